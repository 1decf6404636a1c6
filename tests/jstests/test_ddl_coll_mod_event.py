"""Translated from mongodb/mongo `jstests/change_streams/ddl_coll_mod_event.js` @
35cfa5f274d054269891697f16c3c84209c0f71a: `modify` events (showExpandedEvents) for collMod of
an index's `hidden` / `expireAfterSeconds` and of the validator, validation level and action,
with `stateBeforeChange`, for whole-db and collection streams."""

from __future__ import annotations

from typing import Any

import pytest
from bson.int64 import Int64
from cst import ChangeStreamTest

DB = "ddl_coll_mod_event"
COLL = "ddl_coll_mod_event"
NS = {"db": DB, "coll": COLL}
PIPELINE = [{"$changeStream": {"showExpandedEvents": True}}]
SCHEMA_VALIDATOR = {"$jsonSchema": {"bsonType": "object", "properties": {
    "a": {"bsonType": "number"}, "b": {"bsonType": "number"}, "c": {"bsonType": "number"}}}}


@pytest.mark.parametrize("watch", [1, COLL], ids=["whole db", "collection"])
def test_coll_mod_events(client: Any, watch: Any) -> None:
    db = client[DB]
    cst = ChangeStreamTest(db)

    def start() -> Any:
        return cst.start_watching_changes(PIPELINE, watch)

    def uuid() -> Any:
        return next(db.list_collections(filter={"name": COLL}))["info"]["uuid"]

    def next_is(cursor: Any, expected: dict) -> None:
        cst.assert_next_changes_equal(cursor, [expected])

    db.command({"create": COLL})
    db[COLL].insert_one({"a": 1, "b": 1, "c": 1})

    def coll_mod_index(key: dict, options: dict) -> None:
        name = "_".join(f"{k}_{v}" for k, v in key.items())
        db.command({"createIndexes": COLL, "indexes": [{"key": key, "name": name, **options}]})
        cursor = start()
        toggle = {"index": {"name": name, "hidden": not options.get("hidden", False)}}
        undo = {"index": {"name": name, "hidden": bool(options.get("hidden", False))}}
        db.command({"collMod": COLL, "index": toggle["index"]})
        db.command({"collMod": COLL, "index": undo["index"]})
        next_is(cursor, {"operationType": "modify", "ns": NS, "operationDescription": toggle,
                         "stateBeforeChange": {"collectionOptions": {"uuid": uuid()},
                                               "indexOptions": {
                                                   "hidden": not toggle["index"]["hidden"]}}})
        next_is(cursor, {"operationType": "modify", "ns": NS, "operationDescription": undo,
                         "stateBeforeChange": {"collectionOptions": {"uuid": uuid()},
                                               "indexOptions": {
                                                   "hidden": not undo["index"]["hidden"]}}})
        if options.get("expireAfterSeconds"):
            ttl = {"index": {"name": name, "expireAfterSeconds": Int64(100000)}}
            db.command({"collMod": COLL, "index": ttl["index"]})
            next_is(cursor, {"operationType": "modify", "ns": NS, "operationDescription": ttl,
                             "stateBeforeChange": {"collectionOptions": {"uuid": uuid()},
                                                   "indexOptions": options}})
        db.command({"dropIndexes": COLL, "index": [name]})

    coll_mod_index({"a": 1}, {})
    coll_mod_index({"b": 1}, {"hidden": True})
    coll_mod_index({"c": 1}, {"expireAfterSeconds": Int64(100000)})

    # The validator, then the validation level, then the validation action.
    cursor = start()
    db.command({"collMod": COLL, "validator": SCHEMA_VALIDATOR})
    next_is(cursor, {"operationType": "modify", "ns": NS,
                     "operationDescription": {"validator": SCHEMA_VALIDATOR},
                     "stateBeforeChange": {"collectionOptions": {"uuid": uuid()}}})
    db.command({"collMod": COLL, "validationLevel": "off"})
    next_is(cursor, {"operationType": "modify", "ns": NS,
                     "operationDescription": {"validationLevel": "off"},
                     "stateBeforeChange": {"collectionOptions": {
                         "uuid": uuid(), "validator": SCHEMA_VALIDATOR,
                         "validationLevel": "strict", "validationAction": "error"}}})
    db.command({"collMod": COLL, "validationAction": "warn"})
    next_is(cursor, {"operationType": "modify", "ns": NS,
                     "operationDescription": {"validationAction": "warn"},
                     "stateBeforeChange": {"collectionOptions": {
                         "uuid": uuid(), "validator": SCHEMA_VALIDATOR,
                         "validationLevel": "off", "validationAction": "error"}}})
    db[COLL].drop()
    cst.clean_up()
