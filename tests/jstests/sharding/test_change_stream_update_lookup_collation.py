"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_update_lookup_collation.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: on a collection whose default collation is
case-insensitive, sharded on `shardKey` with the simple collation and split at "aBC" (so "ABC"
and "abc" live on different shards, each with its own `_id: "abc_1"`), `updateLookup` targets
the shard by the documentKey under the simple collation and finds the one updated document:
for a stream without a collation, and for one with a strength-1 collation whose `$match` on
`fullDocument.shardKey` then also matches "ABC".

Left out: the `$indexStats` `accesses.ops` counts of each shard's `_id` index (that the lookup
used it)."""

from __future__ import annotations

from sharding_util import watch

NAME = "change_stream_update_lookup_collation"
CASE_INSENSITIVE = {"locale": "en_US", "strength": 2}
STRENGTH_ONE = {"locale": "en_US", "strength": 1}
SIMPLE = {"locale": "simple"}


def test_change_stream_update_lookup_collation(st):
    s = st.s
    db = s[NAME]
    coll = db[NAME]
    ns = f"{NAME}.{NAME}"
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    db.command({"create": NAME, "collation": CASE_INSENSITIVE})
    s.admin.command({"shardCollection": ns, "key": {"shardKey": 1}, "collation": SIMPLE})
    s.admin.command("split", ns, middle={"shardKey": "aBC"})
    s.admin.command("moveChunk", ns, find={"shardKey": "ABC"}, to=st.rs_url(1))

    for doc in ({"_id": "abc_1", "shardKey": "ABC"}, {"_id": "abc_2", "shardKey": "ABC"},
                {"_id": "abc_1", "shardKey": "abc"}, {"_id": "abc_2", "shardKey": "abc"}):
        coll.insert_one(doc)

    cs = watch(coll, fullDocument="updateLookup")
    for key in ("abc", "ABC"):
        result = coll.update_one({"shardKey": key, "_id": "abc_1"},
                                 {"$set": {"updatedCount": 1}}, collation=SIMPLE)
        assert result.modified_count == 1
    for key in ({"shardKey": "abc", "_id": "abc_1"}, {"shardKey": "ABC", "_id": "abc_1"}):
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert list(event["documentKey"].items()) == list(key.items()), event
        assert event["fullDocument"] == {**key, "updatedCount": 1}, event
    cs.close()

    for doc in ({"_id": "abç_1", "shardKey": "ABÇ"}, {"_id": "abç_2", "shardKey": "ABÇ"},
                {"_id": "abç_1", "shardKey": "abç"}, {"_id": "abç_2", "shardKey": "abç"}):
        coll.insert_one(doc)
    assert len(list(coll.find({"shardKey": "abc"}, collation=STRENGTH_ONE))) == 8

    cs = watch(coll, [{"$match": {"fullDocument.shardKey": "abc"}}], collation=STRENGTH_ONE,
               fullDocument="updateLookup")
    for key in ("ABC", "abc"):
        result = coll.update_one({"shardKey": key, "_id": "abc_1"},
                                 {"$set": {"updatedCount": 2}}, collation=SIMPLE)
        assert result.modified_count == 1
    for key in ({"shardKey": "ABC", "_id": "abc_1"}, {"shardKey": "abc", "_id": "abc_1"}):
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert list(event["documentKey"].items()) == list(key.items()), event
        assert event["fullDocument"] == {**key, "updatedCount": 2}, event
    cs.close()
