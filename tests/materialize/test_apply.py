"""The pure oplog application (cdcserver/materialize/apply.py) and the pattern checks."""

from __future__ import annotations

import bson
import pytest
from bson.binary import Binary
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.materialize.apply import (
    Op,
    Skipped,
    Transactions,
    apply_crud,
    ddl_of,
    document_id,
)
from cdcserver.materialize.patterns import Patterns, pattern_problem
from pipeline_stages.oplog_entry import decode_entry

UUID = Binary(b"u" * 16, 4)
LSID = {"id": Binary(b"l" * 16, 4), "uid": b"x" * 32}


def op(kind: str, o: dict, o2: dict | None = None, ts: int = 1, index: int = 0) -> Op:
    return Op(kind, "shop.c", bytes(UUID), RawBSONDocument(bson.encode(o)),
              None if o2 is None else RawBSONDocument(bson.encode(o2)), Timestamp(ts, 0), index)


def test_insert_is_the_document_bytes_and_replaces_an_existing_one():
    doc = {"_id": 1, "a": [1, {"b": 2}]}
    assert apply_crud(op("i", doc), None) == bson.encode(doc)
    assert apply_crud(op("i", doc), bson.encode({"_id": 1, "old": True})) == bson.encode(doc)


def test_v2_diff_keeps_field_order_and_resizes_arrays():
    current = bson.encode({"_id": 1, "a": 1, "arr": [1, 2, 3], "sub": {"x": 1, "y": 2}})
    diff = {"$v": 2, "diff": {"u": {"a": 5}, "i": {"z": 9},
                              "sarr": {"a": True, "l": 2, "u1": 20},
                              "ssub": {"d": {"x": False}}}}
    new = apply_crud(op("u", diff, {"_id": 1}), current)
    assert new is not None
    assert list(bson.decode(new).items()) == [
        ("_id", 1), ("a", 5), ("arr", [1, 20]), ("sub", {"y": 2}), ("z", 9)]


def test_replacement_and_delete():
    current = bson.encode({"_id": 1, "a": 1})
    assert apply_crud(op("u", {"_id": 1, "b": 2}, {"_id": 1}), current) == bson.encode(
        {"_id": 1, "b": 2})
    assert apply_crud(op("d", {"_id": 1}), current) is None


def test_update_of_a_missing_document_is_skipped():
    with pytest.raises(Skipped):
        apply_crud(op("u", {"$v": 2, "diff": {"u": {"a": 1}}}, {"_id": 1}), None)
    with pytest.raises(Skipped):  # a $v: 1 modifier update: not applied (no such oplog in 8.0)
        apply_crud(op("u", {"$set": {"a": 1}}, {"_id": 1}), bson.encode({"_id": 1}))


def test_document_id_of_each_kind():
    assert document_id(op("i", {"_id": 7})) == 7
    assert document_id(op("u", {"$v": 2, "diff": {}}, {"_id": 8, "sk": 1})) == 8
    assert document_id(op("d", {"_id": 9})) == 9


def entry(**fields: object) -> dict:
    return decode_entry(bson.encode(fields))


def test_transactions_apply_at_their_commit():
    txns = Transactions()
    inner = [{"op": "i", "ns": "shop.c", "ui": UUID, "o": {"_id": i}} for i in range(3)]
    first = entry(op="c", ns="admin.$cmd", ts=Timestamp(5, 1), lsid=LSID, txnNumber=1,
                  partialTxn=True, o={"applyOps": inner[:2]})
    last = entry(op="c", ns="admin.$cmd", ts=Timestamp(5, 2), lsid=LSID, txnNumber=1,
                 o={"applyOps": inner[2:]})
    assert txns.feed(first) == []
    assert txns.oldest_open() == Timestamp(5, 1)
    ops = txns.feed(last)
    assert [(o.o["_id"], o.entry_ts, o.index) for o in ops] == [
        (0, Timestamp(5, 1), 0), (1, Timestamp(5, 1), 1), (2, Timestamp(5, 2), 0)]
    assert txns.oldest_open() is None
    # prepared: applied by commitTransaction, dropped by abortTransaction
    prepared = entry(op="c", ns="admin.$cmd", ts=Timestamp(6, 1), lsid=LSID, txnNumber=2,
                     o={"applyOps": inner[:1], "prepare": True})
    assert txns.feed(prepared) == []
    commit = entry(op="c", ns="admin.$cmd", ts=Timestamp(6, 2), lsid=LSID, txnNumber=2,
                   o={"commitTransaction": 1, "commitTimestamp": Timestamp(6, 1)})
    assert [o.index for o in txns.feed(commit)] == [0]
    txns.feed({**prepared, "txnNumber": 3})
    abort = entry(op="c", ns="admin.$cmd", ts=Timestamp(7, 1), lsid=LSID, txnNumber=3,
                  o={"abortTransaction": 1})
    assert txns.feed(abort) == [] and txns.oldest_open() is None


def test_ddl_kinds():
    def c(o: dict) -> Op:
        return Op("c", "shop.$cmd", bytes(UUID), o, None, Timestamp(1, 1), 0)

    assert ddl_of(c({"create": "x"})).kind == "create"
    assert ddl_of(c({"drop": "x"})).coll == "x"
    rename = ddl_of(c({"renameCollection": "shop.a", "to": "crm.b", "dropTarget": UUID}))
    assert (rename.kind, rename.coll, rename.to_db, rename.to_coll) == ("rename", "a", "crm", "b")
    assert rename.drop_target == bytes(UUID)
    assert ddl_of(c({"dropDatabase": 1})).kind == "drop_database"
    assert ddl_of(c({"collMod": "x", "validationLevel": "off"})).kind == "other"


def test_patterns():
    p = Patterns(["shop.*", "crm.accounts"])
    assert p.matches("shop", "orders") and p.matches("crm", "accounts")
    assert not p.matches("crm", "leads") and not p.matches("shop", "system.views")
    assert p.databases() == {"shop", "crm"}
    for bad in ["shop", "shop.", ".x", "sh op.x", "admin.*", "shop.a*", "shop.system.js",
                "shop.$x"]:
        assert pattern_problem(bad) is not None, bad
    with pytest.raises(ValueError):
        Patterns(["local.*"])


def test_config_checks_the_patterns_and_needs_the_retained_log(tmp_path):
    from cdcserver.config import check_config

    env = {"CDCSERVER_UPSTREAM_URI": "mongodb://127.0.0.1:1/",
           "CDCSERVER_UPSTREAM_MATERIALIZE": '["shop.*", "local.x", "crm"]'}
    _, errors = check_config(None, env)
    text = "\n".join(errors)
    assert "upstream.materialize[1]" in text and "upstream.materialize[2]" in text
    assert "needs upstream.retain_dir" in text
    config, errors = check_config(
        None, {**env, "CDCSERVER_UPSTREAM_MATERIALIZE": '["shop.*", "crm.accounts"]',
               "CDCSERVER_UPSTREAM_RETAIN_DIR": str(tmp_path)})
    assert errors == [] and config is not None
    assert config.upstream.materialize == ["shop.*", "crm.accounts"]


def test_stored_id_key_reads_the_first_element_as_the_whole_document_would():
    from bson import Decimal128, Int64, ObjectId
    from bson.timestamp import Timestamp as Ts

    from cdcserver.materialize.apply import id_key, stored_id_key

    for value in [1, Int64(2), 2.0, "s", "", ObjectId(), True, Ts(1, 2), Decimal128("1.5"),
                  {"a": 1}, [1], None]:
        raw = bson.encode({"_id": value, "x": 1})
        assert stored_id_key(raw) == id_key(value), value
    assert stored_id_key(bson.encode({"x": 1, "_id": 3})) == id_key(3)  # not first: decoded
    assert stored_id_key(bson.encode({"_id": 1})) == id_key(1)  # only field
