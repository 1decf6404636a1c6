"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_lookup_post_image_chunk_migration.js` @
591928c6193659fc8e1bf6a9ea0b234d3ac25b67, on three shards as the jstest: updates written while
the collection was unsharded on shard0 are looked up (`updateLookup`) by a stream resumed from
before them, after the collection was sharded and its two chunks moved to shard1 and shard2;
and again, with two more updates, after a fourth shard was added (`addShard`: the embedded
cluster adds a shard of its own) and the chunks moved to shard2 and shard3.

Left out: the profiler checks that each lookup went to the shard owning the document (its
`aggregate` with `$match: {_id}` and the stream's `comment` in that shard's `system.profile`):
the front asks its shards in process."""

from __future__ import annotations

from sharding_util import watch

NAME = "change_stream_lookup_post_image_chunk_migration"
NS = f"{NAME}.{NAME}"


def _check_updates(cs, ids: list[int]) -> None:
    for id_ in ids:
        event = cs.soon_next()
        assert event["operationType"] == "update"
        assert event["fullDocument"] == {"_id": id_, "updated": True}


def test_change_stream_lookup_post_image_chunk_migration(st3):
    s = st3.s
    coll = s[NAME][NAME]
    s.admin.command({"enableSharding": NAME, "primaryShard": st3.shard0})
    cs = watch(coll, fullDocument="updateLookup")
    for id_ in (0, 1, 2, 3):
        coll.insert_one({"_id": id_})
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["fullDocument"] == {"_id": id_}
    resume_before_updates = event["_id"]
    cs.close()

    coll.update_one({"_id": 0}, {"$set": {"updated": True}})
    coll.update_one({"_id": 2}, {"$set": {"updated": True}})
    s.admin.command("shardCollection", NS, key={"_id": 1})
    s.admin.command("split", NS, middle={"_id": 2})
    for id_, shard in ((0, st3.shard_names[1]), (2, st3.shard_names[2])):
        s.admin.command({"moveChunk": NS, "find": {"_id": id_}, "to": shard,
                         "_waitForDelete": True})
    cs = watch(coll, resumeAfter=resume_before_updates, fullDocument="updateLookup",
               comment="change stream after sharding")
    _check_updates(cs, [0, 2])
    cs.close()

    coll.update_one({"_id": 1}, {"$set": {"updated": True}})
    coll.update_one({"_id": 3}, {"$set": {"updated": True}})
    s.admin.command({"addShard": "shard3/127.0.0.1:1", "name": "shard3"})
    for id_, shard in ((0, st3.shard_names[2]), (2, "shard3")):
        s.admin.command({"moveChunk": NS, "find": {"_id": id_}, "to": shard,
                         "_waitForDelete": True})
    cs = watch(coll, resumeAfter=resume_before_updates, fullDocument="updateLookup",
               comment="change stream after addShard")
    _check_updates(cs, [0, 2, 1, 3])
    cs.close()
