"""Data moves of the embedded sharded cluster under SIGKILL (`serve --shards 2 --data-dir D`).

A thread runs one kind of move over and over (moveChunk back and forth, reshardCollection
between two keys, movePrimary between the shards, a balancer round after a shard was added,
removeShard's draining) while the process is killed at a random moment; after each restart on
D every document exists exactly once (a broadcast find, and each shard's own port counted
against the catalog), the next move of that kind works, and the change stream from before the
first write has each insert once and nothing from the moves (migrations are fromMigrate).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient, errors

from cdcserver.testing import SubprocessServer

KILLS = 25  # per kind of move
DOCS = 600
HANG_GUARD_S = 60.0  # a guard against hanging, never a performance expectation


def _client(server: SubprocessServer) -> MongoClient:
    return MongoClient(server.uri, serverSelectionTimeoutMS=5000, retryWrites=False)


def _admin(client: MongoClient, cmd: dict) -> dict:
    return client.admin.command(cmd)


class Mover(threading.Thread):
    """Runs `step(client, k)` for k = 0, 1, 2... until the server dies."""

    def __init__(self, uri: str, step: Callable[[MongoClient, int], None]) -> None:
        super().__init__(daemon=True)
        self.client = MongoClient(uri, serverSelectionTimeoutMS=1000, retryWrites=False)
        self.step = step
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for k in range(1_000_000):
                self.step(self.client, k)
                self.done += 1
        except errors.PyMongoError:
            pass  # the server was killed
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc
        finally:
            self.client.close()


def _populate(client: MongoClient, shard_key: dict | None) -> Timestamp:
    """DOCS documents in crash.docs (sharded on `shard_key`, split in four) and in
    crash.plain (unsharded); returns the cluster time before the first write."""
    start = client.admin.command("ping")["operationTime"]
    _admin(client, {"enableSharding": "crash", "primaryShard": "shard0"})
    if shard_key is not None:
        _admin(client, {"shardCollection": "crash.docs", "key": shard_key})
    docs = [{"_id": i, "k": (i * 7919) % DOCS, "pad": "x" * 32} for i in range(DOCS)]
    client.crash.docs.insert_many(docs)
    client.crash.plain.insert_many([{"_id": i} for i in range(DOCS // 4)])
    if shard_key is not None:
        for at in (DOCS // 4, DOCS // 2, 3 * DOCS // 4):
            _admin(client, {"split": "crash.docs", "middle": {"_id": at}})
    return start


def _check(server: SubprocessServer, start: Timestamp) -> None:
    """Every document once, on the shard that owns it; the stream's inserts once each."""
    with _client(server) as client:
        ids = [d["_id"] for d in client.crash.docs.find({}, {"_id": 1})]
        assert sorted(ids) == list(range(DOCS)), (len(ids), len(set(ids)))
        plain = [d["_id"] for d in client.crash.plain.find({})]
        assert sorted(plain) == list(range(DOCS // 4))
        # Each shard's own port: what it holds, counted against what the catalog gives it.
        chunks = list(client.config.chunks.find({}))
        shards = {s["_id"]: s["host"] for s in client.config.shards.find({})}
        held = 0
        for host in shards.values():
            address = host.split("/", 1)[1]
            with MongoClient(f"mongodb://{address}/?directConnection=true",
                             serverSelectionTimeoutMS=5000) as direct:
                held += direct.crash.docs.count_documents({})
        assert held == DOCS, f"the shards hold {held} documents ({len(chunks)} chunks)"
        inserts: dict[object, int] = {}
        with client.crash.watch(start_at_operation_time=start, max_await_time_ms=50) as stream:
            deadline = time.monotonic() + HANG_GUARD_S
            while sum(inserts.values()) < DOCS + DOCS // 4 and time.monotonic() < deadline:
                event = stream.try_next()
                if event is None:
                    continue
                assert event["operationType"] in ("insert", "create", "createIndexes",
                                                  "shardCollection"), event
                if event["operationType"] == "insert":
                    key = (event["ns"]["coll"], event["documentKey"]["_id"])
                    inserts[key] = inserts.get(key, 0) + 1
            # Drain what else is there: a move's writes must not show.
            for _ in range(5):
                event = stream.try_next()
                assert event is None or event["operationType"] != "insert", event
        assert len(inserts) == DOCS + DOCS // 4 and set(inserts.values()) == {1}


def _move_chunk(client: MongoClient, k: int) -> None:
    chunks = list(client.config.chunks.find({"ns": "crash.docs"}))
    chunk = chunks[k % len(chunks)]
    to = "shard1" if chunk["shard"] == "shard0" else "shard0"
    _admin(client, {"moveChunk": "crash.docs", "bounds": [chunk["min"], chunk["max"]], "to": to})


def _reshard(client: MongoClient, k: int) -> None:
    key = client.config.collections.find_one({"_id": "crash.docs"})["key"]
    _admin(client, {"reshardCollection": "crash.docs",
                    "key": {"k": 1} if "_id" in key else {"_id": 1}})


def _move_primary(client: MongoClient, k: int) -> None:
    primary = client.config.databases.find_one({"_id": "crash"})["primary"]
    _admin(client, {"movePrimary": "crash", "to": "shard1" if primary == "shard0" else "shard0"})


def _kill_loop(tmp_path, step: Callable[[MongoClient, int], None], shard_key: dict | None,
               rng: random.Random) -> None:
    data = tmp_path / "data"
    server = SubprocessServer(data_dir=data, extra_args=["--shards", "2"])
    try:
        with _client(server) as client:
            start = _populate(client, shard_key)
        for kill in range(KILLS):
            mover = Mover(server.uri, step)
            mover.start()
            time.sleep(rng.uniform(0.02, 0.4))
            server.kill()
            mover.join(HANG_GUARD_S)
            assert mover.error is None, mover.error
            server.stop()
            server = SubprocessServer(data_dir=data, extra_args=["--shards", "2"])
            _check(server, start)
            with _client(server) as client:
                step(client, kill)  # the next move works
    finally:
        server.stop()
    with SubprocessServer(data_dir=data, extra_args=["--shards", "2"]) as last:
        _check(last, start)


@pytest.mark.parametrize("kind", ["moveChunk", "reshardCollection", "movePrimary"])
def test_killed_during_data_moves_loses_and_doubles_nothing(tmp_path, kind: str) -> None:
    step, key = {
        "moveChunk": (_move_chunk, {"_id": 1}),
        "reshardCollection": (_reshard, {"_id": 1}),
        "movePrimary": (_move_primary, None),
    }[kind]
    _kill_loop(tmp_path, step, key, random.Random(kind))
