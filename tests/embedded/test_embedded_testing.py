"""cdcserver.testing for the embedded store: fixtures that start it (in memory, durable, as a
process) on a free port, and recording a run's oplog to a file that `cdcserver serve --oplog`
and `cdcserver replay` replay with the same events."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import bson
from bson import json_util
from pymongo import CursorType, MongoClient

from cdcserver.cli import replay_events
from cdcserver.testing import (
    EmbeddedServer,
    OplogRecorder,
    SubprocessServer,
    append_oplog,
    read_oplog,
    record_oplog,
    write_oplog,
)


def _drain(stream, n):
    got = []
    while len(got) < n:
        event = stream.try_next()
        if event is not None:
            got.append(event)
    return got


def _workload(coll):
    coll.insert_many([{"_id": i, "n": i} for i in range(3)])
    coll.update_one({"_id": 1}, {"$inc": {"n": 10}, "$set": {"tag": "x"}})
    coll.replace_one({"_id": 2}, {"r": True})
    coll.delete_one({"_id": 0})


WORKLOAD_OPS = ["insert", "insert", "insert", "update", "replace", "delete"]


def test_uri_fixture_serves_writes_and_watch(cdcserver_uri):
    with MongoClient(cdcserver_uri) as client:  # replica-set discovery from hello
        coll = client.app.orders
        with coll.watch(max_await_time_ms=50) as stream:
            _workload(coll)
            events = _drain(stream, 6)
    assert [e["operationType"] for e in events] == WORKLOAD_OPS


def test_embedded_fixture_exposes_the_store(cdcserver_embedded):
    with cdcserver_embedded.client() as client:
        client.app.c.insert_one({"_id": 1})
    assert cdcserver_embedded.store.get("app", "c") is not None
    assert [e["op"] for e in cdcserver_embedded.entries()] == ["n", "c", "i"]
    assert cdcserver_embedded.data_dir is None


def test_durable_fixture_survives_a_restart(cdcserver_embedded_durable):
    server = cdcserver_embedded_durable
    with server.client() as client:
        _workload(client.app.c)
    before = server.entries()
    server.stop()
    with EmbeddedServer(server.data_dir) as again, again.client() as client:
        assert list(client.app.c.find()) == [{"_id": 1, "n": 11, "tag": "x"}, {"_id": 2, "r": True}]
        assert again.entries() == before


def test_factory_starts_the_embedded_store_without_oplog_files(cdcserver_factory, tmp_path):
    memory = cdcserver_factory()
    assert isinstance(memory, EmbeddedServer)
    durable = cdcserver_factory(data_dir=tmp_path / "d")
    with memory.client() as a, durable.client() as b:
        a.x.c.insert_one({"_id": 1})
        b.x.c.insert_one({"_id": 2})
        assert a.x.c.find_one() == {"_id": 1} and b.x.c.find_one() == {"_id": 2}
    assert (tmp_path / "d" / "cdcserver.sqlite3").exists()


def test_factory_subprocess_embedded(cdcserver_factory, tmp_path):
    server = cdcserver_factory(mode="subprocess", data_dir=tmp_path / "data")
    assert isinstance(server, SubprocessServer) and "--data-dir" in server.args
    with MongoClient(server.uri) as client:
        coll = client.app.c
        with coll.watch(max_await_time_ms=50) as stream:
            _workload(coll)
            assert [e["operationType"] for e in _drain(stream, 6)] == WORKLOAD_OPS
    server.stop()
    assert server.process.returncode == 0
    again = cdcserver_factory(mode="subprocess", data_dir=tmp_path / "data")
    with MongoClient(again.uri) as client:
        assert client.app.c.count_documents({}) == 2
    memory = cdcserver_factory(mode="subprocess")
    assert "--in-memory" in memory.args


def test_recorded_run_replays_with_the_same_events(cdcserver_embedded, cdcserver_factory,
                                                   tmp_path):
    server = cdcserver_embedded
    with server.client() as client:
        client.app.setup.insert_one({"_id": "before"})  # not part of the recording
        with OplogRecorder(server, tmp_path / "run.bson") as recorder:
            coll = client.app.orders
            with coll.watch(max_await_time_ms=50) as stream:
                _workload(coll)
                live = _drain(stream, 6)
    assert recorder.count == 7  # the create and the six writes
    entries = bson.decode_all(recorder.path.read_bytes())
    assert entries == server.entries()[-7:]

    # `cdcserver serve --oplog run.bson`
    replay_server = cdcserver_factory(recorder.path, follow=False)
    first_ts = entries[0]["ts"]
    with MongoClient(replay_server.uri) as client, client.app.orders.watch(
        start_at_operation_time=first_ts, max_await_time_ms=50
    ) as stream:
        served = _drain(stream, 6)
        assert stream.try_next() is None
    assert served == live  # the same events, tokens and all

    # `cdcserver replay --oplog run.bson`
    cmd = {"aggregate": "orders", "pipeline": [{"$changeStream": {}}]}
    replayed = [bson.decode(e.raw) for b, _ in replay_events([str(recorder.path)], cmd, "app")
                for e in b]
    assert replayed == live
    out = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "replay", "--oplog", str(recorder.path),
         "--ns", "app.orders"],
        capture_output=True, check=True, timeout=60,
    ).stdout.decode()
    lines = [json_util.loads(line) for line in out.splitlines()]
    assert [e["operationType"] for e in lines] == WORKLOAD_OPS
    assert [e["_id"] for e in lines] == [e["_id"] for e in live]


def test_record_whole_oplog_and_as_json(cdcserver_embedded, cdcserver_record_oplog, tmp_path):
    with cdcserver_embedded.client() as client:
        client.a.b.insert_one({"_id": 1})
    path = cdcserver_record_oplog(cdcserver_embedded)
    assert path == tmp_path / "oplog.bson"
    assert bson.decode_all(path.read_bytes()) == cdcserver_embedded.entries()
    as_json = record_oplog(cdcserver_embedded.uri, tmp_path / "oplog.jsonl")
    lines = [json_util.loads(line) for line in as_json.read_text().splitlines()]
    assert [e["op"] for e in lines] == ["n", "c", "i"]
    since = lines[1]["ts"]
    assert [e["op"] for e in read_oplog(cdcserver_embedded, since=since)] == ["i"]


def test_a_tailer_chains_two_servers(cdcserver_embedded, cdcserver_factory, tmp_path):
    """An oplog tailer using cdcserver as its upstream: it tails server A's local.oplog.rs
    (tailable + awaitData) into a file that server B follows; B's change streams see A's
    writes."""
    upstream = cdcserver_embedded
    path = record_oplog(upstream, tmp_path / "mirror.bson")
    downstream = cdcserver_factory(path, follow=True)
    stop = threading.Event()
    copied: list[int] = []

    def tail() -> None:
        with upstream.client() as client:
            last = bson.decode_all(path.read_bytes())[-1]["ts"]
            cursor = client.local["oplog.rs"].find(
                {"ts": {"$gt": last}}, cursor_type=CursorType.TAILABLE_AWAIT
            ).max_await_time_ms(50)
            while not stop.is_set() and cursor.alive:
                batch = list(cursor)
                if batch:
                    append_oplog(path, batch)
                    copied.append(len(batch))
            cursor.close()

    tailer = threading.Thread(target=tail)
    tailer.start()
    try:
        with upstream.client() as a, MongoClient(downstream.uri) as b:
            with b.app.orders.watch(max_await_time_ms=50) as stream:
                _workload(a.app.orders)
                events = _drain(stream, 6)
    finally:
        stop.set()
        tailer.join(30)
    assert [e["operationType"] for e in events] == WORKLOAD_OPS
    assert sum(copied) == 7


def test_record_option_writes_one_file_per_test(tmp_path):
    test_file = tmp_path / "test_app.py"
    test_file.write_text(textwrap.dedent("""
        from pymongo import MongoClient

        def test_one(cdcserver_uri):
            with MongoClient(cdcserver_uri) as client:
                client.shop.orders.insert_one({"_id": 1})

        def test_two(cdcserver_factory):
            server = cdcserver_factory()
            with server.client() as client:
                client.shop.orders.insert_many([{"_id": 1}, {"_id": 2}])
    """))
    out = tmp_path / "recorded"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "cdcserver.testing", "-p",
         "no:cacheprovider", "--rootdir", str(tmp_path), "--cdcserver-record-oplog", str(out),
         str(test_file)],
        capture_output=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    files = sorted(p.name for p in out.iterdir())
    assert files == ["test_app.py_test_one.bson", "test_app.py_test_two.bson"]
    two = bson.decode_all((out / "test_app.py_test_two.bson").read_bytes())
    assert [e["op"] for e in two] == ["n", "c", "i", "i"]
    replay = write_oplog(tmp_path / "copy.bson", two)
    cmd = {"aggregate": "orders", "pipeline": [{"$changeStream": {}}]}
    events = [e for b, _ in replay_events([str(replay)], cmd, "shop") for e in b]
    assert [e["documentKey"]["_id"] for e in events] == [1, 2]
