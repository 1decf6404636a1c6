"""Translated from mongodb/mongo `jstests/change_streams/resume_expanded_events.js` @
00587bf02e46e8251e876b26d93b9c0df1bf216d: resuming (resumeAfter and startAfter) from the
tokens of expanded events (create, createIndexes, dropIndexes) gives the next event, for a
whole-db and a collection stream."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

DB = "resume_expanded_events"
COLL = "coll1"
NS = {"db": DB, "coll": COLL}


@pytest.mark.parametrize("watch", [1, COLL], ids=["whole db", "collection"])
def test_resume_expanded_events(client: Any, watch: Any) -> None:
    db = client[DB]
    test = ChangeStreamTest(db)
    pipeline: list[Any] = [{"$changeStream": {"showExpandedEvents": True}}]
    cursor = test.start_watching_changes(pipeline, watch, {"cursor": {"batchSize": 0}})

    def next_is(expected: dict) -> dict:
        return test.assert_next_changes_equal(cursor, [expected])[0]

    db.create_collection(COLL)
    create = next_is({"operationType": "create", "ns": NS, "nsType": "collection",
                      "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1},
                                                           "name": "_id_"}}})
    db[COLL].create_index([("a", 1)])
    create_indexes1 = next_is({"operationType": "createIndexes", "ns": NS, "operationDescription":
                               {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}})
    db[COLL].insert_one({"_id": 1, "a": 1, "b": 1})
    insert1 = next_is({"operationType": "insert", "ns": NS, "fullDocument": {"_id": 1, "a": 1,
                                                                              "b": 1},
                       "documentKey": {"_id": 1}})
    db[COLL].create_index([("b", -1)])
    create_indexes2 = next_is({"operationType": "createIndexes", "ns": NS, "operationDescription":
                               {"indexes": [{"v": 2, "key": {"b": -1}, "name": "b_-1"}]}})
    db.command({"dropIndexes": COLL, "index": {"b": -1}})
    drop_indexes = next_is({"operationType": "dropIndexes", "ns": NS, "operationDescription":
                            {"indexes": [{"v": 2, "key": {"b": -1}, "name": "b_-1"}]}})
    db[COLL].insert_one({"_id": 2, "a": 2, "b": 2})
    insert2 = next_is({"operationType": "insert", "ns": NS, "fullDocument": {"_id": 2, "a": 2,
                                                                              "b": 2},
                       "documentKey": {"_id": 2}})

    for option in ["resumeAfter", "startAfter"]:
        for event, following in [(create, create_indexes1), (create_indexes1, insert1),
                                 (create_indexes2, drop_indexes), (drop_indexes, insert2)]:
            resumed = test.start_watching_changes(
                [{"$changeStream": {"showExpandedEvents": True, option: event["_id"]}}], watch
            )
            # The expected event is the one seen before, token and all.
            test.assert_next_changes_equal(resumed, [following])
    db[COLL].drop()
    test.clean_up()
