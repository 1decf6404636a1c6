"""Writes on orphans (documents of a range the shard does not own), as mongod 8.0 logs them
(`write_stage_common.cpp` PreWriteFilter, featureFlagNoChangeStreamEventsDueToOrphans): a
shard's insert of a document of another shard's chunk, its update or delete of one it holds,
are done but logged `fromMigrate: true`, so no change stream shows them; the same writes on
the shard's own documents are a user's. `test.c` is sharded on `_id` with [MinKey, 0) on
shard0 and [0, MaxKey) on shard1, every write sent to shard0's own port."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer

TRIES = 50  # a hang guard: each try_next waits at most its maxAwaitTimeMS


@pytest.fixture
def st() -> Iterator[tuple[pymongo.MongoClient, pymongo.MongoClient, pymongo.MongoClient]]:
    """The front, shard0's own port and shard1's, `test.c` split at 0, [0, MaxKey) moved."""
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as front, \
            pymongo.MongoClient(server.shard_uris[0]) as shard0, \
            pymongo.MongoClient(server.shard_uris[1]) as shard1:
        names = [s.name for s in server.cluster.shards]
        front.admin.command({"enableSharding": "test", "primaryShard": names[0]})
        front.admin.command("shardCollection", "test.c", key={"_id": 1})
        front.admin.command("split", "test.c", middle={"_id": 0})
        front.admin.command("moveChunk", "test.c", find={"_id": 0}, to=names[1])
        yield front, shard0, shard1


def _next(stream: Any) -> dict[str, Any]:
    for _ in range(TRIES):
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError("no event")


def _watch(client: pymongo.MongoClient) -> Any:
    return client.test.c.watch(max_await_time_ms=100)


def _last_entry(shard: pymongo.MongoClient) -> dict[str, Any]:
    return next(shard.local["oplog.rs"].find({"ns": "test.c"}).sort("$natural", -1).limit(1))


@pytest.mark.parametrize("kind", ["insert", "update", "delete"])
def test_an_orphan_write_on_a_shard_has_no_event_an_owned_one_has(st, kind):
    front, shard0, _ = st
    coll = shard0.test.c
    if kind != "insert":  # the orphan (7, in shard1's range) and an owned document (-7)
        coll.insert_many([{"_id": 7, "a": 0}, {"_id": -7, "a": 0}])
    with _watch(front) as stream:
        for _id in (7, -7):
            if kind == "insert":
                coll.insert_one({"_id": _id, "a": 1})
            elif kind == "update":
                coll.update_one({"_id": _id}, {"$set": {"a": 1}})
            else:
                coll.delete_one({"_id": _id})
            if _id == 7:  # the orphan's write is done, logged as a migration's
                entry = _last_entry(shard0)
                assert entry["op"] == kind[0] and entry.get("fromMigrate") is True, entry
                assert entry.get("txnNumber") is not None, entry  # still a retryable write
                found = coll.find_one({"_id": 7})
                if kind == "delete":
                    assert found is None
                else:
                    assert found is not None and found["a"] == 1
        # The first event is the owned document's: the orphan's write (before it) has none.
        event = _next(stream)
        assert (event["operationType"], event["documentKey"]) == (kind, {"_id": -7}), event
    assert "fromMigrate" not in _last_entry(shard0)


def test_a_stream_on_the_shard_has_no_orphan_event_either(st):
    _, shard0, _ = st
    with _watch(shard0) as stream:
        shard0.test.c.insert_one({"_id": 7})
        shard0.test.c.insert_one({"_id": -7})
        event = _next(stream)
        assert event["documentKey"] == {"_id": -7}, event


def test_a_transaction_on_a_shard_shows_only_its_owned_writes(st):
    """change_stream_no_orphans.js's test case 4: one transaction on the shard updating an
    owned document and an orphan: one event; both documents updated."""
    front, shard0, _ = st
    coll = shard0.test.c
    coll.insert_many([{"_id": -2, "age": 20}, {"_id": 6, "age": 60}, {"_id": 9}])
    with _watch(front) as stream:
        with shard0.start_session() as session, session.start_transaction():
            coll.update_one({"_id": -2}, {"$set": {"age": 21}}, session=session)
            coll.update_one({"_id": 6}, {"$set": {"age": 61}}, session=session)
            coll.delete_one({"_id": 9}, session=session)
        event = _next(stream)
        assert (event["operationType"], event["documentKey"]) == ("update", {"_id": -2})
        front.test.c.insert_one({"_id": -100})  # a later event: nothing else came between
        assert _next(stream)["documentKey"] == {"_id": -100}
    assert coll.find_one({"_id": 6})["age"] == 61 and coll.find_one({"_id": 9}) is None
    ops = next(shard0.local["oplog.rs"].find({"o.applyOps": {"$exists": True}})
               .sort("$natural", -1).limit(1))["o"]["applyOps"]
    assert [op.get("fromMigrate") for op in ops] == [None, True, True]


def test_writes_through_the_front_and_unsharded_ones_are_users(st):
    front, shard0, shard1 = st
    with _watch(front) as stream:
        front.test.c.insert_many([{"_id": -1}, {"_id": 1}])  # each on its owner
        assert [_next(stream)["documentKey"]["_id"] for _ in range(2)] == [-1, 1]
    assert "fromMigrate" not in _last_entry(shard1)
    with front.test.u.watch(max_await_time_ms=100) as stream:
        shard0.test.u.insert_one({"_id": 7})  # unsharded, on its database's primary
        assert _next(stream)["documentKey"] == {"_id": 7}
