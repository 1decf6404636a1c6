"""The `let` option of find, aggregate, update, delete and findAndModify against the embedded
store, through pymongo: `$$name` in `$expr` and in pipelines reads the command's variables
(evaluated once, before any document), and mongod's errors for a bad `let`."""

from __future__ import annotations

import pytest
from pymongo import MongoClient, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

ID_IS = {"$expr": {"$eq": ["$_id", "$$id"]}}


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.let_tests.c
    collection.insert_many([{"_id": 1, "name": "a"}, {"_id": 2, "name": "a"}, {"_id": 3}])
    yield collection
    client.close()


def _failure(call) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        call()
    return info.value.code, info.value.details["errmsg"]


def test_find_reads_let_variables_in_expr(coll: Collection) -> None:
    assert list(coll.find(ID_IS, let={"id": 2})) == [{"_id": 2, "name": "a"}]
    # outside $expr `$$id` is a string like any other
    assert list(coll.find({"name": "$$id"}, let={"id": 2})) == []


def test_aggregate_let_in_match_and_project(coll: Collection) -> None:
    out = list(coll.aggregate(
        [{"$match": ID_IS}, {"$project": {"_id": 0, "x": "$$x", "y": "$$y", "r": "$$r"}}],
        let={"id": 1, "x": "foo", "y": {"$literal": "$bar"}, "r": {"$rand": {}}},
    ))
    assert len(out) == 1
    assert out[0]["x"] == "foo" and out[0]["y"] == "$bar"
    assert isinstance(out[0]["r"], float) and 0 <= out[0]["r"] < 1


def test_let_variables_are_shadowed_by_inner_scopes(coll: Collection) -> None:
    out = list(coll.aggregate(
        [{"$match": ID_IS},
         {"$project": {"_id": 0, "m": {"$map": {"input": [1, 2], "as": "id",
                                                 "in": {"$add": ["$$id", "$$k"]}}}}}],
        let={"id": 3, "k": 10},
    ))
    assert out == [{"m": [11, 12]}]


def test_update_delete_and_find_and_modify_with_let(coll: Collection) -> None:
    result = coll.update_one(ID_IS, [{"$set": {"x": "$$x"}}], let={"id": 1, "x": "foo"})
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert coll.find_one({"_id": 1}) == {"_id": 1, "name": "a", "x": "foo"}
    before = coll.find_one_and_update(ID_IS, [{"$set": {"x": "$$x"}}], let={"id": 2, "x": "z"})
    assert before == {"_id": 2, "name": "a"}
    assert coll.find_one({"_id": 2})["x"] == "z"
    assert coll.delete_many({"$expr": {"$eq": ["$name", "$$n"]}}, let={"n": "a"}).deleted_count == 2
    assert list(coll.find()) == [{"_id": 3}]


def test_bad_let_gets_mongods_errors(coll: Collection) -> None:
    db = coll.database
    assert _failure(lambda: db.command({"find": "c", "let": 1})) == (
        14, "BSON field 'find.let' is the wrong type 'int', expected type 'object'")
    assert _failure(lambda: list(coll.find({}, let={"Id": 1}))) == (
        9, "Invalid 'let' parameter :: caused by :: 'Id' starts with an invalid character for "
        "a user variable name")
    assert _failure(lambda: list(coll.find({}, let={"a-b": 1}))) == (
        9, "Invalid 'let' parameter :: caused by :: 'a-b' contains an invalid character for a "
        "variable name: '-'")
    code, _ = _failure(lambda: list(coll.find({}, let={"NOW": 1})))
    assert code == 4738901
    code, message = _failure(lambda: list(coll.find({}, let={"v": "$name"})))
    assert code == 4890500 and "Command let Expression tried to access a field" in message
