"""`$function` on the embedded store (cdcserver/embedded/javascript.py): the body called with
the evaluated args in V8, its result as mongod's ValueWriter writes it (numbers as doubles,
Dates as dates), and ExpressionFunction::parse's errors in its order."""

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
    ({"body": "function(){ throw new TypeError('boom') }", "args": [], "lang": "js"}, 139,
     "TypeError: boom"),
])
def test_errors(coll, spec, code, message):
    with pytest.raises(OperationFailure) as info:
        coll.aggregate([{"$project": {"v": {"$function": spec}}}]).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (code, message)
