"""Translated from mongodb/mongo `jstests/change_streams/events_containing_version_literals.js`
@ 12947f43573c49c528786519688f91c3ba7bac43: documents with a `$v` field (the oplog's update
version field name) make correct events; updates that would write `$v` the wrong way fail
with the codes mongod gives. One case per block of the jstest, each after its `setUp()`."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

COLL = "events_containing_version_literals"
VALUES = ["test", 1, 2, "1", "2"]
FAILED_TO_PARSE, DOLLAR_PREFIXED, TYPE_MISMATCH = 9, 52, 14


def _event(op: str, _id: Any, v: Any) -> dict[str, Any]:
    return {"documentKey": {"_id": _id}, "fullDocument": {"_id": _id, "$v": v},
            "ns": {"db": "test", "coll": COLL}, "operationType": op}


class Setup:
    """`setUp()`: a fresh collection, a stream, 5 documents with `$v` and their events."""

    def __init__(self, client: Any) -> None:
        self.db = client["test"]
        self.db.drop_collection(COLL)
        self.db.create_collection(COLL)
        self.cst = ChangeStreamTest(self.db)
        self.cursor = self.cst.start_watching_changes([{"$changeStream": {}}], COLL)
        for i, v in enumerate([1, 2, "1", "2", "test"]):
            self.db.command({"insert": COLL, "documents": [{"_id": i, "$v": v}]})
            self.cst.assert_next_changes_equal(self.cursor, [_event("insert", i, v)])

    def update(self, q: dict, u: Any, upsert: bool = False) -> dict[str, Any]:
        return self.db.command({"update": COLL, "updates": [{"q": q, "u": u, "upsert": upsert}]})

    def fails(self, codes: tuple[int, ...], q: dict, u: Any, upsert: bool = False) -> None:
        reply = self.update(q, u, upsert)
        errors = reply.get("writeErrors", [])
        assert errors and errors[0]["code"] in codes, reply

    def works(self, q: dict, u: Any, expected: dict, upsert: bool = False) -> None:
        reply = self.update(q, u, upsert)
        assert not reply.get("writeErrors"), reply
        self.cst.assert_next_changes_equal(self.cursor, [expected])


def test_object_literal_fails(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.fails((FAILED_TO_PARSE,), {"_id": i}, {"$v": v})


def test_object_literal_upsert_fails(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.fails((FAILED_TO_PARSE,), {"_id": i + 10}, {"$v": v}, upsert=True)


def test_set_fails(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.fails((DOLLAR_PREFIXED,), {"_id": i}, {"$set": {"$v": v}})


def test_set_upsert_inserts(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.works({"_id": i + 10}, {"$set": {"$v": v}}, _event("insert", i + 10, v), upsert=True)


def test_replace_with_literal(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.works({"_id": i}, [{"$replaceWith": {"$literal": {"_id": i, "$v": v}}}],
                _event("replace", i, v))


def test_replace_with_object_literal_fails(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.fails((16410,), {"_id": i}, [{"$replaceWith": {"_id": i, "$v": v}}])


def test_replace_root_literal(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.works({"_id": i}, [{"$replaceRoot": {"newRoot": {"$literal": {"_id": i, "$v": v}}}}],
                _event("replace", i, v))


def test_replace_root_object_literal_fails(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.fails((16410,), {"_id": i}, [{"$replaceRoot": {"newRoot": {"_id": i, "$v": v}}}])


def test_inc_fails(client: Any) -> None:
    s = Setup(client)
    for i, _ in enumerate(VALUES):
        s.fails((DOLLAR_PREFIXED, TYPE_MISMATCH), {"_id": i}, {"$inc": {"$v": 1}})


def test_add_fields_fails(client: Any) -> None:
    s = Setup(client)
    for i, _ in enumerate(VALUES):
        s.fails((16410,), {"_id": i}, [{"$addFields": {"$v": i}}])


def test_replace_with_set_field(client: Any) -> None:
    s = Setup(client)
    for i, v in enumerate(VALUES):
        s.works({"_id": i}, [{"$replaceWith": {"$setField": {
            "field": {"$literal": "$v"}, "input": "$$ROOT", "value": v}}}],
                _event("replace", i, v))
