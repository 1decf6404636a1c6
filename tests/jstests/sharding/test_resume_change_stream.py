"""Translated from mongodb/mongo `jstests/sharding/query/change_streams/resume_change_stream.js`
@ 05a9f6fe335c104fb2184e56e4ae64f27487f011 (`ChangeStreamTest` from
`jstests/libs/change_stream_util.js`: `cst.py`): on a collection sharded on `_id` across two
shards whose oplogs are 1 MB (`rs: {oplogSize: 1}`: each shard's store capped at 1 MiB), a
stream (collection, then whole-db) resumes after an update on shard0; once shard1's oplog has
rolled over, resuming from its token, from a time before it, or even from shard0's token (shard1
lacks the history) is 286 ChangeStreamHistoryLost; then, on a collection sharded on `shardKey`,
a multi-update's hundred events (clusterTime collisions across shards) can each be resumed
after, with a case-insensitive collation."""

from __future__ import annotations

import pytest
from cst import ChangeStreamTest, assert_change_stream_throws_code

NAME = "resume_change_stream"
OPLOG_SIZE_MB = 1


def _oldest_ts(client) -> object:
    return next(client.local["oplog.rs"].find({}, sort=[("$natural", 1)], limit=1))["ts"]


def _latest_ts(client) -> object:
    return next(client.local["oplog.rs"].find({}, sort=[("$natural", -1)], limit=1))["ts"]


@pytest.mark.parametrize("coll_to_watch", [NAME, 1], ids=["collection", "whole_db"])
def test_resume_change_stream(st, coll_to_watch):
    for shard in st.server.cluster.shards:
        shard.store.oplog_size_bytes = OPLOG_SIZE_MB * 1024 * 1024
    s = st.s
    db = s[NAME]
    coll = db[NAME]
    ns = f"{NAME}.{NAME}"
    cst = ChangeStreamTest(db)
    try:
        coll.drop()
        s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
        s.admin.command("shardCollection", ns, key={"_id": 1})
        s.admin.command("split", ns, middle={"_id": 0})
        s.admin.command("moveChunk", ns, find={"_id": 1}, to=st.rs_url(1))
        coll.insert_one({"_id": -1})
        coll.insert_one({"_id": 1})

        cs = cst.start_watching_changes([{"$changeStream": {}}], coll_to_watch)
        coll.update_one({"_id": -1}, {"$set": {"updated": True}})
        resume_time_first_update = db.command("hello")["$clusterTime"]["clusterTime"]
        coll.update_one({"_id": 1}, {"$set": {"updated": True}})

        change = cst.get_one_change(cs)
        assert change["operationType"] == "update"
        assert change["documentKey"]["_id"] == -1
        token_shard0 = change["_id"]
        change = cst.get_one_change(cs)
        assert change["operationType"] == "update"
        assert change["documentKey"]["_id"] == 1
        token_shard1 = change["_id"]

        coll.insert_one({"_id": -2})
        coll.insert_one({"_id": 2})
        cs = cst.start_watching_changes([{"$changeStream": {"resumeAfter": token_shard0}}],
                                        coll_to_watch)
        for expected_id in (1, -2, 2):
            assert cst.get_one_change(cs)["documentKey"]["_id"] == expected_id

        # Roll shard1's oplog over.
        shard1 = st.rs(1)
        most_recent = _latest_ts(shard1)
        large = "abcdefghi" * (4 * 1024 * OPLOG_SIZE_MB - 1)
        i = 0
        while not most_recent < _oldest_ts(shard1):
            coll.insert_one({"_id": 100 + i, "long_str": large})
            i += 1
            assert i < 1000

        assert_change_stream_throws_code(
            db, coll_to_watch, [{"$changeStream": {"resumeAfter": token_shard1}}], 286)
        assert_change_stream_throws_code(
            db, coll_to_watch,
            [{"$changeStream": {"startAtOperationTime": resume_time_first_update}}], 286)
        assert_change_stream_throws_code(
            db, coll_to_watch, [{"$changeStream": {"resumeAfter": token_shard0}}], 286)

        coll.drop()
        s.admin.command("shardCollection", ns, key={"shardKey": 1})
        s.admin.command("split", ns, middle={"shardKey": 50})
        s.admin.command("moveChunk", ns, find={"shardKey": 51}, to=st.rs_url(1))
        number_of_docs = 100
        for counter in range(number_of_docs // 5):
            for k, prefix in enumerate(("abcd", "Abcd", "aBcd", "abCd", "abcD")):
                coll.insert_one({"_id": f"{prefix}{counter}", "shardKey": counter * 5 + k})

        all_changes = cst.start_watching_changes([{"$changeStream": {}}], coll_to_watch)
        coll.update_many({}, {"$set": {"updated": True}})
        case_insensitive = {"locale": "en_US", "strength": 2}
        for _ in range(number_of_docs - 1):
            token = cst.get_one_change(all_changes)["_id"]
            resumed = cst.start_watching_changes(
                [{"$changeStream": {"resumeAfter": token}}], coll_to_watch,
                {"collation": case_insensitive})
            cst.get_one_change(resumed)
    finally:
        cst.clean_up()
