"""insert / update / delete parsed whole before any statement runs, as mongod 8.0's IDL does.

A wrong-typed, unknown or missing field anywhere in a write command (top level or inside a
statement) fails the command with ok:0 and mongod's code and message, and nothing is written,
not even the statements before the bad one. What mongod leaves to execution (modifiers, filter
operators) stays a per-statement write error with ok:1.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.son import SON
from pymongo.database import Database
from pymongo.errors import OperationFailure

from cdcserver.testing import HOST
from tests.support.embedded_support import EmbeddedServer


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    s = EmbeddedServer()
    yield s
    s.stop()


@pytest.fixture
def db(server: EmbeddedServer) -> Iterator[Database]:
    c = server.client()
    d = c.wparse
    d.c.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    yield d
    c.drop_database("wparse")
    c.close()


GOOD_UPDATE = {"q": {"_id": 1}, "u": {"$set": {"a": 10}}}
GOOD_DELETE = {"q": {"_id": 1}, "limit": 1}
SAFE_BOOL = "[bool, long, int, decimal, double']"


def _update(*stmts: Any, **extra: Any) -> SON:
    return SON([("update", "c"), ("updates", list(stmts)), *extra.items()])


def _delete(*stmts: Any, **extra: Any) -> SON:
    return SON([("delete", "c"), ("deletes", list(stmts)), *extra.items()])


def _insert(*docs: Any, **extra: Any) -> SON:
    return SON([("insert", "c"), ("documents", list(docs)), *extra.items()])


def _wrong(path: str, actual: str, expected: str) -> str:
    return f"BSON field '{path}' is the wrong type '{actual}', expected type '{expected}'"


PARSE_ERRORS = [
    # statements of update: the bad one follows a good one, which must not run either
    (_update(GOOD_UPDATE, {"q": {}, "u": {"$set": {"b": 1}}, "arrayFilters": 5}), 14,
     _wrong("update.updates.arrayFilters", "int", "array")),
    (_update(GOOD_UPDATE, {"q": {}, "u": {"$set": {"b": 1}}, "arrayFilters": [5]}), 14,
     _wrong("update.updates.arrayFilters.0", "int", "object")),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "multi": "x"}), 14,
     _wrong("update.updates.multi", "string", "bool")),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "upsert": 1}), 14,
     _wrong("update.updates.upsert", "int", "bool")),
    (_update(GOOD_UPDATE, {"u": {"$set": {"b": 1}}}), 40414,
     "BSON field 'update.updates.q' is missing but a required field"),
    (_update(GOOD_UPDATE, {"q": None, "u": {"$set": {"b": 1}}}), 40414,
     "BSON field 'update.updates.q' is missing but a required field"),
    (_update(GOOD_UPDATE, {"q": {}}), 40414,
     "BSON field 'update.updates.u' is missing but a required field"),
    (_update(GOOD_UPDATE, {"q": 5, "u": {}}), 14, _wrong("update.updates.q", "int", "object")),
    (_update(GOOD_UPDATE, {"q": {}, "u": 5}), 9,
     "Update argument must be either an object or an array"),
    (_update(GOOD_UPDATE, {"q": {}, "u": [5]}), 14,
     "Each element of the 'pipeline' array must be an object"),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "collation": 5}), 14,
     _wrong("update.updates.collation", "int", "object")),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "hint": 5}), 9,
     "Hint must be a string or an object"),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "hint": Code("x")}), 9,
     "Hint must be a string or an object"),
    (_update(GOOD_UPDATE, {"q": {}, "u": {}, "foo": 1}), 40415,
     "BSON field 'update.updates.foo' is an unknown field."),
    (_update(GOOD_UPDATE, 5), 14, _wrong("update.updates.1", "int", "object")),
    (_update(GOOD_UPDATE, {"q": Code("x"), "u": {}}), 14,
     _wrong("update.updates.q", "javascript", "object")),
    # field order decides which error is reported, as the generated parser walks the fields
    (_update(SON([("u", 5), ("multi", "x")])), 9,
     "Update argument must be either an object or an array"),
    (_update(SON([("multi", "x"), ("u", 5)])), 14,
     _wrong("update.updates.multi", "string", "bool")),
    # statements of delete
    (_delete(GOOD_DELETE, {"q": {}, "limit": 2}), 9,
     "The limit field in delete objects must be 0 or 1. Got 2"),
    (_delete(GOOD_DELETE, {"q": {}, "limit": 0.5}), 9,
     "The limit field in delete objects must be 0 or 1. Got 0.5"),
    (_delete(GOOD_DELETE, {"q": {}, "limit": Int64(-1)}), 9,
     "The limit field in delete objects must be 0 or 1. Got -1"),
    (_delete(GOOD_DELETE, {"q": {}}), 40414,
     "BSON field 'delete.deletes.limit' is missing but a required field"),
    (_delete(GOOD_DELETE, {"limit": 0}), 40414,
     "BSON field 'delete.deletes.q' is missing but a required field"),
    (_delete(GOOD_DELETE, {"q": [], "limit": 0}), 14,
     _wrong("delete.deletes.q", "array", "object")),
    (_delete(GOOD_DELETE, {"q": {}, "limit": 0, "multi": True}), 40415,
     "BSON field 'delete.deletes.multi' is an unknown field."),
    (_delete(GOOD_DELETE, {"q": {}, "limit": 0, "hint": None}), 9,
     "Hint must be a string or an object"),
    (_delete(GOOD_DELETE, {"q": {}, "limit": 0, "collation": "fr"}), 14,
     _wrong("delete.deletes.collation", "string", "object")),
    # documents of insert
    (_insert({"_id": 3}, 5), 14, _wrong("insert.documents.1", "int", "object")),
    (_insert({"_id": 3}, Code("function() {}")), 14,
     _wrong("insert.documents.1", "javascript", "object")),
    (_insert(), 16, "Write batch sizes must be between 1 and 100000. Got 0 operations."),
    (_insert(None), 16, "Write batch sizes must be between 1 and 100000. Got 0 operations."),
    (_update(), 16, "Write batch sizes must be between 1 and 100000. Got 0 operations."),
    (SON([("delete", "c")]), 40414, "BSON field 'delete.deletes' is missing but a required field"),
    (SON([("insert", "c"), ("documents", {"0": {}})]), 14,
     _wrong("insert.documents", "object", "array")),
    # top-level fields
    (_insert({"_id": 3}, ordered=1), 14, _wrong("insert.ordered", "int", "bool")),
    (_update(GOOD_UPDATE, ordered="no"), 14, _wrong("update.ordered", "string", "bool")),
    (_delete(GOOD_DELETE, bypassDocumentValidation="yes"), 14,
     f"BSON field 'delete.bypassDocumentValidation' is the wrong type 'string', expected types "
     f"'{SAFE_BOOL}"),
    (_update(GOOD_UPDATE, let=5), 14, _wrong("update.let", "int", "object")),
    (_insert({"_id": 3}, let={}), 40415, "BSON field 'insert.let' is an unknown field."),
    (_insert({"_id": 3}, foo=1), 40415, "BSON field 'insert.foo' is an unknown field."),
    (_delete(GOOD_DELETE, upsert=True), 40415, "BSON field 'delete.upsert' is an unknown field."),
    (_insert({"_id": 3}, stmtId="x"), 14, _wrong("insert.stmtId", "string", "int")),
    (_insert({"_id": 3}, collectionUUID=Binary(b"x" * 16, 0)), 14,
     "BSON field 'insert.collectionUUID' is the wrong binData type 'general', expected type "
     "'UUID'"),
    (_insert({"_id": 3}, maxTimeMS="x"), 2, "maxTimeMS must be a number"),
    (_insert({"_id": 3}, maxTimeMS=None), 2, "maxTimeMS must be a number"),
    (_update(GOOD_UPDATE, maxTimeMS=-1), 2, "-1 value for maxTimeMS is out of range"),
    (_delete(GOOD_DELETE, maxTimeMS=2**31), 2, "2147483648 value for maxTimeMS is out of range"),
    (_delete(GOOD_DELETE, maxTimeMS=1.5), 2, "maxTimeMS has non-integral value"),
    (_insert({"_id": 3}, writeConcern=5), 14, _wrong("writeConcern", "int", "object")),
    (_insert({"_id": 3}, writeConcern={"w": True}), 9, "w has to be a number or string"),
    # pymongo sends the statements as a document sequence, which mongod parses after the body
    (_update({"q": {}, "u": {}, "multi": 1}, ordered="x"), 14,
     _wrong("update.ordered", "string", "bool")),
]


def _body_only(cmd: Mapping[str, Any]) -> bool:
    """pymongo sends a write's statements as an OP_MSG document sequence, which can only hold
    documents; other values can only come in the body, sent here over a raw socket."""
    field = {"insert": "documents", "update": "updates", "delete": "deletes"}.get(next(iter(cmd)))
    stmts = cmd.get(field) if field else None
    return stmts is not None and (
        not isinstance(stmts, list) or not all(isinstance(s, Mapping) for s in stmts))


def _raw_command(server: EmbeddedServer, body: Mapping[str, Any]) -> dict[str, Any]:
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    with socket.create_connection((HOST, server.port), timeout=20) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(payload), 1, 0, 2013) + payload)
        data = b""
        while len(data) < 16 or len(data) < struct.unpack("<i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            data += chunk
    return bson.decode(data[21:])


def _command_error(server: EmbeddedServer, db: Database, cmd: SON) -> dict[str, Any]:
    if _body_only(cmd):
        reply = _raw_command(server, SON([*cmd.items(), ("$db", db.name)]))
        assert reply["ok"] == 0.0, reply
        return reply
    with pytest.raises(OperationFailure) as info:
        db.command(cmd)
    assert info.value.details is not None
    return dict(info.value.details)


def _ids(case: tuple[SON, int, str]) -> str:
    return f"{next(iter(case[0]))}-{case[1]}-{case[2][:40]}"


@pytest.mark.parametrize(("cmd", "code", "errmsg"), PARSE_ERRORS, ids=map(_ids, PARSE_ERRORS))
def test_parse_errors_fail_the_whole_command(
    server: EmbeddedServer, db: Database, cmd: SON, code: int, errmsg: str
) -> None:
    reply = _command_error(server, db, cmd)
    assert (reply["ok"], reply["code"], reply["errmsg"]) == (0.0, code, errmsg)
    assert reply["codeName"] == {
        2: "BadValue", 9: "FailedToParse", 14: "TypeMismatch", 16: "InvalidLength",
        40414: "Location40414", 40415: "Location40415",
    }[code]
    assert "writeErrors" not in reply
    # nothing written: the good statements before the bad one did not run
    assert sorted(db.c.find(), key=lambda d: d["_id"]) == [{"_id": 1, "a": 1}, {"_id": 2, "a": 2}]


def test_statements_in_the_body_are_parsed_in_field_order(
    server: EmbeddedServer, db: Database
) -> None:
    bad = {"q": {}, "u": {}, "multi": 1}
    first = _raw_command(server, SON([("update", "c"), ("updates", [bad]), ("ordered", "x"),
                                      ("$db", db.name)]))
    assert (first["ok"], first["errmsg"]) == (0.0, _wrong("update.updates.multi", "int", "bool"))
    last = _raw_command(server, SON([("update", "c"), ("ordered", "x"), ("updates", [bad]),
                                     ("$db", db.name)]))
    assert (last["ok"], last["errmsg"]) == (0.0, _wrong("update.ordered", "string", "bool"))
    assert db.c.count_documents({}) == 2


def test_a_javascript_collection_name_is_refused(db: Database) -> None:
    with pytest.raises(OperationFailure) as info:
        db.command(SON([("insert", Code("c")), ("documents", [{"_id": 3}])]))
    assert info.value.details is not None
    assert info.value.details["errmsg"] == "collection name has invalid type javascript"
    assert db.c.count_documents({}) == 2


# -- what the IDL accepts ------------------------------------------------------------------


def test_safe_bool_accepts_numbers(db: Database) -> None:
    reply = db.command(_insert({"_id": 3}, bypassDocumentValidation=1))
    assert reply["n"] == 1
    reply = db.command(_insert({"_id": 4}, bypassDocumentValidation=Decimal128("0")))
    assert reply["n"] == 1


def test_comment_takes_any_type(db: Database) -> None:
    for i, comment in enumerate([5, "x", {"a": 1}, [1], None, Code("f")]):
        assert db.command(_insert({"_id": 10 + i}, comment=comment))["n"] == 1
    assert db.c.count_documents({"_id": {"$gte": 10}}) == 6


def test_nulls_are_absent_fields(server: EmbeddedServer, db: Database) -> None:
    """The IDL parser skips a null typed field (its default applies) and null array elements."""
    reply = db.command(_update({"q": {"_id": 1}, "u": {"$set": {"a": 5}}, "multi": None,
                                "upsert": None, "arrayFilters": None, "collation": None},
                               ordered=None, let=None))
    assert (reply["n"], reply["nModified"]) == (1, 1)
    reply = _raw_command(server, SON([*_insert(None, {"_id": 3}, None).items(), ("$db", db.name)]))
    assert (reply["ok"], reply["n"]) == (1.0, 1)
    assert db.c.count_documents({}) == 3


@pytest.mark.parametrize("limit", [0, 0.0, Int64(0), Decimal128("0"), None, "x", True])
def test_a_limit_that_reads_as_zero_deletes_every_match(db: Database, limit: Any) -> None:
    """readMultiDeleteProperty reads the limit with numberDouble: what is not a number is 0."""
    reply = db.command(_delete({"q": {}, "limit": limit}))
    assert reply["n"] == 2
    assert db.c.count_documents({}) == 0


@pytest.mark.parametrize("limit", [1, 1.0, Int64(1), Decimal128("1")])
def test_limit_one_deletes_one(db: Database, limit: Any) -> None:
    reply = db.command(_delete({"q": {}, "limit": limit}))
    assert reply["n"] == 1
    assert db.c.count_documents({}) == 1


def test_statement_fields_mongod_accepts(db: Database) -> None:
    reply = db.command(_update({"q": {"_id": 1}, "u": {"$set": {"a": 7}}, "hint": {"_id": 1},
                                "collation": {"locale": "simple"}, "c": {"x": 1}}))
    assert reply["n"] == 1
    reply = db.command(_delete({"q": {"_id": 2}, "limit": 1, "hint": "_id_"}))
    assert reply["n"] == 1
    assert list(db.c.find()) == [{"_id": 1, "a": 7}]


# -- execution errors stay per-statement write errors (ok: 1) ---------------------------------


EXECUTION_ERRORS = [
    (_update(GOOD_UPDATE, {"q": {}, "u": {"a": 1, "$set": {"b": 1}}}), 52),
    (_update(GOOD_UPDATE, {"q": {}, "u": {"$set": {"b": 1}, "c": 1}}), 9),
    (_update(GOOD_UPDATE, {"q": {"$bad": 1}, "u": {"$set": {"b": 1}}}), 2),
    (_update(GOOD_UPDATE, {"q": {}, "u": {"a": 1}, "multi": True}), 9),
    (_delete(GOOD_DELETE, {"q": {"$bad": 1}, "limit": 0}), 2),
    (_insert({"_id": 3}, {"_id": 1}), 11000),
]


@pytest.mark.parametrize(("cmd", "code"), EXECUTION_ERRORS, ids=map(str, range(6)))
def test_execution_errors_are_write_errors(db: Database, cmd: SON, code: int) -> None:
    reply = db.command(cmd)
    assert reply["ok"] == 1.0
    assert reply["n"] == 1  # the first statement ran
    assert [(e["index"], e["code"]) for e in reply["writeErrors"]] == [(1, code)]


# -- findAndModify ------------------------------------------------------------------------------


def _fam(**fields: Any) -> SON:
    return SON([("findAndModify", "c"), ("query", {"_id": 1}), *fields.items()])


FAM_PARSE_ERRORS = [
    (_fam(update={"$set": {"a": 3}}, foo=1), 40415,
     "BSON field 'findAndModify.foo' is an unknown field."),
    (_fam(update=5), 9, "Update argument must be either an object or an array"),
    (_fam(update=None), 9, "Update argument must be either an object or an array"),
    (_fam(update={"$set": {"a": 3}}, fields=5), 14,
     _wrong("findAndModify.fields", "int", "object")),
    (_fam(update={"$set": {"a": 3}}, hint=5), 9, "Hint must be a string or an object"),
    (_fam(remove="yes"), 14,
     f"BSON field 'findAndModify.remove' is the wrong type 'string', expected types "
     f"'{SAFE_BOOL}"),
    (_fam(update={"$set": {"a": 3}}, arrayFilters=[1]), 14,
     _wrong("findAndModify.arrayFilters.0", "int", "object")),
    (_fam(update={"$set": {"a": 3}}, singleBatch=1), 14,
     _wrong("findAndModify.singleBatch", "int", "bool")),
    (_fam(update={"$set": {"a": 3}}, maxTimeMS=-5), 2,
     "-5 value for maxTimeMS is out of range"),
]


@pytest.mark.parametrize(("cmd", "code", "errmsg"), FAM_PARSE_ERRORS,
                         ids=map(_ids, FAM_PARSE_ERRORS))
def test_find_and_modify_parse_errors(
    server: EmbeddedServer, db: Database, cmd: SON, code: int, errmsg: str
) -> None:
    reply = _command_error(server, db, cmd)
    assert (reply["ok"], reply["code"], reply["errmsg"]) == (0.0, code, errmsg)
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "a": 1}


def test_find_and_modify_safe_bools_take_numbers(db: Database) -> None:
    reply = db.command(_fam(update={"$set": {"a": 3}}, new=1))
    assert reply["value"] == {"_id": 1, "a": 3}
    reply = db.command(SON([("findAndModify", "c"), ("query", {"_id": 9}),
                            ("update", {"$set": {"a": 9}}), ("upsert", 1.0), ("new", 1)]))
    assert reply["value"] == {"_id": 9, "a": 9}
    reply = db.command(SON([("findAndModify", "c"), ("query", {"_id": 2}), ("remove", 1)]))
    assert reply["value"] == {"_id": 2, "a": 2}
    assert sorted(d["_id"] for d in db.c.find()) == [1, 9]
