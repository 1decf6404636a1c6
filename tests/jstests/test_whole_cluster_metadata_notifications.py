"""Translated from mongodb/mongo `jstests/change_streams/whole_cluster_metadata_notifications.js`
@ 07b11864b6c8a72ad5572c900529a18372d072c9: a whole-cluster stream's notifications across two
databases: CRUD, a database drop (drops, then dropDatabase), resuming before a drop, renames
(dropTarget, across databases, $out), collection drops, and a view's system.views writes
ignored. (Its waits for two-phase drops are no-ops on 8.0.)

Left out: the steps that rename `system.views` (to a user collection, to `system.users`) and a
user collection to `system.views`: mongod 8.0 refuses those renames (IllegalOperation, "renaming
system.views collection or renaming to system.views is not allowed"); the case checks that
refusal in their place."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest
from pymongo import WriteConcern
from pymongo.errors import OperationFailure

DB1 = "whole_cluster_metadata_notifications"
DB2 = DB1 + "_other"
ILLEGAL_OPERATION = 20


def test_whole_cluster_metadata_notifications(client: Any) -> None:
    db1, db2 = client[DB1], client[DB2]
    client.drop_database(DB1)
    client.drop_database(DB2)

    def recreate(db: Any, name: str) -> Any:
        db.drop_collection(name)
        db.create_collection(name)
        return db[name]

    db1_coll, db2_coll = recreate(db1, "test"), recreate(db2, "test")
    cst = ChangeStreamTest(client.admin)
    cursor = cst.start_watching_all_changes_for_cluster()
    for coll in (db1_coll, db2_coll):
        coll.insert_one({"_id": 1})
        coll.update_one({"_id": 1}, {"$set": {"a": 1}})
        coll.delete_one({"_id": 1})
    client.drop_database(DB2)
    for expected_db in (DB1, DB2):
        for op in ("insert", "update", "delete"):
            change = cst.get_one_change(cursor)
            assert change["operationType"] == op and change["ns"]["db"] == expected_db, change
    cst.assert_database_drop(cursor, DB2)

    # A cluster stream resumes from before a collection's drop.
    db1_coll = recreate(db1, "test")
    cursor = cst.start_watching_all_changes_for_cluster()
    db1_coll.with_options(write_concern=WriteConcern(w="majority")).insert_one({"_id": 1})
    resume_token = cst.get_one_change(cursor, False)["_id"]
    db1.drop_collection("test")
    client.admin.command({"aggregate": 1, "pipeline": [{"$changeStream": {
        "resumeAfter": resume_token, "allChangesForCluster": True}}], "cursor": {}})

    db1_coll, db2_coll = recreate(db1, "test"), recreate(db2, "test")
    next_id = 0
    for coll_to_invalidate in (db1_coll, db2_coll):
        cursor = cst.start_watching_all_changes_for_cluster()
        test_db = coll_to_invalidate.database
        for coll_to_write in (db1_coll, db2_coll):
            coll_to_write.insert_one({"_id": next_id})
            change = cst.get_one_change(cursor)
            assert change["operationType"] == "insert", change
            assert change["documentKey"]["_id"] == next_id
            assert change["ns"]["db"] == coll_to_write.database.name
            next_id += 1

        # Renames.
        recreate(test_db, "test")
        cursor = cst.start_watching_all_changes_for_cluster()
        coll_to_invalidate.rename("renamed_coll")
        cst.assert_next_changes_equal(cursor, [{
            "operationType": "rename", "ns": {"db": test_db.name, "coll": "test"},
            "to": {"db": test_db.name, "coll": "renamed_coll"}}])
        renamed = test_db["renamed_coll"]
        recreate(test_db, "test")
        test_db["test"].insert_one({"_id": 0})
        renamed.rename("test", dropTarget=True)
        cst.assert_next_changes_equal(cursor, [
            {"operationType": "insert", "ns": {"db": test_db.name, "coll": "test"},
             "documentKey": {"_id": 0}, "fullDocument": {"_id": 0}},
            {"operationType": "rename", "ns": {"db": test_db.name, "coll": "renamed_coll"},
             "to": {"db": test_db.name, "coll": "test"}},
        ])
        coll_to_invalidate = test_db["test"]

        # Across databases: a rename into the target (from its temporary collection), then
        # the source's drop.
        other_db = client[test_db.name + "_rename_target"]
        recreate(other_db, "test")
        other_db.drop_collection("test")
        cursor = cst.start_watching_all_changes_for_cluster()
        client.admin.command({"renameCollection": f"{test_db.name}.test",
                              "to": f"{other_db.name}.test"})
        change = cst.get_one_change(cursor)
        assert change["operationType"] == "rename", change
        assert change["to"] == {"db": other_db.name, "coll": "test"}, change
        cst.assert_next_changes_equal(cursor, [{"operationType": "drop",
                                                "ns": {"db": test_db.name, "coll": "test"}}])

        # $out: a rename of its temporary collection, no invalidate.
        list(coll_to_invalidate.aggregate([{"$out": "renamed_coll"}]))
        rename = cst.get_one_change(cursor)
        assert rename["operationType"] == "rename", rename
        assert rename["to"] == {"db": test_db.name, "coll": "renamed_coll"}, rename
        assert cst.get_next_batch(cursor)["nextBatch"] == []
        coll_to_invalidate.insert_one({"_id": 2})
        assert cst.get_one_change(cursor)["operationType"] == "insert"

        # (the system.views rename steps, left out: 8.0 refuses each of them)
        test_db.command({"create": "view1", "viewOn": "test", "pipeline": []})
        for source, to in (("system.views", "non_system_collection"),
                           ("system.views", "system.users"), ("test", "system.views")):
            with pytest.raises(OperationFailure) as refused:
                client.admin.command({"renameCollection": f"{test_db.name}.{source}",
                                      "to": f"{test_db.name}.{to}"})
            assert refused.value.code == ILLEGAL_OPERATION, refused.value.details
        test_db.drop_collection("system.views")
        coll_to_invalidate.insert_one({"_id": 0})
        cst.assert_next_changes_equal(cursor, [{
            "operationType": "insert", "ns": {"db": test_db.name, "coll": "test"},
            "documentKey": {"_id": 0}, "fullDocument": {"_id": 0}}])

        # A drop, then (any number of drops and) the next insert.
        test_db.drop_collection("test")
        coll_to_invalidate.insert_one({"_id": 0})
        cst.consume_drop_up_to(cursor, "drop", {
            "documentKey": {"_id": 0}, "fullDocument": {"_id": 0},
            "ns": {"db": test_db.name, "coll": "test"}, "operationType": "insert"})

        # A view's system.views insert and that collection's drop: nothing.
        cursor = cst.start_watching_all_changes_for_cluster()
        test_db.command({"create": "view1", "viewOn": "test", "pipeline": []})
        test_db.drop_collection("system.views")
        coll_to_invalidate.insert_one({"_id": 1})
        change = cst.get_one_change(cursor)
        assert change["operationType"] == "insert", change
        assert change["ns"] == {"db": test_db.name, "coll": "test"}, change
    cst.clean_up()
