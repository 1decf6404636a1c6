"""`$bucket` and `$sortByCount` (pipeline_stages/bucket_stage.py) through a real pymongo client
against the embedded store, as mongod 8.0 answers them (document_source_bucket.cpp,
document_source_sort_by_count.cpp, jstests/aggregation/sources/bucket/)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson import Int64

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db() -> Any:
    with EmbeddedServer() as server:
        yield server.client().get_database("bucket_stage")


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


def error(db: Any, spec: Any, stage: str = "$bucket") -> tuple[int, str]:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        run(db, [{"_id": 1, "x": 1}], [{stage: spec}])
    return info.value.code, info.value.details["errmsg"]


DOCS = [{"_id": 1, "x": 0, "v": 0}, {"_id": 2, "x": 5, "v": 0}, {"_id": 3, "x": 12.5, "v": 1},
        {"_id": 4, "v": 2}, {"_id": 5, "x": "a", "v": 0}, {"_id": 6, "x": Int64(20), "v": 3}]


def test_buckets_id_first_accumulators_in_order_default_last_by_bson_order(db: Any) -> None:
    out = run(db, DOCS, [{"$bucket": {
        "groupBy": "$x", "boundaries": [0, 10, 20], "default": "other",
        "output": {"s": {"$addToSet": "$v"}, "n": {"$sum": 1}}}}])
    # 0 stays 0 in $addToSet; 20 is past the last boundary; missing and "a" go to default.
    assert out[:2] == [
        [("_id", ("int", 0)), ("s", [("int", 0)]), ("n", ("int", 2))],
        [("_id", ("int", 10)), ("s", [("int", 1)]), ("n", ("int", 1))],
    ]
    assert out[2][0] == ("_id", ("str", "other"))
    assert sorted(out[2][1][1]) == [("int", 0), ("int", 2), ("int", 3)]
    assert out[2][2] == ("n", ("int", 3))


def test_default_count_and_default_sorted_among_buckets(db: Any) -> None:
    out = run(db, DOCS, [{"$bucket": {"groupBy": "$x", "boundaries": [0, 10, 20],
                                      "default": -1}}])
    assert out == [[("_id", ("int", -1)), ("count", ("int", 3))],
                   [("_id", ("int", 0)), ("count", ("int", 2))],
                   [("_id", ("int", 10)), ("count", ("int", 1))]]


def test_empty_output_has_only_id_and_boundaries_may_be_expressions(db: Any) -> None:
    out = run(db, DOCS[:3], [{"$bucket": {"groupBy": {"$add": ["$x", 1]},
                                          "boundaries": [0, {"$add": [5, 5]}, 20],
                                          "output": {}}}])
    assert out == [[("_id", ("int", 0))], [("_id", ("int", 10))]]


def test_n_accumulator_and_push_through_group_accumulators(db: Any) -> None:
    out = run(db, DOCS[:3], [{"$bucket": {
        "groupBy": "$x", "boundaries": [0, 100],
        "output": {"top": {"$maxN": {"input": "$x", "n": 2}}, "p": {"$push": "$missing"}}}}])
    assert out == [[("_id", ("int", 0)), ("top", [("float", 12.5), ("int", 5)]), ("p", [])]]


def test_no_matching_bucket_without_default_fails(db: Any) -> None:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        run(db, DOCS, [{"$bucket": {"groupBy": "$x", "boundaries": [0, 10]}}])
    assert info.value.code == 40066
    assert info.value.details["errmsg"].endswith(
        "$switch could not find a matching branch for an input, and no default was specified.")


@pytest.mark.parametrize(("spec", "code", "message"), [
    (5, 40201, "Argument to $bucket stage must be an object, but found type: int."),
    ({"groupBy": "x", "boundaries": [0, 1]}, 40202,
     "The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression, but "
     'found: "x".'),
    ({"groupBy": "$x", "boundaries": 1}, 40200,
     "The $bucket 'boundaries' field must be an array, but found type: int."),
    ({"groupBy": "$x", "boundaries": [0, "$a"]}, 40191,
     "The $bucket 'boundaries' field must be an array of constant values, but found value: "
     '"$a".'),
    ({"groupBy": "$x", "boundaries": [0]}, 40192,
     "The $bucket 'boundaries' field must have at least 2 values, but found 1 value(s)."),
    ({"groupBy": "$x", "boundaries": [0, "a"]}, 40193,
     "All values in the the 'boundaries' option to $bucket must have the same type. Found "
     "conflicting types int and string."),
    ({"groupBy": "$x", "boundaries": [0, 10, 10]}, 40194,
     "The 'boundaries' option to $bucket must be sorted, but elements 1 and 2 are not in "
     "ascending order (10 is not less than 10)."),
    ({"groupBy": "$x", "boundaries": [0, 1], "default": "$y"}, 40195,
     "The $bucket 'default' field must be a constant expression, but found: \"$y\"."),
    ({"groupBy": "$x", "boundaries": [0, 1], "output": 1}, 40196,
     "The $bucket 'output' field must be an object, but found type: int."),
    ({"groupBy": "$x", "boundaries": [0, 1], "bad": 1}, 40197,
     "Unrecognized option to $bucket: bad."),
    ({"groupBy": "$x"}, 40198, "$bucket requires 'groupBy' and 'boundaries' to be specified."),
    ({"groupBy": "$x", "boundaries": [0, 10], "default": 5}, 40199,
     "The $bucket 'default' field must be less than the lowest boundary or greater than or "
     "equal to the highest boundary."),
    ({"groupBy": "$x", "boundaries": [0, 10], "output": {"_id": {"$sum": 1}}}, 15948,
     "a group's _id may only be specified once"),
    ({"groupBy": "$x", "boundaries": [0, 10], "output": {"a": 1}}, 40234,
     "The field 'a' must be an accumulator object"),
])
def test_bucket_errors(db: Any, spec: Any, code: int, message: str) -> None:
    assert error(db, spec) == (code, message)


@pytest.mark.parametrize(("spec", "code"), [("k", 40148), ({"a": 1}, 40147), (1, 40149)])
def test_sort_by_count_errors(db: Any, spec: Any, code: int) -> None:
    message = ("the sortByCount field must be specified as a string or as an object"
               if code == 40149 else "the sortByCount field must be defined as a $-prefixed "
               "path or an expression inside an object")
    assert error(db, spec, "$sortByCount") == (code, message)
