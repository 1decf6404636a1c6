"""The front's commands whose routing is a policy (`sharding/router/routing.py` `POLICIES`):
where each goes and how the shards' replies combine, through pymongo."""

from __future__ import annotations

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer


@pytest.fixture(scope="module")
def cluster():
    with ShardedServer(3) as server:
        yield server


@pytest.fixture(scope="module")
def client(cluster):
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def test_list_databases_names_each_database_of_every_shard_once(cluster, client):
    names = [s.name for s in cluster.cluster.shards]
    for k, name in enumerate(names):  # one database per primary shard
        client.admin.command("enableSharding", f"pol{k}", primaryShard=name)
        client[f"pol{k}"].c.insert_one({"_id": k})
    client.admin.command("shardCollection", "pol0.s", key={"_id": 1})
    client.admin.command("split", "pol0.s", middle={"_id": 10})
    client.admin.command("moveChunk", "pol0.s", find={"_id": 10}, to=names[1])
    client.pol0.s.insert_many([{"_id": 1}, {"_id": 11}])  # pol0 on two shards now

    reply = client.admin.command("listDatabases")
    listed = [d["name"] for d in reply["databases"]]
    assert [n for n in listed if n.startswith("pol")] == ["pol0", "pol1", "pol2"]
    assert listed == sorted(set(listed))
    assert reply["totalSize"] == 0 and reply["totalSizeMb"] == 0
    name_only = client.admin.command("listDatabases", nameOnly=True)
    assert "totalSize" not in name_only
    assert [d["name"] for d in name_only["databases"]] == listed


def test_count_and_distinct_sharded_and_not(cluster, client):
    names = [s.name for s in cluster.cluster.shards]
    client.admin.command("enableSharding", "polc", primaryShard=names[2])
    client.polc.plain.insert_many([{"_id": i, "g": i % 4} for i in range(9)])
    client.admin.command("shardCollection", "polc.s", key={"x": 1})
    for k in range(1, len(names)):
        client.admin.command("split", "polc.s", middle={"x": 100 * k})
        client.admin.command("moveChunk", "polc.s", find={"x": 100 * k}, to=names[k])
    client.polc.s.insert_many([{"x": x, "g": x % 7} for x in range(0, 300, 5)])

    assert client.polc.command("count", "plain")["n"] == 9
    assert client.polc.command("count", "plain", query={"g": 1})["n"] == 2
    assert client.polc.command("count", "s")["n"] == 60
    assert client.polc.command("count", "s", query={"x": {"$gte": 150}})["n"] == 30
    assert client.polc.plain.distinct("g") == [0, 1, 2, 3]
    assert client.polc.s.distinct("g") == list(range(7))
    assert client.polc.s.distinct("x", {"x": {"$lt": 20}}) == [0, 5, 10, 15]


def test_kill_sessions_aborts_a_transaction_on_every_shard_it_reached(cluster, client):
    names = [s.name for s in cluster.cluster.shards]
    client.admin.command("enableSharding", "polk", primaryShard=names[0])
    client.admin.command("shardCollection", "polk.s", key={"_id": 1})
    client.admin.command("split", "polk.s", middle={"_id": 10})
    client.admin.command("moveChunk", "polk.s", find={"_id": 10}, to=names[1])
    client.polk.s.insert_many([{"_id": 1}, {"_id": 11}])
    with client.start_session() as session:
        session.start_transaction()
        client.polk.s.update_one({"_id": 1}, {"$set": {"t": 1}}, session=session)
        client.polk.s.update_one({"_id": 11}, {"$set": {"t": 1}}, session=session)
        assert client.admin.command("killSessions", [session.session_id])["ok"] == 1
        with pytest.raises(pymongo.errors.OperationFailure) as failed:
            session.commit_transaction()
        assert failed.value.code == 251  # NoSuchTransaction: every participant aborted
    assert list(client.polk.s.find({}, sort=[("_id", 1)])) == [{"_id": 1}, {"_id": 11}]
    assert client.admin.command("refreshSessions", [])["ok"] == 1
    assert client.admin.command("endSessions", [])["ok"] == 1
