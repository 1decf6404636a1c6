"""`$function` and `$accumulator` on the embedded store (cdcserver/embedded/javascript.py): the
JavaScript called with the evaluated args in V8, results as mongod's ValueWriter writes them
(numbers as doubles, Dates as dates), and ExpressionFunction::parse's and AccumulatorJs::parse's
errors in their order."""

from __future__ import annotations

import datetime

import pytest
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def coll():
    with EmbeddedServer() as server:
        coll = server.client().fn.people
        coll.insert_many([{"_id": i, "name": n, "d": datetime.datetime(2024, 1, i + 1)}
                          for i, n in enumerate(["ann", "bob"])])
        yield coll


def function(body, *args):
    return {"$function": {"body": body, "args": list(args), "lang": "js"}}


def test_results_and_types(coll):
    out = coll.aggregate([{"$project": {
        "up": function("function(n, d) { return n.toUpperCase() + d.getUTCDate() }",
                       "$name", "$d"),
        "next": function("function(x) { return x + 1 }", "$_id"),
        "doc": function("function() { return {a: [1, 'x', new Date(0)], b: null} }"),
        "missing": function("function(m) { return m === null }", "$nosuch"),
    }}, {"$sort": {"_id": 1}}]).to_list()
    assert out == [
        {"_id": 0, "up": "ANN1", "next": 1.0, "missing": True,
         "doc": {"a": [1.0, "x", datetime.datetime(1970, 1, 1)], "b": None}},
        {"_id": 1, "up": "BOB2", "next": 2.0, "missing": True,
         "doc": {"a": [1.0, "x", datetime.datetime(1970, 1, 1)], "b": None}},
    ]
    assert type(out[0]["next"]) is float


def test_in_a_query_expr(coll):
    found = coll.find({"$expr": function("function(n) { return n == 'bob' }", "$name")})
    assert [d["_id"] for d in found] == [1]


@pytest.mark.parametrize(("spec", "code", "message"), [
    (5, 31260, "$function requires an object as an argument, found: int"),
    ({"args": [], "lang": "js"}, 31261, "The body function must be specified."),
    ({"body": "$name", "args": [], "lang": "js"}, 31432,
     "The body function must be a constant expression"),
    ({"body": 1, "args": [], "lang": "js"}, 31262,
     "The body function must evaluate to type string or code"),
    ({"body": "function(){}", "lang": "js"}, 31263, "The args field must be specified."),
    ({"body": "function(){}", "args": []}, 31418, "The lang field must be specified."),
    ({"body": "function(){}", "args": [], "lang": "py"}, 31419,
     "Currently the only supported language specifier is 'js'."),
    ({"body": "function(){}", "args": "$name", "lang": "js"}, 31266,
     "The args field must be of type array"),
    # thrown while the pipeline runs ($function is never folded): the executor's context
    ({"body": "function(){ throw new TypeError('boom') }", "args": [], "lang": "js"}, 139,
     "PlanExecutor error during aggregation :: caused by :: TypeError: boom"),
])
def test_errors(coll, spec, code, message):
    with pytest.raises(OperationFailure) as info:
        coll.aggregate([{"$project": {"v": {"$function": spec}}}]).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (code, message)


AVERAGE = {
    "init": "function(base) { return {count: 0, sum: base} }", "initArgs": [10],
    "accumulate": "function(state, v) { return {count: state.count + 1, sum: state.sum + v} }",
    "accumulateArgs": ["$_id"],
    "merge": "function(a, b) { return {count: a.count + b.count, sum: a.sum + b.sum} }",
    "finalize": "function(state) { return state.sum / state.count }", "lang": "js",
}


def test_accumulator(coll):
    out = coll.aggregate([{"$group": {"_id": None, "avg": {"$accumulator": AVERAGE}}}]).to_list()
    assert out == [{"_id": None, "avg": 5.5}]  # (10 + 0 + 1) / 2
    no_finalize = {k: v for k, v in AVERAGE.items() if k != "finalize"}
    out = coll.aggregate([{"$group": {"_id": "$name", "state": {"$accumulator": no_finalize}}},
                          {"$sort": {"_id": 1}}]).to_list()
    assert out == [{"_id": "ann", "state": {"count": 1.0, "sum": 10.0}},
                   {"_id": "bob", "state": {"count": 1.0, "sum": 11.0}}]


@pytest.mark.parametrize(("change", "code", "message"), [
    ({"init": "$name"}, 4544701, "$accumulator 'init' must be a constant expression"),
    ({"merge": 1}, 4544702, "$accumulator 'merge' must be a String or Code"),
    ({"lang": 1}, 4544704, "$accumulator lang must be a string; found: int"),
    ({"lang": "py"}, 4544705, "$accumulator only supports lang: 'js'"),
    ({"other": 1}, 4544706, "$accumulator got an unexpected field: other"),
    ({"merge": None}, 4544709, "$accumulator missing required argument 'merge'"),
    ({"accumulateArgs": None}, 4544710,
     "$accumulator missing required argument 'accumulateArgs'"),
    ({"initArgs": 5}, 4544711, "$accumulator initArgs must evaluate to an array: 5"),
    ({"accumulateArgs": "$_id"}, 4544712,
     "$accumulator accumulateArgs must evaluate to an array: 0"),
])
def test_accumulator_errors(coll, change, code, message):
    spec = {k: v for k, v in {**AVERAGE, **change}.items() if v is not None}
    with pytest.raises(OperationFailure) as info:
        coll.aggregate([{"$group": {"_id": None, "a": {"$accumulator": spec}}}]).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (code, message)
