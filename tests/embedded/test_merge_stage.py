"""The `$merge` aggregation stage against the embedded store, through pymongo: `into`
(a name or {db, coll}), `on`, each whenMatched / whenNotMatched mode, a whenMatched pipeline
with `$$new` or `let`, a database-level aggregate (`$documents`) ending in `$merge`, and
mongod's errors for a bad spec."""

from __future__ import annotations

import pytest
from pymongo import MongoClient, errors
from pymongo.database import Database

from cdcserver.testing import EmbeddedServer


@pytest.fixture
def db(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    database = client.merge_tests
    database.src.insert_many([{"_id": 1, "a": 1, "k": "x"}, {"_id": 2, "a": 2, "k": "y"}])
    database.dst.insert_many([{"_id": 1, "a": 10, "b": 10}, {"_id": 3, "a": 30}])
    yield database
    client.close()


def _merged(db: Database, **spec) -> list[dict]:
    assert list(db.src.aggregate([{"$merge": {"into": "dst", **spec}}])) == []
    return list(db.dst.find().sort("_id", 1))


def test_default_merges_matched_and_inserts_the_rest(db: Database) -> None:
    assert _merged(db) == [
        {"_id": 1, "a": 1, "b": 10, "k": "x"}, {"_id": 2, "a": 2, "k": "y"}, {"_id": 3, "a": 30}]


def test_replace_keep_existing_and_discard(db: Database) -> None:
    assert _merged(db, whenMatched="replace", whenNotMatched="discard") == [
        {"_id": 1, "a": 1, "k": "x"}, {"_id": 3, "a": 30}]
    db.dst.delete_many({})
    db.dst.insert_one({"_id": 1, "a": 10})
    assert _merged(db, whenMatched="keepExisting") == [
        {"_id": 1, "a": 10}, {"_id": 2, "a": 2, "k": "y"}]


def test_fail_modes(db: Database) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        _merged(db, whenMatched="fail")
    assert info.value.code == 11000
    assert info.value.details["keyPattern"] == {"_id": 1}
    assert info.value.details["keyValue"] == {"_id": 1}
    with pytest.raises(errors.OperationFailure) as info:
        _merged(db, whenNotMatched="fail")
    assert info.value.code == 13113


def test_pipeline_with_new_and_let(db: Database) -> None:
    assert _merged(db, whenMatched=[{"$set": {"a": {"$add": ["$a", "$$new.a"]}}}],
                   whenNotMatched="discard") == [{"_id": 1, "a": 11, "b": 10}, {"_id": 3, "a": 30}]
    assert _merged(db, let={"inc": "$a"}, whenMatched=[{"$set": {"a": {"$add": ["$a", "$$inc"]}}}],
                   whenNotMatched="discard") == [{"_id": 1, "a": 12, "b": 10}, {"_id": 3, "a": 30}]


def test_on_needs_a_unique_index_then_matches_on_it(db: Database) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        _merged(db, on="k")
    assert info.value.code == 51183
    db.dst.delete_many({})
    db.dst.create_index("k", unique=True)
    db.dst.insert_one({"_id": 7, "k": "x", "c": 1})
    assert list(db.src.aggregate([{"$project": {"_id": 0}}, {"$merge": {
        "into": "dst", "on": "k", "whenMatched": "merge", "whenNotMatched": "discard"}}])) == []
    assert list(db.dst.find({}, {"_id": 1, "k": 1, "a": 1, "c": 1})) == [
        {"_id": 7, "k": "x", "c": 1, "a": 1}]


def test_into_other_db_and_database_level_documents(db: Database) -> None:
    other = db.client.merge_tests_other
    other.out.drop()
    db.src.aggregate([{"$merge": {"into": {"db": "merge_tests_other", "coll": "out"}}}])
    assert other.out.count_documents({}) == 2
    db.aggregate([{"$documents": [{"_id": 5, "z": 1}]}, {"$merge": {"into": "dst"}}])
    assert db.dst.find_one({"_id": 5}) == {"_id": 5, "z": 1}
    assert list(db.aggregate([{"$documents": [{"x": 1}, {"x": 2}]}, {"$match": {"x": 2}}])) == [
        {"x": 2}]


@pytest.mark.parametrize("spec,code", [
    ({"into": "dst", "bogus": 1}, 40415),
    ({"into": 5}, 51178),
    ({"into": "dst", "whenMatched": "nope"}, 2),
    ({"into": "dst", "whenNotMatched": "nope"}, 2),
    ({"into": "dst", "let": {"x": 1}}, 51199),
])
def test_bad_specs(db: Database, spec: dict, code: int) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        list(db.src.aggregate([{"$merge": spec}]))
    assert info.value.code == code
    with pytest.raises(errors.OperationFailure) as info:
        list(db.src.aggregate([{"$merge": {"into": "dst"}}, {"$match": {}}]))
    assert info.value.code == 40601


@pytest.mark.parametrize("stage", [{"$merge": {"into": "dst"}}, {"$out": "o"}])
def test_refused_in_a_transaction(db: Database, stage: dict) -> None:
    with db.client.start_session() as session:
        with pytest.raises(errors.OperationFailure) as info:
            with session.start_transaction():
                list(db.src.aggregate([stage], session=session))
    assert info.value.code == 263
    assert info.value.details["errmsg"] == (
        "Operation not permitted in transaction :: caused by :: Aggregation stage "
        f"{next(iter(stage))} cannot run within a multi-document transaction.")
    assert db.dst.count_documents({}) == 2


def test_pipeline_mode_inserts_the_pipeline_applied_to_the_on_fields(db: Database) -> None:
    # jstests/aggregation/sources/merge/mode_pipeline_insert.js: an upsert, not the result
    db.dst.delete_many({})
    db.dst.insert_one({"_id": 1, "b": 1})
    assert _merged(db, whenMatched=[{"$addFields": {"x": {"$add": ["$b", 1]}}}]) == [
        {"_id": 1, "b": 1, "x": 2}, {"_id": 2, "x": None}]
    db.dst.delete_many({})
    db.dst.create_index("k", unique=True)
    list(db.src.aggregate([{"$project": {"_id": 0}}, {"$merge": {
        "into": "dst", "on": "k", "whenMatched": [{"$addFields": {"z": 1}}]}}]))
    assert sorted((d["k"], d["z"]) for d in db.dst.find({}, {"_id": 0})) == [("x", 1), ("y", 1)]


def test_on_field_missing_or_array(db: Database) -> None:
    db.dst.delete_many({})
    db.dst.create_index("k", unique=True)
    db.src.insert_one({"_id": 9, "k": [1, 2]})
    with pytest.raises(errors.OperationFailure) as info:
        list(db.src.aggregate([{"$match": {"_id": 9}}, {"$merge": {"into": "dst", "on": "k"}}]))
    assert info.value.code == 51185
    with pytest.raises(errors.OperationFailure) as info:
        list(db.src.aggregate([{"$project": {"k": 0}}, {"$merge": {"into": "dst", "on": "k"}}]))
    assert info.value.code == 51132


def test_target_validator_applies(db: Database) -> None:
    db.create_collection("valid", validator={"a": {"$gt": 1}})
    with pytest.raises(errors.OperationFailure) as info:
        list(db.src.aggregate([{"$merge": {"into": "valid"}}]))
    assert info.value.code == 121
