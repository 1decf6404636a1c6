"""A transaction (or a snapshot read) reads the collection catalog as it was at its snapshot, as
mongod 8.0 does: a collection dropped or renamed after the snapshot is still read under its old
name, with its documents as they were then, and a name it took since is not there yet; a write
to such a collection is a 112 WriteConflict (TransientTransactionError) that aborts the
transaction (jstests/core/txns/concurrent_drops_and_creates.js: "We can perform reads on the
dropped collection as it existed when we started the transaction. However, trying to perform a
write will cause a write conflict."; the message is shard_role.cpp's for a write whose
collection changed in the latest catalog).
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import errors

from tests.support.embedded_support import EmbeddedServer


@pytest.fixture
def db(client, request):
    name = request.node.name.replace("[", "_").replace("]", "")[:50]
    client.drop_database(name)
    yield client[name]
    client.drop_database(name)


def _catalog_conflict(fn: Any, ns: str) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        fn()
    details = info.value.details
    assert (details["code"], details["codeName"]) == (112, "WriteConflict")
    assert details["errmsg"] == (
        f"Caused by :: Unable to write to collection '{ns}' due to catalog changes; please "
        "retry the operation :: Please retry your operation or multi-document transaction."
    )
    assert details["errorLabels"] == ["TransientTransactionError"]


def _no_such_transaction(s: Any) -> None:
    # the conflict aborted it (pymongo's abort_transaction hides errors: a commit shows it)
    with pytest.raises(errors.OperationFailure) as info:
        s.commit_transaction()
    assert (info.value.code, info.value.details["codeName"]) == (251, "NoSuchTransaction")


def _retired(server: EmbeddedServer) -> int:
    return server.call(lambda: len(server.store._retired))


def test_dropped_collection_is_read_as_it_was_and_a_write_conflicts(server, client, db):
    # concurrent_drops_and_creates.js, first part
    db.a.insert_one({"_id": 0})
    db.b.insert_many([{"_id": 1}, {"_id": 2}])
    with client.start_session() as s:
        s.start_transaction()
        db.a.insert_one({"_id": "txn"}, session=s)  # its snapshot is taken
        db.b.insert_one({"_id": 3})  # after the snapshot: not seen
        db.b.delete_one({"_id": 1})  # likewise
        db.b.drop()
        assert "b" not in db.list_collection_names()
        assert list(db.b.find(session=s)) == [{"_id": 1}, {"_id": 2}]
        assert db.b.count_documents({}, session=s) == 2
        assert sorted(db.list_collection_names()) == ["a"]  # outside: gone
        _catalog_conflict(lambda: db.b.find_one_and_update(
            {}, {"$set": {"a": 1}}, upsert=True, session=s), f"{db.name}.b")
        _no_such_transaction(s)
    assert list(db.a.find()) == [{"_id": 0}]  # the transaction's insert was aborted
    assert "b" not in db.list_collection_names()
    assert _retired(server) == 0  # nothing kept once no older snapshot is open


@pytest.mark.parametrize("write", ["insert", "update", "delete", "update-none", "delete-none",
                                   "find-and-modify-none"])
def test_each_kind_of_write_to_a_dropped_collection_conflicts(client, db, write):
    """Also a statement that matches nothing: the collection's acquisition for the write
    conflicts, not the write of a document."""
    db.a.insert_one({"_id": 0})
    db.b.insert_one({"_id": 1, "x": 1})
    with client.start_session() as s:
        s.start_transaction()
        assert db.a.find_one(session=s) == {"_id": 0}
        db.b.drop()
        run = {
            "insert": lambda: db.b.insert_one({"_id": 2}, session=s),
            "update": lambda: db.b.update_one({"_id": 1}, {"$inc": {"x": 1}}, session=s),
            "delete": lambda: db.b.delete_one({"_id": 1}, session=s),
            "update-none": lambda: db.b.update_one({"_id": 9}, {"$inc": {"x": 1}}, session=s),
            "delete-none": lambda: db.b.delete_many({"_id": 9}, session=s),
            "find-and-modify-none": lambda: db.b.find_one_and_delete({"_id": 9}, session=s),
        }[write]
        _catalog_conflict(run, f"{db.name}.b")
        _no_such_transaction(s)
    assert "b" not in db.list_collection_names()


def test_renamed_collection_is_read_under_its_old_name_only(client, db):
    db.a.insert_many([{"_id": 1}, {"_id": 2}])
    db.other.insert_one({"_id": 0})
    with client.start_session() as s:
        s.start_transaction()
        assert db.other.find_one(session=s) == {"_id": 0}
        db.a.insert_one({"_id": 3})  # after the snapshot
        client.admin.command("renameCollection", f"{db.name}.a", to=f"{db.name}.b")
        db.b.insert_one({"_id": 4})
        assert list(db.a.find(session=s)) == [{"_id": 1}, {"_id": 2}]
        assert list(db.b.find(session=s)) == []  # no b at its snapshot
        _catalog_conflict(lambda: db.a.insert_one({"_id": 5}, session=s), f"{db.name}.a")
        _no_such_transaction(s)
    assert list(db.b.find()) == [{"_id": 1}, {"_id": 2}, {"_id": 3}, {"_id": 4}]
    assert "a" not in db.list_collection_names()


def test_rename_over_a_target_keeps_the_target_of_the_snapshot(client, db):
    db.a.insert_one({"_id": "a"})
    db.b.insert_one({"_id": "old b"})
    with client.start_session() as s:
        s.start_transaction()
        assert db.b.find_one(session=s) == {"_id": "old b"}
        client.admin.command("renameCollection", f"{db.name}.a", to=f"{db.name}.b",
                             dropTarget=True)
        assert list(db.b.find(session=s)) == [{"_id": "old b"}]
        assert list(db.a.find(session=s)) == [{"_id": "a"}]
        _catalog_conflict(lambda: db.b.update_one({"_id": "old b"}, {"$set": {"x": 1}},
                                                  session=s), f"{db.name}.b")
    assert list(db.b.find()) == [{"_id": "a"}]


def test_drop_and_recreate_is_the_old_collection_to_the_snapshot(client, db):
    db.b.insert_one({"_id": "old"})
    with client.start_session() as s:
        s.start_transaction()
        assert db.b.find_one(session=s) == {"_id": "old"}
        db.b.drop()
        db.b.insert_one({"_id": "new"})
        assert list(db.b.find(session=s)) == [{"_id": "old"}]
        _catalog_conflict(lambda: db.b.insert_one({"_id": "txn"}, session=s), f"{db.name}.b")
    assert list(db.b.find()) == [{"_id": "new"}]


def test_dropped_database_and_lookup_read_the_snapshot(client, db):
    db.orders.insert_many([{"_id": 1, "item": "pen"}, {"_id": 2, "item": "ink"}])
    db.items.insert_many([{"_id": "pen", "price": 2}, {"_id": "ink", "price": 5}])
    with client.start_session() as s:
        s.start_transaction()
        assert db.orders.count_documents({}, session=s) == 2
        db.items.update_one({"_id": "pen"}, {"$set": {"price": 99}})  # after the snapshot
        client.drop_database(db.name)
        joined = list(db.orders.aggregate([
            {"$lookup": {"from": "items", "localField": "item", "foreignField": "_id",
                         "as": "i"}},
            {"$project": {"price": {"$first": "$i.price"}}},
        ], session=s))
        assert joined == [{"_id": 1, "price": 2}, {"_id": 2, "price": 5}]
        s.commit_transaction()  # read only: nothing to conflict
    assert db.name not in client.list_database_names()


def test_other_collections_still_commit(client, db):
    db.a.insert_one({"_id": 0})
    db.b.insert_one({"_id": 0})
    with client.start_session() as s:
        s.start_transaction()
        db.a.insert_one({"_id": 1}, session=s)
        db.b.drop()
        db.a.insert_one({"_id": 2}, session=s)
        s.commit_transaction()
    assert list(db.a.find()) == [{"_id": 0}, {"_id": 1}, {"_id": 2}]


def test_snapshot_read_sees_a_collection_dropped_after_its_time(server, client, db):
    db.b.insert_many([{"_id": 1}, {"_id": 2}])
    with client.start_session(snapshot=True) as s:
        assert list(db.b.find(session=s)) == [{"_id": 1}, {"_id": 2}]  # its time is set
        db.b.drop()
        assert list(db.b.find(session=s)) == [{"_id": 1}, {"_id": 2}]
        assert db.b.distinct("_id", session=s) == [1, 2]
    assert list(db.b.find()) == []
