"""Zones through the embedded cluster's front, as mongos and the config server of 8.0 keep
them: addShardToZone / removeShardFromZone (config.shards `tags`), updateZoneKeyRange
(config.tags), their errors (ShardNotFound, ZoneNotFound, ZoneStillInUse,
RangeOverlapConflict, ShardKeyNotFound), shardCollection of an empty collection laid out by
zone, and a balancer round that moves chunks into their zones."""

from __future__ import annotations

import pymongo
import pytest
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer


@pytest.fixture
def cluster():
    with ShardedServer(3) as server:
        yield server


@pytest.fixture
def client(cluster):
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def _error(call) -> tuple[int, str, str]:
    with pytest.raises(OperationFailure) as err:
        call()
    details = err.value.details or {}
    return err.value.code, str(details.get("codeName")), str(details.get("errmsg"))


def _shard(client: pymongo.MongoClient, name: str) -> dict:
    return next(s for s in client.admin.command("listShards")["shards"] if s["_id"] == name)


def _zone(client, shard: str, zone: str) -> None:
    client.admin.command({"addShardToZone": shard, "zone": zone})


def _range(client, ns: str, low: dict, high: dict, zone: str | None) -> None:
    client.admin.command({"updateZoneKeyRange": ns, "min": low, "max": high, "zone": zone})


def test_shards_join_and_leave_zones(client):
    _zone(client, "shard1", "EU")
    _zone(client, "shard1", "EU")  # $addToSet: once
    _zone(client, "shard1", "US")
    assert _shard(client, "shard1")["tags"] == ["EU", "US"]
    assert client.config.shards.find_one({"_id": "shard1"})["tags"] == ["EU", "US"]
    assert "tags" not in _shard(client, "shard0")
    client.admin.command({"removeShardFromZone": "shard1", "zone": "US"})
    client.admin.command({"removeShardFromZone": "shard1", "zone": "nowhere"})  # no-op
    assert _shard(client, "shard1")["tags"] == ["EU"]
    code, name, message = _error(lambda: _zone(client, "shard9", "EU"))
    assert (code, name, message) == (70, "ShardNotFound", "shard shard9 does not exist")
    # The config server finds the shard by its _id alone (ShardingCatalogManager).
    code, _, _ = _error(lambda: _zone(client, _shard(client, "shard0")["host"], "EU"))
    assert code == 70
    code, _, _ = _error(lambda: client.admin.command(
        {"removeShardFromZone": "shard9", "zone": "EU"}))
    assert code == 70
    code, _, message = _error(lambda: client.admin.command({"addShardToZone": "shard0"}))
    assert (code, message) == (40414, "BSON field 'addShardToZone.zone' is missing but a "
                                      "required field")
    code, _, _ = _error(lambda: client.test.command({"addShardToZone": "shard0", "zone": "x"}))
    assert code == 13


def test_zone_key_ranges_are_config_tags(client):
    client.admin.command("shardCollection", "z.c", key={"x": 1, "y": 1})
    code, name, message = _error(lambda: _range(client, "z.c", {"x": 0}, {"x": 10}, "EU"))
    assert (code, name, message) == (177, "ZoneNotFound", "zone EU does not exist")
    _zone(client, "shard1", "EU")
    _zone(client, "shard2", "US")
    _range(client, "z.c", {"x": 0}, {"x": 10}, "EU")
    _range(client, "z.c", {"x": 0}, {"x": 10}, "EU")  # the same range again: fine
    tags = list(client.config.tags.find({"ns": "z.c"}))
    assert [{k: v for k, v in t.items() if k != "_id"} for t in tags] == [
        {"ns": "z.c", "min": {"x": 0, "y": MinKey()}, "max": {"x": 10, "y": MinKey()},
         "tag": "EU"}]  # extended to the whole shard key
    code, name, message = _error(lambda: _range(client, "z.c", {"x": 5}, {"x": 20}, "US"))
    assert (code, name) == (178, "RangeOverlapConflict")
    assert message.startswith("Zone range: { x: 5, y: MinKey } -->> { x: 20, y: MinKey }  on  "
                              "US is overlapping with existing: { x: 0, y: MinKey } -->> ")
    code, name, message = _error(lambda: _range(client, "z.c", {"y": 5}, {"y": 20}, "US"))
    assert (code, name) == (61, "ShardKeyNotFound")
    assert message == ("min: { y: 5 } is not a prefix of the shard key { x: 1, y: 1 } of "
                       "ns: z.c")
    code, _, message = _error(lambda: _range(client, "z.c", {"x": 20}, {"x": 10}, "US"))
    assert (code, message) == (9, "min: { x: 20 } should be less than max: { x: 10 }")
    code, _, _ = _error(lambda: _range(client, "z.c", {"x": 20}, {"x": 30}, 5))
    assert code == 14
    # A zone whose only shard has a range cannot lose it.
    code, name, message = _error(lambda: client.admin.command(
        {"removeShardFromZone": "shard1", "zone": "EU"}))
    assert (code, name, message) == (163, "ZoneStillInUse", "cannot remove a shard from zone "
                                     "if a chunk range is associated with it")
    _range(client, "z.c", {"x": 0}, {"x": 10}, None)  # zone: null removes it
    assert list(client.config.tags.find({"ns": "z.c"})) == []
    client.admin.command({"removeShardFromZone": "shard1", "zone": "EU"})
    # A range of an unsharded namespace is kept as given.
    _range(client, "z.unsharded", {"a": 1}, {"a": 5}, "US")
    tag = client.config.tags.find_one({"ns": "z.unsharded"})
    assert (tag["min"], tag["max"], tag["tag"]) == ({"a": 1}, {"a": 5}, "US")


def test_shard_collection_of_an_empty_collection_lays_chunks_out_by_zone(client):
    _zone(client, "shard1", "EU")
    _zone(client, "shard2", "US")
    _range(client, "z.c", {"x": 0}, {"x": 10}, "EU")
    _range(client, "z.c", {"x": 20}, {"x": 30}, "US")
    client.admin.command("enableSharding", "z", primaryShard="shard0")
    client.admin.command("shardCollection", "z.c", key={"x": 1})
    chunks = [(c["min"]["x"], c["max"]["x"], c["shard"])
              for c in client.config.chunks.find({"uuid": client.config.collections.find_one(
                  {"_id": "z.c"})["uuid"]})]
    assert [(lo, hi) for lo, hi, _ in chunks] == [
        (MinKey(), 0), (0, 10), (10, 20), (20, 30), (30, MaxKey())]
    assert chunks[1][2] == "shard1" and chunks[3][2] == "shard2"
    # The gaps are spread over every shard: each shard has at least one chunk.
    assert {s for _, _, s in chunks} == {"shard0", "shard1", "shard2"}
    client.z.c.insert_many([{"x": x} for x in (-5, 5, 15, 25, 35)])
    holders = {}
    for uri, name in zip(ShardedServerUris.of(client), ["shard0", "shard1", "shard2"],
                         strict=True):
        with pymongo.MongoClient(uri) as direct:
            holders[name] = sorted(d["x"] for d in direct.z.c.find({}))
    assert 5 in holders["shard1"] and 25 in holders["shard2"]


class ShardedServerUris:
    @staticmethod
    def of(client: pymongo.MongoClient) -> list[str]:
        return [f"mongodb://{s['host'].split('/', 1)[1]}/?directConnection=true"
                for s in client.admin.command("listShards")["shards"]]


def test_zone_ranges_not_of_the_new_key_refuse_shard_collection(client):
    _zone(client, "shard1", "EU")
    _range(client, "z.c", {"x": 0}, {"x": 10}, "EU")
    client.admin.command("enableSharding", "z", primaryShard="shard0")
    client.admin.command("shardCollection", "z.other", key={"x": 1})  # no ranges: fine
    code, name, _ = _error(lambda: client.admin.command("shardCollection", "z.c",
                                                         key={"y": 1}))
    assert (code, name) == (72, "InvalidOptions")  # the range is not of the key's fields


def test_a_balancer_round_moves_chunks_into_their_zones(client):
    client.admin.command("enableSharding", "z", primaryShard="shard0")
    client.admin.command("shardCollection", "z.c", key={"x": 1})
    client.z.c.insert_many([{"_id": x, "x": x} for x in range(100)])
    _zone(client, "shard2", "HOT")
    _range(client, "z.c", {"x": 50}, {"x": 60}, "HOT")  # balancer off: nothing moves yet
    uuid = client.config.collections.find_one({"_id": "z.c"})["uuid"]
    assert {c["shard"] for c in client.config.chunks.find({"uuid": uuid})} == {"shard0"}
    with client.z.c.watch(max_await_time_ms=50) as stream:
        client.admin.command("balancerStart")
        chunks = list(client.config.chunks.find({"uuid": uuid}))
        hot = [c for c in chunks if c["min"]["x"] == 50]
        assert len(hot) == 1 and hot[0]["max"]["x"] == 60 and hot[0]["shard"] == "shard2"
        # The chunks in no zone may be on any shard: evened out.
        others = [c["shard"] for c in chunks if c["min"]["x"] != 50]
        counts = {n: others.count(n) for n in ("shard0", "shard1", "shard2")}
        assert max(counts.values()) - min(counts.values()) <= 1
        assert stream.try_next() is None  # migrations: no events
    assert client.z.c.count_documents({}) == 100
    with pymongo.MongoClient(ShardedServerUris.of(client)[2]) as shard2:
        assert sorted(d["x"] for d in shard2.z.c.find({"x": {"$gte": 50, "$lt": 60}})) == \
            list(range(50, 60))
    # Zones outlive a restart of the catalog (config.bson): checked by the crash test.


def test_the_only_shard_of_a_zone_with_ranges_cannot_be_removed(client):
    _zone(client, "shard2", "HOT")
    _range(client, "z.c", {"x": 0}, {"x": 10}, "HOT")
    code, name, message = _error(lambda: client.admin.command("removeShard", "shard2"))
    assert (code, name, message) == (
        163, "ZoneStillInUse", "Operation not allowed because it would remove the only shard "
        "for zone HOT which has a chunk range is associated with it")
    assert "draining" not in _shard(client, "shard2")
    _zone(client, "shard1", "HOT")  # another shard in the zone: allowed
    assert client.admin.command("removeShard", "shard2")["state"] == "started"
