"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_survive_move_primary.js` @
591928c6193659fc8e1bf6a9ea0b234d3ac25b67 (`ChangeStreamTest`: `cst.py`): a stream on an
untracked (unsharded) collection returns its inserts before and after a `movePrimary` of its
database, then its drop and the invalidate; a stream resumed after the first insert with
`showSystemEvents` returns the same events after it (movePrimary's own writes are a
migration's: no event)."""

from __future__ import annotations

from cst import ChangeStreamTest

DB = "test"
COLL = "untrackedCollection"


def _insert(id_: str) -> dict:
    return {"operationType": "insert", "ns": {"db": DB, "coll": COLL},
            "fullDocument": {"_id": id_}, "documentKey": {"_id": id_}}


def test_change_streams_survive_move_primary(st):
    db = st.s[DB]
    st.s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    db.create_collection(COLL)
    coll = db[COLL]
    cst = ChangeStreamTest(db)
    try:
        cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL,
                                            {"cursor": {"batchSize": 0}})
        coll.insert_one({"_id": "createdToEstablishResumeToken"})
        coll.insert_one({"_id": "createdBeforeMovePrimary"})
        st.s.admin.command({"movePrimary": DB, "to": st.shard1})
        assert st.primary_shard(DB) == st.shard1
        coll.insert_one({"_id": "createdAfterMovePrimary"})
        coll.drop()
        expected = [
            _insert("createdToEstablishResumeToken"),
            _insert("createdBeforeMovePrimary"),
            _insert("createdAfterMovePrimary"),
            {"operationType": "drop", "ns": {"db": DB, "coll": COLL}},
            {"operationType": "invalidate"},
        ]
        observed = cst.assert_next_changes_equal(cursor, expected, expect_invalidate=True)

        cursor = cst.start_watching_changes(
            [{"$changeStream": {"showSystemEvents": True, "resumeAfter": observed[0]["_id"]}}],
            COLL, {"cursor": {"batchSize": 0}})
        cst.assert_next_changes_equal(cursor, expected[1:], expect_invalidate=True)
    finally:
        cst.clean_up()
