"""`$text` queries on a text index and partial indexes in explain, through pymongo against the
embedded store: matching on stemmed, lowercased terms without stop words, phrases and negated
terms, `{$meta: "textScore"}` in projection and sort (mongod's FTSSpec scores), 27 without a
text index, 40218 for textScore without $text; a partialFilterExpression is parsed when the
index is created and explain plans the partial index only for queries that imply its filter."""

from __future__ import annotations

import pytest
from pymongo import ASCENDING, TEXT, MongoClient, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture
def client(cdcserver_embedded: EmbeddedServer):
    c: MongoClient = MongoClient(cdcserver_embedded.uri)
    yield c
    c.close()


@pytest.fixture
def coll(client: MongoClient) -> Collection:
    collection = client.text_tests.c
    collection.create_index([("t", TEXT)])
    collection.insert_many([
        {"_id": 1, "t": "spam eggs and spam"},
        {"_id": 2, "t": "spam"},
        {"_id": 3, "t": "egg sausage and bacon"},
        {"_id": 4, "t": "The Spams were Running"},
        {"_id": 5, "other": "spam"},
    ])
    return collection


def test_text_matches_stemmed_lowercase_terms(coll: Collection) -> None:
    assert sorted(d["_id"] for d in coll.find({"$text": {"$search": "spam"}})) == [1, 2, 4]
    assert sorted(d["_id"] for d in coll.find({"$text": {"$search": "EGGS"}})) == [1, 3]
    assert sorted(d["_id"] for d in coll.find({"$text": {"$search": "run bacon"}})) == [3, 4]
    assert list(coll.find({"$text": {"$search": "and the"}})) == []  # stop words only
    assert sorted(d["_id"] for d in coll.find({"$text": {"$search": "spam -egg"}})) == [2, 4]
    assert [d["_id"] for d in coll.find({"$text": {"$search": '"spam eggs"'}})] == [1]
    assert [d["_id"] for d in coll.find({"$text": {"$search": "spam"}, "_id": {"$gt": 2}})] \
        == [4]


def test_text_score_projection_and_sort(coll: Collection) -> None:
    found = list(coll.find({"$text": {"$search": "spam"}}, {"score": {"$meta": "textScore"}})
                 .sort([("score", {"$meta": "textScore"})]))
    assert [d["_id"] for d in found] == [1, 2, 4]
    # FTSSpec::_scoreStringV2: spam twice in three terms: (1 + 1/2) * (0.5 * 2/3 + 0.5);
    # a field that is only the term: 1 * 1 * 1.1; once in two terms (spam, run; "the" and
    # "were" are stop words): 1 * (0.5 * 1/2 + 0.5).
    assert found[0]["score"] == pytest.approx(1.25)
    assert found[1]["score"] == pytest.approx(1.1)
    assert found[2]["score"] == pytest.approx(0.75)
    assert found[0]["t"] == "spam eggs and spam"  # a meta-only projection keeps every field
    excluding = coll.find_one({"$text": {"$search": "bacon"}},
                              {"_id": 0, "s": {"$meta": "textScore"}})
    assert list(excluding) == ["t", "s"]
    including = coll.find_one({"$text": {"$search": "bacon"}},
                              {"_id": 1, "s": {"$meta": "textScore"}})
    assert list(including) == ["_id", "s"]


def test_text_errors(client: MongoClient, coll: Collection) -> None:
    plain = client.text_tests.plain
    plain.insert_one({"t": "spam"})
    with pytest.raises(errors.OperationFailure) as exc:
        plain.find_one({"$text": {"$search": "spam"}})
    assert exc.value.code == 27
    assert "text index required for $text query" in str(exc.value)
    with pytest.raises(errors.OperationFailure) as exc:
        coll.find_one({}, {"score": {"$meta": "textScore"}})
    assert exc.value.code == 40218
    for spec, code in (({"$search": 5}, 14), ({}, 4), ({"$search": "a", "x": 1}, 2), (5, 2),
                       ({"$search": "a", "$caseSensitive": 1}, 14)):
        with pytest.raises(errors.OperationFailure) as exc:  # parse errors come before 27
            plain.find_one({"$text": spec})
        assert exc.value.code == code, spec
    assert coll.find_one({"$text": {"$search": "SPAM", "$caseSensitive": True}}) is None
    assert coll.find_one({"$text": {"$search": "Spams", "$caseSensitive": True}})["_id"] == 4
    # "none": the query's words unstemmed, against the index's (English-stemmed) terms
    assert coll.find_one({"$text": {"$search": "eggs", "$language": "none"}}) is None
    assert coll.count_documents({"$text": {"$search": "egg", "$language": "none"}}) == 2


def _stage(plan: dict, name: str) -> dict:
    if plan.get("stage") == name:
        return plan
    inner = plan.get("inputStage")
    return _stage(inner, name) if isinstance(inner, dict) else {}


def test_partial_filter_expression_is_parsed(client: MongoClient) -> None:
    c = client.text_tests.partial
    for bad, code in ((5, 14), ({"x": {"$asdasd": 3}}, 2), ({"$and": 5}, 2)):
        with pytest.raises(errors.OperationFailure) as exc:
            c.create_index("x", partialFilterExpression=bad)
        assert exc.value.code == code
    assert "x_1" not in c.index_information()


def test_explain_plans_a_partial_index_its_filter_implies(client: MongoClient) -> None:
    c = client.text_tests.partial2
    c.create_index([("x", ASCENDING)], partialFilterExpression={"a": {"$lte": 1.5}})
    c.insert_many([{"x": 5, "a": 2}, {"x": 6, "a": 1}])
    for query in ({"x": 6, "a": 1}, {"x": {"$gt": 1}, "a": 1}, {"x": 6, "a": {"$lte": 1}},
                  {"x": 6, "$and": [{"a": {"$lt": 1.5}}]}):
        plan = c.find(query).explain()["queryPlanner"]["winningPlan"]
        scan = _stage(plan, "IXSCAN")
        assert scan["indexName"] == "x_1" and scan["isPartial"] is True, query
        assert _stage(plan, "FETCH")
    for query in ({"x": 6, "a": {"$lte": 1.6}}, {"x": 6}, {"a": 1}, {"x": 6, "a": "b"}):
        plan = c.find(query).explain()["queryPlanner"]["winningPlan"]
        assert _stage(plan, "COLLSCAN"), query
        assert not _stage(plan, "IXSCAN"), query
    bounds = _stage(c.find({"x": 6, "a": 1}).explain()["queryPlanner"]["winningPlan"],
                    "IXSCAN")["indexBounds"]
    assert bounds == {"x": ["[6, 6]"]}
    assert [d["x"] for d in c.find({"x": 6, "a": 1})] == [6]
    c.drop_index("x_1")
    assert _stage(c.find({"x": 6, "a": 1}).explain()["queryPlanner"]["winningPlan"],
                  "COLLSCAN")
