"""Translated from mongodb/mongo `jstests/change_streams/ddl_view_events.js` @
00587bf02e46e8251e876b26d93b9c0df1bf216d: create / modify / drop events of views with
showExpandedEvents, resuming from each; no change stream on a view; a collection stream sees no
view events. The file's time-series segment (the create / modify / drop events of a time-series
collection's view) is left out: cdcserver's embedded store has no time-series collections
(README.md lists it)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import SOON_TRIES, ChangeStreamTest, assert_change_stream_event_eq
from pymongo.errors import OperationFailure

DB = "ddl_view_events"
VIEW_PIPELINE = [{"$match": {"a": 2}}, {"$project": {"a": 1}}]
EXPANDED = [{"$changeStream": {"showExpandedEvents": True}}]


def _next(stream: Any) -> Any:
    for _ in range(SOON_TRIES):
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError("no event")


def test_view_events_and_resume(client: Any) -> None:
    db = client[DB]
    for name in ("base", "view", "viewOnView"):
        db.drop_collection(name)
    db.create_collection("base")
    db["base"].insert_one({"_id": 1})

    cursor = db.watch([], show_expanded_events=True)
    db.command({"create": "view", "viewOn": "base", "pipeline": VIEW_PIPELINE})
    event = _next(cursor)
    assert event["clusterTime"] and event["wallTime"]
    assert_change_stream_event_eq(event, {
        "operationType": "create", "ns": {"db": DB, "coll": "view"},
        "operationDescription": {"viewOn": "base", "pipeline": VIEW_PIPELINE},
        "nsType": "view"})

    cursor = db.watch([], resume_after=event["_id"], show_expanded_events=True)
    db.command({"create": "viewOnView", "viewOn": "view", "pipeline": VIEW_PIPELINE})
    events = []
    create = _next(cursor)
    events.append(create)
    assert_change_stream_event_eq(create, {
        "operationType": "create", "ns": {"db": DB, "coll": "viewOnView"},
        "operationDescription": {"viewOn": "view", "pipeline": VIEW_PIPELINE},
        "nsType": "view"})

    updated = [{"$match": {"a": 1}}, {"$project": {"a": 1}}]
    db.command({"collMod": "viewOnView", "viewOn": "view", "pipeline": updated})
    modify = _next(cursor)
    events.append(modify)
    assert_change_stream_event_eq(modify, {
        "operationType": "modify", "ns": {"db": DB, "coll": "viewOnView"},
        "operationDescription": {"viewOn": "view", "pipeline": updated}})

    db.drop_collection("view")
    drop = _next(cursor)
    events.append(drop)
    assert_change_stream_event_eq(drop, {"operationType": "drop",
                                         "ns": {"db": DB, "coll": "view"}})
    db.drop_collection("viewOnView")
    drop = _next(cursor)
    events.append(drop)
    assert_change_stream_event_eq(drop, {"operationType": "drop",
                                         "ns": {"db": DB, "coll": "viewOnView"}})

    # A dummy event, so that every event above is resumed from.
    db.command({"create": "dummyView", "viewOn": "view", "pipeline": VIEW_PIPELINE})
    events.append(_next(cursor))
    db.drop_collection("dummyView")
    _next(cursor)

    for event, subsequent in zip(events, events[1:], strict=False):
        resumed = db.watch([], resume_after=event["_id"], show_expanded_events=True)
        assert_change_stream_event_eq(_next(resumed), subsequent)


def test_no_view_events_on_collection_streams(client: Any) -> None:
    db = client[DB]
    for name in ("base", "view"):
        db.drop_collection(name)
    db.create_collection("base")
    db["base"].insert_one({"_id": 1})
    cst = ChangeStreamTest(db)

    # No change stream on a view.
    db.command({"create": "view", "viewOn": "base", "pipeline": VIEW_PIPELINE})
    with pytest.raises(OperationFailure) as raised:
        cst.start_watching_changes(EXPANDED, "view")
    assert raised.value.code == 166  # CommandNotSupportedOnView

    # A stream on a name that is later a view, then a collection: only the collection's create.
    db.drop_collection("view")
    cursor = cst.start_watching_changes(EXPANDED, "view")
    db.command({"create": "view", "viewOn": "base", "pipeline": VIEW_PIPELINE})
    db.drop_collection("view")
    db.create_collection("view")
    event = cst.get_next_changes(cursor, 1)[0]
    assert event.get("collectionUUID"), event
    assert_change_stream_event_eq(event, {
        "operationType": "create", "ns": {"db": DB, "coll": "view"},
        "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
        "nsType": "collection"})

    # A collection stream on the base collection sees no view events.
    db.drop_collection("view")
    cursor = cst.start_watching_changes(EXPANDED, "base")
    db.command({"create": "view", "viewOn": "base", "pipeline": VIEW_PIPELINE})
    db.drop_collection("view")
    db["base"].insert_one({"_id": 0})
    event = cst.get_next_changes(cursor, 1)[0]
    assert event.get("collectionUUID"), event
    assert_change_stream_event_eq(event, {
        "operationType": "insert", "ns": {"db": DB, "coll": "base"},
        "fullDocument": {"_id": 0}, "documentKey": {"_id": 0}})
    cst.clean_up()
