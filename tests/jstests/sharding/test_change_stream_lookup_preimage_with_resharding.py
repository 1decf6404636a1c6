"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_lookup_preimage_with_resharding.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011, its part before and after the resharding: on a
collection with `changeStreamPreAndPostImages` sharded on `oldShardKey` (one chunk, on shard0),
a stream with `fullDocument` and `fullDocumentBeforeChange: "required"` returns the updates
made before `reshardCollection` to `newShardKey` and the update made after it, each with its
pre-image and post-image.

Left out: the writes the jstest makes while the resharding runs (`ReshardingTest`'s
`withReshardingInBackground` after its clone timestamp is chosen): the embedded cluster's
`reshardCollection` is one step, with no window in which to write; and the checks of each
shard's `config.system.preimages` documents (where mongod keeps pre-images; the embedded
shards keep theirs in their image store)."""

from __future__ import annotations

from sharding_util import watch

NS = "test.whileResharding"


def test_pre_and_post_images_around_resharding(st):
    s = st.s
    db = s.test
    coll = db.whileResharding
    s.admin.command({"enableSharding": "test", "primaryShard": st.shard0})
    s.admin.command("shardCollection", NS, key={"oldShardKey": 1})
    db.command({"collMod": "whileResharding", "changeStreamPreAndPostImages": {"enabled": True}})
    coll.insert_many([
        {"_id": 0, "annotation": "pre-resharding-insert", "oldShardKey": 0, "newShardKey": 2},
        {"_id": 1, "annotation": "pre-resharding-insert", "oldShardKey": 1, "newShardKey": 3},
    ])
    cs = watch(coll, fullDocument="required", fullDocumentBeforeChange="required")
    coll.update_one({"_id": 0}, {"$set": {"annotation": "pre-resharding-update"}})
    coll.update_one({"_id": 1}, {"$set": {"annotation": "pre-resharding-update"}})

    s.admin.command({"reshardCollection": NS, "key": {"newShardKey": 1}})
    assert s.config.collections.find_one({"_id": NS})["key"] == {"newShardKey": 1}
    coll.update_one({"_id": 0}, {"$set": {"annotation": "post-resharding-update"}})

    for id_, before, after in ((0, "pre-resharding-insert", "pre-resharding-update"),
                               (1, "pre-resharding-insert", "pre-resharding-update"),
                               (0, "pre-resharding-update", "post-resharding-update")):
        event = cs.soon_next()
        assert event["operationType"] == "update", event
        assert event["documentKey"]["_id"] == id_, event
        assert event["fullDocumentBeforeChange"]["annotation"] == before, event
        assert event["fullDocument"]["annotation"] == after, event
