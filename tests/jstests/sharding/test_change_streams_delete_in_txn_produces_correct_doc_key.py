"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_delete_in_txn_produces_correct_doc_key.js`
@ 05a9f6fe335c104fb2184e56e4ae64f27487f011 (`ChangeStreamTest`: `cst.py`), on a one-shard
cluster as the jstest's `ShardingTest({shards: 1})`: `delete` events of a transaction
(`deleteOne`, `deleteMany`, `findAndModify` with `remove`) on a collection sharded on
`{a: 1, _id: 1}` carry the documentKey `{a, _id}` (SERVER-45987), not the whole document, and
a stream resumes after the transaction's last one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest
from cst import ChangeStreamTest

from cdcserver.sharding.testing import ShardedServer

DB = "test"
COLL = "change_streams_delete_in_txn_produces_correct_doc_key"


@pytest.fixture
def s() -> Iterator[pymongo.MongoClient]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as client:
        yield client


def _delete(key: int) -> dict[str, Any]:
    return {"documentKey": {"a": 0, "_id": key}, "ns": {"db": DB, "coll": COLL},
            "operationType": "delete"}


CASES: dict[str, tuple[Callable[[Any, Any], Any], list[dict[str, Any]]]] = {
    "deleteOne": (lambda c, s: c.delete_one({"_id": 1}, session=s), [_delete(1)]),
    "deleteMany": (lambda c, s: c.delete_many({"a": 0, "_id": {"$gt": 0}}, session=s),
                   [_delete(1), _delete(2), _delete(3)]),
    "findAndModify": (lambda c, s: c.find_one_and_delete({"a": 0, "_id": 1}, session=s),
                      [_delete(1)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_delete_in_txn_produces_correct_doc_key(s, case):
    delete_command, expected = CASES[case]
    db = s[DB]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    s.admin.command("enableSharding", DB)
    s.admin.command("shardCollection", f"{DB}.{COLL}", key={"a": 1, "_id": 1})
    coll.insert_many([{"_id": 1, "a": 0, "fullDoc": "It's a full document!"},
                      {"_id": 2, "a": 0}, {"_id": 3, "a": 0}, {"_id": 4, "a": 1}])
    cst = ChangeStreamTest(db)
    try:
        cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)
        with s.start_session() as session:
            session.start_transaction()
            delete_command(coll, session)
            session.commit_transaction()
        changes = cst.assert_next_changes_equal(cursor, expected)

        cursor = cst.start_watching_changes(
            [{"$changeStream": {"resumeAfter": changes[-1]["_id"]}}], COLL)
        coll.insert_one({"a": 1, "_id": 5})
        assert list(cst.get_one_change(cursor)["documentKey"].items()) == [("a", 1), ("_id", 5)]
    finally:
        cst.clean_up()
