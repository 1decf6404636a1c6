"""Translated from mongodb/mongo `jstests/sharding/query/change_streams/oplog_document_key.js`
@ 591928c6193659fc8e1bf6a9ea0b234d3ac25b67, on a one-shard cluster as the jstest: the shard
writes each update's `o2` and each delete's `o` (or its batched delete's `applyOps` entry) as
the documentKey: `{_id}` unsharded or sharded on `_id`, else the shard key fields in key order,
then `_id` unless it is one of them (`{x, _id}`, `{_id, x}`)."""

from __future__ import annotations

from collections.abc import Iterator

import bson
import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer


@pytest.fixture
def one_shard() -> Iterator[tuple[pymongo.MongoClient, pymongo.MongoClient]]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as s, \
            pymongo.MongoClient(server.shard_uris[0]) as shard:
        yield s, shard


def _doc_eq(actual, expected) -> None:
    assert bson.encode(actual) == bson.encode(expected), (actual, expected)


def test_oplog_document_key(one_shard):
    s, shard = one_shard
    db = s.test
    oplog = shard.local["oplog.rs"]
    s.admin.command("enableSharding", "test")
    s.admin.command("shardCollection", "test.byId", key={"_id": 1})
    s.admin.command("shardCollection", "test.byX", key={"x": 1})
    s.admin.command("shardCollection", "test.byXId", key={"x": 1, "_id": 1})
    s.admin.command("shardCollection", "test.byIdX", key={"_id": 1, "x": 1})
    for coll, a, b in (("un", 10, 30), ("byId", 11, 31), ("byX", 12, 32), ("byXId", 13, 33),
                       ("byIdX", 14, 34)):
        db[coll].insert_one({"_id": a, "x": a + 40, "y": a + 50})
        db[coll].insert_one({"_id": b, "x": b + 40, "y": b + 50})

    def o2(ns: str, id_: int) -> dict:
        return oplog.find_one({"ns": ns, "op": "u", "o2._id": id_})["o2"]

    db.un.update_one({"_id": 10, "x": 50}, {"$set": {"y": 70}})
    db.un.replace_one({"_id": 30, "x": 70}, {"y": 75})
    _doc_eq(o2("test.un", 10), {"_id": 10})
    _doc_eq(o2("test.un", 30), {"_id": 30})

    db.byId.update_one({"_id": 11}, {"$set": {"y": 71}})
    db.byId.replace_one({"_id": 31}, {"x": 71, "y": 76})
    _doc_eq(o2("test.byId", 11), {"_id": 11})
    _doc_eq(o2("test.byId", 31), {"_id": 31})

    db.byX.update_one({"x": 52}, {"$set": {"y": 72}})
    db.byX.replace_one({"x": 72}, {"x": 72, "y": 77})
    _doc_eq(o2("test.byX", 12), {"x": 52, "_id": 12})
    _doc_eq(o2("test.byX", 32), {"x": 72, "_id": 32})

    db.byXId.update_one({"_id": 13, "x": 53}, {"$set": {"y": 73}})
    db.byXId.replace_one({"_id": 33, "x": 73}, {"x": 73, "y": 78})
    _doc_eq(o2("test.byXId", 13), {"x": 53, "_id": 13})
    _doc_eq(o2("test.byXId", 33), {"x": 73, "_id": 33})

    db.byIdX.update_one({"_id": 14, "x": 54}, {"$set": {"y": 74}})
    db.byIdX.replace_one({"_id": 34, "x": 74}, {"x": 74, "y": 79})
    _doc_eq(o2("test.byIdX", 14), {"_id": 14, "x": 54})
    _doc_eq(o2("test.byIdX", 34), {"_id": 34, "x": 74})

    def removed(ns: str, id_: int, key: int | None = None) -> None:
        expected = {"_id": id_, "x": key} if key is not None else {"_id": id_}
        entry = oplog.find_one({"ns": ns, "op": "d", "o._id": id_})
        if entry is not None:
            _doc_eq(entry["o"], expected)
            return
        match = {"ns": ns, "op": "d", "o._id": id_, **({"o.x": key} if key is not None else {})}
        entry = oplog.find_one({"ns": "admin.$cmd", "op": "c",
                                "o.applyOps": {"$elemMatch": match}})
        _doc_eq(entry["o"]["applyOps"][0]["o"], expected)

    for coll, a, b, key in (("un", 10, 30, False), ("byX", 12, 32, True),
                            ("byXId", 13, 33, True), ("byIdX", 14, 34, True)):
        db[coll].delete_one({"_id": a})
        db[coll].delete_one({"_id": b})
        removed(f"test.{coll}", a, a + 40 if key else None)
        removed(f"test.{coll}", b, b + 40 if key else None)
