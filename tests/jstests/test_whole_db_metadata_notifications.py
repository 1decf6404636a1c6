"""Translated from mongodb/mongo `jstests/change_streams/whole_db_metadata_notifications.js`,
the index's newest revision (no system.views renames, which 8.0 refuses; it ends by resuming
with a $match that filters out everything): a whole-database stream's drop, rename (dropTarget,
across databases, $out) and dropDatabase notifications, resuming before a drop, other databases'
drops ignored, system collections' writes ignored, and the invalidate's token kept by a stream
whose $match filters the invalidate out. (Its waits for two-phase drops are no-ops on 8.0.)"""

from __future__ import annotations

from typing import Any

from cst import SOON_TRIES, ChangeStreamTest, ShellCursor

DB = "whole_db_metadata_notifications"
COLL = "test"


def test_whole_db_metadata_notifications(client: Any) -> None:
    client.drop_database(DB)
    db = client[DB]
    cst = ChangeStreamTest(db)

    def recreate(name: str) -> Any:
        db.drop_collection(name)
        db.create_collection(name)
        return db[name]

    coll = recreate(COLL)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
    coll.insert_one({"_id": 1})
    coll.update_one({"_id": 1}, {"$set": {"a": 1}})
    coll.delete_one({"_id": 1})
    coll_agg = recreate(COLL)
    for op in ("insert", "update", "delete", "drop"):
        change = cst.get_one_change(cursor)
        assert change["operationType"] == op, change

    coll_agg.insert_one({"_id": 1})
    resume_token = cst.get_one_change(cursor, False)["_id"]
    # A whole-db stream may resume from before a collection's drop.
    db.drop_collection(COLL)
    db.command({"aggregate": 1, "pipeline": [{"$changeStream": {"resumeAfter": resume_token}}],
                "cursor": {}})

    # Another database's drop does not invalidate the stream.
    other_db = client[DB + "other"]
    other_db[COLL + "_other"].insert_one({"_id": 0})
    coll = recreate(COLL)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
    other_db.drop_collection(COLL + "_other")
    coll.insert_one({"_id": 1})
    change = cst.get_one_change(cursor)
    assert change["operationType"] == "insert" and change["documentKey"]["_id"] == 1, change

    # Rename: a rename event for the source.
    recreate(COLL)
    db.drop_collection("renamed_coll")
    cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
    coll.rename("renamed_coll")
    cst.assert_next_changes_equal(cursor, [{
        "operationType": "rename", "ns": {"db": DB, "coll": COLL},
        "to": {"db": DB, "coll": "renamed_coll"}}])

    # dropTarget onto an existing collection.
    coll = db["renamed_coll"]
    db.create_collection(COLL)
    db[COLL].insert_one({"_id": 0})
    coll.rename(COLL, dropTarget=True)
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "insert", "ns": {"db": DB, "coll": COLL}, "documentKey": {"_id": 0},
         "fullDocument": {"_id": 0}},
        {"operationType": "rename", "ns": {"db": DB, "coll": "renamed_coll"},
         "to": {"db": DB, "coll": COLL}},
    ])

    # Across databases: the source's drop; then, renamed back, a rename into this database.
    coll = db[COLL]
    target_db = client[DB + "_rename_target"]
    target_db.create_collection("test")
    target_db.drop_collection("test")
    client.admin.command({"renameCollection": f"{DB}.{COLL}", "to": f"{target_db.name}.test"})
    cst.assert_next_changes_equal(cursor, [{"operationType": "drop",
                                            "ns": {"db": DB, "coll": COLL}}])
    client.admin.command({"renameCollection": f"{target_db.name}.test", "to": f"{DB}.{COLL}"})
    change = cst.get_one_change(cursor)
    assert change["operationType"] == "rename", change
    assert change["to"] == {"db": DB, "coll": COLL}, change

    # $out to a new collection: a rename of its temporary collection, no invalidate.
    list(coll.aggregate([{"$out": "renamed_coll"}]))
    rename = cst.get_one_change(cursor)
    assert rename["operationType"] == "rename", rename
    assert rename["to"] == {"db": DB, "coll": "renamed_coll"}, rename
    assert cst.get_next_batch(cursor)["nextBatch"] == []
    coll.insert_one({"_id": 2})
    assert cst.get_one_change(cursor)["operationType"] == "insert"
    db.drop_collection("renamed_coll")
    cst.assert_next_changes_equal(cursor, [{"operationType": "drop",
                                            "ns": {"db": DB, "coll": "renamed_coll"}}])

    db.drop_collection(COLL)
    cst.assert_next_changes_equal(cursor, [{"operationType": "drop",
                                            "ns": {"db": DB, "coll": COLL}}])

    # System collections: a view's system.views insert and that collection's drop show nothing.
    cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
    db.command({"create": "view1", "viewOn": COLL, "pipeline": []})
    db.drop_collection("system.views")
    coll.insert_one({"_id": 0})
    change = cst.get_one_change(cursor)
    assert change["operationType"] == "insert", change
    assert change["ns"] == {"db": DB, "coll": COLL}, change

    # dropDatabase: the drops, dropDatabase, then the invalidate.
    client.drop_database(DB)
    cst.assert_database_drop(cursor, DB)
    invalidate = cst.assert_next_changes_equal(cursor, [{"operationType": "invalidate"}])

    # A stream whose $match filters the invalidate out still ends at the invalidate's token.
    session = db.client.start_session()  # the cursor's, for its getMores too
    reply = db.command({"aggregate": 1, "pipeline": [
        {"$changeStream": {"resumeAfter": change["_id"]}},
        {"$match": {"operationType": "DummyOperationType"}}], "cursor": {}}, session=session)
    resumed = ShellCursor(db["$cmd.aggregate"], reply=reply, session=session)
    for _ in range(SOON_TRIES):
        assert not resumed.has_next()
        if resumed.is_exhausted():
            break
    assert resumed.is_exhausted()
    assert resumed.get_resume_token() == invalidate[0]["_id"]
    cst.clean_up()
