"""Reading a collection costs O(N), `distinct` and `sort` order values as mongod does
(issue 15).

The work of a scan is counted by cdcserver/embedded/query.py (`stats`: documents examined and
copied), so linearity is checked by counting, not by timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64

from cdcserver.embedded import query

N = 100_000


@pytest.fixture(scope="module")
def big(server) -> Iterator[Any]:
    client = server.client()
    c = client.qscale.big
    c.drop()
    for start in range(0, N, 10_000):
        c.insert_many([{"_id": i, "n": i % 10, "s": f"v{i}"} for i in range(start, start + 10_000)])
    yield c
    c.drop()
    client.close()


def _work(fn: Any) -> tuple[Any, int, int]:
    before = dict(query.stats)
    result = fn()
    return (result, query.stats["examined"] - before["examined"],
            query.stats["copied"] - before["copied"])


def test_count_of_a_large_collection_examines_each_document_once(big) -> None:
    n, examined, copied = _work(
        lambda: big.database.command("count", big.name, query={"n": 3})["n"])
    assert n == N // 10
    assert examined == N
    assert copied == 0
    assert big.count_documents({}) == N
    assert big.estimated_document_count() == N


def test_find_of_a_large_collection_reads_each_document_once(big) -> None:
    ids, examined, copied = _work(lambda: [d["_id"] for d in big.find({"n": {"$gte": 0}})])
    assert ids == list(range(N))  # natural order, every document once (getMore batches)
    assert examined == N
    assert copied == 0  # stored documents are never changed in place: no copy needed
    names, examined, copied = _work(
        lambda: [d for d in big.find({"n": 5}, {"s": 1, "_id": 0})])
    assert names == [{"s": f"v{i}"} for i in range(5, N, 10)]
    assert examined == N
    assert copied == N // 10  # only the documents returned are projected


def test_skip_and_limit_stop_the_scan(big) -> None:
    docs, examined, _ = _work(lambda: list(big.find({"n": 1}).skip(2).limit(3)))
    assert [d["_id"] for d in docs] == [21, 31, 41]
    assert examined < 100


def test_distinct_of_a_large_collection(big) -> None:
    values, examined, _ = _work(lambda: big.distinct("n", {"s": {"$regex": "^v"}}))
    assert values == list(range(10))
    assert examined == 2 * N  # the filter's scan, then the values of the documents it kept


@pytest.fixture
def coll(client) -> Iterator[Any]:
    c = client.qscale.small
    c.drop()
    yield c
    c.drop()


def test_distinct_values_in_bson_order(coll) -> None:
    """mongod collects distinct values in a BSONElementSet: ordered as BSON compares them,
    the first of equal values kept, array elements counted one by one."""
    coll.insert_many([{"x": 33}, {"x": 11}, {"x": 22}, {"x": 11}])
    assert coll.distinct("x") == [11, 22, 33]
    coll.delete_many({})
    coll.insert_many([
        {"x": "b"}, {"x": 2}, {"x": [3, "a"]}, {"x": None}, {"x": 2.0}, {"x": Int64(1)},
        {"x": {"k": 1}}, {"x": True}, {"y": 1},
    ])
    values = coll.distinct("x")
    assert values == [None, 1, 2, 3, "a", "b", {"k": 1}, True]
    assert isinstance(values[2], int)  # 2 came before 2.0: the first is kept
    # the array matched (one element is a string): all its elements are values
    assert coll.distinct("x", {"x": {"$type": "string"}}) == [3, "a", "b"]


def test_distinct_along_paths(coll) -> None:
    coll.insert_many([
        {"a": [{"b": 3}, {"b": 1}]},
        {"a": {"b": [2, [9]]}},
        {"a": [5, 4]},
    ])
    assert coll.distinct("a.b") == [1, 2, 3, [9]]
    assert coll.distinct("a.0") == [5, {"b": 3}]


def test_sort_orders_arrays_by_their_least_or_greatest_element(coll) -> None:
    """Ascending, an array sorts by its least element, descending by its greatest; an empty
    array sorts before null and missing fields (mongod's sort keys)."""
    coll.insert_many([
        {"_id": "two", "a": 2},
        {"_id": "array", "a": [3, 1]},
        {"_id": "missing"},
        {"_id": "empty", "a": []},
        {"_id": "null", "a": None},
    ])
    up = [d["_id"] for d in coll.find().sort("a", 1)]
    assert up == ["empty", "missing", "null", "array", "two"]
    down = [d["_id"] for d in coll.find().sort("a", -1)]
    assert down == ["array", "two", "missing", "null", "empty"]
    both = [d["_id"] for d in coll.find({"_id": {"$ne": "empty"}}).sort([("a", 1), ("_id", -1)])]
    assert both == ["null", "missing", "array", "two"]


def test_aggregate_sort_uses_the_same_sort_keys_as_find(coll) -> None:
    coll.insert_many([
        {"_id": "two", "a": 2},
        {"_id": "array", "a": [3, 1]},
        {"_id": "missing"},
        {"_id": "empty", "a": []},
        {"_id": "word", "a": "B"},
        {"_id": "lower", "a": "a"},
    ])
    found = [d["_id"] for d in coll.find().sort([("a", -1), ("_id", 1)])]
    agg = [d["_id"] for d in coll.aggregate([{"$sort": {"a": -1, "_id": 1}}])]
    assert agg == found == ["lower", "word", "array", "two", "missing", "empty"]
    en = [d["_id"] for d in coll.aggregate(
        [{"$match": {"a": {"$type": "string"}}}, {"$sort": {"a": 1}}, {"$project": {"a": 0}}],
        collation={"locale": "en"})]
    assert en == ["lower", "word"]  # binary order would put "B" first
