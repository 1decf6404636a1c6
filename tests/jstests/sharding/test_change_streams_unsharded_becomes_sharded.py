"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_unsharded_becomes_sharded.js` @
24608b289f670a2672d469ee07849b44422e9c0f (`ChangeStreamTest`: `cst.py`), for a collection
stream and a whole-db one (`$match` on the collection): an insert before `shardCollection` has
documentKey `{_id}`, after it `{x, _id}`, also from the shard a chunk moved to; a stream resumed
from the token before `shardCollection` sees both later inserts; a stream opened before the
sharded collection is dropped and recreated sharded on `{z: 1}` returns the inserts made before
the drop with their `{x, _id}` documentKeys (from the oplog)."""

from __future__ import annotations

import pytest
from cst import ChangeStreamTest

NAME = "change_streams_unsharded_becomes_sharded"


@pytest.mark.parametrize("coll_to_watch", [NAME, 1], ids=["collection", "whole_db"])
def test_change_streams_unsharded_becomes_sharded(st, coll_to_watch):
    s = st.s
    s.admin.command({"enableSharding": "test", "primaryShard": st.shard0})
    db = s.test
    coll = db[NAME]
    other = db[NAME + "other"]
    ns = {"db": "test", "coll": NAME}
    coll.drop()
    db.create_collection(NAME)
    coll.create_index({"x": 1})
    cst = ChangeStreamTest(db)
    try:
        other.drop()
        db.create_collection(NAME + "other")
        other.create_index({"y": 1})
        cursor = cst.start_watching_changes(
            [{"$changeStream": {}}, {"$match": {"ns.coll": NAME}}], coll_to_watch)
        assert len(cursor["firstBatch"]) == 0, f"Cursor had changes: {cursor!r}"

        coll.insert_one({"_id": 0, "x": 0})
        other.insert_one({"_id": 0, "y": 0})
        [pre_shard] = cst.assert_next_changes_equal(cursor, [{
            "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "x": 0}, "ns": ns,
            "operationType": "insert"}])
        pre_shard_token = pre_shard["_id"]

        st.shard_coll(coll, {"x": 1}, {"x": 0}, False, "test")
        st.shard_coll(other, {"y": 1}, {"y": 0}, False, "test")
        post_shard = [
            {"documentKey": {"x": 1, "_id": 1}, "fullDocument": {"_id": 1, "x": 1}, "ns": ns,
             "operationType": "insert"},
            {"documentKey": {"x": -1, "_id": -1}, "fullDocument": {"_id": -1, "x": -1},
             "ns": ns, "operationType": "insert"},
        ]
        coll.insert_one({"_id": 1, "x": 1})
        other.insert_one({"_id": 1, "y": 1})
        cst.assert_next_changes_equal(cursor, [post_shard[0]])

        s.admin.command({"moveChunk": f"test.{NAME}", "find": {"x": -1}, "to": st.rs_url(1),
                         "_waitForDelete": True})
        s.admin.command({"moveChunk": f"test.{NAME}other", "find": {"y": -1}, "to": st.rs_url(1),
                         "_waitForDelete": True})
        coll.insert_one({"_id": -1, "x": -1})
        other.insert_one({"_id": -1, "y": -1})
        cst.assert_next_changes_equal(cursor, [post_shard[1]])

        resumed = cst.start_watching_changes(
            [{"$changeStream": {"resumeAfter": pre_shard_token}}], NAME)
        cst.assert_next_changes_equal(resumed, post_shard)

        # Dropped and recreated, sharded on another key.
        cursor = cst.start_watching_changes(
            [{"$changeStream": {}}, {"$match": {"ns.coll": NAME}}], coll_to_watch)
        assert len(cursor["firstBatch"]) == 0, f"Cursor had changes: {cursor!r}"
        coll.insert_one({"_id": -2, "x": -2})
        coll.insert_one({"_id": -3, "x": -3})
        coll.drop()
        db.create_collection(NAME)
        coll.create_index({"z": 1})
        st.shard_coll(coll, {"z": 1}, {"z": 0}, {"z": -1}, "test")
        coll.insert_one({"_id": -1, "z": -1})
        coll.insert_one({"_id": 1, "z": 1})
        cst.assert_next_changes_equal(cursor, [
            {"documentKey": {"x": -2, "_id": -2}, "fullDocument": {"_id": -2, "x": -2},
             "ns": ns, "operationType": "insert"},
            {"documentKey": {"x": -3, "_id": -3}, "fullDocument": {"_id": -3, "x": -3},
             "ns": ns, "operationType": "insert"},
        ])
    finally:
        cst.clean_up()
