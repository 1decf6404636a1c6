"""`$where` on the embedded store, as mongod runs it (cdcserver/embedded/javascript.py): code
as an expression, statements or a function, `this` and `obj` the document, `sleep`, mongod's
parse errors, 139 for a JavaScript error, 50 at the time limit, and a sleeping predicate holds
its own operation only."""

from __future__ import annotations

import datetime
import itertools
import threading
import time

import pytest
from bson import Code, ObjectId
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer

_names = itertools.count()


@pytest.fixture(scope="module")
def server():
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def coll(server, request):
    coll = server.client().where_db[f"c{next(_names)}"]
    coll.drop()
    coll.insert_many([{"_id": i, "x": i} for i in range(10)])
    return coll


def xs(cursor) -> list[int]:
    return [d["x"] for d in cursor]


@pytest.mark.parametrize("code", [
    "this.x < 3", Code("this.x < 3"), "obj.x < 3", "this.x < 3;",
    "function() { return this.x < 3 }", "var limit = 3; this.x < limit",
    "var limit = 3\nthis.x < limit", "if (this.x < 3) { return true; } return false",
])
def test_code_forms(coll, code):
    assert xs(coll.find({"$where": code})) == [0, 1, 2]


def test_with_other_conditions_and_inside_or(coll):
    assert xs(coll.find({"x": {"$gt": 5}, "$where": "this.x % 2 == 0"})) == [6, 8]
    assert xs(coll.find({"$or": [{"x": 0}, {"$where": "this.x == 9"}]})) == [0, 9]
    # the count command (count_documents is an aggregation $match, which refuses $where)
    assert coll.database.command("count", coll.name, query={"$where": "this.x >= 7"})["n"] == 3
    assert coll.delete_many({"$where": "this.x > 7"}).deleted_count == 2
    assert coll.update_many({"$where": "this.x < 2"}, {"$set": {"y": 1}}).modified_count == 2


def test_document_types_reach_javascript(coll):
    oid = ObjectId()
    coll.insert_one({"_id": "typed", "when": datetime.datetime(2020, 5, 1), "ref": oid,
                     "tags": ["a", "b"], "sub": {"n": 2}})
    found = coll.find_one({"$where": "this.when instanceof Date && this.when.getUTCFullYear()"
                                     f" == 2020 && this.ref.str == '{oid}'"
                                     " && this.tags.length == 2 && this.sub.n == 2"})
    assert found is not None and found["_id"] == "typed"


@pytest.mark.parametrize(("value", "code", "message"), [
    (Code("this.x < i", {"i": 3}), 4649201,
     "$where no longer supports deprecated BSON type CodeWScope"),
    (Code("this.x < 3", {}), 4649201,
     "$where no longer supports deprecated BSON type CodeWScope"),
    (5, 2, "$where got bad type"),
    (None, 2, "$where got bad type"),
    ("", 2, "code for $where cannot be empty"),
])
def test_parse_errors(coll, value, code, message):
    with pytest.raises(OperationFailure) as info:
        coll.find({"$where": value}).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (code, message)


def test_a_javascript_error_is_139(coll):
    with pytest.raises(OperationFailure) as info:
        coll.find({"$where": "nosuch.field > 1"}).to_list()
    assert info.value.code == 139
    assert info.value.details["codeName"] == "JSInterpreterFailure"
    assert "ReferenceError: nosuch is not defined" in info.value.details["errmsg"]


def test_max_time_ms_stops_a_predicate(coll):
    with pytest.raises(OperationFailure) as info:
        coll.find({"$where": "sleep(60000); return true"}, max_time_ms=100).to_list()
    assert info.value.code == 50


def test_a_sleeping_predicate_holds_only_its_own_operation(server, coll):
    """The predicate runs off the event loop: other clients are answered meanwhile (the
    check is on order, not on time: the ping ends before the sleeping find does)."""
    events: list[str] = []
    started = threading.Event()

    def slow_find():
        started.set()
        coll.find_one({"$where": "sleep(1500); return true"})
        events.append("find")

    thread = threading.Thread(target=slow_find)
    thread.start()
    started.wait()
    time.sleep(0.3)  # the find is in its sleep by now (not a timing assertion: see above)
    server.client().admin.command("ping")
    events.append("ping")
    thread.join()
    assert events == ["ping", "find"]


@pytest.mark.parametrize("pipeline", [
    [{"$match": {"$where": "true"}}],
    [{"$project": {"x": 1}}, {"$match": {"$or": [{"x": 1}, {"$where": "true"}]}}],
])
def test_not_in_an_aggregation_match(coll, pipeline):
    with pytest.raises(OperationFailure) as info:
        coll.aggregate(pipeline).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (
        2, "$where is not allowed in this context")


def test_only_at_the_top_level(coll):
    with pytest.raises(OperationFailure) as info:
        coll.find({"a": {"$elemMatch": {"$where": "true"}}}).to_list()
    assert (info.value.code, info.value.details["errmsg"]) == (
        2, "$where can only be applied to the top-level document")


def test_not_in_a_change_stream_match(coll):
    with pytest.raises(OperationFailure) as info:
        coll.watch([{"$match": {"$where": "true"}}])
    assert (info.value.code, info.value.details["errmsg"]) == (
        2, "$where is not allowed in this context")
