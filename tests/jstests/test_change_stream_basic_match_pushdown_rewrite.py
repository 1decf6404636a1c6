"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_basic_match_pushdown_rewrite.js` @
124eb7f41bfe3082cbe8067503eb02679ab20c6b: on a collection sharded on `_id` across two shards
(`pushdown_util.py`), `{$match: {operationType: "insert"}}` returns just the inserts, from a
stream open before the writes, then from a stream resumed before a transaction that also
writes to another collection; and a `$match` on `fullDocument.string` with the aggregate's
collation (`strength: 2`) is not rewritten into a filter that ignores the collation. Left
out: the `executionStats` counts (events each shard returned, oplog entries its cursor
returned, also of the `lsid` / `txnNumber` `$match` that only an explain runs): cdcserver has
no explain of change streams."""

from __future__ import annotations

from typing import Any

from pushdown_util import cluster, create_sharded_collection, mongos, read_exactly

__all__ = ["cluster", "mongos"]

DB = "change_stream_match_pushdown_and_rewrite"
COLL = "coll1"
ALTERNATE = "change_stream_match_pushdown_and_rewrite_alternate"
INSERTS = [{"$match": {"operationType": "insert"}}]


def test_basic_match_pushdown_rewrite(mongos: Any, cluster: Any) -> None:
    coll = create_sharded_collection(mongos, cluster, "_id", DB, COLL, 2)
    mongos[DB].create_collection(ALTERNATE)

    stream = coll.watch(INSERTS, max_await_time_ms=1)
    resume_after = stream.resume_token
    coll.insert_one({"_id": 1, "string": "Value"})
    coll.update_one({"_id": 1}, {"$set": {"foo": "bar"}})
    coll.delete_one({"_id": 1})
    coll.insert_one({"_id": 2, "string": "vAlue"})
    coll.update_one({"_id": 2}, {"$set": {"foo": "bar"}})
    coll.delete_one({"_id": 2})
    event1, event2 = read_exactly(stream, 2)
    stream.close()
    assert (event1["operationType"], event1["documentKey"]["_id"]) == ("insert", 1), event1
    assert (event2["operationType"], event2["documentKey"]["_id"]) == ("insert", 2), event2

    session = mongos.start_session(causal_consistency=True)
    s_coll = session.client[DB][COLL]
    s_alternate = session.client[DB][ALTERNATE]
    with session.start_transaction():
        s_coll.insert_one({"_id": 1}, session=session)
        s_coll.update_one({"_id": 1}, {"$set": {"foo": "bar"}}, session=session)
        s_coll.delete_one({"_id": 1}, session=session)
        s_alternate.insert_one({"_id": "alt"}, session=session)
        s_coll.insert_one({"_id": 2}, session=session)
        s_coll.update_one({"_id": 2}, {"$set": {"foo": "bar"}}, session=session)
        s_coll.delete_one({"_id": 2}, session=session)
    with coll.watch(INSERTS, resume_after=event2["_id"], max_await_time_ms=1) as txn_stream:
        event3, event4 = read_exactly(txn_stream, 2)
    assert event3["operationType"] == event4["operationType"] == "insert"
    assert sorted([event3["documentKey"]["_id"], event4["documentKey"]["_id"]]) == [1, 2]

    # The second transaction of the jstest (its lsid / txnNumber $match is explain-only).
    with session.start_transaction():
        s_coll.insert_one({"_id": 1, "a": 1, "string": "vaLue"}, session=session)
        s_coll.update_one({"_id": 1}, {"$set": {"foo": "bar"}}, session=session)
        s_coll.delete_one({"_id": 1}, session=session)
        s_coll.insert_one({"_id": 2, "a": 2, "string": "valUe"}, session=session)
        s_coll.update_one({"_id": 2}, {"$set": {"foo": "bar"}}, session=session)
        s_coll.delete_one({"_id": 2}, session=session)
    session.end_session()

    # A raw aggregate: pymongo's watch() does not send its `collation` argument.
    db = mongos[DB]
    reply = db.command({"aggregate": COLL, "pipeline": [
        {"$changeStream": {"resumeAfter": resume_after}},
        {"$match": {"fullDocument.string": "value"}}],
        "cursor": {}, "collation": {"locale": "en_US", "strength": 2}})
    cursor = reply["cursor"]
    events = list(cursor["firstBatch"])
    for _ in range(200):
        if len(events) >= 4:
            break
        cursor = db.command({"getMore": cursor["id"], "collection": COLL, "maxTimeMS": 1})[
            "cursor"]
        events += cursor["nextBatch"]
    more = db.command({"getMore": cursor["id"], "collection": COLL, "maxTimeMS": 1})["cursor"]
    db.command({"killCursors": COLL, "cursors": [cursor["id"]]})
    assert len(events) == 4 and not more["nextBatch"], (events, more)
    strings = [e["fullDocument"]["string"] for e in events]
    assert strings[:2] == ["Value", "vAlue"]
    assert sorted(strings[2:]) == sorted(["vaLue", "valUe"])
