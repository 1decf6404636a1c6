"""Date-part and timestamp expressions (pipeline_stages/date_part_expressions.py) through a
pymongo client against the embedded store, with mongod 8.0's results and errors
(expression.cpp: DateExpressionAcceptingTimeZone, ExpressionDateToParts, ExpressionTsSecond)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

D = datetime.datetime


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        client = server.client()
        collection = client.date_part_expressions.c
        collection.insert_one({"_id": 1, "d": D(2021, 1, 3, 23, 30, 5, 250000),
                               "t": Timestamp(1704067200, 7)})
        yield collection
        client.close()


def _one(coll: Collection[Any], expr: Any) -> Any:
    (doc,) = coll.aggregate([{"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


@pytest.mark.parametrize(("expr", "expected"), [
    ({"$isoWeek": "$d"}, 53),  # 2021-01-03 is a Sunday of 2020's week 53
    ({"$isoWeekYear": ["$d"]}, 2020),
    ({"$isoDayOfWeek": "$d"}, 7),
    ({"$isoDayOfWeek": {"date": "$d", "timezone": "+01:00"}}, 1),
    ({"$isoWeek": {"date": "$d", "timezone": "Europe/Paris"}}, 1),
    ({"$isoWeekYear": {"date": "$d", "timezone": "Europe/Paris"}}, 2021),
    ({"$isoWeek": "$t"}, 1),  # a timestamp is a date here
    ({"$isoWeek": ObjectId("65920080" + "0" * 16)}, 1),
    ({"$isoWeek": {"$dateAdd": {"startDate": "$d", "unit": "day", "amount": 1}}}, 1),
    ({"$isoWeek": "$zz"}, None),
    ({"$isoWeek": {"date": "$d", "timezone": None}}, None),
    ({"$dateToParts": {"date": "$d"}},
     {"year": 2021, "month": 1, "day": 3, "hour": 23, "minute": 30, "second": 5,
      "millisecond": 250}),
    ({"$dateToParts": {"date": "$d", "iso8601": True}},
     {"isoWeekYear": 2020, "isoWeek": 53, "isoDayOfWeek": 7, "hour": 23, "minute": 30,
      "second": 5, "millisecond": 250}),
    ({"$dateToParts": {"date": "$d", "timezone": "America/New_York", "iso8601": False}},
     {"year": 2021, "month": 1, "day": 3, "hour": 18, "minute": 30, "second": 5,
      "millisecond": 250}),
    ({"$dateToParts": {"date": "$d", "timezone": "+05:30", "iso8601": True}},
     {"isoWeekYear": 2021, "isoWeek": 1, "isoDayOfWeek": 1, "hour": 5, "minute": 0,
      "second": 5, "millisecond": 250}),
    ({"$dateToParts": {"date": "$zz"}}, None),
    ({"$dateToParts": {"date": "$d", "iso8601": None}}, None),
    ({"$dateToParts": {"date": "$d", "timezone": "$zz"}}, None),
    ({"$tsSecond": "$t"}, Int64(1704067200)),
    ({"$tsIncrement": "$t"}, Int64(7)),
    ({"$tsSecond": None}, None),
    ({"$tsIncrement": "$zz"}, None),
])
def test_results(coll: Collection[Any], expr: Any, expected: Any) -> None:
    got = _one(coll, expr)
    assert got == expected
    if isinstance(expected, dict):
        assert list(got) == list(expected)  # mongod's field order
        assert all(type(v) is int for v in got.values())
    else:
        assert type(got) is type(expected)


@pytest.mark.parametrize(("expr", "code", "message"), [
    ({"$isoWeek": {}}, 40539, "missing 'date' argument to $isoWeek, provided: $isoWeek: {}"),
    ({"$isoWeek": {"timezone": "UTC"}}, 40539,
     "missing 'date' argument to $isoWeek, provided: $isoWeek: { timezone: \"UTC\" }"),
    ({"$isoDayOfWeek": {"date": "$d", "x": 1}}, 40535,
     "unrecognized option to $isoDayOfWeek: \"x\""),
    ({"$isoWeekYear": ["$d", "$d"]}, 40536,
     "$isoWeekYear accepts exactly one argument if given an array, but was given 2"),
    ({"$isoWeek": 5}, 16006, "can't convert from BSON type int to Date"),
    ({"$isoWeek": {"date": "$d", "timezone": "Nope/Zone"}}, 40485,
     "unrecognized time zone identifier: \"Nope/Zone\""),
    ({"$isoWeek": {"date": "$zz", "timezone": 5}}, 40517,
     "timezone must evaluate to a string, found int"),
    ({"$dateToParts": 1}, 40524, "$dateToParts only supports an object as its argument"),
    ({"$dateToParts": {"date": "$d", "q": 1}}, 40520, "Unrecognized argument to $dateToParts: q"),
    ({"$dateToParts": {}}, 40522, "Missing 'date' parameter to $dateToParts"),
    ({"$dateToParts": {"date": "$zz", "iso8601": 1}}, 40521,
     "iso8601 must evaluate to a bool, found int"),
    ({"$dateToParts": {"date": "s"}}, 16006, "can't convert from BSON type string to Date"),
    ({"$tsSecond": "$d"}, 5687301, " Argument to $tsSecond must be a timestamp, but is date"),
    ({"$tsIncrement": 1}, 5687302, " Argument to $tsIncrement must be a timestamp, but is int"),
    ({"$tsSecond": ["$t", "$t"]}, 16020,
     "Expression $tsSecond takes exactly 1 arguments. 2 were passed in."),
])
def test_errors(coll: Collection[Any], expr: Any, code: int, message: str) -> None:
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, expr)
    assert (exc.value.code, exc.value.details["errmsg"]) == (code, message)  # type: ignore[index]
