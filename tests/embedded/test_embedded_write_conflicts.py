"""Write conflicts between transactions on the embedded store, through pymongo sessions."""

from __future__ import annotations

import pytest
from pymongo import errors


@pytest.fixture
def coll(client, request):
    c = client.wc_txn[request.node.name]
    c.drop()
    c.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}])
    return c


def test_second_writer_gets_write_conflict_and_is_aborted(client, coll):
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
        with pytest.raises(errors.OperationFailure) as info:
            coll.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=s2)
        err = info.value
        assert (err.code, err.details["codeName"]) == (112, "WriteConflict")
        assert err.has_error_label("TransientTransactionError")
        assert err.details["errmsg"] == (
            "Caused by :: Write conflict during plan execution and yielding is disabled. :: "
            "Please retry your operation or multi-document transaction."
        )
        with pytest.raises(errors.OperationFailure) as again:  # s2's transaction is gone
            coll.update_one({"_id": 2}, {"$inc": {"n": 1}}, session=s2)
        assert again.value.code == 251
        s1.commit_transaction()
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1}
    assert coll.find_one({"_id": 2}) == {"_id": 2, "n": 0}


def test_deletes_and_inserts_conflict_too(client, coll):
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        coll.delete_one({"_id": 2}, session=s1)
        coll.insert_one({"_id": 3}, session=s1)
        with pytest.raises(errors.OperationFailure) as info:
            coll.insert_one({"_id": 3}, session=s2)
        assert info.value.code == 112
        s1.abort_transaction()
    assert sorted(d["_id"] for d in coll.find()) == [1, 2]


def test_locks_are_released_at_commit(client, coll):
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        coll.update_one({"_id": 1}, {"$set": {"n": 5}}, session=s1)
        s1.commit_transaction()
        s2.start_transaction()
        coll.update_one({"_id": 1}, {"$set": {"n": 6}}, session=s2)
        s2.commit_transaction()
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 6}


def test_with_transaction_retries_a_transient_conflict(client, coll):
    holder = client.start_session()
    holder.start_transaction()
    coll.update_one({"_id": 1}, {"$set": {"n": 100}}, session=holder)
    attempts = []

    def body(session):
        attempts.append(1)
        if len(attempts) == 2:
            holder.commit_transaction()  # the first writer finishes: the retry can go through
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=session)

    with client.start_session() as s2:
        s2.with_transaction(body)
    holder.end_session()
    assert len(attempts) == 2
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 101}
