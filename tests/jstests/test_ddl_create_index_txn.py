"""Translated from mongodb/mongo `jstests/change_streams/ddl_create_index_txn.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: createIndexes in a transaction (which creates the
collection) is unwound from the applyOps into create and createIndexes events, the latter with
the transaction's lsid and txnNumber, for collection, database and cluster streams."""

from __future__ import annotations

from typing import Any

from bson.int64 import Int64
from cst import ChangeStreamTest
from pymongo import WriteConcern
from pymongo.read_concern import ReadConcern

NAME = "ddl_create_index_txn"
DB, COLL, OTHER_COLL = NAME + "_db0", NAME + "_1", NAME + "_2"
OTHER_DB, OTHER_DB_COLL = NAME + "_3", "someColl"
INDEX = {"indexes": [{"v": 2, "key": {"unused": 1}, "name": "unused_1"}]}


def test_create_index_in_txn(client: Any) -> None:
    db, other_db = client[DB], client[OTHER_DB]
    db.drop_collection(COLL)
    db.drop_collection(OTHER_COLL)
    other_db.drop_collection(OTHER_DB_COLL)

    def pipeline(**options: Any) -> list[Any]:
        return [{"$changeStream": {"showExpandedEvents": True, **options}},
                {"$project": {"lsid.uid": 0}},
                {"$match": {"operationType": {"$ne": "endOfTransaction"}}}]

    cst = ChangeStreamTest(db)
    stream = cst.start_watching_changes(pipeline(), COLL)
    start = cst.last_reply["cursor"]["postBatchResumeToken"]

    txn_numbers = []
    with client.start_session() as session:
        for coll in (db[COLL], db[OTHER_COLL], other_db[OTHER_DB_COLL]):
            with session.start_transaction(read_concern=ReadConcern("local"),
                                           write_concern=WriteConcern(w="majority")):
                coll.create_index([("unused", 1)], session=session)
            txn_numbers.append(Int64(session._server_session.transaction_id))
        lsid = dict(session.session_id)

    def events(db_name: str, coll: str, txn_number: Int64) -> list[dict[str, Any]]:
        ns = {"db": db_name, "coll": coll}
        return [{"operationType": "create", "ns": ns},
                {"operationType": "createIndexes", "ns": ns, "operationDescription": INDEX,
                 "lsid": lsid, "txnNumber": txn_number}]

    expected = events(DB, COLL, txn_numbers[0])
    cst.assert_next_changes_equal(stream, expected)

    expected += events(DB, OTHER_COLL, txn_numbers[1])
    stream = cst.start_watching_changes(pipeline(startAfter=start), 1)
    cst.assert_next_changes_equal(stream, expected)
    cst.clean_up()

    expected += events(OTHER_DB, OTHER_DB_COLL, txn_numbers[2])
    cst = ChangeStreamTest(client.admin)
    stream = cst.start_watching_changes(pipeline(startAfter=start, allChangesForCluster=True), 1)
    cst.assert_next_changes_equal(stream, expected)
    cst.clean_up()
