"""Collation is applied, not ignored (issue 15): strengths 1 and 2 compare strings without
case (and at 1 without diacritics) in find, count, distinct, sort, update, delete and
findAndModify; a collection's default collation applies when a command names none; regexes
ignore collation, as in mongod.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import ReturnDocument
from pymongo.collation import Collation
from pymongo.errors import OperationFailure

CI = Collation("en", strength=2)  # case-insensitive
BASE = Collation("en", strength=1)  # case- and diacritic-insensitive
EXACT = Collation("en", strength=3)


@pytest.fixture
def people(client) -> Iterator[Any]:
    c = client.qcollation.people
    c.drop()
    c.insert_many([
        {"_id": 1, "name": "Alice"},
        {"_id": 2, "name": "alice"},
        {"_id": 3, "name": "Bob"},
        {"_id": 4, "name": "álice"},
        {"_id": 5, "name": ["x", "ALICE"]},
    ])
    yield c
    c.drop()


def _ids(cursor: Any) -> list[int]:
    return sorted(d["_id"] for d in cursor)


def test_update_many_with_a_case_insensitive_collation_changes_every_match(people) -> None:
    result = people.update_many({"name": "alice"}, {"$set": {"hit": True}}, collation=CI)
    assert (result.matched_count, result.modified_count) == (3, 3)
    assert _ids(people.find({"hit": True})) == [1, 2, 5]
    # without a collation, binary comparison
    assert people.update_many({"name": "alice"}, {"$set": {"bin": 1}}).matched_count == 1


def test_find_and_count_by_strength(people) -> None:
    assert _ids(people.find({"name": "ALICE"}, collation=CI)) == [1, 2, 5]
    assert _ids(people.find({"name": "alice"}, collation=BASE)) == [1, 2, 4, 5]
    assert _ids(people.find({"name": "alice"}, collation=EXACT)) == [2]
    assert _ids(people.find({"name": "alice"})) == [2]
    assert _ids(people.find({"name": {"$in": ["BOB", "nobody"]}}, collation=CI)) == [3]
    assert _ids(people.find({"name": {"$ne": "alice"}}, collation=CI)) == [3, 4]
    assert people.count_documents({"name": "ALICE"}, collation=CI) == 3
    n = people.database.command("count", people.name, query={"name": "bob"},
                                collation=CI.document)["n"]
    assert n == 1
    assert people.find_one({"_id": 3, "name": "BOB"}, collation=CI) == {"_id": 3, "name": "Bob"}


def test_ranges_and_sort_follow_the_collation(people) -> None:
    # binary: "Bob" < "a..." < "b"; case-insensitive: "alice" < "b" < "bob"
    assert _ids(people.find({"name": {"$gt": "b"}}, collation=CI)) == [3, 5]
    assert _ids(people.find({"name": {"$gt": "b"}})) == [4, 5]  # "á" is past "b" in UTF-8
    ordered = [d["_id"] for d in people.find({"_id": {"$lte": 3}}, collation=CI)
               .sort([("name", 1), ("_id", 1)])]
    assert ordered == [1, 2, 3]
    assert [d["_id"] for d in people.find({"_id": {"$lte": 3}}).sort("name", 1)] == [1, 3, 2]


def test_regex_ignores_the_collation(people) -> None:
    assert _ids(people.find({"name": {"$regex": "^a"}}, collation=CI)) == [2]


def test_distinct_with_a_collation_keeps_the_first_of_equal_values(people) -> None:
    assert people.distinct("name", collation=CI) == ["Alice", "álice", "Bob", "x"]
    assert people.distinct("name", collation=BASE) == ["Alice", "Bob", "x"]
    assert people.distinct("name") == ["ALICE", "Alice", "Bob", "alice", "x", "álice"]


def test_delete_and_find_and_modify_with_a_collation(people) -> None:
    doc = people.find_one_and_update({"name": "BOB"}, {"$set": {"seen": 1}}, collation=CI,
                                     return_document=ReturnDocument.AFTER)
    assert doc == {"_id": 3, "name": "Bob", "seen": 1}
    first = people.find_one_and_delete({"name": "ALICE"}, sort=[("_id", -1)], collation=CI)
    assert first["_id"] == 5
    assert people.delete_many({"name": "ALICE"}, collation=BASE).deleted_count == 3
    assert _ids(people.find()) == [3]


def test_collection_default_collation(client) -> None:
    db = client.qcollation
    db.drop_collection("defaults")
    c = db.create_collection("defaults", collation=CI)
    c.insert_many([{"_id": 1, "s": "Abc"}, {"_id": 2, "s": "abc"}])
    assert _ids(c.find({"s": "ABC"})) == [1, 2]
    assert _ids(c.find({"s": "ABC"}, collation=Collation("simple"))) == []
    assert c.update_many({"s": "abc"}, {"$set": {"t": 1}}).modified_count == 2
    db.drop_collection("defaults")


def test_invalid_collation(people) -> None:
    # an empty collation asks for none (mongod's jstests run `find` with `collation: {}`)
    people.database.command("find", people.name, filter={}, collation={})
    with pytest.raises(OperationFailure) as err:
        people.database.command("find", people.name, filter={}, collation="en")
    assert err.value.code == 14


@pytest.fixture
def coll_words(client) -> Iterator[Any]:
    c = client.qcollation.words
    c.drop()
    c.insert_many([{"w": w} for w in ["Banana", "apple", "cherry", "álice", "alice", "Alice"]])
    yield c
    c.drop()


def test_default_strength_sorts_as_icu(coll_words) -> None:
    """{locale: "en"} (strength 3): alphabetical, lowercase before uppercase, accents after;
    equality still tells case apart."""
    order = [d["w"] for d in coll_words.find({}, {"_id": 0}).sort("w", 1)
             .collation(Collation("en"))]
    assert order == ["alice", "Alice", "álice", "apple", "Banana", "cherry"]
    upper = [d["w"] for d in coll_words.find({"w": {"$lt": "b"}}, {"_id": 0}).sort("w", 1)
             .collation(Collation("en", caseFirst="upper"))]
    assert upper == ["Alice", "alice", "álice", "apple"]
    assert [d["w"] for d in coll_words.find({"w": "alice"}, collation=Collation("en"))] == [
        "alice"]
    binary = [d["w"] for d in coll_words.find({}, {"_id": 0}).sort("w", 1)]
    assert binary == ["Alice", "Banana", "alice", "apple", "cherry", "álice"]


def test_numeric_ordering(client) -> None:
    c = client.qcollation.items
    c.drop()
    c.insert_many([{"s": s} for s in ["item10", "item9", "item100", "item2"]])
    numeric = Collation("en", numericOrdering=True)
    assert [d["s"] for d in c.find().sort("s", 1).collation(numeric)] == [
        "item2", "item9", "item10", "item100"]
    assert [d["s"] for d in c.find({"s": {"$gt": "item9"}}, collation=numeric)] == [
        "item10", "item100"]
    c.drop()
