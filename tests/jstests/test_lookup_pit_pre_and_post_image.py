"""Translated from mongodb/mongo `jstests/change_streams/lookup_pit_pre_and_post_image.js` @
0cbf0426f72a345ec93bd6142eedb8287d78b415: point-in-time pre- and post-images
(`fullDocumentBeforeChange` / `fullDocument` whenAvailable or required) before and after
`changeStreamPreAndPostImages` is enabled on the collection; `required` without a recorded
image fails with NoMatchingDocument. One case per `preAndPostImageTest` call.

The jstest compares with the shell's `assert.eq`: an absent field equals null, and documents
compare by their `tojson` (field order counts)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import SOON_TRIES
from pymongo.errors import OperationFailure

COLL = "test"
DB = "lookup_pit_pre_and_post_image"
NO_MATCHING_DOCUMENT = 47

ORIGINAL = {"_id": 1, "x": 1}
UPDATED = {"_id": 1, "x": 3}
UPDATED2 = {"_id": 1, "x": 5}
REPLACED = {"_id": 1, "z": 1}


def _eq(actual: Any, expected: Any) -> bool:
    """The shell's assert.eq: undefined == null; documents by tojson (ordered)."""
    if actual is None or expected is None:
        return actual is None and expected is None
    if isinstance(actual, dict) and isinstance(expected, dict):
        return list(actual) == list(expected) and all(
            _eq(actual[k], expected[k]) for k in actual)
    return bool(actual == expected)


def _next(stream: Any) -> dict[str, Any]:
    for _ in range(SOON_TRIES):
        event = stream.try_next()
        if event is not None:
            return dict(event)
    raise AssertionError("no event")


def _run(client: Any, options: dict[str, str], on_update_disabled: dict, on_update: dict,
         on_replace: dict, on_delete: dict) -> None:
    db = client[DB]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]

    def assert_no_internal_fields(event: dict[str, Any]) -> None:
        assert "preImageId" not in event, event
        assert "updateModification" not in event, event
        if "full_document_before_change" not in options:
            assert "fullDocumentBeforeChange" not in event, event
        if "full_document" not in options and event["operationType"] == "update":
            assert "fullDocument" not in event, event

    def assert_images(event: dict[str, Any], expected: dict) -> None:
        assert _eq(event.get("fullDocumentBeforeChange"), expected.get("pre")), event
        assert _eq(event.get("fullDocument"), expected.get("post")), event

    stream = coll.watch([], **options)
    coll.insert_one(dict(ORIGINAL))
    event = _next(stream)
    assert event["operationType"] == "insert"
    assert_no_internal_fields(event)

    coll.update_one(dict(ORIGINAL), {"$inc": {"x": 2}})
    if "required" in options.values():
        with pytest.raises(OperationFailure) as failure:
            _next(stream)
        assert failure.value.code == NO_MATCHING_DOCUMENT, failure.value.details
        stream = coll.watch([], **options)  # reopened: it starts after the update
    else:
        event = _next(stream)
        assert_images(event, on_update_disabled)
        assert_no_internal_fields(event)

    db.command({"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": True}})
    coll.update_one(dict(UPDATED), {"$inc": {"x": 2}})
    event = _next(stream)
    assert_images(event, on_update)
    assert_no_internal_fields(event)

    coll.replace_one(dict(UPDATED2), dict(REPLACED))
    event = _next(stream)
    assert_images(event, on_replace)
    assert event["operationType"] == "replace"
    assert_no_internal_fields(event)

    coll.delete_one(dict(REPLACED))
    event = _next(stream)
    assert _eq(event.get("fullDocumentBeforeChange"), on_delete.get("pre")), event
    assert "fullDocument" not in event, event
    assert event["operationType"] == "delete"
    assert_no_internal_fields(event)
    stream.close()


W, R = "whenAvailable", "required"
CASES = [
    # (change stream options, update before enabling, update, replace, delete)
    ({}, {}, {}, {"post": REPLACED}, {}),
    ({"full_document_before_change": W}, {"pre": None}, {"pre": UPDATED},
     {"pre": UPDATED2, "post": REPLACED}, {"pre": REPLACED}),
    ({"full_document": W}, {"post": None}, {"post": UPDATED2}, {"post": REPLACED}, {}),
    ({"full_document_before_change": W, "full_document": W}, {"pre": None, "post": None},
     {"pre": UPDATED, "post": UPDATED2}, {"pre": UPDATED2, "post": REPLACED},
     {"pre": REPLACED}),
    ({"full_document_before_change": R}, {}, {"pre": UPDATED},
     {"pre": UPDATED2, "post": REPLACED}, {"pre": REPLACED}),
    ({"full_document": R}, {}, {"post": UPDATED2}, {"post": REPLACED}, {}),
    ({"full_document_before_change": R, "full_document": R}, {},
     {"pre": UPDATED, "post": UPDATED2}, {"pre": UPDATED2, "post": REPLACED},
     {"pre": REPLACED}),
    ({"full_document_before_change": W, "full_document": R}, {},
     {"pre": UPDATED, "post": UPDATED2}, {"pre": UPDATED2, "post": REPLACED},
     {"pre": REPLACED}),
    ({"full_document_before_change": R, "full_document": W}, {},
     {"pre": UPDATED, "post": UPDATED2}, {"pre": UPDATED2, "post": REPLACED},
     {"pre": REPLACED}),
]


@pytest.mark.parametrize("case", CASES, ids=[
    ",".join(f"{k}={v}" for k, v in c[0].items()) or "default" for c in CASES])
def test_lookup_pit_pre_and_post_image(client: Any, case: tuple) -> None:
    _run(client, *case)
