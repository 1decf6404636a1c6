"""Exhaust cursors (OP_MSG exhaustAllowed / moreToCome) through pymongo, and a raw socket
reading the stream the server sends for one getMore."""

from __future__ import annotations

import socket
import struct

import bson
import pytest
from bson.son import SON
from pymongo import CursorType, monitoring
from pymongo.errors import OperationFailure

MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16


class _Started(monitoring.CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_exhaust_find_streams_every_batch(server) -> None:
    listener = _Started()
    client = server.client(event_listeners=[listener], maxPoolSize=1)
    try:
        coll = client.exhaust_db.coll
        coll.drop()
        coll.insert_many([{"_id": i} for i in range(5)])
        listener.names.clear()
        got = [d["_id"] for d in coll.find({}, cursor_type=CursorType.EXHAUST, batch_size=2)]
        assert got == [0, 1, 2, 3, 4]
        # find [0, 1]; the one getMore sent, then the server's replies [2, 3] (moreToCome)
        # and [4] (short of the batch size: the end, id 0), each a getMore to the listener
        assert listener.names == ["find", "getMore", "getMore"]
        assert coll.count_documents({}) == 5  # the connection is usable afterwards
    finally:
        client.close()


def _op_msg(request_id: int, flags: int, body: dict) -> bytes:
    payload = struct.pack("<I", flags) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def _read_reply(sock: socket.socket) -> tuple[int, int, int, dict]:
    header = b""
    while len(header) < 16:
        header += sock.recv(16 - len(header))
    length, request_id, response_to, _ = struct.unpack("<iiii", header)
    rest = b""
    while len(rest) < length - 16:
        rest += sock.recv(length - 16 - len(rest))
    flags = struct.unpack("<I", rest[:4])[0]
    return request_id, response_to, flags, bson.decode(rest[5:])


def test_each_exhaust_reply_answers_the_one_before(server, client) -> None:
    coll = client.exhaust_db.raw
    coll.drop()
    coll.insert_many([{"_id": i} for i in range(4)])
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_op_msg(1, 0, {"find": "raw", "batchSize": 1, "$db": "exhaust_db"}))
        first = _read_reply(sock)[3]
        cursor_id = first["cursor"]["id"]
        assert cursor_id != 0
        get_more = {"getMore": cursor_id, "collection": "raw", "batchSize": 1,
                    "$db": "exhaust_db"}
        sock.sendall(_op_msg(2, EXHAUST_ALLOWED, get_more))
        replies = []
        while True:
            request_id, response_to, flags, body = _read_reply(sock)
            replies.append((response_to, flags & MORE_TO_COME, body["cursor"]["nextBatch"]))
            if not flags & MORE_TO_COME:
                break
            previous = request_id
            replies[-1] = (*replies[-1], previous)
    batches = [r[2] for r in replies]
    assert batches == [[{"_id": 1}], [{"_id": 2}], [{"_id": 3}], []]
    assert replies[0][0] == 2  # the first answers the getMore
    for before, after in zip(replies, replies[1:], strict=False):
        assert after[0] == before[3]  # each later one answers the reply before it
    assert [bool(r[1]) for r in replies] == [True, True, True, False]


def test_find_sort_not_a_document_fails_on_a_missing_collection(server) -> None:
    """mongod parses find's sort before it looks up the collection: 14 even when there is no
    collection (PyMongo's TestExhaustCursor.test_exhaust_query_server_error, which then checks
    the exhaust connection went back to the pool)."""
    client = server.client(maxPoolSize=1)
    try:
        coll = client.exhaust_db.no_such_coll
        coll.drop()
        for cursor_type in (CursorType.NON_TAILABLE, CursorType.EXHAUST):
            with pytest.raises(OperationFailure) as info:
                next(coll.find(SON([("$query", {}), ("$orderby", True)]),
                               cursor_type=cursor_type))
            assert info.value.code == 14, info.value.details
            assert info.value.details["codeName"] == "TypeMismatch"
        assert coll.count_documents({}) == 0  # the connection is usable afterwards
    finally:
        client.close()
