"""`$unionWith` on the embedded store (pipeline_stages/union_with.py), through pymongo: the
input's documents then the other collection's through its sub-pipeline, and mongod 8.0's parse
errors for a bad spec."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import errors
from pymongo.database import Database

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db() -> Iterator[Database[Any]]:
    with EmbeddedServer() as server:
        client: Any = server.client()
        database = client.union_tests
        database.a.insert_many([{"_id": 1, "x": 1}, {"_id": 2, "x": 2}])
        database.b.insert_many([{"_id": 10, "y": "p"}, {"_id": 11, "y": "q"}])
        yield database
        client.close()


def _failure(db: Database[Any], pipeline: list[Any]) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        list(db.a.aggregate(pipeline))
    return info.value.code, info.value.details["errmsg"]


def test_collection_name_appends_its_documents(db: Database[Any]) -> None:
    assert list(db.a.aggregate([{"$unionWith": "b"}])) == [
        {"_id": 1, "x": 1}, {"_id": 2, "x": 2}, {"_id": 10, "y": "p"}, {"_id": 11, "y": "q"},
    ]


def test_sub_pipeline_runs_on_the_other_collection_only(db: Database[Any]) -> None:
    out = list(db.a.aggregate([
        {"$match": {"x": 2}},
        {"$unionWith": {"coll": "b", "pipeline": [{"$match": {"y": "q"}},
                                                  {"$project": {"_id": 0, "z": "$y"}}]}},
        {"$sort": {"_id": -1}},
    ]))
    assert out == [{"_id": 2, "x": 2}, {"z": "q"}]


def test_missing_collection_adds_nothing_and_stages_follow(db: Database[Any]) -> None:
    assert list(db.a.aggregate([{"$unionWith": {"coll": "none"}}, {"$count": "n"}])) == [
        {"n": 2}]
    assert list(db.a.aggregate([{"$unionWith": "a"}, {"$count": "n"}])) == [{"n": 4}]


def test_inside_a_lookup_pipeline(db: Database[Any]) -> None:
    union = {"$unionWith": {"coll": "a", "pipeline": [{"$project": {"x": 1}}]}}
    out = list(db.a.aggregate([
        {"$match": {"_id": 1}},
        {"$lookup": {"from": "b", "pipeline": [{"$project": {"_id": 1}}, union], "as": "j"}},
    ]))
    assert out == [{"_id": 1, "x": 1, "j": [{"_id": 10}, {"_id": 11}, {"_id": 1, "x": 1},
                                          {"_id": 2, "x": 2}]}]


def test_collectionless_form_with_documents(db: Database[Any]) -> None:
    out = list(db.a.aggregate([
        {"$match": {"_id": 1}},
        {"$unionWith": {"pipeline": [{"$documents": [{"d": 1}, {"d": 2}]}, {"$match": {"d": 2}}]}},
    ]))
    assert out == [{"_id": 1, "x": 1}, {"d": 2}]


def test_unionwith_does_not_change_the_stored_documents(db: Database[Any]) -> None:
    list(db.a.aggregate([{"$unionWith": {"coll": "b", "pipeline": [{"$set": {"y": 0}}]}}]))
    assert list(db.b.find({}, {"_id": 0})) == [{"y": "p"}, {"y": "q"}]


@pytest.mark.parametrize(("spec", "code", "message"), [
    (1, 9, "the $unionWith stage specification must be an object or string, but found int"),
    ({"coll": 1}, 14, "BSON field '$unionWith.coll' is the wrong type 'int', expected type "
     "'string'"),
    ({"coll": "b", "pipeline": {}}, 14, "BSON field '$unionWith.pipeline' is the wrong type "
     "'object', expected type 'array'"),
    ({"coll": "b", "other": 1}, 40415, "BSON field '$unionWith.other' is an unknown field."),
    ({}, 9, "$unionWith stage without explicit collection must have a pipeline with $documents "
     "as first stage"),
    ({"pipeline": [{"$match": {}}]}, 9, "$unionWith stage without explicit collection must have "
     "a pipeline with $documents as first stage"),
    ({"coll": "b", "pipeline": [{"$out": "c"}]}, 31441,
     "$out is not allowed within a $unionWith's sub-pipeline"),
])
def test_parse_errors(db: Database[Any], spec: Any, code: int, message: str) -> None:
    assert _failure(db, [{"$unionWith": spec}]) == (code, message)
