"""Translated from mongodb/mongo
`jstests/change_streams/change_streams_dynamic_match_expressions.js` @
0d8469427f7ba27d9bd343d50293b0bb56cb40c2: $match (plain and $expr) on fields and values with
characters that mean something inside strings and field paths, on a collection whose name has
them too."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

COLL = "booooo '\"bar baz]]]}}}}{{{{{{{{{{{{{{{{{{{{{{{{{"
NS = {"db": "test", "coll": COLL}
VALUE = "fx {{{\"'x\\"
SUB = "fx {{{\"'x"


def _insert(doc: dict) -> dict[str, Any]:
    return {"operationType": "insert", "fullDocument": doc, "ns": NS,
            "documentKey": {"_id": doc["_id"]}}


CASES: list[Any] = [
    ("no match", [{"_id": "one", "value": 1}, {"_id": {"sub": "two"}, "value": 2}], [],
     [_insert({"_id": "one", "value": 1}), _insert({"_id": {"sub": "two"}, "value": 2})]),
    ("_id value", [{"_id": VALUE}], [{"$match": {"fullDocument._id": VALUE}}],
     [_insert({"_id": VALUE})]),
    ("_id subfield", [{"_id": {SUB: "x"}}], [{"$match": {"fullDocument._id." + SUB: "x"}}],
     [_insert({"_id": {SUB: "x"}})]),
    ("$expr _id object", [{"_id": {SUB: "x"}}],
     [{"$match": {"$expr": {"$eq": ["$fullDocument._id", {SUB: "x"}]}}}],
     [_insert({"_id": {SUB: "x"}})]),
    ("$expr _id subfield", [{"_id": {SUB: "x"}}],
     [{"$match": {"$expr": {"$eq": ["$fullDocument._id." + SUB, "x"]}}}],
     [_insert({"_id": {SUB: "x"}})]),
    ("$expr object", [{"_id": "z", SUB: "y"}], [{"$match": {"$expr": {SUB: "y"}}}],
     [_insert({"_id": "z", SUB: "y"})]),
    ("$expr $not documentKey", [{"_id": {SUB: "x"}}],
     [{"$match": {"$expr": {"$not": {"$eq": ["$documentKey." + SUB, "x"]}}}}],
     [_insert({"_id": {SUB: "x"}})]),
    ("$expr $lte documentKey", [{"_id": {SUB: "x"}}],
     [{"$match": {"$expr": {"$lte": ["$documentKey." + SUB, "a"]}}}],
     [_insert({"_id": {SUB: "x"}})]),
    ("1K braces", [{"_id": {SUB: "x"}}],
     [{"$match": {"$expr": {"$not": {"$eq": ["$documentKey." + "{" * 1024, "x"]}}}}], []),
]


@pytest.mark.parametrize(("name", "inserts", "stages", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_dynamic_match(client: Any, name: str, inserts: list, stages: list, expected: list
                       ) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}, *stages], COLL)
    assert len(cursor["firstBatch"]) == 0, cursor
    db[COLL].insert_many([dict(d) for d in inserts])
    cst.assert_next_changes_equal(cursor, expected)
    cst.clean_up()
