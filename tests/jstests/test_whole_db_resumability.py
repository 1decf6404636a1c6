"""Translated from mongodb/mongo `jstests/change_streams/whole_db_resumability.js` @
39c3a5d77b976e131d37476f2e7255d6058f5093: resuming a whole-database stream after inserts,
a rename, collection drops, dropDatabase and the invalidate (resumeAfter and startAfter)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest
from pymongo.errors import OperationFailure

DB = "whole_db_resumability"
INVALID_RESUME_TOKEN = 260


def test_whole_db_resumability(client: Any) -> None:
    test_db = client[DB]
    for name in ("resume_coll", "resume_coll_other"):
        test_db.drop_collection(name)
        test_db.create_collection(name)
    coll, other = test_db["resume_coll"], test_db["resume_coll_other"]
    cst = ChangeStreamTest(test_db)
    batch0 = {"cursor": {"batchSize": 0}}

    def watch(stage: dict, options: dict | None = None) -> Any:
        return cst.start_watching_changes([{"$changeStream": stage}], 1, options)

    cursor = watch({})
    coll.insert_one({"_id": 1})
    other.insert_one({"_id": 2})
    first = cst.get_one_change(cursor)
    assert first["fullDocument"] == {"_id": 1}
    assert first["ns"] == {"db": DB, "coll": "resume_coll"}

    cursor = watch({"resumeAfter": first["_id"]}, batch0)
    second = cst.get_one_change(cursor)
    assert second["fullDocument"] == {"_id": 2}
    assert second["ns"] == {"db": DB, "coll": "resume_coll_other"}

    coll.insert_one({"_id": 3})
    third = cst.get_one_change(cursor)
    assert third["fullDocument"] == {"_id": 3}
    assert third["ns"] == {"db": DB, "coll": "resume_coll"}

    cursor = watch({"resumeAfter": first["_id"]}, batch0)
    assert cst.get_one_change(cursor) == second
    assert cst.get_one_change(cursor) == third
    cursor = watch({"resumeAfter": second["_id"]}, batch0)
    assert cst.get_one_change(cursor) == third

    # Resume from a rename.
    test_db.drop_collection("resume_coll")
    test_db.create_collection("resume_coll")
    test_db.drop_collection("rename_coll")
    cursor = watch({})
    coll.rename("rename_coll")
    renames = cst.assert_next_changes_equal(cursor, [{
        "operationType": "rename", "ns": {"db": DB, "coll": "resume_coll"},
        "to": {"db": DB, "coll": "rename_coll"}}])
    rename_token = renames[0]["_id"]
    test_db["rename_coll"].insert_one({"_id": "after rename"})
    expected_insert = {"operationType": "insert", "ns": {"db": DB, "coll": "rename_coll"},
                       "fullDocument": {"_id": "after rename"},
                       "documentKey": {"_id": "after rename"}}
    for option in ("resumeAfter", "startAfter"):
        cursor = watch({option: rename_token})
        cst.assert_next_changes_equal(cursor, [expected_insert])
    test_db["rename_coll"].rename("resume_coll")

    # Drop one collection explicitly, then the database.
    cursor = watch({})
    test_db.drop_collection("resume_coll_other")
    first_drop = cst.get_one_change(cursor)
    assert first_drop["operationType"] == "drop"
    assert first_drop["ns"] == {"db": DB, "coll": "resume_coll_other"}
    client.drop_database(DB)
    drop_db_changes = cst.assert_database_drop(cursor, DB)
    second_drop = drop_db_changes[0]
    drop_db_token = drop_db_changes[-1]["_id"]
    invalidate_token = cst.assert_next_changes_equal(cursor, [{"operationType": "invalidate"}])[0][
        "_id"
    ]

    # Resume from each collection drop.
    for change in (first_drop, second_drop):
        cursor = watch({"resumeAfter": change["_id"]}, batch0)
        cst.assert_database_drop(cursor, DB)
        cst.assert_next_changes_equal(cursor, [{"operationType": "invalidate"}])

    coll.insert_one({"_id": "after recreate"})

    # From dropDatabase with resumeAfter: the invalidate.
    cursor = watch({"resumeAfter": drop_db_token}, batch0)
    cst.assert_next_changes_equal(cursor, [{"operationType": "invalidate"}])

    # From the invalidate with resumeAfter: InvalidResumeToken.
    with pytest.raises(OperationFailure) as raised:
        client["test"].command({"aggregate": 1,
                                "pipeline": [{"$changeStream": {"resumeAfter": invalidate_token}}],
                                "cursor": {}, "collation": {"locale": "simple"}})
    assert raised.value.code == INVALID_RESUME_TOKEN

    # From dropDatabase with startAfter: the invalidate.
    cursor = watch({"startAfter": drop_db_token}, batch0)
    cst.assert_next_changes_equal(cursor, [{"operationType": "invalidate"}])

    # From the invalidate with startAfter: the insert after the database was recreated.
    cursor = watch({"startAfter": invalidate_token}, batch0)
    cst.consume_drop_up_to(cursor, "dropDatabase", {
        "operationType": "insert", "ns": {"db": DB, "coll": "resume_coll"},
        "fullDocument": {"_id": "after recreate"}, "documentKey": {"_id": "after recreate"}})
    cst.clean_up()
