"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/resume_change_stream_on_subset_of_shards.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011, on three shards as the jstest: a collection sharded
on `_id` with chunks on shard0 and shard1 only; a stream resumed from the token of an insert
returns the next insert, although shard2 holds no chunk of the collection."""

from __future__ import annotations

from sharding_util import watch

NAME = "resume_change_stream_on_subset_of_shards"


def test_resume_change_stream_on_subset_of_shards(st3):
    s = st3.s
    coll = s[NAME].test
    ns = f"{NAME}.test"
    s.admin.command({"enableSharding": NAME, "primaryShard": st3.rs_url(0)})
    s.admin.command("shardCollection", ns, key={"_id": 1})
    s.admin.command("split", ns, middle={"_id": 0})
    s.admin.command("moveChunk", ns, find={"_id": 1}, to=st3.rs_url(1))

    cs = watch(coll)
    coll.insert_one({"_id": -2})
    resume_token = cs.soon_next()["_id"]
    coll.insert_one({"_id": -1})
    coll.insert_one({"_id": 1})
    for id_ in (-1, 1):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["fullDocument"] == {"_id": id_}
    coll.insert_one({"_id": 2})

    cs = watch(coll, resumeAfter=resume_token)
    event = cs.soon_next()
    assert event["documentKey"] == {"_id": -1}
    assert event["fullDocument"] == {"_id": -1}
    assert event["operationType"] == "insert"
