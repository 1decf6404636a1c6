"""Translated from mongodb/mongo
`jstests/change_streams/change_streams_namespace_match_expressions.js` @
0c878b35f456229d7d1fbf47347d895c99d1a2fc: $match on `ns`, `ns.db` and `ns.coll` by string and
by regular expression, with database and collection names full of regex metacharacters.
(`RegExp.escape` is `re.escape` here: both escape every metacharacter, PCRE reads the rest as
literals.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from bson.regex import Regex
from cst import ChangeStreamTest

DB = "change_streams_namespace_match_expressions]]][}}{{{{{{{{"
COLL = "booooo '\"bar baz]]][}}}}\\{{{{{{{{{{{{{{{{{{{{{{{{{"
OTHER = "other '\"]]]]"
NS = {"db": DB, "coll": COLL}
NS_OTHER = {"db": DB, "coll": OTHER}
INSERT = {"operationType": "insert", "fullDocument": {"_id": "test"}, "ns": NS,
          "documentKey": {"_id": "test"}}
DELETE = {"operationType": "delete", "ns": NS, "documentKey": {"_id": "test"}}
INSERT_OTHER = {**INSERT, "ns": NS_OTHER}
DELETE_OTHER = {**DELETE, "ns": NS_OTHER}
UPDATE = {"operationType": "update", "ns": NS, "documentKey": {"_id": "test"},
          "updateDescription": {"updatedFields": {"updated": True}, "removedFields": [],
                                "truncatedArrays": []}}


def _insert_delete(db: Any) -> None:
    db[COLL].insert_one({"_id": "test"})
    db[COLL].delete_one({"_id": "test"})


def _insert_update_delete(db: Any) -> None:
    db[COLL].insert_one({"_id": "test"})
    db[COLL].update_one({"_id": "test"}, {"$set": {"updated": True}})
    db[COLL].delete_one({"_id": "test"})


def _both(db: Any) -> None:
    db[COLL].insert_one({"_id": "test"})
    db[OTHER].insert_one({"_id": "test"})
    db[COLL].delete_one({"_id": "test"})
    db[OTHER].delete_one({"_id": "test"})


E = re.escape
CASES: list[tuple[str, Any, Callable[[Any], None], dict, list[dict]]] = [
    ("ns literal", COLL, _insert_update_delete, {"ns": {"db": DB, "coll": COLL}},
     [INSERT, UPDATE, DELETE]),
    ("ns.db literal", COLL, _insert_delete, {"ns.db": DB}, [INSERT, DELETE]),
    ("ns.db regex", COLL, _insert_delete, {"ns.db": Regex(E(DB))}, [INSERT, DELETE]),
    ("ns.db regex class", COLL, _insert_delete, {"ns.db": Regex(E(DB) + "[^'\"\\\\ {}]*")},
     [INSERT, DELETE]),
    ("ns.coll literal", COLL, _insert_delete, {"ns.coll": COLL}, [INSERT, DELETE]),
    ("ns.coll regex", COLL, _both, {"ns.coll": Regex(E(COLL))}, [INSERT, DELETE]),
    ("ns.coll anchored regex", COLL, _both, {"ns.coll": Regex("^" + E(COLL) + "[a-zA-Z]*")},
     [INSERT, DELETE]),
    ("ns.coll regex class", COLL, _both, {"ns.coll": Regex(E(COLL) + "[^'\"\\\\ {}]*")},
     [INSERT, DELETE]),
    ("ns.coll alternation", 1, _both,
     {"ns.coll": Regex("^(" + E(COLL) + "|" + E(OTHER) + ")$")},
     [INSERT, INSERT_OTHER, DELETE, DELETE_OTHER]),
    ("ns.coll $in regexes", 1, _both,
     {"ns.coll": {"$in": [Regex("^" + E(COLL) + "$"), Regex("^" + E(OTHER) + "$")]}},
     [INSERT, INSERT_OTHER, DELETE, DELETE_OTHER]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_namespace_match(client: Any, case: tuple) -> None:
    _, collection, operations, match, expected = case
    db = client[DB]
    for name in (COLL, OTHER):
        db.drop_collection(name)
        db.create_collection(name)
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}, {"$match": match}], collection)
    assert len(cursor["firstBatch"]) == 0, cursor
    operations(db)
    cst.assert_next_changes_equal(cursor, expected)
    cst.clean_up()
    client.drop_database(DB)
