"""mongos opens each shard's part of a change stream with `batchSize: 0`
(sharded_agg_helpers.cpp), so a stream's first batch through the front is always empty, even
when events are waiting; its postBatchResumeToken is where the stream starts. The events come
with the first getMore."""

from __future__ import annotations

import pymongo

from cdcserver.sharding.testing import ShardedServer


def test_first_batch_is_empty_and_the_events_follow():
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as client:
        start = client.admin.command("ping")["operationTime"]
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])
        reply = client.shop.command({
            "aggregate": "orders", "pipeline": [{"$changeStream": {"startAtOperationTime": start}}],
            "cursor": {"batchSize": 10},
        })
        cursor = reply["cursor"]
        assert cursor["firstBatch"] == []
        assert cursor["id"] != 0
        more = client.shop.command({"getMore": cursor["id"], "collection": "orders",
                                    "maxTimeMS": 2000})
        ids = [e["documentKey"]["_id"] for e in more["cursor"]["nextBatch"]]
        assert ids == [0, 1, 2]
