"""A `$$name` that nothing defines is refused when the filter is parsed, as mongod's
VariablesParseState does (17276 "Use of undefined variable: <name>"), before any document is
read; `let` variables, system variables and the ones `$let`/`$map`/`$filter`/`$reduce` define
are not."""

from __future__ import annotations

import pytest
from pymongo import DeleteOne, MongoClient, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.undefined_variable.c
    collection.insert_many([{"_id": 1, "a": [1, 2]}, {"_id": 2, "a": [3]}])
    yield collection
    client.close()


@pytest.mark.parametrize("run", [
    lambda c, f: list(c.find(f)),
    lambda c, f: c.delete_one(f),
    lambda c, f: c.update_many(f, {"$set": {"x": 1}}),
    lambda c, f: c.count_documents(f),
    lambda c, f: list(c.aggregate([{"$match": f}])),
])
def test_undefined_variable_refused(coll: Collection, run) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        run(coll, {"$expr": {"$eq": ["$_id", "$$id2"]}})
    assert info.value.code == 17276
    assert info.value.details["errmsg"] == "Use of undefined variable: id2"
    assert coll.count_documents({}) == 2


def test_defined_variables_accepted(coll: Collection) -> None:
    assert [d["_id"] for d in coll.find({"$expr": {"$eq": ["$_id", "$$id"]}}, let={"id": 2})] == [2]
    in_map = {"$expr": {"$in": [2, {"$map": {"input": "$a", "as": "v", "in": "$$v"}}]}}
    assert [d["_id"] for d in coll.find(in_map)] == [1]
    assert [d["_id"] for d in coll.find({"$expr": {"$eq": ["$$ROOT._id", 1]}})] == [1]
    # the variable is defined only inside $let's `in`
    with pytest.raises(errors.OperationFailure) as info:
        list(coll.find({"$expr": {"$and": [{"$let": {"vars": {"x": 1}, "in": "$$x"}}, "$$x"]}}))
    assert info.value.code == 17276


def test_client_bulk_write_reports_it_per_operation(coll: Collection) -> None:
    ns = coll.full_name
    with pytest.raises(errors.ClientBulkWriteException) as info:
        coll.database.client.bulk_write([
            DeleteOne({"_id": 1}, namespace=ns),
            DeleteOne({"$expr": {"$eq": ["$_id", "$$id2"]}}, namespace=ns),
        ], verbose_results=True)
    assert [e["code"] for e in info.value.write_errors] == [17276]
    assert coll.count_documents({}) == 1
