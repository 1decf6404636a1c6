"""The `$group` accumulators (pipeline_stages/accumulators.py) through a real pymongo client
against the embedded store, as mongod 8.0 computes them (accumulator_sum.cpp,
accumulator_avg.cpp, accumulator_min_max.cpp, accumulator_first.cpp, accumulator_last.cpp,
accumulator_push.cpp, accumulator_add_to_set.cpp, accumulator_merge_objects.cpp,
accumulator_std_dev.cpp, accumulator_multi.cpp)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson import Decimal128, Int64

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db() -> Any:
    with EmbeddedServer() as server:
        yield server.client().get_database("accumulators")


def group(db: Any, docs: list[dict[str, Any]], fields: dict[str, Any], key: Any = None) -> Any:
    """The one group's fields (after `_id`) as (name, type name, value) triples."""
    coll = db["c"]
    coll.drop()
    if docs:
        coll.insert_many(docs)
    out = list(coll.aggregate([{"$group": {"_id": key, **fields}}]))
    assert len(out) == 1
    doc = out[0]
    assert list(doc)[0] == "_id"
    return [(k, type(v).__name__, v) for k, v in list(doc.items())[1:]]


def error(db: Any, docs: list[dict[str, Any]], fields: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        group(db, docs, fields)
    return info.value.code, info.value.details["errmsg"]


def docs_of(field: str, values: list[Any]) -> list[dict[str, Any]]:
    return [{"_id": i, field: v} for i, v in enumerate(values)]


# -- $sum, $avg, $count ----------------------------------------------------------------------


def test_sum_types(db: Any) -> None:
    big = 2**31 - 1
    assert group(db, docs_of("v", [1, 2]), {"s": {"$sum": "$v"}}) == [("s", "int", 3)]
    assert group(db, docs_of("v", [big, big]), {"s": {"$sum": "$v"}}) == [
        ("s", "Int64", 2 * big)]
    assert group(db, docs_of("v", [Int64(1), 2]), {"s": {"$sum": "$v"}}) == [("s", "Int64", 3)]
    assert group(db, docs_of("v", [Int64(2**62)] * 2), {"s": {"$sum": "$v"}}) == [
        ("s", "float", 2.0**63)]
    assert group(db, docs_of("v", [1, 2.5]), {"s": {"$sum": "$v"}}) == [("s", "float", 3.5)]
    assert group(db, docs_of("v", [1, Decimal128("2.5")]), {"s": {"$sum": "$v"}}) == [
        ("s", "Decimal128", Decimal128("3.5"))]


def test_sum_skips_non_numbers(db: Any) -> None:
    values = [True, "3", [1, 2], None, {"a": 1}, 4]
    assert group(db, docs_of("v", values) + [{"_id": 9}], {"s": {"$sum": "$v"}}) == [
        ("s", "int", 4)]
    assert group(db, docs_of("v", ["x"]), {"s": {"$sum": "$v"}}) == [("s", "int", 0)]


def test_sum_of_doubles_is_compensated_a_constant_is_not(db: Any) -> None:
    # DoubleDoubleSummation for values; plain additions for a constant addend
    assert group(db, docs_of("v", [0.1] * 10), {"s": {"$sum": "$v"}, "c": {"$sum": 0.1}}) == [
        ("s", "float", 1.0), ("c", "float", 0.9999999999999999)]


def test_sum_of_decimals_and_doubles(db: Any) -> None:
    values = [Decimal128("1.5")] + [0.1] * 9
    assert group(db, docs_of("v", values), {"s": {"$sum": "$v"}}) == [
        ("s", "Decimal128", Decimal128("2.400000000000000049960036108132044"))]


def test_count(db: Any) -> None:
    assert group(db, docs_of("v", [1, None, 3]), {"n": {"$count": {}}}) == [("n", "int", 3)]
    assert error(db, docs_of("v", [1]), {"n": {"$count": 1}}) == (
        14, "$count takes no arguments, i.e. $count:{}")
    assert error(db, docs_of("v", [1]), {"n": {"$count": {"a": 1}}}) == (
        14, "$count takes no arguments, i.e. $count:{}")


def test_avg(db: Any) -> None:
    assert group(db, docs_of("v", [1, 2]), {"a": {"$avg": "$v"}}) == [("a", "float", 1.5)]
    assert group(db, docs_of("v", [2, 2]), {"a": {"$avg": "$v"}}) == [("a", "float", 2.0)]
    assert group(db, docs_of("v", [1, "x", None]), {"a": {"$avg": "$v"}}) == [
        ("a", "float", 1.0)]
    assert group(db, docs_of("v", ["x"]), {"a": {"$avg": "$v"}}) == [("a", "NoneType", None)]
    assert group(db, docs_of("v", [1, Decimal128("2")]), {"a": {"$avg": "$v"}}) == [
        ("a", "Decimal128", Decimal128("1.5"))]


# -- $min, $max, $first, $last, $push, $addToSet, $mergeObjects ------------------------------


def test_min_max_skip_null_and_missing(db: Any) -> None:
    docs = docs_of("v", [None, 3, "a", 1.5]) + [{"_id": 9}]
    assert group(db, docs, {"mn": {"$min": "$v"}, "mx": {"$max": "$v"}}) == [
        ("mn", "float", 1.5), ("mx", "str", "a")]
    assert group(db, docs_of("v", [None]), {"mn": {"$min": "$v"}, "mx": {"$max": "$v"}}) == [
        ("mn", "NoneType", None), ("mx", "NoneType", None)]


def test_min_max_keep_the_first_of_equal_values(db: Any) -> None:
    docs = docs_of("v", [1.0, 1, Int64(1)])
    assert group(db, docs, {"mn": {"$min": "$v"}, "mx": {"$max": "$v"}}) == [
        ("mn", "float", 1.0), ("mx", "float", 1.0)]


def test_first_last_of_missing_are_null(db: Any) -> None:
    docs = [{"_id": 1}, {"_id": 2, "v": 2}, {"_id": 3}]
    assert group(db, docs, {"f": {"$first": "$v"}, "l": {"$last": "$v"}}) == [
        ("f", "NoneType", None), ("l", "NoneType", None)]
    docs = [{"_id": 1, "v": 1}, {"_id": 2}, {"_id": 3, "v": 3}]
    assert group(db, docs, {"f": {"$first": "$v"}, "l": {"$last": "$v"}}) == [
        ("f", "int", 1), ("l", "int", 3)]


def test_push_keeps_order_and_null_skips_missing(db: Any) -> None:
    docs = [{"_id": 1, "v": 3}, {"_id": 2}, {"_id": 3, "v": None}, {"_id": 4, "v": 1}]
    assert group(db, docs, {"p": {"$push": "$v"}}) == [("p", "list", [3, None, 1])]


def test_add_to_set(db: Any) -> None:
    docs = docs_of("v", [0, 2, 4, 2, 0.0])
    assert group(db, docs, {"s": {"$addToSet": "$v"}}) == [("s", "list", [0, 2, 4])]
    docs = docs_of("v", [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1, "b": 2}]) + [{"_id": 9}]
    assert group(db, docs, {"s": {"$addToSet": "$v"}}) == [
        ("s", "list", [{"a": 1, "b": 2}, {"b": 2, "a": 1}])]


def test_merge_objects(db: Any) -> None:
    docs = docs_of("v", [{"a": 1, "b": 1}, None, {"b": 2, "c": 3}]) + [{"_id": 9}]
    out = group(db, docs, {"m": {"$mergeObjects": "$v"}})
    assert out == [("m", "dict", {"a": 1, "b": 2, "c": 3})]
    assert list(out[0][2]) == ["a", "b", "c"]
    assert group(db, [{"_id": 1}], {"m": {"$mergeObjects": "$v"}}) == [("m", "dict", {})]
    assert error(db, docs_of("v", ["x"]), {"m": {"$mergeObjects": "$v"}}) == (
        40400, '$mergeObjects requires object inputs, but input "x" is of type string')


# -- $stdDevPop, $stdDevSamp -----------------------------------------------------------------


def test_std_dev(db: Any) -> None:
    docs = docs_of("v", [1, 2, 3, 4, "x", None])
    assert group(db, docs, {"p": {"$stdDevPop": "$v"}, "s": {"$stdDevSamp": "$v"}}) == [
        ("p", "float", 1.118033988749895), ("s", "float", 1.2909944487358056)]
    assert group(db, docs_of("v", [5]), {"p": {"$stdDevPop": "$v"},
                                         "s": {"$stdDevSamp": "$v"}}) == [
        ("p", "float", 0.0), ("s", "NoneType", None)]
    assert group(db, docs_of("v", ["x"]), {"p": {"$stdDevPop": "$v"}}) == [
        ("p", "NoneType", None)]


# -- $firstN, $lastN, $minN, $maxN -----------------------------------------------------------


def test_first_n_last_n_keep_nulls(db: Any) -> None:
    docs = [{"_id": 1, "v": 1}, {"_id": 2}, {"_id": 3, "v": None}, {"_id": 4, "v": 4}]
    assert group(db, docs, {"f": {"$firstN": {"n": 3, "input": "$v"}},
                            "l": {"$lastN": {"input": "$v", "n": 2}},
                            "all": {"$firstN": {"n": 10, "input": "$v"}}}) == [
        ("f", "list", [1, None, None]), ("l", "list", [None, 4]),
        ("all", "list", [1, None, None, 4])]


def test_min_n_max_n_skip_nulls_in_order(db: Any) -> None:
    docs = docs_of("v", [5, None, "s", 1, 3.5, 1]) + [{"_id": 9}]
    assert group(db, docs, {"mn": {"$minN": {"n": 3, "input": "$v"}},
                            "mx": {"$maxN": {"n": 2, "input": "$v"}},
                            "few": {"$maxN": {"n": 9, "input": "$v"}}}) == [
        ("mn", "list", [1, 1, 3.5]), ("mx", "list", ["s", 5]),
        ("few", "list", ["s", 5, 3.5, 1, 1])]


def test_max_n_among_equal_values(db: Any) -> None:
    # mongod's multiset: a larger value evicts the earliest of the equal smallest ones, and
    # equal values come out latest first
    docs = docs_of("v", [5.0, Int64(5), 7])
    assert group(db, docs, {"mx": {"$maxN": {"n": 2, "input": "$v"}}}) == [
        ("mx", "list", [7, 5])]
    out = group(db, docs, {"mx": {"$maxN": {"n": 2, "input": "$v"}}})
    assert [type(v).__name__ for v in out[0][2]] == ["int", "Int64"]
    out = group(db, docs_of("v", [5.0, Int64(5)]), {"mx": {"$maxN": {"n": 3, "input": "$v"}}})
    assert [type(v).__name__ for v in out[0][2]] == ["Int64", "float"]


def test_n_from_the_group_key(db: Any) -> None:
    coll = db["c"]
    coll.drop()
    coll.insert_many([{"_id": i, "k": 1 + i % 2, "v": i} for i in range(6)])
    out = list(coll.aggregate([{"$group": {
        "_id": {"k": "$k"}, "f": {"$firstN": {"n": "$k", "input": "$v"}}}}]))
    assert out == [{"_id": {"k": 1}, "f": [0]}, {"_id": {"k": 2}, "f": [1, 3]}]


@pytest.mark.parametrize("spec, code, message", [
    ({"$firstN": 5}, 5787801, "specification must be an object; found $firstN: 5"),
    ({"$maxN": "x"}, 5787900, 'specification must be an object; found $maxN: "x"'),
    ({"$firstN": {"n": 1, "input": "$v", "x": 1}}, 5787901,
     "Unknown argument for 'n' operator: x"),
    ({"$lastN": {"input": "$v"}}, 5787906, "Missing value for 'n'"),
    ({"$minN": {"n": 2}}, 5787907, "Missing value for 'input'"),
    ({"$firstN": {"n": "a", "input": "$v"}}, 5787902,
     "Value for 'n' must be of integral type, but found \"a\""),
    ({"$firstN": {"n": 2.5, "input": "$v"}}, 5787903,
     "Value for 'n' must be of integral type, but found 2.5"),
    ({"$maxN": {"n": 0, "input": "$v"}}, 5787908, "'n' must be greater than 0, found 0"),
    ({"$maxN": {"n": Int64(-3), "input": "$v"}}, 5787908,
     "'n' must be greater than 0, found -3"),
])
def test_n_errors(db: Any, spec: Any, code: int, message: str) -> None:
    assert error(db, docs_of("v", [1]), {"x": spec}) == (code, message)


# -- $top, $bottom, $topN, $bottomN ----------------------------------------------------------


SCORES = [{"_id": 1, "p": "a", "s": 31}, {"_id": 2, "p": "b", "s": 33},
          {"_id": 3, "p": "c", "s": 99}, {"_id": 4, "p": "d", "s": 1},
          {"_id": 5, "p": "e"}, {"_id": 6, "p": "f", "s": [50, 2]}]


def test_top_bottom_n_in_sort_order(db: Any) -> None:
    # a missing sort value is null (first ascending); an array by its least element
    # ascending, its greatest descending
    assert group(db, SCORES, {
        "top": {"$topN": {"n": 3, "sortBy": {"s": 1}, "output": "$p"}},
        "bottom": {"$bottomN": {"n": 2, "sortBy": {"s": 1}, "output": "$p"}},
        "topDesc": {"$topN": {"n": 2, "sortBy": {"s": -1}, "output": {"p": "$p", "s": "$s"}}},
    }) == [("top", "list", ["e", "d", "f"]), ("bottom", "list", ["b", "c"]),
           ("topDesc", "list", [{"p": "c", "s": 99}, {"p": "f", "s": [50, 2]}])]


def test_top_bottom_single(db: Any) -> None:
    assert group(db, SCORES, {
        "top": {"$top": {"sortBy": {"s": -1}, "output": "$p"}},
        "bottom": {"$bottom": {"output": "$p", "sortBy": {"s": -1}}},
        "missing": {"$top": {"sortBy": {"s": 1}, "output": "$s"}},
    }) == [("top", "str", "c"), ("bottom", "str", "e"), ("missing", "NoneType", None)]


def test_top_bottom_ties_keep_the_first_met(db: Any) -> None:
    docs = [{"_id": i, "k": k, "t": t} for i, (k, t) in enumerate(
        [(1, "a"), (2, "b"), (1, "c"), (2, "d"), (1, "e")])]
    assert group(db, docs, {
        "top": {"$topN": {"n": 2, "sortBy": {"k": 1}, "output": "$t"}},
        "bottom": {"$bottomN": {"n": 2, "sortBy": {"k": 1}, "output": "$t"}},
        "two": {"$topN": {"n": 3, "sortBy": {"k": -1, "t": -1}, "output": "$t"}},
    }) == [("top", "list", ["a", "c"]), ("bottom", "list", ["b", "d"]),
           ("two", "list", ["d", "b", "e"])]


@pytest.mark.parametrize("spec, code, message", [
    ({"$top": 1}, 5788001, "specification must be an object; found $top: 1"),
    ({"$top": {"n": 1, "sortBy": {"a": 1}, "output": 1}}, 5788002,
     "Unknown argument to $top 'n'"),
    ({"$topN": {"n": 1, "sortBy": {"a": 1}, "output": 1, "x": 1}}, 5788002,
     "Unknown argument to $topN 'x'"),
    ({"$topN": {"sortBy": {"a": 1}, "output": 1}}, 5788003, "Missing value for 'n'"),
    ({"$bottom": {"sortBy": {"a": 1}}}, 5788004, "Missing value for 'output'"),
    ({"$bottomN": {"n": 2, "output": 1}}, 5788005, "Missing value for 'sortBy'"),
    ({"$top": {"sortBy": {"a": "x"}, "output": 1}}, 15974,
     'Illegal key in $sort specification: a: "x"'),
    ({"$top": {"sortBy": {"a": 2}, "output": 1}}, 15975,
     "$sort key ordering must be 1 (for ascending) or -1 (for descending)"),
    ({"$topN": {"n": 0, "sortBy": {"a": 1}, "output": 1}}, 5787908,
     "'n' must be greater than 0, found 0"),
])
def test_top_bottom_errors(db: Any, spec: Any, code: int, message: str) -> None:
    assert error(db, docs_of("v", [1]), {"x": spec}) == (code, message)
