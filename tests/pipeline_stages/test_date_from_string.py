"""`$dateFromString` (pipeline_stages/date_from_string.py) through a real pymongo client against
the embedded store, as mongod 8.0 evaluates it (expression.cpp ExpressionDateFromString,
date_time_support.cpp TimeZoneDatabase::fromString, timelib parse_date.re;
jstests/aggregation/expressions/date_from_string.js)."""

from __future__ import annotations

import datetime
from typing import Any

import pymongo
import pytest

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def coll() -> Any:
    with EmbeddedServer() as server:
        c = server.client().get_database("date_from_string")["c"]
        c.insert_one({"_id": 0, "s": "2017-07-06T12:35:37.513", "n": None})
        yield c


def run(coll: Any, spec: Any) -> Any:
    out = list(coll.aggregate([{"$project": {"_id": 0, "d": {"$dateFromString": spec}}}]))
    return out[0].get("d", "MISSING")


def error(coll: Any, spec: Any) -> tuple[int, str]:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        run(coll, spec)
    return info.value.code, info.value.details["errmsg"]


def d(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("date_string", "expected"), [
    ("2017-07-04T11:56:02Z", d(2017, 7, 4, 11, 56, 2)),
    ("2017-07-04T11:56:02.813Z", d(2017, 7, 4, 11, 56, 2, 813000)),
    ("2017-07-04T11:56.02.8", d(2017, 7, 4, 11, 56, 2, 800000)),
    ("2017-07-04T11:56:02.8139", d(2017, 7, 4, 11, 56, 2, 813000)),
    ("1960-07-10T12:10:37.448", d(1960, 7, 10, 12, 10, 37, 448000)),
    ("2017-07-06", d(2017, 7, 6)),
    ("2017-02-08 12:10:40.787", d(2017, 2, 8, 12, 10, 40, 787000)),
    ("2017-07-14T12:02:44.771 GMT+02:00", d(2017, 7, 14, 10, 2, 44, 771000)),
    ("2017-07-14T12:02:44.771+0330", d(2017, 7, 14, 8, 32, 44, 771000)),
    ("2017-07-14T12:02:44.771-03", d(2017, 7, 14, 15, 2, 44, 771000)),
    ("2017-07-14T12:02:44.771 UTC", d(2017, 7, 14, 12, 2, 44, 771000)),
    ("2017-07-14T12:02:44.771 L", d(2017, 7, 14, 1, 2, 44, 771000)),
    ("2017-07-14T12:02:44.771 P", d(2017, 7, 14, 15, 2, 44, 771000)),
])
def test_iso_forms_without_format(coll: Any, date_string: str, expected: Any) -> None:
    assert run(coll, {"dateString": date_string}) == expected


@pytest.mark.parametrize(("date_string", "fmt", "expected"), [
    ("2017-07-04T11:56:02.81Z", "%Y-%m-%dT%H:%M:%S.%LZ", d(2017, 7, 4, 11, 56, 2, 810000)),
    ("05 12 1988", "%d %m %Y", d(1988, 12, 5)),
    ("1992 % 04 % 26", "%Y %% %m %% %d", d(1992, 4, 26)),
    ("Day: 05 Month: 12 Year: 1988", "Day: %d Month: %m Year: %Y", d(1988, 12, 5)),
    ("4/26/1992:+0445", "%m/%d/%Y:%z", d(1992, 4, 25, 19, 15)),
    ("4/26/1992:+285", "%m/%d/%Y:%Z", d(1992, 4, 25, 19, 15)),
    ("2017-07-14T12:02:44.771 GMT+02", "%Y-%m-%dT%H:%M:%S.%L%z", d(2017, 7, 14, 10, 2, 44, 771000)),
    ("2017-07-14T12:02:44.771 A", "%Y-%m-%dT%H:%M:%S.%L%z", d(2017, 7, 14, 11, 2, 44, 771000)),
    ("4 July 2017", "%d %B %Y", d(2017, 7, 4)),
    ("Sept 4 2017", "%b %d %Y", d(2017, 9, 4)),
    ("2017", "%G", d(2017, 1, 2)),
    ("2017, Week 53", "%G, Week %V", d(2018, 1, 1)),
    ("2017, Day 5", "%G, Day %u", d(2017, 1, 6)),
    ("53.7.2017", "%V.%u.%G", d(2018, 1, 7)),
    ("1.1.1", "%V.%u.%G", d(1, 1, 1)),
])
def test_formats(coll: Any, date_string: str, fmt: str, expected: Any) -> None:
    assert run(coll, {"dateString": date_string, "format": fmt}) == expected


def test_timezone_argument(coll: Any) -> None:
    assert run(coll, {"dateString": "$s", "timezone": "America/New_York"}) == d(
        2017, 7, 6, 16, 35, 37, 513000)
    assert run(coll, {"dateString": "2017-07-04T11:56.02.81", "timezone": "+01:00",
                      "format": "%Y-%m-%dT%H:%M.%S.%L"}) == d(2017, 7, 4, 10, 56, 2, 810000)
    assert run(coll, {"dateString": "2017-07-04T11:56:02Z", "timezone": "UTC"}) == d(
        2017, 7, 4, 11, 56, 2)


def test_null_and_missing(coll: Any) -> None:
    assert run(coll, {"dateString": "$nope"}) is None
    assert run(coll, {"dateString": "$n", "onNull": "x"}) == "x"
    assert run(coll, {"dateString": "$nope", "onNull": "$nope"}) == "MISSING"
    assert run(coll, {"dateString": "2017-07-11T17:05:19Z", "timezone": "$n"}) is None
    assert run(coll, {"dateString": "2017-07-11T17:05:19Z", "format": "$nope"}) is None


NUL = "\x00"


@pytest.mark.parametrize(("spec", "message"), [
    ({"dateString": "2018-01", "format": "%Y-%m-%d"},
     f"Error parsing date string '2018-01'; 7: Not enough data available to satisfy format "
     f"'{NUL}'"),
    ({"dateString": "2018-01", "format": "%Y"},
     "Error parsing date string '2018-01'; 4: Trailing data '-'"),
    ({"dateString": "x2017", "format": "%Y"},
     "Error parsing date string 'x2017'; 0: Unexpected data found. 'x'"),
    ({"dateString": "1992-26", "format": "Y-d"},
     "Error parsing date string '1992-26'; 0: Format literal not found '1'; 1: Format literal "
     "not found '9'; 2: Format literal not found '9'; 3: Trailing data '2'"),
    ({"dateString": "ISO Day 6", "format": "ISO Day %u"},
     f"Error parsing date string 'ISO Day 6'; 9: The parsed date was invalid '{NUL}'"),
    ({"dateString": "12/31/2018", "format": "%m/%d/%G"},
     "Error parsing date string '12/31/2018'; 10: Mixing of ISO dates with natural dates is "
     f"not allowed '{NUL}'"),
    ({"dateString": "2017-02-30"},
     f"Error parsing date string '2017-02-30'; 10: The parsed date was invalid '{NUL}'"),
    ({"dateString": "2017-02-03T24:00:00", "format": "%Y-%m-%dT%H:%M:%S"},
     f"Error parsing date string '2017-02-03T24:00:00'; 19: The parsed time was invalid "
     f"'{NUL}'"),
    ({"dateString": "2017-07-12 Europe/Amsterdam", "format": "%Y-%m-%d%z"},
     "Error parsing date string '2017-07-12 Europe/Amsterdam'; 10: passing a time zone "
     "identifier as part of the string is not allowed ' '"),
    ({"dateString": "12:50:53", "format": "%H:%M:%S"},
     'an incomplete date/time string has been found, with elements missing: "12:50:53"'),
    ({"dateString": "4/26/1992:+0445", "format": "%m/%d/%Y:%z", "timezone": "+0500"},
     "you cannot pass in a date/time string with GMT offset together with a timezone argument"),
    ({"dateString": "2017-07-12T22:23:55Z", "timezone": "Europe/Amsterdam"},
     "you cannot pass in a date/time string with time zone information ('Z') together with a "
     "timezone argument"),
    ({"dateString": 5},
     "$dateFromString requires that 'dateString' be a string, found: int with value 5"),
])
def test_conversion_failures(coll: Any, spec: Any, message: str) -> None:
    # A ConversionFailure is raised while the expression runs: mongod adds its context, the
    # optimizer's when every argument is a constant (it folds the expression), else the
    # executor's (tests/embedded/test_executor_context.py).
    reads_a_field = any(isinstance(v, str) and v.startswith("$") for v in spec.values())
    context = ("PlanExecutor error during aggregation" if reads_a_field
               else "Failed to optimize pipeline")
    assert error(coll, spec) == (241, f"{context} :: caused by :: {message}")
    assert run(coll, {**spec, "onError": "fallback"}) == "fallback"


@pytest.mark.parametrize(("spec", "code", "message"), [
    ("x", 40540, "$dateFromString only supports an object as an argument, found: string"),
    ({"dateString": "x", "bad": 1}, 40541, "Unrecognized argument to $dateFromString: bad"),
    ({"format": "%Y"}, 40542, "Missing 'dateString' parameter to $dateFromString"),
    ({"dateString": "1992", "format": 5, "onError": 1}, 40684,
     "$dateFromString requires that 'format' be a string, found: int with value 5"),
    ({"dateString": "1992", "format": "%n", "onError": 1}, 18536,
     "Invalid format character '%n' in format string"),
    ({"dateString": "$nope", "format": "%Y%"}, 18535, "Unmatched '%' at end of format string"),
])
def test_argument_errors(coll: Any, spec: Any, code: int, message: str) -> None:
    assert error(coll, spec) == (code, message)


@pytest.mark.parametrize("spec", [
    {"dateString": "July 4th, 2017"},
    {"dateString": "12:50:53"},
    {"dateString": "2017-07-12T22:23:55 EST", "format": "%Y-%m-%dT%H:%M:%S %z",
     "onError": 1},
])
def test_forms_left_refused(coll: Any, spec: Any) -> None:
    code, message = error(coll, spec)
    assert code == 2
    assert message.startswith("not supported by cdcserver's embedded store: $dateFromString")
