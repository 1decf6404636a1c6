"""A retryable findAndModify retried after a restart answers as the first time: mongod 8.0 keeps
its pre- or post-image in `config.image_collection` and marks its oplog entry with
`needsRetryImage`; cdcserver's embedded store does the same (durably, in SQLite).

The commands go over a raw socket: pymongo puts its own session's `lsid` on every command, and
the retry must carry the first attempt's `lsid` to a restarted server."""

from __future__ import annotations

import socket
import struct
import uuid

import bson
from bson.binary import Binary
from bson.int64 import Int64
from bson.son import SON

from cdcserver.testing import EmbeddedServer

OP_MSG = 2013
LSID = {"id": Binary(uuid.uuid4().bytes, 4)}
ENTRY_ORDER = ["lsid", "txnNumber", "op", "ns", "ui", "o", "o2", "needsRetryImage", "stmtId",
               "ts", "t", "v", "wall", "prevOpTime"]


def raw_command(server: EmbeddedServer, cmd: SON) -> dict:
    body = bson.encode(cmd)
    payload = struct.pack("<I", 0) + b"\x00" + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(payload), 1, 0, OP_MSG) + payload)
        header = b""
        while len(header) < 16:
            header += sock.recv(16 - len(header))
        length = struct.unpack_from("<i", header)[0]
        rest = b""
        while len(rest) < length - 16:
            rest += sock.recv(length - 16 - len(rest))
    return bson.decode(rest[5:])


def fam(txn_number: int, **fields) -> SON:
    cmd = SON([("findAndModify", "c")])
    cmd.update(fields)
    cmd.update({"lsid": LSID, "txnNumber": Int64(txn_number), "$db": "r"})
    return cmd


def _reply(doc: dict) -> dict:
    return {k: doc[k] for k in ("lastErrorObject", "value", "ok") if k in doc}


CASES = [  # (findAndModify fields, the entry's needsRetryImage or None)
    ({"query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "new": True}, "postImage"),
    ({"query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "fields": {"n": 1, "_id": 0}},
     "preImage"),
    ({"query": {"_id": 2}, "update": {"_id": 2, "r": 1}}, "preImage"),
    ({"query": {"_id": 3}, "remove": True}, "preImage"),
    ({"query": {"_id": 4}, "update": {"$set": {"u": 1}}, "upsert": True, "new": True}, None),
]


def test_findandmodify_retried_after_a_restart_gets_the_same_reply(tmp_path):
    data = tmp_path / "data"
    firsts = []
    with EmbeddedServer(data) as server, server.client() as client:
        client.r.c.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0}])
        for k, (fields, image) in enumerate(CASES, start=1):
            first = raw_command(server, fam(k, **fields))
            assert first["ok"] == 1.0, first
            again = raw_command(server, fam(k, **fields))  # same server: the same reply
            assert _reply(again) == _reply(first)
            entry = server.entries()[-1]
            assert list(entry) == [f for f in ENTRY_ORDER if f in entry]
            assert entry.get("needsRetryImage") == image
            firsts.append(first)
        documents = list(client.r.c.find())
        images = server.store.image_collection()
        oplog_length = len(server.entries())
    [image_doc] = images  # one per session: the latest statement's
    assert list(image_doc) == ["_id", "txnNum", "ts", "imageKind", "image", "invalidated"]
    assert image_doc["_id"]["id"] == LSID["id"] and image_doc["invalidated"] is False
    assert image_doc["txnNum"] == 4 and image_doc["imageKind"] == "preImage"
    assert image_doc["image"] == {"_id": 3, "n": 0}

    with EmbeddedServer(data) as server, server.client() as client:
        # the newest statement (an upsert) is rebuilt from its entry
        retried = raw_command(server, fam(5, **CASES[4][0]))
        assert _reply(retried) == _reply(firsts[4])
        assert firsts[4]["value"] == {"_id": 4, "u": 1}
        # mongod remembers the newest txnNumber of a session only
        older = raw_command(server, fam(4, **CASES[3][0]))
        assert (older["ok"], older["code"]) == (0.0, 225)
        assert list(client.r.c.find()) == documents  # nothing applied twice
        assert len(server.entries()) == oplog_length


def test_image_survives_a_restart_for_each_kind(tmp_path):
    """Each kind of image, retried after its own restart."""
    data = tmp_path / "data"
    with EmbeddedServer(data) as server, server.client() as client:
        client.r.c.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}, {"_id": 3, "n": 0}])
    for k, (fields, _) in enumerate(CASES[:4], start=10):
        with EmbeddedServer(data) as server:
            first = raw_command(server, fam(k, **fields))
        with EmbeddedServer(data) as server:
            retried = raw_command(server, fam(k, **fields))
        assert _reply(retried) == _reply(first)


def test_change_events_do_not_carry_needs_retry_image(tmp_path):
    with EmbeddedServer(tmp_path / "data") as server, server.client() as client:
        client.r.c.insert_one({"_id": 1, "n": 0})
        start = server.entries()[-1]["ts"]
        raw_command(server, fam(1, query={"_id": 1}, update={"$inc": {"n": 1}}, new=True))
        raw_command(server, fam(2, query={"_id": 1}, remove=True))
        with client.r.c.watch(start_at_operation_time=start) as stream:
            events = [stream.next() for _ in range(3)]
        assert [e["operationType"] for e in events] == ["insert", "update", "delete"]
        assert events[1]["updateDescription"] == {
            "updatedFields": {"n": 1}, "removedFields": [], "truncatedArrays": [],
        }
        assert all("needsRetryImage" not in e for e in events)
