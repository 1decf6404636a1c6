"""Translated from mongodb/mongo `jstests/change_streams/ddl_rename_cross_db.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: a rename across databases (dropTarget true, a new
database, and a failing dropTarget false) as collection and database streams with
showExpandedEvents see it: the source's events and drop, the destination's `tmpXXXXX.
renameCollection` staging collection (create, indexes, inserts), its rename onto the target."""

from __future__ import annotations

import re
from typing import Any

import pytest
from cst import ChangeStreamTest
from pymongo.errors import OperationFailure

NAME = "ddl_rename_cross_db"
TMP = re.compile(r"^tmp[a-zA-Z0-9]{5}[.]renameCollection$")


def _contains(event: dict, db: Any, coll: Any, op: str, key: Any = None, value: Any = None
              ) -> bool:
    """`eventContains` of the jstest."""
    ns = event.get("ns", {})
    if op != event["operationType"]:
        return False
    if op == "insert":
        if event["fullDocument"].get(key) != value:
            return False
    elif op == "createIndexes":
        if event["operationDescription"]["indexes"][0]["name"] != f"{key}_1":
            return False
    elif op == "invalidate":
        return True
    elif op == "rename":
        to = event["operationDescription"]["to"]
        if to["db"] != key or to["coll"] != value:
            return False
    if ns.get("db") != db:
        return False
    if coll == "tmp":
        return bool(TMP.match(ns.get("coll", "")))
    return coll == ns.get("coll")


@pytest.mark.parametrize("rename_type", ["dropTarget", "newDatabase", "noDropTarget"])
@pytest.mark.parametrize("watch_type", ["collection", "database"])
def test_rename_cross_db(client: Any, watch_type: str, rename_type: str) -> None:
    dst_db = client[f"{NAME}_dstdb_{watch_type[0]}_{rename_type[:2]}"]
    src_db = client[f"{NAME}_srcdb_{watch_type[0]}_{rename_type[:2]}"]
    dst, src = dst_db["target"], src_db["source"]
    dst_db.unused_collection.insert_one({"a": 1})

    pipeline = [{"$changeStream": {"showExpandedEvents": True}}]
    test_src, test_dst = ChangeStreamTest(src_db), ChangeStreamTest(dst_db)
    target = (src.name, dst.name) if watch_type == "collection" else (1, 1)
    cursor_src = test_src.start_watching_changes(pipeline, target[0])
    cursor_dst = test_dst.start_watching_changes(pipeline, target[1])

    if rename_type in ("dropTarget", "noDropTarget"):
        dst.insert_many([{"b": "1", "c": "x"}, {"b": "2", "c": "y"}])
        dst.create_index([("b", 1)])
        dst.create_index([("c", 1)])
    src.insert_many([{"Key0": "Val0"}, {"Key2": "Val1"}, {"Key2": "Val2"}])
    src.create_index([("Key0", 1)])
    src.create_index([("Key2", 1)])

    command = {"renameCollection": src.full_name, "to": dst.full_name}
    if rename_type == "dropTarget":
        client.admin.command({**command, "dropTarget": True})
    elif rename_type == "newDatabase":
        client.admin.command(command)
    else:
        with pytest.raises(OperationFailure):
            client.admin.command({**command, "dropTarget": False})

    s, d = src_db.name, dst_db.name
    events = test_src.get_next_changes(cursor_src, 6)
    assert _contains(events[0], s, src.name, "create")
    assert _contains(events[1], s, src.name, "insert", "Key0", "Val0")
    assert _contains(events[2], s, src.name, "insert", "Key2", "Val1")
    assert _contains(events[3], s, src.name, "insert", "Key2", "Val2")
    assert _contains(events[4], s, src.name, "createIndexes", "Key0")
    assert _contains(events[5], s, src.name, "createIndexes", "Key2")
    if rename_type != "noDropTarget":
        events = test_src.get_next_changes(cursor_src, 1)
        assert _contains(events[0], s, src.name, "drop")

    if rename_type in ("dropTarget", "noDropTarget"):
        events = test_dst.get_next_changes(cursor_dst, 5)
        assert _contains(events[0], d, dst.name, "create")
        assert _contains(events[1], d, dst.name, "insert", "b", "1")
        assert _contains(events[1], d, dst.name, "insert", "c", "x")
        assert _contains(events[2], d, dst.name, "insert", "b", "2")
        assert _contains(events[2], d, dst.name, "insert", "c", "y")
        assert _contains(events[3], d, dst.name, "createIndexes", "b")
        assert _contains(events[4], d, dst.name, "createIndexes", "c")
    if watch_type == "database" and rename_type != "noDropTarget":
        events = test_dst.get_next_changes(cursor_dst, 6)
        assert _contains(events[0], d, "tmp", "create"), events
        assert _contains(events[1], d, "tmp", "createIndexes", "Key0"), events
        assert _contains(events[2], d, "tmp", "createIndexes", "Key2"), events
        assert _contains(events[3], d, "tmp", "insert", "Key0", "Val0"), events
        assert _contains(events[4], d, "tmp", "insert", "Key2", "Val1"), events
        assert _contains(events[5], d, "tmp", "insert", "Key2", "Val2"), events
    if rename_type != "noDropTarget":
        events = test_dst.get_next_changes(cursor_dst, 1)
        assert _contains(events[0], d, "tmp", "rename", d, dst.name), events
    if watch_type == "collection" and rename_type != "noDropTarget":
        events = test_dst.get_next_changes(cursor_dst, 1)
        assert _contains(events[0], None, None, "invalidate"), events
