"""Fail points `onPrimaryTransactionalWrite` and `maxTimeAlwaysTimeOut`, and write concern on DDL
commands and on aggregate with $out, through pymongo against the embedded store.

onPrimaryTransactionalWrite as mongod's TransactionParticipant evaluates it: once per retryable
write statement; `closeConnection` (default true) ends the connection but the write is kept
(a retry finds it executed), `failBeforeCommitExceptionCode` fails the statement unwritten.
"""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo import errors
from pymongo.write_concern import WriteConcern


@pytest.fixture
def client(server):
    c = server.client()
    c.drop_database("fp")
    yield c
    for point in ("onPrimaryTransactionalWrite", "maxTimeAlwaysTimeOut"):
        c.admin.command("configureFailPoint", point, mode="off")
    c.drop_database("fp")
    c.close()


def _fail_point(client, name, mode, **data):
    client.admin.command({"configureFailPoint": name, "mode": mode, "data": data})


def test_closed_connection_write_kept_and_retried_once(client):
    _fail_point(client, "onPrimaryTransactionalWrite", {"times": 1})
    client.fp.c.insert_many([{"_id": 1}, {"_id": 2}])  # retryable: the retry answers from history
    client.fp.c.update_one({"_id": 1}, {"$inc": {"n": 1}})
    assert list(client.fp.c.find().sort("_id", 1)) == [{"_id": 1, "n": 1}, {"_id": 2}]


def test_fail_before_commit_leaves_nothing(client):
    _fail_point(client, "onPrimaryTransactionalWrite", {"skip": 1},
                failBeforeCommitExceptionCode=50, closeConnection=False)
    with client.start_session() as session:
        reply = client.fp.command(
            {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}], "txnNumber": Int64(1)},
            session=session,
        )
    # statement 0 written, statement 1 failed unwritten (ordered: the batch stops there)
    assert reply["n"] == 1
    [error] = reply["writeErrors"]
    assert (error["index"], error["code"]) == (1, 50)
    assert error["errmsg"].endswith(":1 due to failpoint. The write must not be reflected.")
    assert [d["_id"] for d in client.fp.c.find()] == [1]


def test_always_failing_retryable_write_gives_up(client):
    _fail_point(client, "onPrimaryTransactionalWrite", "alwaysOn",
                failBeforeCommitExceptionCode=1)
    with pytest.raises(errors.PyMongoError):
        client.fp.c.insert_one({"_id": 1})
    _fail_point(client, "onPrimaryTransactionalWrite", "off")
    assert client.fp.c.count_documents({}) == 0


def test_non_retryable_writes_do_not_meet_it(server, client):
    _fail_point(client, "onPrimaryTransactionalWrite", "alwaysOn",
                failBeforeCommitExceptionCode=1)
    plain = server.client(retryWrites=False)
    try:
        plain.fp.c.insert_one({"_id": 1})
        with plain.start_session() as session:  # a transaction's writes are not retryable ones
            with session.start_transaction():
                plain.fp.c.insert_one({"_id": 2}, session=session)
    finally:
        plain.close()
    assert client.fp.c.count_documents({}) == 2


def test_max_time_always_time_out(client):
    client.fp.c.insert_one({"_id": 1})
    _fail_point(client, "maxTimeAlwaysTimeOut", "alwaysOn")
    assert client.fp.c.find_one() == {"_id": 1}  # no deadline, no timeout
    with pytest.raises(errors.ExecutionTimeout) as info:
        client.fp.c.find_one(max_time_ms=10_000)
    assert info.value.code == 50
    with pytest.raises(errors.ExecutionTimeout):
        client.fp.command("count", "c", maxTimeMS=5000)


@pytest.mark.parametrize("ddl", ["create", "createIndexes", "renameCollection", "drop",
                                 "aggregate $out"])
def test_ddl_reports_unsatisfiable_write_concern(client, ddl):
    client.fp.c.insert_one({"_id": 1, "a": 1})
    db = client.get_database("fp", write_concern=WriteConcern(w=2))
    actions = {
        "create": lambda: db.create_collection("new"),
        "createIndexes": lambda: db.c.create_index("a"),
        "renameCollection": lambda: db.c.rename("renamed"),
        "drop": lambda: db.c.drop(),
        "aggregate $out": lambda: db.c.aggregate([{"$out": "out"}]),
    }
    with pytest.raises(errors.WriteConcernError) as info:
        actions[ddl]()
    assert info.value.code == 100
    assert info.value.details["errInfo"] == {
        "writeConcern": {"w": 2, "wtimeout": 0, "provenance": "clientSupplied"}}
    names = set(client.fp.list_collection_names())  # the DDL itself was applied
    expected = {"create": {"c", "new"}, "createIndexes": {"c"}, "renameCollection": {"renamed"},
                "drop": set(), "aggregate $out": {"c", "out"}}[ddl]
    assert names == expected


def test_ddl_with_a_malformed_write_concern_does_nothing(client):
    with pytest.raises(errors.OperationFailure) as info:
        client.fp.command("create", "never", writeConcern={"w": -1})
    assert info.value.code == 9
    assert "never" not in client.fp.list_collection_names()


def test_failed_ddl_still_reports_the_write_concern(client):
    client.fp.a.insert_one({})
    client.fp.b.insert_one({})
    reply = client.admin.command({"renameCollection": "fp.a", "to": "fp.b",
                                  "writeConcern": {"w": 2}}, check=False)
    assert (reply["ok"], reply["code"], reply["codeName"]) == (0.0, 48, "NamespaceExists")
    assert reply["writeConcernError"]["code"] == 100
    assert list(reply)[:5] == ["ok", "errmsg", "code", "codeName", "writeConcernError"]


def test_retried_find_and_modify_after_a_write_concern_error(server, client):
    client.fp.c.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 22}])
    # 91 ShutdownInProgress makes the driver rediscover the server before its retry
    retrying = server.client(heartbeatFrequencyMS=500, serverSelectionTimeoutMS=30000)
    client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": 1},
        "data": {"failCommands": ["findAndModify"], "errorLabels": ["RetryableWriteError"],
                 "writeConcernError": {"code": 91, "errmsg": "Replication is being shut down"}},
    })
    try:
        # the retry answers the first run's result, without the injected error
        assert retrying.fp.c.find_one_and_delete({"x": {"$gte": 11}}, sort=[("x", 1)]) == {
            "_id": 1, "x": 11}
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        retrying.close()
    assert list(client.fp.c.find()) == [{"_id": 2, "x": 22}]


def test_a_query_cursor_keeps_its_max_time(client):
    client.fp.c.insert_many([{"_id": i} for i in range(5)])
    timed = client.fp.c.find(batch_size=2).max_time_ms(60_000)
    untimed = client.fp.c.find(batch_size=2)
    next(timed), next(untimed)  # the first batches, before the fail point
    _fail_point(client, "maxTimeAlwaysTimeOut", "alwaysOn")
    assert len(untimed.to_list()) == 4  # its getMores have no deadline
    with pytest.raises(errors.ExecutionTimeout):
        timed.to_list()  # the find's maxTimeMS is its getMores' deadline too


def test_test_version_2_is_outside_api_version_1(client):
    assert client.admin.command("testVersion2")["ok"] == 1.0
    with pytest.raises(errors.OperationFailure) as info:
        client.admin.command({"testVersion2": 1, "apiVersion": "1", "apiStrict": True})
    assert info.value.code == 323
    assert "the command testVersion2 is not in API Version 1" in info.value.details["errmsg"]
