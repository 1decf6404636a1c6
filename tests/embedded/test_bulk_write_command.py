"""The 8.0 `bulkWrite` admin command (client bulk write) on the embedded store, through pymongo,
checked against mongod 8.0's bulk_write.cpp / bulk_write.idl / bulk_write_common.cpp: per-op
results in a cursor, the summary counts, ordered / unordered, errorsOnly, validation errors,
retryable statements, transactions and write concern."""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo import DeleteMany, InsertOne, ReplaceOne, UpdateMany, UpdateOne, errors
from pymongo.write_concern import WriteConcern


@pytest.fixture
def client(server):
    c = server.client()
    for name in ("bw", "bw2"):
        c.drop_database(name)
    yield c
    for name in ("bw", "bw2"):
        c.drop_database(name)
    c.close()


def _bulk(client, ops, ns=("bw.a",), **options):
    return client.admin.command(
        {"bulkWrite": 1, "ops": ops, "nsInfo": [{"ns": n} for n in ns], **options}
    )


def test_mixed_namespaces_reply_as_mongod(client):
    client.bw.a.insert_many([{"_id": 1, "x": 1}, {"_id": 2, "x": 1}])
    reply = _bulk(client, [
        {"insert": 1, "document": {"_id": 10}},
        {"update": 0, "filter": {"x": 1}, "updateMods": {"$set": {"y": 2}}, "multi": True},
        {"update": 0, "filter": {"_id": 7}, "updateMods": {"$set": {"y": 3}}, "upsert": True},
        {"delete": 1, "filter": {"_id": 10}},
        {"delete": 0, "filter": {"_id": 99}},
    ], ns=("bw.a", "bw2.b"))
    # BulkWriteCommandReply's field order; electionId and opTime as a replica-set member adds.
    assert list(reply)[:9] == ["cursor", "nErrors", "nInserted", "nMatched", "nModified",
                               "nUpserted", "nDeleted", "electionId", "opTime"]
    assert reply["cursor"]["id"] == 0 and reply["cursor"]["ns"] == "admin.$cmd.bulkWrite"
    assert list(reply["cursor"]) == ["id", "firstBatch", "ns"]
    assert reply["cursor"]["firstBatch"] == [
        {"ok": 1.0, "idx": 0, "n": 1},
        {"ok": 1.0, "idx": 1, "n": 2, "nModified": 2},
        {"ok": 1.0, "idx": 2, "n": 1, "nModified": 0, "upserted": {"index": 0, "_id": 7}},
        {"ok": 1.0, "idx": 3, "n": 1},
        {"ok": 1.0, "idx": 4, "n": 0},
    ]
    counts = {k: reply[k] for k in ("nErrors", "nInserted", "nMatched", "nModified",
                                    "nUpserted", "nDeleted")}
    assert counts == {"nErrors": 0, "nInserted": 1, "nMatched": 2, "nModified": 2,
                      "nUpserted": 1, "nDeleted": 1}
    assert sorted(d["_id"] for d in client.bw.a.find({"y": {"$exists": True}})) == [1, 2, 7]
    assert client.bw2.b.count_documents({}) == 0


def test_ordered_stops_at_the_first_error_unordered_goes_on(client):
    client.bw.a.insert_one({"_id": 1})
    ops = [{"insert": 0, "document": {"_id": 1}}, {"insert": 0, "document": {"_id": 2}},
           {"update": 0, "filter": {"_id": 2}, "updateMods": {"$inc": {"s": "x"}}}]
    reply = _bulk(client, ops)
    first = reply["cursor"]["firstBatch"]
    assert len(first) == 1 and reply["nErrors"] == 1 and reply["nInserted"] == 0
    err = first[0]
    assert (err["ok"], err["idx"], err["code"], err["n"]) == (0.0, 0, 11000, 0)
    assert err["keyPattern"] == {"_id": 1} and err["keyValue"] == {"_id": 1}
    assert list(err)[:4] == ["ok", "idx", "code", "errmsg"] and "nModified" not in err
    assert client.bw.a.count_documents({}) == 1

    reply = _bulk(client, ops, ordered=False)
    batch = reply["cursor"]["firstBatch"]
    assert [i["idx"] for i in batch] == [0, 1, 2] and reply["nErrors"] == 2
    assert batch[1] == {"ok": 1.0, "idx": 1, "n": 1}
    # an update's error carries nModified: 0 (addUpdateErrorReply)
    assert batch[2]["code"] == 14 and batch[2]["n"] == 0 and batch[2]["nModified"] == 0


def test_errors_only_and_the_cursor(client):
    reply = _bulk(client, [{"insert": 0, "document": {"_id": i}} for i in range(3)],
                  errorsOnly=True)
    # no reply to keep: the simplest reply (no cursor, no electionId / opTime)
    assert reply["cursor"] == {"id": 0, "firstBatch": [], "ns": "admin.$cmd.bulkWrite"}
    assert reply["nInserted"] == 3 and "electionId" not in reply

    reply = _bulk(client, [{"insert": 0, "document": {"_id": i}} for i in range(5)],
                  ordered=False, cursor={"batchSize": 2})
    assert [i["idx"] for i in reply["cursor"]["firstBatch"]] == [0, 1]
    cursor_id = reply["cursor"]["id"]
    assert isinstance(cursor_id, Int64) and cursor_id != 0
    more = client.admin.command("getMore", cursor_id, collection="$cmd.bulkWrite")
    assert [i["idx"] for i in more["cursor"]["nextBatch"]] == [2, 3, 4]
    assert [i.get("code") for i in more["cursor"]["nextBatch"]] == [11000, None, None]
    assert reply["nErrors"] == 3 and reply["nInserted"] == 2  # counts cover every op


@pytest.mark.parametrize(("cmd", "code", "message"), [
    ({"ops": [], "nsInfo": [{"ns": "bw.a"}]}, 16,
     "Write batch sizes must be between 1 and 100000. Got 0 operations."),
    ({"ops": [{"insert": 1, "document": {}}], "nsInfo": [{"ns": "bw.a"}]}, 2,
     "BulkWrite ops entry { insert: 1, document: {} } has an invalid nsInfo index."),
    ({"ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "bw"}]}, 73,
     "Invalid namespace specified for bulkWrite: 'bw'"),
    ({"ops": [{"insert": 0, "document": {}}]}, 40414,
     "BSON field 'bulkWrite.nsInfo' is missing but a required field"),
    ({"ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "bw.a"}], "bogus": 1}, 40415,
     "BSON field 'bulkWrite.bogus' is an unknown field."),
    ({"ops": [{"insert": 0, "document": {}}], "nsInfo": [{"ns": "bw.a"}], "stmtId": 0,
      "stmtIds": [0]}, 72, None),
])
def test_invalid_requests_fail_whole(client, cmd, code, message):
    with pytest.raises(errors.OperationFailure) as info:
        client.admin.command({"bulkWrite": 1, **cmd})
    assert info.value.code == code
    if message is not None:
        assert info.value.details["errmsg"] == message
    assert client.bw.a.count_documents({}) == 0


def test_admin_only(client):
    with pytest.raises(errors.OperationFailure) as info:
        client.bw.command({"bulkWrite": 1, "ops": [{"insert": 0, "document": {}}],
                           "nsInfo": [{"ns": "bw.a"}]})
    assert info.value.code == 13
    assert info.value.details["errmsg"] == "bulkWrite may only be run against the admin database."


def test_driver_client_bulk_write(client):
    result = client.bulk_write([
        InsertOne({"_id": 1, "k": "a"}, namespace="bw.a"),
        InsertOne({"_id": 1, "k": "b"}, namespace="bw2.b"),
        UpdateMany({}, {"$set": {"u": 1}}, namespace="bw.a"),
        ReplaceOne({"_id": 5}, {"r": 1}, upsert=True, namespace="bw2.b"),
        DeleteMany({"k": "b"}, namespace="bw2.b"),
    ], verbose_results=True)
    assert (result.inserted_count, result.matched_count, result.modified_count,
            result.upserted_count, result.deleted_count) == (2, 1, 1, 1, 1)
    assert result.update_results[3].upserted_id == 5
    assert list(client.bw2.b.find()) == [{"_id": 5, "r": 1}]


def test_retried_statements_run_once(client):
    with client.start_session() as session:
        cmd = {"bulkWrite": 1, "ops": [{"insert": 0, "document": {"_id": 1}},
                                       {"update": 0, "filter": {"_id": 1},
                                        "updateMods": {"$inc": {"n": 1}}}],
               "nsInfo": [{"ns": "bw.a"}], "txnNumber": Int64(1)}
        first = client.admin.command(cmd, session=session)
        again = client.admin.command(cmd, session=session)
    assert "retriedStmtIds" not in first
    assert again["retriedStmtIds"] == [0, 1]
    assert again["cursor"]["firstBatch"] == first["cursor"]["firstBatch"]
    assert list(client.bw.a.find()) == [{"_id": 1, "n": 1}]


def test_multi_refused_in_a_retryable_write(client):
    with client.start_session() as session:
        reply = client.admin.command(
            {"bulkWrite": 1, "nsInfo": [{"ns": "bw.a"}], "txnNumber": Int64(1),
             "ops": [{"delete": 0, "filter": {}, "multi": True}]}, session=session)
    item = reply["cursor"]["firstBatch"][0]
    assert (item["code"], item["errmsg"]) == (72, "Cannot use retryable writes with multi=true")


def test_in_a_transaction(client):
    client.bw.a.insert_one({"_id": 0})
    with client.start_session() as session:
        session.start_transaction()
        client.bulk_write([InsertOne({"_id": 1}, namespace="bw.a"),
                           UpdateOne({"_id": 0}, {"$set": {"t": 1}}, namespace="bw.a")],
                          session=session)
        assert client.bw.a.count_documents({}) == 1  # not visible outside before commit
        session.commit_transaction()
    assert list(client.bw.a.find().sort("_id", 1)) == [{"_id": 0, "t": 1}, {"_id": 1}]


def test_write_concern(client):
    reply = _bulk(client, [{"insert": 0, "document": {"_id": 1}}], writeConcern={"w": 2})
    assert reply["nInserted"] == 1
    assert reply["writeConcernError"]["code"] == 100
    with pytest.raises(errors.ClientBulkWriteException) as info:
        client.bulk_write([InsertOne({"_id": 2}, namespace="bw.a")],
                          write_concern=WriteConcern(w=3))
    assert info.value.write_concern_errors[0]["code"] == 100
    assert client.bw.a.count_documents({}) == 2


def test_let_variables(client):
    client.bw.a.insert_many([{"_id": 1, "x": 1}, {"_id": 2, "x": 2}])
    reply = _bulk(client, [
        {"update": 0, "filter": {"$expr": {"$eq": ["$_id", "$$id"]}},
         "updateMods": [{"$set": {"x": "$$value"}}]},
        {"delete": 0, "filter": {"$expr": {"$eq": ["$_id", "$$gone"]}}},
    ], let={"id": 1, "value": 10, "gone": 2})
    assert reply["nModified"] == 1 and reply["nDeleted"] == 1
    assert list(client.bw.a.find()) == [{"_id": 1, "x": 10}]


def test_update_one_sort_picks_the_first_match_in_that_order(client):
    client.bw.a.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 22}, {"_id": 3, "x": 33}])
    reply = _bulk(client, [{"update": 0, "filter": {"_id": {"$gt": 1}},
                            "updateMods": {"$inc": {"x": 1}}, "sort": {"_id": -1}}])
    assert reply["nModified"] == 1
    client.bw.a.update_one({"_id": {"$gt": 1}}, {"$inc": {"x": 100}}, sort={"x": 1})
    client.bw.a.replace_one({}, {"r": 1}, sort={"_id": -1})
    assert list(client.bw.a.find().sort("_id", 1)) == [
        {"_id": 1, "x": 11}, {"_id": 2, "x": 122}, {"_id": 3, "r": 1}]


def test_dollar_prefixed_field_in_id_is_refused(client):
    reply = _bulk(client, [{"insert": 0, "document": {"_id": {"a": {"$b": 1}}}}])
    item = reply["cursor"]["firstBatch"][0]
    assert (item["code"], item["errmsg"]) == (
        52, "_id fields may not contain '$'-prefixed fields: $b is not valid for storage.")
    client.bw.a.insert_one({"_id": {"$ref": "c", "$id": 1}})  # a DBRef is a valid _id
    with pytest.raises(errors.WriteError) as info:
        client.bw.a.insert_one({"_id": {"$a": 1}})
    assert info.value.code == 52
    assert client.bw.a.count_documents({}) == 1


def test_a_pipeline_update_that_drops_the_id_keeps_it(client):
    client.bw.a.insert_one({"_id": 1, "t": {"u": 2}})
    reply = _bulk(client, [{"update": 0, "filter": {"_id": 1},
                            "updateMods": [{"$replaceRoot": {"newRoot": "$t"}}]}])
    assert reply["nModified"] == 1
    assert list(client.bw.a.find()) == [{"_id": 1, "u": 2}]
