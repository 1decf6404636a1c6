"""History that outlives the upstream's oplog: the sidecar's durable retained log.

A is cdcserver's embedded store with a small capped oplog; B (`--upstream`, with
`retain_dir`) tails it and keeps what it tailed. Once A's oplog has rolled over, a token A
no longer has gets 286 from A, while B resumes it: every later event exactly once, in order,
byte for byte what A emitted while it still had them. The same after B is killed (SIGKILL)
and restarted; a B restarted after A rolled past its last entry, or after A lost entries B
had (a restore from an older copy: a rollback), drops what it can no longer vouch for.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson import json_util
from bson.timestamp import Timestamp
from pymongo import MongoClient, errors

from cdcserver.embedded.persist import DataDirError
from cdcserver.hub import next_ts
from cdcserver.sources import retained as retained_module
from cdcserver.sources.retained import RetainedLog, RetainedWriteError, export_oplog
from cdcserver.testing import HOST, ThreadServer
from pipeline_stages import resume_token as rt
from tests.server.test_upstream import (
    GUARD_S,
    UpstreamServer,
    drain_until,
    latest_ts,
    raw_client,
    raws,
    watch,
)
from tests.support.embedded_support import EmbeddedServer

OPLOG_BYTES = 48 * 1024  # A's capped oplog
PAD = "p" * 1500


def write_chunk(ca: MongoClient, start: int, n: int) -> None:
    """Inserts, updates and deletes (with pre-images on `audited`), and a transaction."""
    shop = ca.shop
    for i in range(start, start + n):
        shop.orders.insert_one({"_id": i, "pad": PAD})
        if i % 3 == 0:
            shop.orders.update_one({"_id": i}, {"$set": {"seen": True}})
        if i % 5 == 0:
            shop.audited.update_one({"_id": 0}, {"$inc": {"v": 1}})
        if i % 7 == 0:
            shop.orders.delete_one({"_id": i})
    with ca.start_session() as session:
        session.with_transaction(
            lambda s: (
                shop.orders.insert_one({"_id": f"t{start}"}, session=s),
                shop.audited.update_one({"_id": 0}, {"$set": {"t": start}}, session=s),
            )
        )


def setup_a(ca: MongoClient) -> None:
    ca.shop.create_collection("audited", changeStreamPreAndPostImages={"enabled": True})
    ca.shop.audited.insert_one({"_id": 0, "v": 0})


OPTIONS = {"full_document_before_change": "whenAvailable"}


class Recorder:
    """A's cluster-wide stream (with pre-images), read as A is written, so every event is
    recorded before A's oplog rolls past it."""

    def __init__(self, a: EmbeddedServer) -> None:
        self.a = a
        self.client = raw_client(a.uri)
        self.stream = watch(self.client, "cluster", OPTIONS)
        self.events: list[Any] = []

    def catch_up(self) -> None:
        self.events += drain_until(self.stream, latest_ts(self.a))

    def close(self) -> None:
        self.stream.close()
        self.client.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", *args], capture_output=True, text=True,
        timeout=GUARD_S * 3, stdin=subprocess.DEVNULL,
    )


def assert_history_lost(uri: str, token: Any) -> None:
    """A stream resumed from `token` fails with 286 (at once or at its first getMore)."""
    with raw_client(uri) as client, pytest.raises(errors.OperationFailure) as lost:
        with watch(client, "cluster", {**OPTIONS, "resume_after": token}) as stream:
            deadline = time.monotonic() + GUARD_S
            while time.monotonic() < deadline:
                stream.try_next()
    assert lost.value.code == 286


def resumed_on(uri: str, token: Any, end: Timestamp) -> list[bytes]:
    with raw_client(uri) as client:
        with watch(client, "cluster", {**OPTIONS, "resume_after": token}) as stream:
            return raws(drain_until(stream, end))


def token_index(events: list[Any], a: EmbeddedServer) -> int:
    """An early event whose entry A's oplog no longer has."""
    oldest = a.call(a.store.oldest_ts)
    k = 2
    assert rt.decode(events[k]["_id"]).cluster_time < oldest, "A's oplog did not roll over"
    return k


@pytest.fixture
def a_server() -> Iterator[EmbeddedServer]:
    a = EmbeddedServer(oplog_size_bytes=OPLOG_BYTES)
    try:
        yield a
    finally:
        a.stop()


# ---------------------------------------------------------------------------------------------
# In-process sidecar


def test_token_older_than_the_upstreams_oplog_resumes_from_the_retained_log(a_server, tmp_path):
    a = a_server
    ca = a.client()
    setup_a(ca)
    b = UpstreamServer(a.uri, max_await_ms=100, window_entries=5,
                       retain_dir=str(tmp_path / "b"))
    try:
        b.wait_ready()
        recorder = Recorder(a)
        for start in range(0, 120, 10):
            write_chunk(ca, start, 10)
            recorder.catch_up()
        end = latest_ts(a)
        events = recorder.events
        recorder.close()
        k = token_index(events, a)
        token = events[k]["_id"]
        assert_history_lost(a.uri, token)
        b.wait_caught_up(end)
        got = resumed_on(b.direct_uri, token, end)
        assert got == raws(events[k + 1 :])
        # The pre-images came from B's log (A dropped them with its oplog).
        early_updates = [e for e in events[k + 1 :] if e["ns"]["coll"] == "audited"
                         and e["operationType"] == "update"]
        assert early_updates and early_updates[0]["fullDocumentBeforeChange"] is not None
        status = b.call(lambda: b.source.status()["retained"])
        assert status["entries"] > 0 and status["oldest"] < a.call(a.store.oldest_ts)
        # startAtOperationTime before A's oldest entry: served too.
        first_ts = rt.decode(events[0]["_id"]).cluster_time
        with raw_client(b.direct_uri) as cb:
            with watch(cb, "cluster", {**OPTIONS, "start_at_operation_time": first_ts}) as s:
                assert raws(drain_until(s, end)) == raws(events)
        # `archive export` (beside the running sidecar), then `replay` of what it wrote: the
        # same events as A's from the token on (tokens compared: pre-images are not in it).
        token_json = json_util.dumps(token)
        exported = run_cli("archive", "export", "--retain-dir", str(tmp_path / "b"),
                           "--since", token_json, "--out", str(tmp_path / "dump"))
        assert exported.returncode == 0, exported.stderr
        replayed = run_cli("replay", "--oplog", str(tmp_path / "dump" / "oplog.bson"),
                           "--cluster", "--options", json_util.dumps({"resumeAfter": token}))
        assert replayed.returncode == 0, replayed.stderr
        ids = [json_util.loads(line)["_id"] for line in replayed.stdout.splitlines()]
        assert ids == [dict(e["_id"]) for e in events[k + 1 :]]
        # ...and `serve --oplog` serves it: a driver resumes there with the same token.
        with ThreadServer([tmp_path / "dump" / "oplog.bson"], follow=False) as served:
            with raw_client(served.direct_uri) as cs:
                with watch(cs, "cluster", {"resume_after": token}) as stream:
                    from_file = drain_until(stream, end)
        assert [dict(e["_id"]) for e in from_file] == ids
    finally:
        b.stop()
        ca.close()


def test_retention_drops_under_a_slow_reader_who_then_gets_286(a_server, tmp_path):
    """B keeps about 60 KB: a stream that fell behind both A's oplog and B's log gets 286 at
    its next getMore, after only events of A's in order (nothing skipped before the error)."""
    a = a_server
    ca = a.client()
    setup_a(ca)
    b = UpstreamServer(a.uri, max_await_ms=100, window_entries=5, retain_hours=0,
                       retain_mb=60_000 / (1024 * 1024), retain_dir=str(tmp_path / "b"))
    recorder = None
    try:
        b.wait_ready()
        t0 = next_ts(latest_ts(a))  # where the recorder starts too
        recorder = Recorder(a)
        write_chunk(ca, 0, 10)
        recorder.catch_up()
        b.wait_caught_up(latest_ts(a))
        got = []
        with raw_client(b.direct_uri) as cb:
            options = {**OPTIONS, "start_at_operation_time": t0, "batch_size": 2}
            with watch(cb, "cluster", options) as slow:
                got.append(slow.next())
                for start in range(10, 130, 10):  # A and B's log both roll past it
                    write_chunk(ca, start, 10)
                    recorder.catch_up()
                b.wait_caught_up(latest_ts(a))
                status = b.call(lambda: b.source.status()["retained"])
                assert status["bytes"] <= 60_000 + 20_000
                with pytest.raises(errors.OperationFailure) as lost:
                    deadline = time.monotonic() + GUARD_S
                    while time.monotonic() < deadline:
                        event = slow.try_next()
                        if event is not None:
                            got.append(event)
        assert lost.value.code == 286
        assert raws(got) == raws(recorder.events[: len(got)])
    finally:
        b.stop()
        if recorder is not None:
            recorder.close()
        ca.close()


def test_refused_write_stops_delivery_until_the_log_is_writable(a_server, tmp_path, caplog):
    """The log's writes fail (SQLite refuses them: query_only) while A is written: the error
    is logged and counted, B's streams get nothing past what is retained, and once writes
    succeed again every event arrives, in order, none lost."""
    a = a_server
    ca = a.client()
    b = UpstreamServer(a.uri, max_await_ms=100, retain_dir=str(tmp_path / "b"))
    try:
        b.wait_ready()
        with raw_client(b.direct_uri) as cb, watch(cb, "shop.refused", {}) as stream:
            ca.shop.refused.insert_one({"_id": 0})
            first = None
            deadline = time.monotonic() + GUARD_S
            while first is None:
                assert time.monotonic() < deadline
                first = stream.try_next()
            b.call(lambda: b.source.retained.db.execute("PRAGMA query_only = ON"))
            ca.shop.refused.insert_many([{"_id": i} for i in range(1, 4)])
            while not b.call(lambda: b.source.retained.failing):
                assert time.monotonic() < deadline, "the refused write was not noticed"
                time.sleep(0.01)
            assert stream.try_next() is None  # nothing delivered past what is retained
            retained_before = b.call(lambda: b.source.retained.count)
            b.call(lambda: b.source.retained.db.execute("PRAGMA query_only = OFF"))
            got = []
            while len(got) < 3:
                assert time.monotonic() < deadline, "delivery did not resume"
                event = stream.try_next()
                if event is not None:
                    got.append(event["documentKey"]["_id"])
            assert got == [1, 2, 3]
            status = b.call(lambda: b.source.status()["retained"])
            assert status["writeErrors"] >= 1 and status["failing"] is None
            assert status["entries"] == retained_before + 3  # one entry per document
        assert "cannot write the retained log" in caplog.text
    finally:
        b.stop()
        ca.close()


def test_upstream_rolling_past_a_cut_off_sidecar_empties_its_log(a_server, tmp_path):
    """B is cut off while A's oplog rolls past B's position: when B reaches A again its log
    ends at a gap, so it is emptied; a token from before the gap gets 286 on B, never events
    from after the gap as if nothing was missing. Later events are retained again."""
    from tests.server.test_upstream import FAST_CLIENT
    from tests.server.test_upstream_faults import Relay

    a = a_server
    relay = Relay(a.port)
    b = UpstreamServer(f"mongodb://{HOST}:{relay.port}/?directConnection=true",
                       max_await_ms=100, backoff_max_ms=300, client_options=FAST_CLIENT,
                       retain_dir=str(tmp_path / "b"))
    ca = a.client()
    try:
        b.wait_ready()
        recorder = Recorder(a)
        write_chunk(ca, 0, 3)
        recorder.catch_up()
        b.wait_caught_up(latest_ts(a))
        token = recorder.events[0]["_id"]
        relay.pause()
        for start in range(3, 80, 10):
            write_chunk(ca, start, 10)
            recorder.catch_up()
        recorder.close()
        relay.drop()
        relay.resume()
        b.wait_caught_up(latest_ts(a))
        assert b.call(lambda: b.source.gaps) >= 1
        assert_history_lost(b.direct_uri, token)
        oldest_kept = b.call(lambda: b.source.retained.oldest_ts())
        assert oldest_kept is not None and oldest_kept >= a.call(a.store.oldest_ts)
    finally:
        b.stop()
        relay.stop()
        ca.close()


def test_required_pre_image_missing_from_the_log_is_mongods_error(a_server, tmp_path):
    """A collection without pre-images: `required` on retained history fails as A fails while
    it still has the history (same code)."""
    a = a_server
    ca = a.client()
    b = UpstreamServer(a.uri, max_await_ms=100, window_entries=2,
                       retain_dir=str(tmp_path / "b"))
    try:
        b.wait_ready()
        start = latest_ts(a)
        ca.shop.plain.insert_one({"_id": 1})
        ca.shop.plain.update_one({"_id": 1}, {"$set": {"a": 1}})
        for i in range(5):
            ca.shop.filler.insert_one({"_id": i})
        end = latest_ts(a)
        b.wait_caught_up(end)
        options = {"full_document_before_change": "required", "start_at_operation_time": start}
        codes = []
        for uri in (a.uri, b.direct_uri):
            with raw_client(uri) as client, pytest.raises(errors.OperationFailure) as failed:
                with watch(client, "shop.plain", options) as stream:
                    drain_until(stream, end)
            codes.append((failed.value.code, failed.value.details.get("codeName")))
        assert codes[0] == codes[1]
    finally:
        b.stop()
        ca.close()


# ---------------------------------------------------------------------------------------------
# The sidecar in its own process: SIGKILL and restart


class Sidecar:
    """`cdcserver serve --upstream URI` with `upstream.retain_dir` (environment)."""

    def __init__(self, upstream: str, retain_dir: pathlib.Path, log_path: pathlib.Path,
                 **env: str) -> None:
        offset = log_path.stat().st_size if log_path.exists() else 0
        self.log_path = log_path
        log = open(log_path, "ab")  # noqa: SIM115  (handed to the child)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST, "--port", "0",
             "--metrics-port", "0", "--upstream", upstream],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={
                **os.environ, "PYTHONUNBUFFERED": "1",
                "CDCSERVER_UPSTREAM_RETAIN_DIR": str(retain_dir),
                "CDCSERVER_UPSTREAM_WINDOW_ENTRIES": "5",
                "CDCSERVER_UPSTREAM_MAX_AWAIT_MS": "100",
                **env,
            },
        )
        log.close()
        import re

        deadline = time.monotonic() + GUARD_S
        while True:
            text = log_path.read_bytes()[offset:]
            match = re.search(rb"listening on [^:\s]+:(\d+)", text)
            if match:
                self.port = int(match.group(1))
                break
            assert self.process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "B did not start"
            time.sleep(0.02)

    @property
    def uri(self) -> str:
        return f"mongodb://{HOST}:{self.port}/?directConnection=true"

    def metrics(self) -> dict[str, float]:
        """The retained log's samples from B's /metrics endpoint."""
        import re
        import urllib.request

        ports = re.findall(r"metrics on http://[^:]+:(\d+)/", self.log_path.read_text())
        url = f"http://{HOST}:{ports[-1]}/metrics"  # this run's (the log is appended to)
        with urllib.request.urlopen(url, timeout=GUARD_S) as reply:
            text = reply.read().decode()
        return {
            name: float(value)
            for name, value in re.findall(r"^(cdcserver_upstream_retained_\w+) (\S+)$", text,
                                          re.MULTILINE)
        }

    def wait_caught_up(self, ts: Timestamp) -> None:
        """Until B's operationTime (its newest delivered entry) reaches `ts`."""
        with MongoClient(self.uri, serverSelectionTimeoutMS=5000) as client:
            deadline = time.monotonic() + GUARD_S
            while client.admin.command("ping")["operationTime"] < ts:
                assert time.monotonic() < deadline, "B did not catch up"
                time.sleep(0.02)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(GUARD_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def retained_rows(retain_dir: pathlib.Path) -> list[tuple[int, bytes]]:
    db = sqlite3.connect(retain_dir / retained_module.FILE_NAME)
    try:
        return list(db.execute("SELECT ts, entry FROM oplog ORDER BY ts"))
    finally:
        db.close()


def test_killed_sidecar_restarts_from_its_log_without_gap_or_duplicate(a_server, tmp_path):
    a = a_server
    ca = a.client()
    setup_a(ca)
    retain_dir = tmp_path / "b"
    recorder = Recorder(a)
    b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
    try:
        for start in range(0, 80, 10):  # A's oplog rolls over while B tails it
            write_chunk(ca, start, 10)
            recorder.catch_up()
        b.wait_caught_up(latest_ts(a))
        k = token_index(recorder.events, a)
        token = recorder.events[k]["_id"]
        before_kill = resumed_on(b.uri, token, latest_ts(a))
        assert before_kill == raws(recorder.events[k + 1 :])
        b.kill()
        last_kept = retained_rows(retain_dir)[-1][0]
        write_chunk(ca, 80, 5)  # while B is down (A keeps B's last entry)
        recorder.catch_up()
        b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
        write_chunk(ca, 85, 5)
        recorder.catch_up()
        end = latest_ts(a)
        b.wait_caught_up(end)
        assert_history_lost(a.uri, token)
        assert resumed_on(b.uri, token, end) == raws(recorder.events[k + 1 :])
        # B's tail went on after its last retained entry, not from A's present or oldest.
        restarted = b.log_path.read_text().rsplit("listening on", 1)[1]
        assert f"at {Timestamp(last_kept >> 32, last_kept & 0xFFFFFFFF)}" in restarted
        # The log itself: one entry per A entry, ascending, none twice (A's own oplog: the
        # entries it still has are B's newest ones, byte for byte).
        rows = retained_rows(retain_dir)
        assert [ts for ts, _ in rows] == sorted({ts for ts, _ in rows})
        a_tail = a.call(a.store.oplog_entries)
        assert [bytes(raw) for _, raw in rows[-len(a_tail):]] == [bytes(r) for r in a_tail]
        metrics = b.metrics()
        assert metrics["cdcserver_upstream_retained_entries"] == len(rows)
        assert metrics["cdcserver_upstream_retained_bytes"] == sum(len(r) for _, r in rows)
        assert metrics["cdcserver_upstream_retained_oldest_timestamp_seconds"] == rows[0][0] >> 32
        assert metrics["cdcserver_upstream_retained_beyond_upstream_seconds"] >= 0
        assert metrics["cdcserver_upstream_retained_failing"] == 0
    finally:
        b.stop()
        recorder.close()
        ca.close()


def test_restart_after_the_upstream_rolled_past_the_log_is_a_gap(a_server, tmp_path):
    a = a_server
    ca = a.client()
    setup_a(ca)
    retain_dir = tmp_path / "b"
    recorder = Recorder(a)
    b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
    try:
        write_chunk(ca, 0, 5)
        recorder.catch_up()
        b.wait_caught_up(latest_ts(a))
        token = recorder.events[1]["_id"]
        b.kill()
        for start in range(5, 80, 10):  # A rolls over past everything B had
            write_chunk(ca, start, 10)
            recorder.catch_up()
        b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
        b.wait_caught_up(latest_ts(a))
        assert_history_lost(b.uri, token)  # never served across the gap
        assert "rolled over while the sidecar was away" in b.log_path.read_text()
    finally:
        b.stop()
        recorder.close()
        ca.close()


def test_restart_after_an_upstream_rollback_drops_what_was_rolled_back(tmp_path):
    """A is restored from an older copy of its data directory (what it wrote after the copy
    is gone, as after a rollback): B's retained entries past the copy are dropped, and B
    follows A's new history after its last common entry."""
    a_dir = tmp_path / "a"
    a = EmbeddedServer(a_dir)
    retain_dir = tmp_path / "b"
    b = None
    try:
        ca = a.client()
        ca.shop.orders.insert_many([{"_id": i} for i in range(5)])
        a.stop()
        shutil.copytree(a_dir, tmp_path / "a-copy", ignore=shutil.ignore_patterns("*.lock"))
        a = EmbeddedServer(a_dir)
        ca = a.client()
        common = latest_ts(a)
        b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
        ca.shop.orders.insert_many([{"_id": i} for i in range(5, 10)])  # to be rolled back
        b.wait_caught_up(latest_ts(a))
        assert len(retained_rows(retain_dir)) > 1  # past `common`: what A-copy lacks
        b.kill()
        ca.close()
        a.stop()
        a = EmbeddedServer(tmp_path / "a-copy")  # the older copy: entries after `common` gone
        ca = a.client()
        with raw_client(a.uri) as c:
            with watch(c, "shop.orders", {"start_at_operation_time": common}) as sa:
                ca.shop.orders.insert_many([{"_id": i} for i in range(100, 103)])
                expected = raws(drain_until(sa, latest_ts(a)))
        b = Sidecar(a.uri, retain_dir, tmp_path / "b.log")
        deadline = time.monotonic() + GUARD_S
        while True:  # B logs the rollback, then reads A-copy after the last common entry
            before, rolled_back, after = b.log_path.read_text().partition("(a rollback)")
            if rolled_back and "upstream tail reading" in after:
                break
            assert time.monotonic() < deadline, "B did not resume after a rollback"
            time.sleep(0.02)
        with raw_client(b.uri) as cb:
            with watch(cb, "shop.orders", {"start_at_operation_time": common}) as sb:
                assert raws(drain_until(sb, latest_ts(a))) == expected
        rows = {ts for ts, _ in retained_rows(retain_dir)}
        a_ts = {(e["ts"].time << 32) | e["ts"].inc for e in a.entries()}
        assert rows <= a_ts  # nothing rolled back is kept
        ca.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


# ---------------------------------------------------------------------------------------------
# The log itself: retention, bad data directories, export


def _entries(n: int, start_time: int, size: int = 100) -> list[tuple[Timestamp, bytes]]:
    out = []
    for i in range(n):
        ts = Timestamp(start_time + i, 1)
        raw = bson.encode({"op": "n", "ns": "", "o": {"msg": "x" * size}, "ts": ts, "v": 2})
        out.append((ts, raw))
    return out


def test_retention_by_size_drops_the_oldest_first(tmp_path):
    log = RetainedLog(str(tmp_path), retain_mb=20_000 / (1024 * 1024), retain_hours=0)
    try:
        items = _entries(500, 1_000)
        for i in range(0, 500, 10):
            log.append(items[i : i + 10])
            assert log.bytes <= 20_000 + 10 * len(items[0][1])
        kept = [ts for ts, _ in log.newest(None, 10_000)][::-1]
        assert kept == [ts for ts, _ in items[-len(kept):]]  # a suffix: oldest dropped first
        assert items[-len(kept) - 1][0] < log.covered_from <= kept[0]
        assert not log.covers(items[0][0]) and log.covers(kept[0])
        assert log.dropped_entries == 500 - len(kept) > 0
    finally:
        log.close()


def test_retention_by_age_drops_entries_older_than_retain_hours(tmp_path):
    now = [10_000.0]
    log = RetainedLog(str(tmp_path), retain_mb=0, retain_hours=1, clock=lambda: now[0])
    try:
        log.append(_entries(100, 10_000 - 3_600 - 50))  # 50 of them older than an hour
        assert log.oldest_ts() == Timestamp(10_000 - 3_600, 1)
        assert log.count == 50
        now[0] += 3_600 + 1_000  # everything is old now, but the newest entry stays
        log.trim()
        assert log.count == 1 and log.last_ts() == Timestamp(10_000 - 3_600 + 49, 1)
    finally:
        log.close()


def test_log_survives_reopening(tmp_path):
    log = RetainedLog(str(tmp_path), retain_mb=1, retain_hours=0)
    items = _entries(20, 5_000)
    log.append(items)
    log.close()
    log = RetainedLog(str(tmp_path), retain_mb=1, retain_hours=0)
    try:
        assert log.count == 20 and log.last() == items[-1]
        assert [e["ts"] for e in log.read_from(items[5][0], 3)] == [t for t, _ in items[5:8]]
    finally:
        log.close()


def test_second_sidecar_on_the_same_directory_is_refused(tmp_path):
    log = RetainedLog(str(tmp_path))
    try:
        with pytest.raises(DataDirError, match="DBPathInUse"):
            RetainedLog(str(tmp_path))
    finally:
        log.close()


def test_corrupt_log_is_named_at_start(tmp_path):
    log = RetainedLog(str(tmp_path), retain_hours=0)
    log.append(_entries(3, 7_000))
    log.close()
    path = tmp_path / retained_module.FILE_NAME
    db = sqlite3.connect(path)
    db.execute("UPDATE oplog SET entry = x'0500000000' WHERE ts = (SELECT max(ts) FROM oplog)")
    db.commit()
    db.close()
    with pytest.raises(DataDirError, match="corrupt") as bad:
        RetainedLog(str(tmp_path))
    assert str(path) in str(bad.value)
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(DataDirError, match="corrupt"):
        RetainedLog(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_unwritable_directory_fails_at_start(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o500)
    try:
        with pytest.raises(DataDirError, match="not writable"):
            RetainedLog(str(target))
    finally:
        target.chmod(0o700)


def test_failed_write_raises_and_is_counted(tmp_path):
    """A write the disk refuses (here: the database made read-only under the log) raises;
    nothing of the batch is counted as retained, and the next write that succeeds goes on."""
    log = RetainedLog(str(tmp_path), retain_hours=0)
    try:
        items = _entries(6, 8_000)
        log.append(items[:3])
        log.db.execute("PRAGMA query_only = ON")
        with pytest.raises(RetainedWriteError):
            log.append(items[3:])
        assert log.count == 3 and log.write_errors == 1 and log.failing
        log.db.execute("PRAGMA query_only = OFF")
        log.append(items[3:])
        assert log.count == 6 and log.failing is None
    finally:
        log.close()


def test_export_writes_mongodump_oplog_bson(tmp_path):
    log = RetainedLog(str(tmp_path / "b"), retain_hours=0)
    items = _entries(10, 9_000)
    log.append(items)
    path, n = export_oplog(str(tmp_path / "b"), items[4][0], str(tmp_path / "out"))
    log.close()
    assert n == 6
    assert pathlib.Path(path).read_bytes() == b"".join(raw for _, raw in items[4:])


def test_since_accepts_tokens_timestamps_and_times():
    token = rt.encode(rt.ResumeTokenData(
        cluster_time=Timestamp(1_700_000_000, 7), token_type=rt.HIGH_WATER_MARK_TOKEN
    ))
    assert retained_module.parse_since(json_util.dumps(token)) == Timestamp(1_700_000_000, 7)
    assert retained_module.parse_since(token["_data"]) == Timestamp(1_700_000_000, 7)
    assert retained_module.parse_since("1700000000:3") == Timestamp(1_700_000_000, 3)
    assert retained_module.parse_since("1700000000") == Timestamp(1_700_000_000, 0)
    assert retained_module.parse_since("2023-11-14T22:13:20Z") == Timestamp(1_700_000_000, 0)


def test_export_refuses_a_bad_since_or_a_missing_log_in_one_line(tmp_path):
    bad = run_cli("archive", "export", "--retain-dir", str(tmp_path), "--since", "yesterday",
                  "--out", str(tmp_path / "out"))
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    missing = run_cli("archive", "export", "--retain-dir", str(tmp_path / "none"),
                      "--since", "1:1", "--out", str(tmp_path / "out"))
    assert missing.returncode == 2 and "no retained log" in missing.stderr
    assert not (tmp_path / "out").exists()


def test_unusable_log_paths_fail_at_start_naming_them(tmp_path):
    as_file = tmp_path / "file"
    as_file.write_text("x")
    with pytest.raises(DataDirError, match="cannot create the data directory"):
        RetainedLog(str(as_file / "sub"))
    (tmp_path / "d" / retained_module.FILE_NAME).mkdir(parents=True)  # not openable
    with pytest.raises(DataDirError, match="cannot use the retained log") as bad:
        RetainedLog(str(tmp_path / "d"))
    assert retained_module.FILE_NAME in str(bad.value)


def test_serve_refuses_a_corrupt_log_in_one_line(tmp_path):
    (tmp_path / retained_module.FILE_NAME).write_bytes(b"garbage, not SQLite " * 200)
    result = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "serve", "--port", "0", "--metrics-port", "0",
         "--upstream", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100"],
        capture_output=True, text=True, timeout=GUARD_S * 3, stdin=subprocess.DEVNULL,
        env={**os.environ, "CDCSERVER_UPSTREAM_RETAIN_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("cdcserver: ") and "corrupt" in lines[-1]
    assert str(tmp_path / retained_module.FILE_NAME) in lines[-1]


def test_retention_keys_from_the_environment_and_their_checks(tmp_path):
    from cdcserver.config import check_config

    env = {"CDCSERVER_UPSTREAM_RETAIN_DIR": str(tmp_path), "CDCSERVER_UPSTREAM_RETAIN_MB": "5",
           "CDCSERVER_UPSTREAM_RETAIN_HOURS": "0.5"}
    config, problems = check_config(None, env=env)
    assert problems == [] and config is not None
    up = config.upstream
    assert (up.retain_dir, up.retain_mb, up.retain_hours) == (str(tmp_path), 5, 0.5)
    _, problems = check_config(None, env={**env, "CDCSERVER_UPSTREAM_RETAIN_MB": "0",
                                          "CDCSERVER_UPSTREAM_RETAIN_HOURS": "0"})
    assert any("upstream.retain_mb" in p and "both be 0" in p for p in problems)
    _, problems = check_config(None, env={**env, "CDCSERVER_UPSTREAM_RETAIN_HOURS": "-1"})
    assert any("upstream.retain_hours" in p for p in problems)
    (tmp_path / "f").write_text("")
    _, problems = check_config(None, env={**env, "CDCSERVER_UPSTREAM_RETAIN_DIR":
                                          str(tmp_path / "f")})
    assert any("upstream.retain_dir" in p and "not a directory" in p for p in problems)


def test_a_full_disk_under_the_retained_log_recovers_as_space_returns(tmp_path, caplog):
    """B's retain_dir on a small tmpfs, filled: the tail stops, nothing past what is retained
    is delivered; space freed for part of the backlog gives progress (the log appends in
    chunks), all of it gives every event once, in order, with one line when the log starts
    failing (naming the full disk) and one when it recovers."""
    from tests.support.small_disk import ballast, small_tmpfs

    a = EmbeddedServer()  # an oplog that holds the whole backlog: only B's disk is short
    ca = a.client()
    pad = "p" * 3000
    with small_tmpfs(tmp_path / "disk", 8 * 1024 * 1024) as mount:
        b = UpstreamServer(a.uri, max_await_ms=100, retain_dir=str(mount / "b"))
        try:
            b.wait_ready()
            with raw_client(b.direct_uri) as cb, watch(cb, "shop.full", {}) as stream:
                ca.shop.full.insert_one({"_id": -1})
                deadline = time.monotonic() + GUARD_S
                while stream.try_next() is None:
                    assert time.monotonic() < deadline
                weight = ballast(mount, 1024 * 1024)  # room for a few chunks, once freed
                small = ballast(mount, 0, name="small")  # all the rest
                backlog = 1000
                ca.shop.full.insert_many([{"_id": i, "pad": pad} for i in range(backlog)])
                while not b.call(lambda: b.source.retained.failing):
                    assert time.monotonic() < deadline, "the full disk was not noticed"
                    time.sleep(0.01)
                got: list[int] = []
                small.unlink()  # room for part of the backlog only
                deadline = time.monotonic() + GUARD_S
                while len(got) < 5:
                    assert time.monotonic() < deadline, "no progress with part of the room"
                    event = stream.try_next()
                    if event is not None:
                        got.append(event["documentKey"]["_id"])
                weight.unlink()
                deadline = time.monotonic() + 3 * GUARD_S
                while len(got) < backlog:
                    assert time.monotonic() < deadline, f"{backlog - len(got)} still missing"
                    event = stream.try_next()
                    if event is not None:
                        got.append(event["documentKey"]["_id"])
                assert got == list(range(backlog))  # once each, in order
                assert b.call(lambda: b.source.retained.failing) is None
            failing = [r for r in caplog.records if "cannot write the retained log" in
                       r.getMessage()]
            assert len(failing) == 1 and "disk full" in failing[0].getMessage()
            assert len([r for r in caplog.records
                        if "catches up" in r.getMessage()]) == 1
        finally:
            b.stop()
            ca.close()
            a.stop()
