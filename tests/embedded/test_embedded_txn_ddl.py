"""DDL and transactions on the embedded store, as mongod 8.0: commands refused inside a
transaction (263, the transaction goes on), `create`/`createIndexes`/implicit creation inside
one (logged in its applyOps), outside DDL waiting for the transaction, and errors that abort it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bson.son import SON
from pymongo import errors

from tests.support.embedded_support import (
    Outside,
    database_for_test,
    wait_until_blocked,
)


@pytest.fixture
def db(client, request):
    return database_for_test(client, request)


def _refused(db) -> list[tuple[Any, Any, str]]:
    """(database, command, mongod's message) for commands mongod 8.0 refuses in a transaction:
    first those canUseTransactions refuses before the session is checked out (the transaction
    goes on), then two the command itself refuses (the error aborts the transaction)."""
    admin = db.client.admin
    cmd = "Cannot run '{}' in a multi-document transaction."
    return [
        (db, SON([("drop", "other")]), cmd.format("drop")),
        (db, SON([("dropDatabase", 1)]), cmd.format("dropDatabase")),
        (admin, SON([("renameCollection", f"{db.name}.other"), ("to", f"{db.name}.x")]),
         cmd.format("renameCollection")),
        (db, SON([("collMod", "other"), ("validator", {})]), cmd.format("collMod")),
        (db, SON([("dropIndexes", "other"), ("index", "*")]), cmd.format("dropIndexes")),
        (db, SON([("listCollections", 1)]), cmd.format("listCollections")),
        (db, SON([("listIndexes", "other")]), cmd.format("listIndexes")),
        (db, SON([("ping", 1)]), cmd.format("ping")),
        (db, SON([("count", "other")]),
         "Cannot run 'count' in a multi-document transaction. Please see "
         "http://dochub.mongodb.org/core/transaction-count for a recommended alternative."),
        (db, SON([("create", "v"), ("viewOn", "other"), ("pipeline", [])]),
         "Cannot create a view in a multi-document transaction."),
        (db, SON([("createIndexes", "other"), ("indexes", [{"key": {"a": 1}, "name": "a_1"}])]),
         f"Cannot create new indexes on existing collection {db.name}.other in a "
         "multi-document transaction."),
    ]


@pytest.mark.parametrize("k", range(11))
def test_refused_command_gets_263(client, db, k):
    db.other.insert_one({"_id": 0})
    target_db, cmd, message = _refused(db)[k]
    goes_on = k < 9
    with client.start_session() as s:
        s.start_transaction()
        db.t.insert_one({"_id": 1}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            target_db.command(cmd, session=s)
        assert info.value.code == 263
        assert info.value.details["codeName"] == "OperationNotSupportedInTransaction"
        assert info.value.details["errmsg"] == message
        assert "errorLabels" not in info.value.details  # not a TransientTransactionError
        if goes_on:
            s.commit_transaction()  # not aborted: the insert commits
        else:
            with pytest.raises(errors.OperationFailure) as info:
                s.commit_transaction()
            assert info.value.code == 251
    assert db.t.find_one() == ({"_id": 1} if goes_on else None)
    assert db.other.find_one() == {"_id": 0}  # and the refused command did nothing
    assert sorted(db.list_collection_names()) == (["other", "t"] if goes_on else ["other"])


def test_refused_first_command_starts_no_transaction(server, client, db):
    with client.start_session() as s:
        s.start_transaction()
        with pytest.raises(errors.OperationFailure) as info:
            db.command("drop", "t", session=s)
        assert info.value.code == 263
        lsid = bytes(s.session_id["id"])
        # refused before the session was checked out: no transaction started
        assert not [t for t in server.store.sessions.values()
                    if bytes(t.lsid["id"]) == lsid and t.txn is not None]
        s.abort_transaction()


def test_create_and_create_indexes_in_a_transaction_are_in_its_apply_ops(server, client, db):
    start = len(server.entries())
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("made", session=s)
        reply = db.command(
            "createIndexes", "made", indexes=[{"key": {"a": 1}, "name": "a_1"}], session=s
        )
        assert reply["createdCollectionAutomatically"] is True
        assert (reply["numIndexesBefore"], reply["numIndexesAfter"]) == (1, 2)
        db.made.insert_one({"_id": 1, "a": 1}, session=s)
        db.implicit.insert_one({"_id": 2}, session=s)  # implicit creation
        assert db.made.find_one({}, session=s) == {"_id": 1, "a": 1}
        s.commit_transaction()
    entries = server.entries()[start:]
    assert len(entries) == 1  # no create entry outside the transaction
    entry = entries[0]
    assert entry["op"] == "c" and entry["ns"] == "admin.$cmd" and "lsid" in entry
    ops = entry["o"]["applyOps"]
    assert [(op["op"], op["ns"], next(iter(op["o"]))) for op in ops] == [
        ("c", f"{db.name}.$cmd", "create"),
        ("c", f"{db.name}.$cmd", "createIndexes"),
        ("i", f"{db.name}.made", "_id"),
        ("c", f"{db.name}.$cmd", "create"),
        ("i", f"{db.name}.implicit", "_id"),
    ]
    for op in ops:
        assert list(op)[:4] == ["op", "ns", "ui", "o"]
    assert ops[0]["o"] == {"create": "made", "idIndex": {"v": 2, "key": {"_id": 1},
                                                         "name": "_id_"}}
    assert ops[1]["o"] == {"createIndexes": "made", "v": 2, "key": {"a": 1}, "name": "a_1"}
    assert ops[0]["ui"] == ops[1]["ui"] == ops[2]["ui"] != ops[4]["ui"]
    assert ops[3]["ui"] == ops[4]["ui"]
    assert [i["name"] for i in db.made.list_indexes()] == ["_id_", "a_1"]
    assert db.implicit.find_one() == {"_id": 2}


def test_aborted_create_leaves_nothing(server, client, db):
    start = len(server.entries())
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("gone", session=s)
        db.gone.insert_one({"_id": 1}, session=s)
        db.implicit.insert_one({"_id": 1}, session=s)
        s.abort_transaction()
    assert server.entries()[start:] == []
    assert "gone" not in db.list_collection_names()
    assert "implicit" not in db.list_collection_names()
    db.gone.insert_one({"_id": 5})  # the name is free again: a new collection
    assert db.gone.find_one() == {"_id": 5}


def test_change_stream_reports_the_create_with_the_transaction(client, db):
    with db.watch(show_expanded_events=True, max_await_time_ms=50) as stream:
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("evt", session=s)
            db.evt.insert_one({"_id": 1}, session=s)
            s.commit_transaction()
        events = []
        while len(events) < 2:
            event = stream.try_next()
            if event is not None:
                events.append(event)
    assert [e["operationType"] for e in events] == ["create", "insert"]
    create, insert = events
    assert create["ns"] == {"db": db.name, "coll": "evt"}
    assert create["lsid"] == insert["lsid"] and create["txnNumber"] == insert["txnNumber"]
    assert create["clusterTime"] == insert["clusterTime"]
    assert create["collectionUUID"] == insert["collectionUUID"]


def test_create_of_an_existing_collection_fails_and_aborts(client, db):
    db.create_collection("there")
    with client.start_session() as s:
        s.start_transaction()
        db.t.insert_one({"_id": 1}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            db.command("create", "there", session=s)
        assert (info.value.code, info.value.details["codeName"]) == (48, "NamespaceExists")
        with pytest.raises(errors.OperationFailure) as info:
            s.commit_transaction()
        assert info.value.code == 251
    assert db.t.find_one() is None


def test_create_indexes_on_a_non_empty_new_collection_is_refused(client, db):
    with client.start_session() as s:
        s.start_transaction()
        db.fresh.insert_one({"_id": 1}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            db.command("createIndexes", "fresh", indexes=[{"key": {"a": 1}, "name": "a_1"}],
                       session=s)
        assert info.value.code == 263
        assert info.value.details["errmsg"] == (
            f"Cannot create new indexes on non-empty collection {db.name}.fresh in a "
            "multi-document transaction."
        )
        with pytest.raises(errors.OperationFailure) as info:  # the error aborted it
            s.commit_transaction()
        assert info.value.code == 251
    assert "fresh" not in db.list_collection_names()


def test_existing_indexes_are_fine_in_a_transaction(client, db):
    db.c.create_index("a")
    with client.start_session() as s:
        s.start_transaction()
        reply = db.command("createIndexes", "c", indexes=[{"key": {"a": 1}, "name": "a_1"}],
                           session=s)
        assert reply["note"] == "all indexes already exist"
        db.c.insert_one({"_id": 1}, session=s)
        s.commit_transaction()
    assert db.c.find_one() == {"_id": 1}


def test_failed_find_and_modify_aborts_the_transaction(client, db):
    db.c.insert_one({"_id": 1, "a": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            db.c.find_one_and_update({"_id": 1}, {"$inc": {"a": "x"}}, session=s)
        assert info.value.code == 14
        with pytest.raises(errors.OperationFailure) as info:
            s.commit_transaction()
        assert info.value.code == 251
    assert list(db.c.find()) == [{"_id": 1, "a": 1}]


def test_failed_find_aborts_the_transaction(client, db):
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        with pytest.raises(errors.OperationFailure):
            db.c.find_one({"$bogus": 1}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            s.commit_transaction()
        assert info.value.code == 251
    assert db.c.find_one() is None


def _ddl(db, which: str) -> Callable[[], Any]:
    admin = db.client.admin
    return {
        "drop": lambda: db.command("drop", "c"),
        "dropDatabase": lambda: db.command("dropDatabase"),
        "renameCollection": lambda: admin.command(
            "renameCollection", f"{db.name}.c", to=f"{db.name}.d"),
        "collMod": lambda: db.command("collMod", "c", validator={}),
        "dropIndexes": lambda: db.command("dropIndexes", "c", index="*"),
    }[which]


@pytest.mark.parametrize(
    "which", ["drop", "dropDatabase", "renameCollection", "collMod", "dropIndexes"]
)
def test_outside_ddl_waits_for_the_transaction(server, client, db, which):
    db.c.insert_one({"_id": 1})
    db.c.create_index("a")  # for dropIndexes to drop
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        outside = Outside(_ddl(db, which))
        outside.start()
        wait_until_blocked(server)
        assert outside.is_alive()  # held by the transaction
        s.commit_transaction()
    outside.join()
    assert outside.error is None
    assert server.store.waiting_writes == 0
    # The DDL ran after the commit: its entry follows the transaction's.
    ops = [(e["op"], next(iter(e["o"]))) for e in server.entries()[-3:]]
    assert ("c", "applyOps") in ops
    assert ops.index(("c", "applyOps")) < len(ops) - 1


def test_outside_drop_does_not_see_a_collection_being_created(server, client, db):
    # mongod: a collection a transaction creates is in its UncommittedCatalogUpdates only, so
    # an outside drop finds nothing to drop and does not wait
    with client.start_session() as s:
        s.start_transaction()
        db.new.insert_one({"_id": 1}, session=s)
        result = db.command("drop", "new")
        assert "nIndexesWas" not in result  # nothing to drop
        s.commit_transaction()
    assert db.new.find_one() == {"_id": 1}


def test_outside_insert_into_a_collection_being_created_makes_the_commit_conflict(
    server, client, db
):
    # mongod (jstests/core/txns/create_collection_parallel.js): the outside insert creates
    # the collection itself at once; the transaction's commit then gets 112 WriteConflict
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("new", session=s)
        db.new.insert_one({"_id": 9})
        with pytest.raises(errors.OperationFailure) as info:
            s.commit_transaction()
        assert (info.value.code, info.value.details["codeName"]) == (112, "WriteConflict")
        assert info.value.has_error_label("TransientTransactionError")
    assert list(db.new.find()) == [{"_id": 9}]


def test_outside_ddl_gets_max_time_ms_expired(client, db):
    db.c.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2}, session=s)
        with pytest.raises(errors.OperationFailure) as info:
            db.command(SON([("drop", "c"), ("maxTimeMS", 20)]))
        assert (info.value.code, info.value.details["codeName"]) == (50, "MaxTimeMSExpired")
        s.commit_transaction()
    assert sorted(d["_id"] for d in db.c.find()) == [1, 2]
