"""Translated from mongodb/mongo `jstests/change_streams/whole_cluster_resumability.js` @
39c3a5d77b976e131d37476f2e7255d6058f5093: resuming a whole-cluster stream after inserts in two
databases, after a rename, and after a dropDatabase (resumeAfter and startAfter)."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

DB1, DB2 = "whole_cluster_resumability", "whole_cluster_resumability_other"


def test_whole_cluster_resumability(client: Any) -> None:
    for name in (DB1, DB2):
        client[name].drop_collection("test")
        client[name].create_collection("test")
    coll1, coll2 = client[DB1]["test"], client[DB2]["test"]
    cst = ChangeStreamTest(client.admin)
    batch0 = {"cursor": {"batchSize": 0}}

    def watch(extra: dict, options: dict | None = batch0) -> Any:
        return cst.start_watching_changes(
            [{"$changeStream": {**extra, "allChangesForCluster": True}}], 1, options)

    cursor = cst.start_watching_all_changes_for_cluster()
    coll1.insert_one({"_id": 1})
    first = cst.get_one_change(cursor)
    assert first["fullDocument"] == {"_id": 1}

    cursor = watch({"resumeAfter": first["_id"]})
    coll2.insert_one({"_id": 2})
    second = cst.get_one_change(cursor)
    assert second["fullDocument"] == {"_id": 2}
    coll1.insert_one({"_id": 3})
    third = cst.get_one_change(cursor)
    assert third["fullDocument"] == {"_id": 3}

    cursor = watch({"resumeAfter": first["_id"]})
    assert cst.get_one_change(cursor) == second
    assert cst.get_one_change(cursor) == third
    cursor = watch({"resumeAfter": second["_id"]})
    assert cst.get_one_change(cursor) == third

    # From a rename.
    client[DB1].drop_collection("test")
    client[DB1].create_collection("test")
    client[DB1].drop_collection("rename_coll")
    cursor = watch({})
    coll1.rename("rename_coll")
    renames = cst.assert_next_changes_equal(cursor, [{
        "operationType": "rename", "ns": {"db": DB1, "coll": "test"},
        "to": {"db": DB1, "coll": "rename_coll"}}])
    client[DB1]["rename_coll"].insert_one({"_id": "after rename"})
    expected = {"operationType": "insert", "ns": {"db": DB1, "coll": "rename_coll"},
                "fullDocument": {"_id": "after rename"}, "documentKey": {"_id": "after rename"}}
    for option in ("resumeAfter", "startAfter"):
        cursor = watch({option: renames[0]["_id"]})
        cst.assert_next_changes_equal(cursor, [expected])
    client[DB1]["rename_coll"].rename("test")

    # From a dropDatabase.
    cursor = cst.start_watching_all_changes_for_cluster()
    client.drop_database(DB1)
    drop_db_token = cst.assert_database_drop(cursor, DB1)[-1]["_id"]
    coll1.insert_one({"_id": "after recreate"})
    expected = {"operationType": "insert", "ns": {"db": DB1, "coll": "test"},
                "fullDocument": {"_id": "after recreate"},
                "documentKey": {"_id": "after recreate"}}
    for option in ("resumeAfter", "startAfter"):
        cursor = watch({option: drop_db_token})
        cst.consume_drop_up_to(cursor, "dropDatabase", expected)
    cst.clean_up()
