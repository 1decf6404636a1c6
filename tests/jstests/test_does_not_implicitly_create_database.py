"""Translated from mongodb/mongo `jstests/change_streams/does_not_implicitly_create_database.js`
@ 01ed0776388cc8cff83a82e3671d313b00d5096d: a change stream opened on a namespace that does
not exist creates neither the collection nor the database, and sees the writes that do."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

DB = "does_not_implicitly_create_database"
COLL = "test"


def _db_list(client: Any) -> list[Any]:
    return client.admin.command(
        {"listDatabases": 1, "nameOnly": True, "filter": {"name": DB}}
    )["databases"]


def test_does_not_implicitly_create_database(client: Any) -> None:
    db = client[DB]
    client.drop_database(DB)
    assert _db_list(client) == []

    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)
    assert cursor["id"] > 0
    assert _db_list(client) == []

    # A non-$changeStream aggregation on the missing database: an empty, exhausted cursor.
    reply = db.command({"aggregate": COLL, "pipeline": [{"$match": {}}], "cursor": {}})
    assert reply["cursor"]["firstBatch"] == []
    assert reply["cursor"]["id"] == 0

    db[COLL].insert_one({"_id": 1})
    db[COLL].insert_one({"_id": 2})
    db[COLL].update_one({"_id": 1}, {"$set": {"updated": True}})
    db[COLL].delete_one({"_id": 2})
    assert _db_list(client) == [{"name": DB}]

    ns = {"db": DB, "coll": COLL}
    cst.assert_next_changes_equal(cursor, [
        {"documentKey": {"_id": 1}, "fullDocument": {"_id": 1}, "ns": ns,
         "operationType": "insert"},
        {"documentKey": {"_id": 2}, "fullDocument": {"_id": 2}, "ns": ns,
         "operationType": "insert"},
        {"documentKey": {"_id": 1}, "ns": ns,
         "updateDescription": {"removedFields": [], "updatedFields": {"updated": True},
                               "truncatedArrays": []},
         "operationType": "update"},
        {"documentKey": {"_id": 2}, "ns": ns, "operationType": "delete"},
    ])
    cst.clean_up()
