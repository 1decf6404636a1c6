"""Translated from mongodb/mongo `jstests/change_streams/lookup_pre_image.js` @
6af105aa73b7e3ed88186a14a5e832434af65863: `fullDocumentBeforeChange` off / whenAvailable /
required, with pre-images recorded and after recording is turned off (required then fails with
NoMatchingDocument or 51770)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest, assert_change_stream_event_eq
from pymongo.errors import OperationFailure

COLL = "change_stream_pre_images"


def test_lookup_pre_image(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    cst = ChangeStreamTest(db)
    db.command({"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": True}})

    def watch(before: str) -> Any:
        return cst.start_watching_changes([{"$changeStream": {
            "fullDocumentBeforeChange": before, "fullDocument": "updateLookup"}}], COLL)

    off, when_available, required = watch("off"), watch("whenAvailable"), watch("required")
    ns = {"db": "test", "coll": COLL}

    def update_event(_id: str) -> dict:
        return {"documentKey": {"_id": _id}, "fullDocument": {"_id": _id, "foo": "baz"},
                "ns": ns, "operationType": "update",
                "updateDescription": {"updatedFields": {"foo": "baz"}, "removedFields": [],
                                      "truncatedArrays": []}}

    # Insert: no pre-image anywhere.
    coll.insert_one({"_id": "x"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "insert"
    assert "fullDocumentBeforeChange" not in latest
    assert latest["fullDocument"] == {"_id": "x"}
    assert latest == cst.get_one_change(when_available)
    assert latest == cst.get_one_change(required)

    # Replacement.
    coll.replace_one({"_id": "x"}, {"foo": "bar"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "replace"
    assert "fullDocumentBeforeChange" not in latest
    assert latest["fullDocument"] == {"_id": "x", "foo": "bar"}
    latest["fullDocumentBeforeChange"] = {"_id": "x"}
    assert latest == cst.get_one_change(when_available)
    assert latest == cst.get_one_change(required)

    # Op-style update.
    coll.update_one({"_id": "x"}, {"$set": {"foo": "baz"}})
    latest = cst.assert_next_changes_equal(off, [update_event("x")])[0]
    latest["fullDocumentBeforeChange"] = {"_id": "x", "foo": "bar"}
    assert_change_stream_event_eq(cst.get_one_change(when_available), latest)
    assert_change_stream_event_eq(cst.get_one_change(required), latest)

    # Delete.
    coll.delete_one({"_id": "x"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "delete"
    assert "fullDocument" not in latest
    assert "fullDocumentBeforeChange" not in latest
    latest["fullDocumentBeforeChange"] = {"_id": "x", "foo": "baz"}
    assert latest == cst.get_one_change(when_available)
    assert latest == cst.get_one_change(required)

    # Pre-images off.
    db.command({"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": False}})
    coll.insert_one({"_id": "y"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "insert"
    assert "fullDocumentBeforeChange" not in latest
    assert latest["fullDocument"] == {"_id": "y"}
    assert latest == cst.get_one_change(when_available)
    assert latest == cst.get_one_change(required)

    coll.replace_one({"_id": "y"}, {"foo": "bar"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "replace"
    assert "fullDocumentBeforeChange" not in latest
    assert latest["fullDocument"] == {"_id": "y", "foo": "bar"}
    latest["fullDocumentBeforeChange"] = None
    assert latest == cst.get_one_change(when_available)
    with pytest.raises(OperationFailure) as raised:
        cst.get_one_change(required)
    assert raised.value.code in (47, 51770)  # NoMatchingDocument

    coll.update_one({"_id": "y"}, {"$set": {"foo": "baz"}})
    latest = cst.assert_next_changes_equal(off, [update_event("y")])[0]
    latest["fullDocumentBeforeChange"] = None
    assert_change_stream_event_eq(cst.get_one_change(when_available), latest)

    coll.delete_one({"_id": "y"})
    latest = cst.get_one_change(off)
    assert latest["operationType"] == "delete"
    assert "fullDocument" not in latest
    assert "fullDocumentBeforeChange" not in latest
    latest["fullDocumentBeforeChange"] = None
    assert latest == cst.get_one_change(when_available)
    db.drop_collection(COLL)
