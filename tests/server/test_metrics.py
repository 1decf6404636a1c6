"""The Prometheus endpoint (cdcserver/metrics.py) scraped over HTTP while pymongo streams, and the
slow-operation log (cdcserver/logs.py)."""

from __future__ import annotations

import logging
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcserver.metrics import Metrics, MetricsEndpoint
from cdcserver.testing import HOST, EmbeddedServer, SubprocessServer

GUARD_S = 10.0  # bounds a wait for something that must happen; never asserted on

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, path: str = "/metrics") -> Samples:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=GUARD_S) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def next_events(stream: Any, n: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + GUARD_S
    while len(got) < n and time.monotonic() < deadline:
        event = stream.try_next()
        if event is not None:
            got.append(event)
    return got


@pytest.fixture
def served() -> Iterator[tuple[EmbeddedServer, int]]:
    """An embedded server in this process with its metrics endpoint on a free port."""
    server = EmbeddedServer()

    def attach() -> MetricsEndpoint:
        server.state.metrics = Metrics(
            server.state, in_flight=lambda: len(server.server.in_flight())
        )
        return MetricsEndpoint(server.state.metrics)

    endpoint = server.call(attach)
    port = server.run(endpoint.start(HOST, 0))
    try:
        yield server, port
    finally:
        server.run(endpoint.close())
        server.stop()


def test_counters_move_during_a_stream(served: tuple[EmbeddedServer, int]) -> None:
    server, port = served
    before = scrape(port)
    assert value(before, "cdcserver_events_delivered_total") == 0
    assert value(before, "cdcserver_getmore_duration_seconds_count") == 0
    with server.client() as client:
        orders = client.shop.orders
        streams = [
            orders.watch(max_await_time_ms=50),
            client.shop.watch(max_await_time_ms=50),
            client.watch(max_await_time_ms=50),
        ]
        opened = scrape(port)
        for scope in ("collection", "database", "cluster"):
            assert value(opened, "cdcserver_cursors_open", scope=scope) == 1
        assert value(opened, "cdcserver_connections_current") >= 1
        assert value(opened, "cdcserver_connections_total") >= 1

        orders.insert_many([{"_id": i} for i in range(5)])
        for stream in streams:
            assert [e["documentKey"]["_id"] for e in next_events(stream, 5)] == list(range(5))
        after = scrape(port)
        assert value(after, "cdcserver_events_delivered_total") == 15
        assert value(after, "cdcserver_getmore_duration_seconds_count") >= 3
        assert value(after, "cdcserver_getmore_duration_seconds_bucket", le="+Inf") == value(
            after, "cdcserver_getmore_duration_seconds_count"
        )
        newest = server.call(server.store.latest_ts)
        assert value(after, "cdcserver_oplog_read_timestamp_seconds") == newest.time
        assert value(after, "cdcserver_oplog_entries") >= 6  # create + 5 inserts (+ no-op)
        assert value(after, "cdcserver_streams_lag_entries") == 0  # everyone has read it all

        # Errors by code: one CommandNotFound, one CursorNotFound.
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            client.admin.command("noSuchCommand")
        assert err.value.code == 59
        with pytest.raises(pymongo.errors.OperationFailure) as err:
            client.admin.command({"getMore": 12345, "collection": "orders"})
        assert err.value.code == 43
        errors = scrape(port)
        assert value(
            errors, "cdcserver_command_errors_total", code="59", codeName="CommandNotFound"
        ) == 1
        assert value(
            errors, "cdcserver_command_errors_total", code="43", codeName="CursorNotFound"
        ) == 1

        for stream in streams:
            stream.close()
        closed = scrape(port)
        for scope in ("collection", "database", "cluster"):
            assert value(closed, "cdcserver_cursors_open", scope=scope) == 0


def test_stream_lag_and_hub(served: tuple[EmbeddedServer, int]) -> None:
    server, port = served
    with server.client() as client:
        coll = client.app.events
        coll.insert_one({"_id": "first"})  # the collection exists before the streams open
        fast = coll.watch(max_await_time_ms=50)
        same = coll.watch(max_await_time_ms=50)  # identical: shares the producer
        coll.insert_many([{"_id": i} for i in range(10)])
        behind = scrape(port)
        assert value(behind, "cdcserver_streams_lag_entries") == 10
        assert value(behind, "cdcserver_streams_lag_seconds") >= 0
        assert value(behind, "cdcserver_hub_producers") == 1
        assert len(next_events(fast, 10)) == 10
        caught_up = scrape(port)
        assert value(caught_up, "cdcserver_streams_lag_entries") == 0
        # `same` has had everything made for it, and not yet returned any of it.
        assert value(caught_up, "cdcserver_hub_queued_events") == 10
        assert value(caught_up, "cdcserver_hub_window_entries") >= 10
        assert len(next_events(same, 10)) == 10
        assert value(scrape(port), "cdcserver_hub_queued_events") == 0
        fast.close()
        same.close()


def test_endpoint_answers_only_metrics(served: tuple[EmbeddedServer, int]) -> None:
    _, port = served
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{HOST}:{port}/other", timeout=GUARD_S)
    assert err.value.code == 404
    # Several servers in one process: each has its own registry and its own numbers.
    with EmbeddedServer() as other:

        def attach() -> Metrics:
            other.state.metrics = Metrics(other.state)
            return other.state.metrics

        metrics = other.call(attach)
        with other.client() as client, pytest.raises(pymongo.errors.OperationFailure):
            client.admin.command("noSuchCommand")
        text = other.call(metrics.exposition).decode()
    assert 'cdcserver_command_errors_total{code="59",codeName="CommandNotFound"} 1.0' in text
    mine = scrape(port)
    assert ("cdcserver_command_errors_total",
            frozenset({("code", "59"), ("codeName", "CommandNotFound")})) not in mine


def test_slow_query_log(served: tuple[EmbeddedServer, int], caplog: Any) -> None:
    server, _ = served
    caplog.set_level(logging.INFO, logger="cdcserver.command")
    with server.client() as client:
        client.admin.command({
            "configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 150},
        })
        client.admin.command("ping")
        # An awaitData getMore that waits 300 ms for events did no slow work.
        with client.shop.orders.watch(max_await_time_ms=300) as stream:
            assert stream.try_next() is None
        # Nor does a tailable awaitData find on the oplog that waits 300 ms for entries.
        tail = client.local["oplog.rs"].find(
            {"ts": {"$gt": client.admin.command("ping")["operationTime"]}},
            cursor_type=pymongo.CursorType.TAILABLE_AWAIT,
        ).max_await_time_ms(300)
        assert next(tail, None) is None  # the find's first batch: empty, at once
        assert next(tail, None) is None and tail.alive  # a getMore that waited, empty
        tail.close()
    slow = [r for r in caplog.records if r.name == "cdcserver.command"]
    assert [r.command for r in slow] == ["ping"]  # type: ignore[attr-defined]
    record = slow[0]
    assert record.getMessage().startswith("Slow query: conn ")
    assert record.durationMillis >= 100  # type: ignore[attr-defined]  # slowms: what logs it
    assert record.ns == "admin.$cmd"  # type: ignore[attr-defined]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def test_serve_has_a_metrics_port(tmp_path: pathlib.Path) -> None:
    with SubprocessServer() as server:
        match = re.search(r"metrics on http://[^:]+:(\d+)/metrics", server.log_text())
        assert match, server.log_text()
        with pymongo.MongoClient(server.direct_uri) as client:
            client.admin.command("ping")
            samples = scrape(int(match.group(1)))
        assert value(samples, "cdcserver_connections_total") >= 1
        assert value(samples, "cdcserver_requests_in_flight") == 0
        assert value(samples, "cdcserver_source_failed") == 0
        # The process's own (prometheus_client's process and platform collectors): the
        # server's memory, CPU, descriptors, start time, and its Python.
        assert value(samples, "process_resident_memory_bytes") > 0
        assert value(samples, "process_open_fds") > 0
        assert value(samples, "process_start_time_seconds") > 0
        assert "process_cpu_seconds_total" in {name for name, _ in samples}
        assert any(name == "python_info" for name, _ in samples)
    # Off: no endpoint.
    with SubprocessServer(env={"CDCSERVER_METRICS_ENABLED": "false"}) as server:
        assert "metrics on" not in server.log_text()


def test_busy_metrics_port_fails_startup_naming_the_key() -> None:
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--in-memory", "--host", HOST,
             "--port", str(_free_port()), "--metrics-port", str(port)],
            capture_output=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    out = result.stderr.decode()
    assert result.returncode == 48, out
    assert f"metrics.port: cannot listen on {HOST}:{port}" in out
    assert "listening on" not in out


def test_taken_default_metrics_port_falls_back_with_a_warning(
    tmp_path: pathlib.Path, default_metrics_port_held: int
) -> None:
    """No metrics port set and 9216 held by another process: serve starts anyway, metrics on
    a free port named by a warning (a port nobody chose must not stop startup)."""
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--in-memory", "--host", HOST,
             "--port", "0"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + GUARD_S
        while "listening on" not in log_path.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
        text = log_path.read_text()
        warning = re.search(
            rf"WARNING metrics: {HOST}:{default_metrics_port_held} is in use; serving metrics "
            r"on port (\d+) instead", text)
        assert warning, text
        port = int(warning.group(1))
        assert port != default_metrics_port_held
        assert f"metrics on http://{HOST}:{port}/metrics" in text
        assert f"metrics http://{HOST}:{port}/metrics" in text  # the `serving` line
        assert value(scrape(port), "cdcserver_requests_in_flight") == 0
    finally:
        server.terminate()
        assert server.wait(GUARD_S * 3) == 0


def test_taken_metrics_port_that_was_set_still_fails(default_metrics_port_held: int) -> None:
    """The same port set explicitly (flag, variable or file) is a choice: it must be free."""
    for how in (["--metrics-port", str(default_metrics_port_held)], []):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if not how:
            env["CDCSERVER_METRICS_PORT"] = str(default_metrics_port_held)
        result = subprocess.run(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--in-memory", "--host", HOST,
             "--port", "0", *how],
            capture_output=True, timeout=60, env=env,
        )
        out = result.stderr.decode()
        assert result.returncode == 48, out
        assert f"metrics.port: cannot listen on {HOST}:{default_metrics_port_held}" in out
        assert "listening on" not in out



def test_taken_wire_port_names_the_flag_and_leaves_no_trace(tmp_path: pathlib.Path) -> None:
    """27017 (here: any port) taken: exit 48 naming --port and --port 0, before anything is
    opened (no data directory made, no metrics line for a server that never ran)."""
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST,
             "--port", str(port), "--metrics-port", "0"],
            capture_output=True, timeout=60, cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    out = result.stderr.decode() + result.stdout.decode()
    assert result.returncode == 48, out
    assert f"server.port: cannot listen on {HOST}:{port}: address already in use" in out
    assert "--port N" in out and "--port 0" in out
    assert "metrics on" not in out and "listening on" not in out
    assert list(tmp_path.iterdir()) == []  # no ./cdcserver-data, nothing written
