"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_on_system_collection.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e, on a one-shard cluster as the jstest: a stream on
a `system.resharding.*` collection with `allowToRunOnSystemNS` is 73 InvalidNamespace through
mongos, but opens on the shard directly and sees the collection's insert from a given time;
that insert reaches neither a whole-db nor a whole-cluster stream through mongos."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from cst import assert_change_stream_event_eq
from pymongo.errors import OperationFailure
from sharding_util import watch, watch_cluster, watch_db

from cdcserver.sharding.testing import ShardedServer

NAME = "change_stream_on_system_collection"
SYSTEM = "system.resharding.someUUID"


@pytest.fixture
def one_shard() -> Iterator[tuple[pymongo.MongoClient, pymongo.MongoClient]]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as s, \
            pymongo.MongoClient(server.shard_uris[0]) as shard:
        yield s, shard


def _insert(coll: str, doc: dict) -> dict:
    return {"documentKey": {"_id": doc["_id"]}, "fullDocument": doc,
            "ns": {"db": NAME, "coll": coll}, "operationType": "insert"}


def test_change_stream_on_system_collection(one_shard):
    s, shard = one_shard
    db = s[NAME]
    s.admin.command("enableSharding", NAME)
    db.drop_collection("t1")
    db.create_collection("t1")
    whole_db = watch_db(db)
    whole_cluster = watch_cluster(s)

    db.create_collection(SYSTEM)
    s.admin.command("shardCollection", f"{NAME}.{SYSTEM}", key={"_id": 1})
    db.t1.insert_one({"_id": 0, "a": 1})
    inserted = whole_db.soon_next()
    assert inserted["operationType"] == "insert", inserted
    assert inserted["ns"]["coll"] == "t1", inserted
    cluster_time_at_insert = inserted["clusterTime"]

    db[SYSTEM].insert_one({"_id": 1, "a": 1})
    db.t1.insert_one({"_id": 2, "a": 1})

    with pytest.raises(OperationFailure) as err:
        watch(db[SYSTEM], allowToRunOnSystemNS=True)
    assert err.value.code == 73, err.value.details

    through_shard = watch(shard[NAME][SYSTEM], startAtOperationTime=cluster_time_at_insert,
                          allowToRunOnSystemNS=True)
    assert_change_stream_event_eq(through_shard.soon_next(), _insert(SYSTEM, {"_id": 1, "a": 1}))

    db.t1.insert_one({"_id": 3, "a": 1})
    assert_change_stream_event_eq(whole_db.soon_next(), _insert("t1", {"_id": 2, "a": 1}))
    assert_change_stream_event_eq(whole_db.soon_next(), _insert("t1", {"_id": 3, "a": 1}))
    for id_ in (0, 2, 3):
        assert_change_stream_event_eq(whole_cluster.soon_next(),
                                      _insert("t1", {"_id": id_, "a": 1}))
    db.drop_collection(SYSTEM)
