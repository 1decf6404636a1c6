"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_chunk_migration.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: a collection stream opened before the collection is
sharded returns every insert, in order and without a `retryNeeded` or migration event, while
its chunks move from shard0 to shard1 (until shard1 owns them all), and then to a shard added
after the stream was opened (`addShard`: the embedded cluster adds a shard of its own)."""

from __future__ import annotations

from sharding_util import watch


def test_change_stream_chunk_migration(st):
    s = st.s
    coll = s.test.foo
    s.admin.command({"enableSharding": "test", "primaryShard": st.shard0})
    cs = watch(coll)
    assert not cs.has_next(), "Do not expect any results yet"

    s.admin.command("shardCollection", "test.foo", key={"_id": 1})
    coll.insert_one({"_id": 0})
    coll.insert_one({"_id": 20})
    s.admin.command("split", "test.foo", middle={"_id": 10})
    s.admin.command({"moveChunk": "test.foo", "find": {"_id": 20}, "to": st.shard1,
                     "_waitForDelete": True})
    for id_ in (0, 20):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["documentKey"] == {"_id": id_}

    coll.insert_one({"_id": 1})
    coll.insert_one({"_id": 21})
    s.admin.command("split", "test.foo", middle={"_id": 0})
    s.admin.command({"moveChunk": "test.foo", "find": {"_id": 5}, "to": st.shard1,
                     "_waitForDelete": True})
    for id_ in (-2, 2, 22):
        coll.insert_one({"_id": id_})
    for id_ in (1, 21, -2, 2, 22):
        assert cs.soon_next()["documentKey"] == {"_id": id_}
    assert not cs.has_next()

    # Migrating the last chunk to shard1 (all chunks on one shard) does not invalidate.
    for id_ in (-3, 3, 23):
        coll.insert_one({"_id": id_})
    s.admin.command({"moveChunk": "test.foo", "find": {"_id": -5}, "to": st.shard1,
                     "_waitForDelete": True})
    for id_ in (-4, 4, 24):
        coll.insert_one({"_id": id_})
    for id_ in (-3, 3, 23, -4, 4, 24):
        assert cs.soon_next()["documentKey"] == {"_id": id_}

    # A new shard, and a chunk migrated to it.
    s.admin.command({"addShard": "newShard/127.0.0.1:1", "name": "newShard"})
    for id_ in (-5, 5, 25):
        coll.insert_one({"_id": id_})
    for id_ in (-5, 5, 25):
        assert cs.soon_next()["documentKey"] == {"_id": id_}
    coll.insert_one({"_id": 16})
    s.admin.command({"moveChunk": "test.foo", "find": {"_id": 20}, "to": "newShard",
                     "_waitForDelete": True})
    for id_ in (-6, 6, 26):
        coll.insert_one({"_id": id_})
    for id_ in (16, -6, 6, 26):
        assert cs.soon_next()["documentKey"] == {"_id": id_}
    assert not cs.has_next()
