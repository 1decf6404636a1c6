"""Transaction outcomes and retryable writes outlive a restart, as mongod's `config.transactions`
makes them (issue 13, items 2 and 5): a retried commitTransaction of a committed transaction
answers ok, abortTransaction of it 256 TransactionCommitted, its txnNumber refuses further
statements, older txnNumbers get 225 TransactionTooOld, and a retryable write whose history
the capped oplog lost answers 217 instead of running again.

The retries after a restart come from a new client whose session carries the first client's
lsid (a driver retrying on a new connection sends the same lsid and txnNumber)."""

from __future__ import annotations

import uuid

import pytest
from bson.binary import Binary
from bson.int64 import Int64
from pymongo import MongoClient, errors

from cdcserver.testing import SubprocessServer

GUARD_MS = 10_000  # server selection guard, never a performance expectation


def session_as(client: MongoClient, lsid: dict) -> object:
    """A session of `client` that sends `lsid` (the driver's own session object, its id
    replaced: what a driver retrying an operation sends)."""
    s = client.start_session()
    s.session_id  # noqa: B018  (materializes the server session)
    s._server_session.session_id = dict(lsid)
    s._server_session.mark_dirty()  # never back to the driver's pool of sessions
    return s


def labels(err: errors.OperationFailure) -> list[str]:
    return list((err.details or {}).get("errorLabels", []))


def restart(server: SubprocessServer, data_dir, how: str, extra: list[str] | None = None):
    if how == "kill":
        server.kill()
    server.stop()
    return SubprocessServer(data_dir=data_dir, extra_args=extra or [])


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_committed_transaction_outcome_survives_a_restart(tmp_path, how):
    data_dir = tmp_path / "data"
    server = SubprocessServer(data_dir=data_dir)
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            coll = client.t.c
            with client.start_session() as s:
                s.start_transaction()
                coll.insert_one({"_id": 1}, session=s)
                s.commit_transaction()
                lsid = dict(s.session_id)
            with client.start_session() as s:  # an aborted one: mongod keeps no outcome
                s.start_transaction()
                coll.insert_one({"_id": 2}, session=s)
                s.abort_transaction()
                aborted_lsid = dict(s.session_id)  # (pymongo may reuse the first lsid)
                aborted_number = Int64(s._server_session.transaction_id)
        server = restart(server, data_dir, how)
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            admin, db = client.admin, client.t
            s = session_as(client, lsid)
            commit = {"commitTransaction": 1, "txnNumber": Int64(1), "autocommit": False}
            assert admin.command(commit, session=s)["ok"] == 1.0  # a retry: ok, nothing redone
            assert admin.command(commit, session=s)["ok"] == 1.0

            with pytest.raises(errors.OperationFailure) as info:
                admin.command({"abortTransaction": 1, "txnNumber": Int64(1),
                               "autocommit": False}, session=s)
            assert info.value.code == 256
            assert info.value.details["codeName"] == "TransactionCommitted"
            assert info.value.details["errmsg"] == (
                "Transaction with { txnNumber: 1 } has been committed.")
            assert "TransientTransactionError" not in labels(info.value)

            # item 5: a statement with the committed transaction's number is refused
            with pytest.raises(errors.OperationFailure) as info:
                db.command({"insert": "c", "documents": [{"_id": 3}], "txnNumber": Int64(1),
                            "autocommit": False}, session=s)
            assert info.value.code == 256 and not labels(info.value)
            with pytest.raises(errors.OperationFailure) as info:  # restart it: not here
                db.command({"insert": "c", "documents": [{"_id": 3}], "txnNumber": Int64(1),
                            "autocommit": False, "startTransaction": True}, session=s)
            assert info.value.code == 117
            with pytest.raises(errors.OperationFailure) as info:  # as a retryable write
                db.command({"insert": "c", "documents": [{"_id": 3}], "txnNumber": Int64(1)},
                           session=s)
            assert info.value.code == 217
            with pytest.raises(errors.OperationFailure) as info:  # an older number
                admin.command({**commit, "txnNumber": Int64(0)}, session=s)
            assert info.value.code == 225
            assert info.value.details["codeName"] == "TransactionTooOld"
            assert not labels(info.value)

            # the aborted transaction left no outcome: its retried commit is 251, transient
            s2 = session_as(client, aborted_lsid)
            with pytest.raises(errors.OperationFailure) as info:
                admin.command({**commit, "txnNumber": aborted_number}, session=s2)
            assert info.value.code == 251
            assert "TransientTransactionError" in labels(info.value)

            assert sorted(d["_id"] for d in db.c.find()) == [1]
            applied = [e for e in client.local.oplog.rs.find({"op": "c", "o.applyOps": {
                "$exists": True}})]
            assert len(applied) == 1  # the commit, once
            record = client.config.transactions.find_one({"_id.id": lsid["id"]})
            assert list(record) == ["_id", "txnNum", "lastWriteOpTime", "lastWriteDate", "state"]
            assert (record["txnNum"], record["state"]) == (1, "committed")
            assert record["lastWriteOpTime"]["ts"] == applied[0]["ts"]
            assert record["_id"] == applied[0]["lsid"]
            s.end_session()
            s2.end_session()
    finally:
        server.stop()


def test_statements_after_commit_or_abort_are_refused(server, client):
    """Item 5 without a restart: nothing is acknowledged and then lost."""
    db, admin = client.t5, client.admin
    db.c.drop()
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 1}, session=s)
        s.commit_transaction()
        number = s._server_session.transaction_id
        for extra in ({}, {"ordered": False}):
            with pytest.raises(errors.OperationFailure) as info:
                db.command({"insert": "c", "documents": [{"_id": 2}], "txnNumber": number,
                            "autocommit": False, **extra}, session=s)
            assert info.value.code == 256
        with pytest.raises(errors.OperationFailure) as info:
            db.command({"find": "c", "txnNumber": number, "autocommit": False}, session=s)
        assert info.value.code == 256
        with pytest.raises(errors.OperationFailure) as info:
            admin.command({"abortTransaction": 1, "txnNumber": number, "autocommit": False},
                          session=s)
        assert info.value.code == 256

        s.start_transaction()
        db.c.insert_one({"_id": 3}, session=s)
        s.abort_transaction()
        number = s._server_session.transaction_id
        with pytest.raises(errors.OperationFailure) as info:
            db.command({"update": "c", "updates": [{"q": {}, "u": {"$set": {"x": 1}}}],
                        "txnNumber": number, "autocommit": False}, session=s)
        assert info.value.code == 251
        assert "TransientTransactionError" in labels(info.value)
        with pytest.raises(errors.OperationFailure) as info:
            admin.command({"commitTransaction": 1, "txnNumber": number, "autocommit": False},
                          session=s)
        assert info.value.code == 251
    assert list(db.c.find()) == [{"_id": 1}]


def test_retryable_write_with_truncated_history_is_not_run_again(tmp_path):
    """The session's txnNumber and last write are kept in config.transactions; when the capped
    oplog has dropped the write's entry, a retry answers 217 IncompleteTransactionHistory (as
    mongod) instead of applying the $inc a second time."""
    config = tmp_path / "c.toml"
    config.write_text("[store]\noplog_size_mb = 1\n")
    data_dir = tmp_path / "data"
    extra = ["--config", str(config)]
    server = SubprocessServer(data_dir=data_dir, extra_args=extra)
    inc = {"update": "c", "updates": [{"q": {"_id": 0}, "u": {"$inc": {"n": 1}},
                                       "upsert": True}], "txnNumber": Int64(7)}
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            db = client.r
            lsid = {"id": Binary(uuid.uuid4().bytes, 4)}  # numbered by the test alone
            s = session_as(client, lsid)
            assert db.command(inc, session=s)["n"] == 1
            assert db.command(inc, session=s)["n"] == 1  # a retry: the same answer
            s.end_session()
            for i in range(6):  # ~3 MB: the capped oplog drops the $inc's entry
                db.fill.insert_many([{"_id": f"{i}-{k}", "pad": "x" * 10_000} for k in range(50)])
            oldest = client.local.oplog.rs.find_one()
            assert oldest["ns"] != "r.c"
        server = restart(server, data_dir, "kill", extra)
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            db = client.r
            s = session_as(client, lsid)
            with pytest.raises(errors.OperationFailure) as info:
                db.command(inc, session=s)
            assert info.value.code == 217
            assert info.value.details["codeName"] == "IncompleteTransactionHistory"
            with pytest.raises(errors.OperationFailure) as info:  # the number is still known
                db.command({**inc, "txnNumber": Int64(6)}, session=s)
            assert info.value.code == 225
            assert db.c.find_one({"_id": 0}) == {"_id": 0, "n": 1}
            assert db.command({**inc, "txnNumber": Int64(8)}, session=s)["nModified"] == 1
            assert db.c.find_one({"_id": 0}) == {"_id": 0, "n": 2}
            s.end_session()
    finally:
        server.stop()


def test_a_data_directory_without_records_rebuilds_sessions_from_its_oplog(tmp_path):
    """A data directory written before config.transactions was kept (its table emptied here):
    sessions come from the oplog's lsid entries, so a committed transaction's retried commit
    is still ok and a retryable $inc is still not applied twice."""
    import sqlite3

    data_dir = tmp_path / "data"
    server = SubprocessServer(data_dir=data_dir)
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    inc = {"update": "c", "updates": [{"q": {"_id": 0}, "u": {"$inc": {"n": 1}},
                                       "upsert": True}], "txnNumber": Int64(3)}
    commit = {"commitTransaction": 1, "txnNumber": Int64(2), "autocommit": False}
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            s = session_as(client, lsid)
            client.r.command({"insert": "t", "documents": [{"_id": 1}], "txnNumber": Int64(2),
                              "autocommit": False, "startTransaction": True}, session=s)
            client.admin.command(commit, session=s)
            s.end_session()
            s = session_as(client, {"id": Binary(uuid.uuid4().bytes, 4)})
            assert client.r.command(inc, session=s)["nModified"] == 0  # the upsert
            inc_lsid = dict(s.session_id)
            s.end_session()
        server.stop()
        with sqlite3.connect(data_dir / "cdcserver.sqlite3") as db:
            assert db.execute("DELETE FROM transactions").rowcount == 2
        server = SubprocessServer(data_dir=data_dir)
        with MongoClient(server.uri, serverSelectionTimeoutMS=GUARD_MS) as client:
            s = session_as(client, lsid)
            assert client.admin.command(commit, session=s)["ok"] == 1.0
            s.end_session()
            s = session_as(client, inc_lsid)
            reply = client.r.command(inc, session=s)
            assert reply["upserted"] == [{"index": 0, "_id": 0}]  # answered from the oplog
            s.end_session()
            assert client.r.c.find_one() == {"_id": 0, "n": 1}
            assert client.r.t.count_documents({}) == 1
    finally:
        server.stop()
