"""Translated from mongodb/mongo `jstests/change_streams/oplog_rewrite/`
`change_stream_match_pushdown_updateDescription_rewrite.js` @
0cf0d832fd76a93496e5a6df71b417a5059b0bd8: the events a collection stream resumed from one
token returns for `$match`es on `updateDescription` (whole, `updatedFields.<f>` with dotted and
number-like names, `removedFields` as an array, by element, by index, `$in`, negations, null,
`$exists`), on a collection sharded on `{shard: 1}` across two shards (`pushdown_util.py`), run
twice with the updates' shards swapped. Left out: the `executionStats` counts (cdcserver has no
explain of change streams), and the jstest's second shard writing `$v: 1` update entries
(`internalQueryEnableLoggingV2OplogEntries: false`, a parameter 8.0 no longer has: 8.0 always
logs `$v: 2`, so its `truncatedArrays: []` update description is expected in both runs, which
selects the same events as the jstest's v1 one)."""

from __future__ import annotations

from typing import Any

import pytest
from pushdown_util import MODES, cluster, create_sharded_collection, mongos, run_cases

__all__ = ["cluster", "mongos"]

DB = BASE = "change_stream_match_pushdown_updateDescription_rewrite"
OP = "update"
UPDATE_DESC = {"updatedFields": {}, "removedFields": ["z"], "truncatedArrays": []}
UD = "updateDescription"
# ($match, the (_id, shard) of the events expected: shard 0 and 1 are s0 and s1 of the run)
CASES: list[tuple[dict[str, Any], list[tuple[int, int]]]] = [
    ({UD: UPDATE_DESC}, [(2, 0)]),
    ({UD: {"$eq": None}}, []),
    ({UD: {"$exists": False}}, []),
    ({UD + ".updatedFields": {"$eq": None}}, []),
    ({UD + ".updatedFields": {"$exists": False}}, []),
    ({UD + ".updatedFields.f": "b"}, [(3, 0)]),
    ({UD + ".updatedFields.f": {"$lte": "b"}}, [(3, 0)]),
    ({UD + ".updatedFields.g": "c"}, [(2, 1)]),
    ({UD + ".updatedFields.g": {"$exists": True}}, [(2, 1)]),
    ({UD + ".updatedFields.x.j": 7}, [(3, 0), (3, 1)]),
    ({UD + ".updatedFields.0": "d"}, [(3, 1)]),
    ({UD + ".removedFields": {"$eq": None}}, []),
    ({UD + ".removedFields": {"$exists": False}}, []),
    ({UD + ".removedFields": "z"}, [(2, 0), (2, 1)]),
    ({UD + ".removedFields": ["z"]}, [(2, 0), (2, 1)]),
    ({UD + ".removedFields": "w.h"}, [(3, 0), (3, 1)]),
    ({UD + ".removedFields": "1"}, [(3, 0)]),
    ({UD + ".removedFields.0": "z"}, [(2, 0), (2, 1)]),
    ({UD + ".removedFields": {"$in": ["y", "z"]}}, [(2, 0), (2, 1), (3, 1)]),
    ({UD: {"$not": {"$eq": UPDATE_DESC}}}, [(2, 1), (3, 0), (3, 1)]),
    ({UD + ".updatedFields.f": {"$not": {"$eq": "b"}}}, [(2, 0), (2, 1), (3, 1)]),
    ({UD + ".updatedFields.g": {"$not": {"$exists": True}}}, [(2, 0), (3, 0), (3, 1)]),
    ({UD + ".updatedFields.g": {"$eq": None}}, [(2, 0), (3, 0), (3, 1)]),
    ({UD + ".removedFields": {"$not": {"$eq": "z"}}}, [(3, 0), (3, 1)]),
    ({UD + ".removedFields": {"$not": {"$in": ["y", "z"]}}}, [(3, 0)]),
]


@pytest.mark.parametrize("reverse_shards", [False, True], ids=["s0s1", "s1s0"])
@pytest.mark.parametrize("mode", MODES)
def test_update_description_rewrite(
    mongos: Any, cluster: Any, mode: str, reverse_shards: bool
) -> None:
    s0, s1 = (1, 0) if reverse_shards else (0, 1)
    coll = create_sharded_collection(mongos, cluster, "shard", DB, f"{BASE}{s0}{s1}", 1)
    with coll.watch([]) as stream:
        resume_after = stream.resume_token
    w = {"h": 5, "k": 5, "l": 5}

    def writes() -> None:
        for i, s in ((2, s0), (2, s1), (3, s0), (3, s1)):
            coll.insert_one({"_id": i, "shard": s})
        coll.replace_one({"_id": 2, "shard": s0}, {"_id": 2, "shard": s0, "z": 4, "f": "a", "w": w})
        coll.replace_one({"_id": 2, "shard": s1}, {"_id": 2, "shard": s1, "z": 4, "f": "a", "w": w})
        coll.replace_one({"_id": 3, "shard": s0}, {"_id": 3, "shard": s0, "1": 4, "f": "a", "w": w})
        coll.replace_one({"_id": 3, "shard": s1}, {"_id": 3, "shard": s1, "y": 4, "f": "a", "w": w})
        if reverse_shards:
            coll.update_one({"_id": 2, "shard": s0}, {"$unset": {"z": 0}})
            coll.update_one({"_id": 2, "shard": s1}, [{"$set": {"g": "c"}}, {"$unset": "z"}])
        else:
            coll.update_one({"_id": 2, "shard": s0}, [{"$unset": ["z"]}])
            coll.update_one({"_id": 2, "shard": s1}, {"$set": {"g": "c"}, "$unset": {"z": 0}})
        coll.update_one({"_id": 3, "shard": s0},
                        {"$set": {"f": "b", "x": {"j": 7}}, "$unset": {"w.h": 0, "1": 0}})
        coll.update_one({"_id": 3, "shard": s1},
                        {"$set": {"0": "d", "x": {"j": 7}}, "$unset": {"y": 0, "w.h": 0}})
        for i, s in ((2, s0), (2, s1), (3, s0), (3, s1)):
            coll.delete_one({"_id": i, "shard": s})

    def open_stream(match: dict[str, Any], live: bool) -> Any:
        return coll.watch([{"$match": match}], resume_after=None if live else resume_after,
                          max_await_time_ms=1)

    shard_of = {0: s0, 1: s1}
    cases = [({"operationType": OP, **m}, [(OP, i, shard_of[s]) for i, s in expected])
             for m, expected in CASES]
    run_cases(mode, open_stream, [(writes, cases)],
              lambda e: (e["operationType"], e["documentKey"]["_id"], e["documentKey"]["shard"]))
