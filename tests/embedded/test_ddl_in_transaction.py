"""DDL inside a multi-document transaction, as mongod 8.0 isolates it: a collection created in a
transaction (`create`, an insert or upsert into a missing collection, `createIndexes` on one)
and the indexes it builds there are the transaction's own until it commits (mongod's
UncommittedCatalogUpdates): other sessions neither list nor read them, an abort leaves nothing,
and the commit logs them in its `applyOps`, so change streams report them with the
transaction's other events. A name taken meanwhile by a committed collection makes the commit
a 112 WriteConflict (jstests/core/txns/create_collection_parallel.js,
create_indexes_parallel.js, and the transactions spec's unified create-collection.json /
create-index.json).
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import errors
from pymongo.read_concern import ReadConcern

from tests.support.embedded_support import EmbeddedServer, database_for_test


@pytest.fixture
def other(server):
    """A second client: another session's view of the server."""
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def db(client, request):
    return database_for_test(client, request)


def _index_names(coll: Any) -> list[str]:
    return [i["name"] for i in coll.list_indexes()]


# The ways a transaction creates a collection (jstests/libs/create_collection_txn_helpers.js).
_CREATES = {
    "create": lambda db, s: db.create_collection("made", session=s),
    "insert": lambda db, s: db.made.insert_one({"_id": 1}, session=s),
    "upsert": lambda db, s: db.made.update_one({"_id": 1}, {"$set": {"a": 1}}, upsert=True,
                                               session=s),
    "findAndModify": lambda db, s: db.made.find_one_and_update(
        {"_id": 1}, {"$set": {"a": 1}}, upsert=True, session=s),
    "createIndexes": lambda db, s: db.made.create_index("a", session=s),
}


@pytest.mark.parametrize("how", list(_CREATES))
def test_created_collection_is_invisible_until_commit(client, other, db, how):
    theirs = other[db.name]
    with client.start_session() as s:
        s.start_transaction()
        _CREATES[how](db, s)
        # another session: no collection, no database, no documents, no indexes
        assert "made" not in theirs.list_collection_names()
        assert db.name not in other.list_database_names()
        assert theirs.made.find_one() is None
        assert _index_names(theirs.made) == []
        assert theirs.command("count", "made")["n"] == 0
        # the transaction itself sees what it created
        assert db.made.count_documents({}, session=s) == (0 if how in ("create",
                                                                        "createIndexes") else 1)
        s.commit_transaction()
    assert "made" in theirs.list_collection_names()
    assert db.name in other.list_database_names()
    expected = ["_id_", "a_1"] if how == "createIndexes" else ["_id_"]
    assert _index_names(theirs.made) == expected


def test_index_on_a_collection_created_in_the_same_transaction(client, other, db):
    theirs = other[db.name]
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("made", session=s)
        reply = db.command("createIndexes", "made", indexes=[{"key": {"x": 1}, "name": "t_1"}],
                           session=s)
        assert reply["createdCollectionAutomatically"] is True
        db.made.insert_one({"_id": 1, "x": 1}, session=s)
        assert db.made.find_one({"x": 1}, session=s) == {"_id": 1, "x": 1}
        assert "t_1" not in _index_names(theirs.made)
        s.commit_transaction()
    assert _index_names(theirs.made) == ["_id_", "t_1"]
    assert list(theirs.made.find()) == [{"_id": 1, "x": 1}]


@pytest.mark.parametrize("how", list(_CREATES))
def test_abort_leaves_nothing(server, client, other, db, how):
    start = len(server.entries())
    with client.start_session() as s:
        s.start_transaction()
        _CREATES[how](db, s)
        s.abort_transaction()
    assert server.entries()[start:] == []
    assert "made" not in other[db.name].list_collection_names()
    db.made.insert_one({"_id": 5})  # the name is free: a new collection, without the index
    assert _index_names(db.made) == ["_id_"]


def test_commit_logs_the_ddl_in_its_apply_ops_and_streams_it_then(server, client, db):
    with db.watch(show_expanded_events=True, max_await_time_ms=50) as stream:
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("made", session=s)
            db.made.create_index("x", session=s)
            db.made.insert_one({"_id": 1}, session=s)
            db.marker.insert_one({"_id": "outside"})  # committed while the transaction is open
            s.commit_transaction()
        events = []
        while len(events) < 5:
            event = stream.try_next()
            if event is not None:
                events.append(event)
    assert [(e["operationType"], e["ns"].get("coll")) for e in events] == [
        ("create", "marker"), ("insert", "marker"),  # before the commit
        ("create", "made"), ("createIndexes", "made"), ("insert", "made"),  # the commit
    ]
    create, indexes, insert = events[2:]
    assert indexes["operationDescription"] == {
        "indexes": [{"v": 2, "key": {"x": 1}, "name": "x_1"}]
    }
    for e in (create, indexes, insert):
        assert e["lsid"] == insert["lsid"] and e["txnNumber"] == insert["txnNumber"]
        assert e["clusterTime"] == insert["clusterTime"]
        assert e["collectionUUID"] == insert["collectionUUID"]
    entry = server.entries()[-1]
    assert [(op["op"], next(iter(op["o"]))) for op in entry["o"]["applyOps"]] == [
        ("c", "create"), ("c", "createIndexes"), ("i", "_id"),
    ]


def _commit_conflicts(s: Any, ns: str) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        s.commit_transaction()
    details = info.value.details
    assert (details["code"], details["codeName"]) == (112, "WriteConflict")
    assert details["errmsg"] == (
        f"Caused by :: Collection namespace '{ns}' is already in use. :: Please retry your "
        "operation or multi-document transaction."
    )
    assert details["errorLabels"] == ["TransientTransactionError"]


def test_outside_create_meanwhile_makes_the_commit_conflict(server, client, db):
    start = len(server.entries())
    with client.start_session() as s:
        s.start_transaction()
        db.made.insert_one({"_id": 1}, session=s)
        db.create_collection("made")  # not blocked by the transaction
        db.made.insert_one({"_id": "outside"})
        _commit_conflicts(s, f"{db.name}.made")
        with pytest.raises(errors.OperationFailure) as info:  # a retried commit: it was aborted
            s.commit_transaction()
        assert (info.value.code, info.value.details["codeName"]) == (251, "NoSuchTransaction")
    assert list(db.made.find()) == [{"_id": "outside"}]
    # nothing of the transaction in the oplog: only the outside create and insert
    assert [e["op"] for e in server.entries()[start:]] == ["c", "i"]


def test_first_of_two_transactions_creating_a_collection_wins(client, db):
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        db.create_collection("made", session=s2)
        db.made.insert_one({"_id": 2}, session=s2)
        db.made.insert_one({"_id": 1}, session=s1)  # neither sees the other's collection
        s2.commit_transaction()
        _commit_conflicts(s1, f"{db.name}.made")
    assert list(db.made.find()) == [{"_id": 2}]


def test_a_transaction_does_not_see_a_collection_created_after_its_snapshot(client, db):
    # create_collection_parallel.js: "create cannot observe the collection created in the
    # other transaction so the command will succeed and we will instead throw WCE when
    # trying to commit the transaction"
    db.before.insert_one({"_id": 0})
    with client.start_session() as s:
        s.start_transaction()
        assert db.before.find_one(session=s) == {"_id": 0}  # its snapshot is taken
        db.made.insert_one({"_id": "outside"})
        assert db.made.find_one(session=s) is None
        db.create_collection("made", session=s)
        _commit_conflicts(s, f"{db.name}.made")
    assert list(db.made.find()) == [{"_id": "outside"}]


def test_create_of_a_collection_committed_before_the_transaction_is_namespace_exists(
    client, db
):
    with client.start_session() as s1:
        s1.start_transaction()
        db.create_collection("made", session=s1)
        s1.commit_transaction()
    with client.start_session() as s2:
        s2.start_transaction()
        with pytest.raises(errors.OperationFailure) as info:
            db.create_collection("made", session=s2)
        assert (info.value.code, info.value.details["codeName"]) == (48, "NamespaceExists")
        with pytest.raises(errors.OperationFailure) as info:
            s2.commit_transaction()
        assert info.value.code == 251


def test_ddl_in_a_transaction_is_durable_at_commit_only(tmp_path):
    server = EmbeddedServer(tmp_path, transaction_lifetime_limit_seconds=60)
    try:
        client = server.client()
        db = client.t
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("kept", session=s)
            db.kept.create_index("x", session=s)
            db.kept.insert_one({"_id": 1, "x": 1}, session=s)
            s.commit_transaction()
        with client.start_session() as s:
            s.start_transaction()
            db.create_collection("aborted", session=s)
            db.aborted.insert_one({"_id": 1}, session=s)
            s.abort_transaction()
        open_session = client.start_session()
        open_session.start_transaction()
        db.open.insert_one({"_id": 1}, session=open_session)  # never committed
        client.close()
    finally:
        server.stop()
    server = EmbeddedServer(tmp_path)
    try:
        client = server.client()
        db = client.t
        assert db.list_collection_names() == ["kept"]
        assert _index_names(db.kept) == ["_id_", "x_1"]
        assert list(db.kept.find()) == [{"_id": 1, "x": 1}]
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("level", ["snapshot", "majority"])
@pytest.mark.parametrize("command", ["create", "createIndexes"])
@pytest.mark.parametrize("first", [True, False])
def test_ddl_needs_read_concern_local(client, db, level, command, first):
    # jstests/core/txns/commands_in_txns_read_concern.js: InvalidOptions, the transaction
    # aborted, whether the DDL is its first command (which carries the readConcern) or not
    db.other.insert_one({"_id": 0})
    cmd: dict[str, Any] = (
        {"create": "made"} if command == "create"
        else {"createIndexes": "made", "indexes": [{"key": {"a": 1}, "name": "a_1"}]}
    )
    with client.start_session() as s:
        s.start_transaction(read_concern=ReadConcern(level))
        if not first:
            assert db.other.find_one(session=s) == {"_id": 0}
        with pytest.raises(errors.OperationFailure) as info:
            db.command(cmd, session=s)
        assert (info.value.code, info.value.details["codeName"]) == (72, "InvalidOptions")
        assert info.value.details["errmsg"] == (
            f'Command {command} does not support {{ readConcern: {{ level: "{level}", '
            'provenance: "clientSupplied" } } :: caused by :: read concern not supported'
        )
        with pytest.raises(errors.OperationFailure) as info:
            s.commit_transaction()
        assert info.value.code == 251
    assert "made" not in db.list_collection_names()


def test_ddl_with_read_concern_local(client, db):
    with client.start_session() as s:
        s.start_transaction(read_concern=ReadConcern("local"))
        db.create_collection("made", session=s)
        db.made.create_index("a", session=s)
        s.commit_transaction()
    assert _index_names(db.made) == ["_id_", "a_1"]


def test_a_snapshot_read_does_not_see_a_collection_created_after_its_time(client, db):
    # mongod reads the catalog at the snapshot's timestamp: the collection did not exist then
    db.before.insert_one({"_id": 0})
    with client.start_session(snapshot=True) as s:
        assert db.before.find_one(session=s) == {"_id": 0}  # the snapshot's time is set
        db.made.insert_one({"_id": 1})
        assert list(db.made.find(session=s)) == []
    assert list(db.made.find()) == [{"_id": 1}]


def test_create_indexes_racing_another_transaction_conflicts_at_commit(client, db):
    # create_indexes_parallel.js: "createIndexes cannot observe the index created in the other
    # transaction so the command will succeed and we will instead throw WCE when trying to
    # commit the transaction"; the first transaction's other collection is rolled back too
    with client.start_session() as s1, client.start_session() as s2:
        s1.start_transaction()
        s2.start_transaction()
        db.distinct.create_index("a", session=s1)
        db.made.create_index("a", session=s2)
        db.made.insert_one({"_id": 1}, session=s2)
        s2.commit_transaction()
        reply = db.command("createIndexes", "made",
                           indexes=[{"key": {"a": -1}, "name": "a_1"}], session=s1)
        assert reply["createdCollectionAutomatically"] is True
        _commit_conflicts(s1, f"{db.name}.made")
    assert _index_names(db.made) == ["_id_", "a_1"]
    assert [i["key"] for i in db.made.list_indexes()] == [{"_id": 1}, {"a": 1}]
    assert "distinct" not in db.list_collection_names()
