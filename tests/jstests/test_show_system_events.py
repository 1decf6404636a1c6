"""Translated from mongodb/mongo `jstests/change_streams/show_system_events.js` @
2572165d03ab73a8969dd60f5c0fbda20ad41aef: `showSystemEvents` (not with apiStrict) shows CRUD
events of `system.js` on whole-db streams; without it only renames involving a normal name
are shown; a collection stream never shows them."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest
from pymongo.errors import OperationFailure

DB = "show_system_events"
REGULAR = "test_coll"
SYSTEM = "system.js"
RENAMED = "collRenamed"


def _ns(coll: str) -> dict[str, str]:
    return {"db": DB, "coll": coll}


def _insert(coll: str, doc: dict) -> dict[str, Any]:
    return {"documentKey": {"_id": doc["_id"]}, "fullDocument": doc, "ns": _ns(coll),
            "operationType": "insert"}


def _rename_events() -> list[dict[str, Any]]:
    return [{"ns": _ns(SYSTEM), "to": _ns(RENAMED), "operationType": "rename"},
            {"ns": _ns(RENAMED), "to": _ns(SYSTEM), "operationType": "rename"}]


def test_show_system_events(client: Any) -> None:
    db = client[DB]
    with pytest.raises(OperationFailure) as raised:
        db.command({"aggregate": 1, "pipeline": [{"$changeStream": {"showSystemEvents": True}}],
                    "cursor": {}, "apiVersion": "1", "apiStrict": True})
    assert raised.value.code == 323  # APIStrictError

    test = ChangeStreamTest(db)
    regular, system = db[REGULAR], db[SYSTEM]
    db.drop_collection(REGULAR)

    def rename_system_and_back() -> None:
        system.rename(RENAMED)
        db[RENAMED].rename(SYSTEM)

    # A collection stream with showSystemEvents: only the regular collection.
    cursor = test.start_watching_changes(
        [{"$changeStream": {"showExpandedEvents": True, "showSystemEvents": True}}], REGULAR)
    regular.insert_one({"_id": 1, "a": 1})
    test.assert_next_changes_equal(cursor, [{"ns": _ns(REGULAR), "operationType": "create"}])
    system.insert_one({"_id": 1, "a": 1})
    system.replace_one({"_id": 1}, {"a": 2})
    system.delete_one({"_id": 1})
    rename_system_and_back()
    regular.insert_one({"_id": 2, "a": 2})
    test.assert_next_changes_equal(cursor, [_insert(REGULAR, {"_id": 1, "a": 1}),
                                            _insert(REGULAR, {"_id": 2, "a": 2})])

    # A whole-db stream with showSystemEvents: system.js CRUD events too.
    cursor = test.start_watching_changes(
        [{"$changeStream": {"showExpandedEvents": True, "showSystemEvents": True}}], 1)
    db.command("drop", REGULAR)
    test.assert_next_changes_equal(cursor, [{"ns": _ns(REGULAR), "operationType": "drop"}])
    regular.insert_one({"_id": 1, "a": 1})
    test.assert_next_changes_equal(cursor, [{"ns": _ns(REGULAR), "operationType": "create"},
                                            _insert(REGULAR, {"_id": 1, "a": 1})])
    system.insert_one({"_id": 2, "b": 1})
    test.assert_next_changes_equal(cursor, [_insert(SYSTEM, {"_id": 2, "b": 1})])
    system.replace_one({"_id": 2}, {"b": 2})
    test.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 2}, "fullDocument": {"_id": 2, "b": 2}, "ns": _ns(SYSTEM),
        "operationType": "replace"}])
    system.delete_one({"_id": 2})
    test.assert_next_changes_equal(cursor, [{"documentKey": {"_id": 2}, "ns": _ns(SYSTEM),
                                             "operationType": "delete"}])
    rename_system_and_back()
    test.assert_next_changes_equal(cursor, _rename_events())

    # A whole-db stream without: renames only.
    cursor = test.start_watching_changes(
        [{"$changeStream": {"showExpandedEvents": True, "showSystemEvents": False}}], 1)
    db.command("drop", REGULAR)
    test.assert_next_changes_equal(cursor, [{"ns": _ns(REGULAR), "operationType": "drop"}])
    regular.insert_one({"_id": 1, "a": 1})
    system.insert_one({"_id": 3, "c": 1})
    test.assert_next_changes_equal(cursor, [{"ns": _ns(REGULAR), "operationType": "create"},
                                            _insert(REGULAR, {"_id": 1, "a": 1})])
    system.replace_one({"_id": 3}, {"c": 2})
    system.delete_one({"_id": 3})
    rename_system_and_back()
    test.assert_next_changes_equal(cursor, _rename_events())
    regular.insert_one({"_id": 2, "a": 1})
    test.assert_next_changes_equal(cursor, [_insert(REGULAR, {"_id": 2, "a": 1})])
    test.clean_up()
