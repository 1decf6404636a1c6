"""`$fill` on the embedded store (pipeline_stages/fill_stage.py), through pymongo: `method`
outputs as mongod's `$setWindowFields` ($locf / $linearFill), `value` outputs as `$ifNull`,
partitions, and mongod 8.0's parse errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        client: Any = server.client()
        collection = client.fill_tests.c
        collection.insert_many([
            {"_id": 1, "g": "a", "x": 1, "v": 10, "w": None},
            {"_id": 2, "g": "a", "x": 2},
            {"_id": 3, "g": "a", "x": 3, "v": 30},
            {"_id": 4, "g": "b", "x": 1},
            {"_id": 5, "g": "b", "x": 2, "v": 7, "w": 3},
        ])
        yield collection
        client.close()


def _failure(coll: Collection[Any], spec: Any) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        list(coll.aggregate([{"$fill": spec}]))
    return info.value.code, info.value.details["errmsg"]


def test_linear_by_partition_fields_and_values(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$fill": {
        "sortBy": {"x": 1}, "partitionByFields": ["g"],
        "output": {"v": {"method": "linear"}, "w": {"value": 0}},
    }}]))
    assert out == [
        {"_id": 1, "g": "a", "x": 1, "v": 10, "w": 0},
        {"_id": 2, "g": "a", "x": 2, "v": 20.0, "w": 0},
        {"_id": 3, "g": "a", "x": 3, "v": 30, "w": 0},
        {"_id": 4, "g": "b", "x": 1, "v": None, "w": 0},
        {"_id": 5, "g": "b", "x": 2, "v": 7, "w": 3},
    ]


def test_locf_sorted_without_partitions(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$fill": {"sortBy": {"x": 1, "_id": 1},
                                          "output": {"v": {"method": "locf"}}}}]))
    assert [(d["_id"], d["v"]) for d in out] == [(1, 10), (4, 10), (2, 10), (5, 7), (3, 30)]


def test_locf_partitioned_by_an_expression(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$fill": {"sortBy": {"x": 1}, "partitionBy": {"p": "$g"},
                                          "output": {"v": {"method": "locf"}}}}]))
    assert [(d["_id"], d["v"]) for d in out] == [(1, 10), (2, 10), (3, 30), (4, None), (5, 7)]


def test_values_alone_keep_the_order_and_read_the_document(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$fill": {"output": {"w": {"value": "$x"},
                                                     "n.m": {"value": 1}}}}]))
    assert [(d["_id"], d["w"], d["n"]) for d in out] == [
        (1, 1, {"m": 1}), (2, 2, {"m": 1}), (3, 3, {"m": 1}), (4, 1, {"m": 1}),
        (5, 3, {"m": 1})]
    assert list(out[1]) == ["_id", "g", "x", "w", "n"]


@pytest.mark.parametrize(("spec", "code", "message"), [
    (1, 9, "The $fill stage specification must be an object, found int"),
    ({}, 40414, "BSON field '$fill.output' is missing but a required field"),
    ({"output": {}}, 6050203,
     "The output field in '$fill' must contain an object with at least one element"),
    ({"output": {"v": 1}}, 6050200,
     "Each fill output specification must be an object with exactly one field"),
    ({"output": {"v": {"method": "locf", "value": 1}}}, 6050201,
     "Each fill output specification must have exactly one of 'method' or 'value' fields, "
     "not both"),
    ({"output": {"v": {"method": "nearest"}}}, 6050202, "Method must be either locf or linear"),
    ({"output": {"v": {"value": 1}}, "bad": 1}, 40415, "BSON field '$fill.bad' is an unknown "
     "field."),
    ({"sortBy": 1, "output": {"v": {"value": 1}}}, 14,
     "BSON field '$fill.sortBy' is the wrong type 'int', expected type 'object'"),
    ({"partitionBy": "$g", "partitionByFields": ["g"], "output": {"v": {"value": 1}}}, 6050204,
     "Maximum one of 'partitionBy' and 'partitionByFields can be specified in '$fill'"),
    ({"output": {"v": {"method": "linear"}}}, 605001,
     "$linearFill must be specified with a top level sortBy expression with exactly one "
     "element"),
])
def test_parse_errors(coll: Collection[Any], spec: Any, code: int, message: str) -> None:
    assert _failure(coll, spec) == (code, message)
