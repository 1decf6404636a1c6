"""Translated from mongodb/mongo `jstests/change_streams/show_expanded_events.js` @
00587bf02e46e8251e876b26d93b9c0df1bf216d: a whole-db stream with showExpandedEvents sees CRUD,
drop, rename (with and without dropTarget) and dropDatabase events with their expanded fields
(collectionUUID, operationDescription, disambiguatedPaths)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest
from cst import ChangeStreamTest, assert_change_stream_event_eq
from pymongo.errors import OperationFailure

DB = "show_expanded_events"
COLL = "enriched_events"
RENAMED = "enriched_events_renamed"
NS = {"db": DB, "coll": COLL}
RENAMED_NS = {"db": DB, "coll": RENAMED}
PIPELINE = [{"$changeStream": {"showExpandedEvents": True}}]


def test_show_expanded_events(client: Any) -> None:
    db = client[DB]
    # Not allowed with apiStrict.
    with pytest.raises(OperationFailure) as raised:
        db.command({"aggregate": 1, "pipeline": PIPELINE, "cursor": {}, "apiVersion": "1",
                    "apiStrict": True})
    assert raised.value.code == 323  # APIStrictError
    db.command({"aggregate": 1, "pipeline": PIPELINE, "cursor": {}})

    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    test = ChangeStreamTest(db)
    state = {"cursor": test.start_watching_changes(PIPELINE, 1)}

    def open_cursor() -> None:
        state["cursor"] = test.start_watching_changes(PIPELINE, 1)

    def uuid_of(name: str) -> Any:
        return next(db.list_collections(filter={"name": name}))["info"]["uuid"]

    def assert_next_change_event(expected: dict, check_uuid: bool = True) -> None:
        event = test.get_one_change(state["cursor"])
        assert check_uuid or "collectionUUID" not in event
        assert isinstance(event["wallTime"], datetime.datetime)
        del event["wallTime"]
        assert_change_stream_event_eq(event, expected)

    def assert_change_event(op: Callable[[], Any], expected: dict, check_uuid: bool = True) -> None:
        if check_uuid:
            expected["collectionUUID"] = uuid_of(expected["ns"]["coll"])
        op()
        assert_next_change_event(expected, check_uuid)

    assert_change_event(lambda: coll.insert_one({"_id": 0, "a": 1}), {
        "ns": NS, "operationType": "insert", "documentKey": {"_id": 0},
        "fullDocument": {"_id": 0, "a": 1}})
    assert_change_event(lambda: coll.replace_one({"_id": 0}, {"_id": 0, "a": 2}), {
        "ns": NS, "operationType": "replace", "documentKey": {"_id": 0},
        "fullDocument": {"_id": 0, "a": 2}})
    assert_change_event(lambda: coll.update_one({"_id": 0}, {"$inc": {"a": 1}}), {
        "ns": NS, "operationType": "update", "documentKey": {"_id": 0},
        "updateDescription": {"removedFields": [], "updatedFields": {"a": 3},
                              "truncatedArrays": [], "disambiguatedPaths": {}}})
    assert_change_event(lambda: coll.delete_one({"_id": 0}), {
        "ns": NS, "operationType": "delete", "documentKey": {"_id": 0}})
    assert_change_event(lambda: db.command("drop", COLL), {"ns": NS, "operationType": "drop"})
    db.create_collection(COLL)
    open_cursor()

    # rename, dropTarget false.
    assert_change_event(lambda: coll.rename(RENAMED), {
        "ns": NS, "operationType": "rename", "to": RENAMED_NS,
        "operationDescription": {"to": RENAMED_NS}})
    db.command("drop", RENAMED)
    db.create_collection(COLL)
    open_cursor()

    # rename, dropTarget true, the target missing.
    assert_change_event(lambda: coll.rename(RENAMED, dropTarget=True), {
        "ns": NS, "operationType": "rename", "to": RENAMED_NS,
        "operationDescription": {"to": RENAMED_NS}})
    db.command("drop", RENAMED)
    db.create_collection(COLL)
    open_cursor()

    # rename, dropTarget true, the target existing.
    db.create_collection(RENAMED)
    assert_next_change_event({
        "ns": RENAMED_NS, "operationType": "create",
        "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
        "nsType": "collection"})
    target_uuid = uuid_of(RENAMED)
    assert_change_event(lambda: coll.rename(RENAMED, dropTarget=True), {
        "ns": NS, "operationType": "rename", "to": RENAMED_NS,
        "operationDescription": {"dropTarget": target_uuid, "to": RENAMED_NS}})
    db.command("drop", RENAMED)

    # dropDatabase (its collections are all dropped already).
    open_cursor()
    assert_change_event(lambda: client.drop_database(DB),
                        {"ns": {"db": DB}, "operationType": "dropDatabase"}, check_uuid=False)
