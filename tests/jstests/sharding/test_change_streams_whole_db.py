"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_whole_db.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e (`ChangeStreamTest`: `cst.py`): a whole-database
stream through mongos returns, in order, the inserts of an unsharded collection, of one sharded
on `{x: 1}` and of one sharded on `{y: 1, x: 1}` (documentKeys with their shard keys); resumed
from before the `{x: 1}` collection's drop with a `$match` on it, it returns the insert written
just before the drop (its documentKey from the oplog)."""

from __future__ import annotations

from bson.min_key import MinKey
from cst import ChangeStreamTest

NAME = "change_streams_whole_db"


def _insert(db, coll: str, doc: dict) -> dict:
    return {"documentKey": doc, "fullDocument": doc, "ns": {"db": db.name, "coll": coll},
            "operationType": "insert"}


def test_change_streams_whole_db(st):
    db = st.s.test
    coll = db[NAME]
    cst = ChangeStreamTest(db)
    try:
        cursor = cst.start_watching_changes([{"$changeStream": {}}], 1)
        assert len(cursor["firstBatch"]) == 0, f"Cursor had changes: {cursor!r}"

        coll.insert_one({"_id": 0})
        cst.assert_next_changes_equal(cursor, [_insert(db, NAME, {"_id": 0})])

        on_x = f"{NAME}_sharded_on_x"
        db.create_collection(on_x)
        st.shard_coll(db[on_x], {"x": 1}, {"x": 0}, {"x": 1}, "test")
        db[on_x].insert_one({"_id": 0, "x": -1})
        db[on_x].insert_one({"_id": 1, "x": 1})
        cst.assert_next_changes_equal(cursor, [
            _insert(db, on_x, {"_id": 0, "x": -1}), _insert(db, on_x, {"_id": 1, "x": 1})])

        db[on_x].insert_one({"_id": 2, "x": 2})
        coll.insert_one({"_id": 1})
        cst.assert_next_changes_equal(cursor, [
            _insert(db, on_x, {"_id": 2, "x": 2}), _insert(db, NAME, {"_id": 1})])

        compound = f"{NAME}_sharded_compound"
        db.create_collection(compound)
        st.shard_coll(db[compound], {"y": 1, "x": 1}, {"y": 1, "x": MinKey()},
                      {"y": 1, "x": MinKey()}, "test")
        db[compound].insert_one({"_id": 0, "y": -1, "x": 0})
        db[compound].insert_one({"_id": 1, "y": 1, "x": 0})
        cst.assert_next_changes_equal(cursor, [
            _insert(db, compound, {"_id": 0, "y": -1, "x": 0}),
            _insert(db, compound, {"_id": 1, "y": 1, "x": 0})])

        db[on_x].insert_one({"_id": 3, "x": 3})
        coll.insert_one({"_id": 3})
        db[compound].insert_one({"_id": 2, "x": 0, "y": -2})
        results = cst.assert_next_changes_equal(cursor, [
            _insert(db, on_x, {"_id": 3, "x": 3}), _insert(db, NAME, {"_id": 3}),
            _insert(db, compound, {"_id": 2, "x": 0, "y": -2})])
        resume_before_drop = results[0]["_id"]

        db[on_x].insert_one({"_id": 4, "x": 4})
        assert db.drop_collection(on_x)["ok"] == 1

        cursor = cst.start_watching_changes([
            {"$changeStream": {"resumeAfter": resume_before_drop}},
            {"$match": {"ns.coll": on_x}}], 1)
        cst.assert_next_changes_equal(cursor, [_insert(db, on_x, {"_id": 4, "x": 4})])
    finally:
        cst.clean_up()
