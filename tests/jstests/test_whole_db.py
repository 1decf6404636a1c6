"""Translated from mongodb/mongo `jstests/change_streams/whole_db.js` @
77f43172584a0302df127174b9b0bd2259730772: basic whole-database change streams."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest, assert_invalid_change_stream_nss

DB = "whole_db"


def test_whole_db(client: Any) -> None:
    db = client[DB]
    db.client.drop_database(DB)

    # A single-database change stream cannot be opened on "admin", "config", or "local".
    assert_invalid_change_stream_nss(client, "admin", 1)
    assert_invalid_change_stream_nss(client, "config", 1)
    assert_invalid_change_stream_nss(client, "local", 1)

    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
    # No changes: an empty first batch.
    assert len(cursor["firstBatch"]) == 0, cursor

    db.t1.insert_one({"_id": 0, "a": 1})
    cst.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 1},
        "ns": {"db": DB, "coll": "t1"}, "operationType": "insert",
    }])

    # Another collection in the same database.
    db.t2.insert_one({"_id": 0, "a": 2})
    cst.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 2},
        "ns": {"db": DB, "coll": "t2"}, "operationType": "insert",
    }])

    # User collections whose names include "system" but are not internal collections.
    for coll_name in ["system", "systems.views", "ssystem.views", "test.system"]:
        db[coll_name].insert_one({"_id": 0, "a": 1})
        assert db.command("drop", coll_name)["ok"] == 1
        cst.assert_next_changes_equal(cursor, [
            {"documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 1},
             "ns": {"db": DB, "coll": coll_name}, "operationType": "insert"},
            {"operationType": "drop", "ns": {"db": DB, "coll": coll_name}},
        ])
    cst.clean_up()
