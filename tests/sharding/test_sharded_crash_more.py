"""More of the embedded sharded cluster under SIGKILL (`serve --shards 2 --data-dir D`), and
reads while chunks move.

- removeShard's draining and a balancer round: a thread cycles a shard through the cluster
  (addShard of a new embedded shard, balancerStart: the round gives it its share of the
  chunks, balancerStop, removeShard until completed: its draining round moves them off). A
  removed shard's name stays taken (its oplog is still read for old tokens), so each cycle
  adds a shard of a new name (shard0002, shard0003...). The process is killed at a random
  moment inside one phase of the cycle: the draining, or the balancer round.
- a cross-shard commit: a thread commits transactions through the front (pymongo's
  `with_transaction`), each inserting one document on each shard's chunk.

After each restart on D: every document exists exactly once (a broadcast find, and each
member shard's own port counted), the change stream from before the first write has each
insert once, in clusterTime order, and nothing from the moves; the interrupted kind of work
goes on (the draining completes, the next balancer round balances, the next transaction
commits). Each kill is classified from what D held at the moment of the kill (a data move's
record in config.bson, a draining shard, a commit decision in coordinator.bson): each test
asserts that some kills did land inside the work it is about.

Last, 200 moveChunks run while two other connections read in small batches: broadcast
finds (the front's merged results), finds on one shard key value (a shard's cursor read on
through getMores while its chunk moves), range finds and counts: every read sees each
document of its range exactly once, and the server serves on.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import bson
from bson.timestamp import Timestamp
from pymongo import MongoClient, errors, monitoring

from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import SubprocessServer
from tests.sharding.test_sharded_crash import HANG_GUARD_S, KILLS, _admin, _client

DOCS = 300
CHUNK_WIDTH = 40  # crash.docs is split at 40, 80, ... 280: eight chunks
ARGS = ["--shards", "2"]


# -- what D held when the process died ------------------------------------------------------------

def _saved_catalog(data: Path) -> dict[str, Any]:
    return bson.decode((data / "config.bson").read_bytes())


def _moving(data: Path) -> bool:
    """A data move was under way (its record saved, not yet dropped)."""
    return bool(_saved_catalog(data).get("operations"))


def _draining(data: Path) -> bool:
    """A shard was draining (removeShard started, not completed)."""
    return any(s.get("draining") for s in _saved_catalog(data).get("shards", []))


def _deciding(data: Path) -> bool:
    """A cross-shard commit was decided and not known finished on every participant."""
    return (data / "coordinator.bson").exists()


# -- the checks after a restart ------------------------------------------------------------------

def _member_hosts(client: MongoClient) -> list[str]:
    return [s["host"].split("/", 1)[1] for s in client.config.shards.find({})]


def _held_by_members(client: MongoClient, coll: str) -> int:
    held = 0
    for address in _member_hosts(client):
        with MongoClient(f"mongodb://{address}/?directConnection=true",
                         serverSelectionTimeoutMS=5000) as direct:
            held += direct.crash[coll].count_documents({})
    return held


def _stream_inserts(client: MongoClient, coll: str, start: Timestamp, expected: int
                    ) -> list[dict[str, Any]]:
    """The insert events of crash.<coll> from `start`: at least `expected` of them, then
    whatever else the stream has (nothing but inserts and DDL events may be there)."""
    events: list[dict[str, Any]] = []
    with client.crash[coll].watch(start_at_operation_time=start,
                                  max_await_time_ms=50) as stream:
        deadline = time.monotonic() + HANG_GUARD_S
        idle = 0
        while idle < 5 and time.monotonic() < deadline:
            event = stream.try_next()
            if event is None:
                if len(events) >= expected:
                    idle += 1  # drained: a move's writes would show here
                continue
            assert event["operationType"] in ("insert", "create", "createIndexes",
                                              "shardCollection"), event
            if event["operationType"] == "insert":
                events.append(event)
    return events


def _assert_once_in_order(events: list[dict[str, Any]], ids: Iterable[Any]) -> None:
    """Each of `ids` inserted once, nothing else, in clusterTime order."""
    keys = [e["documentKey"]["_id"] for e in events]
    assert len(keys) == len(set(keys)), "an insert event twice"
    assert set(keys) == set(ids), (sorted(set(keys) ^ set(ids))[:10])
    times = [e["clusterTime"] for e in events]
    assert times == sorted(times), "events out of clusterTime order"


def _check_docs(server: SubprocessServer, start: Timestamp, ids: set[Any]) -> None:
    """crash.docs holds `ids`, each once and on the member shard that owns it; the stream has
    their inserts once each, in order, and nothing from the moves."""
    with _client(server) as client:
        found = [d["_id"] for d in client.crash.docs.find({}, {"_id": 1}, batch_size=64)]
        assert len(found) == len(set(found)) and set(found) == ids, (len(found), len(ids))
        assert _held_by_members(client, "docs") == len(ids)
        _assert_once_in_order(_stream_inserts(client, "docs", start, len(ids)), ids)


# -- the killed process ----------------------------------------------------------------------------

class Killed(Exception):
    """A step's work ends: the server was killed."""


class PhasedMover(threading.Thread):
    """Runs `step(mover, client, k)` for k = 0, 1, 2... until the server is killed; a step
    calls `enter(phase)` before each phase of its work, which the test waits for to kill in
    it. An error before the kill is the test's failure."""

    def __init__(self, uri: str, step: Callable[[PhasedMover, MongoClient, int], None],
                 listeners: Iterable[monitoring.CommandListener] = ()) -> None:
        super().__init__(daemon=True)
        self.client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=1000,
                                               retryWrites=False,
                                               event_listeners=list(listeners))
        self.step = step
        self.entered: dict[str, threading.Event] = {}
        self.killed = threading.Event()
        self.error: BaseException | None = None

    def enter(self, phase: str) -> None:
        self.entered.setdefault(phase, threading.Event()).set()

    def wait_for(self, phase: str) -> bool:
        return self.entered.setdefault(phase, threading.Event()).wait(HANG_GUARD_S)

    def run(self) -> None:
        try:
            for k in range(1_000_000):
                self.step(self, self.client, k)
        except (errors.PyMongoError, AssertionError, Killed) as exc:
            if not self.killed.is_set():
                self.error = exc
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc

    def stop_after_kill(self) -> None:
        self.killed.set()
        # with_transaction retries what the kill cut for two minutes: on a closed client its
        # statements fail at once (TransientTransactionError), and the retried callback sees
        # `killed` (Killed).
        self.client.close()
        self.join(HANG_GUARD_S)
        assert not self.is_alive(), "the mover hangs"
        assert self.error is None, self.error


def _kill_in(server: SubprocessServer, mover: PhasedMover, phase: str, window_s: float,
             rng: random.Random) -> None:
    """Kill the process at a random moment in the `window_s` after the mover enters `phase`."""
    mover.start()
    assert mover.wait_for(phase), f"the mover never reached {phase}"
    time.sleep(rng.uniform(0.0, window_s))
    mover.killed.set()
    server.kill()
    mover.stop_after_kill()
    server.stop()


def _timed(phase: Callable[[], None]) -> float:
    began = time.monotonic()
    phase()
    return time.monotonic() - began


# -- a shard through the cluster: addShard, a balancer round, removeShard's draining ------------

def _populate_docs(client: MongoClient) -> Timestamp:
    start = client.admin.command("ping")["operationTime"]
    _admin(client, {"enableSharding": "crash", "primaryShard": "shard0"})
    _admin(client, {"shardCollection": "crash.docs", "key": {"_id": 1}})
    client.crash.docs.insert_many([{"_id": i, "pad": "x" * 32} for i in range(DOCS)])
    for at in range(CHUNK_WIDTH, DOCS, CHUNK_WIDTH):
        _admin(client, {"split": "crash.docs", "middle": {"_id": at}})
    for chunk in list(client.config.chunks.find({}))[1::2]:  # both shards own chunks
        _admin(client, {"moveChunk": "crash.docs", "bounds": [chunk["min"], chunk["max"]],
                        "to": "shard1"})
    return start


def _chunk_counts(client: MongoClient) -> dict[str, int]:
    counts = {s["_id"]: 0 for s in client.config.shards.find({})}
    for chunk in client.config.chunks.find({}):
        counts[chunk["shard"]] += 1
    return counts


def _balance(client: MongoClient) -> None:
    _admin(client, {"balancerStart": 1})
    _admin(client, {"balancerStop": 1})


def _drain(client: MongoClient, name: str) -> None:
    """removeShard until completed (the first call of a shard not draining starts it)."""
    for _ in range(10):
        reply = _admin(client, {"removeShard": name})
        if reply["state"] == "completed":
            return
    raise AssertionError(f"removeShard {name} never completes: {reply}")


def _cycle(mover: PhasedMover | None, client: MongoClient, k: int) -> None:
    """One phase of a shard's cycle through the cluster, decided by the cluster's state (so
    that a cycle cut by a kill goes on after the restart): a draining shard is drained to
    completion; a third shard that owns no chunk gets its share (a balancer round); one that
    owns some is drained; with two shards, a new one is added."""
    enter = mover.enter if mover is not None else (lambda phase: None)
    shards = list(client.config.shards.find({}))
    draining = [s["_id"] for s in shards if s.get("draining")]
    if draining:
        enter("drain")
        _drain(client, draining[0])
        return
    if len(shards) == 2:
        enter("add")
        added = _admin(client, {"addShard": "127.0.0.1:1"})["shardAdded"]  # a generated name
        assert added not in ("shard0", "shard1")
        return
    extra = next(s["_id"] for s in shards if s["_id"] not in ("shard0", "shard1"))
    if not _chunk_counts(client)[extra]:
        enter("balance")
        _balance(client)
    else:
        enter("drain")
        _drain(client, extra)


def _assert_balanced(client: MongoClient) -> None:
    counts = _chunk_counts(client)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def _go_on_after_restart(phase: str, client: MongoClient) -> None:
    """The interrupted kind of work goes on: a draining shard's removal completes (a kill
    after the phase may have cut the draining that follows it); the next balancer round
    balances."""
    for name in [s["_id"] for s in client.config.shards.find({"draining": True})]:
        _drain(client, name)
        assert name not in _chunk_counts(client)
    if phase == "balance":
        _balance(client)
        _assert_balanced(client)


def _shard_cycle_kill_loop(tmp_path: Path, phase: str, rng: random.Random,
                           landed: Callable[[Path], bool]) -> int:
    """KILLS kills inside `phase` of the cycle; returns how many found `landed(D)` true."""
    data = tmp_path / "data"
    server = SubprocessServer(data_dir=data, extra_args=ARGS)
    inside = 0
    try:
        with _client(server) as client:
            start = _populate_docs(client)
            ids: set[Any] = set(range(DOCS))
            # One cycle unkilled: how long each phase takes here (the kill's window).
            _cycle(None, client, 0)  # add
            took = {"balance": _timed(lambda: _cycle(None, client, 1)),
                    "drain": _timed(lambda: _cycle(None, client, 2))}
            _assert_balanced(client)
            window = took[phase]
        for kill in range(KILLS):
            mover = PhasedMover(server.uri, _cycle)
            _kill_in(server, mover, phase, window * 1.5, rng)
            inside += landed(data)
            server = SubprocessServer(data_dir=data, extra_args=ARGS)
            _check_docs(server, start, ids)
            with _client(server) as client:
                _go_on_after_restart(phase, client)
                # New documents, one in each chunk's range: inserts on every shard, the
                # added one included, for the stream's order across shards.
                new = [at + 0.5 + kill / 100 for at in range(0, DOCS, CHUNK_WIDTH)]
                client.crash.docs.insert_many([{"_id": i} for i in new])
                ids.update(new)
    finally:
        server.stop()
    with SubprocessServer(data_dir=data, extra_args=ARGS) as last:
        _check_docs(last, start, ids)
    return inside


def test_killed_while_removeshard_drains_loses_and_doubles_nothing(tmp_path: Path) -> None:
    inside = _shard_cycle_kill_loop(tmp_path, "drain", random.Random("drain"), _draining)
    print(f"kills while a shard was draining: {inside} of {KILLS}")
    assert inside, "no kill landed while a shard was draining"


def test_killed_in_a_balancer_round_loses_and_doubles_nothing(tmp_path: Path) -> None:
    inside = _shard_cycle_kill_loop(tmp_path, "balance", random.Random("balance"), _moving)
    print(f"kills inside a balancer round's migration: {inside} of {KILLS}")
    assert inside, "no kill landed inside a balancer round's migration"


# -- a cross-shard commit --------------------------------------------------------------------------

class Committer:
    """Transactions through the front, each inserting {_id: 2n, x: -n-1} (shard0's chunk) and
    {_id: 2n+1, x: n+1} (shard1's): which n were tried, which commits were acknowledged."""

    def __init__(self, first: int) -> None:
        self.next = first
        self.tried: set[int] = set()
        self.acked: set[int] = set()

    def commit_one(self, client: MongoClient, killed: threading.Event | None = None) -> None:
        n = self.next
        self.next += 1
        self.tried.add(n)
        coll = client.crash.txn

        def both(session: Any) -> None:
            if killed is not None and killed.is_set():
                raise Killed  # with_transaction's retry after the kill: it ends here
            coll.insert_one({"_id": 2 * n, "x": -n - 1}, session=session)
            coll.insert_one({"_id": 2 * n + 1, "x": n + 1}, session=session)

        with client.start_session() as session:
            session.with_transaction(both)
        self.acked.add(n)

    def step(self, mover: PhasedMover, client: MongoClient, k: int) -> None:
        self.commit_one(client, mover.killed)


class CommitCue(monitoring.CommandListener):
    """The client's commitTransaction commands: each one's start calls `on_start` (the
    kill's cue); how long those that succeeded took (the kill's window)."""

    def __init__(self) -> None:
        self.on_start: Callable[[], None] | None = None
        self.micros: list[int] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "commitTransaction" and self.on_start is not None:
            self.on_start()

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "commitTransaction":
            self.micros.append(event.duration_micros)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _populate_txn(client: MongoClient) -> Timestamp:
    start = client.admin.command("ping")["operationTime"]
    _admin(client, {"enableSharding": "crash", "primaryShard": "shard0"})
    _admin(client, {"shardCollection": "crash.txn", "key": {"x": 1}})
    _admin(client, {"split": "crash.txn", "middle": {"x": 0}})
    _admin(client, {"moveChunk": "crash.txn", "find": {"x": 1}, "to": "shard1"})
    return start


def _check_transactions(server: SubprocessServer, start: Timestamp, committer: Committer
                        ) -> None:
    """Every acknowledged transaction's two documents once; any other tried one whole or not
    at all; the stream has each insert once, in clusterTime order, a transaction's two at
    its one commit time."""
    with _client(server) as client:
        found = [d["_id"] for d in client.crash.txn.find({}, {"_id": 1}, batch_size=256)]
        assert len(found) == len(set(found)), "a document twice"
        halves: dict[int, set[int]] = {}
        for i in found:
            halves.setdefault(i // 2, set()).add(i)
        half_applied = sorted(n for n, got in halves.items() if len(got) != 2)
        assert not half_applied, f"transactions half applied: {half_applied[:10]}"
        assert set(halves) <= committer.tried
        lost = sorted(committer.acked - set(halves))
        assert not lost, f"acknowledged transactions lost: {lost[:10]}"
        assert _held_by_members(client, "txn") == len(found)
        events = _stream_inserts(client, "txn", start, len(found))
        _assert_once_in_order(events, found)
        at: dict[int, set[Timestamp]] = {}
        for e in events:
            at.setdefault(e["documentKey"]["_id"] // 2, set()).add(e["clusterTime"])
        assert all(len(times) == 1 for times in at.values()), "a commit at two times"


def test_killed_in_cross_shard_commits_keeps_each_transaction_whole(tmp_path: Path) -> None:
    rng = random.Random("commit")
    data = tmp_path / "data"
    server = SubprocessServer(data_dir=data, extra_args=ARGS)
    committer = Committer(0)
    decided = 0
    try:
        cue = CommitCue()
        with MongoClient(server.uri, event_listeners=[cue]) as client:
            start = _populate_txn(client)
            for _ in range(9):
                committer.commit_one(client)
        window = sorted(cue.micros)[len(cue.micros) // 2] / 1e6  # a commit takes this here
        for _ in range(KILLS):
            mover = PhasedMover(server.uri, committer.step, [cue])
            # The kill at a random moment of the mover's first commit (or just after it).
            cue.on_start = lambda mover=mover: mover.enter("commit")
            _kill_in(server, mover, "commit", window, rng)
            cue.on_start = None
            decided += _deciding(data)
            server = SubprocessServer(data_dir=data, extra_args=ARGS)
            _check_transactions(server, start, committer)
            assert not _deciding(data), "a decided commit left unfinished at restart"
            with _client(server) as client:
                committer.commit_one(client)  # the next transaction commits
    finally:
        server.stop()
    with SubprocessServer(data_dir=data, extra_args=ARGS) as last:
        _check_transactions(last, start, committer)
    assert len(committer.acked) > KILLS
    print(f"kills between a commit's decision and its end: {decided} of {KILLS}")
    assert decided, "no kill landed between a commit's decision and its end"


# -- reads while chunks move ---------------------------------------------------------------------

MIGRATIONS = 200
GROUPS = 10  # crash.keyed: DOCS documents, DOCS // GROUPS of each shard key value k


def _populate_keyed(client: MongoClient) -> None:
    """crash.keyed sharded on {k: 1}, one chunk per value of k, alternately on each shard."""
    _admin(client, {"enableSharding": "crash", "primaryShard": "shard0"})
    _admin(client, {"shardCollection": "crash.keyed", "key": {"k": 1}})
    client.crash.keyed.insert_many([{"_id": i, "k": i % GROUPS} for i in range(DOCS)])
    for k in range(1, GROUPS):
        _admin(client, {"split": "crash.keyed", "middle": {"k": k}})
    for k in range(1, GROUPS, 2):
        _admin(client, {"moveChunk": "crash.keyed", "find": {"k": k}, "to": "shard1"})


class Reader(threading.Thread):
    """Reads crash.keyed over and over until told to stop, each read in small batches: a
    broadcast find (getMores of the front's merged results), a find targeting one value of
    the shard key (one shard's cursor, read on through getMores while its chunk may move
    away), a range find, a count. Each must see every document of its range exactly once."""

    def __init__(self, uri: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.stop_reading = stop
        self.reads = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with MongoClient(self.uri, serverSelectionTimeoutMS=5000) as client:
                docs = client.crash.keyed
                while not self.stop_reading.is_set():
                    ids = [d["_id"] for d in docs.find({}, {"_id": 1}, batch_size=37)]
                    assert sorted(ids) == list(range(DOCS)), (len(ids), len(set(ids)))
                    k = self.reads % GROUPS
                    one = [d["_id"] for d in docs.find({"k": k}, batch_size=4)]
                    assert sorted(one) == list(range(k, DOCS, GROUPS)), (k, len(one))
                    ranged = [d["_id"] for d in docs.find({"_id": {"$gte": 50, "$lt": 250}},
                                                          batch_size=16)]
                    assert sorted(ranged) == list(range(50, 250)), len(ranged)
                    assert docs.count_documents({}) == DOCS
                    self.reads += 1
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


def test_reads_during_200_migrations_see_each_document_once() -> None:
    with ShardedServer(shards=2) as server, MongoClient(server.uri) as client:
        _populate_keyed(client)
        stop = threading.Event()
        readers = [Reader(server.uri, stop) for _ in range(2)]
        for reader in readers:
            reader.start()
        moved = 0
        try:
            for k in range(MIGRATIONS):
                if any(r.error is not None for r in readers):
                    break
                chunk = client.config.chunks.find_one({"min": {"k": k % GROUPS}}) or \
                    client.config.chunks.find_one({"max": {"k": 1}})
                assert chunk is not None
                to = "shard1" if chunk["shard"] == "shard0" else "shard0"
                _admin(client, {"moveChunk": "crash.keyed",
                                "bounds": [chunk["min"], chunk["max"]], "to": to})
                moved += 1
        finally:
            stop.set()
            for reader in readers:
                reader.join(HANG_GUARD_S)
        for reader in readers:
            assert reader.error is None, reader.error
            assert reader.reads
        assert moved == MIGRATIONS
        # Still serving, each document once on the shard that owns it.
        assert client.admin.command("ping")["ok"] == 1
        held = 0
        for uri in server.shard_uris:
            with MongoClient(uri) as direct:
                held += direct.crash.keyed.count_documents({})
        assert held == DOCS
        print(f"reads during {moved} migrations: {sum(r.reads for r in readers)} rounds")
