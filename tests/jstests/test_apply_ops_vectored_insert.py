"""Translated from mongodb/mongo `jstests/change_streams/apply_ops_vectored_insert.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: a retryable vectored insert (logged by mongod 8.0 as
applyOps batches) gives one insert event per document, for collection, database and cluster
streams. The file's first step, `setParameter` of internalInsertMaxBatchSize (a server parameter
cdcserver does not have), is left out (README.md lists it)."""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp
from cst import ChangeStreamTest

DB = "test"
COLL = "change_stream_apply_ops_vi"
OTHER_COLL = "change_stream_apply_ops_vi_2"
OTHER_DB = "change_stream_apply_ops_vi_db"
OTHER_DB_COLL = "someColl"
INSERTS_PER_BATCH = 4
NUM_INSERTS = 1 * INSERTS_PER_BATCH * 2  # one shard
PROJECT = {"$project": {"lsid.uid": 0}}


def test_apply_ops_vectored_insert(client: Any) -> None:
    db = client[DB]
    for d, name in ((db, COLL), (db, OTHER_COLL), (client[OTHER_DB], OTHER_DB_COLL)):
        d.drop_collection(name)
        d.create_collection(name)
    # (the jstest first sets internalInsertMaxBatchSize to 4 with setParameter: a server
    # parameter cdcserver does not have; the events below do not depend on the batch size)
    now = db.command("hello")["$clusterTime"]["clusterTime"]
    start = Timestamp(now.time, now.inc + 1)

    cst = ChangeStreamTest(db)
    stream = cst.start_watching_changes([{"$changeStream": {}}, PROJECT], COLL)
    documents = [{"_id": i + 1, "a": 0} for i in range(NUM_INSERTS)]
    with client.start_session(causal_consistency=False) as session:
        db[COLL].insert_many([dict(d) for d in documents], session=session)  # retryable
        db[OTHER_COLL].insert_one({"_id": 111, "a": "Doc on other collection"}, session=session)
        client[OTHER_DB][OTHER_DB_COLL].insert_one({"_id": 222, "a": "Doc on other DB"},
                                                   session=session)
        db[COLL].update_one({"_id": 1}, {"$inc": {"a": 1}}, session=session)
    db.command("drop", COLL)

    ns = {"db": DB, "coll": COLL}
    expected: list[dict[str, Any]] = [
        {"documentKey": {"_id": d["_id"]}, "fullDocument": d, "ns": ns, "operationType": "insert"}
        for d in documents
    ]
    expected.append({"documentKey": {"_id": 1}, "ns": ns, "operationType": "update",
                     "updateDescription": {"removedFields": [], "updatedFields": {"a": 1},
                                           "truncatedArrays": []}})
    expected.append({"operationType": "drop", "ns": ns})
    cst.assert_next_changes_equal(stream, expected)
    cst.assert_next_changes_equal(stream, [{"operationType": "invalidate"}],
                                  expect_invalidate=True)

    expected.insert(NUM_INSERTS, {
        "documentKey": {"_id": 111}, "fullDocument": {"_id": 111, "a": "Doc on other collection"},
        "ns": {"db": DB, "coll": OTHER_COLL}, "operationType": "insert"})
    stream = cst.start_watching_changes(
        [{"$changeStream": {"startAtOperationTime": start}}, PROJECT], 1)
    cst.assert_next_changes_equal(stream, expected)

    expected.insert(NUM_INSERTS + 1, {
        "documentKey": {"_id": 222}, "fullDocument": {"_id": 222, "a": "Doc on other DB"},
        "ns": {"db": OTHER_DB, "coll": OTHER_DB_COLL}, "operationType": "insert"})
    cst = ChangeStreamTest(client.admin)
    stream = cst.start_watching_changes([
        {"$changeStream": {"startAtOperationTime": start, "allChangesForCluster": True}},
        PROJECT], 1)
    cst.assert_next_changes_equal(stream, expected)
    cst.clean_up()
