"""Translated from mongodb/mongo `jstests/change_streams/metadata_notifications.js` @
9b6fd099940c96ec3cd315653190fa5e628f78c9: a collection stream's drop, rename (source and
target, dropTarget, $out) and dropDatabase notifications and invalidates, and resuming from
them (resumeAfter / startAfter), including a stream whose $match filters out its resume point
and every event up to the invalidate (it ends at the invalidate's token, without an error)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import SOON_TRIES, ChangeStreamTest, ShellCursor
from pymongo.errors import OperationFailure

DB = "metadata_notifications"
COLL = "test"
INVALID_RESUME_TOKEN = 260
SIMPLE = {"collation": {"locale": "simple"}}


def test_metadata_notifications(client: Any) -> None:
    db = client[DB]
    cst = ChangeStreamTest(db)
    db.drop_collection(COLL)

    def resume_expected(coll: str, spec: dict, expected: list[dict]) -> None:
        cursor = cst.start_watching_changes([{"$changeStream": spec}], coll, dict(SIMPLE))
        cst.assert_next_changes_equal(cursor, expected)

    # A stream on a collection that does not exist: no error, no event.
    cursor = cst.start_watching_changes([{"$changeStream": {}}, {"$project": {"operationType": 1}}],
                                        COLL)
    change = cst.get_next_batch(cursor)
    assert change["id"] != 0
    assert change["nextBatch"] == []
    client.drop_database(DB)  # nothing to notify
    change = cst.get_next_batch(cursor)
    assert change["id"] != 0
    assert change["nextBatch"] == []

    db.create_collection(COLL)
    coll = db[COLL]
    coll.insert_one({"_id": 0})
    assert cst.get_one_change(cursor)["operationType"] == "insert"

    coll.insert_one({"_id": 1})
    coll.update_one({"_id": 1}, {"$set": {"a": 1}})
    coll.delete_one({"_id": 1})
    db.command("drop", COLL)
    changes = cst.assert_next_changes_equal(cursor, [
        {"operationType": op} for op in ("insert", "update", "delete", "drop", "invalidate")
    ], expect_invalidate=True)
    resume_token, drop_token, invalidate_token = (changes[0]["_id"], changes[3]["_id"],
                                                  changes[4]["_id"])

    # startAfter the invalidate: nothing (one shard).
    restarted = coll.watch([], start_after=invalidate_token)
    assert restarted.try_next() is None
    restarted.close()

    # Resumable after the drop without an explicit collation.
    db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {"resumeAfter": resume_token}}],
                "cursor": {}})

    db.create_collection(COLL)
    coll.insert_one({"_id": "after recreate"})

    cursor = cst.start_watching_changes([{"$changeStream": {"resumeAfter": drop_token}}], COLL,
                                        {**SIMPLE, "cursor": {"batchSize": 0}})
    cst.consume_drop_up_to(cursor, "drop", {"operationType": "invalidate"},
                           expect_invalidate=True)

    with pytest.raises(OperationFailure) as raised:
        db.command({"aggregate": COLL,
                    "pipeline": [{"$changeStream": {"resumeAfter": invalidate_token}}],
                    "cursor": {}, **SIMPLE})
    assert raised.value.code == INVALID_RESUME_TOKEN

    # The invalidate filtered out: the stream still ends, holding the invalidate's token. (The
    # shell's cursor: the aggregate may already end the stream, where pymongo would resume.)
    stream = ShellCursor(coll, [{"$match": {"operationType": "DummyOperationType"}}],
                         resumeAfter=resume_token)
    for _ in range(SOON_TRIES):
        assert not stream.has_next()
        if stream.is_exhausted():
            break
    assert stream.is_exhausted()
    assert stream.get_resume_token() == invalidate_token

    resume_expected(COLL, {"startAfter": drop_token}, [{"operationType": "invalidate"}])

    cursor = cst.start_watching_changes([{"$changeStream": {"startAfter": invalidate_token}}],
                                        COLL, {**SIMPLE, "cursor": {"batchSize": 0}})
    cst.consume_drop_up_to(cursor, "drop", {
        "operationType": "insert", "ns": {"db": DB, "coll": COLL},
        "fullDocument": {"_id": "after recreate"}, "documentKey": {"_id": "after recreate"}})

    # A rename invalidates a stream on its source and on its target.
    cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)
    db.drop_collection("renamed_coll")
    coll.rename("renamed_coll")
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "rename", "ns": {"db": DB, "coll": COLL},
         "to": {"db": DB, "coll": "renamed_coll"}},
        {"operationType": "invalidate"}], expect_invalidate=True)

    cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)
    db["renamed_coll"].rename(COLL)
    changes = cst.assert_next_changes_equal(cursor, [
        {"operationType": "rename", "ns": {"db": DB, "coll": "renamed_coll"},
         "to": {"db": DB, "coll": COLL}},
        {"operationType": "invalidate"}])
    rename_token, rename_invalidate = changes[0]["_id"], changes[1]["_id"]
    coll.insert_one({"_id": "after rename"})
    resume_expected(COLL, {"resumeAfter": rename_token}, [{"operationType": "invalidate"}])
    with pytest.raises(OperationFailure) as raised:
        db.command({"aggregate": COLL,
                    "pipeline": [{"$changeStream": {"resumeAfter": rename_invalidate}}],
                    "cursor": {}, **SIMPLE})
    assert raised.value.code == INVALID_RESUME_TOKEN
    resume_expected(COLL, {"startAfter": rename_token}, [{"operationType": "invalidate"}])
    resume_expected(COLL, {"startAfter": rename_invalidate}, [{
        "operationType": "insert", "ns": {"db": DB, "coll": COLL},
        "fullDocument": {"_id": "after rename"}, "documentKey": {"_id": "after rename"}}])

    db.drop_collection("renamed_coll")
    db.create_collection("renamed_coll")
    db["renamed_coll"].insert_one({"_id": 0})
    cursor = cst.start_watching_changes([{"$changeStream": {}}], "renamed_coll")
    coll.rename("renamed_coll", dropTarget=True)
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "rename", "ns": {"db": DB, "coll": COLL},
         "to": {"db": DB, "coll": "renamed_coll"}},
        {"operationType": "invalidate"}], expect_invalidate=True)

    # $out into the watched collection: a rename from its temporary collection, then invalidate.
    cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)
    list(db["renamed_coll"].aggregate([{"$out": COLL}]))
    rename = cst.get_one_change(cursor)
    assert rename["operationType"] == "rename", rename
    assert rename["to"] == {"db": DB, "coll": COLL}
    assert cst.get_one_change(cursor, True)["operationType"] == "invalidate"

    # dropDatabase drops the collection first: drop, then invalidate.
    cursor = cst.start_watching_changes([{"$changeStream": {}}], "renamed_coll")
    client.drop_database(DB)
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "drop", "ns": {"db": DB, "coll": "renamed_coll"}},
        {"operationType": "invalidate"}], expect_invalidate=True)
    cst.clean_up()
