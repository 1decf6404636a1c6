"""Index options mongod checks, through pymongo: a 2d index's `min` / `max` / `bits` (72 at
createIndexes, 13027 and the other key-generation errors on writes and builds), the partial
filters a partial index refuses (67, with the offending node as mongod prints it), a sparse
index's hint counting only the documents it holds, and an explained aggregate's writeConcern
(9)."""

from __future__ import annotations

import pytest
from pymongo import errors
from pymongo.database import Database

from tests.support.embedded_support import database_for_test


@pytest.fixture
def db(client, request) -> Database:
    return database_for_test(client, request)


def _write_error(call) -> dict:
    with pytest.raises(errors.OperationFailure) as info:
        call()
    return info.value.details or {}


# -- 2d bounds --------------------------------------------------------------------------------


def test_a_point_outside_the_default_bounds_is_refused(db: Database) -> None:
    db.g.create_index([("loc", "2d")])
    db.g.insert_one({"loc": [-100, 100]})
    error = _write_error(lambda: db.g.insert_one({"_id": 1, "loc": [200, 200]}))
    assert error["code"] == 13027
    assert error["errmsg"] == ("point not in interval of [ -180, 180 ] :: caused by :: "
                               "{ _id: 1, loc: [ 200, 200 ] }")
    assert db.g.count_documents({}) == 1


def test_min_and_max_set_the_bounds(db: Database) -> None:
    db.g.create_index([("loc", "2d")], min=0, max=1024)
    db.g.insert_many([{"loc": [100, 100]}, {"loc": [200, 200]}, {"loc": [1024, 0]}])
    error = _write_error(lambda: db.g.insert_one({"_id": 2, "loc": [-200.5, -200]}))
    assert error["code"] == 13027
    assert error["errmsg"].startswith("point not in interval of [ 0, 1024 ] :: caused by :: ")
    db.g.insert_one({"_id": 3, "loc": [1, 2]})
    with pytest.raises(errors.WriteError) as info:
        db.g.update_one({"_id": 3}, {"$set": {"loc.0": 2000}})
    assert info.value.code == 13027
    assert db.g.find_one({"_id": 3})["loc"] == [1, 2]
    # Every location of a document with several, and only well-formed ones.
    assert _write_error(lambda: db.g.insert_one({"loc": [[1, 2], [3, 5000]]}))["code"] == 13027
    assert _write_error(lambda: db.g.insert_one({"loc": [1]}))["code"] == 13068
    assert _write_error(lambda: db.g.insert_one({"loc": ["a", "b"]}))["code"] == 16804
    db.g.insert_many([{"loc": {"x": 1, "y": 2}}, {"loc": "nowhere"}, {"other": 1}])


def test_bad_bounds_are_refused_at_create(db: Database) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        db.g.create_index([("loc", "2d")], min=10, max=0)
    assert info.value.code == 72
    assert info.value.details["errmsg"] == (
        "region for hash must be valid and have positive area, but [10, 0] was specified")
    with pytest.raises(errors.OperationFailure) as info:
        db.g.create_index([("loc", "2d")], min=5, max=5)
    assert info.value.code == 72
    with pytest.raises(errors.OperationFailure) as info:
        db.g.create_index([("loc", "2d")], bits=40)
    assert info.value.details["errmsg"] == (
        "bits for hash must be > 0 and <= 32, but 40 bits were specified")
    with pytest.raises(errors.OperationFailure) as info:
        db.g.create_index([("a", 1), ("loc", "2d")])
    assert info.value.code == 16801
    assert list(db.g.index_information()) in ([], ["_id_"])  # (no collection: as mongod)


def test_a_build_over_a_point_outside_fails(db: Database) -> None:
    db.g.insert_many([{"loc": [1, 1]}, {"_id": 9, "loc": [500, 1]}])
    with pytest.raises(errors.OperationFailure) as info:
        db.g.create_index([("loc", "2d")])
    assert info.value.code == 13027
    assert info.value.details["errmsg"].startswith("Index build failed: ")
    assert info.value.details["errmsg"].endswith(
        ":: caused by :: point not in interval of [ -180, 180 ] :: caused by :: "
        "{ _id: 9, loc: [ 500, 1 ] }")
    assert list(db.g.index_information()) == ["_id_"]


# -- partial filters --------------------------------------------------------------------------

_REFUSED = [
    ({"a": {"$exists": False}}, "$not\n    a exists\n"),
    ({"a": {"$ne": 1}}, "$not\n    a $eq 1\n"),
    ({"a": {"$not": {"$gt": 1}}}, "$not\n    $and\n        a $gt 1\n"),
    ({"$nor": [{"a": 1}]}, "$nor\n    a $eq 1\n"),
    ({"a": {"$regex": "x", "$options": "i"}}, "a regex /x/i\n"),
    ({"a": {"$mod": [2, 0]}}, "a mod 2 % x == 0\n"),
    ({"a": {"$size": 2}}, "a $size : 2\n"),
    ({"a": {"$elemMatch": {"$gt": 1}}}, "a $elemMatch (value)\n     $gt 1\n"),
    ({"$or": [{"a": 1}, {"b": {"$ne": 1}}]}, "$not\n    b $eq 1\n"),
    ({"a": 1, "b": {"$exists": False}}, "$not\n    b exists\n"),
]


@pytest.mark.parametrize(("pfe", "node"), _REFUSED)
def test_a_partial_filter_refuses_what_it_cannot_hold(
    db: Database, pfe: dict, node: str
) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        db.command("createIndexes", "p", indexes=[
            {"key": {"k": 1}, "name": "k", "partialFilterExpression": pfe}])
    assert info.value.code == 67
    assert info.value.details["codeName"] == "CannotCreateIndex"
    assert info.value.details["errmsg"].startswith(
        'Error in specification { key: { k: 1 }, name: "k", partialFilterExpression: ')
    assert info.value.details["errmsg"].endswith(
        ", v: 2 } :: caused by :: Expression not supported in partial index: " + node)
    assert "k" not in db.p.index_information()


def test_a_partial_filter_too_deep_or_with_sparse_and_those_it_takes(db: Database) -> None:
    deep = {"$and": [{"$or": [{"$and": [{"$or": [{"a": 1}, {"b": 1}]}]}]}]}
    with pytest.raises(errors.OperationFailure) as info:
        db.p.create_index("k", name="k", partialFilterExpression=deep)
    assert info.value.code == 67
    assert info.value.details["errmsg"].endswith(
        ":: caused by :: partialFilterExpression depth may not exceed 4")
    with pytest.raises(errors.OperationFailure) as info:
        db.command("createIndexes", "p", indexes=[
            {"key": {"k": 1}, "name": "k", "sparse": True, "partialFilterExpression": {"a": 1}}])
    assert info.value.details["errmsg"] == (
        'Error in specification { key: { k: 1 }, name: "k", sparse: true, '
        'partialFilterExpression: { a: 1 }, v: 2 } :: caused by :: cannot mix '
        '"partialFilterExpression" and "sparse" options')
    # And the filters it takes, nested $and / $or included.
    for i, pfe in enumerate([
        {"a": {"$exists": True}}, {"a": {"$in": [1, 2]}}, {"a": {"$type": "string"}},
        {"$or": [{"a": 1}, {"b": {"$gt": 2}}]}, {"a": {"$gte": 1, "$lt": 5}}, {"a": None},
        {"$and": [{"a": {"$gt": 1}}, {"$or": [{"b": 1}, {"c": 1}]}]},
    ]):
        db.p.create_index(f"k{i}", partialFilterExpression=pfe)
    assert len(db.p.index_information()) == 8


# -- a sparse index's hint --------------------------------------------------------------------


def test_a_sparse_hint_counts_what_the_index_holds(db: Database) -> None:
    db.c.insert_many([{"i": 1}, {"i": 2, "x": None}, {"i": 1, "x": 3}])
    db.c.create_index("i")
    db.c.create_index("x", sparse=True)
    assert db.command("count", "c", query={"i": 1}, hint="_id_")["n"] == 2
    assert db.command("count", "c", query={"i": 1}, hint="x_1")["n"] == 1
    assert db.command("count", "c", hint="x_1")["n"] == 2
    assert db.command("count", "c", hint="i_1")["n"] == 3
    assert db.c.count_documents({}, hint="x_1") == 2
    assert sorted(d["i"] for d in db.c.find({}, {"_id": 0}).hint("x_1")) == [1, 2]


# -- explain and writeConcern -----------------------------------------------------------------


def test_an_explained_aggregate_refuses_a_write_concern(db: Database) -> None:
    db.c.insert_one({"a": 1})
    for pipeline in ([{"$project": {"_id": 0}}, {"$out": "bar"}], []):
        with pytest.raises(errors.OperationFailure) as info:
            db.command("aggregate", "c", pipeline=pipeline, explain=True,
                       writeConcern={"j": True})
        assert info.value.code == 9
        assert info.value.details["errmsg"] == (
            "Aggregation explain does not support the'writeConcern' option")
    assert "bar" not in db.list_collection_names()
    assert "stages" in db.command("aggregate", "c", pipeline=[{"$out": "bar"}], explain=True)


def test_the_explain_command_refuses_an_aggregate_with_a_write_concern(db: Database) -> None:
    """The Node driver's way: `{explain: {aggregate, pipeline, writeConcern}}`."""
    db.c.insert_one({"a": 1})
    with pytest.raises(errors.OperationFailure) as info:
        db.command("explain", {"aggregate": "c", "pipeline": [{"$out": "bar"}], "cursor": {},
                               "writeConcern": {"w": 1}})
    assert info.value.code == 9
    assert "bar" not in db.list_collection_names()


def test_a_refused_index_spec_creates_no_collection(db: Database) -> None:
    """mongod rolls back the implicit create of a createIndexes it refuses; the spec in the
    message is the one the client sent, in its order."""
    with pytest.raises(errors.OperationFailure) as info:
        db.command("createIndexes", "fresh", indexes=[
            {"name": "k", "key": {"k": 1}, "partialFilterExpression": {"a": {"$ne": 1}}}])
    assert info.value.code == 67
    assert info.value.details["errmsg"].startswith(
        'Error in specification { name: "k", key: { k: 1 }, ')
    assert "fresh" not in db.list_collection_names()
