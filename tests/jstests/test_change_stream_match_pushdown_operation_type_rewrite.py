"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_operation_type_rewrite.js` @
1cace179dad67a095a957720c3868d317755adb6: the events a collection stream resumed from one
token returns for `$match`es on `operationType` (equality, `$in`, `$nin`, `$gt`, a subfield,
`$expr` with `$indexOfCP`, `$regexMatch`, `$not`, `$or`), on a collection sharded on `_id`
across two shards (`pushdown_util.py`). Left out: the `executionStats` counts of each case
(events returned by each shard, oplog entries its cursor returned): cdcserver has no explain of
change streams."""

from __future__ import annotations

from typing import Any

import pytest
from bson.regex import Regex
from pushdown_util import MODES, cluster, create_sharded_collection, mongos, run_cases

__all__ = ["cluster", "mongos"]

ALL = ["insert", "update", "replace", "delete"]


def _idx(substr: str) -> dict[str, Any]:
    return {"$gte": [{"$indexOfCP": ["$operationType", substr]}, 0]}


# ($match, the operation types expected, each for _id 1 then _id 2)
CASES: list[tuple[dict[str, Any], list[str]]] = [
    ({"operationType": "insert"}, ["insert"]),
    ({"operationType": "update"}, ["update"]),
    ({"operationType": "replace"}, ["replace"]),
    ({"operationType": "delete"}, ["delete"]),
    ({"operationType": 1}, []),
    ({"operationType": "unknown"}, []),
    ({"operationType": ""}, []),
    ({"operationType": {"$gt": "insert"}}, ["update", "replace"]),
    ({"operationType.subField": "subOperation"}, []),
    ({"operationType.subField": {"$eq": None}}, ALL),
    ({"operationType": {"$in": ["insert", "update"]}}, ["insert", "update"]),
    ({"operationType": {"$in": ["insert", "unknown"]}}, ["insert"]),
    ({"operationType": {"$in": ["unknown"]}}, []),
    ({"operationType": {"$in": [1]}}, []),
    ({"operationType": {"$in": [Regex("^insert$"), "update"]}}, ["insert", "update"]),
    ({"operationType": {"$nin": ["insert"]}}, ["update", "replace", "delete"]),
    ({"operationType": {"$nin": ["insert", "unknown"]}}, ["update", "replace", "delete"]),
    ({"operationType": {"$nin": [1]}}, ALL),
    ({"$expr": {"$eq": ["$operationType", "insert"]}}, ["insert"]),
    ({"$expr": {"$eq": ["$operationType", "update"]}}, ["update"]),
    ({"$expr": {"$eq": ["$operationType", "replace"]}}, ["replace"]),
    ({"$expr": {"$eq": ["$operationType", "delete"]}}, ["delete"]),
    ({"$expr": {"$eq": ["$operationType", "unknown"]}}, []),
    ({"$expr": {"$and": [_idx("l"), _idx("te")]}}, ["delete"]),
    ({"$expr": {"$or": [_idx("l"), _idx("te")]}}, ["update", "replace", "delete"]),
    ({"$expr": {"$not": {"$regexMatch": {"input": "$operationType", "regex": Regex("e$")}}}},
     ["insert"]),
    ({"$expr": {"$not": {"$or": [{"$eq": ["$operationType", "insert"]},
                                 {"$eq": ["$operationType", "delete"]}]}}},
     ["update", "replace"]),
]


@pytest.mark.parametrize("mode", MODES)
def test_operation_type_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll = create_sharded_collection(
        mongos, cluster, "_id", "change_stream_match_pushdown_and_rewrite", "coll1", 2)
    with coll.watch([]) as stream:
        resume_after = stream.resume_token

    def writes() -> None:
        coll.insert_one({"_id": 1})
        coll.insert_one({"_id": 2})
        coll.update_one({"_id": 1}, {"$set": {"foo": "bar"}})
        coll.update_one({"_id": 2}, {"$set": {"foo": "bar"}})
        coll.replace_one({"_id": 1}, {"_id": 1, "foo": "baz"})
        coll.replace_one({"_id": 2}, {"_id": 2, "foo": "baz"})
        coll.delete_one({"_id": 1})
        coll.delete_one({"_id": 2})

    def open_stream(match: dict[str, Any], live: bool) -> Any:
        return coll.watch([{"$match": match}], resume_after=None if live else resume_after,
                          max_await_time_ms=1)

    cases = [(match, [(op, i) for op in ops for i in (1, 2)]) for match, ops in CASES]
    run_cases(mode, open_stream, [(writes, cases)],
              lambda e: (e["operationType"], e["documentKey"]["_id"]))
