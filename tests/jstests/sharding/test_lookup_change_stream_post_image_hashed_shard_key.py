"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/lookup_change_stream_post_image_hashed_shard_key.js` @
50f7e84aafc4c918702cdf5a3afe3a0af8e9b1bd: `fullDocument: "updateLookup"` on a collection
sharded on `{shardKey: "hashed"}`, its negative chunk on shard0 and its positive one on shard1
(`moveChunk` by `bounds`): for a thousand documents, each insert's documentKey is
`{shardKey, _id}` and each update's fullDocument the updated document. The jstest's retry loop
(a stepdown's QueryPlanKilled) has nothing to retry here."""

from __future__ import annotations

import bson
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from sharding_util import watch

NAME = "lookup_change_stream_post_image_hashed_shard_key"
N_DOCS = 1000


def test_lookup_change_stream_post_image_hashed_shard_key(st):
    s = st.s
    coll = s[NAME].coll
    ns = f"{NAME}.coll"
    s.drop_database(NAME)
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    s.admin.command("shardCollection", ns, key={"shardKey": "hashed"})
    s.admin.command({"moveChunk": ns, "bounds": [{"shardKey": MinKey()}, {"shardKey": Int64(0)}],
                     "to": st.rs_url(0)})
    s.admin.command({"moveChunk": ns, "bounds": [{"shardKey": Int64(0)}, {"shardKey": MaxKey()}],
                     "to": st.rs_url(1)})

    cs = watch(coll, fullDocument="updateLookup")
    for id_ in range(N_DOCS):
        coll.insert_one({"_id": id_, "shardKey": id_})
        coll.update_one({"shardKey": id_}, {"$set": {"updatedCount": 1}})
    for id_ in range(N_DOCS):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert bson.encode(event["documentKey"]) == bson.encode({"shardKey": id_, "_id": id_})
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert bson.encode(event["documentKey"]) == bson.encode({"shardKey": id_, "_id": id_})
        assert bson.encode(event["fullDocument"]) == bson.encode(
            {"_id": id_, "shardKey": id_, "updatedCount": 1})
    counts = [st.rs(i)[NAME].coll.count_documents({}) for i in range(2)]
    assert all(counts) and sum(counts) == N_DOCS, counts
