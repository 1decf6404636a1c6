"""Translated from mongodb/mongo `jstests/change_streams/ddl_create_drop_index_events.js` @
1e98a0f23d62eb1f149658d190f0285879d91db5: createIndexes and dropIndexes events
(showExpandedEvents) with various index options, for whole-db and collection streams, on an
empty and on a non-empty collection. (The columnstore case runs only where
`safeToCreateColumnStoreIndex` holds; mongod 8.0 has no columnstore indexes, so it is skipped
there as here.)"""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

DB = "ddl_create_drop_index_events"
COLL = "ddl_create_drop_index_events"
NS = {"db": DB, "coll": COLL}
PIPELINE = [{"$changeStream": {"showExpandedEvents": True}}]
COLLATION = {
    "locale": "en_US", "caseLevel": False, "caseFirst": "off", "strength": 3,
    "numericOrdering": False, "alternate": "non-ignorable", "maxVariable": "punct",
    "normalization": False, "backwards": False, "version": "57.1",
}
# (name, key, options, the key the event shows (None: `key`), dropIndexes argument (None: name))
INDEX_CASES: list[tuple[str, dict, dict, dict | None, str | None]] = [
    ("options", {"a": 1}, {"hidden": True, "partialFilterExpression": {"a": {"$gte": 0}},
                           "expireAfterSeconds": 86400, "storageEngine": {"wiredTiger": {}}},
     None, None),
    ("collation, drop *", {"e": 1}, {"collation": COLLATION}, {"e": 1}, "*"),
    ("wildcard", {"$**": 1}, {"name": "wi", "wildcardProjection": {"a": True, "b": True,
                                                                  "_id": False}}, None, None),
    ("text", {"e": "text"}, {"name": "text", "weights": {"e": 1}, "default_language": "english",
                             "language_override": "language", "textIndexVersion": 3},
     {"_fts": "text", "_ftsx": 1}, None),
    ("2d", {"f": "2d"}, {"name": "2d", "min": -150.0, "max": 150.0, "bits": 26}, None, None),
    ("2dsphere", {"f": "2dsphere"}, {"name": "2dsphere", "2dsphereIndexVersion": 3}, None, None),
]
RUNS = [("whole db", False), ("collection", False), ("whole db", True), ("collection", True)]
RUN_IDS = ["whole db-empty", "collection-empty", "whole db-non-empty", "collection-non-empty"]


def _setup(client: Any, watch: str, insert_data: bool) -> tuple[Any, ChangeStreamTest, Any]:
    db = client[DB]
    cst = ChangeStreamTest(db)
    db.command({"create": COLL})
    if insert_data:
        db[COLL].insert_one({"a": 1, "b": "j", "c": "k", "d": "l", "e": "m", "f": [55.5, 42.3]})
    return db, cst, lambda: cst.start_watching_changes(PIPELINE, 1 if watch == "whole db" else COLL)


def _default_name(key: dict) -> str:
    return "_".join(f"{k}_{v}" for k, v in key.items())


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("case", INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_create_and_drop_index(client: Any, run: tuple, case: tuple) -> None:
    db, cst, start = _setup(client, *run)
    _, key, options, op_desc_key, drop_key = case
    if "name" in options:
        name = options["name"]
        drop_key = name
    else:
        name = _default_name(key)
    if drop_key is None:
        drop_key = name
    cursor = start()
    op_desc = {"indexes": [{"v": 2, "key": op_desc_key or key, "name": name, **options}]}
    db[COLL].create_index(list(key.items()), **options)
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "createIndexes", "ns": NS, "operationDescription": op_desc}
    ])
    db.command({"dropIndexes": COLL, "index": [drop_key]})
    cst.assert_next_changes_equal(cursor, [
        {"operationType": "dropIndexes", "ns": NS, "operationDescription": op_desc}
    ])
    db[COLL].drop()


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_create_indexes_two_sparse(client: Any, run: tuple) -> None:
    db, cst, start = _setup(client, *run)
    insert_data = run[1]
    cursor = start()
    desc1 = {"indexes": [{"v": 2, "key": {"b": 1, "c": -1}, "name": "b_1_c_-1", "sparse": True}]}
    desc2 = {"indexes": [{"v": 2, "key": {"d": "hashed"}, "name": "d_hashed", "sparse": True}]}
    db.command({"createIndexes": COLL, "indexes": [
        {"key": {"b": 1, "c": -1}, "name": "b_1_c_-1", "sparse": True},
        {"key": {"d": "hashed"}, "name": "d_hashed", "sparse": True},
    ]})
    if not insert_data:
        # An empty collection: one event per index.
        cst.assert_next_changes_equal_unordered(cursor, [
            {"operationType": "createIndexes", "ns": NS, "operationDescription": desc1},
            {"operationType": "createIndexes", "ns": NS, "operationDescription": desc2},
        ])
    else:
        # A non-empty collection: a single event covering both indexes.
        cst.assert_next_changes_equal(cursor, [{
            "operationType": "createIndexes", "ns": NS,
            "operationDescription": {"indexes": [desc1["indexes"][0], desc2["indexes"][0]]},
        }])
    db.command({"dropIndexes": COLL, "index": ["b_1_c_-1", "d_hashed"]})
    cst.assert_next_changes_equal_unordered(cursor, [
        {"operationType": "dropIndexes", "ns": NS, "operationDescription": desc1},
        {"operationType": "dropIndexes", "ns": NS, "operationDescription": desc2},
    ])
    db[COLL].drop()
