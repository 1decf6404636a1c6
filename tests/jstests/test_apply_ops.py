"""Translated from mongodb/mongo `jstests/change_streams/apply_ops.js` @
01ed0776388cc8cff83a82e3671d313b00d5096d: a transaction's applyOps is unwound into events
carrying lsid and txnNumber, per collection, database and cluster stream. The file's step that
runs the `applyOps` command is left out: cdcserver has no applyOps command, and this revision
expects that applyOps (no lsid) not to be unwound, which predates SERVER-64972 (change streams
emit events for applyOps entries without lsid and txnNumber since 6.x; README.md lists it)."""

from __future__ import annotations

from typing import Any

from bson.int64 import Int64
from cst import ChangeStreamTest
from pymongo import WriteConcern
from pymongo.read_concern import ReadConcern

DB = "test"
COLL = "change_stream_apply_ops"
OTHER_COLL = "change_stream_apply_ops_2"
OTHER_DB = "change_stream_apply_ops_db"
OTHER_DB_COLL = "someColl"
DELETED_ID = 0


def test_apply_ops(client: Any) -> None:
    db = client[DB]
    for d, name in ((db, COLL), (db, OTHER_COLL), (client[OTHER_DB], OTHER_DB_COLL)):
        d.drop_collection(name)
        d.create_collection(name)
    reply = db.command("insert", COLL, documents=[
        {"_id": DELETED_ID, "a": "I was here before the transaction"}],
        writeConcern={"w": "majority"})
    start = reply["$clusterTime"]["clusterTime"]
    test_start = start.__class__(start.time, start.inc + 1)

    cst = ChangeStreamTest(db)
    stream = cst.start_watching_changes([{"$changeStream": {}}, {"$project": {"lsid.uid": 0}}],
                                        COLL)

    with client.start_session(causal_consistency=False) as session:
        with session.start_transaction(read_concern=ReadConcern("snapshot"),
                                       write_concern=WriteConcern(w="majority")):
            db[COLL].insert_one({"_id": 1, "a": 0}, session=session)
            db[COLL].insert_one({"_id": 2, "a": 0}, session=session)
            db[OTHER_COLL].insert_one({"_id": 111, "a": "Doc on other collection"},
                                      session=session)
            client[OTHER_DB][OTHER_DB_COLL].insert_one({"_id": 222, "a": "Doc on other DB"},
                                                       session=session)
            db[COLL].update_one({"_id": 1}, {"$inc": {"a": 1}}, session=session)
            db[COLL].delete_one({"_id": DELETED_ID}, session=session)
        lsid = dict(session.session_id)
        txn_number = Int64(session._server_session.transaction_id)  # getTxnNumber_forTesting

    # (the jstest's applyOps command, outside a transaction, would come here)
    db.command("drop", COLL)

    ns = {"db": DB, "coll": COLL}
    txn = {"lsid": lsid, "txnNumber": txn_number}
    expected: list[dict[str, Any]] = [
        {"documentKey": {"_id": 1}, "fullDocument": {"_id": 1, "a": 0}, "ns": ns,
         "operationType": "insert", **txn},
        {"documentKey": {"_id": 2}, "fullDocument": {"_id": 2, "a": 0}, "ns": ns,
         "operationType": "insert", **txn},
        {"documentKey": {"_id": 1}, "ns": ns, "operationType": "update",
         "updateDescription": {"removedFields": [], "updatedFields": {"a": 1},
                               "truncatedArrays": []}, **txn},
        {"documentKey": {"_id": DELETED_ID}, "ns": ns, "operationType": "delete", **txn},
        {"operationType": "drop", "ns": ns},
    ]
    cst.assert_next_changes_equal(stream, expected)
    cst.assert_next_changes_equal(stream, [{"operationType": "invalidate"}],
                                  expect_invalidate=True)

    # Whole database: also the other collection's insert.
    expected.insert(2, {"documentKey": {"_id": 111},
                        "fullDocument": {"_id": 111, "a": "Doc on other collection"},
                        "ns": {"db": DB, "coll": OTHER_COLL}, "operationType": "insert", **txn})
    stream = cst.start_watching_changes(
        [{"$changeStream": {"startAtOperationTime": test_start}}, {"$project": {"lsid.uid": 0}}], 1
    )
    cst.assert_next_changes_equal(stream, expected)

    # Whole cluster: also the other database's insert.
    expected.insert(3, {"documentKey": {"_id": 222},
                        "fullDocument": {"_id": 222, "a": "Doc on other DB"},
                        "ns": {"db": OTHER_DB, "coll": OTHER_DB_COLL}, "operationType": "insert",
                        **txn})
    cst = ChangeStreamTest(client.admin)
    stream = cst.start_watching_changes([
        {"$changeStream": {"startAtOperationTime": test_start, "allChangesForCluster": True}},
        {"$project": {"lsid.uid": 0}}], 1)
    cst.assert_next_changes_equal(stream, expected)
    cst.clean_up()
