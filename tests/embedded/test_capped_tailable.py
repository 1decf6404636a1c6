"""Capped collections (max / size enforced on insert, oldest first) and tailable cursors on
them, through pymongo against the embedded store."""

from __future__ import annotations

import threading

import pytest
from pymongo import CursorType
from pymongo.errors import OperationFailure


def test_max_keeps_the_newest_documents(client) -> None:
    db = client.capped_db
    db.drop_collection("by_count")
    coll = db.create_collection("by_count", capped=True, size=100000, max=3)
    coll.insert_many([{"_id": i} for i in range(5)])
    assert [d["_id"] for d in coll.find()] == [2, 3, 4]
    info = db.command("collStats", "by_count")
    assert (info["capped"], info["max"], info["count"]) == (True, 3, 3)
    options = next(db.list_collections(filter={"name": "by_count"}))["options"]
    assert options["capped"] is True and options["max"] == 3


def test_size_keeps_what_fits(client) -> None:
    db = client.capped_db
    db.drop_collection("by_size")
    coll = db.create_collection("by_size", capped=True, size=1024)
    filler = "x" * 200
    coll.insert_many([{"_id": i, "s": filler} for i in range(20)])
    ids = [d["_id"] for d in coll.find()]
    assert ids == list(range(20 - len(ids), 20))  # the newest, in insertion order
    assert sum(len(str(d)) for d in coll.find()) < 20 * 200
    assert db.command("collStats", "by_size")["size"] <= 1024


def test_capped_deletes_are_change_stream_deletes(client) -> None:
    db = client.capped_db
    db.drop_collection("events")
    coll = db.create_collection("events", capped=True, size=100000, max=1)
    with coll.watch() as stream:
        coll.insert_one({"_id": 1})
        coll.insert_one({"_id": 2})
        kinds = [(stream.next()["operationType"]) for _ in range(3)]
    assert kinds == ["insert", "insert", "delete"]


def test_tailable_follows_new_documents_and_dies_when_capped_past(client) -> None:
    db = client.capped_db
    db.drop_collection("tail")
    coll = db.create_collection("tail", capped=True, size=1000, max=3)
    coll.insert_one({"x": 1})
    session = client.start_session()  # the cursor's: a getMore in another is refused (50738)
    cursor = coll.find(cursor_type=CursorType.TAILABLE, session=session)
    assert [d["x"] for d in cursor] == [1]
    assert cursor.alive
    coll.insert_one({"x": 2})
    assert [d["x"] for d in cursor] == [2]
    coll.insert_many([{"x": i} for i in range(3, 7)])  # x: 2 (its position) capped away
    with pytest.raises(OperationFailure) as failure:
        coll.database.command("getMore", cursor.cursor_id, collection="tail", session=session)
    session.end_session()
    assert failure.value.code == 136
    assert "position in capped collection being deleted" in str(failure.value)


def test_tailable_on_an_empty_capped_collection_is_not_kept(client) -> None:
    db = client.capped_db
    db.drop_collection("empty")
    db.create_collection("empty", capped=True, size=1000)
    reply = db.command("find", "empty", tailable=True)
    assert reply["cursor"]["id"] == 0 and reply["cursor"]["firstBatch"] == []


def test_tailable_on_a_collection_not_capped(client) -> None:
    db = client.capped_db
    db.drop_collection("plain")
    db.plain.insert_one({})
    with pytest.raises(OperationFailure) as failure:
        db.command("find", "plain", tailable=True)
    assert failure.value.code == 2
    assert "tailable cursor requested on non capped collection" in str(failure.value)


def test_await_data_returns_a_document_inserted_while_waiting(client) -> None:
    db = client.capped_db
    db.drop_collection("await")
    coll = db.create_collection("await", capped=True, size=10000)
    coll.insert_one({"x": 0})
    session = client.start_session()  # the cursor's, for its getMores (50738 in another)
    reply = db.command("find", "await", tailable=True, awaitData=True, session=session)
    cid = reply["cursor"]["id"]
    assert cid != 0
    inserter = threading.Timer(0.2, lambda: coll.insert_one({"x": 1}))
    inserter.start()
    try:
        # The wait is long enough that only the insert can end it with a document.
        more = db.command("getMore", cid, collection="await", maxTimeMS=30000, session=session)
    finally:
        inserter.join()
    assert [d["x"] for d in more["cursor"]["nextBatch"]] == [1]
    assert more["cursor"]["id"] == cid
    empty = db.command("getMore", cid, collection="await", maxTimeMS=10, session=session)
    session.end_session()
    assert empty["cursor"]["nextBatch"] == [] and empty["cursor"]["id"] == cid


def test_tailable_cursor_of_a_dropped_collection_is_killed(client) -> None:
    db = client.capped_db
    db.drop_collection("dropped")
    coll = db.create_collection("dropped", capped=True, size=1000)
    coll.insert_one({"x": 1})
    reply = db.command("find", "dropped", tailable=True)
    cid = reply["cursor"]["id"]
    db.drop_collection("dropped")
    with pytest.raises(OperationFailure) as failure:
        db.command("getMore", cid, collection="dropped")
    assert failure.value.code == 175
    assert str(failure.value).startswith("collection dropped. UUID ")


def test_a_document_larger_than_the_capped_size_is_refused(client) -> None:
    db = client.capped_db
    db.drop_collection("small")
    coll = db.create_collection("small", capped=True, size=256)
    coll.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as failure:
        coll.insert_one({"_id": 2, "s": "x" * 400})
    assert failure.value.code == 2
    assert "object to insert exceeds cappedMaxSize" in str(failure.value)
    assert [d["_id"] for d in coll.find()] == [1]
