"""The oplog the embedded store writes (mongod 8.0's shape), the change events `watch()` gives
for each kind of write, and persistence across a restart."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
from bson import json_util
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo import errors

from cdcserver.embedded.store import Store
from tests.support.embedded_support import EmbeddedServer

CRUD_ORDER = ["op", "ns", "ui", "o", "o2", "ts", "t", "v", "wall"]
RETRYABLE_ORDER = ["lsid", "txnNumber", "op", "ns", "ui", "o", "o2", "stmtId", "ts", "t", "v",
                   "wall", "prevOpTime"]
CORPUS = "corpus/oplog/derived-jsonl/mongodb-mongo-tools/mongorestore/testdata"


@pytest.fixture
def server():
    s = EmbeddedServer()
    yield s
    s.stop()


def _entries(server, since=0):
    return server.entries()[since:]


def _corpus_lines(shared_dir: pathlib.Path, rel: str) -> list[dict]:
    path = shared_dir / CORPUS / rel
    return [json_util.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _key_order(doc) -> list[str]:
    return list(doc)


def test_first_entry_initiates_the_set(server):
    first = server.entries()[0]
    assert first["op"] == "n" and first["o"] == {"msg": "initiating set"}


def test_crud_entries_shape(server):
    client = server.client(retryWrites=False)
    coll = client.shape.c
    start = len(server.entries())
    coll.insert_one({"_id": 1, "a": 1})
    coll.update_one({"_id": 1}, {"$set": {"b": 2}, "$unset": {"a": ""}})
    coll.replace_one({"_id": 1}, {"c": 3})
    coll.delete_one({"_id": 1})
    create, ins, upd, rep, dele = _entries(server, start)
    assert create["op"] == "c" and create["ns"] == "shape.$cmd"
    assert create["o"] == {"create": "c", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    assert list(create) == ["op", "ns", "ui", "o", "ts", "t", "v", "wall"]
    assert list(ins) == CRUD_ORDER
    assert ins["o"] == {"_id": 1, "a": 1} and ins["o2"] == {"_id": 1}
    assert upd["o"] == {"$v": 2, "diff": {"d": {"a": False}, "i": {"b": 2}}}
    assert upd["o2"] == {"_id": 1}
    assert rep["o"] == {"_id": 1, "c": 3} and list(rep) == CRUD_ORDER
    assert dele["o"] == {"_id": 1} and list(dele) == ["op", "ns", "ui", "o", "ts", "t", "v",
                                                      "wall"]
    assert {e["ui"] for e in (create, ins, upd, rep, dele)} == {create["ui"]}
    assert create["ui"].subtype == 4
    for e in (create, ins, upd, rep, dele):
        assert isinstance(e["t"], Int64) and e["t"] == 1 and e["v"] == 2
    ts = [e["ts"] for e in server.entries()]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)


def test_same_shape_as_real_8x_entries(server, shared_dir):
    """Field order of mongod 8.x entries recorded in the corpus."""
    real = _corpus_lines(shared_dir, "oplogs/bson/bypassDocumentValidation.bson.canonical.jsonl")
    real_create = next(e for e in real if e["op"] == "c")
    real_insert = next(e for e in real if e["op"] == "i")
    client = server.client()  # retryable writes on: lsid/txnNumber/stmtId/prevOpTime
    start = len(server.entries())
    client.real.coll1.insert_one({"testField": "valid"})
    create, ins = _entries(server, start)
    assert list(create) == list(real_create)
    assert list(create["o"]) == ["create", "idIndex"]
    assert list(ins) == list(real_insert) == RETRYABLE_ORDER
    assert list(ins["lsid"]) == list(real_insert["lsid"]) == ["id", "uid"]
    assert ins["lsid"]["uid"] == real_insert["lsid"]["uid"]  # sha256("") without auth
    assert ins["prevOpTime"] == {"ts": Timestamp(0, 0), "t": -1}
    assert ins["stmtId"] == 0


def test_retryable_insert_many_chains_prev_op_time(server):
    client = server.client()
    start = len(server.entries())
    client.chain.c.insert_many([{"_id": i} for i in range(3)])
    _, *inserts = _entries(server, start)
    assert [e["stmtId"] for e in inserts] == [0, 1, 2]
    assert inserts[0]["prevOpTime"]["ts"] == Timestamp(0, 0)
    assert inserts[1]["prevOpTime"] == {"ts": inserts[0]["ts"], "t": 1}
    assert inserts[2]["prevOpTime"] == {"ts": inserts[1]["ts"], "t": 1}
    assert len({e["txnNumber"] for e in inserts}) == 1


def test_ddl_entries(server, shared_dir):
    client = server.client()
    db = client.ddl
    start = len(server.entries())
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    db.c.create_index("a")  # empty collection: one createIndexes entry
    db.c.insert_one({"_id": 1, "a": 1})
    db.c.create_index("b")  # non-empty: startIndexBuild + commitIndexBuild
    db.c.drop_index("a_1")
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": False})
    db.c.rename("d")
    db.c2.insert_one({})
    client.drop_database("ddl")
    entries = _entries(server, start)
    kinds = [next(iter(e["o"])) if e["op"] == "c" else e["op"] for e in entries]
    assert kinds == ["create", "createIndexes", "i", "startIndexBuild", "commitIndexBuild",
                     "dropIndexes", "collMod", "renameCollection", "create", "i", "drop", "drop",
                     "dropDatabase"]
    create, ci = entries[0], entries[1]
    assert create["o"] == {"create": "c", "changeStreamPreAndPostImages": {"enabled": True},
                           "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    assert ci["o"] == {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"}
    real = _corpus_lines(shared_dir, "oplogs/bson/collMod_indexUniqueness.bson.canonical.jsonl")
    assert list(ci) == list(real[1]) and list(ci["o"]) == list(real[1]["o"])
    start_build, commit = entries[3], entries[4]
    assert start_build["o"]["indexBuildUUID"] == commit["o"]["indexBuildUUID"]
    assert commit["o"]["indexes"] == [{"v": 2, "key": {"b": 1}, "name": "b_1"}]
    drop_index = entries[5]
    assert drop_index["o"] == {"dropIndexes": "c", "index": "a_1"}
    assert drop_index["o2"] == {"v": 2, "key": {"a": 1}, "name": "a_1"}
    coll_mod = entries[6]
    assert coll_mod["o"] == {"collMod": "c", "changeStreamPreAndPostImages": {"enabled": False}}
    assert coll_mod["o2"] == {"collectionOptions_old": {
        "uuid": create["ui"], "changeStreamPreAndPostImages": {"enabled": True}}}
    assert list(coll_mod) == list(real[5])
    rename = entries[7]
    assert rename["o"] == {"renameCollection": "ddl.c", "to": "ddl.d", "stayTemp": False}
    assert rename["ui"] == create["ui"]
    drops = entries[10:12]
    assert sorted(e["o"]["drop"] for e in drops) == ["c2", "d"]
    assert all("numRecords" in e["o2"] for e in drops)
    drop_db = entries[12]
    assert drop_db["ns"] == "ddl.$cmd" and drop_db["o"] == {"dropDatabase": 1}
    assert "ui" not in drop_db


def test_new_uuid_per_collection_generation(server):
    client = server.client()
    coll = client.gen.c
    coll.insert_one({})
    first = server.store.get("gen", "c").uuid
    coll.drop()
    coll.insert_one({})
    assert server.store.get("gen", "c").uuid != first


def test_rename_drop_target_records_target_uuid(server):
    client = server.client()
    client.rt.a.insert_one({})
    client.rt.b.insert_one({})
    target = server.store.get("rt", "b").ui
    client.rt.a.rename("b", dropTarget=True)
    rename = server.entries()[-1]
    assert rename["o"] == {"renameCollection": "rt.a", "to": "rt.b", "stayTemp": False,
                           "dropTarget": target}


def test_pre_images_recorded(server):
    client = server.client()
    db = client.pre
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    db.c.insert_one({"_id": 1, "a": 1})
    db.c.update_one({"_id": 1}, {"$set": {"a": 2}})
    upd = server.entries()[-1]
    db.c.delete_one({"_id": 1})
    dele = server.entries()[-1]
    from pipeline_stages.image_source import pre_image_id

    images = server.store.images.pre_images(
        [pre_image_id(upd["ui"], upd["ts"]), pre_image_id(dele["ui"], dele["ts"])]
    )
    assert images == [{"_id": 1, "a": 1}, {"_id": 1, "a": 2}]


# ---------------------------------------------------------------------------------------------
# Change events


def _collect(stream, n, timeout=5.0):
    got, end = [], time.time() + timeout
    while len(got) < n and time.time() < end:
        ev = stream.try_next()
        if ev is not None:
            got.append(ev)
    return got


def test_events_for_each_write_kind(server):
    client = server.client()
    coll = client.ev.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=100) as cs:
        coll.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
        coll.update_many({}, {"$inc": {"a": 1}})
        coll.update_one({"_id": 1}, [{"$set": {"p": "$a"}}])
        coll.replace_one({"_id": 2}, {"r": 1})
        coll.find_one_and_update({"_id": 1}, {"$unset": {"p": ""}})
        coll.delete_many({})
        events = _collect(cs, 10)
    ops = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
    # A pipeline update whose delta is not smaller than the document is logged as a
    # replacement (mongod's computeOplogDiff), hence a `replace` event.
    assert ops == [("insert", 1), ("insert", 2), ("update", 0), ("update", 1), ("update", 2),
                   ("replace", 1), ("replace", 2), ("update", 1), ("delete", 0), ("delete", 1)]
    assert events[2]["updateDescription"] == {
        "updatedFields": {"a": 1}, "removedFields": [], "truncatedArrays": []
    }
    assert events[6]["fullDocument"] == {"_id": 2, "r": 1}
    assert events[7]["updateDescription"]["removedFields"] == ["p"]


def test_ddl_events_and_invalidate(server):
    client = server.client()
    db = client.evddl
    db.c.insert_one({"_id": 1})
    with db.watch(max_await_time_ms=100, show_expanded_events=True) as cs:
        db.c.create_index("a")
        db.c.rename("d")
        db.d.drop()
        events = _collect(cs, 3)
    assert [e["operationType"] for e in events] == ["createIndexes", "rename", "drop"]
    assert events[0]["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]
    }
    rename = next(e for e in events if e["operationType"] == "rename")
    assert rename["to"] == {"db": "evddl", "coll": "d"}
    with db.e.watch(max_await_time_ms=100) as cs:
        db.e.insert_one({})
        db.e.drop()
        events = _collect(cs, 3)
    assert [e["operationType"] for e in events] == ["insert", "drop", "invalidate"]


def test_full_document_lookup_and_pre_images(server):
    client = server.client()
    db = client.img
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    coll = db.c
    coll.insert_one({"_id": 1, "a": 1})
    with coll.watch(full_document="updateLookup", full_document_before_change="required",
                    max_await_time_ms=100) as cs:
        coll.update_one({"_id": 1}, {"$set": {"a": 2}})
        [upd] = _collect(cs, 1)  # updateLookup reads the document as it is now
        coll.delete_one({"_id": 1})
        [dele] = _collect(cs, 1)
    assert upd["fullDocument"] == {"_id": 1, "a": 2}
    assert upd["fullDocumentBeforeChange"] == {"_id": 1, "a": 1}
    assert dele["fullDocumentBeforeChange"] == {"_id": 1, "a": 2}


def test_resume_after_each_event(server):
    client = server.client()
    coll = client.resume.c
    with coll.watch(max_await_time_ms=100) as cs:
        coll.insert_many([{"_id": i} for i in range(4)])
        events = _collect(cs, 4)
    with coll.watch(resume_after=events[1]["_id"], max_await_time_ms=100) as cs:
        rest = _collect(cs, 2)
    assert [e["documentKey"]["_id"] for e in rest] == [2, 3]


def test_transaction_is_one_apply_ops_entry_and_events_share_cluster_time(server):
    client = server.client()
    coll = client.txn.c
    coll.insert_one({"_id": 0})
    start = len(server.entries())
    with coll.watch(max_await_time_ms=100) as cs:
        with client.start_session() as s:
            s.with_transaction(lambda s: (coll.insert_one({"_id": 1}, session=s),
                                          coll.update_one({"_id": 0}, {"$set": {"a": 1}},
                                                          session=s)))
        events = _collect(cs, 2)
    [entry] = _entries(server, start)
    assert list(entry) == ["lsid", "txnNumber", "op", "ns", "o", "ts", "t", "v", "wall",
                           "prevOpTime"]
    assert entry["ns"] == "admin.$cmd" and entry["op"] == "c"
    inner = entry["o"]["applyOps"]
    assert [op["op"] for op in inner] == ["i", "u"]
    assert list(inner[0]) == ["op", "ns", "ui", "o", "o2"]
    assert [e["operationType"] for e in events] == ["insert", "update"]
    assert events[0]["clusterTime"] == events[1]["clusterTime"] == entry["ts"]
    assert list(events[0])[:3] == ["txnNumber", "lsid", "_id"]
    assert events[0]["lsid"]["id"] == entry["lsid"]["id"]


# ---------------------------------------------------------------------------------------------
# Persistence


def test_durable_restart(tmp_path):
    data = str(tmp_path / "data")
    with EmbeddedServer(data) as s:
        client = s.client()
        db = client.dur
        db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
        db.c.create_index("u", unique=True)
        with db.c.watch(max_await_time_ms=100) as cs:
            db.c.insert_many([{"_id": i, "u": i} for i in range(5)])
            db.c.update_one({"_id": 1}, {"$set": {"x": 1}})
            db.c.delete_one({"_id": 0})
            events = _collect(cs, 7)
        before = s.entries()
        uuid = s.store.get("dur", "c").uuid
        client.close()
    assert len(events) == 7
    with EmbeddedServer(data) as s:
        client = s.client()
        assert list(client.dur.c.find()) == [{"_id": 1, "u": 1, "x": 1}] + [
            {"_id": i, "u": i} for i in range(2, 5)
        ]
        assert s.entries() == before
        assert s.store.get("dur", "c").uuid == uuid
        assert [i["name"] for i in client.dur.c.list_indexes()] == ["_id_", "u_1"]
        with pytest.raises(errors.DuplicateKeyError):
            client.dur.c.insert_one({"u": 3})
        client.dur.c.insert_one({"_id": 9, "u": 9})
        after = s.entries()
        assert after[-1]["ts"] > before[-1]["ts"]
        with client.dur.c.watch(resume_after=events[4]["_id"],
                                full_document_before_change="required",
                                max_await_time_ms=100) as cs:
            rest = _collect(cs, 3)
        assert [e["operationType"] for e in rest] == ["update", "delete", "insert"]
        assert rest[1]["fullDocumentBeforeChange"] == {"_id": 0, "u": 0}
        client.close()


def test_natural_order_survives_restart(tmp_path):
    data = str(tmp_path / "data")
    with EmbeddedServer(data) as s:
        coll = s.client().nat.c
        coll.insert_many([{"_id": 3}, {"_id": 1}, {"_id": 2}])
        coll.update_one({"_id": 3}, {"$set": {"a": 1}})
    with EmbeddedServer(data) as s:
        assert [d["_id"] for d in s.client().nat.c.find()] == [3, 1, 2]


def test_capped_oplog_truncates_oldest():
    store = Store(None, oplog_size_bytes=2000)
    coll = store.ensure_collection  # noqa: F841 - the store API directly
    with store.batch():
        c = store.ensure_collection("cap", "c")
    for i in range(50):
        with store.batch():
            store.insert_document(c, {"_id": i, "pad": "x" * 50})
    raw = store.oplog_entries()
    assert sum(len(r) for r in raw) <= 2000
    assert store.oldest_entry()["o"]["_id"] > 0
    assert store.latest_ts() == store.read_from(store.latest_ts(), 1)[0]["ts"]


def test_config_example_has_store_section():
    import msgspec

    from cdcserver.config import Config

    text = pathlib.Path(__file__).resolve().parents[2].joinpath("config.example.toml").read_bytes()
    config = msgspec.toml.decode(text, type=Config)
    assert config.store.data_dir == "./cdcserver-data" and config.store.in_memory is False
    json.dumps(msgspec.to_builtins(config))  # serialisable


def test_binary_uuid_helpers():
    assert Binary(b"\0" * 16, 4).subtype == 4
