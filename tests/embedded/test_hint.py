"""The `hint` option and find's `min` / `max` against the embedded store, through pymongo:
a hinted index (by name or key pattern) is scanned in its key order, `$natural: -1` in
reverse, min (inclusive) / max (exclusive) bound that scan, and mongod's planner errors
(2 unknown index, 51173 no hint, 51174 wrong fields, 51175 min not before max, 51176)."""

from __future__ import annotations

import pytest
from pymongo import ASCENDING, DESCENDING, MongoClient, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.hint_tests.c
    collection.insert_many([{"_id": i, "a": i % 3, "b": 10 - i} for i in range(6)])
    collection.create_index([("a", ASCENDING), ("b", DESCENDING)], name="a_b")
    collection.create_index([("b", ASCENDING)])
    yield collection
    client.close()


def _ids(cursor) -> list[int]:
    return [d["_id"] for d in cursor]


def test_hint_orders_by_the_index(coll: Collection) -> None:
    assert _ids(coll.find()) == [0, 1, 2, 3, 4, 5]
    by_a_b = [0, 3, 1, 4, 2, 5]  # a ascending, then b descending
    assert _ids(coll.find().hint("a_b")) == by_a_b
    assert _ids(coll.find().hint([("a", 1), ("b", -1)])) == by_a_b
    assert _ids(coll.find().hint("b_1")) == [5, 4, 3, 2, 1, 0]
    assert _ids(coll.find({"a": 1}).hint("b_1")) == [4, 1]
    assert _ids(coll.find().hint([("$natural", -1)])) == [5, 4, 3, 2, 1, 0]
    assert _ids(coll.find().sort("_id", 1).hint("b_1")) == [0, 1, 2, 3, 4, 5]
    assert _ids(coll.aggregate([{"$project": {"_id": 1}}], hint="b_1")) == [5, 4, 3, 2, 1, 0]


def test_unknown_index_is_bad_value(coll: Collection) -> None:
    for call in (lambda: list(coll.find().hint("nope")),
                 lambda: list(coll.find().hint([("b", -1)])),
                 lambda: coll.count_documents({}, hint="nope"),
                 lambda: list(coll.aggregate([], hint="nope"))):
        with pytest.raises(errors.OperationFailure) as info:
            call()
        assert info.value.code == 2
        assert "hint provided does not correspond to an existing index" in str(info.value)


def test_min_max_bound_the_hinted_index(coll: Collection) -> None:
    assert _ids(coll.find().min([("b", 7)]).hint("b_1")) == [3, 2, 1, 0]
    assert _ids(coll.find().max([("b", 7)]).hint("b_1")) == [5, 4]
    assert _ids(coll.find().min([("b", 6)]).max([("b", 9)]).hint("b_1")) == [4, 3, 2]
    assert _ids(coll.find().min([("a", 1), ("b", 7)]).hint("a_b")) == [4, 2, 5]


@pytest.mark.parametrize("make,code", [
    (lambda c: c.database.command("find", c.name, min={"b": 1})["cursor"]["firstBatch"],
     51173),  # (pymongo's cursor refuses min without hint before sending)
    (lambda c: c.find().min([("b", 1)]).hint("a_b"), 51174),
    (lambda c: c.find().min([("b", 9)]).max([("b", 7)]).hint("b_1"), 51175),
    (lambda c: c.find().min([("a", 1), ("b", 7)]).max([("b", 7), ("a", 1)]).hint("a_b"), 51176),
])
def test_min_max_errors(coll: Collection, make, code: int) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        list(make(coll))
    assert info.value.code == code


def test_writes_refuse_an_unknown_hint(coll: Collection) -> None:
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": 1}, {"$set": {"x": 1}}, hint="nope")
    assert info.value.code == 2
    with pytest.raises(errors.WriteError) as info:
        coll.delete_one({"_id": 1}, hint=[("zz", 1)])
    assert info.value.code == 2
    with pytest.raises(errors.OperationFailure) as info:
        coll.find_one_and_delete({"_id": 1}, hint="nope")
    assert info.value.code == 2
    assert coll.count_documents({"_id": 1}) == 1
    assert coll.update_one({"_id": 1}, {"$set": {"x": 1}}, hint="b_1").modified_count == 1
    assert coll.delete_one({"_id": 1}, hint={"a": 1, "b": -1}).deleted_count == 1
