"""`$group` and `$bucketAuto` (pipeline_stages/group_stage.py) through a real pymongo client
against the embedded store, as mongod 8.0 answers them (document_source_group_base.cpp,
group_processor_base.cpp, accumulation_statement.cpp, document_source_bucket_auto.cpp)."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest
from bson import Decimal128, Int64

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db() -> Any:
    with EmbeddedServer() as server:
        yield server.client().get_database("group_stage")


def run(db: Any, docs: list[dict[str, Any]], pipeline: list[dict[str, Any]]) -> list[Any]:
    """The output as lists of (field, value) pairs: field order and value types count."""
    coll = db["c"]
    coll.drop()
    if docs:
        coll.insert_many(docs)
    return [_items(d) for d in coll.aggregate(pipeline)]


def _items(value: Any) -> Any:
    if isinstance(value, dict):
        return [(k, _items(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_items(v) for v in value]
    return (type(value).__name__, value)


def error(db: Any, docs: list[dict[str, Any]], pipeline: list[dict[str, Any]]) -> tuple[int, str]:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        run(db, docs, pipeline)
    return info.value.code, info.value.details["errmsg"]


def test_id_first_then_accumulators_in_spec_order(db: Any) -> None:
    out = run(db, [{"_id": 1, "v": 3}, {"_id": 2, "v": 3}],
              [{"$group": {"_id": 0, "x": {"$sum": "$v"}, "a": {"$max": "$v"}}}])
    assert out == [[("_id", ("int", 0)), ("x", ("int", 6)), ("a", ("int", 3))]]


def test_numbers_one_group_the_first_key_kept(db: Any) -> None:
    docs = [{"_id": 1, "k": 1.0}, {"_id": 2, "k": 1}, {"_id": 3, "k": Int64(1)},
            {"_id": 4, "k": Decimal128("1")}, {"_id": 5, "k": "1"}]
    out = run(db, docs, [{"$group": {"_id": "$k", "n": {"$sum": 1}}}])
    assert out == [[("_id", ("float", 1.0)), ("n", ("int", 4))],
                   [("_id", ("str", "1")), ("n", ("int", 1))]]


def test_documents_grouped_in_field_order(db: Any) -> None:
    docs = [{"_id": 1, "k": {"a": 1, "b": 2}}, {"_id": 2, "k": {"b": 2, "a": 1}},
            {"_id": 3, "k": {"a": 1.0, "b": 2}}]
    out = run(db, docs, [{"$group": {"_id": "$k", "ids": {"$push": "$_id"}}}])
    assert out == [
        [("_id", [("a", ("int", 1)), ("b", ("int", 2))]), ("ids", [("int", 1), ("int", 3)])],
        [("_id", [("b", ("int", 2)), ("a", ("int", 1))]), ("ids", [("int", 2)])],
    ]


def test_missing_key_is_null_and_groups_with_null(db: Any) -> None:
    docs = [{"_id": 1}, {"_id": 2, "k": None}, {"_id": 3, "k": 5}]
    out = run(db, docs, [{"$group": {"_id": "$k", "ids": {"$push": "$_id"}}}])
    assert out == [[("_id", ("NoneType", None)), ("ids", [("int", 1), ("int", 2)])],
                   [("_id", ("int", 5)), ("ids", [("int", 3)])]]


def test_composite_id_missing_fields(db: Any) -> None:
    # Several fields: a missing value stays missing (and is not null); one field: null.
    docs = [{"_id": 1, "a": 1}, {"_id": 2, "a": 1, "b": None}, {"_id": 3, "b": 2},
            {"_id": 4, "a": 1}]
    out = run(db, docs, [{"$group": {"_id": {"a": "$a", "b": "$b"}, "n": {"$sum": 1}}}])
    assert out == [
        [("_id", [("a", ("int", 1))]), ("n", ("int", 2))],
        [("_id", [("a", ("int", 1)), ("b", ("NoneType", None))]), ("n", ("int", 1))],
        [("_id", [("b", ("int", 2))]), ("n", ("int", 1))],
    ]
    out = run(db, docs, [{"$group": {"_id": {"b": "$b"}, "n": {"$sum": 1}}}])
    assert out == [[("_id", [("b", ("NoneType", None))]), ("n", ("int", 3))],
                   [("_id", [("b", ("int", 2))]), ("n", ("int", 1))]]


def test_id_expression(db: Any) -> None:
    docs = [{"_id": i, "v": i} for i in range(5)]
    key = {"$cond": [{"$gt": ["$v", 2]}, "big", "small"]}
    out = run(db, docs, [{"$group": {"_id": key, "t": {"$sum": "$v"}}}])
    assert out == [[("_id", ("str", "big")), ("t", ("int", 7))],
                   [("_id", ("str", "small")), ("t", ("int", 3))]]


def test_empty_input_gives_no_group(db: Any) -> None:
    assert run(db, [], [{"$group": {"_id": None, "n": {"$sum": 1}}}]) == []


@pytest.mark.parametrize("spec, code, message", [
    ([1], 15947, "a group's fields must be specified in an object"),
    ({"n": {"$sum": 1}}, 15955, "a group specification must include an _id"),
    ({"_id": 1, "x": 1}, 40234, "The field 'x' must be an accumulator object"),
    ({"_id": 1, "x": {}}, 40234, "The field 'x' must be an accumulator object"),
    ({"_id": 1, "x": {"a": 1}}, 40234, "The field 'x' must be an accumulator object"),
    ({"_id": 1, "a.b": {"$sum": 1}}, 40235, "The field name 'a.b' cannot contain '.'"),
    ({"_id": 1, "$a": {"$sum": 1}}, 40236, "The field name '$a' cannot be an operator name"),
    ({"_id": 1, "x": {"$sum": 1, "$avg": 1}}, 40238,
     "The field 'x' must specify one accumulator"),
    ({"_id": 1, "x": {"$push": [1]}}, 40237, "The $push accumulator is a unary operator"),
    ({"_id": 1, "x": {"$foo": 1}}, 15952, "unknown group operator '$foo'"),
    ({"_id": {"a": 1}}, 17390, "$group does not support inclusion-style expressions"),
    ({"_id": {"a": "$a", "b": True}}, 17390,
     "$group does not support inclusion-style expressions"),
    # in field order: the accumulator's error before the missing _id
    ({"x": {"$foo": 1}}, 15952, "unknown group operator '$foo'"),
])
def test_spec_errors(db: Any, spec: Any, code: int, message: str) -> None:
    assert error(db, [{"_id": 1}], [{"$group": spec}]) == (code, message)


def test_spec_errors_without_documents(db: Any) -> None:
    # mongod parses the stage before it reads anything
    assert error(db, [], [{"$group": {"_id": 1, "x": {"$foo": 1}}}])[0] == 15952


def test_sort_by_count(db: Any) -> None:
    docs = [{"_id": i, "k": "ab"[i % 3 == 0]} for i in range(6)]
    out = run(db, docs, [{"$sortByCount": "$k"}])
    assert out == [[("_id", ("str", "a")), ("count", ("int", 4))],
                   [("_id", ("str", "b")), ("count", ("int", 2))]]


def test_group_of_20000_documents_is_fast(db: Any) -> None:
    coll = db["big"]
    coll.drop()
    coll.insert_many([{"_id": i, "k": i % 100, "v": i} for i in range(20000)])
    started = time.perf_counter()
    out = list(coll.aggregate([{"$group": {"_id": "$k", "t": {"$sum": "$v"},
                                           "a": {"$avg": "$v"}}}]))
    elapsed = time.perf_counter() - started
    assert len(out) == 100
    assert list(out[0].items()) == [("_id", 0), ("t", sum(range(0, 20000, 100))), ("a", 9950.0)]
    assert elapsed < 5.0


# -- $bucketAuto -----------------------------------------------------------------------------


def test_bucket_auto_default_count(db: Any) -> None:
    docs = [{"_id": i, "v": v} for i, v in enumerate([4, 0, 2, 1, 2**31 - 1])]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 2}}])
    # round(5 / 2) = 3 per bucket; max is the next bucket's min, the last one's own max
    assert out == [
        [("_id", [("min", ("int", 0)), ("max", ("int", 4))]), ("count", ("int", 3))],
        [("_id", [("min", ("int", 4)), ("max", ("int", 2**31 - 1))]), ("count", ("int", 2))],
    ]


def test_bucket_auto_equal_values_stay_together(db: Any) -> None:
    docs = [{"_id": i, "v": v} for i, v in enumerate([1, 1, 1, 1.0, 2, 3])]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 3,
                                          "output": {"ids": {"$push": "$_id"}}}}])
    assert out == [
        [("_id", [("min", ("int", 1)), ("max", ("int", 2))]),
         ("ids", [("int", 0), ("int", 1), ("int", 2), ("int", 3)])],
        # two per bucket: this one is full, and no third is made
        [("_id", [("min", ("int", 2)), ("max", ("int", 3))]), ("ids", [("int", 4), ("int", 5)])],
    ]


def test_bucket_auto_last_bucket_takes_the_rest(db: Any) -> None:
    docs = [{"_id": i, "v": i} for i in range(7)]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 3}}])
    assert [d[1] for d in out] == [("count", ("int", 2)), ("count", ("int", 2)),
                                   ("count", ("int", 3))]


def test_bucket_auto_more_buckets_than_documents(db: Any) -> None:
    docs = [{"_id": 1, "v": "b"}, {"_id": 2}, {"_id": 3, "v": None}, {"_id": 4, "v": 5}]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 10,
                                          "output": {"n": {"$sum": 1}, "f": {"$first": "$x"}}}}])
    # missing sorts (and is grouped) as null
    assert out == [
        [("_id", [("min", ("NoneType", None)), ("max", ("int", 5))]), ("n", ("int", 2)),
         ("f", ("NoneType", None))],
        [("_id", [("min", ("int", 5)), ("max", ("str", "b"))]), ("n", ("int", 1)),
         ("f", ("NoneType", None))],
        [("_id", [("min", ("str", "b")), ("max", ("str", "b"))]), ("n", ("int", 1)),
         ("f", ("NoneType", None))],
    ]


def test_bucket_auto_expression_and_empty_input(db: Any) -> None:
    docs = [{"_id": i, "v": i} for i in range(4)]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": {"$multiply": ["$v", -1]}, "buckets": 1,
                                          "output": {"s": {"$sum": "$v"}}}}])
    assert out == [[("_id", [("min", ("int", -3)), ("max", ("int", 0))]), ("s", ("int", 6))]]
    assert run(db, [], [{"$bucketAuto": {"groupBy": "$v", "buckets": 2}}]) == []


@pytest.mark.parametrize("spec, code, message", [
    (1, 40240, "The argument to $bucketAuto must be an object, but found type: int"),
    ({"groupBy": "v", "buckets": 1}, 40239,
     "The $bucketAuto 'groupBy' field must be defined as a $-prefixed path or an expression "
     'object, but found: "v"'),
    ({"groupBy": "$", "buckets": 1}, 40239,
     "The $bucketAuto 'groupBy' field must be defined as a $-prefixed path or an expression "
     'object, but found: "$"'),
    ({"groupBy": "$v", "buckets": "2"}, 40241,
     "The $bucketAuto 'buckets' field must be a numeric value, but found type: string"),
    ({"groupBy": "$v", "buckets": 2.5}, 40242,
     "The $bucketAuto 'buckets' field must be representable as a 32-bit integer, but found "
     "2.5"),
    ({"groupBy": "$v", "buckets": 0}, 40243,
     "The $bucketAuto 'buckets' field must be greater than 0, but found: 0"),
    ({"groupBy": "$v", "buckets": 2, "output": 1}, 40244,
     "The $bucketAuto 'output' field must be an object, but found type: int"),
    ({"groupBy": "$v", "buckets": 2, "bad": 1}, 40245, "Unrecognized option to $bucketAuto: bad"),
    ({"groupBy": "$v"}, 40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified"),
    ({"buckets": -1}, 40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified"),
    ({"groupBy": "$v", "buckets": 2, "granularity": 5}, 40261,
     "The $bucketAuto 'granularity' field must be a string, but found type: int"),
    ({"groupBy": "$v", "buckets": 2, "output": {"x": {"$foo": 1}}}, 15952,
     "unknown group operator '$foo'"),
    ({"groupBy": "$v", "buckets": 2, "output": {"x": {"$firstN": {"n": "$v", "input": 1}}}},
     4544714, "Can't refer to the group key in $bucketAuto"),
])
def test_bucket_auto_errors(db: Any, spec: Any, code: int, message: str) -> None:
    assert error(db, [{"_id": 1, "v": 1}], [{"$bucketAuto": spec}]) == (code, message)


def test_bucket_auto_documented_example(db: Any) -> None:
    # the MongoDB community forum's example: _id 1..100 (and 1..101) in 5 buckets
    docs = [{"_id": i} for i in range(1, 101)]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$_id", "buckets": 5}}])
    assert out == [[("_id", [("min", ("int", lo)), ("max", ("int", hi))]), ("count", ("int", 20))]
                   for lo, hi in [(1, 21), (21, 41), (41, 61), (61, 81), (81, 100)]]
    out = run(db, [*docs, {"_id": 101}], [{"$bucketAuto": {"groupBy": "$_id", "buckets": 5}}])
    assert out[-1] == [("_id", [("min", ("int", 81)), ("max", ("int", 101))]),
                       ("count", ("int", 21))]


# -- $bucketAuto granularity -----------------------------------------------------------------


def test_granularity_near_zero(db: Any) -> None:
    # jstests/aggregation/sources/bucketauto/granularity_near_zero.js (SERVER-57091)
    coll = db["c"]
    coll.drop()
    coll.insert_one({"v": 4.940656484124654e-324})
    out = list(coll.aggregate([{"$bucketAuto": {"groupBy": "$v", "buckets": Int64(8),
                                                "granularity": "R80"}}]))
    assert out == [{"_id": {"min": 0, "max": 1.02e-321}, "count": 1}]


def test_granularity_powers_of_two(db: Any) -> None:
    # rounding the max up to the next power pulls the values below it into the bucket; the
    # powers are ExpressionPow's ints
    docs = [{"_id": i, "p": p} for i, p in enumerate([3, 8, 12, 18, 35, 45, 60, 230])]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$p", "buckets": 4,
                                          "granularity": "POWERSOF2"}}])
    assert out == [
        [("_id", [("min", ("int", 2)), ("max", ("int", 16))]), ("count", ("int", 3))],
        [("_id", [("min", ("int", 16)), ("max", ("int", 64))]), ("count", ("int", 4))],
        [("_id", [("min", ("int", 64)), ("max", ("int", 256))]), ("count", ("int", 1))],
    ]
    docs = [{"_id": 1, "p": 0.3}, {"_id": 2, "p": 2**40}]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$p", "buckets": 2,
                                          "granularity": "POWERSOF2"}}])
    assert out == [
        [("_id", [("min", ("float", 0.25)), ("max", ("float", 0.5))]), ("count", ("int", 1))],
        [("_id", [("min", ("float", 0.5)), ("max", ("Int64", 2**41))]), ("count", ("int", 1))],
    ]


def test_granularity_preferred_numbers(db: Any) -> None:
    # R20: 100, 112, 125 ... 630, 710, 800, 900 times powers of ten, scaled in doubles
    docs = [{"_id": i} for i in range(100)]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$_id", "buckets": 5,
                                          "granularity": "R20"}}])
    assert out == [
        [("_id", [("min", ("int", 0)), ("max", ("float", 20.0))]), ("count", ("int", 20))],
        [("_id", [("min", ("float", 20.0)), ("max", ("float", 40.0))]), ("count", ("int", 20))],
        [("_id", [("min", ("float", 40.0)), ("max", ("float", 63.0))]), ("count", ("int", 23))],
        [("_id", [("min", ("float", 63.0)), ("max", ("float", 90.0))]), ("count", ("int", 27))],
        [("_id", [("min", ("float", 90.0)), ("max", ("float", 100.0))]),
         ("count", ("int", 10))],
    ]


def test_granularity_zero_max_takes_the_next_min_rounded_down(db: Any) -> None:
    docs = [{"_id": 1, "v": 0}, {"_id": 2, "v": 0}, {"_id": 3, "v": 5}]
    out = run(db, docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 2, "granularity": "R5"}}])
    assert out == [
        [("_id", [("min", ("int", 0)), ("max", ("float", 4.0))]), ("count", ("int", 2))],
        [("_id", [("min", ("float", 4.0)), ("max", ("float", 63 * 0.1))]),
         ("count", ("int", 1))],
    ]


@pytest.mark.parametrize("value, code, message", [
    ("x", 40258, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
                 "found a value with type: string"),
    (None, 40258, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
                  "found a value with type: null"),
    (float("nan"), 40259, "$bucketAuto can specify a 'granularity' with numeric boundaries "
                          "only, but found a NaN"),
    (-1, 40260, "$bucketAuto can specify a 'granularity' with non-negative numbers only, but "
                "found a negative number"),
])
def test_granularity_value_errors(db: Any, value: Any, code: int, message: str) -> None:
    docs = [{"_id": 1, "v": 1}, {"_id": 2, "v": value}]
    stage = {"$bucketAuto": {"groupBy": "$v", "buckets": 2, "granularity": "E12"}}
    assert error(db, docs, [stage]) == (code, message)


def test_granularity_missing_value_and_unknown_series(db: Any) -> None:
    stage = {"$bucketAuto": {"groupBy": "$zz", "buckets": 2, "granularity": "E12"}}
    assert error(db, [{"_id": 1}], [stage]) == (
        40258, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but found "
        "a value with type: missing")
    stage = {"$bucketAuto": {"groupBy": "$v", "buckets": 2, "granularity": "R7"}}
    assert error(db, [{"_id": 1}], [stage]) == (40257, "Unknown rounding granularity 'R7'")
