"""Aggregation expressions mongomock lacks, evaluated here with mongod 8.0's semantics and
errors: `$dateAdd`, `$dateSubtract`, `$dateDiff`, `$dateTrunc` (date_time_support.cpp: day
and longer units in the `timezone`'s local time, months clamped to the month's last day,
`$dateDiff` counting unit boundaries crossed, `$dateTrunc` binned from 2000-01-01 local), and
`$reduce` (ExpressionReduce: `$$this` / `$$value` over `input`).

Installed into the expression parser by expressions.py (`OPERATORS`). Dates are the engine's
UTC-naive datetimes, held here as milliseconds since the epoch. Pure and synchronous.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

__all__ = ["OPERATORS"]

_EPOCH = datetime.datetime(1970, 1, 1)
_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000,
       "day": 86_400_000, "week": 7 * 86_400_000}
_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_UNITS = frozenset({*_MS, *_MONTHS})
_DAYS = {name: n for n, names in enumerate(
    (("monday", "mon"), ("tuesday", "tue"), ("wednesday", "wed"), ("thursday", "thu"),
     ("friday", "fri"), ("saturday", "sat"), ("sunday", "sun"))) for name in names}
_Y2K_MS = 946_684_800_000  # 2000-01-01T00:00:00Z, $dateTrunc's reference point
_OFFSET = re.compile(r"^([+-])(\d{2})(?::?(\d{2}))?$")


class _Missing:
    pass


_MISSING = _Missing()


def operand(parser: Any, expression: Any) -> Any:
    """An operand's value, MISSING for a missing one (mongomock raises KeyError); shared by
    the expression modules."""
    try:
        return parser.parse(expression)
    except KeyError:
        return _MISSING


def nullish(value: Any) -> bool:
    return value is None or value is _MISSING


def missing_type_name(value: Any) -> str:
    """mongod's typeName(), "missing" for a missing value."""
    return "missing" if value is _MISSING else type_name(value)




# -- conversions ---------------------------------------------------------------------------------


def _coercible_to_date(value: Any) -> bool:
    return isinstance(value, (datetime.datetime, Timestamp, ObjectId))


def _to_ms(value: Any) -> int:
    if isinstance(value, Timestamp):
        return value.time * 1000
    if isinstance(value, ObjectId):
        return int(value.generation_time.timestamp()) * 1000
    moment: datetime.datetime = value
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC).replace(tzinfo=None)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _from_ms(ms: int, name: str) -> datetime.datetime:
    try:
        return _EPOCH + datetime.timedelta(milliseconds=ms)
    except OverflowError:
        raise MongoError(5166406, f"{name} overflowed") from None


def _convert_date(value: Any, name: str, parameter: str) -> int:
    if not _coercible_to_date(value):
        raise MongoError(5166307, f"{name} requires '{parameter}' to be a date, but got "
                         f"{type_name(value)}")
    return _to_ms(value)


def _integral64(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, Int64)):
        return int(value) if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and -(2**63) <= value < 2**63 else None
    if isinstance(value, (Decimal128, decimal.Decimal)):
        d = value.to_decimal() if isinstance(value, Decimal128) else value
        if d.is_finite() and d == d.to_integral_value() and -(2**63) <= d < 2**63:
            return int(d)
    return None


class _Zone:
    """A `timezone` argument: UTC, a fixed offset or an Olson name."""

    def __init__(self, tz: datetime.tzinfo | None) -> None:
        self.tz = tz

    def offset_ms(self, utc_ms: int) -> int:
        if self.tz is None:
            return 0
        moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + (
            datetime.timedelta(milliseconds=utc_ms))
        offset = moment.astimezone(self.tz).utcoffset()
        return int(offset.total_seconds() * 1000) if offset is not None else 0

    def local(self, utc_ms: int) -> datetime.datetime:
        return _EPOCH + datetime.timedelta(milliseconds=utc_ms + self.offset_ms(utc_ms))

    def utc_of_local(self, local: datetime.datetime) -> int:
        naive_ms = _to_ms(local)
        if self.tz is None:
            return naive_ms
        offset = local.replace(tzinfo=self.tz).utcoffset()
        return naive_ms - (int(offset.total_seconds() * 1000) if offset is not None else 0)


def _zone(parser: Any, args: Mapping[str, Any], name: str | None) -> _Zone | None:
    """The `timezone` argument (UTC without one); None when it is null or missing."""
    if "timezone" not in args:
        return _Zone(None)
    value = operand(parser, args["timezone"])
    if nullish(value):
        return None
    try:
        if not isinstance(value, str):
            raise MongoError(40517, f"timezone must evaluate to a string, found "
                             f"{type_name(value)}")
        return _Zone(_parse_zone(value))
    except MongoError as exc:
        if name is None:
            raise
        raise MongoError(exc.code, f"{name} parameter 'timezone' value parsing failed :: "
                         f"caused by :: {exc.args[0] if exc.args else exc}") from None


def _parse_zone(text: str) -> datetime.tzinfo | None:
    if text in ("UTC", "GMT", "Z", "UCT"):
        return None
    m = _OFFSET.match(text)
    if m:
        sign, hours, minutes = m.groups()
        delta = datetime.timedelta(hours=int(hours), minutes=int(minutes or 0))
        return datetime.timezone(-delta if sign == "-" else delta)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # on first use: a cost of start-up

    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise MongoError(40485, f'unrecognized time zone identifier: "{text}"') from None


def _unit(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise MongoError(5439013, f"{name} requires 'unit' to be a string, but got "
                         f"{type_name(value)}")
    if value not in _UNITS:
        raise MongoError(9, f"{name} parameter 'unit' value parsing failed :: caused by :: "
                         f"unknown time unit value: {value}")
    return value


def _start_of_week(parser: Any, args: Mapping[str, Any], name: str) -> int | None:
    """The `startOfWeek` day (Python's weekday numbers), Sunday by default; None if null."""
    if "startOfWeek" not in args:
        return _DAYS["sunday"]
    value = operand(parser, args["startOfWeek"])
    if nullish(value):
        return None
    if not isinstance(value, str):
        raise MongoError(5439015, f"{name} requires 'startOfWeek' to be a string, but got "
                         f"{type_name(value)}")
    day = _DAYS.get(value.lower())
    if day is None:
        raise MongoError(9, f"{name} parameter 'startOfWeek' value parsing failed :: caused "
                         f"by :: unknown day of week value: {value}")
    return day


def _check_args(args: Any, name: str, allowed: tuple[str, ...], codes: tuple[int, int],
                object_message: str, expected: str) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise MongoError(codes[0], object_message)
    for key in args:
        if key not in allowed:
            raise MongoError(codes[1], f"Unrecognized argument to {name}: {key}{expected}")
    return args


# -- $dateAdd / $dateSubtract ------------------------------------------------------------------


def _add_months(local: datetime.datetime, months: int, name: str) -> datetime.datetime:
    total = local.year * 12 + (local.month - 1) + months
    year, month = divmod(total, 12)
    if not 1 <= year <= 9999:
        raise MongoError(5166406, f"{name} overflowed")
    next_first = datetime.date(year + (month == 11), (month + 1) % 12 + 1, 1)
    last_day = (next_first - datetime.timedelta(days=1)).day
    return local.replace(year=year, month=month + 1, day=min(local.day, last_day))


def date_add(utc_ms: int, unit: str, amount: int, zone: _Zone, name: str) -> int:
    """mongod's dateAdd: hours and shorter as durations, days and longer in local time."""
    if unit in ("millisecond", "second", "minute", "hour"):
        return utc_ms + amount * _MS[unit]
    local = zone.local(utc_ms)
    try:
        if unit in ("day", "week"):
            moved = local + datetime.timedelta(days=amount * (7 if unit == "week" else 1))
        else:
            moved = _add_months(local, amount * _MONTHS[unit], name)
    except OverflowError:
        raise MongoError(5166406, f"{name} overflowed") from None
    return zone.utc_of_local(moved)


def _date_arithmetic(parser: Any, args: Any, name: str) -> Any:
    args = _check_args(
        args, name, ("startDate", "unit", "amount", "timezone"), (5166400, 5166401),
        f"{name} expects an object as its argument",
        ". Expected arguments are startDate, unit, amount, and optionally timezone.")
    if not all(k in args for k in ("startDate", "unit", "amount")):
        raise MongoError(5166402, f"{name} requires startDate, unit, and amount to be present")
    start = operand(parser, args["startDate"])
    if nullish(start):
        return None
    unit_value = operand(parser, args["unit"])
    if nullish(unit_value):
        return None
    unit = _unit(unit_value, name)
    amount_value = operand(parser, args["amount"])
    if nullish(amount_value):
        return None
    zone = _zone(parser, args, None)
    if zone is None:
        return None
    if not _coercible_to_date(start):
        raise MongoError(5166403, f"{name} requires startDate to be convertible to a date")
    amount = _integral64(amount_value)
    if amount is None:
        raise MongoError(5166405, f"{name} expects integer amount of time units")
    if name == "$dateSubtract":
        if amount == -(2**63):
            raise MongoError(6045000, f"invalid $dateSubtract 'amount' parameter value: "
                             f"{amount}")
        amount = -amount
    return _from_ms(date_add(_to_ms(start), unit, amount, zone, name.lstrip("$")), name)


# -- $dateDiff -----------------------------------------------------------------------------------


def _week_index(local_day: int, start_of_week: int) -> int:
    # 1970-01-01 (day 0) was a Thursday (weekday 3)
    return (local_day + 3 - start_of_week) // 7


def date_diff(start_ms: int, end_ms: int, unit: str, zone: _Zone, start_of_week: int) -> int:
    """The number of `unit` boundaries between the two dates (in local time)."""
    if unit == "millisecond":
        return end_ms - start_ms
    if unit in _MONTHS:
        a, b = zone.local(start_ms), zone.local(end_ms)
        if unit == "year":
            return b.year - a.year
        if unit == "quarter":
            return (b.year * 4 + (b.month - 1) // 3) - (a.year * 4 + (a.month - 1) // 3)
        return (b.year * 12 + b.month) - (a.year * 12 + a.month)
    local_a = start_ms + zone.offset_ms(start_ms)
    local_b = end_ms + zone.offset_ms(end_ms)
    if unit == "week":
        day = _MS["day"]
        return _week_index(local_b // day, start_of_week) - _week_index(local_a // day,
                                                                        start_of_week)
    size = _MS[unit]
    return local_b // size - local_a // size


def _date_diff(parser: Any, args: Any) -> Any:
    name = "$dateDiff"
    args = _check_args(args, name, ("startDate", "endDate", "unit", "timezone", "startOfWeek"),
                       (5166301, 5166302), f"{name} only supports an object as its argument",
                       "")
    for key, code in (("startDate", 5166303), ("endDate", 5166304), ("unit", 5166305)):
        if key not in args:
            raise MongoError(code, f"Missing '{key}' parameter to {name}")
    start = operand(parser, args["startDate"])
    if nullish(start):
        return None
    end = operand(parser, args["endDate"])
    if nullish(end):
        return None
    unit_value = operand(parser, args["unit"])
    if nullish(unit_value):
        return None
    unit = _unit(unit_value, name)
    start_of_week = _DAYS["sunday"]
    if unit == "week":
        found = _start_of_week(parser, args, name)
        if found is None:
            return None
        start_of_week = found
    zone = _zone(parser, args, name)
    if zone is None:
        return None
    start_ms = _convert_date(start, name, "startDate")
    end_ms = _convert_date(end, name, "endDate")
    return Int64(date_diff(start_ms, end_ms, unit, zone, start_of_week))


# -- $dateTrunc ----------------------------------------------------------------------------------


def date_trunc(utc_ms: int, unit: str, bin_size: int, zone: _Zone, start_of_week: int) -> int:
    """The start of the `bin_size` x `unit` bin holding the date, bins counted from
    2000-01-01T00:00:00 local time (the first `startOfWeek` on or after it, for weeks)."""
    if unit in _MONTHS:
        local = zone.local(utc_ms)
        months = (local.year - 2000) * 12 + (local.month - 1)
        width = bin_size * _MONTHS[unit]
        start = (months // width) * width
        year, month = divmod(start, 12)
        return zone.utc_of_local(datetime.datetime(2000 + year, month + 1, 1))
    local_ms = utc_ms + zone.offset_ms(utc_ms)
    reference = _Y2K_MS
    if unit == "week":
        y2k_weekday = 5  # 2000-01-01 was a Saturday
        reference += ((start_of_week - y2k_weekday) % 7) * _MS["day"]
    width_ms = bin_size * _MS[unit]
    truncated = reference + ((local_ms - reference) // width_ms) * width_ms
    if unit in ("millisecond", "second", "minute", "hour") and zone.tz is None:
        return truncated
    return zone.utc_of_local(_EPOCH + datetime.timedelta(milliseconds=truncated))


def _date_trunc(parser: Any, args: Any) -> Any:
    name = "$dateTrunc"
    args = _check_args(args, name, ("date", "unit", "binSize", "timezone", "startOfWeek"),
                       (5439007, 5439008), f"{name} only supports an object as its argument",
                       ". Expected arguments are date, unit, and optionally, binSize, timezone, "
                       "startOfWeek")
    for key, code in (("date", 5439009), ("unit", 5439010)):
        if key not in args:
            raise MongoError(code, f"Missing '{key}' parameter to {name}")
    date = operand(parser, args["date"])
    if nullish(date):
        return None
    bin_size = 1
    if "binSize" in args:
        size_value = operand(parser, args["binSize"])
        if nullish(size_value):
            return None
        size = _integral64(size_value)
        if size is None:
            raise MongoError(5439017, f"{name} requires 'binSize' to be a 64-bit integer, but "
                             f"got value '{value_string(size_value)}' of type "
                             f"{type_name(size_value)}")
        if size <= 0:
            raise MongoError(5439018, f"{name} requires 'binSize' to be greater than 0, but "
                             f"got value {size}")
        bin_size = size
    unit_value = operand(parser, args["unit"])
    if nullish(unit_value):
        return None
    unit = _unit(unit_value, name)
    start_of_week = _DAYS["sunday"]
    if unit == "week":
        found = _start_of_week(parser, args, name)
        if found is None:
            return None
        start_of_week = found
    zone = _zone(parser, args, name)
    if zone is None:
        return None
    utc_ms = _convert_date(date, name, "date")
    return _from_ms(date_trunc(utc_ms, unit, bin_size, zone, start_of_week), name)


# -- $reduce -------------------------------------------------------------------------------------


def _reduce(parser: Any, args: Any) -> Any:
    if not isinstance(args, Mapping):
        raise MongoError(40075, f"$reduce requires an object as an argument, found: "
                         f"{type_name(args)}")
    for key in args:
        if key not in ("input", "initialValue", "in"):
            raise MongoError(40076, f"$reduce found an unknown argument: {key}")
    for key, code in (("input", 40077), ("initialValue", 40078), ("in", 40079)):
        if key not in args:
            raise MongoError(code, f"$reduce requires '{key}' to be specified")
    values = operand(parser, args["input"])
    if nullish(values):
        return None
    if not isinstance(values, list):
        raise MongoError(40080, f"$reduce requires that 'input' be an array, found: "
                         f"{value_string(values)}")
    accumulated = operand(parser, args["initialValue"])
    user_vars = dict(getattr(parser, "_user_vars", None) or {})
    for element in values:
        scope = {**user_vars, "this": element}
        if accumulated is _MISSING:
            scope.pop("value", None)
        else:
            scope["value"] = accumulated
        inner = type(parser)(parser._doc_dict, scope, parser._ignore_missing_keys)
        accumulated = operand(inner, args["in"])
    return accumulated


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$dateAdd": lambda parser, args: _date_arithmetic(parser, args, "$dateAdd"),
    "$dateSubtract": lambda parser, args: _date_arithmetic(parser, args, "$dateSubtract"),
    "$dateDiff": _date_diff,
    "$dateTrunc": _date_trunc,
    "$reduce": _reduce,
}
MISSING = _MISSING
