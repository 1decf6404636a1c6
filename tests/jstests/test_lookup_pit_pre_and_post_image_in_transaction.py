"""Translated from mongodb/mongo
`jstests/change_streams/lookup_pit_pre_and_post_image_in_transaction.js` @
0c82c0cfa3525721cf2269271b6978df85882bf8: point-in-time pre- and post-images of updates,
replacements and deletes made in a transaction, logged as one applyOps entry or as several
(15 MiB inserts into another collection between them; a 7 MiB pre-image).

One case: the script up to its last step, the `applyOps` command (cdcserver has no applyOps
command; the step is listed in README.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cst import ChangeStreamTest
from pymongo import WriteConcern
from pymongo.read_concern import ReadConcern

DB = "lookup_pit_pre_and_post_image_in_transaction"


def test_lookup_pit_pre_and_post_image_in_transaction(client: Any) -> None:
    db = client[DB]
    for name in ("coll", "coll_regular"):
        db.drop_collection(name)
    db.create_collection("coll", changeStreamPreAndPostImages={"enabled": True})
    db.create_collection("coll_regular")
    coll, other = db["coll"], db["coll_regular"]
    cst = ChangeStreamTest(db)

    def assert_events(cursor: Any, expected: list[dict[str, Any]]) -> None:
        events = []
        for e in expected:
            event: dict[str, Any] = {"documentKey": {"_id": e["_id"]},
                                     "ns": {"db": DB, "coll": "coll"},
                                     "operationType": e["op"]}
            if e.get("pre") is not None:
                event["fullDocumentBeforeChange"] = e["pre"]
            if e.get("post") is not None:
                event["fullDocument"] = e["post"]
            events.append(event)
        cst.assert_next_changes_equal_unordered(cursor, events)

    def in_transaction(body: Callable[[Any], None]) -> None:
        with client.start_session(causal_consistency=False) as session:
            with session.start_transaction(read_concern=ReadConcern("snapshot"),
                                           write_concern=WriteConcern(w="majority")):
                body(session)

    coll.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 1}, {"_id": 3, "a": 1}])
    cursor = cst.start_watching_changes([{"$changeStream": {
        "fullDocumentBeforeChange": "whenAvailable", "fullDocument": "whenAvailable"}}], "coll")

    # A transaction logged as one applyOps entry.
    def single(s: Any) -> None:
        coll.update_one({"_id": 1}, {"$inc": {"a": 1}}, session=s)
        coll.replace_one({"_id": 2}, {"a": "Long string"}, session=s)
        coll.delete_one({"_id": 3}, session=s)

    in_transaction(single)
    assert_events(cursor, [
        {"_id": 1, "op": "update", "pre": {"_id": 1, "a": 1}, "post": {"_id": 1, "a": 2}},
        {"_id": 2, "op": "replace", "pre": {"_id": 2, "a": 1},
         "post": {"_id": 2, "a": "Long string"}},
        {"_id": 3, "op": "delete", "pre": {"_id": 3, "a": 1}},
    ])

    # A transaction logged as several applyOps entries.
    large = "b" * (15 * 1024 * 1024)
    coll.insert_many([{"_id": 3, "a": 1}])

    def multiple(s: Any) -> None:
        other.insert_one({"b": large}, session=s)
        coll.update_one({"_id": 1}, {"$inc": {"a": 1}}, session=s)
        other.insert_one({"b": large}, session=s)
        coll.replace_one({"_id": 2}, {"a": 1}, session=s)
        coll.update_one({"_id": 2}, {"$inc": {"a": 1}}, session=s)  # the same document again
        coll.delete_one({"_id": 3}, session=s)
        other.insert_one({"b": large}, session=s)

    in_transaction(multiple)
    assert_events(cursor, [
        {"_id": 3, "op": "insert", "post": {"_id": 3, "a": 1}},
        {"_id": 1, "op": "update", "pre": {"_id": 1, "a": 2}, "post": {"_id": 1, "a": 3}},
        {"_id": 2, "op": "replace", "pre": {"_id": 2, "a": "Long string"},
         "post": {"_id": 2, "a": 1}},
        {"_id": 2, "op": "update", "pre": {"_id": 2, "a": 1}, "post": {"_id": 2, "a": 2}},
        {"_id": 3, "op": "delete", "pre": {"_id": 3, "a": 1}},
    ])

    # Several applyOps entries with large pre-images.
    value = "c" * (7 * 1024 * 1024)
    coll.insert_many([{"_id": 3, "a": value}])

    def large_pre_images(s: Any) -> None:
        coll.update_one({"_id": 3}, {"$set": {"b": 1}}, session=s)
        coll.delete_one({"_id": 3}, session=s)

    in_transaction(large_pre_images)
    assert_events(cursor, [
        {"_id": 3, "op": "insert", "post": {"_id": 3, "a": value}},
        {"_id": 3, "op": "update", "pre": {"_id": 3, "a": value},
         "post": {"_id": 3, "a": value, "b": 1}},
        {"_id": 3, "op": "delete", "pre": {"_id": 3, "a": value, "b": 1}},
    ])
    cst.clean_up()
