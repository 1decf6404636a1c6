"""The database profiler through pymongo: `profile` levels and `<db>.system.profile`."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure


@pytest.fixture
def db(client):
    database = client.profiler_db
    client.drop_database(database)
    yield database
    database.command("profile", 0)
    database.system.profile.drop()


def test_level_2_profiles_every_operation(db) -> None:
    assert db.command("profile", 2)["was"] == 0
    db.coll.insert_many([{"a": 1}, {"a": 2}])
    assert len(db.coll.find({"a": {"$gte": 1}}).comment("c1").to_list()) == 2
    db.coll.update_one({"a": 1}, {"$set": {"b": 1}})
    db.coll.delete_one({"a": 2})
    docs = list(db.system.profile.find({"ns": "profiler_db.coll"}))
    assert [d["op"] for d in docs] == ["insert", "query", "update", "remove"]
    insert, query, update, remove = docs
    assert insert["ninserted"] == 2
    assert query["command"]["comment"] == "c1" and query["nreturned"] == 2
    assert query["docsExamined"] == 2 and query["cursorExhausted"] is True
    assert (update["nMatched"], update["nModified"]) == (1, 1)
    assert remove["ndeleted"] == 1
    for d in docs:
        assert d["client"] == "127.0.0.1" and d["millis"] >= 0 and "ts" in d
    options = next(db.list_collections(filter={"name": "system.profile"}))["options"]
    assert options["capped"] is True


def test_level_0_writes_nothing_and_errors_are_profiled(db) -> None:
    db.coll.insert_one({})
    assert "system.profile" not in db.list_collection_names()
    db.command("profile", 2)
    with pytest.raises(OperationFailure):
        db.command("find", "coll", filter={"$bogus": 1})
    failed = db.system.profile.find_one({"ns": "profiler_db.coll"})
    assert failed is not None and failed["ok"] == 0 and failed["errCode"] == 2
    assert db.command("profile", -1)["was"] == 2


def test_profile_documents_do_not_reach_change_streams(db) -> None:
    with db.watch() as stream:
        db.command("profile", 2)
        db.coll.insert_one({"_id": 1})
        change = stream.next()
    assert change["ns"] == {"db": "profiler_db", "coll": "coll"}
    assert change["operationType"] == "insert"
    oplog = db.client.local["oplog.rs"]
    assert db.system.profile.count_documents({}) >= 1
    assert oplog.count_documents({"ns": {"$regex": "system\\.profile"}}) == 0
