"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_wallTime_rewrite.js` @
b73d967ba7133618ce8aa9bc6f613ab02ec1e087 (`requires_fcv_90`: what it checks of the events is
8.0's too: `wallTime` is the entry's `wall`): the events a whole-cluster stream resumed from one
token returns for `$match`es on `wallTime` (`$type`, `$gt`/`$lt` dates, `$exists`, `$expr`),
on a collection sharded on `_id` across two shards (`pushdown_util.py`), then the events of
transactions (their `wallTime` the commit's) through `{wallTime: {$gt: ...}}`. Left out: the
`executionStats` counts of each case (oplog entries each shard's cursor returned): cdcserver
has no explain of change streams."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pushdown_util import (
    MODES,
    cluster,
    create_sharded_collection,
    mongos,
    read_exactly,
    run_cases,
    whole_cluster_expected,
    whole_cluster_identity,
    whole_cluster_opener,
)

__all__ = ["cluster", "mongos"]

DB = "change_stream_match_pushdown_walltime_rewrite"
COLL = "coll1"
EPOCH = datetime.datetime(1970, 1, 1)
FUTURE = datetime.datetime(2099, 1, 1)
ALL = whole_cluster_expected({COLL: {"insert": [1, 2], "update": [1, 2], "delete": [1, 2]}})
CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"wallTime": {"$type": [9]}}, ALL),
    ({"wallTime": {"$gt": EPOCH}}, ALL),
    ({"wallTime": {"$gt": FUTURE}}, []),
    ({"wallTime": {"$lt": EPOCH}}, []),
    ({"wallTime": {"$exists": True}}, ALL),
    ({"wallTime": {"$exists": False}}, []),
    ({"$expr": {"$gt": ["$wallTime", FUTURE]}}, []),
]


@pytest.mark.parametrize("mode", MODES)
def test_wall_time_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll = create_sharded_collection(mongos, cluster, "_id", DB, COLL, 2)
    with coll.watch([]) as stream:
        resume_after = stream.resume_token

    def writes() -> None:
        coll.insert_one({"_id": 1})
        coll.insert_one({"_id": 2})
        coll.update_one({"_id": 1}, {"$set": {"foo": "bar"}})
        coll.update_one({"_id": 2}, {"$set": {"foo": "bar"}})
        coll.delete_one({"_id": 1})
        coll.delete_one({"_id": 2})

    run_cases(mode, whole_cluster_opener(mongos, resume_after), [(writes, CASES)],
              whole_cluster_identity)


def test_wall_time_in_transactions(mongos: Any, cluster: Any) -> None:
    coll = create_sharded_collection(mongos, cluster, "_id", DB, COLL, 2)
    with coll.watch([]) as stream:
        after_crud = stream.resume_token
    with mongos.start_session() as session, session.start_transaction():
        coll.insert_one({"_id": 3}, session=session)
    with coll.watch([{"$match": {"wallTime": {"$gt": EPOCH}}}], resume_after=after_crud,
                    max_await_time_ms=1) as stream:
        events = read_exactly(stream, 1)
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [("insert", 3)]

    with coll.watch([]) as stream:
        after_txn = stream.resume_token
    with mongos.start_session() as session, session.start_transaction():
        for i in range(10):
            coll.insert_one({"_id": 10 + i}, session=session)
    with coll.watch([{"$match": {"wallTime": {"$gt": EPOCH}}}], resume_after=after_txn,
                    max_await_time_ms=1) as stream:
        events = read_exactly(stream, 10)
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in events] == [
        ("insert", 10 + i) for i in range(10)]
    with coll.watch([{"$match": {"wallTime": {"$gt": FUTURE}}}], resume_after=after_txn,
                    max_await_time_ms=1) as stream:
        assert read_exactly(stream, 0) == []
