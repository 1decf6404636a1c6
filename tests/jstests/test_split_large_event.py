"""Translated from mongodb/mongo `jstests/change_streams/split_large_event.js` @
7c316d4b88fef6588de83521f31852eeea3a2830: `$changeStreamSplitLargeEvent`'s placement errors,
events over 16 MiB failing with BSONObjectTooLarge without it and split into fragments with it,
and resuming from a fragment's token (with the stage, with a changed pipeline, without images,
without the stage)."""

from __future__ import annotations

import math
from typing import Any

import bson
import pytest
from pymongo.errors import OperationFailure

ILLEGAL_OPERATION = 20
BSON_OBJECT_TOO_LARGE = 10334
CHANGE_STREAM_FATAL_ERROR = 280
DB = "split_large_event"
LARGE = 16 * 1024 * 1024 - len(bson.encode({"_id": "aaa", "a": "x"})) + 1


def _fails_with(code: int, fn: Any) -> None:
    with pytest.raises(OperationFailure) as raised:
        fn()
    assert raised.value.code == code, raised.value.details


def _drain_first(stream: Any) -> Any:
    """`assert.soon(() => cursor.hasNext()); cursor.next()`."""
    for _ in range(200):
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError("no event")


def _metric(client: Any, name: str) -> float:
    """The shell's `serverStatus().metrics.changeStreams[name]` summed from 0: NaN when absent."""
    value = client.admin.command("serverStatus")["metrics"]["changeStreams"].get(name)
    return math.nan if value is None else 0 + value


def _reconstruct(stream: Any, count: int) -> tuple[dict[str, Any], list[Any]]:
    event: dict[str, Any] = {}
    tokens: list[Any] = []
    for number in range(1, count + 1):
        fragment = _drain_first(stream)
        assert fragment["splitEvent"] == {"fragment": number, "of": count}
        event.update(fragment)
        tokens.append(fragment["_id"])
        event.pop("splitEvent", None)
        event.pop("_id", None)
    return event, tokens


def _validate(event: dict[str, Any], expected_id: str) -> None:
    assert event["operationType"] == "update"
    assert event["documentKey"]["_id"] == expected_id
    assert event["fullDocument"]["_id"] == expected_id
    assert len(event["fullDocument"]["a"]) == LARGE
    assert event["fullDocumentBeforeChange"]["_id"] == expected_id
    assert len(event["fullDocumentBeforeChange"]["a"]) == LARGE
    assert len(event["updateDescription"]["updatedFields"]["a"]) == LARGE


def test_split_large_event(client: Any) -> None:
    db = client[DB]
    db.drop_collection("test")
    db.create_collection("test")
    coll = db["test"]

    # Not allowed outside a $changeStream pipeline.
    _fails_with(ILLEGAL_OPERATION, lambda: db.command(
        {"aggregate": "test", "pipeline": [{"$changeStreamSplitLargeEvent": {}}], "cursor": {}}
    ))
    # Only once in the pipeline.
    _fails_with(7182802, lambda: db.command({"aggregate": "test", "pipeline": [
        {"$changeStream": {}}, {"$changeStreamSplitLargeEvent": {}},
        {"$changeStreamSplitLargeEvent": {}}], "cursor": {}}))
    # Only as the last stage.
    _fails_with(7182802, lambda: db.command({"aggregate": "test", "pipeline": [
        {"$changeStream": {}}, {"$changeStreamSplitLargeEvent": {}},
        {"$project": {"fullDocument": 0}}], "cursor": {}}))

    coll.insert_many([{"_id": "aaa", "a": "x" * LARGE}, {"_id": "bbb", "a": "x" * LARGE}])
    db.command({"collMod": "test", "changeStreamPreAndPostImages": {"enabled": True}})

    stream = coll.watch([])
    start_token = stream.resume_token
    coll.update_one({"_id": "aaa"}, {"$set": {"a": "y" * LARGE}})
    coll.update_one({"_id": "bbb"}, {"$set": {"a": "y" * LARGE}})

    # Without pre- and post-images the stage is not needed.
    event = _drain_first(stream)
    assert event["documentKey"]["_id"] == "aaa"
    assert "splitEvent" not in event
    stream.close()

    # Events under the limit pass the stage unchanged.
    with coll.watch([{"$changeStreamSplitLargeEvent": {}}], resume_after=start_token) as s:
        event = _drain_first(s)
        assert event["documentKey"]["_id"] == "aaa"
        assert "splitEvent" not in event

    tokens: list[Any] = []
    for mode in ["required", "updateLookup"]:
        images = {"full_document": mode, "full_document_before_change": "required"}
        # Over the limit without the stage: BSONObjectTooLarge, counted in largeEventsFailed.
        failed_before = _metric(client, "largeEventsFailed")
        s = coll.watch([], batch_size=0, resume_after=start_token, **images)
        _fails_with(BSON_OBJECT_TOO_LARGE, lambda s=s: _drain_first(s))
        assert _metric(client, "largeEventsFailed") - failed_before in (1, 2)

        # With the stage: three fragments that reassemble into the event.
        with coll.watch([{"$changeStreamSplitLargeEvent": {}}], batch_size=0,
                        resume_after=start_token, **images) as s:
            # The jstest reads "largeEventSplit", which mongod does not have (its counter is
            # largeEventsSplit): NaN before and after, equal as the shell's assert.eq sees them.
            split_before = _metric(client, "largeEventSplit")
            event, tokens = _reconstruct(s, 3)
            _validate(event, "aaa")
            event2, _ = _reconstruct(s, 3)
            _validate(event2, "bbb")
            assert str(split_before + 2) == str(_metric(client, "largeEventSplit"))

        # A $match over fields summing to more than 16 MiB does not throw.
        match = {"$match": {"$or": [{"fullDocument": {"$exists": True}},
                                    {"fullDocumentBeforeChange": {"$exists": True}},
                                    {"updateDescription": {"$exists": True}}]}}
        with coll.watch([match, {"$changeStreamSplitLargeEvent": {}}],
                        resume_after=start_token, **images) as s:
            assert _reconstruct(s, 3)[1] == tokens

        # Resumed from the second-last fragment: only the last fragment follows.
        with coll.watch([{"$changeStreamSplitLargeEvent": {}}], resume_after=tokens[-2],
                        **images) as s:
            event = _drain_first(s)
            assert len(event["updateDescription"]["updatedFields"]["a"]) == LARGE
            assert event["splitEvent"] == {"fragment": len(tokens), "of": len(tokens)}

        # Projecting out a large field changes the split: the resume point is never produced.
        s = coll.watch([{"$project": {"fullDocument.a": 0}}, {"$changeStreamSplitLargeEvent": {}}],
                       batch_size=0, resume_after=tokens[-1], **images)
        _fails_with(CHANGE_STREAM_FATAL_ERROR, lambda s=s: _drain_first(s))

    # With optimization inhibited the stage cannot move where it must be.
    _fails_with(7182803, lambda: db.command({"aggregate": "test", "pipeline": [
        {"$changeStream": {"resumeAfter": tokens[-2]}}, {"$_internalInhibitOptimization": {}},
        {"$changeStreamSplitLargeEvent": {}}], "cursor": {}}))

    # Resumed from a fragment without images: the event is too small to be split.
    s = coll.watch([{"$changeStreamSplitLargeEvent": {}}], batch_size=0, resume_after=tokens[-1])
    _fails_with(CHANGE_STREAM_FATAL_ERROR, lambda: _drain_first(s))

    # Resumed from a fragment without the stage.
    _fails_with(CHANGE_STREAM_FATAL_ERROR, lambda: coll.watch([], resume_after=tokens[-2]))
