"""Translated from mongodb/mongo `jstests/change_streams/oplog_rewrite/`
`change_stream_match_pushdown_fullDocumentBeforeChange_rewrite.js` @
1e98a0f23d62eb1f149658d190f0285879d91db5: the events a whole-cluster stream
(`fullDocumentBeforeChange: "whenAvailable"`) resumed from one token returns for `$match`es on
`fullDocumentBeforeChange` (whole, `_id`, the shard key, negated, `$exists`, null, `$type`,
`$gt: null`) per operation type, on a collection with pre-images, sharded on `{shard: 1}`
across two shards (`pushdown_util.py`). Left out: the `executionStats` counts of each case
(events each shard returned, oplog entries its cursor returned): cdcserver has no explain of
change streams."""

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

DB = COLL = "change_stream_match_pushdown_fullDocumentBeforeChange_rewrite"
PRE = "fullDocumentBeforeChange"


def _cases(op: str) -> list[tuple[dict[str, Any], list[Any]]]:
    def ids(*values: Any) -> list[Any]:
        return whole_cluster_expected({COLL: {op: list(values)}} if values else {})

    all4 = ids(2, 3, 2, 3)
    if op == "insert":
        return absent_field_cases(op, (PRE, PRE + "._id", PRE + ".shard"), ids(), all4)
    doc: dict[str, Any] = {"_id": 2, "shard": 0}
    if op == "update":
        doc["foo"] = "a"
    if op == "delete":
        doc["foo"] = "b"
    return [
        ({"operationType": op, PRE: doc}, ids(2)),
        ({"operationType": op, PRE + "._id": {"$lt": 3}}, ids(2, 2)),
        ({"operationType": op, PRE + ".shard": {"$gt": 0}}, ids(2, 3)),
        ({"operationType": op, PRE: {"$not": {"$eq": doc}}}, ids(3, 2, 3)),
        ({"operationType": op, PRE + "._id": {"$not": {"$lt": 3}}}, ids(3, 3)),
        ({"operationType": op, PRE + ".shard": {"$not": {"$gt": 0}}}, ids(2, 3)),
        ({"operationType": op, PRE: {"$exists": True}}, all4),
        ({"operationType": op, PRE: {"$exists": True}}, all4),
        ({"operationType": op, PRE: {"$exists": False}}, ids()),
        ({"operationType": op, PRE: {"$exists": False}}, ids()),
        ({"operationType": op, PRE: {"$eq": None}}, ids()),
        ({"operationType": op, PRE: {"$eq": None}}, ids()),
        ({"operationType": op, PRE: {"$ne": None}}, all4),
        ({"operationType": op, PRE: {"$ne": None}}, all4),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_full_document_before_change_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll = create_sharded_collection(mongos, cluster, "shard", DB, COLL, 1)
    mongos[DB].command({"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": True}})
    with coll.watch([]) as stream:
        resume_after = stream.resume_token
    keys = ((2, 0), (3, 0), (2, 1), (3, 1))

    def writes() -> None:
        for i, s in keys:
            coll.insert_one({"_id": i, "shard": s})
        for i, s in keys:
            coll.replace_one({"_id": i, "shard": s}, {"_id": i, "shard": s, "foo": "a"})
        for i, s in keys:
            coll.update_one({"_id": i, "shard": s}, {"$set": {"foo": "b"}})
        for i, s in keys:
            coll.delete_one({"_id": i, "shard": s})
        coll.drop()

    drop = whole_cluster_expected({COLL: {"drop": [COLL]}})
    cases = (_cases("insert") + _cases("replace") + _cases("update") + _cases("delete")
             + [({"operationType": "drop"}, drop), ({"operationType": "drop"}, drop)])
    opener = whole_cluster_opener(mongos, resume_after, full_document_before_change="whenAvailable")
    run_cases(mode, opener, [(writes, cases)], whole_cluster_identity)
