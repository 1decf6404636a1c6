"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_against_shard_mongod.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011, on a one-shard cluster as the jstest: an
`updateLookup` stream opened on the shard itself (not through mongos) on a collection sharded
on `{a: 1}` sees the insert and the update, with the looked-up document (SERVER-44977)."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from sharding_util import watch

from cdcserver.sharding.testing import ShardedServer

NAME = "change_stream_against_shard_mongod"


@pytest.fixture
def one_shard() -> Iterator[tuple[ShardedServer, pymongo.MongoClient, pymongo.MongoClient]]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as s, \
            pymongo.MongoClient(server.shard_uris[0]) as shard:
        yield server, s, shard


def test_change_stream_against_shard_mongod(one_shard):
    server, s, shard = one_shard
    coll = s[NAME].test
    s.admin.command({"enableSharding": NAME, "primaryShard": server.cluster.shards[0].host_string})
    s.admin.command("shardCollection", f"{NAME}.test", key={"a": 1})
    cs = watch(shard[NAME].test, fullDocument="updateLookup")
    coll.insert_one({"_id": 0, "a": -100})
    coll.update_one({"a": -100}, {"$set": {"updated": True}})
    for op, doc in (("insert", {"_id": 0, "a": -100}),
                    ("update", {"_id": 0, "a": -100, "updated": True})):
        event = cs.soon_next()
        assert event["operationType"] == op
        assert event["fullDocument"] == doc
