"""Snapshot reads of the sidecar's copy, and the snapshot-then-stream recipe.

A snapshot at T (now, or any earlier time the sidecar retains) plus the change stream from
just after T is the collection's final state on the upstream, with no change duplicated or
missing: checked as a property over generated workloads (hypothesis), the snapshot taken in the
middle of them and the stream folded onto it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient, errors

from cdcserver.materialize.client import after, snapshot, snapshot_then_watch
from cdcserver.sources.mongo_common import RAW
from pipeline_stages import resume_token as rt
from pipeline_stages.image_source import equality_key
from pipeline_stages.oplog_entry import iter_entries
from tests.materialize.support import MaterializedSidecar, raw_client, sorted_raw
from tests.server.test_upstream import drain_until, latest_ts
from tests.support.embedded_support import EmbeddedServer


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, Any]]:
    a = EmbeddedServer()
    b = None
    try:
        raw_client(a.uri).shop.seed.insert_one({"_id": 0})
        b = MaterializedSidecar(a.uri, str(tmp_path_factory.mktemp("b")), ["shop.*"])
        b.wait_applied(latest_ts(a))
        yield a, b
    finally:
        if b is not None:
            b.stop()
        a.stop()


def snapshot_cmd(client: MongoClient, coll: str, at: Timestamp | None = None,
                 **fields: Any) -> dict[str, Any]:
    rc: dict[str, Any] = {"level": "snapshot"}
    if at is not None:
        rc["atClusterTime"] = at
    return client.shop.command({"find": coll, "readConcern": rc, **fields},
                               codec_options=RAW)


def test_a_read_at_each_past_time_sees_that_time(pair):
    a, b = pair
    ca = raw_client(a.uri)
    coll = ca.shop.timeline
    coll.insert_many([{"_id": i, "v": 0} for i in range(3)])
    times, states = [], []
    for v in range(1, 5):
        coll.update_many({}, {"$set": {"v": v}})
        coll.delete_one({"_id": v % 3}) if v == 3 else None
        times.append(latest_ts(a))
        states.append(sorted_raw(ca, "shop", "timeline"))
    b.wait_applied(latest_ts(a))
    with raw_client(b.direct_uri) as cb:
        for at, state in zip(times, states):
            reply = snapshot_cmd(cb, "timeline", at)
            assert reply["cursor"]["atClusterTime"] == at
            assert reply["operationTime"] == at
            assert [d.raw for d in reply["cursor"]["firstBatch"]] == state
        # a snapshot session: its first read picks the time, the next ones read at it
        with cb.start_session(snapshot=True) as session:
            first = [d.raw for d in cb.shop.timeline.find({}, session=session)]
            coll.insert_one({"_id": "later"})
            b.wait_applied(latest_ts(a))
            again = [d.raw for d in cb.shop.timeline.find({}, session=session)]
            assert first == again == states[-1]
        # filters, sorts, projections, batches and pipelines run on the copy at that time
        reply = snapshot_cmd(cb, "timeline", times[0], filter={"_id": {"$gte": 1}},
                             sort={"_id": -1}, projection={"v": 1}, batchSize=1)
        assert [dict(d) for d in reply["cursor"]["firstBatch"]] == [{"_id": 2, "v": 1}]
        more = cb.shop.command("getMore", reply["cursor"]["id"], collection="timeline")
        assert [dict(d) for d in more["cursor"]["nextBatch"]] == [{"_id": 1, "v": 1}]
        counted = cb.shop.command({
            "aggregate": "timeline", "pipeline": [{"$match": {"v": 1}}, {"$count": "n"}],
            "cursor": {}, "readConcern": {"level": "snapshot", "atClusterTime": times[0]}})
        assert [dict(d) for d in counted["cursor"]["firstBatch"]] == [{"n": 3}]
        values = cb.shop.command({"distinct": "timeline", "key": "v", "query": {"_id": {"$lt": 2}},
                                  "readConcern": {"level": "snapshot", "atClusterTime": times[1]}})
        assert values["values"] == [2] and values["atClusterTime"] == times[1]
        assert values["operationTime"] == times[1]
        ca.shop.words.insert_one({"_id": 1, "s": "a"})
        b.wait_applied(latest_ts(a))
        plain = snapshot_cmd(cb, "words", filter={"s": "A"})
        folded = snapshot_cmd(cb, "words", filter={"s": "A"},
                              collation={"locale": "en", "strength": 2})
        assert len(plain["cursor"]["firstBatch"]) == 0
        assert len(folded["cursor"]["firstBatch"]) == 1


def test_reads_outside_the_copys_range(pair):
    a, b = pair
    with raw_client(b.direct_uri) as cb:
        with pytest.raises(errors.OperationFailure) as old:
            snapshot_cmd(cb, "seed", Timestamp(1, 1))
        assert old.value.code == 239
        with pytest.raises(errors.OperationFailure) as future:
            snapshot_cmd(cb, "seed", Timestamp(latest_ts(a).time + 3600, 1))
        assert future.value.code == 72
        # $out / $merge at snapshot: run by the upstream (mongod 8.0 accepts them; the copy
        # cannot write), which writes the collection
        for stage in ({"$out": "seed_out"}, {"$merge": {"into": "seed_merged"}}):
            reply = cb.shop.command({"aggregate": "seed", "cursor": {}, "pipeline": [stage],
                                     "readConcern": {"level": "snapshot"}})
            assert reply["ok"] == 1.0
        ca = raw_client(a.uri)
        for name in ("seed_out", "seed_merged"):
            assert [bytes(d.raw) for d in ca.shop[name].find({})] == sorted_raw(ca, "shop",
                                                                                "seed")
        ca.close()
        # not materialized, or not a snapshot read: the upstream answers
        reply = cb.other.command({"find": "x", "readConcern": {"level": "snapshot"}})
        assert "atClusterTime" in reply["cursor"]


# -- the recipe, as a property ----------------------------------------------------------------

IDS = st.integers(0, 5)
OPS = st.one_of(
    st.tuples(st.just("insert"), IDS, st.integers(0, 9)),
    st.tuples(st.just("set"), IDS, st.integers(0, 9)),
    st.tuples(st.just("push"), IDS, st.integers(0, 9)),
    st.tuples(st.just("unset"), IDS, st.just(0)),
    st.tuples(st.just("replace"), IDS, st.integers(0, 9)),
    st.tuples(st.just("delete"), IDS, st.just(0)),
    st.tuples(st.just("txn"), IDS, st.integers(0, 9)),
)


def run(ca: MongoClient, coll: str, ops: list[tuple[str, int, int]]) -> None:
    c = ca.shop[coll]
    for kind, i, v in ops:
        if kind == "insert":
            c.update_one({"_id": i}, {"$setOnInsert": {"v": v, "arr": [v]}}, upsert=True)
        elif kind == "set":
            c.update_one({"_id": i}, {"$set": {"v": v, "sub.x": v}})
        elif kind == "push":
            c.update_one({"_id": i}, {"$push": {"arr": {"$each": [v], "$slice": -3}}})
        elif kind == "unset":
            c.update_one({"_id": i}, {"$unset": {"sub": ""}})
        elif kind == "replace":
            c.replace_one({"_id": i}, {"r": v})
        elif kind == "delete":
            c.delete_one({"_id": i})
        else:
            with ca.start_session() as session:
                session.with_transaction(lambda s, i=i, v=v: (
                    c.update_one({"_id": i}, {"$inc": {"v": v}}, session=s),
                    c.update_one({"_id": (i + 1) % 6}, {"$set": {"t": v}}, upsert=True,
                                 session=s),
                ))


def fold(state: dict[bytes, Any], event: Any) -> None:
    """Apply one change event (with its post-image) to documents keyed by `_id`."""
    key = equality_key(event["documentKey"]["_id"])
    kind = event["operationType"]
    if kind in ("insert", "replace", "update"):
        assert event["fullDocument"] is not None, event
        state[key] = event["fullDocument"]
    elif kind == "delete":
        state.pop(key, None)


COUNTER = iter(range(1_000_000))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(before=st.lists(OPS, max_size=12), middle=st.lists(OPS, max_size=8),
       later=st.lists(OPS, max_size=12), in_the_past=st.booleans())
def test_snapshot_then_stream_is_the_final_state(pair, before, middle, later, in_the_past):
    a, b = pair
    coll = f"w{next(COUNTER)}"
    ca = raw_client(a.uri)
    cb = raw_client(b.direct_uri)
    try:
        ca.shop.create_collection(coll)
        run(ca, coll, before)
        t_before = latest_ts(a)
        run(ca, coll, middle)
        b.wait_applied(latest_ts(a))
        # the snapshot now, or at the earlier time (after `before`, `middle` in the stream)
        at = t_before if in_the_past else None
        docs, t, stream = snapshot_then_watch(cb.shop[coll], at_cluster_time=at,
                                              full_document="whenAvailable",
                                              max_await_time_ms=50)
        if in_the_past:
            assert t == t_before
        with stream:
            run(ca, coll, later)
            end = latest_ts(a)
            events = drain_until(stream, end)
        state = {equality_key(d["_id"]): d for d in docs}
        for event in events:
            fold(state, event)
        # byte for byte what A has, in the same (_id) order
        assert [state[k].raw for k in sorted(state)] == sorted_raw(ca, "shop", coll)
        # exactly once, none before T: one event per write of A's oplog after T
        times = [rt.decode(e["_id"]).cluster_time for e in events]
        assert all(ts > t for ts in times)
        tokens = [e["_id"]["_data"] for e in events]
        assert len(tokens) == len(set(tokens))
        assert len(events) == writes_after(a, coll, t, end)
    finally:
        ca.close()
        cb.close()


def writes_after(a: EmbeddedServer, coll: str, t: Timestamp, end: Timestamp) -> int:
    """A's CRUD writes to shop.<coll> with t < ts <= end (transactions' ops counted)."""
    n = 0
    for entry in a.entries():
        if not t < entry["ts"] <= end:
            continue
        ops = entry["o"].get("applyOps") if entry["op"] == "c" else None
        for op in ops if isinstance(ops, list) else [entry]:
            if op["op"] in ("i", "u", "d") and op["ns"] == f"shop.{coll}":
                n += 1
    return n


def test_the_helper_at_a_past_time(pair):
    a, b = pair
    ca = raw_client(a.uri)
    ca.shop.helper.insert_many([{"_id": i} for i in range(3)])
    t = latest_ts(a)
    ca.shop.helper.delete_one({"_id": 0})
    b.wait_applied(latest_ts(a))
    with raw_client(b.direct_uri) as cb:
        docs, at = snapshot(cb.shop.helper, at_cluster_time=t, batch_size=1)
        assert at == t and [d["_id"] for d in docs] == [0, 1, 2]
    assert after(Timestamp(5, 0xFFFFFFFF)) == Timestamp(6, 0)


def test_an_exported_snapshot_plus_its_oplog_is_the_final_state(pair, tmp_path):
    """export_snapshot at a past T: the collections at T (mongodump layout) and the oplog after
    T; replaying that oplog onto them (with the pure apply) gives A's collections now."""
    import bson

    from cdcserver.materialize.apply import Transactions, apply_crud, document_id, id_key
    from cdcserver.materialize.export import export_snapshot
    from pipeline_stages.oplog_entry import iter_entries

    a, b = pair
    ca = raw_client(a.uri)
    ca.shop.exported.insert_many([{"_id": i, "v": 0} for i in range(4)])
    t = latest_ts(a)
    ca.shop.exported.update_many({}, {"$inc": {"v": 1}})
    ca.shop.exported.delete_one({"_id": 0})
    ca.shop.exported.insert_one({"_id": 9})
    b.wait_applied(latest_ts(a))
    at, counts, n = b.call(lambda: export_snapshot(str(b._options.retain_dir), str(tmp_path), t))
    assert at == t and counts["shop.exported"] == 4 and n >= 6
    docs = {id_key(bson.decode(r)["_id"]): r for r in _split((tmp_path / "shop" /
                                                             "exported.bson").read_bytes())}
    txns = Transactions()
    for entry in iter_entries((tmp_path / "oplog.bson").read_bytes()):
        assert entry["ts"] > t
        for op in txns.feed(entry):
            if op.op in ("i", "u", "d") and op.ns == "shop.exported":
                key = id_key(document_id(op))
                new = apply_crud(op, docs.get(key))
                if new is None:
                    docs.pop(key, None)
                else:
                    docs[key] = new
    assert [docs[k] for k in sorted(docs)] == sorted_raw(ca, "shop", "exported")


def _split(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        size = int.from_bytes(data[i:i + 4], "little")
        out.append(data[i:i + size])
        i += size
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdcserver.cli", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_archive_export_snapshot_writes_the_copy_at_a_time_beside_the_sidecar(pair, tmp_path):
    """`cdcserver archive export --snapshot [TIME]` beside the running sidecar: the copy at
    that time in mongodump's layout (the newest applied without a time) and the oplog after it."""
    a, b = pair
    ca = raw_client(a.uri)
    ca.shop.cli.insert_many([{"_id": i, "v": 0} for i in range(3)])
    t = latest_ts(a)
    ca.shop.cli.update_one({"_id": 1}, {"$set": {"v": 1}})
    ca.shop.cli.insert_one({"_id": 7})
    b.wait_applied(latest_ts(a))
    retain = str(b._options.retain_dir)

    past = _cli("archive", "export", "--retain-dir", retain, "--snapshot", f"{t.time}:{t.inc}",
                "--out", str(tmp_path / "past"))
    assert past.returncode == 0, past.stderr
    assert f"the copy at {t}" in past.stderr
    at_t = [bson.decode(r) for r in _split((tmp_path / "past/shop/cli.bson").read_bytes())]
    assert at_t == [{"_id": i, "v": 0} for i in range(3)]
    after_t = list(iter_entries((tmp_path / "past/oplog.bson").read_bytes()))
    assert after_t and all(e["ts"] > t for e in after_t)
    assert [e["op"] for e in after_t if e["ns"] == "shop.cli"] == ["u", "i"]

    newest = _cli("archive", "export", "--retain-dir", retain, "--snapshot",
                  "--out", str(tmp_path / "now"))
    assert newest.returncode == 0, newest.stderr
    now = _split((tmp_path / "now/shop/cli.bson").read_bytes())
    assert now == sorted_raw(ca, "shop", "cli")

    no_copy = _cli("archive", "export", "--retain-dir", str(tmp_path / "none"), "--snapshot",
                   "--out", str(tmp_path / "x"))
    assert no_copy.returncode == 2 and "no materialized copy" in no_copy.stderr, no_copy.stderr
    both = _cli("archive", "export", "--retain-dir", retain, "--snapshot", "--since", "1:0",
                "--out", str(tmp_path / "y"))
    assert both.returncode == 2 and "not allowed with" in both.stderr, both.stderr


# -- as mongod reads: record order, default collation, other collections at the same time ----


def snapshot_agg(client: MongoClient, coll: str, pipeline: list[Any], at: Timestamp,
                 **fields: Any) -> list[Any]:
    reply = client.shop.command({"aggregate": coll, "pipeline": pipeline, "cursor": {},
                                 "readConcern": {"level": "snapshot", "atClusterTime": at},
                                 **fields})
    assert reply["cursor"]["id"] == 0
    return list(reply["cursor"]["firstBatch"])


def test_natural_order_is_the_record_order(pair):
    a, b = pair
    ca = raw_client(a.uri)
    coll = ca.shop.natural
    coll.insert_many([{"_id": i} for i in (5, 1, 3)])
    coll.update_one({"_id": 5}, {"$set": {"grown": "x" * 500}})  # keeps its record
    coll.delete_one({"_id": 1})
    coll.insert_one({"_id": 1, "again": True})  # a new record: last
    coll.insert_one({"_id": 0})
    coll.replace_one({"_id": 3}, {"r": 1})  # keeps its record
    at = latest_ts(a)
    b.wait_applied(at)
    upstream = [d["_id"] for d in coll.find({})]
    with b.client() as cb:
        mine = [d["_id"] for d in cb.shop.command(
            {"find": "natural", "readConcern": {"level": "snapshot", "atClusterTime": at}}
        )["cursor"]["firstBatch"]]
        assert mine == [5, 3, 1, 0]
        assert [d["_id"] for d in snapshot_agg(cb, "natural", [], at)] == mine
    assert upstream == mine  # the upstream's own natural order
    ca.close()


def test_cloned_documents_keep_the_upstreams_order(tmp_path):
    a = EmbeddedServer()
    b = None
    try:
        ca = raw_client(a.uri)
        ca.shop.c.insert_many([{"_id": i} for i in (9, 2, 7, 4)])
        ca.shop.c.delete_one({"_id": 2})
        ca.shop.c.insert_one({"_id": 2})
        upstream = [d["_id"] for d in ca.shop.c.find({})]
        ca.shop.create_collection("folded", collation={"locale": "en", "strength": 2})
        ca.shop.folded.insert_many([{"_id": 1, "s": "A"}, {"_id": 2, "s": "a"}])
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"])
        b.wait_applied(latest_ts(a))
        with b.client() as cb:
            mine = [d["_id"] for d in cb.shop.command(
                {"find": "c", "readConcern": {"level": "snapshot"}})["cursor"]["firstBatch"]]
            # the cloned collection's default collation, from listCollections
            folded = cb.shop.command({"find": "folded", "filter": {"s": "a"},
                                      "readConcern": {"level": "snapshot"}})
        assert mine == upstream
        assert sorted(d["_id"] for d in folded["cursor"]["firstBatch"]) == [1, 2]
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_the_collections_default_collation_applies(pair):
    a, b = pair
    ca = raw_client(a.uri)
    ca.shop.create_collection("folded", collation={"locale": "en", "strength": 2})
    ca.shop.folded.insert_many([{"_id": 1, "s": "ABC"}, {"_id": 2, "s": "abc"},
                                {"_id": 3, "s": "b"}])
    at = latest_ts(a)
    b.wait_applied(at)
    with b.client() as cb:
        rc = {"level": "snapshot", "atClusterTime": at}
        found = cb.shop.command({"find": "folded", "filter": {"s": "abc"}, "readConcern": rc})
        assert sorted(d["_id"] for d in found["cursor"]["firstBatch"]) == [1, 2]
        # the command's own collation wins over the collection's
        simple = cb.shop.command({"find": "folded", "filter": {"s": "abc"}, "readConcern": rc,
                                  "collation": {"locale": "simple"}})
        assert [d["_id"] for d in simple["cursor"]["firstBatch"]] == [2]
        values = cb.shop.command({"distinct": "folded", "key": "s", "readConcern": rc})
        assert len(values["values"]) == 2  # "ABC" and "abc" are one value, as on mongod
        grouped = snapshot_agg(cb, "folded", [{"$match": {"s": "ABC"}}], at)
        assert sorted(d["_id"] for d in grouped) == [1, 2]
        # the upstream agrees
        upstream = ca.shop.command({"find": "folded", "filter": {"s": "abc"}})
        assert sorted(d["_id"] for d in upstream["cursor"]["firstBatch"]) == [1, 2]
    ca.close()


def test_other_collections_are_read_at_the_same_time(pair):
    a, b = pair
    ca = raw_client(a.uri)
    ca.shop.orders.insert_many([{"_id": 1, "cust": "x"}, {"_id": 2, "cust": "y"}])
    ca.shop.customers.insert_many([{"_id": "x", "up": None}, {"_id": "y", "up": "x"}])
    at = latest_ts(a)
    ca.shop.customers.insert_one({"_id": "z", "up": "y"})
    ca.shop.customers.update_one({"_id": "x"}, {"$set": {"late": True}})
    ca.shop.orders.insert_one({"_id": 3, "cust": "z"})
    b.wait_applied(latest_ts(a))
    with b.client() as cb:
        joined = snapshot_agg(cb, "orders", [
            {"$lookup": {"from": "customers", "localField": "cust", "foreignField": "_id",
                         "as": "c"}},
            {"$sort": {"_id": 1}}], at)
        assert joined == [{"_id": 1, "cust": "x", "c": [{"_id": "x", "up": None}]},
                          {"_id": 2, "cust": "y", "c": [{"_id": "y", "up": "x"}]}]
        piped = snapshot_agg(cb, "orders", [
            {"$lookup": {"from": "customers", "let": {"c": "$cust"}, "as": "c",
                         "pipeline": [{"$match": {"$expr": {"$eq": ["$_id", "$$c"]}}},
                                      {"$project": {"_id": 1}}]}},
            {"$sort": {"_id": 1}}], at)
        assert [d["c"] for d in piped] == [[{"_id": "x"}], [{"_id": "y"}]]
        graph = snapshot_agg(cb, "customers", [
            {"$match": {"_id": "y"}},
            {"$graphLookup": {"from": "customers", "startWith": "$up", "connectFromField": "up",
                              "connectToField": "_id", "as": "chain"}}], at)
        assert [c["_id"] for c in graph[0]["chain"]] == ["x"]
        union = snapshot_agg(cb, "orders", [
            {"$project": {"_id": 1}},
            {"$unionWith": {"coll": "customers", "pipeline": [{"$project": {"_id": 1}}]}},
            {"$unionWith": "orders"},
            {"$count": "n"}], at)
        assert union == [{"n": 2 + 2 + 2}]
        # the same reads now see the later writes
        now = latest_ts(a)
        assert snapshot_agg(cb, "orders", [{"$unionWith": "customers"}, {"$count": "n"}],
                            now) == [{"n": 3 + 3}]
    ca.close()


def test_record_order_continues_after_a_restart(tmp_path):
    """Record ids are kept in the copy: after a restart a new document comes after every
    earlier one, as on mongod (not numbered from the start again)."""
    a = EmbeddedServer()
    b = None
    try:
        ca = raw_client(a.uri)
        ca.shop.r.insert_many([{"_id": i} for i in (3, 1, 2)])
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"])
        b.wait_applied(latest_ts(a))
        ca.shop.r.insert_one({"_id": 0})
        b.wait_applied(latest_ts(a))
        b.stop()
        ca.shop.r.delete_one({"_id": 3})
        ca.shop.r.insert_one({"_id": 3})
        ca.shop.r.insert_one({"_id": -1})
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"])
        b.wait_applied(latest_ts(a))
        assert b.call(lambda: b.materializer.resyncs) == 0  # continued, not synced again
        with b.client() as cb:
            mine = [d["_id"] for d in cb.shop.command(
                {"find": "r", "readConcern": {"level": "snapshot"}})["cursor"]["firstBatch"]]
        assert mine == [1, 2, 0, 3, -1]
        assert mine == [d["_id"] for d in ca.shop.r.find({})]
    finally:
        if b is not None:
            b.stop()
        a.stop()
