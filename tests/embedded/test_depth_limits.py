"""Nesting depth around each of mongod's limits, through pymongo (and a raw socket for what
pymongo cannot encode): never 1 InternalError, always mongod's code and message.

- A message's document may nest 200 levels below its top (`BSONDepth::getMaxAllowableDepth()`,
  201 frames in validateBSON); one more is 15 Overflow for the whole request, "BSONObj exceeds
  maximum nested object depth in element with field name '<path>' in object with <_id>".
- A stored document may have fields 180 levels down (`getMaxDepthForUserStorage()`); 181 is
  15 Overflow: insert's "cannot insert document because it exceeds 180 levels of nesting",
  an update's or upsert's "Document exceeds maximum nesting depth of 180" (a write error).
- An upsert into a collection whose name insert refuses (a NUL) is 73 InvalidNamespace.

Depths are counted as mongod counts them: "levels" of a stored document are its field depth
(top-level fields are level 1); "frames" of a message document count the top document and
every object or array value below it.
"""

from __future__ import annotations

import datetime
import socket
import struct

import bson
import pytest
from bson import SON, ObjectId, Timestamp
from pymongo.errors import BulkWriteError, OperationFailure, WriteError

from cdcserver.testing import HOST

STORAGE = 180  # BSONDepth::getMaxDepthForUserStorage()
FRAMES = 201  # BSONDepth::getMaxAllowableDepth() + the top document
INSERT_MSG = "cannot insert document because it exceeds 180 levels of nesting"
UPDATE_MSG = "Document exceeds maximum nesting depth of 180"
MESSAGE_MSG = "BSONObj exceeds maximum nested object depth in element with field name"
HANG_GUARD_S = 20.0


def nest(n: int, leaf=1, key: str = "a"):
    """n nested one-field documents around `leaf`."""
    value = leaf
    for _ in range(n):
        value = {key: value}
    return value


def nest_arrays(n: int):
    value = 1
    for _ in range(n):
        value = [value]
    return value


def with_levels(levels: int, _id) -> dict:
    """A document whose deepest field is `levels` levels down."""
    return {"_id": _id, "x": nest(levels - 1)}


def assert_overflow(exc: OperationFailure, message: str) -> None:
    assert exc.code == 15, exc.details
    if not isinstance(exc, WriteError):  # a write error is {index, code, errmsg}
        assert exc.details["codeName"] == "Overflow", exc.details
    assert message in exc.details["errmsg"], exc.details


@pytest.fixture
def coll(client, request):
    c = client.depth[request.node.name.replace("[", "_").replace("]", "")]
    c.drop()
    return c


@pytest.mark.parametrize("levels", [STORAGE - 1, STORAGE])
def test_insert_within_storage_depth(coll, levels):
    coll.insert_one(with_levels(levels, 1))
    coll.insert_one({"_id": 2, "x": nest_arrays(levels - 1)})
    assert coll.count_documents({}) == 2
    assert coll.find_one({"_id": 1}) == with_levels(levels, 1)


@pytest.mark.parametrize("levels", [STORAGE + 1, STORAGE + 2, FRAMES])
def test_insert_deeper_than_storage_depth(coll, levels):
    for doc in (with_levels(levels, 1), {"_id": 1, "x": nest_arrays(levels - 1)}):
        with pytest.raises(WriteError) as info:
            coll.insert_one(doc)
        assert info.value.code == 15 and info.value.details["errmsg"] == INSERT_MSG
    assert coll.count_documents({}) == 0


def test_empty_document_below_the_limit_is_not_a_level(coll):
    """validateDepth: empty subdocuments do not count toward the depth."""
    coll.insert_one({"_id": 1, "x": nest(STORAGE - 1, {})})
    coll.insert_one({"_id": 2, "x": nest(STORAGE - 1, [])})
    assert coll.count_documents({}) == 2


def test_insert_batch_reports_each_deep_document(coll):
    docs = [with_levels(3, 0), with_levels(STORAGE + 1, 1), with_levels(STORAGE, 2)]
    with pytest.raises(BulkWriteError) as info:
        coll.insert_many(docs, ordered=False)
    errors = info.value.details["writeErrors"]
    assert [(e["index"], e["code"], e["errmsg"]) for e in errors] == [(1, 15, INSERT_MSG)]
    assert sorted(d["_id"] for d in coll.find()) == [0, 2]


@pytest.mark.parametrize("frames", [FRAMES + 1, FRAMES + 50, 400])
def test_message_deeper_than_allowed(coll, frames):
    """The insert's document sequence entry is the validated document: 202 frames fail the
    whole command at parse (not a write error), with the path and the _id read before it."""
    with pytest.raises(OperationFailure) as info:
        coll.insert_one({"_id": 7, "x": nest(frames - 1)})
    assert not isinstance(info.value, WriteError)
    assert_overflow(info.value, MESSAGE_MSG)
    path = "x" + ".a" * (FRAMES - 1)  # the names of 200 frames, then the overflowing element
    assert info.value.details["errmsg"] == f"{MESSAGE_MSG} '{path}' in object with _id: 7"


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_find_filter_around_message_depth(coll, extra):
    # body (1) + filter (2) + x's value nest(k): 2 + k frames
    k = FRAMES - 2 + extra
    coll.insert_one({"_id": 1})
    if extra <= 0:
        assert list(coll.find({"x": nest(k)})) == []
    else:
        with pytest.raises(OperationFailure) as info:
            list(coll.find({"x": nest(k)}))
        assert_overflow(info.value, MESSAGE_MSG)
        assert info.value.details["errmsg"].endswith("in object with unknown _id")


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_match_around_message_depth(coll, extra):
    # body, pipeline, stage, $match: 4 frames, then x's value
    k = FRAMES - 4 + extra
    coll.insert_one({"_id": 1})
    if extra <= 0:
        assert list(coll.aggregate([{"$match": {"x": nest(k)}}])) == []
    else:
        with pytest.raises(OperationFailure) as info:
            list(coll.aggregate([{"$match": {"x": nest(k)}}]))
        assert_overflow(info.value, "field name 'pipeline.0.$match.x.a.a")


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_resume_after_around_message_depth(coll, extra):
    # body, pipeline, stage, $changeStream: 4 frames, then resumeAfter = nest(k)
    k = FRAMES - 4 + extra
    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=nest(k))
    if extra <= 0:
        assert info.value.code == 40647, info.value.details  # a bad token, not a crash
    else:
        assert_overflow(info.value, "field name 'pipeline.0.$changeStream.resumeAfter.a.a")


@pytest.mark.parametrize("levels", [STORAGE - 1, STORAGE, STORAGE + 1, FRAMES - 2])
def test_update_around_storage_depth(coll, levels):
    # The statement {q, u: {$set: {y: nest(levels - 1)}}}: 3 + levels - 1 frames, within the
    # message limit; the stored document's y field reaches `levels`.
    coll.insert_one({"_id": 1})
    update = {"$set": {"y": nest(levels - 1)}}
    if levels <= STORAGE:
        assert coll.update_one({"_id": 1}, update).modified_count == 1
        assert coll.find_one_and_update({"_id": 2}, update, upsert=True) is None
        assert coll.update_one({"_id": 3}, update, upsert=True).upserted_id == 3
        assert coll.replace_one({"_id": 4}, {"y": nest(levels - 1)}, upsert=True).upserted_id == 4
        return
    for run in (
        lambda: coll.update_one({"_id": 1}, update),
        lambda: coll.update_one({"_id": 5}, update, upsert=True),
        lambda: coll.replace_one({"_id": 1}, {"y": nest(levels - 1)}),
        lambda: coll.replace_one({"_id": 5}, {"y": nest(levels - 1)}, upsert=True),
        lambda: coll.find_one_and_update({"_id": 1}, update),
        lambda: coll.find_one_and_update({"_id": 5}, update, upsert=True),
    ):
        with pytest.raises(OperationFailure) as info:
            run()
        assert_overflow(info.value, UPDATE_MSG)
    assert list(coll.find()) == [{"_id": 1}]


def test_update_message_deeper_than_allowed(coll):
    coll.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as info:
        coll.update_one({"_id": 1}, {"$set": {"y": nest(FRAMES - 2)}})  # 3 + 199 frames
    assert_overflow(info.value, "field name 'u.$set.y.a.a")
    assert coll.find_one() == {"_id": 1}


def test_upsert_into_invalid_collection_name(client):
    """A collection name with a NUL fails the whole command, as mongod 8.0's NamespaceString
    refuses it while the command is parsed (73): an insert, and the upserts that would create
    it, instead of a Python error (tests/embedded/test_namespace_nul.py)."""
    db = client.depth
    name = "a\x00b"
    expected = (73, "namespaces cannot have embedded null characters")
    with pytest.raises(OperationFailure) as info:
        db.command(SON([("insert", name), ("documents", [{"_id": 1}])]))
    assert (info.value.code, info.value.details["errmsg"]) == expected
    for u in ({"$set": {"a": 1}}, {"a": 1}, [{"$set": {"a": 1}}]):
        with pytest.raises(OperationFailure) as info:
            db.command(SON([("update", name),
                            ("updates", [{"q": {"_id": 1}, "u": u, "upsert": True}])]))
        assert (info.value.code, info.value.details["errmsg"]) == expected
        with pytest.raises(OperationFailure) as info:
            db.command(SON([("findAndModify", name), ("query", {"_id": 1}), ("update", u),
                            ("upsert", True)]))
        assert (info.value.code, info.value.details["errmsg"]) == expected
    assert name not in db.list_collection_names()


def _deep_bson(levels: int) -> bytes:
    """{a: {a: ... {}}}, `levels` objects deep, built by hand (pymongo's encoder recurses)."""
    inner = b"\x05\x00\x00\x00\x00"
    for _ in range(levels):
        body = b"\x03a\x00" + inner + b"\x00"
        inner = struct.pack("<i", len(body) + 4) + body
    return inner


def test_nesting_past_the_decoder_recursion(server):
    """5000 levels: too deep for the C decoder (it recurses). The answer is still mongod's
    15 for that request, and the connection goes on."""
    body = bson.encode(SON([("find", "c"), ("$db", "depth")]))
    deep = b"\x03filter\x00" + _deep_bson(5000)
    body = struct.pack("<i", len(body) + len(deep)) + body[4:-1] + deep + b"\x00"
    message = struct.pack("<I", 0) + b"\x00" + body
    ping = struct.pack("<I", 0) + b"\x00" + bson.encode({"ping": 1, "$db": "admin"})
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S) as sock:
        for rid, payload in ((1, message), (2, ping)):
            sock.sendall(struct.pack("<iiii", 16 + len(payload), rid, 0, 2013) + payload)
        replies = {}
        for _ in range(2):
            header = _recv(sock, 16)
            length, _, response_to, _ = struct.unpack("<iiii", header)
            replies[response_to] = bson.decode(_recv(sock, length - 16)[5:])
    assert replies[1]["code"] == 15 and replies[1]["errmsg"].startswith(MESSAGE_MSG)
    assert replies[1]["errmsg"].endswith("in object with unknown _id")
    assert replies[2]["ok"] == 1.0


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


@pytest.mark.parametrize("_id, text", [
    ("s", '"s"'),
    (ObjectId("0123456789abcdef01234567"), "ObjectId('0123456789abcdef01234567')"),
    (datetime.datetime(2020, 1, 1), "new Date(1577836800000)"),
    (Timestamp(3, 4), "Timestamp(3, 4)"),
])
def test_message_depth_error_names_the_id(coll, _id, text):
    with pytest.raises(OperationFailure) as info:
        coll.insert_one({"_id": _id, "x": nest(FRAMES)})
    assert info.value.details["errmsg"].endswith(f"in object with _id: {text}")
