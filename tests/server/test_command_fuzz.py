"""Every command the server answers, fuzzed with BSON values of every type.

Through pymongo (`db.command` with a raw codec, so replies are not interpreted), each example
sends one command: a registered name, a value in its value slot, and some of the fields
handlers read (filled with any BSON value, or with shapes close to valid ones so that the
checks below the top level are reached too). Properties:

- the server never answers 1 InternalError (what `run_command` makes of an exception no
  handler anticipated: every such reply is a missing typed error);
- every error reply is well formed: ok 0, an int code, the codeName of that code, an errmsg;
  write errors likewise;
- the connection stays open (a well-formed OP_MSG never gets a closed connection);
- afterwards the server still answers ping, and a change stream opened before the fuzzing
  still delivers an insert made after each example.

Session fields (`lsid`, `txnNumber`...) are replaced by pymongo's own, so they are fuzzed over a
raw socket at the end.
"""

from __future__ import annotations

import datetime
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import bson
import pytest
from bson import SON
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import OperationFailure

import cdcserver.server  # noqa: F401  (registers every command)
from cdcserver.commands import failpoints
from cdcserver.deployments.embedded import EMBEDDED
from cdcserver.testing import HOST, EmbeddedServer

RAW = CodecOptions(document_class=RawBSONDocument)
FUZZ_DB = "fz"
SENTINEL_DB = "fuzz_sentinel"  # never a fuzzed command's database: its stream must survive
# FUZZ_EXAMPLES=2000 pytest tests/server/test_command_fuzz.py hunts with fresh random inputs;
# by default the run is small and derandomized (the same inputs every time).
HUNT = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
HANG_GUARD_MS = 20_000  # a socket timeout against a hang, never a performance expectation

NAMES = sorted(EMBEDDED)  # every command the embedded store answers

# -- BSON values of every type ------------------------------------------------------------------

_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1).map(Int64)
_DECIMALS = st.sampled_from(["0", "1", "-1", "1.5", "NaN", "Infinity", "-Infinity", "1E+6144",
                             "-0", "9223372036854775808"]).map(Decimal128)
_STRINGS = st.one_of(
    st.sampled_from(["", "x", "$x", "a.b", "c", "system.views", "$", ".", "a..b", "admin",
                     "local", "oplog.rs", "fz.c", "majority", "alwaysOn", "off"]),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
            max_size=8),
)
_KEYS = st.one_of(
    st.sampled_from(["a", "_id", "$x", "$set", "$inc", "$match", "$gt", "a.b", "", "name",
                     "key", "q", "u", "$changeStream", "$jsonSchema", "enabled"]),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
            max_size=4),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), _INT32, _INT64,
    st.floats(allow_nan=True, allow_infinity=True), _DECIMALS, _STRINGS,
    st.builds(ObjectId), st.datetimes(min_value=datetime.datetime(1970, 1, 1),
                                      max_value=datetime.datetime(2100, 1, 1)),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    st.builds(Binary, st.binary(max_size=20), st.sampled_from([0, 3, 4, 5, 128])),
    st.sampled_from([Regex("a"), Regex("^x", "i"), MinKey(), MaxKey(), Code("x"),
                     Code("y", {"s": 1})]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(_KEYS, inner, max_size=3).map(SON),
    ),
    max_leaves=6,
)


def doc_of(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[SON]:
    """A document with some of `fields` (each drawn from its strategy), in any order."""
    keys = list(fields)

    @st.composite
    def build(draw: st.DrawFn) -> SON:
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys)))
        return SON((k, draw(fields[k])) for k in chosen)

    return build()


ANY_OR = lambda *good: st.one_of(VALUES, *good)  # noqa: E731
_FILTERS = ANY_OR(st.just({}), st.fixed_dictionaries({"a": VALUES}),
                  st.fixed_dictionaries({"a": st.dictionaries(
                      st.sampled_from(["$gt", "$in", "$size", "$type", "$exists", "$regex",
                                       "$elemMatch", "$mod", "$all", "$not", "$eq"]),
                      VALUES, min_size=1, max_size=1)}))
_UPDATES = ANY_OR(
    st.fixed_dictionaries({"$set": st.fixed_dictionaries({"a": VALUES})}),
    st.fixed_dictionaries({"$inc": st.fixed_dictionaries({"a": VALUES})}),
    st.dictionaries(st.sampled_from(["$set", "$unset", "$push", "$pull", "$rename", "$min",
                                     "$currentDate", "$addToSet", "$pop", "$mul", "$bit"]),
                    VALUES, min_size=1, max_size=2),
    st.lists(st.dictionaries(st.sampled_from(["$set", "$unset", "$project", "$replaceWith"]),
                             VALUES, min_size=1, max_size=1), max_size=2),
)
_STAGES = st.one_of(
    VALUES,
    st.dictionaries(
        st.sampled_from(["$match", "$project", "$group", "$sort", "$limit", "$skip", "$unwind",
                         "$count", "$addFields", "$set", "$unset", "$replaceRoot", "$out",
                         "$lookup", "$changeStream", "$facet", "$sample", "$bogus"]),
        VALUES, min_size=1, max_size=1),
    st.fixed_dictionaries({"$changeStream": doc_of(
        fullDocument=VALUES, fullDocumentBeforeChange=VALUES, resumeAfter=VALUES,
        startAfter=VALUES, startAtOperationTime=VALUES, showExpandedEvents=VALUES,
        allChangesForCluster=VALUES, bogus=VALUES)}),
)
_PIPELINES = ANY_OR(st.lists(_STAGES, max_size=3))
_CURSOR = ANY_OR(doc_of(batchSize=VALUES, bogus=VALUES))
_INDEX_SPECS = ANY_OR(doc_of(key=ANY_OR(st.fixed_dictionaries({"a": VALUES})), name=VALUES,
                             unique=VALUES, sparse=VALUES, expireAfterSeconds=VALUES,
                             partialFilterExpression=_FILTERS, collation=VALUES, bogus=VALUES))
_WRITE_CONCERN = ANY_OR(doc_of(w=VALUES, j=VALUES, wtimeout=VALUES, fsync=VALUES))

# The fields handlers read, with what to put in them.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "filter": _FILTERS, "query": _FILTERS, "q": _FILTERS,
    "projection": VALUES, "fields": VALUES, "sort": VALUES, "hint": VALUES,
    "limit": VALUES, "skip": VALUES, "batchSize": VALUES, "maxTimeMS": VALUES,
    "pipeline": _PIPELINES, "cursor": _CURSOR,
    "update": _UPDATES, "u": _UPDATES, "upsert": VALUES, "new": VALUES, "remove": VALUES,
    "arrayFilters": ANY_OR(st.lists(VALUES, max_size=2)),
    "updates": st.lists(doc_of(q=_FILTERS, u=_UPDATES, multi=VALUES, upsert=VALUES,
                               arrayFilters=VALUES, hint=VALUES, collation=VALUES, c=VALUES,
                               bogus=VALUES), max_size=2),
    "deletes": st.lists(doc_of(q=_FILTERS, limit=VALUES, hint=VALUES, collation=VALUES,
                               bogus=VALUES), max_size=2),
    "documents": st.lists(st.dictionaries(_KEYS, VALUES, max_size=3).map(SON), max_size=3),
    "key": VALUES, "indexes": ANY_OR(st.lists(_INDEX_SPECS, max_size=2)), "index": VALUES,
    "to": VALUES, "dropTarget": VALUES, "viewOn": VALUES, "validator": ANY_OR(
        st.fixed_dictionaries({"$jsonSchema": VALUES})),
    "validationLevel": VALUES, "validationAction": VALUES, "capped": VALUES, "size": VALUES,
    "max": VALUES, "changeStreamPreAndPostImages": ANY_OR(doc_of(enabled=VALUES)),
    "expireAfterSeconds": VALUES, "timeseries": VALUES, "clusteredIndex": VALUES,
    "collation": VALUES, "collection": VALUES, "cursors": ANY_OR(st.lists(VALUES, max_size=2)),
    "id": VALUES, "ordered": VALUES, "bypassDocumentValidation": VALUES,
    "writeConcern": _WRITE_CONCERN, "readConcern": ANY_OR(doc_of(
        level=VALUES, afterClusterTime=VALUES)), "comment": VALUES, "let": VALUES,
    "singleBatch": VALUES, "tailable": VALUES, "awaitData": VALUES, "nameOnly": VALUES,
    "authorizedCollections": VALUES, "explain": VALUES, "allowDiskUse": VALUES,
    "showRecordId": VALUES, "returnKey": VALUES, "min": VALUES, "noCursorTimeout": VALUES,
    "mechanism": VALUES, "payload": VALUES, "conversationId": VALUES, "user": VALUES,
    "mode": VALUES, "data": ANY_OR(doc_of(
        failCommands=VALUES, errorCode=VALUES, closeConnection=VALUES, errorLabels=VALUES,
        blockConnection=VALUES, blockTimeMS=st.integers(0, 5), appName=VALUES,
        namespace=VALUES, writeConcernError=VALUES, failInternalCommands=VALUES)),
    "client": VALUES, "compression": VALUES, "saslSupportedMechs": VALUES, "helloOk": VALUES,
    "speculativeAuthenticate": VALUES, "topologyVersion": VALUES, "maxAwaitTimeMS": VALUES,
    "featureCompatibilityVersion": VALUES, "allParameters": VALUES, "scale": VALUES,
    "dbStats": VALUES, "showExpandedEvents": VALUES, "bogus": VALUES,
}
# mongod answers hello's awaitable form after maxAwaitTimeMS; keep that wait bounded.
_SMALL_WAIT = st.integers(0, 5)


def value_slot(name: str) -> st.SearchStrategy[Any]:
    """What goes in the command's own value: a plausible value most of the time."""
    good: list[Any] = [1, "c"]
    if name in ("getMore", "$getMore"):
        good = [Int64(1), Int64(0)]
    if name == "renameCollection":
        good = ["fz.c", "fz.d"]
    if name == "configureFailPoint":
        good = list(failpoints.FAIL_POINT_NAMES)
    return st.one_of(st.sampled_from(good), VALUES)


@st.composite
def commands(draw: st.DrawFn, name: str) -> tuple[str, SON]:
    cmd = SON([(name, draw(value_slot(name)))])
    for field in draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=4)):
        if field == name:
            continue
        strategy = _SMALL_WAIT if field == "maxAwaitTimeMS" else FIELDS[field]
        if name in ("insert", "update", "delete") and field in ("documents", "updates",
                                                                "deletes"):
            cmd[field] = draw(FIELDS[field])  # pymongo sends these as document sequences
        elif field in ("documents", "updates", "deletes"):
            cmd[field] = draw(st.one_of(VALUES, FIELDS[field]))
        else:
            cmd[field] = draw(strategy)
    if name in ("insert", "update", "delete"):
        # pymongo can only send a list of documents there (as an OP_MSG document sequence).
        seq = {"insert": "documents", "update": "updates", "delete": "deletes"}[name]
        if not isinstance(cmd.get(seq, []), list):
            del cmd[seq]
    db = "admin" if name in ("renameCollection", "configureFailPoint") else FUZZ_DB
    return db, cmd


# -- the world ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_client(server: EmbeddedServer) -> Iterator[Any]:
    c = server.client(socketTimeoutMS=HANG_GUARD_MS, retryReads=False, retryWrites=False)
    yield c
    c.close()


@pytest.fixture(scope="module")
def watch(server: EmbeddedServer) -> Iterator[Any]:
    """A change stream on its own client, opened before any fuzzing; call to check that it
    still delivers a new insert and that the server still answers ping."""
    client = server.client()
    coll = client[SENTINEL_DB].s
    stream = coll.watch(max_await_time_ms=100)
    assert stream.try_next() is None  # open on the server
    counter = iter(range(1 << 30))

    def still_served() -> None:
        key = next(counter)
        coll.insert_one({"_id": key})
        for _ in range(200):  # bounded: an iteration is one awaitData getMore
            event = stream.try_next()
            if event is not None:
                assert event["operationType"] == "insert"
                assert event["documentKey"] == {"_id": key}
                break
        else:
            pytest.fail("the change stream stopped delivering")
        assert client.admin.command("ping")["ok"] == 1.0

    yield still_served
    stream.close()
    client.close()


# error_codes.yml names that cdcserver/auth.py and cdcserver/wire/ give their errors themselves.
_MORE_CODE_NAMES = {17: "ProtocolError", 22: "InvalidBSON", 10334: "BSONObjectTooLarge",
                    334: "MechanismUnavailable"}


def code_name(code: int) -> str:
    return _MORE_CODE_NAMES.get(code) or failpoints.code_name(code)


def check_reply(cmd: Mapping[str, Any], reply: Mapping[str, Any]) -> None:
    """A well-formed reply, and no InternalError anywhere in it."""
    if reply.get("ok") != 1:
        code = reply.get("code")
        assert reply.get("ok") == 0, (cmd, reply)
        assert isinstance(code, int) and not isinstance(code, bool), (cmd, reply)
        assert code != 1, f"InternalError leaked for {cmd!r}: {reply['errmsg']}"
        assert reply.get("codeName") == code_name(code), (cmd, reply)
        assert isinstance(reply.get("errmsg"), str), (cmd, reply)
    for err in reply.get("writeErrors") or []:
        assert isinstance(err["code"], int) and err["code"] != 1, (cmd, reply)
        assert isinstance(err["errmsg"], str), (cmd, reply)


def send(client: Any, db: str, cmd: SON) -> None:
    try:
        reply = client.get_database(db, codec_options=RAW).command(cmd)
    except OperationFailure as exc:
        reply = exc.details
    decoded = bson.decode(reply.raw) if isinstance(reply, RawBSONDocument) else reply
    check_reply(cmd, decoded)


def reset_fail_points(server: EmbeddedServer) -> None:
    server.call(lambda: failpoints.fail_points(server.state).reset())


@pytest.mark.parametrize("name", NAMES)
def test_command_fuzz(server, fuzz_client, watch, name):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not HUNT,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(commands(name))
    def run(db_cmd: tuple[str, SON]) -> None:
        db, cmd = db_cmd
        try:
            send(fuzz_client, db, cmd)
        finally:
            reset_fail_points(server)  # a configured fail point must not outlive its example
        watch()

    run()


def test_known_leaks_stay_fixed(server, fuzz_client, watch):
    """Inputs that used to come back as InternalError, each with mongod's typed error."""
    cases: list[tuple[str, SON, int]] = [
        (FUZZ_DB, SON([("$getMore", Int64(1))]), 59),
        (FUZZ_DB, SON([("find", "c"), ("limit", float("nan"))]), 0),
        (FUZZ_DB, SON([("find", "c"), ("skip", float("inf"))]), 0),
        (FUZZ_DB, SON([("find", Code("c"))]), 73),
        (FUZZ_DB, SON([("listIndexes", "c"), ("cursor", {"batchSize": "x"})]), 14),
        (FUZZ_DB, SON([("listCollections", 1), ("filter", 5)]), 14),
        (FUZZ_DB, SON([("find", "c"), ("filter", {"a": {"$size": float("nan")}})]), 2),
        (FUZZ_DB, SON([("find", "c"), ("filter", {"a": {"$type": Code("x")}})]), 14),
        (FUZZ_DB, SON([("update", "c"), ("updates", [
            {"q": {}, "u": {"$set": {"a": 1}}, "arrayFilters": 5}])]), 14),
        (FUZZ_DB, SON([("getMore", Int64(1)), ("collection", 5)]), 14),
    ]
    for db, cmd, code in cases:
        try:
            reply = fuzz_client.get_database(db).command(cmd)
            # a statement's error is a write error (ok: 1), as the embedded store reports it
            got = (reply.get("writeErrors") or [{"code": 0}])[0]["code"]
        except OperationFailure as exc:
            got = exc.code
        assert got == code, (cmd, got)
    watch()


# -- session fields, over a raw socket (pymongo would put its own lsid there) -------------------


def _op_msg(body: Mapping[str, Any], request_id: int) -> bytes:
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection on a well-formed OP_MSG"
        data += chunk
    return data


def raw_command(sock: socket.socket, body: Mapping[str, Any], request_id: int) -> dict:
    sock.sendall(_op_msg(body, request_id))
    length, _, response_to, _ = struct.unpack("<iiii", _recv_exact(sock, 16))
    rest = _recv_exact(sock, length - 16)
    assert response_to == request_id
    return bson.decode(rest[5:])


_LSIDS = st.one_of(VALUES, doc_of(
    id=st.one_of(VALUES, st.builds(lambda b: Binary(b, 4), st.binary(min_size=15, max_size=17))),
    uid=VALUES, txnNumber=VALUES, bogus=VALUES))
_SESSION_FIELDS = doc_of(lsid=_LSIDS, txnNumber=VALUES, autocommit=VALUES,
                         startTransaction=VALUES, stmtId=VALUES)


@settings(max_examples=3 * EXAMPLES, deadline=None, derandomize=not HUNT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["find", "insert", "update", "delete", "aggregate", "count",
                             "commitTransaction", "abortTransaction", "ping", "create"]),
       session=_SESSION_FIELDS)
def test_session_fields_fuzz(server, watch, name, session):
    body = SON([(name, "c"), ("$db", "admin" if "Transaction" in name else FUZZ_DB)])
    if name == "insert":
        body["documents"] = [{"x": 1}]
    body.update(session)
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_MS / 1000) as sock:
        check_reply(body, raw_command(sock, body, 7))
        assert raw_command(sock, {"ping": 1, "$db": "admin"}, 8)["ok"] == 1.0
    watch()


# -- nesting depth around mongod's limits ------------------------------------------------------
# A message's documents may nest 200 levels below their top (201 frames, counting the top and
# every object or array; 15 Overflow for the request past that); a stored document's fields may
# be 180 levels down (15 Overflow for that write past that: insert's and update's messages).

MESSAGE_FRAMES, STORAGE_LEVELS = 201, 180
_DEPTHS = st.sampled_from([178, 179, 180, 181, 182, 196, 197, 198, 199, 200, 201, 202, 203])
# Where the nested value goes in each command, and how many frames come before it (pymongo
# sends insert's documents and update's statements as document sequences: each its own top).
_PLACES = {
    "insert": 1,  # the document
    "find": 2,  # body, filter
    "match": 4,  # body, pipeline, stage, $match
    "update": 3,  # statement, u, $set
    "findAndModify": 3,  # body, update, $set
    "resumeAfter": 4,  # body, pipeline, stage, $changeStream
}


@st.composite
def nested_values(draw: st.DrawFn) -> tuple[Any, int, int]:
    """(value, its frames: objects and arrays, its field levels: non-empty ones) for a value
    of objects and arrays nested around the limits, with a scalar or an empty container at the
    bottom."""
    levels = draw(_DEPTHS)
    kinds = draw(st.lists(st.sampled_from("dl"), min_size=levels, max_size=levels))
    key = draw(st.sampled_from(["a", "b", "$x", "0"]))
    leaf = draw(st.one_of(st.sampled_from([1, "s", None, {}, []]), SCALARS))
    value = leaf
    for kind in kinds:
        value = [value] if kind == "l" else {key: value}
    empty_leaf = isinstance(leaf, (dict, list)) and not leaf
    return value, levels + empty_leaf, levels


def depth_command(place: str, value: Any, n: int) -> SON:
    if place == "insert":
        return SON([("insert", "deep"), ("documents", [{"_id": n, "x": value}])])
    if place == "find":
        return SON([("find", "deep"), ("filter", {"x": value})])
    if place == "match":
        return SON([("aggregate", "deep"), ("pipeline", [{"$match": {"x": value}}]),
                    ("cursor", {})])
    if place == "update":
        return SON([("update", "deep"), ("updates", [
            {"q": {"_id": n}, "u": {"$set": {"x": value}}, "upsert": True}])])
    if place == "findAndModify":
        return SON([("findAndModify", "deep"), ("query", {"_id": n}),
                    ("update", {"$set": {"x": value}}), ("upsert", True)])
    return SON([("aggregate", "deep"), ("pipeline", [{"$changeStream": {"resumeAfter": value}}]),
                ("cursor", {})])


_DEPTH_IDS = iter(range(1 << 30))


@settings(max_examples=3 * EXAMPLES, deadline=None, derandomize=not HUNT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(place=st.sampled_from(sorted(_PLACES)), nested=nested_values())
def test_nesting_depth_around_limits(server, fuzz_client, watch, place, nested):
    value, frames, levels = nested
    frames += _PLACES[place]
    stored_levels = levels + 1  # the value is a top-level field's: level 1 is that field
    cmd = depth_command(place, value, next(_DEPTH_IDS))
    try:
        reply = fuzz_client.get_database(FUZZ_DB).command(cmd)
    except OperationFailure as exc:
        reply = exc.details
    check_reply(cmd, reply)
    errors = reply.get("writeErrors") or []
    if frames > MESSAGE_FRAMES:
        assert reply["code"] == 15, (frames, reply)
        assert reply["errmsg"].startswith(
            "BSONObj exceeds maximum nested object depth in element with field name"), reply
        return
    assert reply.get("code") != 15 or place in ("update", "findAndModify"), reply
    if place == "insert":
        expected = [15] if stored_levels > STORAGE_LEVELS else []
        assert [e["code"] for e in errors] == expected, (stored_levels, reply)
        if expected:
            assert errors[0]["errmsg"] == (
                "cannot insert document because it exceeds 180 levels of nesting")
    elif place in ("update", "findAndModify") and stored_levels > STORAGE_LEVELS:
        err = errors[0] if place == "update" else reply
        assert err["code"] == 15, (stored_levels, reply)
        assert err["errmsg"].endswith("Document exceeds maximum nesting depth of 180"), reply
    elif place in ("update", "findAndModify"):
        assert not errors and reply["ok"] == 1.0, (stored_levels, reply)
    watch()
