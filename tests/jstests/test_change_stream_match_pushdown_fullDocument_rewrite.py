"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_fullDocument_rewrite.js` @
179ed0b4e4fac818fb8b9e0968b0c8df71abc870: the events a whole-cluster stream
(`fullDocument: "updateLookup"`) resumed from one token returns for `$match`es on
`fullDocument` (whole, `_id`, the shard key, `$elemMatch`, negated, `$exists`, null, `$type`,
`$gt: null`) per operation type, on a collection sharded on `{shard: 1}` across two shards
(`pushdown_util.py`); updates checked before the deletes (their lookups find the documents),
drops after the collection's drop. Left out: the `executionStats` counts of each case (events
each shard returned, oplog entries its cursor returned): cdcserver has no explain of change
streams."""

from __future__ import annotations

from typing import Any

import pytest
from pushdown_util import (
    MODES,
    absent_field_cases,
    cluster,
    create_sharded_collection,
    mongos,
    run_cases,
    whole_cluster_expected,
    whole_cluster_identity,
    whole_cluster_opener,
)

__all__ = ["cluster", "mongos"]

DB = COLL = "change_stream_match_pushdown_fullDocument_rewrite"


def _cases(op: str) -> list[tuple[dict[str, Any], list[Any]]]:
    def ids(*values: Any) -> list[Any]:
        return whole_cluster_expected({COLL: {op: list(values)}} if values else {})

    all4 = ids(2, 3, 2, 3)
    if op == "delete":
        paths = ("fullDocument", "fullDocument._id", "fullDocument.shard")
        return absent_field_cases(op, paths, ids(), all4)
    if op == "drop":
        drop = whole_cluster_expected({COLL: {op: [COLL]}})
        return [
            ({"operationType": op, "fullDocument": {"$eq": None}}, drop),
            ({"operationType": op, "fullDocument": {"$exists": False}}, drop),
            ({"operationType": op, "fullDocument": {"$exists": True}}, []),
        ]
    doc: dict[str, Any] = {"_id": 2, "shard": 0, "arr": [0, 2]}
    if op != "insert":
        doc["foo"] = "a" if op == "replace" else "b"
    return [
        ({"operationType": op, "fullDocument": doc}, ids(2)),
        ({"operationType": op, "fullDocument._id": {"$lt": 3}}, ids(2, 2)),
        ({"operationType": op, "fullDocument.shard": {"$gt": 0}}, ids(2, 3)),
        ({"operationType": op, "fullDocument.arr": {"$elemMatch": {"$mod": [2, 0]}}}, ids(2, 2)),
        ({"operationType": op, "fullDocument": {"$not": {"$eq": doc}}}, ids(3, 2, 3)),
        ({"operationType": op, "fullDocument._id": {"$not": {"$lt": 3}}}, ids(3, 3)),
        ({"operationType": op, "fullDocument.shard": {"$not": {"$gt": 0}}}, ids(2, 3)),
        ({"operationType": op, "fullDocument": {"$exists": True}}, all4),
        ({"operationType": op, "fullDocument": {"$exists": False}}, ids()),
        ({"operationType": op, "fullDocument": {"$eq": None}}, ids()),
        ({"operationType": op, "fullDocument": {"$ne": None}}, all4),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_full_document_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll = create_sharded_collection(mongos, cluster, "shard", DB, COLL, 1)
    with coll.watch([]) as stream:
        resume_after = stream.resume_token
    keys = ((2, 0), (3, 0), (2, 1), (3, 1))

    def crud() -> None:
        for i, s in keys:
            coll.insert_one({"_id": i, "shard": s, "arr": [0, 2] if i == 2 else [1, 3]})
        for i, s in keys:
            coll.replace_one({"_id": i, "shard": s},
                             {"_id": i, "shard": s, "arr": [0, 2] if i == 2 else [1, 3],
                              "foo": "a"})
        for i, s in keys:
            coll.update_one({"_id": i, "shard": s}, {"$set": {"foo": "b"}})

    def deletes() -> None:
        for i, s in keys:
            coll.delete_one({"_id": i, "shard": s})

    phases = [
        (crud, _cases("update")),
        (deletes, _cases("insert") + _cases("replace") + _cases("delete")),
        (coll.drop, _cases("drop")),
    ]
    opener = whole_cluster_opener(mongos, resume_after, full_document="updateLookup")
    run_cases(mode, opener, phases, whole_cluster_identity)
