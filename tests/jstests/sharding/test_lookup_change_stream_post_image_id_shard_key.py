"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/lookup_change_stream_post_image_id_shard_key.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: `fullDocument: "updateLookup"` on a collection
sharded on `_id` across two shards: each update's documentKey is `{_id}` alone and its
fullDocument the updated document, also once the updated document's chunk has moved to the
other shard before the event is read.

The jstest names the shards by their replica sets' URLs (`st.rsN.getURL()`, which mongos
resolves: `ShardRegistryData::findShard`); the case `by_url` does so too, `by_name` names them
by their names."""

from __future__ import annotations

import bson
import pytest
from sharding_util import watch


def _doc_eq(actual, expected) -> None:
    assert bson.encode(actual) == bson.encode(expected), (actual, expected)


@pytest.mark.parametrize("by_url", [False, True], ids=["by_name", "by_url"])
def test_lookup_change_stream_post_image_id_shard_key(st, by_url):
    shard0, shard1 = (st.rs_url(0), st.rs_url(1)) if by_url else (st.shard0, st.shard1)
    name = "lookup_change_stream_post_image_id_shard_key"
    s = st.s
    db = s[name]
    coll = db.coll
    s.drop_database(name)
    s.admin.command({"enableSharding": name, "primaryShard": shard0})
    s.admin.command("shardCollection", f"{name}.coll", key={"_id": 1})
    s.admin.command("split", f"{name}.coll", middle={"_id": 0})
    s.admin.command("moveChunk", f"{name}.coll", find={"_id": 1}, to=shard1)
    coll.insert_one({"_id": -1})
    coll.insert_one({"_id": 1})

    cs = watch(coll, fullDocument="updateLookup")
    coll.insert_one({"_id": 1000})
    coll.insert_one({"_id": -1000})
    coll.update_one({"_id": 1000}, {"$set": {"updatedCount": 1}})
    coll.update_one({"_id": -1000}, {"$set": {"updatedCount": 1}})
    for id_ in (1000, -1000):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["documentKey"] == {"_id": id_}
    for id_ in (1000, -1000):
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert event["documentKey"] == {"_id": id_}
        _doc_eq(event["fullDocument"], {"_id": id_, "updatedCount": 1})

    # The post image is found after the chunk moved.
    coll.update_one({"_id": 1000}, {"$set": {"updatedCount": 2}})
    coll.update_one({"_id": -1000}, {"$set": {"updatedCount": 2}})
    s.admin.command("split", f"{name}.coll", middle={"_id": 500})
    s.admin.command("moveChunk", f"{name}.coll", find={"_id": 1000}, to=shard0)
    for id_ in (1000, -1000):
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert event["documentKey"] == {"_id": id_}
        _doc_eq(event["fullDocument"], {"_id": id_, "updatedCount": 2})
