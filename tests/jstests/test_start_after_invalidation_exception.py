"""Translated from mongodb/mongo `jstests/change_streams/start_after_invalidation_exception.js`
@ 5324ef1fab3f06ad008050ac12fadb12b8de877c: a stream whose $match filters out the invalidate
still closes on it, its last resume token is the invalidate's, and `startAfter` that token
with the same $match works (the resume point, filtered out, is not required to be seen)."""

from __future__ import annotations

from typing import Any

from cst import SOON_TRIES

DB = "change_stream_check_resumability"
COLL = "test"


def test_start_after_filtered_invalidate(client: Any) -> None:
    db = client[DB]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]

    cursor = coll.watch([{"$match": {"operationType": "insert"}}])
    coll.insert_one({"_id": 0, "a": 1})
    event = cursor.next()
    assert event["operationType"] == "insert"
    assert event["fullDocument"] == {"_id": 0, "a": 1}

    # Dropping the database invalidates the stream: no event is seen, but the stream closes.
    client.drop_database(DB)
    for _ in range(SOON_TRIES):
        assert cursor.try_next() is None
        if not cursor.alive:
            break
    assert not cursor.alive

    # The final resume token is the invalidate's.
    invalidate_token = cursor.resume_token

    db.create_collection(COLL)
    coll.insert_one({"_id": 1, "a": 101})
    cursor = coll.watch([{"$match": {"operationType": "insert"}}], start_after=invalidate_token)
    event = cursor.next()
    assert event["operationType"] == "insert"
    assert event["fullDocument"] == {"_id": 1, "a": 101}
