"""Transaction / applyOps unwinding ($_internalChangeStreamUnwindTransaction, reference §3),
on hand-built entries shaped like mongod's (document_source_change_stream_test.cpp
TransformApplyOps*, PreparedTransaction*, TransactionWithMultipleOplogEntries) and on every
real oplog file of the corpus."""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Iterable
from typing import Any

import bson
import pytest
from bson import json_util
from bson.binary import Binary
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import Entry, decode_entry, iter_entries, split_ns
from pipeline_stages.oplog_match import OplogFilter
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.unwind_transaction import (
    TransactionHistory,
    bson_type_name,
    is_transaction_entry,
    unwind,
)

UUID = Binary(b"\x22" * 16, 4)
LSID = {"id": Binary(b"\x33" * 16, 4), "uid": Binary(b"\x44" * 32, 0)}
NULL_OPTIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}
HISTORY_LOST = (
    "Oplog no longer has history necessary for $changeStream to observe operations from a "
    "committed transaction. :: caused by :: oplog no longer contains the complete write history "
    "of this transaction, log with opTime {} cannot be found"
)


def wall(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def entry(ts: Timestamp, o: dict[str, Any], prev: dict[str, Any] | None = NULL_OPTIME,
          session: bool = True, **kw: Any) -> Entry:
    doc: dict[str, Any] = {}
    if session:
        doc["lsid"] = LSID
        doc["txnNumber"] = Int64(7)
    doc.update({"op": "c", "ns": "admin.$cmd", "o": o, "ts": ts, "t": Int64(1), "v": Int64(2),
                "wall": wall(ts.time * 1000 + ts.inc)})
    if prev is not None:
        doc["prevOpTime"] = prev
    doc.update(kw)
    return decode_entry(bson.encode(doc))


def optime(e: Entry) -> dict[str, Any]:
    return {"ts": e["ts"], "t": e["t"]}


def ins(ns: str, _id: int) -> dict[str, Any]:
    return {"op": "i", "ns": ns, "ui": UUID, "o": {"_id": _id, "x": _id}, "o2": {"_id": _id}}


class History:
    """An in-memory TransactionHistory."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.by_ts: dict[Timestamp, Entry] = {e["ts"]: e for e in entries}
        self.lookups: list[Timestamp] = []

    def entry_at(self, ts: Timestamp) -> Entry | None:
        self.lookups.append(ts)
        return self.by_ts.get(ts)


def coll_filter(db: str = "test", coll: str = "watched", **kw: Any) -> OplogFilter:
    return OplogFilter(ChangeStreamSpec(scope="collection", db=db, coll=coll, **kw))


def run(e: Entry, f: OplogFilter, history: TransactionHistory | None) -> list[dict[str, Any]]:
    return list(unwind(e, f.matches_transaction_op, history))


W, OT = "test.watched", "test.other"


def test_protocol_is_satisfied_by_history() -> None:
    h: TransactionHistory = History()
    assert h.entry_at(Timestamp(1, 1)) is None


def test_non_transaction_entries_pass_through() -> None:
    f = coll_filter()
    for doc in (
        ins(W, 1),
        {"op": "c", "ns": "test.$cmd", "o": {"drop": "watched"}},
        {"op": "n", "ns": "", "o": {"msg": "periodic noop"}},
        {"op": "c", "ns": "test.$cmd", "o": {"create": "watched"}},
    ):
        e = decode_entry(bson.encode({**doc, "ts": Timestamp(5, 1), "wall": wall(5000)}))
        assert is_transaction_entry(e) is False
        out = run(e, f, None)
        assert len(out) == 1 and out[0] is e


def test_single_entry_transaction() -> None:
    ops = [ins(W, 1), ins(OT, 2), {**ins(W, 3), "op": "u", "o": {"$v": 2, "diff": {"u": {"x": 9}}}},
           {"op": "d", "ns": W, "ui": UUID, "o": {"_id": 4}}]
    e = entry(Timestamp(100, 5), {"applyOps": ops})
    assert is_transaction_entry(e)
    f = coll_filter()
    assert f.matches(e)
    h = History()
    out = run(e, f, h)
    assert h.lookups == []  # a single-entry transaction reads nothing
    assert [o["op"] for o in out] == ["i", "u", "d"]
    assert [o["txnOpIndex"] for o in out] == [0, 2, 3]  # the op on test.other used index 1
    assert [o["applyOpsIndex"] for o in out] == [0, 2, 3]
    for o in out:
        assert type(o["txnOpIndex"]) is Int64 and type(o["applyOpsIndex"]) is Int64
        assert o["applyOpsTs"] == Timestamp(100, 5)
        assert o["ts"] == e["ts"] and o["wall"] == e["wall"]
        assert o["lsid"].raw == e["lsid"].raw
        assert o["txnNumber"] == 7 and type(o["txnNumber"]) is Int64
        assert "prevOpTime" not in o and "t" not in o
    # Inner op fields come first and keep their raw representation.
    first = out[0]
    assert list(first)[:5] == ["op", "ns", "ui", "o", "o2"]
    assert list(first)[5:] == ["txnOpIndex", "applyOpsIndex", "applyOpsTs", "ts", "wall", "lsid",
                               "txnNumber"]
    assert isinstance(first["o"], RawBSONDocument)
    assert first["o"].raw == e["o"]["applyOps"][0]["o"].raw
    assert first["ui"] == UUID

    # A database stream sees the op on test.other too, with the index it had all along.
    out = run(e, OplogFilter(ChangeStreamSpec(scope="database", db="test")), h)
    assert [o["txnOpIndex"] for o in out] == [0, 1, 2, 3]


def test_transaction_with_multiple_entries() -> None:
    e1 = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1), ins(OT, 2)], "partialTxn": True})
    e2 = entry(Timestamp(100, 2), {"applyOps": [ins(OT, 3)], "partialTxn": True}, prev=optime(e1))
    e3 = entry(Timestamp(100, 3), {"applyOps": [ins(W, 4), ins(W, 5)], "count": Int64(5)},
               prev=optime(e2))
    f = coll_filter()
    assert [f.matches(e) for e in (e1, e2, e3)] == [False, False, True]
    h = History([e1, e2, e3])
    out = run(e3, f, h)
    assert [o["o"]["_id"] for o in out] == [1, 4, 5]
    assert [o["txnOpIndex"] for o in out] == [0, 3, 4]  # never reset between entries
    assert [o["applyOpsIndex"] for o in out] == [0, 0, 1]  # reset for each applyOps
    assert [o["applyOpsTs"] for o in out] == [e1["ts"], e3["ts"], e3["ts"]]
    assert all(o["ts"] == e3["ts"] and o["wall"] == e3["wall"] for o in out)
    assert all(o["txnNumber"] == 7 and o["lsid"].raw == e3["lsid"].raw for o in out)
    assert set(h.lookups) == {e1["ts"], e2["ts"]}


def test_transaction_with_only_unwatched_ops_in_last_entry() -> None:
    # The last link is selected for its prevOpTime alone; the watched ops are in the first.
    e1 = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)], "partialTxn": True})
    e2 = entry(Timestamp(100, 2), {"applyOps": [ins("other.x", 2)]}, prev=optime(e1))
    f = coll_filter()
    assert f.matches(e2)
    out = run(e2, f, History([e1, e2]))
    assert [(o["o"]["_id"], o["txnOpIndex"], o["ts"]) for o in out] == [(1, 0, e2["ts"])]


def test_prepared_transaction_commit() -> None:
    p1 = entry(Timestamp(200, 1), {"applyOps": [ins(W, 1), ins(OT, 2)], "partialTxn": True})
    p2 = entry(Timestamp(200, 2), {"applyOps": [ins(W, 3)], "prepare": True}, prev=optime(p1))
    other = decode_entry(bson.encode({**ins(W, 99), "ts": Timestamp(200, 3), "t": Int64(1),
                                      "wall": wall(1)}))
    commit = entry(Timestamp(200, 9), {"commitTransaction": 1,
                                       "commitTimestamp": Timestamp(200, 4)}, prev=optime(p2))
    f = coll_filter()
    assert [f.matches(e) for e in (p1, p2, commit)] == [False, False, True]
    out = run(commit, f, History([p1, p2, other, commit]))
    assert [o["o"]["_id"] for o in out] == [1, 3]
    assert [o["txnOpIndex"] for o in out] == [0, 2]
    assert [o["applyOpsIndex"] for o in out] == [0, 0]
    assert [o["applyOpsTs"] for o in out] == [p1["ts"], p2["ts"]]
    # clusterTime is the commit entry's ts (not commitTimestamp), wallTime its wall.
    assert all(o["ts"] == commit["ts"] and o["wall"] == commit["wall"] for o in out)
    assert all("commitTimestamp" not in o for o in out)
    assert all(o["txnNumber"] == 7 for o in out)


def test_prepared_single_entry_commit() -> None:
    p = entry(Timestamp(300, 1), {"applyOps": [ins(W, 1)], "prepare": True})
    commit = entry(Timestamp(300, 2),
                   {"commitTransaction": 1, "commitTimestamp": Timestamp(300, 1)}, prev=optime(p))
    out = run(commit, coll_filter(), History([p]))
    assert [(o["txnOpIndex"], o["applyOpsTs"], o["ts"]) for o in out] == [
        (0, p["ts"], commit["ts"])
    ]


def test_prepared_transaction_abort_yields_nothing() -> None:
    p = entry(Timestamp(300, 1), {"applyOps": [ins(W, 1)], "prepare": True})
    abort = entry(Timestamp(300, 2), {"abortTransaction": 1}, prev=optime(p))
    f = coll_filter()
    assert not f.matches(p) and not f.matches(abort)
    assert not is_transaction_entry(abort)
    h = History([p])
    assert run(abort, f, h) == []
    assert h.lookups == []


def test_batched_applyops_multi_op_type_1() -> None:
    # 8.0 retryable batched writes: each entry stands alone; lsid/txnNumber are not copied and
    # prevOpTime is not followed (so a missing earlier entry is no error).
    a = entry(Timestamp(400, 2), {"applyOps": [ins(W, 1), ins(W, 2)]}, multiOpType=1)
    b = entry(Timestamp(400, 3), {"applyOps": [ins(W, 3), ins(OT, 4), ins(W, 5)]},
              prev=optime(a), multiOpType=1)
    f = coll_filter()
    assert f.matches(a) and f.matches(b)
    h = History()
    out = run(b, f, h)
    assert h.lookups == []
    assert [o["o"]["_id"] for o in out] == [3, 5]
    assert [o["txnOpIndex"] for o in out] == [0, 2]
    assert all(o["ts"] == b["ts"] and o["applyOpsTs"] == b["ts"] for o in out)
    assert all("lsid" not in o and "txnNumber" not in o for o in out)


def test_multi_op_type_other_value_follows_chain() -> None:
    a = entry(Timestamp(400, 2), {"applyOps": [ins(W, 1)], "partialTxn": True})
    b = entry(Timestamp(400, 3), {"applyOps": [ins(W, 2)]}, prev=optime(a), multiOpType=0)
    out = run(b, coll_filter(), History([a]))
    assert [(o["o"]["_id"], o["lsid"].raw) for o in out] == [(1, b["lsid"].raw), (2, b["lsid"].raw)]


def test_multi_op_type_must_be_int() -> None:
    e = entry(Timestamp(400, 2), {"applyOps": [ins(W, 1)]}, multiOpType=Int64(1))
    with pytest.raises(MongoError) as err:
        run(e, coll_filter(), None)
    assert (err.value.code, err.value.errmsg) == (
        40532, 'Entry field "multiOpType" should be int, found: long'
    )


def test_non_transaction_applyops_without_session() -> None:
    e = entry(Timestamp(500, 1), {"applyOps": [ins(W, 1)]}, prev=None, session=False)
    out = run(e, coll_filter(), None)
    assert len(out) == 1
    assert "lsid" not in out[0] and "txnNumber" not in out[0]
    assert out[0]["txnOpIndex"] == 0 and out[0]["ts"] == e["ts"]


def test_missing_chain_link_is_history_lost() -> None:
    e1 = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)], "partialTxn": True})
    e2 = entry(Timestamp(100, 2), {"applyOps": [ins(W, 2)], "partialTxn": True}, prev=optime(e1))
    e3 = entry(Timestamp(100, 3), {"applyOps": [ins(W, 3)]}, prev=optime(e2))
    f = coll_filter()
    for history in (History([e2]), History(), None):
        with pytest.raises(MongoError) as err:
            unwind(e3, f.matches_transaction_op, history)  # raised before iterating
        missing = "{ ts: Timestamp(100, 1), t: 1 }" if history is not None and history.by_ts \
            else "{ ts: Timestamp(100, 2), t: 1 }"
        assert err.value.code == 286
        assert err.value.code_name == "ChangeStreamHistoryLost"
        assert err.value.errmsg == HISTORY_LOST.format(missing)


def test_prepared_commit_with_lost_prepare_entry() -> None:
    commit = entry(Timestamp(600, 9), {"commitTransaction": 1},
                   prev={"ts": Timestamp(600, 1), "t": Int64(3)})
    with pytest.raises(MongoError) as err:
        unwind(commit, coll_filter().matches_transaction_op, History())
    assert err.value.errmsg == HISTORY_LOST.format("{ ts: Timestamp(600, 1), t: 3 }")


def test_lookup_matches_term_too() -> None:
    # mongod looks the link up by {ts, t}: an entry at that ts from another term is not it.
    e1 = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)], "partialTxn": True})
    e2 = entry(Timestamp(100, 2), {"applyOps": [ins(W, 2)]},
               prev={"ts": Timestamp(100, 1), "t": Int64(2)})
    with pytest.raises(MongoError) as err:
        unwind(e2, coll_filter().matches_transaction_op, History([e1]))
    assert err.value.errmsg == HISTORY_LOST.format("{ ts: Timestamp(100, 1), t: 2 }")


def test_chain_entry_without_prev_op_time() -> None:
    e1 = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)], "partialTxn": True}, prev=None)
    e2 = entry(Timestamp(100, 2), {"applyOps": [ins(W, 2)]}, prev=optime(e1))
    with pytest.raises(MongoError) as err:
        unwind(e2, coll_filter().matches_transaction_op, History([e1]))
    assert (err.value.code, err.value.errmsg) == (
        9, "Missing prevOpTime field on oplog entry of previous write in transaction: {}"
    )


def test_commit_without_chain() -> None:
    commit = entry(Timestamp(600, 9), {"commitTransaction": 1})
    with pytest.raises(MongoError) as err:
        unwind(commit, coll_filter().matches_transaction_op, History())
    assert (err.value.code, err.value.errmsg) == (5543804, "No transaction oplog entries found")


def test_chain_entry_without_apply_ops_array() -> None:
    e1 = entry(Timestamp(100, 1), {"applyOps": {"not": "an array"}, "partialTxn": True})
    commit = entry(Timestamp(100, 2), {"commitTransaction": 1}, prev=optime(e1))
    with pytest.raises(MongoError) as err:
        list(unwind(commit, coll_filter().matches_transaction_op, History([e1])))
    assert (err.value.code, err.value.errmsg) == (
        5543806, "Expected 'applyOps' type array, found object"
    )


def test_wall_must_be_a_date() -> None:
    e = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)]}, wall="yesterday")
    with pytest.raises(MongoError) as err:
        run(e, coll_filter(), None)
    assert (err.value.code, err.value.errmsg) == (
        40532, 'Entry field "wall" should be date, found: string'
    )
    # Pre-3.6 entries have no `wall`: replayed without wallTime (mongod 8.0 says 40532).
    doc = dict(entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)]}))
    del doc["wall"]
    (op,) = run(decode_entry(bson.encode(doc)), coll_filter(), None)
    assert "wall" not in op and op["ts"] == Timestamp(100, 1)


def test_txn_number_must_be_long() -> None:
    e = entry(Timestamp(100, 1), {"applyOps": [ins(W, 1)]}, txnNumber=7)
    with pytest.raises(MongoError) as err:
        run(e, coll_filter(), None)
    assert err.value.errmsg == 'Entry field "txnNumber" should be long, found: int'


def test_noop_inside_apply_ops_is_an_internal_error() -> None:
    e = entry(Timestamp(100, 1), {"applyOps": [{"op": "n", "ns": W, "o": {"msg": "hi"}}]})
    with pytest.raises(MongoError) as err:
        run(e, coll_filter(), None)
    assert (err.value.code, err.value.errmsg) == (
        5543809, 'Unexpected noop entry within a transaction {msg: "hi"}'
    )
    e = entry(Timestamp(100, 1), {"applyOps": [{"op": 5, "ns": W}]})
    with pytest.raises(MongoError) as err:
        run(e, coll_filter(), None)
    assert err.value.code == 5543808
    assert err.value.errmsg.endswith("'op' field was type int")


def test_ddl_inside_transaction() -> None:
    create = {"op": "c", "ns": "test.$cmd", "ui": UUID,
              "o": {"create": "watched", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}}
    e = entry(Timestamp(100, 1), {"applyOps": [create, ins(W, 1)]})
    out = run(e, coll_filter(), None)
    assert [(o["op"], o["txnOpIndex"]) for o in out] == [("c", 0), ("i", 1)]


def test_from_migrate_inner_ops() -> None:
    e = entry(Timestamp(100, 1), {"applyOps": [{**ins(W, 1), "fromMigrate": True}, ins(W, 2)]})
    assert [o["txnOpIndex"] for o in run(e, coll_filter(), None)] == [1]
    f = coll_filter(show_migration_events=True)
    assert [o["txnOpIndex"] for o in run(e, f, None)] == [0, 1]


def test_bson_type_names() -> None:
    assert [bson_type_name(v) for v in (1, Int64(1), 2**40, 1.5, "s", True, None, [], {})] == [
        "int", "long", "long", "double", "string", "bool", "null", "array", "object",
    ]
    assert bson_type_name(Timestamp(1, 1)) == "timestamp"
    assert bson_type_name(wall(0)) == "date"


# -- the MongoDB-made transaction vectors of mongo-tools (common/txn/testdata) ------------------


def _txn_vectors(shared_dir: pathlib.Path) -> dict[str, Any]:
    path = shared_dir / "corpus/oplog/mongodb-mongo-tools/common/txn/testdata/oplog_entries.json"
    return json.loads(path.read_text())


def test_mongo_tools_transaction_vectors(shared_dir: pathlib.Path) -> None:
    cases = _txn_vectors(shared_dir)
    assert len(cases) == 12
    seen_committed = 0
    for name, case in cases.items():
        entries = []
        for i, doc in enumerate(json_util.loads(json.dumps(case["ops"]))):
            doc.setdefault("wall", wall(1_000_000 + i))  # the vectors predate `wall`
            entries.append(decode_entry(bson.encode(doc)))
        db, coll = split_ns(case["ns"])
        f = coll_filter(db, coll) if coll != "$cmd" else OplogFilter(
            ChangeStreamSpec(scope="cluster", db="admin"))
        history = History(entries)
        out: list[tuple[Entry, dict[str, Any]]] = []
        for e in entries:
            if f.matches(e):
                out += [(e, o) for o in unwind(e, f.matches_transaction_op, history)]
        if "aborted" in name:
            assert out == [], name
            continue
        assert out, name
        if "prepared" in name or "unprepared" in name:
            seen_committed += 1
            commit = entries[-1]
            # Every op reachable through the prevOpTime chain, in order, stamped with the
            # commit point.
            n_ops = len(commit["o"].get("applyOps", []))
            link = commit["prevOpTime"]
            while link["ts"] != Timestamp(0, 0):
                linked = history.by_ts[link["ts"]]
                n_ops += len(linked["o"]["applyOps"])
                link = linked["prevOpTime"]
            assert [o["txnOpIndex"] for _, o in out] == list(range(n_ops)), name
            assert all(src is commit and o["ts"] == commit["ts"] for src, o in out), name
            assert all(o["lsid"].raw == commit["lsid"].raw for _, o in out), name
        if name == "large, prepared, committed":
            # The hand-made vector's commit links to the *first* entry (i=1), not the prepare
            # entry (i=3): following prevOpTime as mongod does reaches only its 3 ops.
            assert [o["o"]["_id"] for _, o in out] == [0, 1, 2]
        if name == "not transaction with multiOpType":
            assert [o["txnOpIndex"] for _, o in out] == [0, 1]
            assert all("lsid" not in o for _, o in out)
    assert seen_committed == 4


# -- every real oplog file --------------------------------------------------------------------


def _oplog_files(shared_dir: pathlib.Path) -> list[pathlib.Path]:
    root = shared_dir / "corpus/oplog/mongodb-mongo-tools"
    return sorted(root.rglob("*.bson"))


def _is_oplog(entries: list[Entry]) -> bool:
    # Collection dumps (base data of restore tests) share the directory tree.
    return bool(entries) and all("op" in e and "ts" in e for e in entries)


def _namespaces(entries: list[Entry]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for e in entries:
        ns = e.get("ns") or ""
        db, coll = split_ns(ns)
        o = e.get("o")
        if coll == "$cmd" and isinstance(o, dict | RawBSONDocument):
            for key in ("create", "drop", "createIndexes", "collMod", "commitIndexBuild"):
                if isinstance(o.get(key), str):
                    found.add((db, o[key]))
            for op in o.get("applyOps", []) if isinstance(o.get("applyOps"), list) else []:
                found.add(split_ns(op["ns"]))
        elif db and coll:
            found.add((db, coll))
    return {(d, c) for d, c in found if d and c and not c.startswith("$")}


def _specs(entries: list[Entry]) -> list[ChangeStreamSpec]:
    specs = [ChangeStreamSpec(scope="cluster", db="admin")]
    for db, coll in sorted(_namespaces(entries)):
        if db in ("admin", "local", "config") or coll.startswith("system."):
            continue
        specs.append(ChangeStreamSpec(scope="collection", db=db, coll=coll))
        specs.append(ChangeStreamSpec(scope="database", db=db))
    return specs


def test_corpus_files_are_found(shared_dir: pathlib.Path) -> None:
    files = _oplog_files(shared_dir)
    oplogs = [p for p in files if _is_oplog(list(iter_entries(p.read_bytes())))]
    assert len(files) >= 26 and len(oplogs) >= 24


def test_every_real_oplog(shared_dir: pathlib.Path) -> None:
    totals = {"selected": 0, "events": 0, "txn_events": 0, "wall_missing": 0}
    for path in _oplog_files(shared_dir):
        entries = list(iter_entries(path.read_bytes()))
        if not _is_oplog(entries):
            continue
        history = History(entries)
        for spec in _specs(entries):
            f = OplogFilter(spec)
            for e in entries:
                if not f.matches(e):
                    continue
                totals["selected"] += 1
                out = list(unwind(e, f.matches_transaction_op, history))
                if "wall" not in e:
                    totals["wall_missing"] += 1
                totals["events"] += len(out)
                if not is_transaction_entry(e):
                    assert out == [e]
                    continue
                totals["txn_events"] += len(out)
                assert [o["txnOpIndex"] for o in out] == sorted({o["txnOpIndex"] for o in out})
                for o in out:
                    # Each op carries its commit point's ts and wall.
                    assert o["ts"] == e["ts"] and o.get("wall") == e.get("wall"), path
                    assert f.matches_transaction_op(o)
                    if e.get("multiOpType") == 1:
                        assert "lsid" not in o and "txnNumber" not in o
                        assert o["applyOpsTs"] == e["ts"]
                    elif "lsid" in e:
                        assert o["lsid"].raw == e["lsid"].raw
    # The corpus holds 8.0 batched inserts (3 entries, 7 ops) seen by several streams each.
    assert totals["txn_events"] >= 3 * 7
    assert totals["wall_missing"] >= 1  # the 3.6 user applyOps of oplogdump/
    assert totals["selected"] > totals["wall_missing"]


def test_linked_vectored_inserts(shared_dir: pathlib.Path) -> None:
    path = (shared_dir / "corpus/oplog/mongodb-mongo-tools/mongorestore/testdata/oplogs/bson/"
            "linked_vectored_inserts.bson")
    a, b = iter_entries(path.read_bytes())
    assert a.get("multiOpType") == b.get("multiOpType") == 1
    assert b["prevOpTime"]["ts"] == a["ts"]
    f = coll_filter("mongodump_test_db", "coll1")
    assert f.matches(a) and f.matches(b)
    out_a = run(a, f, History())
    out_b = run(b, f, History())  # the link to `a` is not followed
    assert [o["o"]["_id"] for o in out_a + out_b] == [300, 400, 500, 600, 700]
    assert [o["txnOpIndex"] for o in out_a] == [0, 1, 2]
    assert [o["txnOpIndex"] for o in out_b] == [0, 1]
    assert {o["ts"] for o in out_a} == {a["ts"]} and {o["ts"] for o in out_b} == {b["ts"]}
    assert out_b[0]["stmtId"] == 3  # inner fields kept
