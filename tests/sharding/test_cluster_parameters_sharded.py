"""Cluster parameters through the sharded front (`serve --shards N`), as mongos 8.0 answers
them: setClusterParameter reaches every shard with one clusterParameterTime (the config
server's `_shardsvrSetClusterParameter`), getClusterParameter answers the cluster's value, the
errors are a replica set's, a shard's own port refuses to set one (238), and each shard's
pre-image remover applies `expireAfterSeconds`."""

from __future__ import annotations

import datetime

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer

OFF = {"_id": "changeStreamOptions", "clusterParameterTime": Timestamp(0, 0),
       "preAndPostImages": {"expireAfterSeconds": "off"}}


def _set(client: pymongo.MongoClient, expire: object) -> dict:
    return client.admin.command(
        "setClusterParameter", {"changeStreamOptions": {"preAndPostImages": {
            "expireAfterSeconds": expire}}})


def _get(client: pymongo.MongoClient, arg: object = "changeStreamOptions") -> list[dict]:
    return client.admin.command("getClusterParameter", arg)["clusterParameters"]


@pytest.fixture
def cluster():
    with ShardedServer(shards=2) as s:
        yield s


@pytest.fixture
def front(cluster):
    with pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=5000) as c:
        yield c


def _shards(cluster: ShardedServer) -> list[pymongo.MongoClient]:
    return [pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) for uri in cluster.shard_uris]


def test_set_through_the_front_reaches_every_shard_with_one_time(cluster, front):
    assert _get(front, "*") == [OFF]
    _set(front, 90)
    (param,) = _get(front)
    assert param["preAndPostImages"] == {"expireAfterSeconds": 90}
    assert param["clusterParameterTime"] > Timestamp(0, 0)
    shards = _shards(cluster)
    try:
        for shard in shards:
            assert _get(shard, ["changeStreamOptions"]) == [param]
            assert list(shard.config.clusterParameters.find()) == [{
                "_id": "changeStreamOptions",
                "clusterParameterTime": param["clusterParameterTime"],
                "preAndPostImages": {"expireAfterSeconds": 90}}]
    finally:
        for shard in shards:
            shard.close()
    _set(front, "off")
    assert _get(front)[0]["preAndPostImages"] == {"expireAfterSeconds": "off"}


@pytest.mark.parametrize(("arg", "code", "message"), [
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": 0}}}, 2,
     "Numeric value of 'expireAfterSeconds' should be positive"),
    ({"nonexistentParam": {"intData": 5}}, 4, "Unknown server parameter: nonexistentParam"),
    ({}, 4, "No cluster parameter provided"),
])
def test_the_front_refuses_what_a_replica_set_refuses_and_sets_nothing(cluster, front, arg,
                                                                       code, message):
    with pytest.raises(OperationFailure) as excinfo:
        front.admin.command("setClusterParameter", arg)
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (code, message)
    shards = _shards(cluster)
    try:
        assert [_get(s) for s in shards] == [[OFF], [OFF]]
    finally:
        for shard in shards:
            shard.close()


def test_get_errors_and_admin_only_through_the_front(front):
    with pytest.raises(OperationFailure) as excinfo:
        front.admin.command("getClusterParameter", ["nonexistentParam"])
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (
        4, "Unknown server parameter: nonexistentParam")
    for name, arg in [("setClusterParameter", {"changeStreamOptions": {}}),
                      ("getClusterParameter", "*")]:
        with pytest.raises(OperationFailure) as excinfo:
            front.shop.command(name, arg)
        assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (
            13, f"{name} may only be run against the admin database.")


def test_a_shard_port_refuses_to_set_a_parameter(cluster, front):
    shards = _shards(cluster)
    try:
        for shard in shards:
            with pytest.raises(OperationFailure) as excinfo:
                _set(shard, 30)
            assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (
                238, "setClusterParameter can only run on mongos in sharded clusters")
            # The command's own checks come first, as on a --shardsvr mongod.
            with pytest.raises(OperationFailure) as excinfo:
                shard.admin.command("setClusterParameter", {})
            assert excinfo.value.code == 4
        assert _get(front) == [OFF]
    finally:
        for shard in shards:
            shard.close()


def test_each_shard_expires_its_pre_images(cluster, front):
    db = front.shop
    db.create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    db.orders.insert_one({"_id": 1, "n": 0})
    db.orders.update_one({"_id": 1}, {"$set": {"n": 1}})
    _set(front, 60)
    stores = [shard.store for shard in cluster.cluster.shards]
    held = [cluster.call(store.pre_image_documents) for store in stores]
    assert sum(len(docs) for docs in held) == 1
    newest = max(d["operationTime"] for docs in held for d in docs)
    later = newest + datetime.timedelta(seconds=60)
    assert sum(cluster.call(store.remove_expired_pre_images, later) for store in stores) == 1
    assert all(cluster.call(store.pre_image_documents) == [] for store in stores)


def test_the_parameter_survives_a_restart_of_a_durable_cluster(tmp_path):
    with ShardedServer(shards=2, data_dir=tmp_path / "data") as cluster, \
            pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=5000) as front:
        _set(front, 600)
        (before,) = _get(front)
    with ShardedServer(shards=2, data_dir=tmp_path / "data") as cluster, \
            pymongo.MongoClient(cluster.uri, serverSelectionTimeoutMS=5000) as front:
        assert _get(front) == [before]
        shards = _shards(cluster)
        try:
            assert [_get(s) for s in shards] == [[before], [before]]
        finally:
            for shard in shards:
                shard.close()
