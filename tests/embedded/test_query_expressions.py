"""Aggregation and projection forms the embedded store's query engine lacked, as mongod 8.0
has them (issue 27, item 6): `$$NOW` / `$$CLUSTER_TIME`, `$dateAdd`, `$dateSubtract`,
`$dateDiff`, `$dateTrunc`, `$reduce`, `$lookup` with `let` + `pipeline`, aggregation
expressions and literals in a find projection, and mixed inclusion / exclusion projections
refused with mongod's codes and messages (projection_parser.cpp)."""

from __future__ import annotations

import datetime

import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo import MongoClient, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

D = datetime.datetime


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.query_expressions.c
    collection.insert_many([
        {"_id": 1, "d": D(2024, 1, 31, 10, 30), "n": [1, 2, 3], "s": ["a", "b"]},
        {"_id": 2, "d": D(2021, 3, 20, 11, 30, 5), "n": [], "s": []},
    ])
    yield collection
    client.close()


def _one(coll: Collection, expr: object, _id: int = 1) -> object:
    (doc,) = coll.aggregate([{"$match": {"_id": _id}}, {"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


def _code(exc: pytest.ExceptionInfo[errors.OperationFailure]) -> tuple[int | None, str]:
    assert "mongomock" not in str(exc.value)
    return exc.value.code, exc.value.details["errmsg"]  # type: ignore[index]


def test_now_and_cluster_time(coll: Collection) -> None:
    docs = list(coll.aggregate([{"$project": {"t": "$$NOW", "c": "$$CLUSTER_TIME"}}]))
    assert [sorted(d) for d in docs] == [["_id", "c", "t"], ["_id", "c", "t"]]
    assert all(isinstance(d["t"], D) and isinstance(d["c"], Timestamp) for d in docs)
    assert docs[0]["t"] == docs[1]["t"] and docs[0]["c"] == docs[1]["c"]  # one per command
    shown = list(coll.find({}, {"t": "$$NOW"}))
    assert [sorted(d) for d in shown] == [["_id", "t"], ["_id", "t"]]
    assert coll.count_documents({"$expr": {"$lt": ["$d", "$$NOW"]}}) == 2


def test_date_add_and_subtract(coll: Collection) -> None:
    month = {"$dateAdd": {"startDate": "$d", "unit": "month", "amount": 1}}
    assert _one(coll, month) == D(2024, 2, 29, 10, 30)  # clamped to the month's last day
    assert _one(coll, {"$dateAdd": {"startDate": "$d", "unit": "hour", "amount": Int64(-3)}}) \
        == D(2024, 1, 31, 7, 30)
    assert _one(coll, {"$dateSubtract": {"startDate": "$d", "unit": "quarter", "amount": 1}}) \
        == D(2023, 10, 31, 10, 30)
    assert _one(coll, {"$dateAdd": {"startDate": "$d", "unit": "week", "amount": 2.0}}) == \
        D(2024, 2, 14, 10, 30)
    # a day in local time: across New York's switch to summer time it is 23 hours
    dst = {"$dateAdd": {"startDate": D(2021, 3, 13, 12), "unit": "day", "amount": 1,
                        "timezone": "America/New_York"}}
    assert _one(coll, dst) == D(2021, 3, 14, 11)
    assert _one(coll, {"$dateAdd": {"startDate": "$missing", "unit": "day", "amount": 1}}) \
        is None
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$dateAdd": {"startDate": "$d", "unit": "day", "amount": 1.5}})
    assert _code(exc) == (5166405, "$dateAdd expects integer amount of time units")
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$dateSubtract": {"startDate": "$n", "unit": "day", "amount": 1}})
    assert _code(exc) == (5166403, "$dateSubtract requires startDate to be convertible to a "
                                   "date")
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$dateAdd": {"startDate": "$d", "unit": 5, "amount": 1}})
    assert _code(exc) == (5439013, "$dateAdd requires 'unit' to be a string, but got int")


def test_date_diff(coll: Collection) -> None:
    def diff(start: object, end: object, unit: str, **more: object) -> object:
        return _one(coll, {"$dateDiff": {"startDate": start, "endDate": end, "unit": unit,
                                         **more}})

    # boundaries crossed, not elapsed time
    assert diff(D(2020, 12, 31, 23, 59, 59), D(2021, 1, 1), "year") == 1
    assert diff("$d", D(2025, 1, 1), "month") == 12
    assert diff(D(2021, 1, 3), D(2021, 1, 4), "week") == 0  # Sunday to Monday
    assert diff(D(2021, 1, 3), D(2021, 1, 4), "week", startOfWeek="monday") == 1
    assert diff(D(2024, 1, 1, 0, 59), D(2024, 1, 1, 1, 0), "hour") == 1
    assert diff(D(2024, 3, 1), D(2024, 1, 1), "day") == -60
    assert diff(None, D(2024, 1, 1), "day") is None
    with pytest.raises(errors.OperationFailure) as exc:
        diff("$d", "x", "day")
    assert _code(exc) == (5166307, "$dateDiff requires 'endDate' to be a date, but got string")
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$dateDiff": {"startDate": "$d", "unit": "day"}})
    assert _code(exc) == (5166304, "Missing 'endDate' parameter to $dateDiff")


def test_date_trunc(coll: Collection) -> None:
    def trunc(unit: str, **more: object) -> object:
        return _one(coll, {"$dateTrunc": {"date": "$d", "unit": unit, **more}}, _id=2)

    assert trunc("hour", binSize=2) == D(2021, 3, 20, 10)
    assert trunc("week") == D(2021, 3, 14)  # a Saturday: back to Sunday
    assert trunc("week", startOfWeek="Mon") == D(2021, 3, 15)
    assert trunc("month", binSize=6) == D(2021, 1, 1)
    assert trunc("quarter") == D(2021, 1, 1)
    assert trunc("day", timezone="+05:30") == D(2021, 3, 19, 18, 30)
    with pytest.raises(errors.OperationFailure) as exc:
        trunc("day", binSize=0)
    assert _code(exc) == (5439018, "$dateTrunc requires 'binSize' to be greater than 0, but "
                                   "got value 0")
    with pytest.raises(errors.OperationFailure) as exc:
        trunc("day", bins=2)
    assert _code(exc)[0] == 5439008


def test_reduce(coll: Collection) -> None:
    total = {"$reduce": {"input": "$n", "initialValue": 0,
                         "in": {"$add": ["$$value", "$$this"]}}}
    assert _one(coll, total) == 6
    assert _one(coll, total, _id=2) == 0
    joined = {"$reduce": {"input": "$s", "initialValue": "",
                          "in": {"$concat": ["$$value", "$$this"]}}}
    assert _one(coll, joined) == "ab"
    assert _one(coll, {"$reduce": {"input": "$nothing", "initialValue": 0, "in": 1}}) is None
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$reduce": {"input": "$d", "initialValue": 0, "in": 1}})
    assert _code(exc)[0] == 40080
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, {"$reduce": {"input": "$n", "in": 1}})
    assert _code(exc) == (40078, "$reduce requires 'initialValue' to be specified")


def test_lookup_let_pipeline(coll: Collection) -> None:
    orders = coll.database.orders
    orders.insert_many([{"_id": 10, "item": 1, "qty": 5}, {"_id": 11, "item": 1, "qty": 1},
                        {"_id": 12, "item": 2, "qty": 7}])
    out = list(coll.aggregate([
        {"$lookup": {
            "from": "orders", "let": {"id": "$_id", "least": 2},
            "pipeline": [
                {"$match": {"$expr": {"$and": [{"$eq": ["$item", "$$id"]},
                                               {"$gte": ["$qty", "$$least"]}]}}},
                {"$project": {"_id": 1}},
            ],
            "as": "big"}},
        {"$project": {"big": 1}},
        {"$sort": {"_id": 1}},
    ]))
    assert out == [{"_id": 1, "big": [{"_id": 10}]}, {"_id": 2, "big": [{"_id": 12}]}]
    # localField / foreignField with a pipeline (5.0+): the pipeline runs on the matches
    out = list(coll.aggregate([
        {"$lookup": {"from": "orders", "localField": "_id", "foreignField": "item",
                     "pipeline": [{"$count": "n"}], "as": "count"}},
        {"$project": {"count": 1}},
        {"$sort": {"_id": 1}},
    ]))
    assert out == [{"_id": 1, "count": [{"n": 2}]}, {"_id": 2, "count": [{"n": 1}]}]


def test_find_projection_expressions(coll: Collection) -> None:
    kind = {"$switch": {"branches": [{"case": {"$eq": ["$_id", 1]}, "then": "one"}],
                        "default": "other"}}
    assert list(coll.find({}, {"kind": kind}, sort=[("_id", 1)])) == [
        {"_id": 1, "kind": "one"}, {"_id": 2, "kind": "other"}]
    assert list(coll.find({"_id": 1}, {"_id": 0, "next": {"$add": ["$_id", 1]},
                                       "label": "fixed", "size": {"$size": "$n"}})) == [
        {"next": 2, "label": "fixed", "size": 3}]


@pytest.mark.parametrize(("projection", "code", "message"), [
    ({"d": 1, "n": 0}, 31254, "Cannot do exclusion on field n in inclusion projection"),
    ({"d": 0, "n": 1}, 31253, "Cannot do inclusion on field n in exclusion projection"),
    ({"d": 0, "n": {"$size": "$n"}}, 31252,
     "Cannot use expression other than $meta in exclusion projection"),
    ({"_id": 0, "d": 0, "x": "lit"}, 31310,
     'Cannot use an expression x: "lit" in an exclusion projection'),
])
def test_mixed_projection_errors(coll: Collection, projection: dict, code: int,
                                 message: str) -> None:
    with pytest.raises(errors.OperationFailure) as exc:
        list(coll.find({}, projection))
    assert _code(exc) == (code, message)
    with pytest.raises(errors.OperationFailure) as exc:
        list(coll.aggregate([{"$project": projection}]))
    assert _code(exc) == (code, f"Invalid $project :: caused by :: {message}")


def test_id_exclusion_mixes_with_inclusion(coll: Collection) -> None:
    assert list(coll.find({"_id": 1}, {"_id": 0, "s": 1})) == [{"s": ["a", "b"]}]
    assert list(coll.find({"_id": 1}, {"_id": 1, "s": 0, "n": 0, "d": 0})) == [{"_id": 1}]


def test_sub_projection_and_constant_group_key(coll: Collection) -> None:
    coll.insert_one({"_id": 3, "b": {"c": 1, "d": 2}})
    assert list(coll.find({"_id": 3}, {"b": {"c": 1}})) == [{"_id": 3, "b": {"c": 1}}]
    assert list(coll.aggregate([{"$group": {"_id": 0, "n": {"$sum": 1}}}])) == [
        {"_id": 0, "n": 3}]


def test_array_literals_are_evaluated_element_by_element(coll: Collection) -> None:
    # ExpressionArray: `["$n", ...]` holds the values, a missing element null (mongomock gave
    # the literal back as written); in $project, inside operators and in a find projection.
    assert _one(coll, ["$_id", "$s", {"$add": ["$_id", 1]}, "$nosuch"]) == [
        1, ["a", "b"], 2, None]
    assert _one(coll, {"$map": {"input": [1, 2], "in": ["$$this", "$_id"]}}) == [[1, 1], [2, 1]]
    assert _one(coll, {"$size": [["$_id", "$s"]]}) == 2
    (doc,) = coll.find({"_id": 1}, {"_id": 0, "v": ["$_id", "$s"]})
    assert doc == {"v": [1, ["a", "b"]]}
