"""The embedded sharded cluster (`serve --shards N`) through pymongo: the mongos front, routing
by shard key, migrations, and change streams merged from every shard."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import bson
import pymongo
import pytest
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from cdcserver.sharding.catalog import hashed_value
from cdcserver.sharding.shard_commands import AFTER_CLUSTER_TIME_NOOP
from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import EmbeddedServer, serving_port


@pytest.fixture(params=[2, 3], ids=["2shards", "3shards"])
def cluster(request):
    with ShardedServer(request.param) as server:
        yield server


@pytest.fixture
def client(cluster):
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def _spread(client: pymongo.MongoClient, cluster: ShardedServer, ns: str) -> None:
    """A collection sharded on {x: 1} with one chunk per shard: [.., 100), [100, 200), ..."""
    client.admin.command("shardCollection", ns, key={"x": 1})
    names = [s.name for s in cluster.cluster.shards]
    for k in range(1, len(names)):
        client.admin.command("split", ns, middle={"x": 100 * k})
        client.admin.command("moveChunk", ns, find={"x": 100 * k}, to=names[k])


def _shard_counts(cluster: ShardedServer, db: str, coll: str) -> list[int]:
    out = []
    for uri in cluster.shard_uris:
        with pymongo.MongoClient(uri) as c:
            out.append(c[db][coll].count_documents({}))
    return out


def test_front_is_a_mongos_and_shards_are_replica_sets(cluster, client):
    hello = client.admin.command("hello")
    assert hello["msg"] == "isdbgrid"
    assert "setName" not in hello and "hosts" not in hello
    assert client.topology_description.topology_type_name == "Sharded"
    shards = client.admin.command("listShards")["shards"]
    assert [s["_id"] for s in shards] == [s.name for s in cluster.cluster.shards]
    assert list(client.config.shards.find()) == shards
    for shard, uri in zip(shards, cluster.shard_uris, strict=True):
        with pymongo.MongoClient(uri) as direct:
            own = direct.admin.command("hello")
            assert own["setName"] == shard["_id"]
            assert shard["host"] == f"{own['setName']}/{own['me']}"
            with pytest.raises(OperationFailure) as err:
                direct.admin.command("isdbgrid")
            assert err.value.code == 59
    assert client.admin.command("isdbgrid")["isdbgrid"] == 1
    assert client.admin.command("serverStatus")["process"] == "mongos"


def test_unsharded_collections_live_on_their_database_primary(cluster, client):
    client.admin.command("enableSharding", "pinned", primaryShard=cluster.cluster.shards[-1].name)
    client.pinned.c.insert_many([{"i": i} for i in range(5)])
    counts = _shard_counts(cluster, "pinned", "c")
    assert counts[-1] == 5 and sum(counts) == 5
    primary = client.config.databases.find_one({"_id": "pinned"})["primary"]
    assert primary == cluster.cluster.shards[-1].name
    assert client.pinned.c.count_documents({}) == 5


def test_range_and_hashed_sharding_route_documents(cluster, client):
    _spread(client, cluster, "r.c")
    n = len(cluster.cluster.shards)
    client.r.c.insert_many([{"x": x} for x in range(0, 100 * n, 10)])
    assert _shard_counts(cluster, "r", "c") == [10] * n
    # Targeted and broadcast reads and writes through the front.
    assert client.r.c.count_documents({}) == 10 * n
    assert [d["x"] for d in client.r.c.find({}, sort=[("x", -1)], limit=3)] == [
        100 * n - 10, 100 * n - 20, 100 * n - 30]
    assert client.r.c.find_one({"x": 110})["x"] == 110
    assert client.r.c.update_many({}, {"$inc": {"y": 1}}).modified_count == 10 * n
    assert client.r.c.delete_one({"x": 20}).deleted_count == 1
    assert client.r.c.delete_many({"x": {"$gte": 100}}).deleted_count == 10 * (n - 1)
    chunks = list(client.config.chunks.find())
    assert len(chunks) == n and {c["shard"] for c in chunks} == {
        s.name for s in cluster.cluster.shards}

    client.admin.command("shardCollection", "h.c", key={"k": "hashed"})
    client.h.c.insert_many([{"k": k} for k in range(60)])
    counts = _shard_counts(cluster, "h", "c")
    assert sum(counts) == 60 and all(counts)  # presplit: one chunk per shard
    # mongod's own hash (hasher.cpp's test value for 1).
    assert hashed_value(1) == 5902408780260971510
    for chunk in client.config.chunks.find({"uuid": client.config.collections.find_one(
            {"_id": "h.c"})["uuid"]}):
        assert isinstance(chunk["min"]["k"], (MinKey, int))
        assert isinstance(chunk["max"]["k"], (MaxKey, int))


def test_interleaved_writes_merge_in_cluster_time_order(cluster, client):
    _spread(client, cluster, "app.orders")
    n = len(cluster.cluster.shards)
    client.other.notes.insert_one({"seed": 1})  # another database, another primary maybe
    with client.watch(max_await_time_ms=50) as stream:
        expected = []
        for round_ in range(5):
            for k in range(n):
                x = 100 * k + round_
                client.app.orders.insert_one({"_id": f"{k}-{round_}", "x": x})
                expected.append(("insert", f"{k}-{round_}"))
            client.other.notes.insert_one({"_id": round_})
            expected.append(("insert", round_))
        client.app.orders.update_one({"x": 100 * (n - 1)}, {"$set": {"done": True}})
        expected.append(("update", f"{n - 1}-0"))
        client.app.orders.delete_one({"x": 1})
        expected.append(("delete", "0-1"))
        events = [stream.next() for _ in expected]
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == expected
    times = [e["clusterTime"] for e in events]
    assert times == sorted(times) and len(set(times)) == len(times)
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # documentKey as mongod writes it for a sharded collection: the shard key, then _id.
    orders = [e for e in events if e["ns"] == {"db": "app", "coll": "orders"}]
    assert all(list(e["documentKey"]) == ["x", "_id"] for e in orders)
    assert orders[-1]["documentKey"] == {"x": 1, "_id": "0-1"}
    assert list(events[0]["documentKey"]) == ["x", "_id"]


def test_resume_from_any_token_continues_with_the_following_events(cluster, client):
    _spread(client, cluster, "app.c")
    n = len(cluster.cluster.shards)
    with client.app.c.watch() as stream:
        for i in range(4 * n):
            client.app.c.insert_one({"_id": i, "x": 100 * (i % n) + i})
        events = [stream.next() for _ in range(4 * n)]
    ids = [e["documentKey"]["_id"] for e in events]
    assert ids == list(range(4 * n))
    for i, event in enumerate(events):
        for option in ("resume_after", "start_after"):
            with client.app.c.watch(**{option: event["_id"]}, max_await_time_ms=50) as resumed:
                rest = [resumed.next()["documentKey"]["_id"] for _ in range(len(ids) - i - 1)]
                assert rest == ids[i + 1:]
                assert resumed.try_next() is None  # nothing more, nothing doubled
    # A high-water-mark token (an idle stream's) resumes too.
    with client.app.c.watch(max_await_time_ms=50) as idle:
        assert idle.try_next() is None
        token = idle.resume_token
    client.app.c.insert_one({"_id": "after", "x": 5})
    with client.app.c.watch(resume_after=token) as resumed:
        assert resumed.next()["documentKey"]["_id"] == "after"


def test_migrations_write_from_migrate_entries_and_produce_no_events(cluster, client):
    client.admin.command("shardCollection", "m.c", key={"x": 1})
    client.m.c.insert_many([{"_id": i, "x": i} for i in range(20)])
    names = [s.name for s in cluster.cluster.shards]
    with client.m.c.watch(max_await_time_ms=50) as stream:
        client.admin.command("split", "m.c", middle={"x": 10})
        client.admin.command("moveChunk", "m.c", find={"x": 15}, to=names[1])
        client.admin.command("moveRange", "m.c", min={"x": 10}, toShard=names[0])
        client.admin.command("moveRange", "m.c", min={"x": MinKey()}, toShard=names[-1])
        assert stream.try_next() is None
        client.m.c.insert_one({"_id": "sentinel", "x": 3})
        event = stream.next()
        assert event["documentKey"] == {"x": 3, "_id": "sentinel"}
    assert sum(_shard_counts(cluster, "m", "c")) == 21
    assert client.m.c.count_documents({}) == 21
    # The shards' oplogs hold the migrations' writes, marked fromMigrate.
    moved = 0
    for uri in cluster.shard_uris:
        with pymongo.MongoClient(uri) as direct:
            moved += direct.local["oplog.rs"].count_documents(
                {"ns": "m.c", "fromMigrate": True})
    assert moved >= 40  # 20 documents moved out (deletes) and in (inserts) at least once


def test_an_idle_shard_does_not_hold_events_back(cluster, client):
    busy = cluster.cluster.shards[0]
    client.admin.command("enableSharding", "busy", primaryShard=busy.name)
    client.busy.c.insert_one({"warm": 1})
    with client.busy.c.watch(max_await_time_ms=10) as stream:
        assert stream.try_next() is None
        for i in range(5):
            client.busy.c.insert_one({"_id": i})
            # The very next getMore returns the event: the idle shards (whose oplogs end
            # before it) already promised the cluster's time.
            event = stream.try_next()
            assert event is not None and event["documentKey"]["_id"] == i
        assert stream.try_next() is None
        # Its post-batch token stays the last event's: nothing was written after it (as
        # mongos's, the minimum of its shards' tokens, each at its oplog's newest entry).
        assert stream.resume_token == event["_id"]
        client.busy.other.insert_one({"after": 1})  # written later (not watched): a later mark
        assert stream.try_next() is None
        assert stream.resume_token["_data"] > event["_id"]["_data"]
    idle_latest = [cluster.call(s.log.latest_ts) for s in cluster.cluster.shards[1:]]
    assert all(ts < event["clusterTime"] for ts in idle_latest)


def test_sharding_command_errors_on_the_front(cluster, client):
    with pytest.raises(OperationFailure) as err:
        client.app.command("shardCollection", "app.c", key={"x": 1})
    assert err.value.code == 13
    with pytest.raises(OperationFailure) as err:
        client.admin.command("shardCollection", "app.c", key={"x": 2})
    assert err.value.code == 2
    client.admin.command("shardCollection", "app.c", key={"x": 1})
    with pytest.raises(OperationFailure) as err:
        client.admin.command("shardCollection", "app.c", key={"y": 1})
    assert err.value.code == 20
    with pytest.raises(OperationFailure) as err:
        client.admin.command("moveChunk", "app.c", find={"x": 1}, to="nowhere")
    assert err.value.code == 70


@pytest.mark.parametrize("name", ["shardCollection", "enableSharding", "listShards",
                                  "moveChunk", "split", "moveRange", "isdbgrid", "addShard",
                                  "removeShard", "movePrimary"])
def test_sharding_commands_on_a_replica_set_get_mongods_error(name):
    with EmbeddedServer() as server, server.client() as client:
        with pytest.raises(OperationFailure) as err:
            client.admin.command({name: "a.b"})
    assert err.value.code == 59
    assert err.value.details["errmsg"] == f"no such command: '{name}'"
    assert err.value.details["codeName"] == "CommandNotFound"


def test_durable_cluster_keeps_data_and_catalog(tmp_path):
    with ShardedServer(2, data_dir=tmp_path) as server, pymongo.MongoClient(server.uri) as c:
        _spread(c, server, "d.c")
        c.d.c.insert_many([{"_id": i, "x": i * 10} for i in range(20)])
    assert (tmp_path / "shard0").is_dir() and (tmp_path / "shard1").is_dir()
    with ShardedServer(2, data_dir=tmp_path) as server, pymongo.MongoClient(server.uri) as c:
        assert c.d.c.count_documents({}) == 20
        assert c.config.collections.find_one({"_id": "d.c"})["key"] == {"x": 1}
        assert _shard_counts(server, "d", "c") == [10, 10]
        # startAtOperationTime is inclusive: the last write before the restart comes first.
        last = c.admin.command("ping")["operationTime"]
        with c.d.c.watch(start_at_operation_time=last, max_await_time_ms=50) as stream:
            c.d.c.insert_one({"_id": 99, "x": 150})
            assert stream.next()["documentKey"] == {"x": 190, "_id": 19}
            assert stream.next()["documentKey"] == {"x": 150, "_id": 99}


def test_cli_serve_shards():
    proc = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "cdcserver"), "serve", "--in-memory",
         "--shards", "2", "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        port = serving_port(proc.stdout)  # type: ignore[arg-type]
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/",
                                 serverSelectionTimeoutMS=5000) as c:
            assert c.admin.command("hello")["msg"] == "isdbgrid"
            assert len(c.admin.command("listShards")["shards"]) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_cross_shard_transaction_events_share_cluster_time_lsid_and_txn_number(cluster, client):
    _spread(client, cluster, "t.c")
    n = len(cluster.cluster.shards)
    client.t.c.insert_one({"x": -1})
    with client.t.c.watch(max_await_time_ms=50) as stream:
        with client.start_session() as session, session.start_transaction():
            lsid = bytes(session.session_id["id"])
            for k in range(n):
                client.t.c.insert_one({"_id": k, "x": 100 * k + 1}, session=session)
            client.t.c.update_one({"x": -1}, {"$set": {"in": "txn"}}, session=session)
        events = [stream.next() for _ in range(n + 1)]
        assert stream.try_next() is None
    assert {e["clusterTime"] for e in events} == {events[0]["clusterTime"]}
    assert {bytes(e["lsid"]["id"]) for e in events} == {lsid}
    assert {e["txnNumber"] for e in events} == {events[0]["txnNumber"]}
    assert sorted(e["documentKey"].get("_id") for e in events if e["operationType"] == "insert"
                  ) == list(range(n))
    assert all(_shard_counts(cluster, "t", "c"))  # every shard took part
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens)


def test_cluster_time_gossip_advances_the_cluster_clock(cluster, client):
    now = client.admin.command("ping")["operationTime"]
    ahead = Timestamp(now.time + 1000, 7)
    with client.start_session() as session:  # pymongo sends the session's time if later
        session.advance_cluster_time(
            {"clusterTime": ahead, "signature": {"hash": b"\0" * 20, "keyId": 0}})
        client.admin.command("ping", session=session)
    with client.g.c.watch() as stream:
        client.g.c.insert_one({"a": 1})
        event = stream.next()
    assert event["clusterTime"] > ahead
    assert client.admin.command("ping")["$clusterTime"]["clusterTime"] >= event["clusterTime"]


def test_a_balancer_round_spreads_chunks_without_events(cluster, client):
    client.admin.command("shardCollection", "b.c", key={"x": 1})
    n = len(cluster.cluster.shards)
    client.b.c.insert_many([{"_id": i, "x": i} for i in range(10 * n)])
    for k in range(1, 2 * n):
        client.admin.command("split", "b.c", middle={"x": 5 * k})
    assert _shard_counts(cluster, "b", "c")[1:] == [0] * (n - 1)  # every chunk on the primary
    with client.b.c.watch(max_await_time_ms=50) as stream:
        client.admin.command("balancerStart")
        assert client.admin.command("balancerStatus")["mode"] == "full"
        assert stream.try_next() is None
        client.b.c.insert_one({"_id": "after", "x": -5})
        assert stream.next()["documentKey"] == {"x": -5, "_id": "after"}
    per_shard = {}
    for chunk in client.config.chunks.find():
        per_shard[chunk["shard"]] = per_shard.get(chunk["shard"], 0) + 1
    assert max(per_shard.values()) - min(per_shard.values()) <= 1 and len(per_shard) == n
    counts = _shard_counts(cluster, "b", "c")
    assert sum(counts) == 10 * n + 1 and all(counts)
    assert sorted(d["_id"] for d in client.b.c.find({"x": {"$gte": 0}})) == list(range(10 * n))
    # While it is on, a split is followed by a round.
    client.admin.command("split", "b.c", middle={"x": 3})
    per_shard = {}
    for chunk in client.config.chunks.find():
        per_shard[chunk["shard"]] = per_shard.get(chunk["shard"], 0) + 1
    assert max(per_shard.values()) - min(per_shard.values()) <= 1
    client.admin.command("balancerStop")
    assert client.admin.command("balancerStatus")["mode"] == "off"


def test_refine_collection_shard_key(cluster, client):
    client.admin.command("shardCollection", "f.c", key={"a": 1})
    client.f.c.create_index([("a", 1), ("b", 1)])
    with client.f.c.watch(show_expanded_events=True, max_await_time_ms=50) as stream:
        client.admin.command("refineCollectionShardKey", "f.c", key={"a": 1, "b": 1})
        event = stream.next()
        while event["operationType"] != "refineCollectionShardKey":
            event = stream.next()
    assert event["operationDescription"] == {"shardKey": {"a": 1, "b": 1},
                                             "oldShardKey": {"a": 1}}
    assert client.config.collections.find_one({"_id": "f.c"})["key"] == {"a": 1, "b": 1}
    with client.f.c.watch() as stream:
        client.f.c.insert_one({"_id": 1, "b": 2, "a": 3})
        assert list(stream.next()["documentKey"].items()) == [("a", 3), ("b", 2), ("_id", 1)]
    with pytest.raises(OperationFailure) as err:
        client.admin.command("refineCollectionShardKey", "f.c", key={"b": 1})
    assert err.value.code == 72


def test_broadcast_reads_merge_on_the_front_in_batches(cluster, client):
    _spread(client, cluster, "q.c")
    n = len(cluster.cluster.shards)
    client.q.c.insert_many([{"_id": i, "x": (i * 37) % (100 * n), "g": i % 3}
                            for i in range(50)])
    xs = sorted((i * 37) % (100 * n) for i in range(50))
    cursor = client.q.c.find({}, sort=[("x", 1)], batch_size=7)
    assert [d["x"] for d in cursor] == xs
    assert [d["x"] for d in client.q.c.find({"x": {"$gt": 40}}, sort=[("x", -1)], skip=2,
                                            limit=5)] == sorted(
        (x for x in xs if x > 40), reverse=True)[2:7]
    groups = list(client.q.c.aggregate(
        [{"$match": {"x": {"$gte": 0}}}, {"$group": {"_id": "$g", "n": {"$sum": 1}}},
         {"$sort": {"_id": 1}}], batchSize=1))
    assert groups == [{"_id": g, "n": len([i for i in range(50) if i % 3 == g])}
                      for g in range(3)]
    assert client.q.c.count_documents({"g": 1}) == len([i for i in range(50) if i % 3 == 1])
    assert client.q.c.estimated_document_count() == 50
    assert client.q.c.distinct("g") == [0, 1, 2]
    assert client.q.c.distinct("x", {"x": {"$gte": 100}}) == [x for x in xs if x >= 100]


# -- a sidecar of the cluster (`serve --upstream <mongos>`) ---------------------------------------

@pytest.fixture
def sidecar(cluster):
    from cdcserver.sharding.testing import ShardedSidecar

    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side:
        yield side


def _write_round(client, n: int, tag: str) -> int:
    for k in range(n):
        client.app.c.insert_one({"_id": f"{tag}{k}", "x": 100 * k + 1})
    client.idle.c.insert_one({"_id": tag})  # on the idle database's primary only
    return n + 1


def test_sidecar_events_are_the_fronts_byte_for_byte(cluster, client, sidecar):
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    n = len(cluster.cluster.shards)
    with pymongo.MongoClient(sidecar.uri) as side:
        assert side.admin.command("hello")["msg"] == "isdbgrid"
        with client.watch() as front, side.watch() as through:
            count = _write_round(client, n, "a") + _write_round(client, n, "b")
            client.app.c.update_one({"x": 1}, {"$set": {"u": 1}})
            client.app.c.delete_one({"x": 101})
            count += 2
            expected = [front.next() for _ in range(count)]
            got = [through.next() for _ in range(count)]
        assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
        # Resumed on the sidecar from any token: exactly the events after it.
        for i in range(0, count, 3):
            with side.watch(resume_after=expected[i]["_id"]) as resumed:
                rest = [resumed.next() for _ in range(count - i - 1)]
            assert [bson.encode(e) for e in rest] == [bson.encode(e) for e in expected[i + 1:]]
        # Everything else goes to the cluster's mongos.
        assert side.app.c.count_documents({}) == client.app.c.count_documents({})
        assert side.admin.command("listShards")["shards"] == client.admin.command(
            "listShards")["shards"]


def test_sidecar_keeps_cluster_time_order_with_writers_racing_on_every_shard(cluster, client,
                                                                            sidecar):
    """Writers on every shard at once, while the sidecar reads the quiet ones' oplogs at
    afterClusterTime: no event leaves before every shard has promised its time, so the
    sidecar's stream is the front's, event for event, none lost or repeated."""
    import threading

    names = [s.name for s in cluster.cluster.shards]
    for k, name in enumerate(names):
        client.admin.command("enableSharding", f"w{k}", primaryShard=name)
    per_writer = 40
    with pymongo.MongoClient(sidecar.uri) as side, client.watch() as front, \
            side.watch(max_await_time_ms=200) as through:

        def write(k: int) -> None:
            with pymongo.MongoClient(cluster.uri) as own:
                for i in range(per_writer):
                    own[f"w{k}"].c.insert_one({"_id": i})

        writers = [threading.Thread(target=write, args=(k,)) for k in range(len(names))]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        count = per_writer * len(names)
        expected = [front.next() for _ in range(count)]
        got = [through.next() for _ in range(count)]
        assert through.try_next() is None
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
    times = [e["clusterTime"] for e in got]
    assert times == sorted(times)
    assert sidecar.upstream.nudges >= 1


def test_sidecar_never_releases_past_what_a_slow_shard_has_answered(cluster, client,
                                                                     sidecar):
    """A shard whose tail is slow (its getMores and hellos held 150 ms): an event of another
    shard leaves only once the slow shard's read at afterClusterTime has answered for its
    time, so the slow shard's earlier writes come out first, event for event as the front
    gives them; a promise read answers only for its time, never for what is written after."""
    slow, fast = cluster.cluster.shards[-1], cluster.cluster.shards[0]
    client.admin.command("enableSharding", "slow", primaryShard=slow.name)
    client.admin.command("enableSharding", "fast", primaryShard=fast.name)
    with pymongo.MongoClient(cluster.shard_uris[-1]) as direct:
        direct.admin.command({
            "configureFailPoint": "failCommand", "mode": "alwaysOn",
            "data": {"failCommands": ["getMore", "hello"], "blockConnection": True,
                     "blockTimeMS": 150, "appName": "cdcserver"}})
        try:
            with pymongo.MongoClient(sidecar.uri) as side, client.watch() as front, \
                    side.watch(max_await_time_ms=2000) as through:
                rounds = 6
                got = []
                for i in range(rounds):  # the stream waits while the writes come
                    client.slow.c.insert_one({"_id": i})  # earlier, on the slow shard
                    client.fast.c.insert_one({"_id": i})
                    got += [through.next(), through.next()]
                expected = [front.next() for _ in range(2 * rounds)]
        finally:
            direct.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
    assert [e["ns"]["db"] for e in got] == ["slow", "fast"] * rounds


def test_sidecar_asks_list_shards_of_a_mongos_that_refuses_config_shards_at_a_time(cluster,
                                                                                   client):
    """A mongos that refuses the read of `config.shards` at afterClusterTime (an error
    answer): the sidecar asks it `listShards` from then on, and its streams go on."""
    from cdcserver.sharding.testing import ShardedSidecar

    busy = cluster.cluster.shards[0]
    client.admin.command("enableSharding", "lr", primaryShard=busy.name)
    client.admin.command({
        "configureFailPoint": "failCommand", "mode": "alwaysOn",
        "data": {"failCommands": ["find"], "errorCode": 72, "appName": "cdcserver"}})
    try:
        with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side, \
                pymongo.MongoClient(side.uri) as reader, \
                reader.lr.c.watch(max_await_time_ms=2000) as stream:
            for i in range(3):
                client.lr.c.insert_one({"_id": i})
                assert stream.next()["documentKey"] == {"_id": i}
            assert side.upstream._list_shards_refused
    finally:
        client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})


def test_sidecar_asks_append_oplog_note_of_a_shard_that_refuses_promise_reads(cluster, client,
                                                                             sidecar):
    """An idle shard that refuses the read of its oplog at afterClusterTime (an error answer,
    not a failover's): it is asked `appendOplogNote` past the time instead, its tail reads
    that no-op, and the busy shard's events still leave at once, in order."""
    from cdcserver.sharding.sidecar import NUDGE_NOTE

    busy, idle = cluster.cluster.shards[0], cluster.cluster.shards[1]
    client.admin.command("enableSharding", "rf", primaryShard=busy.name)
    with pymongo.MongoClient(cluster.shard_uris[1]) as direct, \
            pymongo.MongoClient(sidecar.uri) as side, \
            side.rf.c.watch(max_await_time_ms=2000) as stream:
        tail = sidecar.upstream.shard(idle.name).log
        deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
        while not tail.connected:  # its tailable cursor is open: the fail point spares it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        direct.admin.command({
            "configureFailPoint": "failCommand", "mode": "alwaysOn",
            "data": {"failCommands": ["find"], "errorCode": 72, "appName": "cdcserver"}})
        try:
            for i in range(3):
                client.rf.c.insert_one({"_id": i})
                assert stream.next()["documentKey"] == {"_id": i}
        finally:
            direct.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        assert tail.promise_read_refused
        notes = [e for e in direct.local["oplog.rs"].find({"op": "n"})
                 if e["o"] == NUDGE_NOTE]
        assert notes


def test_sidecar_nudges_idle_shards_instead_of_waiting(cluster, client, sidecar):
    busy = cluster.cluster.shards[0]
    client.admin.command("enableSharding", "busy", primaryShard=busy.name)
    with pymongo.MongoClient(sidecar.uri) as side:
        side.busy.c.insert_one({"warm": 1})  # through the sidecar: its time is gossiped back
        stream = side.busy.c.watch(max_await_time_ms=2000)
        for i in range(3):
            client.busy.c.insert_one({"_id": i})
            assert stream.next()["documentKey"] == {"_id": i}
        stream.close()
    assert sidecar.upstream.nudges >= 1  # the idle shards' oplogs were read afterClusterTime
    for shard in cluster.cluster.shards[1:]:  # ...which wrote a no-op (invisible to streams)
        notes = [e for e in cluster.call(lambda s=shard: s.store.read_from(
            bson.Timestamp(0, 0), 10_000))
            if e["op"] == "n" and dict(e["o"]) == AFTER_CLUSTER_TIME_NOOP]
        assert notes


def test_sidecar_goes_through_a_shard_restart_without_loss_or_duplicate(cluster, client,
                                                                        sidecar):
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    n = len(cluster.cluster.shards)
    with pymongo.MongoClient(sidecar.uri) as side, client.watch() as front, side.watch(
        max_await_time_ms=200
    ) as through:
        count = _write_round(client, n, "a")
        first = [through.next() for _ in range(count)]
        # The last shard goes away; writes go on through the front meanwhile.
        cluster.restart_shard(n - 1, lambda: _write_round(client, n, "b"))
        count += (n + 1) + _write_round(client, n, "c")
        expected = [front.next() for _ in range(count)]
        got = first + [through.next() for _ in range(count - len(first))]
        assert through.try_next() is None
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]


def test_sidecar_fails_streams_resumably_while_a_shard_is_unreachable(cluster, client,
                                                                      sidecar):
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    sidecar.upstream.down_grace_s = 0.0  # fail at once (5 s by default)
    n = len(cluster.cluster.shards)
    side = pymongo.MongoClient(sidecar.uri)
    errors = []
    with side, client.watch() as front:
        through = side.watch(max_await_time_ms=100)
        count = _write_round(client, n, "a")
        seen = [through.next() for _ in range(count)]

        def while_down() -> None:
            _write_round(client, n, "b")
            deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
            while not errors and time.monotonic() < deadline:
                try:
                    event = through.try_next()
                    if event is not None:
                        seen.append(event)
                except pymongo.errors.OperationFailure as exc:
                    errors.append(exc)

        cluster.restart_shard(n - 1, while_down)
        # The getMore's 6 HostUnreachable is resumable: pymongo's one resume, a new stream's
        # aggregate, is what it raises: 133, as mongos's (change_stream_error_label.js).
        assert errors and errors[0].code == 133
        assert errors[0].has_error_label("ResumableChangeStreamError")
        count += (n + 1) + _write_round(client, n, "c")
        expected = [front.next() for _ in range(count)]
        deadline = time.monotonic() + 30
        while True:  # the shard is back once the sidecar's tail of it reads again
            try:
                resumed = side.watch(resume_after=seen[-1]["_id"], max_await_time_ms=100)
                break
            except pymongo.errors.OperationFailure:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with resumed:
            seen += [resumed.next() for _ in range(count - len(seen))]
    assert [bson.encode(e) for e in seen] == [bson.encode(e) for e in expected]


def test_cli_serve_upstream_of_a_mongos_is_a_sidecar_of_the_cluster(cluster, client):
    _spread(client, cluster, "app.c")
    proc = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "cdcserver"), "serve", "--upstream",
         cluster.uri, "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    try:
        port = serving_port(proc.stdout, lines)  # type: ignore[arg-type]
        assert any("upstream is a mongos: tailing" in line for line in lines)
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/",
                                 serverSelectionTimeoutMS=5000) as side:
            assert side.admin.command("hello")["msg"] == "isdbgrid"
            with side.app.c.watch() as stream:
                side.app.c.insert_many([{"x": 1}, {"x": 150}])
                keys = [stream.next()["documentKey"]["x"] for _ in range(2)]
            assert keys == [1, 150]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_reshard_collection_moves_documents_without_events(cluster, client):
    client.admin.command("shardCollection", "rs.c", key={"a": 1})
    client.rs.c.insert_many([{"_id": i, "a": i, "b": -i} for i in range(30)])
    before = client.config.collections.find_one({"_id": "rs.c"})["uuid"]
    with client.rs.c.watch(show_expanded_events=True, max_await_time_ms=50) as stream:
        client.admin.command("reshardCollection", "rs.c", key={"b": "hashed"})
        event = stream.next()
        assert event["operationType"] == "reshardCollection"
        assert event["operationDescription"]["shardKey"] == {"b": "hashed"}
        assert event["operationDescription"]["oldShardKey"] == {"a": 1}
        assert stream.try_next() is None  # the copy and the drops are migrations
        client.rs.c.insert_one({"_id": "new", "a": 1, "b": 7})
        after = stream.next()
    assert list(after["documentKey"]) == ["b", "_id"]
    assert client.config.collections.find_one({"_id": "rs.c"})["uuid"] != before
    counts = _shard_counts(cluster, "rs", "c")
    assert sum(counts) == 31 and all(counts)
    assert sorted(d["a"] for d in client.rs.c.find({"_id": {"$ne": "new"}})) == list(range(30))


def test_serve_recorded_shard_oplogs_gives_the_fronts_events(cluster, client, tmp_path):
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    n = len(cluster.cluster.shards)
    start = client.admin.command("ping")["operationTime"]
    with client.watch(start_at_operation_time=start) as front:
        count = _write_round(client, n, "a") + _write_round(client, n, "b")
        client.app.c.update_many({}, {"$set": {"u": 1}})
        count += 2 * n
        live = [front.next() for _ in range(count)]
    paths = []
    for shard in cluster.cluster.shards:  # each shard's oplog, as mongodump writes it
        path = tmp_path / f"{shard.name}.bson"
        path.write_bytes(b"".join(cluster.call(shard.store.oplog_entries)))
        paths.append(path)
    command = [str(pathlib.Path(sys.executable).parent / "cdcserver"), "serve", "--port",
               "0", "--metrics-port", "0"]
    for path in paths:
        command += ["--oplog", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port = serving_port(proc.stdout)  # type: ignore[arg-type]
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/",
                                 serverSelectionTimeoutMS=5000) as recorded:
            assert recorded.admin.command("hello")["msg"] == "isdbgrid"
            with recorded.watch(start_at_operation_time=start) as stream:
                served = [stream.next() for _ in range(count)]
                assert stream.try_next() is None
            with recorded.watch(resume_after=live[3]["_id"]) as stream:
                assert [bson.encode(stream.next()) for _ in range(count - 4)] == [
                    bson.encode(e) for e in live[4:]]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert [bson.encode(e) for e in served] == [bson.encode(e) for e in live]
    # `cdcserver replay` of the same recordings merges them the same way (merge.py).
    from cdcserver.cli import replay_shards

    replayed = []
    cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": True}}]}
    for events, _ in replay_shards([[str(p)] for p in paths], cmd, "admin"):
        replayed.extend(events)
    assert [bson.encode(e) for e in replayed] == [bson.encode(e) for e in live]


def test_renaming_a_sharded_collection_renames_it_on_every_shard(cluster, client):
    _spread(client, cluster, "ren.a")
    n = len(cluster.cluster.shards)
    client.ren.a.insert_many([{"x": 100 * k} for k in range(n)])
    with client.ren.watch(max_await_time_ms=50) as stream:
        client.admin.command("renameCollection", "ren.a", to="ren.b")
        event = stream.next()
        assert (event["operationType"], event["to"]) == ("rename", {"db": "ren", "coll": "b"})
        assert stream.try_next() is None  # one rename event, not one per shard
    assert _shard_counts(cluster, "ren", "b") == [1] * n
    assert _shard_counts(cluster, "ren", "a") == [0] * n
    assert client.config.collections.find_one({"_id": "ren.b"})["key"] == {"x": 1}
    assert client.ren.b.count_documents({}) == n


def test_an_update_that_moves_a_document_to_another_shard(cluster, client):
    _spread(client, cluster, "w.c")
    client.w.c.insert_many([{"_id": 1, "x": 5}, {"_id": 2, "x": 6}])
    with client.w.c.watch(max_await_time_ms=50) as stream:
        # Retryable (pymongo's default): deleted on its shard, inserted on the new one.
        result = client.w.c.update_one({"_id": 1}, {"$set": {"x": 150, "y": 1}})
        assert (result.matched_count, result.modified_count) == (1, 1)
        deleted, inserted = stream.next(), stream.next()
        assert (deleted["operationType"], deleted["documentKey"]) == ("delete",
                                                                      {"x": 5, "_id": 1})
        assert (inserted["operationType"], inserted["documentKey"]) == ("insert",
                                                                        {"x": 150, "_id": 1})
        assert deleted["clusterTime"] == inserted["clusterTime"]
        # On the same shard: an update as usual.
        client.w.c.update_one({"_id": 2}, {"$set": {"x": 7}})
        assert stream.next()["operationType"] == "update"
    counts = _shard_counts(cluster, "w", "c")
    assert counts[0] == 1 and counts[1] == 1
    assert client.w.c.find_one({"x": 150}) == {"_id": 1, "x": 150, "y": 1}
    # Without retryable writes or a transaction, mongod's IllegalOperation.
    with pymongo.MongoClient(cluster.uri, retryWrites=False) as plain:
        with pytest.raises(pymongo.errors.WriteError) as err:
            plain.w.c.update_one({"_id": 2}, {"$set": {"x": 160}})
        assert err.value.code == 20
    # In a transaction: two statements of it, committed together.
    with client.start_session() as session, session.start_transaction():
        client.w.c.update_one({"_id": 2}, {"$set": {"x": 170}}, session=session)
    assert client.w.c.find_one({"_id": 2})["x"] == 170
    assert _shard_counts(cluster, "w", "c")[:2] == [0, 2]


def test_find_and_modify_that_moves_a_document_to_another_shard(cluster, client):
    _spread(client, cluster, "w.f")
    client.w.f.insert_many([{"_id": 1, "x": 5}, {"_id": 2, "x": 6}])
    with client.w.f.watch(max_await_time_ms=50) as stream:
        # Retryable: the document moves; the reply is findAndModify's (pre- or post-image).
        before = client.w.f.find_one_and_update({"_id": 1}, {"$set": {"x": 150}})
        assert before == {"_id": 1, "x": 5}
        deleted, inserted = stream.next(), stream.next()
        assert (deleted["operationType"], inserted["operationType"]) == ("delete", "insert")
        assert inserted["documentKey"] == {"x": 150, "_id": 1}
        assert deleted["clusterTime"] == inserted["clusterTime"]
        after = client.w.f.find_one_and_update(
            {"x": 150}, {"$set": {"x": 7, "y": 1}}, projection={"y": 1, "_id": 0},
            return_document=pymongo.ReturnDocument.AFTER)
        assert after == {"y": 1}
        assert [stream.next()["operationType"] for _ in range(2)] == ["delete", "insert"]
    assert _shard_counts(cluster, "w", "f")[:2] == [2, 0]
    with pymongo.MongoClient(cluster.uri, retryWrites=False) as plain:
        with pytest.raises(OperationFailure) as err:
            plain.w.f.find_one_and_update({"_id": 2}, {"$set": {"x": 160}})
        assert err.value.code == 20 and err.value.details["codeName"] == "IllegalOperation"
    with client.start_session() as session, session.start_transaction():
        moved = client.w.f.find_one_and_update({"_id": 2}, {"$set": {"x": 170}},
                                               session=session,
                                               return_document=pymongo.ReturnDocument.AFTER)
        assert moved == {"_id": 2, "x": 170}
    assert _shard_counts(cluster, "w", "f")[:2] == [1, 1]


def test_cross_shard_commit_writes_prepare_and_commit_transaction_entries(cluster, client):
    _spread(client, cluster, "p.c")
    n = len(cluster.cluster.shards)
    with client.start_session() as session, session.start_transaction():
        for k in range(n):
            client.p.c.insert_one({"_id": k, "x": 100 * k}, session=session)
    commits, prepares = [], []
    for shard in cluster.cluster.shards:
        entries = cluster.call(lambda s=shard: s.store.read_from(bson.Timestamp(0, 0), 10_000))
        prepared = [e for e in entries if e["op"] == "c" and e["o"].get("prepare")]
        committed = [e for e in entries if e["op"] == "c" and "commitTransaction" in e["o"]]
        assert len(prepared) == 1 and len(committed) == 1
        prepare, commit = prepared[0], committed[0]
        assert list(prepare["o"]) == ["applyOps", "prepare"]
        assert commit["prevOpTime"]["ts"] == prepare["ts"] < commit["ts"]
        assert commit["o"]["commitTimestamp"] == commit["ts"]
        assert commit["lsid"] == prepare["lsid"] and commit["txnNumber"] == prepare["txnNumber"]
        prepares.append(prepare["ts"])
        commits.append(commit["ts"])
    assert len(set(commits)) == 1 and max(prepares) < commits[0]


def test_an_aborted_cross_shard_transaction_leaves_nothing(cluster, client):
    _spread(client, cluster, "ab.c")
    n = len(cluster.cluster.shards)
    client.ab.c.insert_one({"_id": "dup", "x": 100 * (n - 1)})
    with client.ab.c.watch(max_await_time_ms=50) as stream:
        with client.start_session() as session:
            session.start_transaction()
            for k in range(n - 1):
                client.ab.c.insert_one({"_id": k, "x": 100 * k}, session=session)
            with pytest.raises(pymongo.errors.DuplicateKeyError):
                client.ab.c.insert_one({"_id": "dup", "x": 100 * (n - 1)}, session=session)
            session.abort_transaction()
        assert stream.try_next() is None
    assert client.ab.c.count_documents({}) == 1


def test_upserts_go_to_the_shard_of_their_key(cluster, client):
    _spread(client, cluster, "up.c")
    n = len(cluster.cluster.shards)
    client.up.c.update_one({"x": 100 * (n - 1) + 5}, {"$set": {"y": 1}}, upsert=True)
    assert _shard_counts(cluster, "up", "c")[n - 1] == 1
    # 8.0: a single upsert without the shard key updates a match on any shard...
    client.up.c.update_one({"y": 1}, {"$set": {"z": 1}}, upsert=True)
    assert client.up.c.count_documents({}) == 1
    # ...or, with none, inserts on the shard of the document it makes (a missing key: null).
    result = client.up.c.update_one({"y": 2}, {"$set": {"x": 100 * (n - 1) + 7}}, upsert=True)
    assert result.upserted_id is not None
    assert _shard_counts(cluster, "up", "c")[n - 1] == 2
    client.up.c.replace_one({"y": 3}, {"y": 3, "w": 1}, upsert=True)
    assert _shard_counts(cluster, "up", "c")[0] == 1  # x missing: null, the lowest chunk
    # A multi-document upsert must still name its shard (61 ShardKeyNotFound).
    with pytest.raises(pymongo.errors.WriteError) as err:
        client.up.c.update_many({"y": 4}, {"$set": {"z": 1}}, upsert=True)
    assert err.value.code == 61
    assert client.up.c.count_documents({}) == 3


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_front_stream_is_the_shards_own_streams_merged(seed):
    """Random writes (inserts, updates, deletes, transactions, migrations, on sharded and
    unsharded collections): the front's stream is exactly the union of what each shard's own
    change stream (a direct connection) gives, in token order, byte for byte."""
    import random

    rng = random.Random(seed)
    with ShardedServer(3) as cluster, pymongo.MongoClient(cluster.uri) as client:
        _spread(client, cluster, "rnd.s")
        client.admin.command("shardCollection", "rnd.h", key={"k": "hashed"})
        for db in ("u0", "u1", "u2"):
            client[db].c.insert_one({"seed": True})
        start = client.admin.command("ping")["operationTime"]
        names = [s.name for s in cluster.cluster.shards]
        for step in range(150):
            kind = rng.random()
            if kind < 0.35:
                client.rnd.s.insert_one({"_id": step, "x": rng.randrange(300)})
            elif kind < 0.5:
                client.rnd.h.insert_one({"_id": step, "k": rng.randrange(1000)})
            elif kind < 0.6:
                client[f"u{rng.randrange(3)}"].c.insert_one({"_id": step})
            elif kind < 0.7:
                client.rnd.s.update_many({"x": {"$lt": rng.randrange(300)}}, {"$inc": {"n": 1}})
            elif kind < 0.78:
                client.rnd.s.delete_one({"x": {"$gte": rng.randrange(300)}})
            elif kind < 0.9:
                with client.start_session() as session, session.start_transaction():
                    for j in range(rng.randrange(1, 4)):
                        client.rnd.s.insert_one({"_id": f"t{step}.{j}", "x": rng.randrange(300)},
                                                session=session)
            else:
                low = rng.choice([0, 100, 200])
                client.admin.command("moveChunk", "rnd.s", find={"x": low},
                                     to=rng.choice(names))
        with client.watch(start_at_operation_time=start) as front:
            merged = []
            while (event := front.try_next()) is not None:
                merged.append(event)
        own = []
        for uri in cluster.shard_uris:
            with pymongo.MongoClient(uri) as direct, direct.watch(
                start_at_operation_time=start
            ) as stream:
                while (event := stream.try_next()) is not None:
                    own.append(event)
    own.sort(key=lambda e: e["_id"]["_data"])
    assert len(merged) > 100
    assert [bson.encode(e) for e in merged] == [bson.encode(e) for e in own]


# -- adding and removing shards ------------------------------------------------------------------

def _assert_merged(events: list, count: int) -> None:
    """Every write once, in clusterTime order with increasing tokens."""
    assert len(events) == count
    keys = [e["_id"]["_data"] for e in events]
    assert keys == sorted(keys) and len(set(keys)) == count
    times = [e["clusterTime"] for e in events]
    assert times == sorted(times)
    ids = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
    assert len(set(ids)) == count


def test_add_shard_mid_stream_on_the_front_and_on_a_sidecar(cluster, client):
    from cdcserver.sharding.testing import ShardedSidecar

    client.admin.command("shardCollection", "app.c", key={"x": 1})
    before = client.admin.command("ping")["operationTime"]
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side_server, pymongo.MongoClient(
        side_server.uri
    ) as side, client.watch() as front, side.watch() as through:
        client.app.c.insert_one({"_id": "a", "x": 1})
        added = client.admin.command("addShard", "rsNew/127.0.0.1:1")
        assert added["shardAdded"] == "rsNew"
        entry = [s for s in client.admin.command("listShards")["shards"]
                 if s["_id"] == "rsNew"][0]
        assert entry["topologyTime"] >= added["operationTime"] > before
        assert entry["host"].startswith("rsNew/127.0.0.1:")
        # Asked again for the same replica set: the shard it already is.
        assert client.admin.command("addShard", "rsNew/127.0.0.1:1")["shardAdded"] == "rsNew"
        client.admin.command("split", "app.c", middle={"x": 1000})
        client.admin.command("moveChunk", "app.c", find={"x": 1000}, to="rsNew")
        for k in range(6):  # interleaved: the new shard and the old one in turn
            client.app.c.insert_one({"_id": f"n{k}", "x": 1000 + k})
            client.app.c.insert_one({"_id": f"o{k}", "x": k})
        client.app.c.update_one({"x": 1001}, {"$set": {"u": 1}})
        count = 1 + 12 + 1
        expected = [front.next() for _ in range(count)]
        got = [through.next() for _ in range(count)]
        assert front.try_next() is None
    _assert_merged(expected, count)
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
    new_port = int(entry["host"].rsplit(":", 1)[1])
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{new_port}/?directConnection=true") as d:
        assert d.app.c.count_documents({}) == 6  # the writes did land on the new shard
    # Resumed from before the shard was added: the same events (the shard joins at its time).
    with client.watch(start_at_operation_time=before) as resumed:
        again = [resumed.next() for _ in range(count)]
    assert [bson.encode(e) for e in again] == [bson.encode(e) for e in expected]


def test_remove_shard_drains_and_streams_end_its_part_cleanly(cluster, client):
    from cdcserver.sharding.testing import ShardedSidecar

    names = [s.name for s in cluster.cluster.shards]
    gone = names[-1]
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "solo", primaryShard=gone)
    client.solo.c.insert_one({"_id": "s0"})
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side_server, pymongo.MongoClient(
        side_server.uri
    ) as side, client.watch() as front, side.watch() as through:
        count = _write_round(client, len(names), "a")
        started = client.admin.command("removeShard", gone)
        assert {k: started[k] for k in ("msg", "state", "shard", "note", "dbsToMove")} == {
            "msg": "draining started successfully", "state": "started", "shard": gone,
            "note": "you need to drop or movePrimary these databases", "dbsToMove": ["solo"],
        }
        listed = {s["_id"]: s for s in client.admin.command("listShards")["shards"]}
        assert listed[gone]["draining"] is True
        assert _shard_counts(cluster, "app", "c")[-1] == 0  # its chunks moved off
        client.solo.c.insert_one({"_id": "s1"})  # its database still lives on it
        ongoing = client.admin.command("removeShard", gone)
        assert ongoing["state"] == "ongoing" and ongoing["msg"] == "draining ongoing"
        assert ongoing["remaining"] == {"chunks": 0, "dbs": 1, "jumboChunks": 0}
        client.admin.command("movePrimary", "solo", to=names[0])
        assert client.solo.c.count_documents({}) == 2  # moved without events
        done = client.admin.command("removeShard", gone)
        assert {k: done[k] for k in ("msg", "state", "shard")} == {
            "msg": "removeshard completed successfully", "state": "completed", "shard": gone}
        assert gone not in {s["_id"] for s in client.admin.command("listShards")["shards"]}
        with pytest.raises(OperationFailure) as err:
            client.admin.command("removeShard", gone)
        assert err.value.code == 70 and err.value.details["codeName"] == "ShardNotFound"
        count += 1 + _write_round(client, len(names) - 1, "b")
        client.solo.c.insert_one({"_id": "s2"})
        count += 1
        expected = [front.next() for _ in range(count)]
        got = [through.next() for _ in range(count)]
        assert front.try_next() is None
    _assert_merged(expected, count)
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
    # Resumed from before the removal: the removed shard's events too, once.
    with client.watch(resume_after=expected[0]["_id"]) as resumed:
        again = [resumed.next() for _ in range(count - 1)]
        assert resumed.try_next() is None
    assert [bson.encode(e) for e in again] == [bson.encode(e) for e in expected[1:]]


def test_add_and_remove_shard_errors(cluster, client):
    names = [s.name for s in cluster.cluster.shards]
    cases = [
        ({"addShard": "rs/127.0.0.1:1"}, "app", 13),
        ({"addShard": 5}, "admin", 14),
        ({"addShard": "rsX/127.0.0.1:1", "name": names[0]}, "admin", 20),
        ({"removeShard": "nowhere"}, "admin", 70),
        ({"removeShard": names[0]}, "app", 13),
        ({"movePrimary": "nodb", "to": names[0]}, "admin", 26),
    ]
    for cmd, db, code in cases:
        with pytest.raises(OperationFailure) as err:
            client[db].command(cmd)
        assert err.value.code == code, cmd
    for name in names[1:]:
        client.admin.command("removeShard", name)
    with pytest.raises(OperationFailure) as err:
        client.admin.command("removeShard", names[0])
    assert err.value.code == 20
    assert err.value.details["errmsg"] == (
        "Operation not allowed because it would remove the last shard")
    # A name made up as mongod makes it: after the highest "shard<n>" of the members (the
    # draining ones are still members).
    assert client.admin.command("addShard", "127.0.0.1:1")["shardAdded"] == (
        f"shard{len(names):04d}")


def test_added_and_removed_shards_outlive_a_restart(tmp_path):
    with ShardedServer(2, data_dir=tmp_path) as server, pymongo.MongoClient(server.uri) as c:
        c.admin.command("addShard", "extra/127.0.0.1:1")
        c.admin.command("enableSharding", "d", primaryShard="extra")
        c.d.c.insert_one({"_id": 1})
        c.admin.command("removeShard", "shard1")
        c.admin.command("removeShard", "shard1")
        last = c.admin.command("ping")["operationTime"]
    with ShardedServer(2, data_dir=tmp_path) as server, pymongo.MongoClient(server.uri) as c:
        assert [s["_id"] for s in c.admin.command("listShards")["shards"]] == [
            "shard0", "extra"]
        assert c.d.c.find_one() == {"_id": 1}
        with c.watch(start_at_operation_time=last, max_await_time_ms=50) as stream:
            c.d.c.insert_one({"_id": 2})
            assert stream.next()["documentKey"] == {"_id": 2}


def test_sidecar_with_a_retained_log_per_shard_resumes_after_a_restart(cluster, client,
                                                                        tmp_path):
    """`[upstream] retain_dir`: each shard's tail keeps its durable log in a directory of its
    own; a restarted sidecar resumes streams from it."""
    from cdcserver.sharding.testing import ShardedSidecar

    _spread(client, cluster, "app.c")
    n = len(cluster.cluster.shards)
    retain = tmp_path / "retained"
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0, retain_dir=str(retain)) as side_server:
        with pymongo.MongoClient(side_server.uri) as side, side.watch() as through:
            count = _write_round(client, n, "a")
            first = [through.next() for _ in range(count)]
    assert sorted(p.name for p in retain.iterdir()) == sorted(
        s.name for s in cluster.cluster.shards)
    count = _write_round(client, n, "b")  # while no sidecar runs
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0, retain_dir=str(retain)) as side_server:
        with pymongo.MongoClient(side_server.uri) as side, side.watch(
            resume_after=first[0]["_id"]
        ) as resumed, client.watch(resume_after=first[0]["_id"]) as front:
            expected = [front.next() for _ in range(len(first) - 1 + count)]
            got = [resumed.next() for _ in range(len(expected))]
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
    assert [bson.encode(e) for e in got[:len(first) - 1]] == [bson.encode(e) for e in first[1:]]


def test_sidecar_fails_streams_resumably_while_the_mongos_is_unreachable(cluster, client):
    """Without the shard list no event may leave (a shard could have been added): a mongos
    that cannot be asked fails the sidecar's streams with a resumable error, and they resume
    once it answers again."""
    from cdcserver.server import Server
    from cdcserver.sharding.testing import ShardedSidecar

    _spread(client, cluster, "app.c")
    n = len(cluster.cluster.shards)
    quick = {"serverSelectionTimeoutMS": 500, "heartbeatFrequencyMS": 500}  # notice it soon
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0, client_options=quick
                        ) as side_server, pymongo.MongoClient(side_server.uri) as side:
        side_server.upstream.down_grace_s = 0.0
        side_server.upstream.topology_poll_s = 0.05
        through = side.watch(max_await_time_ms=100)
        count = _write_round(client, n, "a")
        seen = [through.next() for _ in range(count)]
        front = cluster.server
        cluster.run(front.close())  # the mongos goes away; the shards stay
        errors = []
        deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
        while not errors and time.monotonic() < deadline:
            try:
                through.try_next()
            except pymongo.errors.OperationFailure as exc:
                errors.append(exc)
        assert errors and errors[0].code == 6
        assert errors[0].has_error_label("ResumableChangeStreamError")

        async def listen_again() -> None:
            server = Server(front.state)
            await server.start("127.0.0.1", cluster.port)
            cluster.server = server

        cluster.run(listen_again())
        count = _write_round(client, n, "b")
        deadline = time.monotonic() + 30
        while True:
            try:
                resumed = side.watch(resume_after=seen[-1]["_id"], max_await_time_ms=100)
                got = [resumed.next() for _ in range(count)]
                break
            except pymongo.errors.OperationFailure:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with resumed, client.watch(resume_after=seen[-1]["_id"]) as direct:
            expected = [direct.next() for _ in range(count)]
        assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]


def _serve_cluster(data_dir: pathlib.Path) -> tuple[subprocess.Popen, str]:
    """A durable 2-shard cluster on any free port, and its URI."""
    proc = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "cdcserver"), "serve", "--data-dir",
         str(data_dir), "--shards", "2", "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    port = serving_port(proc.stdout)  # type: ignore[arg-type]
    return proc, f"mongodb://127.0.0.1:{port}/"


def test_a_cross_shard_commit_cut_by_a_crash_is_finished_at_restart(tmp_path):
    """The coordinator's decision is durable before the participants commit: a process that
    dies after the first participant committed finishes the second at its next start, at the
    same commit time (mongod's coordinator recovery)."""
    from cdcserver.commands.failpoints import CRASH_AFTER_FIRST_PARTICIPANT_COMMIT

    proc, uri = _serve_cluster(tmp_path)
    try:
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=2000) as c:
            c.admin.command("configureFailPoint", CRASH_AFTER_FIRST_PARTICIPANT_COMMIT,
                            mode="alwaysOn")
            c.admin.command("shardCollection", "t.c", key={"x": 1})
            c.admin.command("split", "t.c", middle={"x": 100})
            c.admin.command("moveChunk", "t.c", find={"x": 100}, to="shard1")
            start = c.admin.command("ping")["operationTime"]
            with c.start_session() as session:
                session.start_transaction()
                c.t.c.insert_one({"_id": 1, "x": 1}, session=session)
                c.t.c.insert_one({"_id": 2, "x": 150}, session=session)
                with pytest.raises(pymongo.errors.PyMongoError):
                    session.commit_transaction()  # the process ends in the middle of it
        assert proc.wait(timeout=30) == 9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "coordinator.bson").exists()
    proc, uri = _serve_cluster(tmp_path)
    try:
        with pymongo.MongoClient(uri) as c:
            assert sorted(d["_id"] for d in c.t.c.find()) == [1, 2]
            with c.t.c.watch(start_at_operation_time=start, max_await_time_ms=50) as stream:
                events = [stream.next(), stream.next()]
                assert stream.try_next() is None
            assert [e["documentKey"]["_id"] for e in events] == [1, 2]
            assert events[0]["clusterTime"] == events[1]["clusterTime"]
            assert events[0]["txnNumber"] == events[1]["txnNumber"]
            for shard in c.admin.command("listShards")["shards"]:
                name, _, hosts = shard["host"].partition("/")
                with pymongo.MongoClient(f"mongodb://{hosts}/?directConnection=true") as d:
                    commits = list(d.local["oplog.rs"].find({"o.commitTransaction": 1}))
                    assert [e["o"]["commitTimestamp"] for e in commits] == [
                        events[0]["clusterTime"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not (tmp_path / "coordinator.bson").exists()


def test_with_the_balancer_on_an_added_shard_takes_chunks_without_events(cluster, client):
    client.admin.command("shardCollection", "bal.c", key={"x": 1})
    for k in range(1, 6):
        client.admin.command("split", "bal.c", middle={"x": 10 * k})
    client.bal.c.insert_many([{"_id": i, "x": i} for i in range(60)])
    client.admin.command("balancerStart")
    with client.bal.c.watch(max_await_time_ms=50) as stream:
        client.admin.command("addShard", "fresh/127.0.0.1:1")
        chunks = list(client.config.chunks.find({"shard": "fresh"}))
        assert chunks  # its share of the six chunks
        assert stream.try_next() is None  # migrations: no events
        bounds = [(c["min"]["x"], c["max"]["x"]) for c in chunks]
        at = next(hi - 1 if isinstance(hi, int) else lo + 1 for lo, hi in bounds
                  if isinstance(hi, int) or isinstance(lo, int))
        client.bal.c.insert_one({"_id": "new", "x": at})  # lands on the new shard
        assert stream.next()["documentKey"] == {"x": at, "_id": "new"}
    assert client.bal.c.count_documents({}) == 61


class _Requests(pymongo.monitoring.CommandListener):
    """The commands a sidecar's own clients send, by name and server port."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.on = False

    def started(self, event) -> None:
        if self.on:
            key = (event.command_name, event.connection_id[1])
            self.counts[key] = self.counts.get(key, 0) + 1

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass

    def count(self, name: str, port: int) -> int:
        return self.counts.get((name, port), 0)


def test_sidecar_asks_a_bounded_number_of_upstream_requests_per_event(cluster, client,
                                                                       monkeypatch):
    """Per event of a busy shard while the others idle: the busy shard's tail getMore and its
    `hello` (its commit point), one `find` per idle shard (its oplog read at afterClusterTime,
    majority: the shard writes its no-op and answers it, with its commit point, in that one
    reply; its tail, which leaves those no-ops out, is not woken) and at most one read of
    `config.shards` through the mongos, at afterClusterTime too (one answer covers every
    event read while it was asked): 3 + idle shards, getMores included; a burst of events read
    at once takes one round of them."""
    from cdcserver.sharding import sidecar as sidecar_module
    from cdcserver.sharding.testing import ShardedSidecar

    monkeypatch.setattr(sidecar_module, "TOPOLOGY_POLL_S", 3600.0)  # only what events ask
    busy, idle = cluster.cluster.shards[0], cluster.cluster.shards[1:]
    mongos_port = int(cluster.uri.rstrip("/").rsplit(":", 1)[1])
    client.admin.command("enableSharding", "busy", primaryShard=busy.name)
    requests = _Requests()
    events = 20
    # max_await_ms: an idle tail's getMore does not come back empty during the test.
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0, max_await_ms=60_000,
                        client_options={"event_listeners": [requests]}) as side, \
            pymongo.MongoClient(side.uri) as reader, \
            reader.busy.c.watch(max_await_time_ms=5000) as stream:
        client.busy.c.insert_one({"_id": "warm"})
        assert stream.next()["documentKey"] == {"_id": "warm"}
        requests.on = True
        for i in range(events):
            client.busy.c.insert_one({"_id": i})
            assert stream.next()["documentKey"] == {"_id": i}
        requests.on = False
        slack = 2  # the warm event's last requests, the last event's trailing ones
        assert requests.count("getMore", busy.port) <= events + slack
        assert requests.count("hello", busy.port) <= events + slack
        assert requests.count("find", mongos_port) <= events + slack
        assert requests.count("listShards", mongos_port) == 0
        assert requests.count("find", busy.port) == 0
        for shard in idle:
            assert 1 <= requests.count("find", shard.port) <= events + slack
            assert requests.count("getMore", shard.port) <= slack  # not woken by the no-ops
            assert requests.count("hello", shard.port) <= slack
            assert requests.count("appendOplogNote", shard.port) == 0
        total = sum(requests.counts.values())
        assert total <= (3 + len(idle)) * events + 2 * slack

        # A burst written at once: read in a batch or a few, idle shards read once per batch.
        before = {s.name: requests.count("find", s.port) for s in idle}
        requests.on = True
        client.busy.c.insert_many([{"_id": f"b{i}"} for i in range(100)])
        got = [stream.next()["documentKey"]["_id"] for _ in range(100)]
        requests.on = False
        assert got == [f"b{i}" for i in range(100)]
        for shard in idle:
            assert requests.count("find", shard.port) - before[shard.name] <= 4


def test_front_get_more_without_batch_size_returns_what_is_ready(cluster, client):
    """mongos, like a shard, has no default getMore batch size (only the aggregate's 101): a
    backlog spread over the shards comes back in one getMore, in order; a batchSize still
    caps the batch."""
    db = client.gm
    _spread(client, cluster, "gm.c")
    opened = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}],
                        cursor={"batchSize": 0})
    cursor_id = opened["cursor"]["id"]
    n = 300
    db.c.insert_many([{"_id": i, "x": i} for i in range(n)])  # every shard's chunk
    seen: list[int] = []
    tokens: list[str] = []
    sizes: list[int] = []
    for extra in ({"batchSize": 120}, {}, {}, {}, {}):
        if len(seen) == n:
            break
        more = db.command("getMore", cursor_id, collection="c", maxTimeMS=2000, **extra)
        batch = more["cursor"]["nextBatch"]
        assert batch, "an empty getMore with events still to come"
        sizes.append(len(batch))
        seen += [e["documentKey"]["_id"] for e in batch]
        tokens += [e["_id"]["_data"] for e in batch]
    assert sizes[0] == 120  # batchSize still caps a getMore
    assert sorted(seen) == list(range(n))  # none lost or repeated
    assert tokens == sorted(tokens)  # in cluster-time order
    assert max(sizes[1:]) > 101  # without batchSize: more than the aggregate's default


def test_sidecar_forwarded_cursors_live_in_its_registry(cluster, client, sidecar):
    """A find through the sidecar is the mongos's cursor: its getMores go there, it is listed
    in the sidecar's one cursor registry as a forwarded cursor, and a killCursors naming it
    with one of the sidecar's own change streams kills each where it lives."""
    from cdcserver.cursors import CHANGE_STREAM, FORWARDED, kind_of

    client.fw.c.insert_many([{"_id": i} for i in range(10)])
    with pymongo.MongoClient(sidecar.uri) as side:
        db = side.fw
        found = db.command("find", "c", batchSize=3, sort={"_id": 1})
        cursor_id = found["cursor"]["id"]
        assert cursor_id
        kinds = {cid: kind_of(c) for cid, c in sidecar.state.cursors.open.items()}
        assert kinds == {cursor_id: FORWARDED}
        more = db.command("getMore", cursor_id, collection="c", batchSize=3)
        ids = [d["_id"] for d in found["cursor"]["firstBatch"] + more["cursor"]["nextBatch"]]
        assert ids == list(range(6))
        stream = db.command("aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={})
        stream_id = stream["cursor"]["id"]
        assert kind_of(sidecar.state.cursors.open[stream_id]) == CHANGE_STREAM
        killed = db.command("killCursors", "c", cursors=[stream_id, cursor_id])
        assert sorted(killed["cursorsKilled"]) == sorted([stream_id, cursor_id])
        assert sidecar.state.cursors.open == {}
        with pytest.raises(pymongo.errors.OperationFailure) as info:  # gone on the mongos too
            db.command("getMore", cursor_id, collection="c")
        assert info.value.code == 43


def test_a_shard_reads_after_cluster_time_as_a_shard_server(cluster, client):
    """readConcern afterClusterTime on a shard (mongod's waitForReadConcern, shardsvr): a time
    past the shard's last entry makes it write a no-op first, which the read then sees, so the
    reply holds every entry up to that time; one past the cluster time is 72; a time the
    oplog has reached writes nothing."""
    busy = cluster.cluster.shards[0]
    client.admin.command("enableSharding", "rc", primaryShard=busy.name)
    written = client.rc.c.insert_one({"_id": 1})
    assert written.acknowledged
    with pymongo.MongoClient(cluster.shard_uris[0]) as b, \
            pymongo.MongoClient(cluster.shard_uris[1]) as d:
        at = b.local["oplog.rs"].find_one({"ns": "rc.c"})["ts"]
        last = d.local["oplog.rs"].find_one(sort=[("$natural", -1)])["ts"]
        assert last < at  # the idle shard's oplog is behind the busy shard's write
        reply = d.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": last}},
                                 "readConcern": {"level": "majority", "afterClusterTime": at}})
        entries = reply["cursor"]["firstBatch"]
        assert [(e["op"], e["ns"], e["o"]) for e in entries] == [
            ("n", "", AFTER_CLUSTER_TIME_NOOP)]
        assert entries[0]["ts"] > at and reply["operationTime"] >= entries[0]["ts"]
        # Reached already: no second no-op.
        again = d.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": last}},
                                 "readConcern": {"level": "majority", "afterClusterTime": at}})
        assert again["cursor"]["firstBatch"] == entries
        future = Timestamp(at.time + 3600, 1)
        with pytest.raises(OperationFailure) as err:
            d.local.command({"find": "oplog.rs",
                             "readConcern": {"level": "majority", "afterClusterTime": future}})
        assert err.value.code == 72
        assert err.value.details["errmsg"].startswith(
            "readConcern afterClusterTime value must not be greater than the current "
            f"clusterTime. Requested clusterTime: {{ ts: Timestamp({future.time}, 1) }}; ")
