"""Transactions on the embedded store are isolated as mongod 8.0's: snapshot reads, uncommitted
writes invisible to others, outside writes waiting for the transaction, and its limits."""

from __future__ import annotations

import pytest
from bson.son import SON
from pymongo import errors

from tests.support.embedded_support import EmbeddedServer, Outside, wait_until_blocked


@pytest.fixture
def coll(client, request):
    c = client.iso[request.node.name]
    c.drop()
    c.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0}])
    return c


def test_uncommitted_writes_are_invisible_to_other_readers(client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$set": {"n": 5}}, session=s)
        coll.insert_one({"_id": 4, "n": 7}, session=s)
        coll.delete_one({"_id": 2}, session=s)
        # outside: the committed documents, for find, aggregate, distinct and matching
        assert list(coll.find()) == [{"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0}]
        assert coll.count_documents({"n": {"$gt": 0}}) == 0
        assert sorted(coll.distinct("n")) == [0]
        assert coll.find_one({"_id": 4}) is None
        # inside: its own writes, in natural order
        assert list(coll.find(session=s)) == [
            {"_id": 1, "n": 5}, {"_id": 3, "n": 0}, {"_id": 4, "n": 7},
        ]
        assert coll.count_documents({"n": {"$gt": 0}}, session=s) == 2
        assert sorted(coll.distinct("n", session=s)) == [0, 5, 7]
        assert list(coll.find(session=s).sort("n", -1).limit(1)) == [{"_id": 4, "n": 7}]
        s.commit_transaction()
    assert list(coll.find()) == [{"_id": 1, "n": 5}, {"_id": 3, "n": 0}, {"_id": 4, "n": 7}]


def test_aborted_writes_never_show(client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.update_many({}, {"$set": {"n": 9}}, session=s)
        assert coll.count_documents({"n": 9}, session=s) == 3
        s.abort_transaction()
    assert coll.count_documents({"n": 9}) == 0


def test_two_transactions_do_not_see_each_other(client, coll):
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        coll.insert_one({"_id": 10}, session=s1)
        coll.insert_one({"_id": 20}, session=s2)
        assert coll.find_one({"_id": 20}, session=s1) is None
        assert coll.find_one({"_id": 10}, session=s2) is None
        s1.commit_transaction()
        assert coll.find_one({"_id": 10}, session=s2) is None  # after s2's snapshot
        s2.commit_transaction()
    assert sorted(d["_id"] for d in coll.find()) == [1, 2, 3, 10, 20]


def test_snapshot_is_taken_at_the_first_operation(client, coll):
    with client.start_session() as s:
        s.start_transaction()
        assert coll.find_one({"_id": 1}, session=s) == {"_id": 1, "n": 0}
        coll.update_one({"_id": 1}, {"$set": {"n": 1}})  # committed outside, afterwards
        coll.delete_one({"_id": 2})
        coll.insert_one({"_id": 5, "n": 0})
        assert list(coll.find(session=s)) == [
            {"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0},
        ]
        # writing a document committed after the snapshot: 112, the transaction is aborted
        with pytest.raises(errors.OperationFailure) as info:
            coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s)
        assert info.value.code == 112
        assert info.value.has_error_label("TransientTransactionError")
        with pytest.raises(errors.OperationFailure) as again:
            coll.find_one({"_id": 3}, session=s)
        assert again.value.code == 251
        assert again.value.has_error_label("TransientTransactionError")
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1}


def test_outside_update_waits_for_the_commit_then_applies(server, client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 1}, {"$set": {"n": 5}}, session=s)
        outside = Outside(lambda: coll.update_one({"_id": 1}, {"$inc": {"n": 1}}))
        outside.start()
        wait_until_blocked(server)
        assert outside.is_alive()  # held by the transaction, not failed
        s.commit_transaction()
    outside.join()
    assert outside.error is None and outside.result.modified_count == 1
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 6}  # applied after the commit


def test_outside_multi_update_resumes_where_it_waited(server, client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 2}, {"$set": {"n": 100}}, session=s)
        outside = Outside(lambda: coll.update_many({"n": {"$lt": 50}}, {"$inc": {"n": 1}}))
        outside.start()
        wait_until_blocked(server)
        s.commit_transaction()
    outside.join()
    assert outside.error is None
    # _id 1 was updated before the wait, _id 2 no longer matches after the commit
    assert (outside.result.matched_count, outside.result.modified_count) == (2, 2)
    assert list(coll.find()) == [{"_id": 1, "n": 1}, {"_id": 2, "n": 100}, {"_id": 3, "n": 1}]


def test_outside_insert_of_the_same_id_fails_after_commit_or_succeeds_after_abort(
    server, client, coll
):
    for commit in (True, False):
        with client.start_session() as s:
            s.start_transaction()
            coll.insert_one({"_id": "k", "by": "txn"}, session=s)
            outside = Outside(lambda: coll.insert_one({"_id": "k", "by": "outside"}))
            outside.start()
            wait_until_blocked(server)
            if commit:
                s.commit_transaction()
            else:
                s.abort_transaction()
        outside.join()
        if commit:
            assert isinstance(outside.error, errors.DuplicateKeyError)
            assert coll.find_one({"_id": "k"}) == {"_id": "k", "by": "txn"}
            coll.delete_one({"_id": "k"})
        else:
            assert outside.error is None
            assert coll.find_one({"_id": "k"}) == {"_id": "k", "by": "outside"}


def test_waiting_write_gets_max_time_ms_expired(client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 3}, {"$set": {"n": 1}}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            coll.database.command(SON([
                ("update", coll.name), ("updates", [{"q": {"_id": 3}, "u": {"$set": {"n": 2}}}]),
                ("maxTimeMS", 20),
            ]))
        assert (info.value.code, info.value.details["codeName"]) == (50, "MaxTimeMSExpired")
        assert info.value.details["errmsg"] == "operation exceeded time limit"
        s.commit_transaction()
    assert coll.find_one({"_id": 3}) == {"_id": 3, "n": 1}


def test_unique_index_in_a_transaction(server, client, coll):
    coll.create_index("u", unique=True, sparse=True)
    coll.update_one({"_id": 3}, {"$set": {"u": 3}})
    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": 7, "u": 7}, session=s)
        coll.update_one({"_id": 3}, {"$unset": {"u": 1}}, session=s)
        coll.insert_one({"_id": 8, "u": 3}, session=s)  # free in the transaction's view
        outside = Outside(lambda: coll.insert_one({"_id": 9, "u": 7}))
        outside.start()
        wait_until_blocked(server)
        with pytest.raises(errors.DuplicateKeyError):  # its own document holds u: 7
            coll.insert_one({"_id": 10, "u": 7}, session=s)
        with pytest.raises(errors.OperationFailure) as info:  # that error aborted it
            coll.insert_one({"_id": 11}, session=s)
        assert info.value.code == 251
    outside.join()
    assert outside.error is None  # the abort let it through
    assert sorted(d["_id"] for d in coll.find({"u": {"$exists": True}})) == [3, 9]


def test_transaction_limits(client, coll):
    with client.start_session() as s:
        s.start_transaction()
        coll.find_one({}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            coll.database.command("count", coll.name, session=s)
        assert info.value.code == 263
        assert info.value.details["codeName"] == "OperationNotSupportedInTransaction"
        assert info.value.details["errmsg"].startswith(
            "Cannot run 'count' in a multi-document transaction."
        )
        s.abort_transaction()
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(errors.OperationFailure) as info:
            client.config.c.find_one({}, session=s)
        assert (info.value.code, info.value.details["errmsg"]) == (
            263, "Cannot run command against the config database in a transaction."
        )
        s.abort_transaction()
    with client.start_session() as s:  # a commit retried after it succeeded: the same reply
        s.start_transaction()
        coll.insert_one({"_id": 30}, session=s)
        s.commit_transaction()
        s.commit_transaction()
    assert coll.find_one({"_id": 30}) == {"_id": 30}


def test_the_reaper_aborts_an_old_transaction_and_frees_waiting_writes(tmp_path):
    with EmbeddedServer(transaction_lifetime_limit_seconds=0.05) as srv, srv.client() as c:
        coll = c.iso.reaper
        coll.insert_one({"_id": 1, "n": 0})
        with c.start_session() as s:
            s.start_transaction()
            coll.update_one({"_id": 1}, {"$set": {"n": 5}}, session=s)
            # waits until the transaction ends: here, only the reaper ends it
            result = coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
            assert result.modified_count == 1
            with pytest.raises(errors.OperationFailure) as info:
                s.commit_transaction()
            assert info.value.code == 251
            assert info.value.has_error_label("TransientTransactionError")
        assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1}
