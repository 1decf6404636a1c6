"""Translated from mongodb/mongo `jstests/change_streams/change_stream_large_event_resumption.js`
@ 24266cc85a44680c8b834fb713eef399a7281521: a consumer recovers from BSONObjectTooLarge by
resuming from the previous event with fullDocument projected out, then resumes with full
documents again; the events before the too-large one are all delivered first.

The shell's cursor (`cst.ShellCursor`), not pymongo's: the jstest's `batchSize: 1` holds for its
getMores, where pymongo asks for 2 (so that mongod, too, would fail the getMore holding the
event before the too-large one)."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from cst import ShellCursor
from pymongo.errors import OperationFailure

BSON_OBJECT_TOO_LARGE = 10334
LARGE = 16 * 1024 * 1024 - len(bson.encode({"_id": "large1", "value": "x"})) + 1


def _events(coll: Any) -> list[tuple[Any, str, bool, Any]]:
    """(documentKey._id, operationType, too large with fullDocument, the write)."""
    return [
        ("large1", "insert", False,
         lambda: coll.insert_one({"_id": "large1", "value": "x" * LARGE})),
        (1, "insert", False, lambda: coll.insert_one({"_id": 1})),
        ("large1", "update", True,
         lambda: coll.update_one({"_id": "large1"}, {"$set": {"value": "y" * LARGE}})),
        (2, "insert", False, lambda: coll.insert_one({"_id": 2})),
        (3, "insert", False, lambda: coll.insert_one({"_id": 3})),
        ("large2", "insert", False,
         lambda: coll.insert_one({"_id": "large2", "value": "x" * LARGE})),
        ("large2", "update", True,
         lambda: coll.update_one({"_id": "large2"}, {"$set": {"value": "y" * LARGE}})),
        (4, "insert", False, lambda: coll.insert_one({"_id": 4})),
    ]


def _next(cursor: ShellCursor) -> Any:
    cursor.soon_has_next()
    return cursor.next()


def test_large_event_resumption(client: Any) -> None:
    db = client["change_stream_large_event_resumption"]
    db.drop_collection("coll")
    db.create_collection("coll")
    coll = db["coll"]
    start = db.command("ping")["$clusterTime"]["clusterTime"]  # getClusterTime
    events = _events(coll)
    for *_, write in events:
        write()

    def watch(pipeline: list[Any], **options: Any) -> ShellCursor:
        return ShellCursor(coll, pipeline, batch_size=1, **options)

    cursor = watch([], startAtOperationTime=start, fullDocument="updateLookup")

    def check(expected: tuple, expect_full_document: bool) -> None:
        event = _next(cursor)
        assert event["documentKey"]["_id"] == expected[0], event["operationType"]
        assert event["operationType"] == expected[1]
        assert ("fullDocument" in event) == expect_full_document

    full_document_mode = True
    last_token = None
    i = 0
    while i < len(events):
        expected = events[i]
        if full_document_mode and expected[2]:
            with pytest.raises(OperationFailure) as raised:
                _next(cursor)
            assert raised.value.code == BSON_OBJECT_TOO_LARGE
            cursor.close()
            cursor = watch([{"$project": {"fullDocument": 0}}], resumeAfter=last_token)
            full_document_mode = False
        check(expected, full_document_mode)
        last_token = cursor.get_resume_token()
        if not full_document_mode:
            i += 1
            check(events[i], False)
            last_token = cursor.get_resume_token()
            full_document_mode = True
            cursor.close()
            cursor = watch([], resumeAfter=last_token, fullDocument="updateLookup")
        i += 1
    cursor.close()
