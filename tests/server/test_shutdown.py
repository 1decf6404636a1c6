"""Graceful shutdown of `cdcserver serve` (SIGTERM/SIGINT), with pymongo clients.

The server stops accepting connections, answers getMores waiting for events at once, lets
requests in flight finish within `server.shutdown_grace_s`, answers new commands with
91 ShutdownInProgress (mongod's labels), closes, flushes the embedded store and exits 0. A second
signal exits at once. Clients resume on a server restarted on the same port and data directory
and miss nothing.
"""

from __future__ import annotations

import json
import pathlib
import re
import signal
import socket
import threading
import time
import urllib.request
from typing import Any

import pymongo
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcserver.commands.registry import SHUTDOWN_MESSAGE
from cdcserver.testing import HOST, SubprocessServer

GUARD_S = 30.0  # bounds waits for things that must happen; never asserted on
N_INSERTS = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _metric(server: SubprocessServer, name: str) -> float:
    match = re.search(r"metrics on http://[^:]+:(\d+)/metrics", server.log_text())
    assert match, server.log_text()
    url = f"http://{HOST}:{match.group(1)}/metrics"
    with urllib.request.urlopen(url, timeout=GUARD_S) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in {text}")


def _wait_metric(server: SubprocessServer, name: str, at_least: float) -> None:
    deadline = time.monotonic() + GUARD_S
    while _metric(server, name) < at_least:
        assert time.monotonic() < deadline, f"{name} never reached {at_least}"
        time.sleep(0.01)


class Watcher(threading.Thread):
    """Iterates one ChangeStream (the same object across the restart) and keeps the _id of
    every insert, in order."""

    def __init__(self, stream: Any, want: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.want = stream, want
        self.ids: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 3 * GUARD_S
        try:
            while len(self.ids) < self.want and time.monotonic() < deadline:
                event = self.stream.try_next()
                if event is not None and event["operationType"] == "insert":
                    self.ids.append(event["documentKey"]["_id"])
        except BaseException as exc:  # reported by the test
            self.error = exc


class Writer(threading.Thread):
    def __init__(self, uri: str, n: int) -> None:
        super().__init__(daemon=True)
        self.client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=GUARD_S * 1000)
        self.n = n
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        coll = self.client.shop.orders
        try:
            for i in range(self.n):
                coll.insert_one({"_id": i})  # a retryable write: retried once after an error
                self.done = i + 1
                time.sleep(0.003)  # spreads the writes over the shutdown and the restart
        except BaseException as exc:
            self.error = exc


def test_sigterm_during_streams_then_restart_loses_nothing(tmp_path: pathlib.Path) -> None:
    port = _free_port()
    data_dir = tmp_path / "data"
    first_log = tmp_path / "first.log"
    env = {"CDCSERVER_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
    server = SubprocessServer(
        data_dir=data_dir, extra_args=["--port", str(port)], env=env, log_path=first_log
    )
    uri = f"mongodb://{HOST}:{port}/?directConnection=true"
    clients = [pymongo.MongoClient(uri, serverSelectionTimeoutMS=GUARD_S * 1000)
               for _ in range(3)]
    restarted: SubprocessServer | None = None
    try:
        clients[0].shop.create_collection("orders")
        streams = [
            clients[0].shop.orders.watch(max_await_time_ms=200),
            clients[1].shop.watch(max_await_time_ms=200),
            clients[2].watch(max_await_time_ms=200),
        ]
        watchers = [Watcher(s, N_INSERTS) for s in streams]
        for w in watchers:
            w.start()
        writer = Writer(uri, N_INSERTS)
        writer.start()
        deadline = time.monotonic() + GUARD_S
        while min(len(w.ids) for w in watchers) < N_INSERTS // 4:
            assert time.monotonic() < deadline and writer.error is None, writer.error
            time.sleep(0.005)

        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(GUARD_S) == 0
        stopped_at = writer.done
        restarted = SubprocessServer(
            data_dir=data_dir, extra_args=["--port", str(port)], env=env,
            log_path=tmp_path / "second.log",
        )
        writer.join(3 * GUARD_S)
        for w in watchers:
            w.join(3 * GUARD_S)
        assert writer.error is None, writer.error
        assert stopped_at < N_INSERTS  # the writer was still writing at SIGTERM
        for w in watchers:
            assert w.error is None, w.error
            assert w.ids == list(range(N_INSERTS))  # every insert, once, in order
        for s in streams:
            s.close()
    finally:
        for c in clients:
            c.close()
        server.stop()
        if restarted is not None:
            restarted.stop()

    text = first_log.read_text()
    assert "SIGTERM: shutting down" in text
    assert "shutdown complete" in text
    assert "still running after" not in text
    # [log] format = "json": every line is one JSON object with the structured fields.
    lines = [json.loads(line) for line in text.splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= set(doc) for doc in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["ts"]) for d in lines)
    accepted = [d for d in lines if d["msg"].startswith("connection ") and "accepted" in d["msg"]]
    assert accepted and all(isinstance(d["conn"], int) and ":" in d["peer"] for d in accepted)


def test_awaiting_get_more_is_answered_at_shutdown(tmp_path: pathlib.Path) -> None:
    # A getMore waiting 60 s for events would outlast the 30 s grace: it must answer at once.
    server = SubprocessServer(
        env={"CDCSERVER_SERVER_SHUTDOWN_GRACE_S": "30"}, log_path=tmp_path / "server.log"
    )
    outcome: list[Any] = []
    try:
        with pymongo.MongoClient(server.direct_uri, retryReads=False) as client:
            stream = client.shop.idle.watch(max_await_time_ms=60_000)

            def wait_once() -> None:
                try:
                    outcome.append(stream._cursor.try_next())  # one getMore, no resume
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=wait_once, daemon=True)
            thread.start()
            _wait_metric(server, "cdcserver_requests_in_flight", 1)
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(GUARD_S * 2) == 0
            thread.join(GUARD_S)
    finally:
        server.stop()
    assert outcome == [None]  # an empty batch, not an error
    assert "still running after" not in server.log_text()


class FailedCommands(pymongo.monitoring.CommandListener):
    def __init__(self) -> None:
        self.failures: list[dict[str, Any]] = []

    def started(self, event: Any) -> None:
        pass

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        if isinstance(event.failure, dict) and "code" in event.failure:
            self.failures.append(event.failure)


def test_requests_during_shutdown_and_second_signal(tmp_path: pathlib.Path) -> None:
    server = SubprocessServer(
        env={"CDCSERVER_SERVER_SHUTDOWN_GRACE_S": "60"}, log_path=tmp_path / "server.log"
    )
    uri = server.direct_uri
    try:
        # These clients' monitors poll rarely: a streaming monitor's awaitable hello gets 91 at
        # once at shutdown (checked below), which would mark the server Unknown in each client
        # before the commands this test sends on their open connections.
        quiet = {"serverMonitoringMode": "poll", "heartbeatFrequencyMS": 600_000}
        blocked = pymongo.MongoClient(uri, **quiet)
        pinger, streamer, helloer = (pymongo.MongoClient(uri, **quiet) for _ in range(3))
        failures = FailedCommands()
        writer = pymongo.MongoClient(
            uri, event_listeners=[failures], serverSelectionTimeoutMS=300, **quiet
        )
        for c in (pinger, streamer, helloer, writer):
            c.admin.command("ping")  # each has a pooled connection before the shutdown
        reply = streamer.shop.command(
            {"aggregate": "orders", "pipeline": [{"$changeStream": {}}], "cursor": {}}
        )
        cursor_id = reply["cursor"]["id"]
        # A request that will not finish: a ping held 60 s by a fail point.
        blocked.admin.command({
            "configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 60_000},
        })
        hold = threading.Thread(
            target=lambda: pytest.raises(pymongo.errors.PyMongoError,
                                         blocked.admin.command, "ping"),
            daemon=True,
        )
        hold.start()
        _wait_metric(server, "cdcserver_requests_in_flight", 1)
        # A driver monitor's awaitable hello, waiting 60 s for a topology change: shutdown
        # answers it at once with 91 (mongod's quiesce mode), not after its wait.
        monitor = pymongo.MongoClient(uri, socketTimeoutMS=120_000, **quiet)
        version = monitor.admin.command("hello")["topologyVersion"]
        awaited: list[BaseException] = []

        def awaitable_hello() -> None:
            try:
                monitor.admin.command(
                    {"hello": 1, "topologyVersion": version, "maxAwaitTimeMS": 60_000}
                )
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                awaited.append(exc)

        waiting = threading.Thread(target=awaitable_hello, daemon=True)
        waiting.start()

        server.process.send_signal(signal.SIGTERM)
        _wait_metric(server, "cdcserver_shutting_down", 1)
        # New connections are refused: the listener is closed.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, server.port), timeout=GUARD_S).close()
        # Commands on open connections: 91 ShutdownInProgress, with mongod's labels.
        # (pymongo raises NotPrimaryError for 91: it marks the server unknown.)
        with pytest.raises(pymongo.errors.NotPrimaryError) as err:
            pinger.admin.command("ping")
        details = err.value.details
        assert (details["code"], details["codeName"]) == (91, "ShutdownInProgress")
        assert details["errmsg"] == SHUTDOWN_MESSAGE
        assert "errorLabels" not in details
        with pytest.raises(pymongo.errors.NotPrimaryError) as err:
            streamer.shop.command({"getMore": cursor_id, "collection": "orders"})
        assert err.value.details["code"] == 91
        assert err.value.details["errorLabels"] == ["ResumableChangeStreamError"]
        with pytest.raises(pymongo.errors.NotPrimaryError) as err:
            helloer.admin.command("hello")
        assert err.value.details["code"] == 91
        waiting.join(GUARD_S)
        assert not waiting.is_alive()
        assert isinstance(awaited[0], pymongo.errors.NotPrimaryError)
        assert awaited[0].details["code"] == 91
        monitor.close()
        # A retryable write: RetryableWriteError (pymongo's retry then finds no server).
        with pytest.raises(pymongo.errors.PyMongoError):
            writer.shop.orders.insert_one({"_id": 1})
        assert [(f["code"], f.get("errorLabels")) for f in failures.failures] == [
            (91, ["RetryableWriteError"])
        ]

        # The blocked ping keeps the shutdown waiting; a second signal ends it at once.
        assert server.process.poll() is None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(GUARD_S) == 128 + signal.SIGTERM
        hold.join(GUARD_S)
        for c in (blocked, pinger, streamer, helloer, writer):
            c.close()
    finally:
        server.stop()
    text = server.log_text()
    assert "SIGTERM: shutting down" in text
    assert "SIGTERM during shutdown: exiting now" in text
    assert "shutdown complete" not in text


def _wait_for_log(path: pathlib.Path, text: str, after: int = 0) -> int:
    """Wait until `text` appears in the log past byte `after`; returns where it ends."""
    deadline = time.monotonic() + GUARD_S
    while True:
        data = path.read_text()
        at = data.find(text, after)
        if at >= 0:
            return at + len(text)
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{data[after:]}"
        time.sleep(0.02)


def test_upstream_shutdown_within_grace_after_the_upstream_died(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --upstream`: the upstream killed, restarted (the reconnect is logged) and killed
    again; SIGTERM then ends the sidecar within its grace. Its upstream client waits 60 s for
    a server (serverSelectionTimeoutMS): closing must not wait for that (it took 3 such
    waits, killCursors and two clients' endSessions), so the hang guard below is far shorter
    than the unbounded close and far longer than the grace."""
    from tests.server.test_upstream_faults import ProcessA

    monkeypatch.setenv("CDCSERVER_UPSTREAM_CLIENT_OPTIONS", "{serverSelectionTimeoutMS = 60000}")
    monkeypatch.setenv("CDCSERVER_UPSTREAM_BACKOFF_MAX_MS", "200")
    monkeypatch.setenv("CDCSERVER_SERVER_SHUTDOWN_GRACE_S", "1")
    a = ProcessA(tmp_path / "a-data", _free_port(), tmp_path / "a.log")
    b_log = tmp_path / "b.log"
    b = ProcessA(None, _free_port(), b_log, ("--upstream", a.uri))
    try:
        a.start()
        b.start()
        seen = _wait_for_log(b_log, "upstream tail reading from")
        a.kill()
        seen = _wait_for_log(b_log, "upstream tail lost", seen)
        a.start()  # same port, same data directory: the tail resumes where it was
        seen = _wait_for_log(b_log, "upstream tail reconnected to", seen)
        a.kill()
        seen = _wait_for_log(b_log, "upstream tail lost", seen)
        assert b.process is not None
        b.process.send_signal(signal.SIGTERM)
        assert b.process.wait(GUARD_S) == 0
    finally:
        b.stop()
        a.stop()
    text = b_log.read_text()
    assert "shutdown complete" in text
    assert text.count("upstream tail lost") == 2  # once per outage, not once per attempt
    assert "still running after" not in text
