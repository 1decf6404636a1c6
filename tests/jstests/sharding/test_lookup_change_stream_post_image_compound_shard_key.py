"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/lookup_change_stream_post_image_compound_shard_key.js`
@ 05a9f6fe335c104fb2184e56e4ae64f27487f011: `fullDocument: "updateLookup"` on a collection
sharded on `{a, b, c}` (the upper chunk on shard1), read by a collection stream and a whole-db
stream: each insert's and update's documentKey is the shard key then `_id`, each update's
fullDocument the updated document, also after the upper chunk moved back to shard0. The
shards are named by their URLs (`st.rsN.getURL()`), as in the jstest."""

from __future__ import annotations

import bson
from bson.min_key import MinKey
from sharding_util import watch, watch_db

NAME = "lookup_change_stream_post_image_compound_shard_key"
B_VALUES = ["one", "two", "three", "four", "five", "six"]
N_DOCS = 6


def _shard_key(id_: int) -> dict:
    return {"a": id_ % 3, "b": B_VALUES[id_], "c": id_ % 2}


def test_lookup_change_stream_post_image_compound_shard_key(st):
    s = st.s
    db = s[NAME]
    coll = db.coll
    ns = f"{NAME}.coll"
    s.drop_database(NAME)
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    s.admin.command("shardCollection", ns, key={"a": 1, "b": 1, "c": 1})
    middle = {"a": 1, "b": MinKey(), "c": MinKey()}
    s.admin.command("split", ns, middle=middle)
    s.admin.command("moveChunk", ns, find=middle, to=st.rs_url(1))

    streams = [watch(coll, fullDocument="updateLookup"),
               watch_db(db, fullDocument="updateLookup")]
    for id_ in range(N_DOCS):
        key = {"_id": id_, **_shard_key(id_)}
        coll.insert_one(dict(key))
        coll.update_one(key, {"$set": {"updatedCount": 1}})

    def expect_update(cs, id_: int, count: int) -> None:
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert event["documentKey"] == {**_shard_key(id_), "_id": id_}
        # assert.docEq of Object.merge(shardKey, {_id, updatedCount}): any field order then.
        assert event["fullDocument"] == {**_shard_key(id_), "_id": id_, "updatedCount": count}

    for cs in streams:
        for id_ in range(N_DOCS):
            event = cs.soon_next()
            assert event["operationType"] == "insert"
            assert bson.encode(event["documentKey"]) == bson.encode(
                {**_shard_key(id_), "_id": id_})
            expect_update(cs, id_, 1)

    for id_ in range(N_DOCS):
        coll.update_one({"_id": id_, **_shard_key(id_)}, {"$set": {"updatedCount": 2}})
    s.admin.command("moveChunk", ns, find=middle, to=st.rs_url(0))
    for cs in streams:
        for id_ in range(N_DOCS):
            expect_update(cs, id_, 2)
