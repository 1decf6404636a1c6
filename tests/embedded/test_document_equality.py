"""Equality on whole embedded documents as mongod compares BSON objects: field by field, in
order (`{x: 1, y: 2}` is not `{y: 2, x: 1}`), in a plain equality, inside arrays, `$eq`,
`$in`, `$ne`, `$nin`, `$elemMatch`, `$match` and `$group` keys; and regexes in `$all`
(issue 27, item 2)."""

from __future__ import annotations

import re

import pytest
from bson import SON
from bson.regex import Regex
from pymongo import MongoClient
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

XY = SON([("x", 1), ("y", 2)])
YX = SON([("y", 2), ("x", 1)])


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.document_equality.c
    collection.insert_many([
        {"_id": 1, "a": YX, "arr": [YX], "nested": {"in": YX}},
        {"_id": 2, "a": XY, "arr": [XY], "nested": {"in": XY}},
    ])
    yield collection
    client.close()


def _ids(coll: Collection, filter_doc: dict) -> list[int]:
    return sorted(d["_id"] for d in coll.find(filter_doc))


def test_equality_compares_fields_in_order(coll: Collection) -> None:
    assert _ids(coll, {"a": XY}) == [2]
    assert _ids(coll, {"a": YX}) == [1]
    assert _ids(coll, {"a": {"$eq": XY}}) == [2]
    assert _ids(coll, {"nested": {"in": XY}}) == [2]
    assert _ids(coll, {"nested.in": YX}) == [1]


def test_equality_inside_arrays(coll: Collection) -> None:
    assert _ids(coll, {"arr": XY}) == [2]  # an element equal to the document
    assert _ids(coll, {"arr": [XY]}) == [2]  # the whole array
    assert _ids(coll, {"arr": {"$elemMatch": {"$eq": YX}}}) == [1]


def test_in_ne_nin(coll: Collection) -> None:
    assert _ids(coll, {"a": {"$in": [XY]}}) == [2]
    assert _ids(coll, {"a": {"$ne": XY}}) == [1]
    assert _ids(coll, {"a": {"$nin": [XY]}}) == [1]
    assert _ids(coll, {"arr": {"$in": [YX]}}) == [1]


def test_aggregate_match_and_group_keys(coll: Collection) -> None:
    assert [d["_id"] for d in coll.aggregate([{"$match": {"a": XY}}])] == [2]
    groups = list(coll.aggregate([{"$group": {"_id": "$a", "n": {"$sum": 1}}}]))
    assert len(groups) == 2  # two different keys
    assert sorted(list(g["_id"]) for g in groups) == [["x", "y"], ["y", "x"]]
    assert all(g["n"] == 1 for g in groups)


def test_all_with_regexes(coll: Collection) -> None:
    coll.insert_many([
        {"_id": 10, "keywords": ["server", "database"]},
        {"_id": 11, "keywords": ["client"]},
        {"_id": 12, "keywords": "observer"},
    ])
    assert _ids(coll, {"keywords": {"$all": [re.compile("ser")]}}) == [10, 12]
    assert _ids(coll, {"keywords": {"$all": [Regex("^da"), "server"]}}) == [10]
    assert _ids(coll, {"keywords": {"$all": [Regex("^da"), "client"]}}) == []



def test_change_stream_match_compares_fields_in_order(coll: Collection) -> None:
    """A change stream's `$match` is the same matcher as find's: an inserted `{a: {y: 2, x: 1}}`
    does not match `{"fullDocument.a": {x: 1, y: 2}}`, as on mongod; nor does a document an
    expression built in that order (`$addFields`), which Python's dict equality took as
    equal to any order."""
    watched = coll.database.watched
    built = {"$addFields": {"b": {"y": "$fullDocument.a.y", "x": "$fullDocument.a.x"}}}
    pipelines = {
        "stored": [{"$match": {"$or": [
            {"fullDocument.a": XY},
            {"fullDocument.arr": {"$elemMatch": {"$eq": XY}}},
            {"fullDocument.nested.in": {"$in": [XY]}},
        ]}}],
        "built_xy": [built, {"$match": {"b": XY}}],
        "built_yx": [built, {"$match": {"b": YX}}],
        "built_in": [built, {"$match": {"b": {"$in": [XY]}}}],
    }
    streams = {name: watched.watch(p, max_await_time_ms=100) for name, p in pipelines.items()}
    try:
        watched.insert_many([
            {"_id": 1, "a": YX},
            {"_id": 2, "arr": [YX]},
            {"_id": 3, "nested": {"in": YX}},
            {"_id": 4, "a": XY},
            {"_id": 5, "arr": [XY]},
            {"_id": 6, "nested": {"in": XY}},
        ])
        seen = {}
        for name, stream in streams.items():
            ids = []
            while (event := stream.try_next()) is not None:
                ids.append(event["documentKey"]["_id"])
            seen[name] = ids
    finally:
        for stream in streams.values():
            stream.close()
    # built as {y: 2, x: 1} from either order (ids 1 and 4): equal to YX only
    assert seen == {"stored": [4, 5, 6], "built_xy": [], "built_yx": [1, 4], "built_in": []}


def test_aggregate_match_on_a_built_document(coll: Collection) -> None:
    built = {"$addFields": {"b": {"y": "$nested.in.y", "x": "$nested.in.x"}}}
    assert [d["_id"] for d in coll.aggregate([built, {"$match": {"b": XY}}])] == []
    assert [d["_id"] for d in coll.aggregate([built, {"$match": {"b": YX}}])] == [1, 2]
