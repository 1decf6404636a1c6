"""cdcserver.testing itself, and the server as a process: the `cdcserver serve` command,
tailing a growing file, graceful shutdown, and agreement with `cdcserver replay`."""

from __future__ import annotations

import signal
import time

import bson
from bson import json_util
from bson.timestamp import Timestamp
from pymongo import MongoClient

from cdcserver.cli import replay_events
from cdcserver.testing import append_oplog, rss_kib, write_oplog
from tests.support.oplog_builders import Oplog
from tests.support.server_support import ORDERS_EVENTS, World, describe, drain


def test_sample_fixture_agrees_with_replay(cdcserver_sample):
    """The server and `cdcserver replay` give the same events for the same oplog."""
    path = str(cdcserver_sample.oplog_paths[0])
    cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {}}]}
    first_ts = json_util.loads(open(path).readline())["ts"]
    cmd["pipeline"][0]["$changeStream"]["startAtOperationTime"] = first_ts
    replayed = [e for batch, _ in replay_events([path], cmd, "shop") for e in batch]
    assert replayed
    with MongoClient(cdcserver_sample.uri) as client, client.shop.watch(
        start_at_operation_time=first_ts, max_await_time_ms=50
    ) as stream:
        served = drain(stream, len(replayed))
        assert stream.try_next() is None
    assert [bson.decode(e.raw) for e in replayed] == served


def test_subprocess_follows_a_growing_json_file(cdcserver_factory, tmp_path):
    world = World.record(tmp_path / "oplog.jsonl")
    server = cdcserver_factory([world.path], mode="subprocess")
    world.server = server
    assert rss_kib(server.pid) > 0
    with MongoClient(server.uri) as client:
        with client.shop.orders.watch(
            start_at_operation_time=world.first_ts, max_await_time_ms=50
        ) as stream:
            assert [describe(e) for e in drain(stream, 8)] == ORDERS_EVENTS
            # A line written in two pieces is read once it is whole.
            world.oplog.insert("shop.orders", {"_id": "late"})
            line = world.path.with_suffix(".part.jsonl")
            write_oplog(line, world.oplog.entries[-1:])
            data = line.read_bytes()
            with open(world.path, "ab") as f:
                f.write(data[:20])
                f.flush()
                assert stream.try_next() is None
                f.write(data[20:])
            events = drain(stream, 1)
            assert [e["documentKey"] for e in events] == [{"_id": "late"}]
    assert "listening on 127.0.0.1" in server.log_text()
    server.stop()
    assert server.process.returncode == 0  # SIGTERM: a graceful shutdown


def test_subprocess_bson_file_and_sigint(cdcserver_factory, tmp_path):
    oplog = Oplog(start=Timestamp(1_750_000_000, 1))
    first = oplog.insert("a.b", {"_id": 1})["ts"]
    path = write_oplog(tmp_path / "oplog.bson", oplog.entries)
    server = cdcserver_factory([path], mode="subprocess")
    with MongoClient(server.direct_uri) as client:
        with client.a.b.watch(start_at_operation_time=first, max_await_time_ms=50) as stream:
            assert [e["documentKey"]["_id"] for e in drain(stream, 1)] == [1]
            oplog.insert("a.b", {"_id": 2})
            append_oplog(path, oplog.entries[-1:])
            assert [e["documentKey"]["_id"] for e in drain(stream, 1)] == [2]
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(30) == 0


def test_corrupt_append_stops_following_but_keeps_serving(cdcserver_factory, tmp_path, caplog):
    oplog = Oplog()
    first = oplog.insert("a.b", {"_id": 1})["ts"]
    path = write_oplog(tmp_path / "oplog.jsonl", oplog.entries)
    server = cdcserver_factory([path])  # in-process, following the file
    with open(path, "ab") as f:
        f.write(b"{not json\n")
    for _ in range(1000):  # the file is polled every few ms; this only bounds the wait
        if "stopped following" in caplog.text:
            break
        time.sleep(0.01)
    assert f"stopped following {path}: {path}:2: invalid JSON" in caplog.text
    with MongoClient(server.uri) as client:
        with client.a.b.watch(start_at_operation_time=first, max_await_time_ms=50) as stream:
            assert [e["documentKey"]["_id"] for e in drain(stream, 1)] == [1]
        assert client.admin.command("ping")["ok"] == 1.0


def test_thread_server_stops_cleanly(cdcserver_factory, tmp_path):
    world = World.record(tmp_path / "oplog.bson")
    server = cdcserver_factory([world.path])
    client = MongoClient(server.uri)
    stream = client.shop.orders.watch(max_await_time_ms=50)
    stream.try_next()
    assert len(server.cursor_ids()) == 1
    server.stop()
    server.stop()  # idempotent
    assert not server._thread.is_alive()
    client.close()
