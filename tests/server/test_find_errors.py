"""`find`'s wrongly typed document options, answered as mongod 8.0 answers them.

find_command.idl types filter, projection, sort, collation, min and max
`object_owned_nonempty_serialize`, parsed by parseOwnedBSON: 14 TypeMismatch "Expected field
<name>to be of type object", without a space before "to" (mongod's own text, as clients
comparing against a real mongod record it), null included. Other commands' document fields
go through the generic IDL check ("BSON field 'count.query' is the wrong type ...").
"""

from __future__ import annotations

import pytest
from bson.son import SON
from pymongo.errors import OperationFailure


@pytest.fixture()
def coll(client):
    c = client.find_errors.things
    c.drop()
    c.insert_many([{"_id": 1, "x": 2}, {"_id": 2, "x": 1}])
    yield c
    c.drop()


def _find_error(coll, **fields) -> OperationFailure:
    with pytest.raises(OperationFailure) as info:
        coll.database.command(SON([("find", coll.name), *fields.items()]))
    return info.value


@pytest.mark.parametrize("field", ["sort", "filter", "projection", "collation", "min", "max"])
@pytest.mark.parametrize("value", ["x", 1, 0, "", 2.5, [("x", 1)], None, True])
def test_object_fields(coll, field: str, value: object) -> None:
    err = _find_error(coll, **{field: value})
    assert (err.code, err.details["codeName"]) == (14, "TypeMismatch")
    assert err.details["errmsg"] == f"Expected field {field}to be of type object"


def test_first_bad_field_in_command_order(coll) -> None:
    err = _find_error(coll, sort="x", filter=3)
    assert err.details["errmsg"] == "Expected field sortto be of type object"
    err = _find_error(coll, filter=3, sort="x")
    assert err.details["errmsg"] == "Expected field filterto be of type object"


def test_missing_collection_and_oplog_alike(client, coll) -> None:
    err = _find_error(client.find_errors.no_such, sort="x")
    assert err.details["errmsg"] == "Expected field sortto be of type object"
    with pytest.raises(OperationFailure) as info:
        client.local.command({"find": "oplog.rs", "sort": 1})
    assert (info.value.code, info.value.details["errmsg"]) == (
        14, "Expected field sortto be of type object")


def test_documents_still_work(coll) -> None:
    docs = coll.database.command(
        {"find": coll.name, "filter": {}, "sort": {"x": 1}, "projection": {"_id": 1}}
    )["cursor"]["firstBatch"]
    assert docs == [{"_id": 2}, {"_id": 1}]
    assert list(coll.find({}, sort=[("x", -1)])) == [{"_id": 1, "x": 2}, {"_id": 2, "x": 1}]


def test_other_commands_keep_the_idl_message(coll) -> None:
    with pytest.raises(OperationFailure) as info:
        coll.database.command({"count": coll.name, "query": "x"})
    assert info.value.details["errmsg"] == (
        "BSON field 'count.query' is the wrong type 'string', expected type 'object'")
    with pytest.raises(OperationFailure) as info:
        coll.database.command({"findAndModify": coll.name, "sort": "x", "remove": True})
    assert info.value.details["errmsg"] == (
        "BSON field 'findAndModify.sort' is the wrong type 'string', expected type 'object'")
