"""endSessions, killSessions and killAllSessions end the sessions they name and abort their open
transactions (issue 15: test suites call them between tests; a transaction one test leaves open
must not hold the next test's writes until transactionLifetimeLimitSeconds). Without
authentication, `killSessions: []` and `killAllSessions: []` reach every session."""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

BLOCK_GUARD_MS = 5000  # a write blocked by a leftover transaction fails at this (50), not hangs


def open_transaction(client, coll, doc_id):
    s = client.start_session()
    s.start_transaction()
    coll.insert_one({"_id": doc_id, "by": "txn"}, session=s)
    return s


def insert_outside(db, doc_id):
    """A write outside transactions on a key the transaction holds: it waits for that
    transaction to end (50 MaxTimeMSExpired if it never does)."""
    return db.command({"insert": "c", "documents": [{"_id": doc_id, "by": "outside"}],
                       "maxTimeMS": BLOCK_GUARD_MS})


def assert_aborted(client, s):
    with pytest.raises(OperationFailure) as info:
        s.commit_transaction()
    assert info.value.code == 251
    assert "has been aborted" in info.value.details["errmsg"]
    s.end_session()


@pytest.mark.parametrize("command", ["endSessions", "killSessions"])
def test_ending_a_session_aborts_its_transaction(client, command):
    db = client.k
    db.c.drop()
    db.create_collection("c")
    s = open_transaction(client, db.c, 1)
    other = open_transaction(client, db.c, 2)  # not named: goes on
    client.admin.command({command: [s.session_id]})
    assert insert_outside(db, 1)["n"] == 1  # no longer held
    assert_aborted(client, s)
    other.commit_transaction()
    other.end_session()
    assert sorted((d["_id"], d["by"]) for d in db.c.find()) == [(1, "outside"), (2, "txn")]


@pytest.mark.parametrize("command", ["killAllSessions", "killSessions"])
def test_killing_all_sessions_aborts_every_transaction(client, command):
    db = client.k
    db.c.drop()
    db.create_collection("c")
    sessions = [open_transaction(client, db.c, i) for i in range(3)]
    client.admin.command({command: []})
    for i, s in enumerate(sessions):
        assert insert_outside(db, i)["n"] == 1
        assert_aborted(client, s)
    assert [d["by"] for d in db.c.find()] == ["outside"] * 3


def test_a_killed_session_keeps_its_txn_number(client):
    """The session goes on: its next transaction (a higher txnNumber) works; the killed one's
    number is still refused (251) and an older one 225."""
    db = client.k
    db.c.drop()
    db.create_collection("c")
    s = open_transaction(client, db.c, 1)
    number = s._server_session.transaction_id
    client.admin.command({"killSessions": [s.session_id]})
    with pytest.raises(OperationFailure) as info:
        s.commit_transaction()  # (pymongo's transaction ends here; numbers below are ours)
    assert info.value.code == 251
    with pytest.raises(OperationFailure) as info:
        db.command({"insert": "c", "documents": [{"_id": 5}], "txnNumber": Int64(number),
                    "autocommit": False}, session=s)
    assert info.value.code == 251
    with pytest.raises(OperationFailure) as info:
        db.command({"insert": "c", "documents": [{"_id": 5}], "txnNumber": Int64(number - 1),
                    "autocommit": False, "startTransaction": True}, session=s)
    assert info.value.code == 225
    s.start_transaction()  # pymongo: number + 1
    db.c.insert_one({"_id": 6}, session=s)
    s.commit_transaction()
    s.end_session()
    assert [d["_id"] for d in db.c.find()] == [6]


def test_arguments_are_checked(client):
    for command in ("endSessions", "killSessions", "killAllSessions"):
        with pytest.raises(OperationFailure) as info:
            client.admin.command({command: {"id": 1}})
        assert info.value.code == 14
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"killSessions": [{"id": "not a uuid"}]})
    assert info.value.code == 14
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"killAllSessions": [{"user": "x"}]})
    assert info.value.code == 40414


def test_kill_all_sessions_by_pattern(client):
    db = client.k
    db.c.drop()
    db.create_collection("c")
    first, second = open_transaction(client, db.c, 1), open_transaction(client, db.c, 2)
    client.admin.command({"killAllSessionsByPattern": [{"lsid": first.session_id}]})
    assert_aborted(client, first)
    second.commit_transaction()
    second.end_session()
    third = open_transaction(client, db.c, 3)
    uid = next(client.config.transactions.find({}, {"_id.uid": 1}))["_id"]["uid"]
    client.admin.command({"killAllSessionsByPattern": [{"uid": uid}]})  # everyone's, no auth
    assert_aborted(client, third)
    with pytest.raises(OperationFailure) as info:
        client.admin.command({"killAllSessionsByPattern": [{"uid": "x"}]})
    assert info.value.code == 14
    assert sorted(d["_id"] for d in db.c.find()) == [2]
