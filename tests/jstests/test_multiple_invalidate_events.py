"""Translated from mongodb/mongo `jstests/change_streams/multiple_invalidate_events.js` @
b73d967ba7133618ce8aa9bc6f613ab02ec1e087: resuming (startAfter) a collection or database
stream from an invalidate, again and again, as the collection or database is dropped and
recreated."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

DB = "multiple_invalidate_events"
COLL = "test"
MATCH = {"$match": {"operationType": {"$nin": ["createIndexes", "dropIndexes",
                                               "shardCollection"]}}}
CREATE = {"operationType": "create", "ns": {"db": DB, "coll": COLL}, "nsType": "collection"}
DROP = {"operationType": "drop", "ns": {"db": DB, "coll": COLL}}
DROP_DATABASE = {"operationType": "dropDatabase", "ns": {"db": DB}}
INVALIDATE = {"operationType": "invalidate"}


def insert_event(_id: int, a: int) -> dict[str, Any]:
    return {"operationType": "insert", "fullDocument": {"_id": _id, "a": a},
            "ns": {"db": DB, "coll": COLL}, "documentKey": {"_id": _id}}


class Streams:
    """`openChangeStream`: a new ChangeStreamTest each time, the old one cleaned up."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.cst: ChangeStreamTest | None = None

    def open(self, collection: Any, resume_token: Any = None) -> tuple[ChangeStreamTest, Any]:
        if self.cst is not None:
            self.cst.clean_up()
        self.cst = ChangeStreamTest(self.db)
        stage: dict[str, Any] = {"showExpandedEvents": True}
        if resume_token is not None:
            stage["startAfter"] = resume_token
        return self.cst, self.cst.start_watching_changes([{"$changeStream": stage}, MATCH],
                                                          collection)


@pytest.fixture
def streams(client: Any) -> Any:
    db = client[DB]
    s = Streams(db)
    yield s
    if s.cst is not None:
        s.cst.clean_up()
    client.drop_database(DB)


def _recreate(db: Any) -> Any:
    db.drop_collection(COLL)
    db.create_collection(COLL)
    return db[COLL]


def test_collection_stream_resumes_from_multiple_drop_events(client: Any, streams: Any) -> None:
    db = client[DB]
    cst, cursor = streams.open(COLL)
    cst.assert_no_change(cursor)

    coll = _recreate(db)
    coll.insert_one({"_id": 0, "a": 1})
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(0, 1)])

    coll.drop()
    cst.assert_next_changes_equal(cursor, [DROP, INVALIDATE], expect_invalidate=True)
    token = cst.get_resume_token(cursor)

    db.create_collection(COLL)
    coll.insert_one({"_id": 1, "a": 2})
    coll.drop()
    cst, cursor = streams.open(COLL, token)
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(1, 2), DROP, INVALIDATE],
                                  expect_invalidate=True)
    token = cst.get_resume_token(cursor)

    db.create_collection(COLL)
    coll.insert_one({"_id": 2, "a": 3})
    client.drop_database(DB)  # drops the collection first
    cst, cursor = streams.open(COLL, token)
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(2, 3), DROP, INVALIDATE],
                                  expect_invalidate=True)
    token = cst.get_resume_token(cursor)

    db.create_collection(COLL)
    coll.insert_one({"_id": 3, "a": 4})
    # The collection still exists: no drop, no invalidate.
    cst, cursor = streams.open(COLL, token)
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(3, 4)])
    cst.assert_no_change(cursor)


def test_database_stream_resumes_from_multiple_drop_events(client: Any, streams: Any) -> None:
    db = client[DB]
    cst, cursor = streams.open(1)
    cst.assert_no_change(cursor)

    coll = _recreate(db)
    coll.insert_one({"_id": 0, "a": 1})
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(0, 1)])

    client.drop_database(DB)
    cst.assert_next_changes_equal(cursor, [DROP, DROP_DATABASE, INVALIDATE],
                                  expect_invalidate=True)
    token = cst.get_resume_token(cursor)

    db.create_collection(COLL)
    coll.insert_one({"_id": 1, "a": 2})
    client.drop_database(DB)
    cst, cursor = streams.open(1, token)
    cst.assert_next_changes_equal(
        cursor, [CREATE, insert_event(1, 2), DROP, DROP_DATABASE, INVALIDATE],
        expect_invalidate=True,
    )
    token = cst.get_resume_token(cursor)

    db.create_collection(COLL)
    coll.insert_one({"_id": 2, "a": 3})
    cst, cursor = streams.open(1, token)
    cst.assert_next_changes_equal(cursor, [CREATE, insert_event(2, 3)])
    cst.assert_no_change(cursor)
