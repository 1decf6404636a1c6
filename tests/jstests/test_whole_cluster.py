"""Translated from mongodb/mongo `jstests/change_streams/whole_cluster.js` @
07b11864b6c8a72ad5572c900529a18372d072c9: basic whole-cluster change streams: where they may
be opened, events from every user database, none from admin, local and config."""

from __future__ import annotations

from typing import Any

from cst import (
    ChangeStreamTest,
    assert_change_stream_event_eq,
    assert_invalid_change_stream_nss,
    assert_valid_change_stream_nss,
)

DB = "whole_cluster"
OTHER = "whole_cluster_other"


def _recreate(db: Any, name: str) -> None:
    db.drop_collection(name)
    db.create_collection(name)


def test_whole_cluster(client: Any) -> None:
    db, other = client[DB], client[OTHER]
    _recreate(db, "t1")
    _recreate(other, "t2")

    assert_valid_change_stream_nss(client, "admin", 1, {"allChangesForCluster": True})
    assert_invalid_change_stream_nss(client, "admin", "testcoll", {"allChangesForCluster": True})
    assert_invalid_change_stream_nss(client, DB, 1, {"allChangesForCluster": True})

    cst = ChangeStreamTest(client.admin)
    cursor = cst.start_watching_all_changes_for_cluster()
    assert len(cursor["firstBatch"]) == 0, cursor

    db.t1.insert_one({"_id": 0, "a": 1})
    cst.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 1},
        "ns": {"db": DB, "coll": "t1"}, "operationType": "insert"}])
    other.t2.insert_one({"_id": 0, "a": 2})
    cst.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 2},
        "ns": {"db": OTHER, "coll": "t2"}, "operationType": "insert"}])

    # User databases whose names include admin, local or config.
    valid_user_dbs = ["admin1", "1admin", "_admin_", "local_", "_local", "_local_", "config_",
                      "_config", "_config_"]
    for name in valid_user_dbs:
        client[name].test.insert_one({"_id": 0, "a": 1})
        cst.assert_next_changes_equal(cursor, [{
            "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 1},
            "ns": {"db": name, "coll": "test"}, "operationType": "insert"}])

    # User collections whose names include "system" but are not internal.
    for name in ["system", "systems.views", "ssystem.views", "test.system"]:
        db[name].insert_one({"_id": 0, "a": 1})
        cst.assert_next_changes_equal(cursor, [{
            "documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 1},
            "ns": {"db": DB, "coll": name}, "operationType": "insert"}])

    # Nothing from the admin, local and config databases.
    for name in ["admin", "local", "config"]:
        client[name].test.insert_one({"_id": 0, "a": 1})
        db.t1.insert_one({"_id": name})
        cst.assert_next_changes_equal(cursor, [{
            "documentKey": {"_id": name}, "fullDocument": {"_id": name},
            "ns": {"db": DB, "coll": "t1"}, "operationType": "insert"}])
        client[name].command("drop", "test")

    # Dropping a database: a drop per collection, then dropDatabase.
    client.drop_database(OTHER)
    changes = []
    change = cst.get_one_change(cursor)
    while change["operationType"] == "drop":
        changes.append(change)
        change = cst.get_one_change(cursor)
    assert_change_stream_event_eq(change, {"operationType": "dropDatabase", "ns": {"db": OTHER}})

    client.drop_database(DB)
    for name in valid_user_dbs:
        client.drop_database(name)
    cst.clean_up()
