"""A find whose filter has an equality, `$in` or range predicate on a single-field index reads
only the documents in the index's bounds (issue 30): explain's executionStats count them
(`totalDocsExamined`, `totalKeysExamined`), its winningPlan is mongod's FETCH over IXSCAN
with the index's name and bounds, the scan itself examines no other document, and what it
returns is what the collection scan returns, through inserts, updates, deletes,
transactions and a restart."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import ASCENDING, DESCENDING, MongoClient

from cdcserver.embedded import query
from cdcserver.testing import EmbeddedServer

N = 2000


def _docs() -> list[dict[str, Any]]:
    return [{"_id": i, "u": i % 100, "s": f"s{i % 7}", "arr": [i % 5, 10 + i % 3],
             "x": i % 2, "y": i % 3} for i in range(N)]


@pytest.fixture(scope="module")
def server():
    with EmbeddedServer() as s:
        yield s


@pytest.fixture
def coll(server: EmbeddedServer):
    with server.client() as client:
        c = client.ix.c
        c.drop()
        c.insert_many(_docs())
        c.create_index("u")
        c.create_index([("s", DESCENDING)])
        c.create_index([("arr", ASCENDING)])
        yield c


def _stats(coll, filter_doc: dict[str, Any]) -> dict[str, Any]:
    return coll.database.command(
        {"explain": {"find": coll.name, "filter": filter_doc}, "verbosity": "executionStats"})


def _scan(coll, filter_doc: dict[str, Any]) -> list[Any]:
    """The collection scan's answer (a $natural hint reads no index)."""
    return [d["_id"] for d in coll.find(filter_doc, hint={"$natural": 1})]


@pytest.mark.parametrize(("filter_doc", "bounds", "matches"), [
    ({"u": 5}, ["[5, 5]"], 20),
    ({"u": 5.0}, ["[5.0, 5.0]"], 20),
    ({"u": {"$eq": 7}}, ["[7, 7]"], 20),
    ({"u": {"$in": [7, 3, 5]}}, ["[3, 3]", "[5, 5]", "[7, 7]"], 60),
    ({"u": {"$gt": 95}}, ["(95, inf.0]"], 80),
    ({"u": {"$gte": 10, "$lt": 12}}, ["[10, 12)"], 40),
    ({"u": {"$lte": 1}}, ["[-inf.0, 1]"], 40),
])
def test_indexed_find_examines_only_matches(coll, filter_doc, bounds, matches) -> None:
    reply = _stats(coll, filter_doc)
    stats = reply["executionStats"]
    assert stats["nReturned"] == matches
    assert stats["totalDocsExamined"] == matches
    assert stats["totalKeysExamined"] == matches
    plan = reply["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "FETCH" and "filter" not in plan
    scan = plan["inputStage"]
    assert scan["stage"] == "IXSCAN"
    assert scan["indexName"] == "u_1" and scan["keyPattern"] == {"u": 1}
    assert scan["indexBounds"] == {"u": bounds}
    assert scan["isMultiKey"] is False and scan["direction"] == "forward"
    fetch = stats["executionStages"]
    assert fetch["stage"] == "FETCH" and fetch["docsExamined"] == matches
    assert fetch["inputStage"]["keysExamined"] == matches
    # the same answer as the collection scan; equal keys in RecordId (natural) order
    found = [d["_id"] for d in coll.find(filter_doc)]
    assert sorted(found) == sorted(_scan(coll, filter_doc))
    if "$in" not in str(filter_doc) and "$g" not in str(filter_doc) and "$l" not in str(
            filter_doc):
        assert found == _scan(coll, filter_doc)


def test_find_itself_reads_only_the_bounds(server: EmbeddedServer, coll) -> None:
    before = query.stats["examined"]
    assert len(list(coll.find({"u": 42}))) == 20
    assert query.stats["examined"] - before == 20
    before = query.stats["examined"]
    assert len(list(coll.find({"x": 1}))) == N // 2  # no index on x: every document
    assert query.stats["examined"] - before == N


def test_unindexed_filter_is_a_collection_scan(coll) -> None:
    reply = _stats(coll, {"x": 1})
    assert reply["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    assert reply["executionStats"]["totalDocsExamined"] == N
    assert reply["executionStats"]["totalKeysExamined"] == 0


def test_other_predicates_filter_the_fetched_documents(coll) -> None:
    reply = _stats(coll, {"u": 5, "y": 0})
    plan = reply["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "FETCH" and plan["filter"] == {"y": {"$eq": 0}}
    assert reply["executionStats"]["totalDocsExamined"] == 20
    assert reply["executionStats"]["nReturned"] == 7
    assert [d["_id"] for d in coll.find({"u": 5, "y": 0})] == _scan(coll, {"u": 5, "y": 0})


def test_most_selective_index_wins(coll) -> None:
    plan = _stats(coll, {"u": 5, "s": "s3"})["queryPlanner"]["winningPlan"]
    assert plan["inputStage"]["indexName"] == "u_1"  # 20 keys against s_-1's 286


def test_descending_index_bounds(coll) -> None:
    reply = _stats(coll, {"s": {"$lt": "s2"}})
    scan = reply["queryPlanner"]["winningPlan"]["inputStage"]
    assert scan["indexName"] == "s_-1" and scan["keyPattern"] == {"s": -1}
    assert scan["indexBounds"] == {"s": ['("s2", ""]']}
    found = [d["_id"] for d in coll.find({"s": {"$lt": "s2"}})]
    assert sorted(found) == sorted(_scan(coll, {"s": {"$lt": "s2"}}))
    assert [d["s"] for d in coll.find({"s": {"$lt": "s2"}})][0] == "s1"  # greatest first


def test_multikey_index(coll) -> None:
    reply = _stats(coll, {"arr": 11})
    scan = reply["queryPlanner"]["winningPlan"]["inputStage"]
    assert scan["isMultiKey"] is True and scan["multiKeyPaths"] == {"arr": ["arr"]}
    assert reply["executionStats"]["totalDocsExamined"] == len(_scan(coll, {"arr": 11}))
    # two range predicates can hold for two elements: not intersected on a multikey index
    both = {"arr": {"$gt": 3, "$lt": 11}}
    assert sorted(d["_id"] for d in coll.find(both)) == sorted(_scan(coll, both))
    assert _stats(coll, both)["queryPlanner"]["winningPlan"]["inputStage"][
        "indexBounds"] == {"arr": ["(3, inf.0]"]}


def test_writes_keep_the_index_in_step(coll) -> None:
    assert len(list(coll.find({"u": 5}))) == 20  # the table is built
    coll.update_one({"_id": 5}, {"$set": {"u": 6}})
    coll.delete_one({"_id": 105})
    coll.insert_one({"_id": "new", "u": 5})
    coll.update_many({"u": 7}, {"$set": {"u": 5}})
    coll.replace_one({"_id": 205}, {"u": [5, 99]})
    for f in ({"u": 5}, {"u": 6}, {"u": 7}, {"u": {"$in": [5, 99]}}, {"u": {"$gte": 99}}):
        assert [d["_id"] for d in coll.find(f)] == _scan(coll, f) or sorted(
            map(str, (d["_id"] for d in coll.find(f)))) == sorted(map(str, _scan(coll, f)))
        assert _stats(coll, f)["executionStats"]["totalDocsExamined"] == len(_scan(coll, f))
    coll.drop_index("u_1")
    coll.create_index([("u", DESCENDING)], name="u_1")  # the same name, another key
    assert _stats(coll, {"u": 5})["queryPlanner"]["winningPlan"]["inputStage"][
        "keyPattern"] == {"u": -1}
    assert sorted(map(str, (d["_id"] for d in coll.find({"u": 5})))) == sorted(
        map(str, _scan(coll, {"u": 5})))


def test_transaction_reads_its_own_writes(server: EmbeddedServer, coll) -> None:
    assert len(list(coll.find({"u": 5}))) == 20
    with server.client() as client, client.start_session() as s, s.start_transaction():
        c = client.ix.c
        c.insert_one({"_id": "t", "u": 5}, session=s)
        c.update_one({"_id": 5}, {"$set": {"u": 8}}, session=s)
        inside = sorted(map(str, (d["_id"] for d in c.find({"u": 5}, session=s))))
        assert "t" in inside and "5" not in inside and len(inside) == 20
        assert len(list(coll.find({"u": 5}))) == 20  # outside: not yet
    after = sorted(map(str, (d["_id"] for d in coll.find({"u": 5}))))
    assert after == inside


def test_index_after_restart(tmp_path) -> None:
    with EmbeddedServer(tmp_path) as s, s.client() as client:
        client.ix.c.insert_many(_docs())
        client.ix.c.create_index("u")
        assert len(list(client.ix.c.find({"u": 5}))) == 20
    with EmbeddedServer(tmp_path) as s, MongoClient(s.direct_uri) as client:
        c = client.ix.c
        assert [d["_id"] for d in c.find({"u": 5})] == list(range(5, N, 100))
        assert _stats(c, {"u": 5})["executionStats"]["totalDocsExamined"] == 20
