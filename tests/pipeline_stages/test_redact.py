"""`$redact` on the embedded store (pipeline_stages/redact.py), through pymongo: $$DESCEND into
embedded documents and arrays of them, $$PRUNE, $$KEEP, $$ROOT against $$CURRENT, and mongod
8.0's error 17053 for any other result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

LEVEL_5_PRUNED = {"$cond": {"if": {"$eq": ["$level", 5]}, "then": "$$PRUNE",
                            "else": "$$DESCEND"}}
DOC = {
    "_id": 1, "level": 1,
    "a": {"level": 1, "b": {"level": 5, "c": {"level": 1, "message": "Hello"}}},
    "d": "World",
    "list": [{"level": 5}, {"level": 2, "x": [{"level": 5}, 7, [{"level": 3}]]}, 4, [1]],
}


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        client: Any = server.client()
        collection = client.redact_tests.c
        collection.insert_many([DOC, {"_id": 2, "level": 5, "a": 1}, {"_id": 3}])
        yield collection
        client.close()


def _failure(coll: Collection[Any], pipeline: list[Any]) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        list(coll.aggregate(pipeline))
    return info.value.code, info.value.details["errmsg"]


def test_descend_prunes_embedded_documents_and_array_elements(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$redact": LEVEL_5_PRUNED}]))
    assert out == [
        {"_id": 1, "level": 1, "a": {"level": 1}, "d": "World",
         "list": [{"level": 2, "x": [7, [{"level": 3}]]}, 4, [1]]},
        {"_id": 3},
    ]


def test_keep_and_prune_whole_documents(coll: Collection[Any]) -> None:
    keep_level_1 = {"$cond": [{"$eq": ["$level", 1]}, "$$KEEP", "$$PRUNE"]}
    assert list(coll.aggregate([{"$redact": keep_level_1}])) == [DOC]
    assert list(coll.aggregate([{"$redact": "$$PRUNE"}])) == []
    assert list(coll.aggregate([{"$redact": "$$KEEP"}, {"$count": "n"}])) == [{"n": 3}]


def test_root_is_the_whole_document_current_the_embedded_one(coll: Collection[Any]) -> None:
    # embedded documents are kept when the root's _id is 1 and their own level is below 5
    spec = {"$cond": [{"$and": [{"$eq": ["$$ROOT._id", 1]}, {"$ne": ["$$CURRENT.level", 5]}]},
                      "$$DESCEND", "$$PRUNE"]}
    out = list(coll.aggregate([{"$redact": spec}]))
    assert out == [{"_id": 1, "level": 1, "a": {"level": 1}, "d": "World",
                    "list": [{"level": 2, "x": [7, [{"level": 3}]]}, 4, [1]]}]


def test_a_computed_string_decides_as_the_variable(coll: Collection[Any]) -> None:
    out = list(coll.aggregate([{"$match": {"_id": 2}},
                               {"$redact": {"$concat": ["ke", "ep"]}}]))
    assert out == [{"_id": 2, "level": 5, "a": 1}]


@pytest.mark.parametrize(("spec", "shown"), [
    (1, "1"),
    ("$level", "MISSING"),
    ({"$literal": "other"}, '"other"'),
    ({"$literal": {"k": 1}}, "{k: 1}"),
])
def test_any_other_result_is_17053(coll: Collection[Any], spec: Any, shown: str) -> None:
    pipeline = [{"$match": {"_id": 3}}, {"$redact": spec}]
    assert _failure(coll, pipeline) == (
        17053, "$redact's expression should not return anything aside from the variables "
        f"$$KEEP, $$DESCEND, and $$PRUNE, but returned {shown}")
