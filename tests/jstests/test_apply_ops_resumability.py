"""Translated from mongodb/mongo `jstests/change_streams/apply_ops_resumability.js` @
01ed0776388cc8cff83a82e3671d313b00d5096d: a transaction's applyOps is unwound, and collection,
database and cluster streams resume from any point inside the transaction."""

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
PROJECT = {"$project": {"lsid.uid": 0}}


def _milestones(events: list[dict]) -> tuple[int, int, int]:
    """Indexes of the first non-transaction event and the first two transaction events."""
    non_txn = next(i for i, e in enumerate(events) if "lsid" not in e)
    first = next(i for i, e in enumerate(events) if "lsid" in e)
    second = next(i for i, e in enumerate(events) if i > first and "lsid" in e)
    return non_txn, first, second


def test_apply_ops_resumability(client: Any) -> None:
    db = client[DB]
    for d, name in ((db, COLL), (db, OTHER_COLL), (client[OTHER_DB], OTHER_DB_COLL)):
        d.drop_collection(name)
        d.create_collection(name)
    coll = db[COLL]
    cst = ChangeStreamTest(db)
    stream = cst.start_watching_changes([{"$changeStream": {}}, PROJECT], COLL)
    start = db.command("isMaster")["$clusterTime"]["clusterTime"]

    coll.insert_one({"_id": 0, "a": 123})
    with client.start_session(causal_consistency=False) as session:
        with session.start_transaction(read_concern=ReadConcern("snapshot"),
                                       write_concern=WriteConcern(w="majority")):
            coll.insert_one({"_id": 1, "a": 0}, session=session)
            coll.insert_one({"_id": 2, "a": 0}, session=session)
            db[OTHER_COLL].insert_one({"_id": 111, "a": "Doc on other collection"},
                                      session=session)
            client[OTHER_DB][OTHER_DB_COLL].insert_one({"_id": 222, "a": "Doc on other DB"},
                                                       session=session)
            coll.update_one({"_id": 1}, {"$inc": {"a": 1}}, session=session)
        txn = {"lsid": dict(session.session_id),
               "txnNumber": Int64(session._server_session.transaction_id)}
    coll.insert_one({"_id": 3, "a": 123})
    db.command("drop", COLL)

    ns = {"db": DB, "coll": COLL}
    expected: list[dict[str, Any]] = [
        {"documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "a": 123}, "ns": ns,
         "operationType": "insert"},
        {"documentKey": {"_id": 1}, "fullDocument": {"_id": 1, "a": 0}, "ns": ns,
         "operationType": "insert", **txn},
        {"documentKey": {"_id": 2}, "fullDocument": {"_id": 2, "a": 0}, "ns": ns,
         "operationType": "insert", **txn},
        {"documentKey": {"_id": 111}, "fullDocument": {"_id": 111, "a": "Doc on other collection"},
         "ns": {"db": DB, "coll": OTHER_COLL}, "operationType": "insert", **txn},
        {"documentKey": {"_id": 222}, "fullDocument": {"_id": 222, "a": "Doc on other DB"},
         "ns": {"db": OTHER_DB, "coll": OTHER_DB_COLL}, "operationType": "insert", **txn},
        {"documentKey": {"_id": 1}, "ns": ns, "operationType": "update",
         "updateDescription": {"removedFields": [], "updatedFields": {"a": 1},
                               "truncatedArrays": []}, **txn},
        {"documentKey": {"_id": 3}, "fullDocument": {"_id": 3, "a": 123}, "ns": ns,
         "operationType": "insert"},
        {"operationType": "drop", "ns": ns},
    ]
    # Every change, from a whole-cluster stream; from here on the events themselves (with their
    # tokens) are what later streams must return.
    whole_cluster = ChangeStreamTest(client.admin)
    cursor = whole_cluster.start_watching_changes([
        {"$changeStream": {"startAtOperationTime": start, "allChangesForCluster": True}},
        PROJECT], 1)
    expected = whole_cluster.assert_next_changes_equal(cursor, expected)

    # Single collection.
    single = [e for e in expected if e["ns"] == ns]
    cst.assert_next_changes_equal(stream, single)
    non_txn, first, second = _milestones(single)
    for idx in (non_txn, first):
        cursor = cst.start_watching_changes(
            [{"$changeStream": {"resumeAfter": single[idx]["_id"]}}, PROJECT], COLL)
        cst.assert_next_changes_equal(cursor, single[idx + 1:])
    cursor = cst.start_watching_changes(
        [{"$changeStream": {"resumeAfter": single[second]["_id"]}}, PROJECT], COLL)
    cst.assert_next_changes_equal(cursor, single[second + 1:])
    assert cst.get_one_change(cursor, True)["operationType"] == "invalidate"

    # Whole database, from the middle of the transaction: not the other database's insert.
    single_db = [e for e in expected if e["ns"]["db"] == DB]
    _, _, second = _milestones(single_db)
    cursor = cst.start_watching_changes(
        [{"$changeStream": {"resumeAfter": single_db[second]["_id"]}}, PROJECT], 1)
    cst.assert_next_changes_equal(cursor, single_db[second + 1:])

    # Whole cluster, from the middle of the transaction: everything after it.
    _, _, second = _milestones(expected)
    cst = ChangeStreamTest(client.admin)
    cursor = cst.start_watching_changes([
        {"$changeStream": {"resumeAfter": expected[second]["_id"], "allChangesForCluster": True}},
        PROJECT], 1)
    cst.assert_next_changes_equal(cursor, expected[second + 1:])
    cst.clean_up()
