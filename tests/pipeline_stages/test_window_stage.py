"""`$setWindowFields` on the embedded store (pipeline_stages/window_stage.py), through pymongo:
partitions, sortBy, documents and range windows (a unit on dates), the window functions with
mongod 8.0's results and types, and its parse and run-time errors."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import errors
from pymongo.database import Database

from cdcserver.testing import EmbeddedServer

DAY = datetime.timedelta(days=1)
T0 = datetime.datetime(2021, 3, 1)


@pytest.fixture(scope="module")
def db() -> Iterator[Database[Any]]:
    with EmbeddedServer() as server:
        client: Any = server.client()
        database = client.window_tests
        database.sales.insert_many([
            {"_id": 1, "g": "b", "x": 30, "t": T0 + 2 * DAY},
            {"_id": 2, "g": "a", "x": 10, "t": T0},
            {"_id": 3, "g": "b", "x": 10, "t": T0 + 5 * DAY},
            {"_id": 4, "g": "a", "x": 20, "t": T0 + DAY},
            {"_id": 5, "g": "a", "x": 20, "t": T0 + 3 * DAY},
            {"_id": 6, "x": 5, "t": T0 + 4 * DAY},
        ])
        yield database
        client.close()


def _run(db: Database[Any], spec: dict[str, Any], coll: str = "sales") -> list[Any]:
    return list(db[coll].aggregate([{"$setWindowFields": spec}]))


def _failure(db: Database[Any], spec: Any, coll: str = "sales") -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        list(db[coll].aggregate([{"$setWindowFields": spec}]))
    return info.value.code, info.value.details["errmsg"]


def _project(docs: list[Any], *fields: str) -> list[tuple[Any, ...]]:
    return [tuple(d.get(f, "<missing>") for f in ("_id", *fields)) for d in docs]


def test_partitions_sorted_and_whole_partition_sum(db: Database[Any]) -> None:
    out = _run(db, {"partitionBy": "$g", "sortBy": {"x": 1, "_id": 1},
                    "output": {"total": {"$sum": "$x"}, "n": {"$count": {}}}})
    # the missing partition key is the null partition, first; then "a", then "b"
    assert _project(out, "g", "total", "n") == [
        (6, "<missing>", 5, 1), (2, "a", 50, 3), (4, "a", 50, 3), (5, "a", 50, 3),
        (3, "b", 40, 2), (1, "b", 40, 2),
    ]
    assert list(out[1]) == ["_id", "g", "x", "t", "total", "n"]


def test_rank_dense_rank_document_number(db: Database[Any]) -> None:
    out = _run(db, {"sortBy": {"x": -1}, "output": {
        "r": {"$rank": {}}, "d": {"$denseRank": {}}, "n": {"$documentNumber": {}}}})
    assert _project(out, "x", "r", "d", "n") == [
        (1, 30, 1, 1, 1), (4, 20, 2, 2, 2), (5, 20, 2, 2, 3), (2, 10, 4, 3, 4),
        (3, 10, 4, 3, 5), (6, 5, 6, 4, 6),
    ]
    assert all(type(d["r"]) is int for d in out)


def test_documents_window_functions(db: Database[Any]) -> None:
    window = {"documents": [-1, 1]}
    out = _run(db, {"sortBy": {"t": 1}, "output": {
        "s": {"$sum": "$x", "window": window},
        "avg": {"$avg": "$x", "window": window},
        "lo": {"$min": "$x", "window": window},
        "hi": {"$max": "$x", "window": window},
        "p": {"$push": "$x", "window": window},
        "set": {"$addToSet": "$x", "window": {"documents": ["unbounded", "current"]}},
        "run": {"$sum": "$x", "window": {"documents": ["unbounded", "current"]}},
    }})
    assert _project(out, "s", "avg", "lo", "hi", "p", "set", "run") == [
        (2, 30, 15.0, 10, 20, [10, 20], [10], 10),
        (4, 60, 20.0, 10, 30, [10, 20, 30], [10, 20], 30),
        (1, 70, 70 / 3, 20, 30, [20, 30, 20], [10, 20, 30], 60),
        (5, 55, 55 / 3, 5, 30, [30, 20, 5], [10, 20, 30], 80),
        (6, 35, 35 / 3, 5, 20, [20, 5, 10], [5, 10, 20, 30], 85),
        (3, 15, 7.5, 5, 10, [5, 10], [5, 10, 20, 30], 95),
    ]


def test_empty_windows_and_first_last(db: Database[Any]) -> None:
    out = _run(db, {"sortBy": {"t": 1}, "output": {
        "prev": {"$first": "$x", "window": {"documents": [-1, -1]}},
        "last": {"$last": "$x"},
        "s": {"$sum": "$x", "window": {"documents": [5, 9]}},
        "a": {"$avg": "$x", "window": {"documents": [5, 9]}},
        "m": {"$max": "$x", "window": {"documents": [5, 9]}},
        "p": {"$push": "$x", "window": {"documents": [5, 9]}},
        "g": {"$first": "$g"},
    }})
    assert _project(out, "prev", "last", "s", "a", "m", "p")[:2] == [
        # [5, 9] from the first document holds the last one; from the second, nothing
        (2, None, 10, 10, 10.0, 10, [10]), (4, 10, 10, 0, None, None, []),
    ]
    assert all(d["g"] == "a" for d in out)  # the first by t has g "a"
    # the first by x (_id 6) has no g: the output is missing, so no document keeps a g
    by_x = _run(db, {"sortBy": {"x": 1}, "output": {"g": {"$first": "$g"}}})
    assert [d["_id"] for d in by_x] == [6, 2, 3, 4, 5, 1]
    assert not any("g" in d for d in by_x)


def test_sum_types_long_kept_only_by_unbounded_windows(db: Database[Any]) -> None:
    db.longs.insert_many([{"_id": i, "v": Int64(i)} for i in range(3)])
    out = list(db.longs.aggregate([{"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
        "all": {"$sum": "$v"},
        "moving": {"$sum": "$v", "window": {"documents": [-1, 0]}},
        "mixed": {"$sum": {"$cond": [{"$eq": ["$_id", 1]}, 0.5, "$v"]},
                  "window": {"documents": [0, 0]}},
    }}}]))
    assert [(type(d["all"]), d["all"]) for d in out] == [(Int64, 3)] * 3
    assert [(type(d["moving"]), d["moving"]) for d in out] == [(int, 0), (int, 1), (int, 3)]
    assert [(type(d["mixed"]), d["mixed"]) for d in out] == [(int, 0), (float, 0.5), (int, 2)]


def test_range_windows_numbers_and_dates(db: Database[Any]) -> None:
    out = _run(db, {"sortBy": {"x": 1}, "output": {
        "near": {"$push": "$_id", "window": {"range": [-5, 5]}},
        "below": {"$sum": "$x", "window": {"range": ["unbounded", -1]}},
        "ties": {"$push": "$_id", "window": {"range": ["current", 0]}},
    }})
    assert _project(out, "x", "near", "below", "ties") == [
        (6, 5, [6, 2, 3], 0, [6]),
        (2, 10, [6, 2, 3], 5, [2, 3]),
        (3, 10, [6, 2, 3], 5, [3]),
        (4, 20, [4, 5], 25, [4, 5]),
        (5, 20, [4, 5], 25, [5]),
        (1, 30, [1], 65, [1]),
    ]
    dated = _run(db, {"sortBy": {"t": 1}, "output": {
        "two_days": {"$push": "$_id", "window": {"range": [-1, 0], "unit": "day"}},
        "next_48h": {"$sum": "$x", "window": {"range": [1, 48], "unit": "hour"}},
    }})
    assert _project(dated, "two_days", "next_48h") == [
        (2, [2], 50), (4, [2, 4], 50), (1, [4, 1], 25), (5, [1, 5], 15),
        (6, [5, 6], 10), (3, [6, 3], 0),
    ]


def test_range_window_on_values_of_the_wrong_type(db: Database[Any]) -> None:
    assert _failure(db, {"sortBy": {"g": 1}, "output": {
        "v": {"$sum": "$x", "window": {"range": [-1, 1]}}}}) == (
        5429414, "Invalid range: Expected the sortBy field to be a number, but it was null")
    assert _failure(db, {"sortBy": {"t": 1}, "output": {
        "v": {"$sum": "$x", "window": {"range": [-1, 1]}}}}) == (
        5429413, "Invalid range: For windows that involve date or time ranges, a unit must be "
        "provided.")
    assert _failure(db, {"sortBy": {"x": 1}, "output": {
        "v": {"$sum": "$x", "window": {"range": [-1, 1], "unit": "day"}}}}) == (
        5429513, "Invalid range: Expected the sortBy field to be a Date, but it was int")


def test_shift_locf_and_linear_fill(db: Database[Any]) -> None:
    db.gaps.insert_many([{"_id": 1, "v": 10}, {"_id": 2}, {"_id": 3, "v": None},
                         {"_id": 4, "v": 40}, {"_id": 5}])
    out = list(db.gaps.aggregate([{"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
        "prev": {"$shift": {"output": "$v", "by": -1, "default": "none"}},
        "next": {"$shift": {"output": "$v", "by": 1}},
        "locf": {"$locf": "$v"},
        "lin": {"$linearFill": "$v"},
    }}}]))
    assert _project(out, "prev", "next", "locf", "lin") == [
        (1, "none", "<missing>", 10, 10),
        (2, 10, None, 10, 20.0),
        (3, "<missing>", 40, 10, 30.0),
        (4, None, "<missing>", 40, 40),
        (5, 40, None, 40, None),
    ]


def test_exp_moving_avg_derivative_integral_std_dev(db: Database[Any]) -> None:
    db.series.insert_many([{"_id": i, "t": T0 + i * DAY, "v": v, "n": i}
                           for i, v in enumerate([0, 10, 20, 30])])
    out = list(db.series.aggregate([{"$setWindowFields": {"sortBy": {"t": 1}, "output": {
        "ema_n": {"$expMovingAvg": {"input": "$v", "N": 3}},
        "ema_a": {"$expMovingAvg": {"input": "$v", "alpha": 0.5}},
        "rate": {"$derivative": {"input": "$v", "unit": "hour"},
                 "window": {"documents": [-1, 0]}},
        "area": {"$integral": {"input": "$v", "unit": "day"},
                 "window": {"documents": ["unbounded", "current"]}},
        "pop": {"$stdDevPop": "$n"},
        "samp": {"$stdDevSamp": "$n", "window": {"documents": ["unbounded", "current"]}},
    }}}]))
    assert _project(out, "ema_n", "ema_a", "rate", "area", "samp") == [
        (0, 0.0, 0.0, None, 0.0, None),
        (1, 5.0, 5.0, 10 / 24, 5.0, math.sqrt(0.5)),
        (2, 12.5, 12.5, 10 / 24, 20.0, 1.0),
        (3, 21.25, 21.25, 10 / 24, 45.0, math.sqrt(5 / 3)),
    ]
    assert {d["pop"] for d in out} == {math.sqrt(1.25)}


def test_std_dev_over_bounded_windows(db: Database[Any]) -> None:
    db.spread.insert_many([{"_id": i, "v": v} for i, v in enumerate([1, 2, 3, 4, 10.5])])
    out = list(db.spread.aggregate([{"$setWindowFields": {"sortBy": {"_id": 1}, "output": {
        "pop": {"$stdDevPop": "$v", "window": {"documents": [-1, 0]}},
        "samp": {"$stdDevSamp": "$v", "window": {"documents": [-2, 0]}},
    }}}]))
    # WindowFunctionStdDev: one value in a population window is the int 0
    assert [(type(d["pop"]), d["pop"]) for d in out] == [
        (int, 0), (float, 0.5), (float, 0.5), (float, 0.5), (float, 3.25)]
    assert [d["samp"] for d in out] == [None, math.sqrt(0.5), 1.0, 1.0, 4.0722639076235385]


def test_outputs_overwrite_in_place_and_dotted_paths(db: Database[Any]) -> None:
    out = _run(db, {"partitionBy": "$g", "sortBy": {"_id": 1},
                    "output": {"x": {"$max": "$x"}, "stats.n": {"$documentNumber": {}}}})
    doc = next(d for d in out if d["_id"] == 4)
    assert list(doc) == ["_id", "g", "x", "t", "stats"]
    assert doc["x"] == 20 and doc["stats"] == {"n": 2}


def test_partition_by_an_array_is_type_mismatch(db: Database[Any]) -> None:
    message = "An expression used to partition cannot evaluate to value of type array"
    assert _failure(db, {"partitionBy": ["$g"], "output": {}}) == (14, message)
    assert _failure(db, {"partitionBy": {"$literal": [1]}, "output": {}}) == (14, message)
    assert _failure(db, {"partitionBy": {"$split": ["a-b", "-"]}, "output": {}}) == (14, message)


@pytest.mark.parametrize(("spec", "code", "message"), [
    ("x", 9, "the $setWindowFields stage specification must be an object, found string"),
    ({"sortBy": "x", "output": {}}, 14,
     "BSON field '$setWindowFields.sortBy' is the wrong type 'string', expected type 'object'"),
    ({"output": 1}, 14,
     "BSON field '$setWindowFields.output' is the wrong type 'int', expected type 'object'"),
    ({"what": 1}, 40415, "BSON field '$setWindowFields.what' is an unknown field."),
    ({}, 40414, "BSON field '$setWindowFields.output' is missing but a required field"),
    ({"output": {"a": {"$sum": 1}, "a.b": {"$sum": 1}}}, 6307900,
     "$setWindowFields 'output' specification contains two conflicting paths"),
    ({"output": {"a": 1}}, 9, "The field 'a' must be an object"),
    ({"output": {"a": {"b": {"$sum": "$a"}}}}, 9, "Expected a $-prefixed window function, b"),
    ({"output": {"a": {}}}, 9, "Expected a $-prefixed window function"),
    ({"output": {"a": {"$summ": 1}}}, 9, "Unrecognized window function, $summ"),
    ({"output": {"a": {"$mergeObjects": "$a"}}}, 9,
     "Unrecognized window function, $mergeObjects"),
    ({"output": {"a": {"$sum": 1, "$avg": 1}}}, 9,
     "Cannot specify two functions in window function spec"),
    ({"output": {"a": {"$sum": 1, "other": 1}}}, 9,
     "Window function found an unknown argument: other"),
    ({"output": {"a": {"$first": 1, "other": 1}}}, 9, "$first got unexpected argument: other"),
    ({"output": {"a": {"$count": 1}}}, 9, "$count only accepts an empty object as input"),
    ({"output": {"a": {"$sum": 1, "window": [0, 1]}}}, 9, "'window' field must be an object"),
    ({"output": {"a": {"$sum": 1, "window": {"documents": [0]}}}}, 9,
     "Window bounds must be a 2-element array: documents: [ 0 ]"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"documents": [0, "x"]}}}}, 9,
     "Window bounds must be 'unbounded', 'current', or a number."),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"documents": [0.5, 1]}}}}, 9,
     "Numeric document-based bounds must be an integer"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"documents": [1, -1]}}}},
     5339900, "Lower bound must not exceed upper bound: [1, -1]"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"range": ["current", -1]}}}},
     5339900, "Lower bound must not exceed upper bound: [0, -1]"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {
        "documents": [0, {"$add": ["$x", 1]}]}}}}, 9,
     "Window bounds expression must be a constant."),
    ({"output": {"a": {"$sum": 1, "window": {"documents": ["unbounded", "current"]}}}},
     5339901, "Document-based bounds require a sortBy"),
    ({"sortBy": {"x": 1, "t": 1}, "output": {"a": {"$sum": 1, "window": {"range": [0, 1]}}}},
     5339902, "Range-based bounds require sortBy a single field"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"range": [0, 1],
                                                                 "unit": "decade"}}}},
     9, "unknown time unit value: decade"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"range": [0, 1], "x": 1}}}},
     9, "'window' field that specifies range cannot have other fields besides 'unit'"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$sum": 1, "window": {"unit": "day"}}}}, 9,
     "Window bounds can only specify 'unit' with range-based bounds."),
    ({"sortBy": {"x": 1}, "output": {"a": {"$rank": {}, "window": {}}}}, 5371601,
     "Rank style window functions take no other arguments"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$rank": 1}}}, 5371603,
     "$rank must be specified with '{}' as the value"),
    ({"output": {"a": {"$denseRank": {}}}}, 5371602,
     "$denseRank must be specified with a top level sortBy expression with exactly one element"),
    ({"output": {"a": {"$shift": {"output": "$x", "by": 1}}}}, 9, "'$shift' requires a sortBy"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$shift": {"output": "$x"}}}}, 9,
     "$shift requires 'by' as an integer value."),
    ({"sortBy": {"x": 1}, "output": {"a": {"$shift": {"output": "$x", "by": 1.5}}}}, 9,
     "'$shift:by' field must be an integer, but found  by: 1.5"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$shift": {"output": "$x", "by": 1,
                                                      "default": "$x"}}}}, 9,
     "'$shift:default' expression must yield a constant value."),
    ({"sortBy": {"x": 1}, "output": {"a": {"$locf": "$x", "window": {}}}}, 9,
     "'window' field is not allowed in $locf"),
    ({"sortBy": {"x": 1, "t": 1}, "output": {"a": {"$linearFill": "$x"}}}, 605001,
     "$linearFill must be specified with a top level sortBy expression with exactly one "
     "element"),
    ({"output": {"a": {"$expMovingAvg": {"input": "$x", "N": 2}}}}, 9,
     "$expMovingAvg requires an explicit 'sortBy'"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$expMovingAvg": {"input": "$x", "N": 0}}}}, 9,
     "'N' must be greater than zero. Got 0"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$expMovingAvg": {"input": "$x", "alpha": 1}}}}, 9,
     "'alpha' must be between 0 and 1 (exclusive), found alpha: 1"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$derivative": {"input": "$x"}}}}, 9,
     "$derivative requires explicit window bounds"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$derivative": {"input": "$x", "unit": "month"},
                                           "window": {"documents": [-1, 0]}}}}, 5490710,
     "unit must be 'week' or smaller"),
    ({"sortBy": {"x": 1, "t": 1}, "output": {"a": {"$integral": {"input": "$x"}}}}, 9,
     "$integral requires a non-compound sortBy"),
    ({"sortBy": {"x": 1}, "output": {"a": {"$integral": 1}}}, 9,
     "$integral expects an object, but got a int: $integral: 1"),
    ({"sortBy": {"x": 2}, "output": {}}, 15975,
     "$sort key ordering must be 1 (for ascending) or -1 (for descending)"),
])
def test_parse_errors(db: Database[Any], spec: Any, code: int, message: str) -> None:
    assert _failure(db, spec) == (code, message)
