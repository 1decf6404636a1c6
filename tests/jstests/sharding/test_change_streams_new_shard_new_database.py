"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_new_shard_new_database.js` @
526a8e21d2b8e0054ad58661c76a9bf6ce2035be, on a one-shard cluster as the jstest: a whole-db
stream and a collection stream on a database that does not exist yet, and a whole-cluster
stream, opened before a shard is added (`addShard`: the embedded cluster adds a shard of its
own); once the database is created with the new shard as its primary, all three see the inserts
into its new unsharded collection (SERVER-42723), and only the cluster stream saw those into
another database before."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from sharding_util import watch, watch_cluster, watch_db

from cdcserver.sharding.testing import ShardedServer

NAME = "change_streams_new_shard_new_database"


@pytest.fixture
def s() -> Iterator[pymongo.MongoClient]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as client:
        yield client


def _assert_all_observed(cs, docs: list[dict]) -> None:
    for doc in docs:
        event = cs.soon_next()
        assert event["fullDocument"] == doc, event


def test_change_streams_new_shard_new_database(s):
    old_db = s[NAME + "_other"]
    new_db = s[NAME]
    whole_db = watch_db(new_db)
    single_coll = watch(new_db.test)
    whole_cluster = watch_cluster(s)

    docs = [{"_id": i} for i in range(20)]
    old_db.coll.insert_many([dict(d) for d in docs])
    _assert_all_observed(whole_cluster, docs)
    for cs in (whole_db, single_coll):
        assert not cs.has_next()

    s.admin.command({"addShard": "newShard1/127.0.0.1:1", "name": "newShard1"})
    s.admin.command({"enableSharding": NAME, "primaryShard": "newShard1"})
    assert s.config.databases.find_one({"_id": NAME, "primary": "newShard1"}) is not None
    new_db.command({"create": "test"})
    assert s.config.databases.find_one({"_id": NAME, "primary": "newShard1"}) is not None
    new_db.test.insert_many([dict(d) for d in docs])
    for cs in (single_coll, whole_db, whole_cluster):
        _assert_all_observed(cs, docs)
