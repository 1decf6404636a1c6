"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_enforce_max_time_ms_on_mongos.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011, its one step that is not about time or the shards'
profilers: with shard1 idle, a getMore with a thirty-minute maxTimeMS on a stream reopened with
`batchSize: 0` returns the insert written to shard0 (an idle shard does not hold it back).

Left out: every other step: the maxTimeMS of the getMores mongos sends its shards, read from
their `system.profile` (the front reaches its shards in process), and how long a getMore waits
(this project's tests make no wall-clock assertions); the getMore's client here has a socket
timeout, so a getMore held back fails instead of waiting for its thirty minutes."""

from __future__ import annotations

import pymongo

NAME = "change_stream_enforce_max_time_ms_on_mongos"
THIRTY_MINS = 30 * 60 * 1000
COMMENT = "change stream sharded maxTimeMS test"


def test_idle_shard_does_not_hold_back_a_long_get_more(st):
    s = st.s
    ns = f"{NAME}.{NAME}"
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    s.admin.command("shardCollection", ns, key={"_id": 1})
    s.admin.command("split", ns, middle={"_id": 0})
    s.admin.command("moveChunk", ns, find={"_id": 1}, to=st.rs_url(1))
    with pymongo.MongoClient(st.server.uri, socketTimeoutMS=60_000) as client:
        db = client[NAME]
        reply = db.command({"aggregate": NAME, "pipeline": [{"$changeStream": {}}],
                            "comment": COMMENT, "cursor": {"batchSize": 0}})
        assert reply["cursor"]["firstBatch"] == []
        cursor_id = reply["cursor"]["id"]
        assert cursor_id != 0
        db[NAME].insert_one({"_id": -1})
        result = db.command({"getMore": cursor_id, "collection": NAME,
                             "maxTimeMS": THIRTY_MINS})
        assert result["cursor"]["nextBatch"][0]["fullDocument"] == {"_id": -1}
        db.command({"killCursors": NAME, "cursors": [cursor_id]})
