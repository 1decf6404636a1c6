"""Date-part and timestamp expressions mongomock lacks, with mongod 8.0's parsing, results and
errors (expression.cpp DateExpressionAcceptingTimeZone, ExpressionDateToParts,
ExpressionTsSecond / ExpressionTsIncrement): `$isoWeek`, `$isoWeekYear`, `$isoDayOfWeek`,
`$dateToParts` (with `iso8601`), `$tsSecond`, `$tsIncrement`.

The `timezone` argument is parsed as the other date expressions parse it
(date_expressions.py). Installed into the expression parser by expressions.py (`OPERATORS`).
Pure and synchronous.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages import date_expressions
from pipeline_stages.array_expressions import operands, value
from pipeline_stages.date_expressions import missing_type_name, nullish
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string

__all__ = ["OPERATORS"]


def _coerce_to_date(v: Any) -> int:
    """Value::coerceToDate, as milliseconds since the epoch."""
    if not isinstance(v, (datetime.datetime, Timestamp, ObjectId)):
        raise MongoError(16006, f"can't convert from BSON type {missing_type_name(v)} to Date")
    return date_expressions._to_ms(v)


def _local(parser: Any, date_expression: Any, options: Mapping[str, Any]) -> Any:
    """The date in its time zone's local time; None when the date or the zone is nullish."""
    date = value(parser, date_expression)
    zone = date_expressions._zone(parser, options, None)
    if zone is None or nullish(date):
        return None
    return zone.local(_coerce_to_date(date))


def _date_part(name: str, part: Callable[[datetime.datetime], int]) -> Callable[[Any, Any], Any]:
    """An operator taking `<date>`, `[<date>]` or `{date, timezone}`."""
    def evaluate(parser: Any, spec: Any) -> Any:
        options: Mapping[str, Any] = {}
        date_expression = spec
        if isinstance(spec, Mapping) and not next(iter(spec), "").startswith("$"):
            for key in spec:
                if key not in ("date", "timezone"):
                    raise MongoError(40535, f'unrecognized option to {name}: "{key}"')
            if "date" not in spec:
                raise MongoError(40539, f"missing 'date' argument to {name}, provided: {name}: "
                                 f"{bson_obj_string(spec)}")
            options, date_expression = spec, spec["date"]
        elif isinstance(spec, list):
            if len(spec) != 1:
                raise MongoError(40536, f"{name} accepts exactly one argument if given an "
                                 f"array, but was given {len(spec)}")
            date_expression = spec[0]
        local = _local(parser, date_expression, options)
        return None if local is None else part(local)
    return evaluate


def _date_to_parts(parser: Any, spec: Any) -> Any:
    name = "$dateToParts"
    if not isinstance(spec, Mapping):
        raise MongoError(40524, f"{name} only supports an object as its argument")
    for key in spec:
        if key not in ("date", "timezone", "iso8601"):
            raise MongoError(40520, f"Unrecognized argument to {name}: {key}")
    if "date" not in spec:
        raise MongoError(40522, f"Missing 'date' parameter to {name}")
    date = value(parser, spec["date"])
    zone = date_expressions._zone(parser, spec, None)
    if zone is None:
        return None
    iso = False
    if "iso8601" in spec:
        flag = value(parser, spec["iso8601"])
        if nullish(flag):
            return None
        if not isinstance(flag, bool):
            raise MongoError(40521, f"iso8601 must evaluate to a bool, found "
                             f"{missing_type_name(flag)}")
        iso = flag
    if nullish(date):
        return None
    local = zone.local(_coerce_to_date(date))
    clock = {"hour": local.hour, "minute": local.minute, "second": local.second,
             "millisecond": local.microsecond // 1000}
    if iso:
        year, week, day = local.isocalendar()
        return {"isoWeekYear": year, "isoWeek": week, "isoDayOfWeek": day, **clock}
    return {"year": local.year, "month": local.month, "day": local.day, **clock}


def _timestamp_part(name: str, code: int, second: bool) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        (arg,) = operands(name, spec, 1)
        v = value(parser, arg)
        if nullish(v):
            return None
        if not isinstance(v, Timestamp):  # the leading space is mongod's
            raise MongoError(code, f" Argument to {name} must be a timestamp, but is "
                             f"{missing_type_name(v)}")
        return Int64(v.time if second else v.inc)
    return evaluate


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$isoWeek": _date_part("$isoWeek", lambda d: d.isocalendar()[1]),
    "$isoWeekYear": _date_part("$isoWeekYear", lambda d: d.isocalendar()[0]),
    "$isoDayOfWeek": _date_part("$isoDayOfWeek", lambda d: d.isocalendar()[2]),
    "$dateToParts": _date_to_parts,
    "$tsSecond": _timestamp_part("$tsSecond", 5687301, True),
    "$tsIncrement": _timestamp_part("$tsIncrement", 5687302, False),
}
