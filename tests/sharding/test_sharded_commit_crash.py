"""`with_transaction` through the front while the cluster process is SIGKILLed and restarted on
the same port (`serve --shards 2 --data-dir D`): pymongo retries a commit whose outcome it did
not learn (UnknownTransactionCommitResult) against the restarted router, which never ran that
transaction and asks the recovery shard named by the commit's `recoveryToken`. Each callback's
writes are applied once or not at all, and every acknowledged one exactly once. Before the
router kept the decision, 2 of 702 transactions were applied twice under 25 kills (the retry
went to the first shard, answered 251 TransientTransactionError, and the callback ran again).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from pymongo import MongoClient, errors

from cdcserver.testing import SubprocessServer

KILLS = 25
HANG_GUARD_S = 120.0  # a guard against hanging, never a performance expectation


class Transactor(threading.Thread):
    """Transaction n inserts {n, x: n + 1} (shard1's chunk) and, for odd n, also
    {n, x: -n - 1} (shard0's: a two-phase commit), each document with a new _id, so a
    callback applied twice leaves n's documents twice; it records which n were
    acknowledged."""

    def __init__(self, uri: str, first: int) -> None:
        super().__init__(daemon=True)
        # Long server selection: the process is down for a restart's time.
        self.client = MongoClient(uri, serverSelectionTimeoutMS=60_000, retryWrites=True)
        self.next = first
        self.acked: set[int] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        coll = self.client.crash.txn
        try:
            while not self.stop.is_set():
                n = self.next
                self.next += 1

                def callback(session: Any, n: int = n) -> None:
                    coll.insert_one({"n": n, "x": n + 1}, session=session)
                    if n % 2:
                        coll.insert_one({"n": n, "x": -n - 1}, session=session)

                with self.client.start_session() as session:
                    session.with_transaction(callback)
                self.acked.add(n)
        except errors.PyMongoError as exc:
            self.error = exc
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc
        finally:
            self.client.close()


def _serve(data: Path, port: int = 0) -> SubprocessServer:
    return SubprocessServer(data_dir=data, extra_args=["--shards", "2", "--port", str(port)])


def test_with_transaction_across_router_crashes_applies_each_callback_once(tmp_path: Path
                                                                          ) -> None:
    rng = random.Random("commit-retry")
    data = tmp_path / "data"
    server = _serve(data)
    port = server.port
    try:
        with MongoClient(server.uri) as client:
            client.admin.command("enableSharding", "crash", primaryShard="shard0")
            client.admin.command("shardCollection", "crash.txn", key={"x": 1})
            client.admin.command("split", "crash.txn", middle={"x": 0})
            client.admin.command("moveChunk", "crash.txn", find={"x": 1}, to="shard1")
        worker = Transactor(server.uri, 0)
        worker.start()
        for _ in range(KILLS):
            seen = worker.next
            deadline = time.monotonic() + HANG_GUARD_S
            while worker.next < seen + 3:  # a few transactions on this process first
                assert worker.is_alive() and time.monotonic() < deadline, worker.error
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.05))
            server.kill()
            server.stop()
            server = _serve(data, port)  # the client's retries reach it on the same port
        worker.stop.set()
        worker.join(HANG_GUARD_S)
        assert not worker.is_alive(), "the transactions did not end"
        assert worker.error is None, worker.error
        with MongoClient(server.uri) as client:
            counts: dict[int, int] = {}
            for doc in client.crash.txn.find({}, {"n": 1}):
                counts[doc["n"]] = counts.get(doc["n"], 0) + 1
    finally:
        server.stop()
    expected = {n: 2 if n % 2 else 1 for n in range(worker.next)}
    doubled = sorted(n for n, c in counts.items() if c > expected[n])
    assert not doubled, f"transactions applied twice: {doubled[:10]}"
    partial = sorted(n for n, c in counts.items() if c != expected[n])
    assert not partial, f"transactions half applied: {partial[:10]}"
    lost = sorted(worker.acked - set(counts))
    assert not lost, f"acknowledged transactions lost: {lost[:10]}"
    assert len(worker.acked) > KILLS
