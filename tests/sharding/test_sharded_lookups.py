"""`fullDocument: "updateLookup"` through the front, routed as mongos routes it
(`MongosProcessInterface::lookupSingleDocument`): the document is looked up on the shard that
owns it now, not the one that wrote the event; a documentKey without the shard key is looked
up on every shard holding the collection, and two matches are 280 ChangeStreamFatalError."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer

HANG_GUARD = 200  # try_next rounds (50 ms each): a guard, never a performance expectation


@pytest.fixture
def cluster():
    with ShardedServer(2) as server:
        yield server


def _first_update(stream) -> dict:
    for _ in range(HANG_GUARD):
        event = stream.try_next()
        if event is not None and event["operationType"] == "update":
            return event
    raise AssertionError("no update event")


def test_lookup_follows_the_document_to_the_shard_it_moved_to(cluster):
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "shop", primaryShard="shard0")
        client.admin.command("shardCollection", "shop.orders", key={"_id": 1})
        client.shop.orders.insert_one({"_id": 5, "n": 0})
        start = client.admin.command("ping")["operationTime"]
        client.shop.orders.update_one({"_id": 5}, {"$set": {"n": 1}})  # written by shard0
        client.admin.command("moveChunk", "shop.orders", find={"_id": 5}, to="shard1")
        with client.shop.orders.watch(full_document="updateLookup",
                                      start_at_operation_time=start,
                                      max_await_time_ms=50) as stream:
            event = _first_update(stream)
    assert event["documentKey"] == {"_id": 5}
    assert event["fullDocument"] == {"_id": 5, "n": 1}


def test_lookup_of_a_key_on_two_shards_is_280(cluster):
    with pymongo.MongoClient(cluster.uri) as client:
        client.admin.command("enableSharding", "shop", primaryShard="shard0")
        client.shop.items.insert_one({"_id": 1, "k": 1})
        start = client.admin.command("ping")["operationTime"]
        # Written while unsharded: its documentKey is {_id: 1}, without the later shard key.
        client.shop.items.update_one({"_id": 1}, {"$set": {"v": 1}})
        client.shop.items.create_index({"k": 1})
        client.admin.command("shardCollection", "shop.items", key={"k": 1})
        client.admin.command("split", "shop.items", middle={"k": 50})
        client.admin.command("moveChunk", "shop.items", find={"k": 50}, to="shard1")
        client.shop.items.insert_one({"_id": 1, "k": 100})  # the same _id, on shard1
        with pytest.raises(OperationFailure) as excinfo, \
                client.shop.items.watch(full_document="updateLookup",
                                        start_at_operation_time=start,
                                        max_await_time_ms=50) as stream:
            _first_update(stream)  # (the aggregate's first batch may already raise)
    assert excinfo.value.code == 280
    assert excinfo.value.details["errmsg"].startswith(
        "found more than one document matching {_id: 1} [")
