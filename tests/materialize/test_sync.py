"""The copy's life: initial sync, restarts (also after SIGKILL, during the clone and during
apply), a lost upstream position (re-synced, logged), and pruning with the retained log.

A is cdcserver's embedded store; B the sidecar (`serve --upstream` with `retain_dir` and
`materialize`), in its own process where it is killed. After each scenario the copy, read as of
the last entry applied, equals A's collections byte for byte.
"""

from __future__ import annotations

import logging
import pathlib
import sqlite3
import time
from typing import Any

import pytest
from pymongo import MongoClient

from cdcserver.materialize.store import FILE_NAME, CopyStore
from cdcserver.sources.mongo_common import next_ts
from tests.materialize.support import GUARD_S, MaterializedSidecar, raw_client, sorted_raw
from tests.materialize.test_images import series, with_images_of
from tests.server.test_retained_history import Sidecar
from tests.server.test_upstream import drain_until, latest_ts, watch
from tests.support.embedded_support import EmbeddedServer

MATERIALIZE = {"CDCSERVER_UPSTREAM_MATERIALIZE": '["shop.*", "crm.accounts"]'}
NAMESPACES = [("shop", "orders"), ("shop", "items"), ("shop", "on"), ("shop", "off"),
              ("crm", "accounts")]


def copy_meta(retain_dir: pathlib.Path, key: str) -> Any:
    """A value of the copy's meta table, read beside the running B (WAL: a reader is fine)."""
    path = retain_dir / FILE_NAME
    if not path.exists():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=GUARD_S)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError:  # the schema is not there yet
        return None
    finally:
        db.close()
    return None if row is None else row[0]


def version_rows(retain_dir: pathlib.Path) -> int:
    db = sqlite3.connect(f"file:{retain_dir / FILE_NAME}?mode=ro", uri=True, timeout=GUARD_S)
    try:
        return int(db.execute("SELECT count(*) FROM versions").fetchone()[0])
    finally:
        db.close()


def wait_copy(retain_dir: pathlib.Path, ts: Any) -> None:
    """Until the copy is ready and has applied every entry up to `ts`."""
    want = (ts.time << 32) | ts.inc
    deadline = time.monotonic() + GUARD_S * 3
    while True:
        applied = copy_meta(retain_dir, "applied")
        if copy_meta(retain_dir, "state") == "ready" and applied is not None and applied >= want:
            return
        assert time.monotonic() < deadline, f"copy at {applied}, A at {ts}"
        time.sleep(0.02)


def assert_copy_equals(retain_dir: pathlib.Path, ca: MongoClient) -> None:
    """With B stopped: the copy as of its last applied entry is A's collections."""
    store = CopyStore(str(retain_dir))
    try:
        applied = store.meta_ts("applied")
        assert applied is not None
        for db, coll in NAMESPACES:
            cid = store.collection_at(db, coll, applied)
            mine = [] if cid is None else list(store.documents_at(cid, applied))
            assert mine == sorted_raw(ca, db, coll), f"{db}.{coll}"
        assert store.collection_at("crm", "leads", applied) is None  # not materialized
    finally:
        store.close()


def workload(ca: MongoClient, start: int, n: int) -> None:
    for i in range(start, start + n):
        ca.shop.orders.insert_one({"_id": i, "qty": i, "tags": ["a"]})
        ca.shop.orders.update_one({"_id": i}, {"$inc": {"qty": 1}, "$push": {"tags": "b"}})
        if i % 3 == 0:
            ca.shop.orders.replace_one({"_id": i}, {"replaced": i})
        if i % 4 == 0:
            ca.shop.orders.delete_one({"_id": i - 1})
        ca.crm.accounts.update_one({"_id": i % 5}, {"$set": {"last": i}}, upsert=True)
        ca.crm.leads.insert_one({"_id": i})
        for twin in ("on", "off"):  # the same writes; images enabled on A for `on` only
            ca.shop[twin].update_one({"_id": i % 4}, {"$inc": {"n": 1}, "$push": {"h": i}},
                                     upsert=True)
    with ca.start_session() as session:
        session.with_transaction(lambda s: (
            ca.shop.items.insert_one({"_id": f"t{start}"}, session=s),
            ca.shop.orders.update_many({}, {"$inc": {"all": 1}}, session=s),
        ))


@pytest.fixture
def a_server():
    a = EmbeddedServer()
    try:
        yield a
    finally:
        a.stop()


def test_killed_during_apply_continues_from_the_last_applied_entry(a_server, tmp_path):
    a, ca = a_server, raw_client(a_server.uri)
    ca.shop.create_collection("on", changeStreamPreAndPostImages={"enabled": True})
    workload(ca, 0, 10)  # cloned
    retain_dir, log_path = tmp_path / "b", tmp_path / "b.log"
    b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
    try:
        wait_copy(retain_dir, latest_ts(a))
        t0 = next_ts(latest_ts(a))
        behind = 0  # kills that found the copy behind A (killed while applying)
        for start in (10, 30, 50):
            workload(ca, start, 20)
            b.kill()  # at once: B is still tailing and applying the last writes
            ts = latest_ts(a)
            behind += int(copy_meta(retain_dir, "applied") < ((ts.time << 32) | ts.inc))
            rows_before = version_rows(retain_dir)
            b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
            wait_copy(retain_dir, latest_ts(a))
            assert version_rows(retain_dir) >= rows_before
        assert behind >= 1, "no kill landed while the copy was applying"
        # The images of every write across the kills, from the restarted copy: what A gives
        # for the same writes on its images-enabled twin.
        end = latest_ts(a)
        opts = {"full_document": "whenAvailable", "full_document_before_change": "whenAvailable",
                "start_at_operation_time": t0}
        a_events = drain_until(watch(ca, "shop", opts), end)
        with raw_client(b.uri) as cb:
            b_off = series(drain_until(watch(cb, "shop", opts), end), ("off",))
        a_on, a_off = series(a_events, ("on",)), series(a_events, ("off",))
        assert len(b_off) == len(a_on) == 60
        assert [e.raw for e in b_off] == [with_images_of(x, y) for x, y in zip(a_off, a_on)]
    finally:
        b.stop()
    assert log_path.read_text().count("materialize: initial sync of") == 1, "never re-synced"
    assert_copy_equals(retain_dir, ca)


def test_killed_during_the_initial_sync_starts_it_over(a_server, tmp_path):
    a, ca = a_server, raw_client(a_server.uri)
    big = [{"_id": i, "pad": "x" * 200} for i in range(40_000)]
    for k in range(0, len(big), 5000):
        ca.shop.items.insert_many(big[k:k + 5000])
    workload(ca, 0, 5)
    retain_dir, log_path = tmp_path / "b", tmp_path / "b.log"
    b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
    try:
        deadline = time.monotonic() + GUARD_S
        while copy_meta(retain_dir, "state") != "cloning" or version_rows(retain_dir) == 0:
            assert copy_meta(retain_dir, "state") != "ready", "the clone ended before the kill"
            assert time.monotonic() < deadline, "B did not start cloning"
            time.sleep(0.002)
        b.kill()
        assert copy_meta(retain_dir, "state") == "cloning"
        workload(ca, 5, 10)  # while B is down
        b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
        workload(ca, 15, 5)
        wait_copy(retain_dir, latest_ts(a))
    finally:
        b.stop()
    text = log_path.read_text()
    assert "the previous initial sync was interrupted: starting over" in text
    assert_copy_equals(retain_dir, ca)


def test_a_lost_upstream_position_is_synced_again(tmp_path, caplog):
    """B stopped, A's small oplog rolls past B's last entry: the retained log is emptied at
    the gap, and the copy (which could not cross it) is synced again, logged."""
    a = EmbeddedServer(oplog_size_bytes=64 * 1024)
    try:
        ca = raw_client(a.uri)
        workload(ca, 0, 5)
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*", "crm.accounts"])
        try:
            b.wait_applied(latest_ts(a))
        finally:
            b.stop()
        for i in range(200):  # far more than A's oplog holds
            ca.shop.orders.update_one({"_id": 1}, {"$set": {"pad": "p" * 1000, "i": i}},
                                      upsert=True)
        workload(ca, 5, 5)
        with caplog.at_level(logging.ERROR, logger="cdcserver.materialize.sync"):
            b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*", "crm.accounts"])
            try:
                workload(ca, 10, 3)
                b.wait_applied(latest_ts(a))
                assert b.call(lambda: b.materializer.resyncs) == 1
            finally:
                b.stop()
        assert any("synced again" in r.getMessage() for r in caplog.records)
        assert_copy_equals(tmp_path / "b", ca)
    finally:
        a.stop()


def test_versions_are_kept_as_long_as_the_retained_log(tmp_path):
    """Each write is a version; once the retained log drops entries, the versions no read at
    or after its oldest entry can need go, and every document keeps the version it had."""
    a = EmbeddedServer()
    try:
        ca = raw_client(a.uri)
        ca.shop.orders.insert_many([{"_id": i, "v": 0} for i in range(5)])
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"])
        try:
            b.wait_applied(latest_ts(a))
            for v in range(1, 6):
                ca.shop.orders.update_many({}, {"$set": {"v": v}})
            ca.shop.orders.delete_one({"_id": 0})
            b.wait_applied(latest_ts(a))
            m = b.materializer
            assert b.call(lambda: m.store.stats()["versions"]) == 5 + 5 * 5 + 1
            # As if retention had dropped every entry but the newest two: prune to there.
            retained = b.source.retained
            assert retained is not None
            oldest = b.call(lambda: retained.newest(None, 2)[-1][0])
            b.call(lambda: (m.store.begin(), m.store.prune(oldest), m.store.commit()))
            # Documents 0-3: their last update (before `oldest`); document 4: its last update
            # (at `oldest`); document 0's deletion (after it).
            assert b.call(lambda: m.store.stats()["versions"]) == 4 + 1 + 1
            assert b.documents("shop", "orders") == sorted_raw(ca, "shop", "orders")
            assert b.documents("shop", "orders", at=next_ts(oldest)) == sorted_raw(
                ca, "shop", "orders")
        finally:
            b.stop()
    finally:
        a.stop()


def test_an_upstream_rollback_the_copy_had_applied_is_synced_again(tmp_path):
    """A restored from an older copy of its data directory (what it wrote after that copy is
    gone, as after a rollback): B's retained log drops the entries past the copy; B's copy,
    which had applied them, is synced again (logged) and equals the restored A."""
    import shutil

    a_dir = tmp_path / "a"
    a = EmbeddedServer(a_dir)
    retain_dir, log_path = tmp_path / "b", tmp_path / "b.log"
    b = None
    try:
        ca = raw_client(a.uri)
        workload(ca, 0, 5)
        a.stop()
        shutil.copytree(a_dir, tmp_path / "a-copy", ignore=shutil.ignore_patterns("*.lock"))
        a = EmbeddedServer(a_dir)
        ca = raw_client(a.uri)
        b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
        wait_copy(retain_dir, latest_ts(a))
        workload(ca, 5, 5)  # to be rolled back: B's copy applies it
        wait_copy(retain_dir, latest_ts(a))
        b.kill()
        a.stop()
        a = EmbeddedServer(tmp_path / "a-copy")
        ca = raw_client(a.uri)
        workload(ca, 100, 3)  # A's new history
        b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
        deadline = time.monotonic() + GUARD_S
        while log_path.read_text().count("materialize: cloned") < 2:
            assert time.monotonic() < deadline, "B's copy was not synced again"
            time.sleep(0.02)
        wait_copy(retain_dir, latest_ts(a))
    finally:
        if b is not None:
            b.stop()
        a.stop()
    text = log_path.read_text()
    assert "(a rollback)" in text
    assert "materialize: the copy applied entries" in text or "rolled back entries" in text
    a = EmbeddedServer(tmp_path / "a-copy")
    try:
        assert_copy_equals(retain_dir, raw_client(a.uri))
    finally:
        a.stop()


KINDS = ["insert", "set", "push", "unset", "replace", "delete", "txn"]


def random_ops(rng: Any, n: int) -> list[tuple[str, int, int]]:
    return [(rng.choice(KINDS), rng.randrange(6), rng.randrange(10)) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_snapshot_then_stream_across_sigkills(a_server, tmp_path, seed):
    """Generated workloads (seeded), the sidecar SIGKILLed during its initial sync and twice
    while applying them; then a snapshot at a time from before the last kill, plus the stream
    from just after it, is A's final state byte for byte, every change after T once."""
    import random

    from cdcserver.materialize.client import snapshot_then_watch
    from pipeline_stages import resume_token as rt
    from pipeline_stages.image_source import equality_key
    from tests.materialize.test_snapshot import fold, run, writes_after

    rng = random.Random(seed)
    a, ca = a_server, raw_client(a_server.uri)
    for k in range(0, 30_000, 5000):  # a clone long enough to be killed in
        ca.shop.items.insert_many([{"_id": i, "pad": "x" * 200} for i in range(k, k + 5000)])
    ca.shop.create_collection("w")
    run(ca, "w", random_ops(rng, 10))
    retain_dir, log_path = tmp_path / "b", tmp_path / "b.log"
    b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
    try:
        deadline = time.monotonic() + GUARD_S
        while copy_meta(retain_dir, "state") != "cloning":
            assert time.monotonic() < deadline, "B did not start cloning"
            time.sleep(0.002)
        b.kill()
        t = None
        for part in range(2):
            b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
            if part == 0:  # the clone starts over: T is taken once it is consistent
                wait_copy(retain_dir, latest_ts(a))
            run(ca, "w", random_ops(rng, 15))
            if part == 0:
                t = latest_ts(a)
            b.kill()  # while it applies what was just written
        b = Sidecar(a.uri, retain_dir, log_path, **MATERIALIZE)
        wait_copy(retain_dir, latest_ts(a))
        assert t is not None
        with raw_client(b.uri) as cb:
            docs, at, stream = snapshot_then_watch(cb.shop.w, at_cluster_time=t,
                                                   full_document="whenAvailable",
                                                   max_await_time_ms=50)
            with stream:
                run(ca, "w", random_ops(rng, 15))
                end = latest_ts(a)
                events = drain_until(stream, end)
        state = {equality_key(d["_id"]): d for d in docs}
        for event in events:
            fold(state, event)
        assert [state[k].raw for k in sorted(state)] == sorted_raw(ca, "shop", "w")
        tokens = [e["_id"]["_data"] for e in events]
        assert len(tokens) == len(set(tokens))
        assert all(rt.decode(e["_id"]).cluster_time > at for e in events)
        assert len(events) == writes_after(a, "w", at, end)
    finally:
        b.stop()
    assert "the previous initial sync was interrupted" in log_path.read_text()


def test_ddl_drop_recreate_rename_and_drop_database(tmp_path):
    """The catalog follows the upstream's DDL: a dropped and re-created name is the new
    collection (a read before the drop still sees the old one), a rename keeps the documents
    under the new name, a rename out of the patterns stops following it, dropDatabase drops
    every collection, and a rename into the patterns of a collection never copied re-syncs."""
    a = EmbeddedServer()
    b = None
    try:
        ca = raw_client(a.uri)
        ca.shop.x.insert_many([{"_id": i} for i in range(3)])
        ca.crm.accounts.insert_one({"_id": "acc"})
        ca.crm.leads.insert_one({"_id": "lead"})  # not materialized
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*", "crm.accounts"])
        b.wait_applied(latest_ts(a))
        before_drop = latest_ts(a)
        ca.shop.x.drop()
        ca.shop.x.insert_one({"_id": "new"})
        ca.shop.command("collMod", "x", validationLevel="moderate")
        ca.shop.x.create_index("v")
        ca.shop.y.insert_many([{"_id": 1}, {"_id": 2}])
        ca.shop.y.rename("z")
        ca.shop.z.update_one({"_id": 1}, {"$set": {"renamed": True}})
        ca.admin.command("renameCollection", "shop.z", to="other.z")  # out of the patterns
        b.wait_applied(latest_ts(a))
        assert b.documents("shop", "x") == sorted_raw(ca, "shop", "x")
        assert len(b.documents("shop", "x", at=before_drop)) == 3  # the old one, then
        assert b.documents("shop", "z") == [] and b.documents("other", "z") == []
        ca.drop_database("shop")
        b.wait_applied(latest_ts(a))
        assert b.documents("shop", "x") == []
        assert b.call(lambda: b.materializer.resyncs) == 0
        ca.admin.command("renameCollection", "crm.leads", to="crm.accounts", dropTarget=True)
        ca.crm.accounts.update_one({"_id": "lead"}, {"$set": {"moved": 1}})
        b.wait_applied(latest_ts(a))
        assert b.call(lambda: b.materializer.resyncs) == 1  # it never had crm.leads' documents
        assert b.documents("crm", "accounts") == sorted_raw(ca, "crm", "accounts")
    finally:
        if b is not None:
            b.stop()
        a.stop()


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_writes_during_the_clone_are_applied_idempotently(tmp_path, seed):
    """Writes racing the clone (between T0 and the consistent point: inserts of documents the
    clone already read, updates and deletes of ones it read before or after them, array diffs
    applied to documents from their future) still end in a copy equal to the upstream."""
    import random
    import threading

    a = EmbeddedServer()
    b = None
    stop = threading.Event()
    try:
        ca = raw_client(a.uri)
        n = 20_000
        for k in range(0, n, 5000):
            ca.shop.big.insert_many([{"_id": i, "arr": [0, 1], "v": 0, "pad": "p" * 100}
                                     for i in range(k, k + 5000)])
        rng = random.Random(seed)
        writes = [0]

        def writer() -> None:
            with raw_client(a.uri) as c:
                coll = c.shop.big
                while not stop.is_set():
                    i = rng.choice([rng.randrange(50), rng.randrange(n)])  # hot ones, and any
                    kind = rng.randrange(6)
                    if kind == 0:
                        coll.update_one({"_id": i}, {"$push": {"arr": rng.randrange(9)}})
                    elif kind == 1:
                        coll.update_one({"_id": i}, {"$pop": {"arr": 1}})
                    elif kind == 2:
                        coll.update_one({"_id": i}, {"$set": {"v": rng.randrange(9),
                                                              "sub.x": 1}})
                    elif kind == 3:
                        coll.update_one({"_id": i}, {"$unset": {"sub": ""}})
                    elif kind == 4:
                        coll.delete_one({"_id": i})
                    else:
                        coll.replace_one({"_id": i}, {"arr": [rng.randrange(9)], "r": 1},
                                         upsert=True)
                    writes[0] += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"])
        m = b.materializer
        deadline = time.monotonic() + GUARD_S * 3
        while b.call(lambda: m.state) != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        during = writes[0]
        time.sleep(0.2)  # and some after the consistent point
        stop.set()
        thread.join(GUARD_S)
        b.wait_applied(latest_ts(a))
        assert during > 50, "the writes did not race the clone"
        assert b.documents("shop", "big") == sorted_raw(ca, "shop", "big")
    finally:
        stop.set()
        if b is not None:
            b.stop()
        a.stop()
