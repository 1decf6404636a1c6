"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_documentKey_rewrite.js` @
0cf0d832fd76a93496e5a6df71b417a5059b0bd8: the events a collection stream resumed from one
token returns for `$match`es on `documentKey` (whole, `_id`, the shard key, negated, `$eq: null`,
`$exists: false` on a field outside the key, `$expr`) per CRUD operation type, on a collection
sharded on `{shard: 1}` across two shards (`pushdown_util.py`), so that `documentKey` is
`{shard, _id}` and `_id`s repeat across shards. Left out: the `executionStats` counts of each
case (events each shard returned, oplog entries its cursor returned; cdcserver has no explain of
change streams) and the `disableMatchExpressionOptimization` fail point (it only keeps mongod
from rewriting `$expr` before the oplog rewrite: the events are the same)."""

from __future__ import annotations

from typing import Any

import pytest
from pushdown_util import MODES, cluster, create_sharded_collection, mongos, run_cases

__all__ = ["cluster", "mongos"]

DB = COLL = "change_stream_match_pushdown_documentKey_rewrite"
OPS = ["insert", "update", "replace", "delete"]


def _cases(op: str) -> list[tuple[dict[str, Any], list[tuple[int, int]]]]:
    """($match, the (_id, shard) of the events expected, in order) for one operation type."""
    def expr(e: dict[str, Any]) -> dict[str, Any]:
        return {"$and": [{"operationType": op}, {"$expr": e}]}

    key = {"shard": 0, "_id": 2}
    return [
        ({"operationType": op, "documentKey": key}, [(2, 0)]),
        ({"operationType": op, "documentKey._id": 2}, [(2, 0), (2, 1)]),
        ({"operationType": op, "documentKey.shard": 1}, [(2, 1), (3, 1)]),
        ({"operationType": op, "documentKey": {"$not": {"$eq": key}}}, [(3, 0), (2, 1), (3, 1)]),
        ({"operationType": op, "documentKey._id": {"$not": {"$eq": 2}}}, [(3, 0), (3, 1)]),
        ({"operationType": op, "documentKey._id": {"$eq": None}}, []),
        ({"operationType": op, "documentKey.shard": {"$not": {"$eq": 1}}}, [(2, 0), (3, 0)]),
        ({"operationType": op, "documentKey.z": {"$exists": False}},
         [(2, 0), (3, 0), (2, 1), (3, 1)]),
        ({"operationType": op, "documentKey.z": {"$eq": None}}, [(2, 0), (3, 0), (2, 1), (3, 1)]),
        (expr({"$eq": ["$documentKey", key]}), [(2, 0)]),
        (expr({"$not": {"$eq": ["$documentKey", key]}}), [(3, 0), (2, 1), (3, 1)]),
        (expr({"$eq": ["$documentKey._id", 2]}), [(2, 0), (2, 1)]),
        (expr({"$not": {"$eq": ["$documentKey._id", 2]}}), [(3, 0), (3, 1)]),
        (expr({"$eq": ["$documentKey.shard", 1]}), [(2, 1), (3, 1)]),
        (expr({"$not": {"$eq": ["$documentKey.shard", 1]}}), [(2, 0), (3, 0)]),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_document_key_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll = create_sharded_collection(mongos, cluster, "shard", DB, COLL, 1)
    with coll.watch([]) as stream:
        resume_after = stream.resume_token

    def writes() -> None:
        coll.insert_one({"_id": 2, "shard": 0})
        coll.insert_one({"_id": 3, "shard": 0, "z": 4})
        coll.insert_one({"_id": 2, "shard": 1, "z": 4})
        coll.insert_one({"_id": 3, "shard": 1})
        for i, s in ((2, 0), (3, 0), (2, 1), (3, 1)):
            coll.update_one({"_id": i, "shard": s}, {"$set": {"foo": "a"}})
        coll.replace_one({"_id": 2, "shard": 0}, {"_id": 2, "shard": 0, "foo": "b"})
        coll.replace_one({"_id": 3, "shard": 0}, {"_id": 3, "shard": 0, "z": 4, "foo": "b"})
        coll.replace_one({"_id": 2, "shard": 1}, {"_id": 2, "shard": 1, "z": 4, "foo": "b"})
        coll.replace_one({"_id": 3, "shard": 1}, {"_id": 3, "shard": 1, "foo": "b"})
        for i, s in ((2, 0), (3, 0), (2, 1), (3, 1)):
            coll.delete_one({"_id": i, "shard": s})

    def open_stream(match: dict[str, Any], live: bool) -> Any:
        return coll.watch([{"$match": match}], resume_after=None if live else resume_after,
                          max_await_time_ms=1)

    cases = [(m, [(op, i, s) for i, s in expected]) for op in OPS for m, expected in _cases(op)]
    run_cases(mode, open_stream, [(writes, cases)],
              lambda e: (e["operationType"], e["documentKey"]["_id"], e["documentKey"]["shard"]))
