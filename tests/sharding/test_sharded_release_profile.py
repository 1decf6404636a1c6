"""`--shards N` under `[server] compatibility`: the front and every shard answer as that
release (hello's maxWireVersion, buildInfo, serverStatus), and setFeatureCompatibilityVersion
through the front takes every shard through it, as mongod's config server coordinates it:
one call, each shard's FCV document updated and its time-series collections converted."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pymongo
import pytest
from pymongo.errors import OperationFailure

from cdcserver.config import Config, ServerConfig
from cdcserver.sharding.testing import ShardedServer, ShardedSidecar
from pipeline_stages.release import MONGODB_8_0, MONGODB_9_0

T0 = datetime.datetime(2024, 5, 1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ShardedServer]:
    with ShardedServer(2, config=Config(server=ServerConfig(compatibility="9.0"))) as server:
        yield server


@pytest.fixture(scope="module")
def client(cluster: ShardedServer) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


@pytest.fixture(scope="module")
def shards(cluster: ShardedServer) -> Iterator[list[pymongo.MongoClient]]:
    clients = [pymongo.MongoClient(uri) for uri in cluster.shard_uris]
    try:
        yield clients
    finally:
        for c in clients:
            c.close()


def _fcv(client: pymongo.MongoClient) -> dict:
    return client.admin.command("getParameter", 1, featureCompatibilityVersion=1)[
        "featureCompatibilityVersion"]


def _set_fcv(client: pymongo.MongoClient, version: str) -> None:
    client.admin.command("setFeatureCompatibilityVersion", version, confirm=True)


def test_the_front_and_every_shard_answer_as_the_release(client, shards):
    assert client.admin.command("hello")["msg"] == "isdbgrid"
    for c in [client, *shards]:
        assert c.admin.command("hello")["maxWireVersion"] == MONGODB_9_0.max_wire_version
        assert c.admin.command("buildInfo")["version"] == MONGODB_9_0.version
        assert c.admin.command("serverStatus")["version"] == MONGODB_9_0.version
    # The driver sees a 9.0 mongos.
    assert client.server_info()["versionArray"][:2] == [9, 0]


def test_an_fcv_set_through_the_front_goes_to_every_shard(client, shards):
    assert [_fcv(s) for s in shards] == [{"version": "9.0"}] * 2
    client.admin.command("enableSharding", "tsa", primaryShard="shard0")
    client.admin.command("enableSharding", "tsb", primaryShard="shard1")
    _set_fcv(client, "8.0")
    assert [_fcv(s) for s in shards] == [{"version": "8.0"}] * 2
    for s in shards:  # each shard's own document, through mongod's transitional one
        docs = [e["o"] for e in s.local["oplog.rs"].find({"ns": "admin.system.version"})]
        assert docs[-2:] == [
            {"_id": "featureCompatibilityVersion", "version": "8.0", "targetVersion": "8.0",
             "previousVersion": "9.0"},
            {"_id": "featureCompatibilityVersion", "version": "8.0"}]
    # At FCV 8.0, a time-series collection on each shard is viewful there.
    for db in ("tsa", "tsb"):
        client[db].create_collection("ts", timeseries={"timeField": "t"})
        client[db].ts.insert_one({"t": T0, "v": 1})
    for s, db in zip(shards, ("tsa", "tsb"), strict=True):
        assert "system.buckets.ts" in s[db].list_collection_names()
    stream = client.watch(max_await_time_ms=100)
    _set_fcv(client, "9.0")
    assert [_fcv(s) for s in shards] == [{"version": "9.0"}] * 2
    for s, db in zip(shards, ("tsa", "tsb"), strict=True):
        assert set(s[db].list_collection_names()) == {"ts", "system.views"}
        entries = list(s.local["oplog.rs"].find(
            {"o.upgradeDowngradeViewlessTimeseries": {"$exists": True}}))
        assert [(e["ns"], e["o"]["isUpgrade"]) for e in entries] == [(f"{db}.$cmd", True)]
    renames = []
    while len(renames) < 2:
        change = stream.next()
        if change["operationType"] == "rename":
            renames.append((change["ns"], change["to"]))
    stream.close()
    assert sorted(renames, key=lambda r: r[0]["db"]) == [
        ({"db": db, "coll": "system.buckets.ts"}, {"db": db, "coll": "ts"})
        for db in ("tsa", "tsb")]
    # The same measurements, read through the front.
    for db in ("tsa", "tsb"):
        client[db].ts.insert_one({"t": T0, "v": 2})
        assert sorted(d["v"] for d in client[db].ts.find()) == [1, 2]


def test_a_refused_fcv_changes_no_shard(client, shards):
    before = [_fcv(s) for s in shards]
    with pytest.raises(OperationFailure) as unconfirmed:
        client.admin.command("setFeatureCompatibilityVersion", "8.0")
    assert unconfirmed.value.code == 7369100
    with pytest.raises(OperationFailure) as unknown:
        client.admin.command("setFeatureCompatibilityVersion", "7.0", confirm=True)
    assert unknown.value.code == 2  # 9.0 accepts 8.0 and 9.0 only
    assert [_fcv(s) for s in shards] == before


def test_a_shard_added_later_takes_the_clusters_fcv(cluster, client, shards):
    _set_fcv(client, "8.0")
    try:
        added = client.admin.command("addShard", "shard9/127.0.0.1:1")["shardAdded"]
        shard = cluster.cluster.shard(added)
        with pymongo.MongoClient(f"mongodb://{shard.host}:{shard.port}/?directConnection=true"
                                 ) as c:
            assert _fcv(c) == {"version": "8.0"}
            assert c.admin.command("hello")["maxWireVersion"] == MONGODB_9_0.max_wire_version
        _set_fcv(client, "9.0")
        with pymongo.MongoClient(f"mongodb://{shard.host}:{shard.port}/?directConnection=true"
                                 ) as c:
            assert _fcv(c) == {"version": "9.0"}
    finally:
        _set_fcv(client, "9.0")


def test_the_default_cluster_answers_as_8_0():
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as front, \
            pymongo.MongoClient(server.shard_uris[0]) as shard:
        for c in (front, shard):
            assert c.admin.command("hello")["maxWireVersion"] == MONGODB_8_0.max_wire_version
            assert c.admin.command("buildInfo")["version"] == MONGODB_8_0.version
        with pytest.raises(OperationFailure) as refused:
            front.admin.command("setFeatureCompatibilityVersion", "9.0", confirm=True)
        assert refused.value.code == 2
        _set_fcv(front, "7.0")
        assert _fcv(shard) == {"version": "7.0"}


def test_a_collection_stream_on_a_viewless_collection_is_refused_without_raw_data(client):
    """Through the front as on the shard holding it (mongos passes the shard's error on):
    115 without rawData, a view 166 either way, after the router's own checks of the spec;
    with rawData the stream reads the collection's buckets; a database stream opens."""
    _set_fcv(client, "9.0")
    client.admin.command("enableSharding", "tsc", primaryShard="shard1")  # not shard0's
    client.tsc.create_collection("ts", timeseries={"timeField": "t"})
    client.tsc.command("create", "v", viewOn="ts", pipeline=[])

    def open_on(coll, options=None, **aggregate):
        return client.tsc.command("aggregate", coll, cursor={},
                                  pipeline=[{"$changeStream": options or {}}], **aggregate)

    with pytest.raises(OperationFailure) as refused:
        open_on("ts")
    assert refused.value.code == 115
    assert refused.value.details["errmsg"] == (
        "Cannot run aggregation on timeseries with namespace tsc.ts")
    for aggregate in ({}, {"rawData": True}):
        with pytest.raises(OperationFailure) as on_view:
            open_on("v", **aggregate)
        assert on_view.value.code == 166
        assert on_view.value.details["errmsg"] == "Namespace tsc.v is a view, not a collection"
    with pytest.raises(OperationFailure) as unknown:  # the router's parse comes first
        open_on("ts", {"noSuchOption": True})
    assert unknown.value.code == 40415
    raw = open_on("ts", rawData=True)["cursor"]
    db_stream = open_on(1)["cursor"]
    client.tsc.ts.insert_one({"t": T0, "v": 1})
    events = []
    for _ in range(20):
        events += client.tsc.command("getMore", raw["id"], collection="ts",
                                     maxTimeMS=100)["cursor"]["nextBatch"]
        if events:
            break
    assert [(e["operationType"], e["ns"]) for e in events] == [
        ("insert", {"db": "tsc", "coll": "ts"})]
    assert {"control", "data"} <= set(events[0]["fullDocument"])  # the bucket, as stored
    quiet = client.tsc.command("getMore", db_stream["id"], collection="$cmd.aggregate",
                               maxTimeMS=100)["cursor"]["nextBatch"]
    assert quiet == []  # the measurement is marked: no event without rawData
    client.tsc.command("killCursors", "ts", cursors=[raw["id"]])
    client.tsc.command("killCursors", "$cmd.aggregate", cursors=[db_stream["id"]])


def test_a_sharded_sidecar_refuses_what_the_front_refuses(cluster, client):
    """A sidecar of the cluster (`serve --upstream <mongos>`) reads the namespace through the
    mongos (its primary shard's catalog) and refuses the stream as the front does."""
    _set_fcv(client, "9.0")
    client.admin.command("enableSharding", "tsd", primaryShard="shard1")
    client.tsd.create_collection("ts", timeseries={"timeField": "t"})
    client.tsd.command("create", "v", viewOn="ts", pipeline=[])
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side_server, \
            pymongo.MongoClient(side_server.uri) as side:
        for coll, aggregate in (("ts", {}), ("v", {}), ("v", {"rawData": True})):
            errors = []
            for c in (client, side):
                with pytest.raises(OperationFailure) as refused:
                    c.tsd.command("aggregate", coll, cursor={},
                                  pipeline=[{"$changeStream": {}}], **aggregate)
                errors.append((refused.value.code, refused.value.details["errmsg"]))
            assert errors[0] == errors[1]
            assert errors[0][0] == (115 if coll == "ts" else 166)
        opened = side.tsd.command("aggregate", "ts", cursor={}, rawData=True,
                                  pipeline=[{"$changeStream": {}}])["cursor"]
        side.tsd.command("killCursors", "ts", cursors=[opened["id"]])


def test_the_front_has_no_fcv_parameter_from_9_0(client, shards):
    """mongos 8.3+ (SERVER-118760): the FCV is no parameter of its own; asked only that, 72
    as any unknown one; asked with others, those. The cluster's is each shard's."""
    with pytest.raises(OperationFailure) as none:
        client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
    assert none.value.code == 72
    assert none.value.details["errmsg"] == "no option found to get"
    both = client.admin.command("getParameter", 1, featureCompatibilityVersion=1,
                                cursorTimeoutMillis=1)
    assert "cursorTimeoutMillis" in both and "featureCompatibilityVersion" not in both
    assert "featureCompatibilityVersion" not in client.admin.command("getParameter", "*")
    assert [_fcv(s) for s in shards] == [{"version": "9.0"}] * 2


def test_an_8_0_front_answers_its_binarys_fcv():
    """mongos 8.0 answers the FCV parameter with its binary's (SERVER-100224), not the
    cluster's: after a downgrade to 7.0 it still says 8.0, while every shard says 7.0."""
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as front:
        _set_fcv(front, "7.0")
        assert _fcv(front) == {"version": "8.0"}
        detailed = front.admin.command("getParameter", {"showDetails": True},
                                       featureCompatibilityVersion=1)
        assert detailed["featureCompatibilityVersion"]["value"] == {"version": "8.0"}
        for uri in server.shard_uris:
            with pymongo.MongoClient(uri) as shard:
                assert _fcv(shard) == {"version": "7.0"}


def _fail_next_fcv(shard: pymongo.MongoClient) -> None:
    """The shard refuses the next setFeatureCompatibilityVersion it is sent (the config
    server's, hence failInternalCommands)."""
    shard.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={
        "failCommands": ["setFeatureCompatibilityVersion"], "errorCode": 96,
        "failInternalCommands": True})


def _version_doc(client: pymongo.MongoClient) -> dict:
    return client.admin["system.version"].find_one({"_id": "featureCompatibilityVersion"})


def test_a_retried_fcv_change_finishes_what_a_failing_shard_stopped(client, shards):
    """A later shard's refusal after shard0 took the change: the error comes back, shard0
    shows the transition under way (targetVersion, also in admin.system.version through the
    front), nothing is converted yet; the other way is refused while it is downgrading; the
    same command again finishes it everywhere, conversions included."""
    _set_fcv(client, "9.0")
    for db in ("tse", "tsf"):
        client.admin.command("enableSharding", db,
                             primaryShard="shard0" if db == "tse" else "shard1")
        client[db].create_collection("ts", timeseries={"timeField": "t"})
    _fail_next_fcv(shards[1])
    with pytest.raises(OperationFailure) as failed:
        _set_fcv(client, "8.0")
    assert failed.value.code == 96
    downgrading = {"version": "8.0", "targetVersion": "8.0", "previousVersion": "9.0"}
    assert [_fcv(s) for s in shards] == [downgrading, {"version": "9.0"}]
    assert _version_doc(client) == {"_id": "featureCompatibilityVersion", **downgrading}
    assert "system.buckets.ts" not in client.tse.list_collection_names()  # not prepared yet
    with pytest.raises(OperationFailure) as back_up:
        _set_fcv(client, "9.0")
    assert back_up.value.code == 5147403
    assert [_fcv(s) for s in shards] == [downgrading, {"version": "9.0"}]  # changed nothing
    _set_fcv(client, "8.0")  # the retry
    assert [_fcv(s) for s in shards] == [{"version": "8.0"}] * 2
    for s, db in zip(shards, ("tse", "tsf"), strict=True):
        assert "system.buckets.ts" in s[db].list_collection_names()

    # An upgrade stopped the same way: retried, or turned back (mongod permits both).
    for then in ("9.0", "8.0"):
        _fail_next_fcv(shards[1])
        with pytest.raises(OperationFailure):
            _set_fcv(client, "9.0")
        assert [_fcv(s) for s in shards] == [
            {"version": "8.0", "targetVersion": "9.0"}, {"version": "8.0"}]
        _set_fcv(client, then)
        assert [_fcv(s) for s in shards] == [{"version": then}] * 2
        viewless = then == "9.0"
        for s, db in zip(shards, ("tse", "tsf"), strict=True):
            assert ("system.buckets.ts" not in s[db].list_collection_names()) is viewless
        if viewless:
            _set_fcv(client, "8.0")
    for db in ("tse", "tsf"):
        client.drop_database(db)
    _set_fcv(client, "9.0")
