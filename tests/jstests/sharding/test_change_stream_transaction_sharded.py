"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_transaction_sharded.js` @
48f78443b14c90aa271223c1f5207519431ab4cb: a stream on a collection sharded on `shard` (the
`{shard: 2}` chunk on shard1) sees only committed writes of two cross-shard transactions: none
while they run, transaction 1's five events (from both shards, in either shard's order) at its
commit, nothing of the aborted transaction 2; then a stream started after any captured event
(`startAfter`, `showExpandedEvents`) returns every later event of each shard, each equal to the
one first seen. On 8.0 (FCV below 8.1) no `commitTimestamp` is expected; `endOfTransaction`
events are behind a feature flag that is off."""

from __future__ import annotations

import bson
from pymongo.read_concern import ReadConcern
from sharding_util import watch

DB = "test"
COLL = "change_stream_transaction_sharded"


def _assert_writes_visible(cs, shard1: list, shard2: list, captured1: list,
                           captured2: list) -> None:
    shard1, shard2 = list(shard1), list(shard2)
    while shard1 or shard2:
        change = cs.soon_next()
        if change["documentKey"]["shard"] == 1:
            assert shard1, change
            op, id_ = shard1.pop(0)
            captured1.append(change)
        else:
            assert change["documentKey"]["shard"] == 2, change
            assert shard2, change
            op, id_ = shard2.pop(0)
            captured2.append(change)
        assert (change["operationType"], change["documentKey"]["_id"]) == (op, id_), change
    assert not cs.has_next()


def test_change_stream_transaction_sharded(st):
    s = st.s
    s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    db = s[DB]
    coll = db[COLL]
    coll.create_index({"shard": 1})
    st.shard_coll(coll, {"shard": 1}, {"shard": 2}, {"shard": 2}, DB, True)
    coll.insert_one({"shard": 1})
    coll.insert_one({"shard": 2})

    list1: list = []
    list2: list = []
    session1 = s.start_session(causal_consistency=True)
    session2 = s.start_session(causal_consistency=True)
    session1.start_transaction(read_concern=ReadConcern("majority"))
    session2.start_transaction(read_concern=ReadConcern("majority"))
    coll1 = session1.client[DB][COLL]
    coll2 = session2.client[DB][COLL]
    try:
        cs = watch(coll, showExpandedEvents=True)
        coll.insert_one({"shard": 1, "_id": "no-txn-doc-1"})
        _assert_writes_visible(cs, [("insert", "no-txn-doc-1")], [], list1, list2)

        coll1.insert_many([{"shard": 1, "_id": "txn1-doc-1"}, {"shard": 2, "_id": "txn1-doc-2"}],
                          session=session1)
        coll2.insert_many([{"shard": 1, "_id": "txn2-doc-1"}, {"shard": 2, "_id": "txn2-doc-2"}],
                          session=session2)
        coll1.update_one({"shard": 1, "_id": "txn1-doc-1"}, {"$set": {"updated": 1}},
                         session=session1)
        coll2.update_one({"shard": 2, "_id": "txn2-doc-2"}, {"$set": {"updated": 1}},
                         session=session2)
        coll1.update_one({"shard": 2, "_id": "txn1-doc-2"},
                         {"$set": {"update-before-delete": 1}}, session=session1)
        coll2.update_one({"shard": 1, "_id": "txn2-doc-1"},
                         {"$set": {"update-before-delete": 1}}, session=session2)
        coll1.delete_one({"shard": 2, "_id": "txn1-doc-2"}, session=session1)
        coll2.delete_one({"shard": 1, "_id": "txn2-doc-2"}, session=session2)

        coll.insert_one({"shard": 2, "_id": "no-txn-doc-2"})
        _assert_writes_visible(cs, [], [("insert", "no-txn-doc-2")], list1, list2)
        coll.insert_one({"shard": 1, "_id": "no-txn-doc-3"})
        _assert_writes_visible(cs, [("insert", "no-txn-doc-3")], [], list1, list2)

        session1.commit_transaction()
        _assert_writes_visible(
            cs, [("insert", "txn1-doc-1"), ("update", "txn1-doc-1")],
            [("insert", "txn1-doc-2"), ("update", "txn1-doc-2"), ("delete", "txn1-doc-2")],
            list1, list2)
        assert not any("commitTimestamp" in c for c in list1 + list2)  # FCV 8.0

        coll.insert_one({"shard": 2, "_id": "no-txn-doc-4"})
        session2.abort_transaction()
        _assert_writes_visible(cs, [], [("insert", "no-txn-doc-4")], list1, list2)
        cs.close()
    finally:
        session1.end_session()
        session2.end_session()

    def post_token_index(change: dict, changes: list) -> int:
        for i, other in enumerate(changes):
            if change["_id"]["_data"] < other["_id"]["_data"]:
                return i
        return len(changes)

    def confirm_resume(changes: list) -> None:
        for resume in changes:
            i1 = post_token_index(resume, list1)
            i2 = post_token_index(resume, list2)
            resumed = watch(coll, startAfter=resume["_id"], showExpandedEvents=True)
            while i1 + i2 < len(list1) + len(list2):
                change = resumed.soon_next()
                if change["documentKey"]["shard"] == 1:
                    expected = list1[i1]
                    i1 += 1
                else:
                    assert change["documentKey"]["shard"] == 2
                    expected = list2[i2]
                    i2 += 1
                assert bson.encode(change) == bson.encode(expected), (change, expected)
            assert not resumed.has_next()
            resumed.close()

    confirm_resume(list1)
    confirm_resume(list2)
