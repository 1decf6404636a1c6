"""TTL indexes on the embedded store: one monitor pass run deterministically (`ttl_pass` with a
given `now`), and the oplog entries mongod 8.0 writes for TTL deletes."""

from __future__ import annotations

import datetime
import time

import pytest

from tests.support.embedded_support import EmbeddedServer

T0 = datetime.datetime(2024, 1, 1, 12, 0, 0)


@pytest.fixture
def server():
    s = EmbeddedServer(ttl_monitor_sleep_secs=0)  # passes are run by the test
    yield s
    s.stop()


def _pass(server: EmbeddedServer, now: datetime.datetime) -> int:
    return server.call(server.store.ttl_pass, now)


def test_expired_documents_are_deleted_with_one_batched_entry(server, client):
    coll = client.ttl.events
    coll.create_index("at", expireAfterSeconds=60)
    coll.insert_many([
        {"_id": 1, "at": T0},
        {"_id": 2, "at": T0 + datetime.timedelta(seconds=30)},
        {"_id": 3, "at": T0 + datetime.timedelta(seconds=120)},  # not yet expired
        {"_id": 4, "at": "not a date"},  # never expires
        {"_id": 5},
        {"_id": 6, "at": [T0 + datetime.timedelta(days=1), T0]},  # the earliest date counts
    ])
    mark = len(server.entries())
    assert _pass(server, T0 + datetime.timedelta(seconds=100)) == 3
    assert sorted(d["_id"] for d in coll.find()) == [3, 4, 5]
    entries = server.entries()[mark:]
    assert len(entries) == 1
    entry = entries[0]
    ui = server.call(lambda: server.store.get("ttl", "events").ui)
    assert list(entry) == ["op", "ns", "o", "ts", "t", "v", "wall"]
    assert (entry["op"], entry["ns"]) == ("c", "admin.$cmd")
    assert entry["o"] == {"applyOps": [
        {"op": "d", "ns": "ttl.events", "ui": ui, "o": {"_id": i}} for i in (1, 6, 2)
    ]}


def test_a_single_expired_document_is_a_plain_delete(server, client):
    coll = client.ttl.one
    coll.create_index("at", expireAfterSeconds=0)
    coll.insert_many([{"_id": 1, "at": T0}, {"_id": 2, "at": T0 + datetime.timedelta(hours=1)}])
    mark = len(server.entries())
    assert _pass(server, T0) == 1
    (entry,) = server.entries()[mark:]
    assert (entry["op"], entry["ns"], entry["o"]) == ("d", "ttl.one", {"_id": 1})
    assert "lsid" not in entry


def test_collections_with_pre_images_get_one_delete_per_document(server, client):
    db = client.ttl
    db.create_collection("images", changeStreamPreAndPostImages={"enabled": True})
    db.images.create_index("at", expireAfterSeconds=1)
    db.images.insert_many([{"_id": i, "at": T0} for i in range(3)])
    mark = len(server.entries())
    assert _pass(server, T0 + datetime.timedelta(seconds=5)) == 3
    entries = server.entries()[mark:]
    assert [(e["op"], e["o"]) for e in entries] == [("d", {"_id": i}) for i in range(3)]
    images = server.call(server.store.pre_image_documents)
    assert [d["preImage"]["_id"] for d in images] == [0, 1, 2]


def test_large_passes_are_split_into_batches_of_100(server, client):
    coll = client.ttl.many
    coll.create_index("at", expireAfterSeconds=0)
    coll.insert_many([{"_id": i, "at": T0} for i in range(250)])
    mark = len(server.entries())
    assert _pass(server, T0) == 250
    sizes = [len(e["o"]["applyOps"]) for e in server.entries()[mark:]]
    assert sizes == [100, 100, 50]
    assert coll.count_documents({}) == 0


def test_change_streams_see_ttl_deletes(server, client):
    coll = client.ttl.watched
    coll.create_index("at", expireAfterSeconds=0)
    coll.insert_many([{"_id": 1, "at": T0}, {"_id": 2, "at": T0}])
    with coll.watch() as stream:
        _pass(server, T0)
        events = [stream.next(), stream.next()]
    assert [(e["operationType"], e["documentKey"]) for e in events] == [
        ("delete", {"_id": 1}), ("delete", {"_id": 2}),
    ]
    assert events[0]["clusterTime"] == events[1]["clusterTime"]


def test_the_monitor_runs_on_its_own_and_stops_with_the_server():
    # A running server's monitor (here every 50 ms) deletes an expired document by itself; a
    # change stream sees the delete, so the test waits on the event, not on a clock.
    s = EmbeddedServer(ttl_monitor_sleep_secs=0.05)
    try:
        with s.client() as c:
            coll = c.ttl.auto
            coll.create_index("at", expireAfterSeconds=0)
            with coll.watch(max_await_time_ms=200) as stream:
                coll.insert_one({"_id": 1, "at": T0})
                ops = [stream.next()["operationType"] for _ in range(2)]
            assert ops == ["insert", "delete"]
            assert coll.count_documents({}) == 0
    finally:
        s.stop()


def test_set_parameter_stops_and_restarts_the_monitor():
    # ttlMonitorEnabled: false makes mongod's TTLMonitor::run skip its passes; true again, the
    # next pass deletes what expired meanwhile.
    s = EmbeddedServer(ttl_monitor_sleep_secs=0.05)
    try:
        with s.client() as c:
            admin = c.admin
            assert admin.command("setParameter", 1, ttlMonitorEnabled=False)["was"] is True
            got = admin.command("getParameter", 1, ttlMonitorEnabled=1)
            assert got["ttlMonitorEnabled"] is False
            coll = c.ttl.paused
            coll.create_index("at", expireAfterSeconds=0)
            coll.insert_one({"_id": 1, "at": T0})
            time.sleep(0.5)  # ten intervals of the monitor: no pass ran
            assert coll.count_documents({}) == 1
            with coll.watch(max_await_time_ms=200) as stream:
                assert admin.command("setParameter", 1, ttlMonitorEnabled=True)["was"] is False
                assert stream.next()["operationType"] == "delete"
            assert coll.count_documents({}) == 0
    finally:
        s.stop()
