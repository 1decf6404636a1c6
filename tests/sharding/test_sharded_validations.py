"""What mongos refuses in a $changeStream that a shard's mongod accepts
(`DocumentSourceChangeStream::assertIsLegalSpecification` with `inMongos`), and the events
of sharding DDL as mongod 8.0 writes them, through the embedded cluster's front."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure


def _open(client: pymongo.MongoClient, db: str, coll: str | int, **options) -> dict:
    return client[db].command({"aggregate": coll, "pipeline": [{"$changeStream": options}],
                               "cursor": {}})


def _error(client: pymongo.MongoClient, db: str, coll: str | int, **options
           ) -> OperationFailure:
    with pytest.raises(OperationFailure) as err:
        _open(client, db, coll, **options)
    return err.value


def test_show_migration_events_is_refused_through_the_front(cluster, client):
    for coll in ("c", 1):
        err = _error(client, "val", coll, showMigrationEvents=True)
        assert err.code == 31123
        assert err.details["codeName"] == "Location31123"
        assert err.details["errmsg"] == "Change streams from mongos may not show migration events"
    err = _error(client, "admin", 1, allChangesForCluster=True, showMigrationEvents=True)
    assert err.code == 31123
    # false is no request for them; a shard's own mongod serves them.
    _open(client, "val", "c", showMigrationEvents=False)
    with pymongo.MongoClient(cluster.shard_uris[0]) as shard:
        _open(shard, "val", "c", showMigrationEvents=True)


def test_system_collections_are_refused_through_the_front(cluster, client):
    err = _error(client, "val", "system.js", allowToRunOnSystemNS=True)
    assert err.code == 73 and err.details["codeName"] == "InvalidNamespace"
    assert err.details["errmsg"] == (
        "$changeStream may not be opened on the internal val.system.js collection through "
        "mongos")
    err = _error(client, "val", "system.js")
    assert err.code == 73
    assert err.details["errmsg"] == (
        "$changeStream may not be opened on the internal val.system.js collection")
    with pymongo.MongoClient(cluster.shard_uris[0]) as shard:
        _open(shard, "val", "system.js", allowToRunOnSystemNS=True)


def test_router_refusals_come_in_mongod_order(client):
    """The namespace checks every mongod makes first, then the router's (system.* before
    showMigrationEvents), then both resume options."""
    err = _error(client, "local", "system.x", allowToRunOnSystemNS=True,
                 showMigrationEvents=True)
    assert err.details["errmsg"] == "$changeStream may not be opened on the internal local database"
    err = _error(client, "val", "system.x", allowToRunOnSystemNS=True, showMigrationEvents=True)
    assert err.code == 73
    token = {"_data": "8200000001000000012B0229296E04"}
    err = _error(client, "val", "c", showMigrationEvents=True, resumeAfter=token,
                 startAfter=token)
    assert err.code == 31123
    err = _error(client, "val", "c", resumeAfter=token, startAfter=token)
    assert err.code == 50865


def test_shard_collection_event_as_mongod_8_writes_it(cluster, client):
    first = cluster.cluster.shards[0].name
    client.admin.command("enableSharding", "sce", primaryShard=first)
    client.sce.create_collection("c")
    with client.sce.c.watch(show_expanded_events=True, max_await_time_ms=2000) as stream:
        client.admin.command("shardCollection", "sce.c", key={"_id": 1})
        client.sce.c.insert_one({"_id": 1})
        events = []
        while not events or events[-1]["operationType"] != "insert":
            events.append(stream.next())
    shard_event = next(e for e in events if e["operationType"] == "shardCollection")
    description = shard_event["operationDescription"]
    assert list(description.items()) == [
        ("shardKey", {"_id": 1}), ("unique", False), ("presplitHashedZones", False),
        ("capped", False)]


def test_the_sidecar_refuses_them_too(cluster, client):
    """A sidecar of the cluster is a mongos to its clients: the same refusals."""
    from cdcserver.sharding.testing import ShardedSidecar

    with ShardedSidecar(cluster.uri) as sidecar, pymongo.MongoClient(sidecar.uri) as side:
        assert _error(side, "val", "c", showMigrationEvents=True).code == 31123
        err = _error(side, "val", "system.js", allowToRunOnSystemNS=True)
        assert err.code == 73 and err.details["errmsg"].endswith("collection through mongos")
