"""Translated from mongodb/mongo `jstests/change_streams/ddl_create_event.js` @
00587bf02e46e8251e876b26d93b9c0df1bf216d: `create` events (showExpandedEvents) carry the
collection's options as mongod records them, for whole-db and collection streams. The file's
`create` with `timeseries` (no event) is left out: cdcserver's embedded store has no
time-series collections (README.md lists it)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest
from bson.int64 import Int64
from cst import ChangeStreamTest, assert_change_stream_event_eq

DB = "ddl_create_event"
COLL = "ddl_create_event"
NS = {"db": DB, "coll": COLL}
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
PIPELINE = [{"$changeStream": {"showExpandedEvents": True}}]
COLLATION = {
    "locale": "en", "caseLevel": False, "caseFirst": "off", "strength": 3,
    "numericOrdering": False, "alternate": "non-ignorable", "maxVariable": "punct",
    "normalization": False, "backwards": True, "version": "57.1",
}
WIRED_TIGER = {"wiredTiger": {"configString": "block_compressor=zlib"}}

# (create command options, the event's operationDescription, or None when the event has none)
CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("basic", {}, {"idIndex": ID_INDEX}),
    ("capped", {"capped": True, "size": 1000, "max": 1000},
     {"idIndex": ID_INDEX, "capped": True, "size": 1000, "max": 1000}),
    ("wiredTiger", {"indexOptionDefaults": {"storageEngine": WIRED_TIGER},
                    "storageEngine": WIRED_TIGER},
     {"idIndex": ID_INDEX, "indexOptionDefaults": {"storageEngine": WIRED_TIGER},
      "storageEngine": WIRED_TIGER}),
    ("validator", {"validator": {"a": 1}, "validationLevel": "off", "validationAction": "warn"},
     {"idIndex": ID_INDEX, "validator": {"a": 1}, "validationLevel": "off",
      "validationAction": "warn"}),
    ("collation", {"collation": COLLATION},
     {"collation": COLLATION, "idIndex": {**ID_INDEX, "collation": COLLATION}}),
    ("clustered", {"clusteredIndex": {"key": {"_id": 1}, "name": "newName", "unique": True},
                   "expireAfterSeconds": 10},
     {"clusteredIndex": {"v": 2, "key": {"_id": 1}, "name": "newName", "unique": True},
      "expireAfterSeconds": Int64(10)}),
    ("idIndex v2", {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "ignored"}},
     {"idIndex": ID_INDEX}),
    ("idIndex v1", {"idIndex": {"v": 1, "key": {"_id": 1}, "name": "new"}}, None),
]
WATCH = ["whole db", "collection"]


def _start(cst: ChangeStreamTest, watch: str) -> Callable[[], dict[str, Any]]:
    return lambda: cst.start_watching_changes(PIPELINE, 1 if watch == "whole db" else COLL)


def _collection_uuid(db: Any) -> Any:
    return next(db.list_collections(filter={"name": COLL}))["info"]["uuid"]


def _assert_next_change_event(cst: ChangeStreamTest, cursor: Any, expected: dict) -> None:
    event = cst.get_one_change(cursor)
    # wallTime must be a date; its value cannot be checked.
    assert isinstance(event["wallTime"], datetime.datetime)
    del event["wallTime"]
    expected["collectionUUID"] = _collection_uuid(cst.db)
    assert_change_stream_event_eq(event, expected)


@pytest.mark.parametrize("watch", WATCH)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_create_event(client: Any, watch: str, case: tuple) -> None:
    _, options, description = case
    db = client[DB]
    cst = ChangeStreamTest(db)
    cursor = _start(cst, watch)()
    db.command({"create": COLL, **options})
    expected: dict[str, Any] = {"operationType": "create", "ns": dict(NS), "nsType": "collection"}
    if description is not None:
        expected["operationDescription"] = description
    _assert_next_change_event(cst, cursor, expected)
    assert db.command("drop", COLL)["ok"] == 1


@pytest.mark.parametrize("watch", WATCH)
def test_implicit_create_through_insert(client: Any, watch: str) -> None:
    db = client[DB]
    cst = ChangeStreamTest(db)
    cursor = _start(cst, watch)()
    db.command({"insert": COLL, "documents": [{"_id": 0}]})
    _assert_next_change_event(cst, cursor, {
        "operationType": "create", "ns": dict(NS),
        "operationDescription": {"idIndex": ID_INDEX}, "nsType": "collection",
    })
    _assert_next_change_event(cst, cursor, {
        "operationType": "insert", "fullDocument": {"_id": 0}, "ns": dict(NS),
        "documentKey": {"_id": 0},
    })
    assert db.command("drop", COLL)["ok"] == 1
