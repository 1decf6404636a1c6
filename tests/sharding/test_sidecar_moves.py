"""A sidecar (`serve --upstream <mongos>`) of a cluster whose shards come back on other hosts
or ports: it follows the shard list and its streams go on, every event once, in order."""

from __future__ import annotations

import time

import bson
import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer, ShardedSidecar


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


def _write_round(client: pymongo.MongoClient, n: int, tag: str) -> int:
    """One insert on every shard, then one on the idle database's primary: n + 1 events."""
    for k in range(n):
        client.app.c.insert_one({"_id": f"{tag}{k}", "x": 100 * k + 1})
    client.idle.c.insert_one({"_id": tag})
    return n + 1


def _hosts(client: pymongo.MongoClient) -> dict[str, str]:
    return {s["_id"]: s["host"] for s in client.admin.command("listShards")["shards"]}


def _move_shards(cluster: ShardedServer, while_down=None) -> None:
    """Every shard's listener closes (its connections drop); `while_down()` runs; then each
    listens again on another port, which the shard list gives from then on."""
    from cdcserver.server import Server

    shards = cluster.cluster.shards
    old = {s.name: s.port for s in shards}
    for shard in shards:
        cluster.run(shard.server.close())
    if while_down is not None:
        while_down()

    async def listen(shard) -> None:
        while True:
            server = Server(shard.state, ssl_context=cluster.cluster.ssl_context)
            port = await server.start(shard.host, 0)
            if port != old[shard.name]:
                break
            await server.close()  # the same port again: take another
        shard.server, shard.port = server, port
        cluster.cluster.catalog.shard_hosts[shard.name] = shard.host_string

    for shard in shards:
        cluster.run(listen(shard))


def test_sidecar_streams_go_on_when_every_shard_comes_back_on_a_new_port(cluster, client):
    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    n = len(cluster.cluster.shards)
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0) as side_server, pymongo.MongoClient(
        side_server.uri
    ) as side, client.watch() as front, side.watch(max_await_time_ms=200) as through:
        # A shard lost this long fails the streams (6): what the sidecar must not come to.
        side_server.upstream.down_grace_s = 3.0
        count = _write_round(client, n, "a")
        got = [through.next() for _ in range(count)]
        before = _hosts(client)
        _move_shards(cluster, lambda: _write_round(client, n, "b"))
        after = _hosts(client)
        assert before.keys() == after.keys()
        assert all(after[name] != before[name] for name in before)
        count += (n + 1) + _write_round(client, n, "c")
        expected = [front.next() for _ in range(count)]
        got += [through.next() for _ in range(count - len(got))]
        assert through.try_next() is None
        # The sidecar tails each shard at its new host.
        tails = [s.log for s in side_server.upstream.shards]
        assert [t.moves for t in tails] == [1] * n
        assert all(f":{s.port}/" in t.options.uri for s, t in zip(cluster.cluster.shards, tails))
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]


def test_sidecar_streams_go_on_when_the_mongos_and_its_shards_restart_on_new_ports(
    cluster, client
):
    """The whole cluster goes away (the mongos comes back where it was, the shards elsewhere):
    a stream on the sidecar may get a resumable error meanwhile, which the driver resumes
    through; it delivers every event once."""
    from cdcserver.server import Server

    _spread(client, cluster, "app.c")
    client.admin.command("enableSharding", "idle", primaryShard=cluster.cluster.shards[0].name)
    n = len(cluster.cluster.shards)
    quick = {"serverSelectionTimeoutMS": 500, "heartbeatFrequencyMS": 500}
    with ShardedSidecar(cluster.uri, majority_poll_ms=1.0, client_options=quick
                        ) as side_server, pymongo.MongoClient(side_server.uri) as side, \
            client.watch() as front, side.watch(max_await_time_ms=100) as through:
        side_server.upstream.topology_poll_s = 0.05
        count = _write_round(client, n, "a")
        got = [through.next() for _ in range(count)]
        before = _hosts(client)
        mongos = cluster.server
        cluster.run(mongos.close())

        def while_down() -> None:
            deadline = time.monotonic() + 1.0  # the sidecar finds nothing to reach meanwhile
            while time.monotonic() < deadline:
                assert through.try_next() is None

        _move_shards(cluster, while_down)

        async def listen_again() -> None:
            server = Server(mongos.state)
            await server.start("127.0.0.1", cluster.port)
            cluster.server = server

        cluster.run(listen_again())
        after = _hosts(client)
        assert all(after[name] != before[name] for name in before)
        count += _write_round(client, n, "b")
        expected = [front.next() for _ in range(count)]
        got += [through.next() for _ in range(count - len(got))]
        assert through.try_next() is None
    assert [bson.encode(e) for e in got] == [bson.encode(e) for e in expected]
