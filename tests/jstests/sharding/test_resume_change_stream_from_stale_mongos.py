"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/resume_change_stream_from_stale_mongos.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: a stream opened through the first mongos while the
collection is unsharded keeps returning inserts after it is sharded and a chunk moves to
shard1; resumed from the last of them through a second mongos, started before the sharding and
unused since (the jstest's stale mongos, which must discover the sharding), it returns the
inserts on both shards after the token. The second mongos is a sidecar of the front
(`ShardedSidecar`, `serve --upstream`): it keeps no routing table, so "stale" here is only that
it was up, and had its view of the shards, before the collection was sharded."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from sharding_util import watch

from cdcserver.sharding.testing import ShardedSidecar

NAME = "resume_change_stream_from_stale_mongos"


@pytest.fixture
def s1(st) -> Iterator[pymongo.MongoClient]:
    with ShardedSidecar(st.server.uri) as sidecar, pymongo.MongoClient(sidecar.uri) as client:
        yield client


def test_resume_change_stream_from_stale_mongos(st, s1):
    s0 = st.s
    coll = s0[NAME].test
    ns = f"{NAME}.test"
    s0.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    cs = watch(coll)
    coll.insert_one({"_id": -1})
    coll.insert_one({"_id": 1})
    for id_ in (-1, 1):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["fullDocument"] == {"_id": id_}

    s0.admin.command("shardCollection", ns, key={"_id": 1})
    s0.admin.command("split", ns, middle={"_id": 0})
    s0.admin.command("moveChunk", ns, find={"_id": 1}, to=st.rs_url(1))
    coll.insert_one({"_id": -2})
    coll.insert_one({"_id": 2})
    for id_ in (-2, 2):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["fullDocument"] == {"_id": id_}
        resume_token = event["_id"]

    coll.insert_one({"_id": -3})
    coll.insert_one({"_id": 3})
    cs.close()
    cs = watch(s1[NAME].test, resumeAfter=resume_token)
    for id_ in (-3, 3):
        event = cs.soon_next()
        assert event["operationType"] == "insert"
        assert event["fullDocument"] == {"_id": id_}
