"""Live upstream under faults: A killed and restarted, A's oplog rolled over past B's
position, A stalled. B (tests/server/test_upstream.py's `UpstreamServer`) tails A; consumers read
change streams from B with pymongo.

No wall-clock assertions: every wait has a generous guard, and "answers within maxTimeMS"
is checked as "the reply arrives" (the consumer's client has a socket timeout).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient, errors

from cdcserver.testing import HOST
from tests.server.test_upstream import (
    FAST_CLIENT,
    GUARD_S,
    UpstreamServer,
    latest_ts,
)
from tests.support.embedded_support import EmbeddedServer

# ---------------------------------------------------------------------------------------------
# A TCP relay between B and A: pause it (A stalls), drop its connections (network loss)


class Relay:
    """127.0.0.1:<port> forwarding to `target_port`, on its own loop thread."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._open: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(GUARD_S)

    async def _start(self) -> int:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._handle, HOST, 0)
        return self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            pass  # the relay is stopping
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()  # paused: the bytes wait here (a stalled peer)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def _call(self, fn: Any) -> None:
        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(GUARD_S)

    def pause(self) -> None:
        self._call(lambda: self._open.clear())

    def resume(self) -> None:
        self._call(lambda: self._open.set())

    def drop(self) -> None:
        """Close every relayed connection (new ones are accepted)."""

        def close_all() -> None:
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self._call(close_all)

    def stop(self) -> None:
        self.resume()

        async def shutdown() -> None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(GUARD_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(GUARD_S)
        self.loop.close()


# ---------------------------------------------------------------------------------------------
# A in its own process (killable), on a fixed port and data directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ProcessA:
    """`cdcserver serve` in its own process on a fixed port: A on a data directory, or
    (`args`) anything else, such as a B with `--upstream`."""

    def __init__(
        self, data_dir: pathlib.Path | None, port: int, log_path: pathlib.Path,
        args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir, self.port, self.log_path = data_dir, port, log_path
        self.args = args or ("--data-dir", str(data_dir))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://{HOST}:{self.port}/?directConnection=true"

    def start(self) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115  (handed to the child)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST,
             "--port", str(self.port), "--metrics-port", "0", *self.args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        deadline = time.monotonic() + GUARD_S
        while b"listening on" not in self.log_path.read_bytes()[offset:]:
            assert self.process.poll() is None, self.log_path.read_text()
            assert time.monotonic() < deadline, "A did not start"
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(GUARD_S)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Consumer(threading.Thread):
    """Reads a change stream from B, keeps every documentKey._id in order."""

    def __init__(self, uri: str, ns: str, want: int) -> None:
        super().__init__(daemon=True)
        db, _, coll = ns.partition(".")
        self.client = MongoClient(uri, serverSelectionTimeoutMS=GUARD_S * 1000)
        self.stream = self.client[db][coll].watch(max_await_time_ms=100)
        self.want = want
        self.ids: list[Any] = []
        self.error: BaseException | None = None
        self.stop_flag = threading.Event()

    def run(self) -> None:
        try:
            while len(self.ids) < self.want and not self.stop_flag.is_set():
                event = self.stream.try_next()
                if event is not None:
                    self.ids.append(event["documentKey"]["_id"])
        except BaseException as exc:  # handed to the test
            self.error = exc

    def finish(self) -> list[Any]:
        self.join(GUARD_S * 2)
        self.stop_flag.set()
        self.join(GUARD_S)
        self.stream.close()
        self.client.close()
        if self.error is not None:
            raise self.error
        return self.ids


def insert_until_acknowledged(client: MongoClient, ns: str, doc: dict) -> None:
    """Insert, retrying through A's absence; a DuplicateKey means an earlier try landed."""
    db, _, coll = ns.partition(".")
    deadline = time.monotonic() + GUARD_S * 2
    while True:
        try:
            client[db][coll].insert_one(doc)
            return
        except errors.DuplicateKeyError:
            return
        except errors.PyMongoError:
            assert time.monotonic() < deadline, "A did not come back"
            time.sleep(0.05)


@pytest.fixture
def process_a(tmp_path) -> Iterator[ProcessA]:
    a = ProcessA(tmp_path / "a-data", free_port(), tmp_path / "a.log")
    a.start()
    yield a
    a.stop()


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    """Everything started here is stopped at the end, in reverse order."""
    started: list[Any] = []
    yield started
    for s in reversed(started):
        s.stop()


# ---------------------------------------------------------------------------------------------
# The tests


def test_a_killed_and_restarted_no_loss_no_duplicate(process_a, servers):
    """A is killed (SIGKILL) and restarted twice while B tails it and a writer keeps
    writing: B's consumer gets every acknowledged write exactly once, in order."""
    b = UpstreamServer(process_a.uri, max_await_ms=200, backoff_max_ms=300,
                       client_options=FAST_CLIENT)
    servers.append(b)
    b.wait_ready()
    n = 120
    consumer = Consumer(b.direct_uri, "shop.events", n)
    consumer.start()
    writer = MongoClient(process_a.uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500)
    try:
        for i in range(n):
            if i in (n // 3, 2 * n // 3):
                process_a.kill()
                process_a.start()  # same port, same data directory
            insert_until_acknowledged(writer, "shop.events", {"_id": i})
    finally:
        writer.close()
    ids = consumer.finish()
    assert ids == list(range(n))
    assert b.call(lambda: b.source.reconnects) >= 2


def test_oplog_rolled_over_past_b_is_history_lost(servers):
    """B is cut off from A (its tail stalls) while A writes more than its capped oplog
    holds: when B reaches A again, its position is gone. Streams positioned before the gap
    fail with ChangeStreamHistoryLost (286, not resumable); new streams go on."""
    a = EmbeddedServer(oplog_size_bytes=64 * 1024)
    servers.append(a)
    relay = Relay(a.port)
    servers.append(relay)
    b = UpstreamServer(
        f"mongodb://{HOST}:{relay.port}/?directConnection=true",
        max_await_ms=200, backoff_max_ms=300, client_options=FAST_CLIENT,
    )
    servers.append(b)
    b.wait_ready()
    ca = a.client()
    with MongoClient(b.direct_uri, socketTimeoutMS=GUARD_S * 1000) as cb:
        stream = cb.shop.trunc.watch(max_await_time_ms=100)
        ca.shop.trunc.insert_one({"_id": 0})
        first = None
        deadline = time.monotonic() + GUARD_S
        while first is None and time.monotonic() < deadline:
            first = stream.try_next()
        assert first is not None and first["documentKey"] == {"_id": 0}
        old_token = first["_id"]

        relay.pause()  # B's tail and its monitor stall
        pad = "x" * 2000
        for i in range(1, 100):  # ~200 KB: A's 64 KB oplog rolls over several times
            ca.shop.trunc.insert_one({"_id": i, "pad": pad})
        assert a.store._ts[0] > first["clusterTime"]
        relay.drop()  # B's connections break; it reconnects at its last position
        relay.resume()

        with pytest.raises(errors.OperationFailure) as lost:
            deadline = time.monotonic() + GUARD_S
            while time.monotonic() < deadline:
                stream.try_next()
        assert lost.value.code == 286
        assert lost.value.has_error_label("NonResumableChangeStreamError")
        assert b.call(lambda: b.source.gaps) >= 1

        # Resuming from before the gap: 286 too (at once, or at the first getMore).
        with pytest.raises(errors.OperationFailure) as again:
            with cb.shop.trunc.watch(resume_after=old_token, max_await_time_ms=100) as s2:
                deadline = time.monotonic() + GUARD_S
                while time.monotonic() < deadline:
                    s2.try_next()
        assert again.value.code == 286

        # A new stream starts after the gap and works.
        b.wait_caught_up(latest_ts(a))
        with cb.shop.trunc.watch(max_await_time_ms=100) as fresh:
            ca.shop.trunc.insert_one({"_id": "after"})
            event = None
            deadline = time.monotonic() + GUARD_S
            while event is None and time.monotonic() < deadline:
                event = fresh.try_next()
            assert event is not None and event["documentKey"] == {"_id": "after"}
    ca.close()


def test_start_older_than_the_truncated_oplog_is_history_lost(servers):
    """startAtOperationTime before A's oldest entry (A truncated its oplog): 286."""
    a = EmbeddedServer(oplog_size_bytes=32 * 1024)
    servers.append(a)
    ca = a.client()
    ca.shop.t.insert_one({"_id": 0})
    early = latest_ts(a)
    for i in range(1, 40):
        ca.shop.t.insert_one({"_id": i, "pad": "y" * 2000})
    assert a.store._ts[0] > early
    b = UpstreamServer(a.uri, max_await_ms=200)
    servers.append(b)
    b.wait_ready()
    with MongoClient(b.direct_uri, socketTimeoutMS=GUARD_S * 1000) as cb:
        with pytest.raises(errors.OperationFailure) as lost:
            with cb.shop.t.watch(start_at_operation_time=early, max_await_time_ms=100) as s:
                deadline = time.monotonic() + GUARD_S
                while time.monotonic() < deadline:
                    s.try_next()
        assert lost.value.code == 286
        # From A's oldest entry on, history is whole.
        oldest = a.store._ts[0]
        with cb.shop.t.watch(start_at_operation_time=oldest, max_await_time_ms=100) as s:
            ids = []
            deadline = time.monotonic() + GUARD_S
            while len(ids) < 5 and time.monotonic() < deadline:
                event = s.try_next()
                if event is not None:
                    ids.append(event["documentKey"]["_id"])
            assert ids and ids == list(range(ids[0], ids[0] + len(ids)))
    ca.close()


def test_a_stalls_b_still_answers_get_more(servers):
    """A stops answering (the relay holds every byte): B's getMores still answer within
    their maxTimeMS (empty batches); when A answers again nothing is lost or repeated."""
    a = EmbeddedServer()
    servers.append(a)
    relay = Relay(a.port)
    servers.append(relay)
    b = UpstreamServer(
        f"mongodb://{HOST}:{relay.port}/?directConnection=true",
        max_await_ms=200, client_options=FAST_CLIENT,
    )
    servers.append(b)
    b.wait_ready()
    ca = a.client()
    # The consumer's socket timeout is the guard: a getMore B did not answer fails the test.
    with MongoClient(b.direct_uri, socketTimeoutMS=10_000) as cb:
        stream = cb.shop.stall.watch(max_await_time_ms=200)
        ca.shop.stall.insert_one({"_id": 0})
        ids: list[Any] = []

        def read_until(count: int) -> None:
            deadline = time.monotonic() + GUARD_S
            while len(ids) < count and time.monotonic() < deadline:
                event = stream.try_next()
                if event is not None:
                    ids.append(event["documentKey"]["_id"])

        read_until(1)
        relay.pause()
        for i in range(1, 20):
            ca.shop.stall.insert_one({"_id": i})
        answered = 0
        for _ in range(5):  # each is one getMore on B, answered empty at its maxTimeMS
            assert stream.try_next() is None
            answered += 1
        assert answered == 5
        # The proxy, meanwhile, fails fast enough for drivers to retry (or times out).
        relay.resume()
        read_until(20)
        assert ids == list(range(20))
    ca.close()


def test_proxy_with_upstream_down_is_a_retryable_error(servers, tmp_path):
    """With A gone, a forwarded write fails with a network error code and the label that
    makes drivers retry it; once A is back the retry lands."""
    port = free_port()
    a = ProcessA(tmp_path / "a-data", port, tmp_path / "a.log")
    a.start()
    servers.append(a)
    b = UpstreamServer(a.uri, max_await_ms=200, backoff_max_ms=300,
                       client_options={**FAST_CLIENT, "serverSelectionTimeoutMS": 300})
    servers.append(b)
    b.wait_ready()
    with MongoClient(b.direct_uri, retryWrites=False) as cb:
        cb.shop.px.insert_one({"_id": 1})
        a.kill()
        with pytest.raises(errors.OperationFailure) as down:
            cb.shop.command({"insert": "px", "documents": [{"_id": 2}],
                             "txnNumber": __import__("bson").Int64(1),  # a long, as in IDL
                             "lsid": {"id": __import__("bson").Binary(b"0" * 16, 4)}})
        assert down.value.code in (6, 89)
        assert down.value.has_error_label("RetryableWriteError")
        a.start()
        insert_until_acknowledged(cb, "shop.px", {"_id": 2})
    with MongoClient(a.uri) as ca:
        assert sorted(d["_id"] for d in ca.shop.px.find()) == [1, 2]


def test_timestamps_are_not_reused_after_restart(process_a, servers):
    """Sanity of the fault setup: A restarted on its data directory continues its oplog."""
    with MongoClient(process_a.uri) as ca:
        ca.shop.x.insert_one({"_id": 1})
        before = ca.admin.command("hello")["lastWrite"]["opTime"]["ts"]
    process_a.kill()
    process_a.start()
    with MongoClient(process_a.uri) as ca:
        ca.shop.x.insert_one({"_id": 2})
        after = ca.admin.command("hello")["lastWrite"]["opTime"]["ts"]
    assert isinstance(before, Timestamp) and after > before


def test_cli_serve_upstream(process_a, servers, tmp_path):
    """`cdcserver serve --upstream URI` in its own process: watch B, write to A."""
    b = ProcessA(None, free_port(), tmp_path / "b.log", ("--upstream", process_a.uri))
    servers.append(b)
    b.start()
    with MongoClient(b.uri) as cb, MongoClient(process_a.uri) as ca:
        with cb.shop.cli.watch(max_await_time_ms=100, full_document="updateLookup") as stream:
            ca.shop.cli.insert_one({"_id": 1})
            ca.shop.cli.update_one({"_id": 1}, {"$set": {"a": 1}})
            events = []
            deadline = time.monotonic() + GUARD_S
            while len(events) < 2 and time.monotonic() < deadline:
                event = stream.try_next()
                if event is not None:
                    events.append(event)
        assert [e["operationType"] for e in events] == ["insert", "update"]
        assert events[1]["fullDocument"] == {"_id": 1, "a": 1}  # looked up on A
        cb.shop.cli.insert_one({"_id": 2})  # forwarded to A
        assert ca.shop.cli.count_documents({}) == 2


def test_a_stalls_lookups_fail_fast_and_resume(servers):
    """While A stalls, an updateLookup stream's lookups fail with a resumable error (at
    lookup_timeout_ms, then at once until B hears from A); other streams keep answering;
    once A answers again the lookup stream resumes from its token and gets its documents."""
    a = EmbeddedServer()
    servers.append(a)
    relay = Relay(a.port)
    servers.append(relay)
    b = UpstreamServer(
        f"mongodb://{HOST}:{relay.port}/?directConnection=true",
        max_await_ms=200, lookup_timeout_ms=500,
        client_options={**FAST_CLIENT, "socketTimeoutMS": 1500},
    )
    servers.append(b)
    b.wait_ready()
    ca = a.client()
    with MongoClient(b.direct_uri, socketTimeoutMS=10_000) as cb:
        plain = cb.shop.other.watch(max_await_time_ms=100)
        looked = cb.shop.looked.watch(max_await_time_ms=100, full_document="updateLookup")
        assert plain.try_next() is None and looked.try_next() is None
        ca.shop.looked.insert_one({"_id": 1, "v": 0})
        ca.shop.looked.update_one({"_id": 1}, {"$set": {"v": 1}})
        b.wait_caught_up(latest_ts(a))  # B has the events; the lookup stream has not read them
        relay.pause()
        token = looked.resume_token
        failure = None
        for _ in range(3):
            assert plain.try_next() is None  # answered
            try:
                event = looked.try_next()
                if event is not None:  # the insert (no lookup) comes first
                    token = event["_id"]
            except errors.OperationFailure as exc:
                failure = exc
                break
        assert failure is not None
        assert failure.code in (6, 89)
        assert failure.has_error_label("ResumableChangeStreamError")
        for _ in range(3):
            assert plain.try_next() is None  # still answered while A is silent
        relay.drop()
        relay.resume()
        b.wait_caught_up(latest_ts(a))
        events = []
        deadline = time.monotonic() + GUARD_S
        while not events and time.monotonic() < deadline:
            try:
                with cb.shop.looked.watch(
                    resume_after=token, full_document="updateLookup", max_await_time_ms=100
                ) as again:
                    while not events and time.monotonic() < deadline:
                        event = again.try_next()
                        if event is not None and event["operationType"] == "update":
                            events.append(event)
            except errors.OperationFailure as exc:
                assert exc.has_error_label("ResumableChangeStreamError")
                time.sleep(0.1)
        assert events and events[0]["fullDocument"] == {"_id": 1, "v": 1}
        plain.close()
        looked.close()
    ca.close()


def test_b_started_before_a(servers, tmp_path):
    """B starts while A is not there yet: new streams get a resumable error (drivers retry)
    until B reaches A; then they work."""
    a = ProcessA(tmp_path / "a-data", free_port(), tmp_path / "a.log")
    servers.append(a)
    b = UpstreamServer(a.uri, max_await_ms=200, backoff_max_ms=300, client_options=FAST_CLIENT)
    servers.append(b)
    with MongoClient(b.direct_uri, retryReads=False) as cb:
        with pytest.raises(errors.OperationFailure) as early:
            cb.shop.late.watch()
        assert early.value.code == 6
        assert early.value.has_error_label("ResumableChangeStreamError")
        a.start()
        b.wait_ready()
        with cb.shop.late.watch(max_await_time_ms=100) as stream, MongoClient(a.uri) as ca:
            ca.shop.late.insert_one({"_id": 1})
            event = None
            deadline = time.monotonic() + GUARD_S
            while event is None and time.monotonic() < deadline:
                event = stream.try_next()
            assert event is not None and event["documentKey"] == {"_id": 1}
