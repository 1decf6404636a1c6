"""Bad input on one connection never disturbs the others.

A misbehaving client speaks raw bytes on its own socket (hand-built frames, not the project's
encoder); meanwhile a pymongo client with an open change stream must go on receiving events.
Each case also says what the bad connection gets: closed (what mongod does with bad framing,
illegal flags, undecodable compressed payloads), or an error reply after which the same
connection still answers (mongod's answer to e.g. invalid BSON or an unknown section kind).
"""

from __future__ import annotations

import socket
import struct
import time
import zlib

import bson
import pytest
from pymongo import MongoClient

from cdcserver.testing import HOST, ThreadServer
from tests.support.server_support import ITEMS, World, drain

OP_QUERY, OP_COMPRESSED, OP_MSG = 2004, 2012, 2013
SOCKET_TIMEOUT_S = 10.0  # a hang guard only


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = World.record(tmp_path_factory.mktemp("adversity") / "oplog.jsonl")
    with ThreadServer([world.path]) as server:
        world.server = server
        yield world


@pytest.fixture(scope="module")
def client(world):
    with MongoClient(world.server.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


_next_id = iter(range(1000, 1 << 30))


@pytest.fixture
def watcher(client, world):
    """An open change stream on the good client; call it to check it still gets events."""
    stream = client.shop.items.watch(max_await_time_ms=100)
    assert stream.try_next() is None  # the cursor is open on the server

    def still_served() -> None:
        key = next(_next_id)
        world.oplog.insert(ITEMS, {"_id": key})
        world.flush()
        assert [e["documentKey"]["_id"] for e in drain(stream, 1)] == [key]
        assert client.admin.command("ping")["ok"] == 1.0

    yield still_served
    stream.close()


# -- hand-built frames ----------------------------------------------------------------------------


def header(length: int, op_code: int, request_id: int = 7, response_to: int = 0) -> bytes:
    return struct.pack("<iiii", length, request_id, response_to, op_code)


def frame(op_code: int, payload: bytes, request_id: int = 7) -> bytes:
    return header(16 + len(payload), op_code, request_id) + payload


def op_msg(body: bytes | dict, flags: int = 0, extra: bytes = b"", request_id: int = 7) -> bytes:
    raw = body if isinstance(body, bytes) else bson.encode(body)
    return frame(OP_MSG, struct.pack("<I", flags) + b"\x00" + raw + extra, request_id)


def compressed(inner: bytes, compressor_id: int, payload: bytes | None = None) -> bytes:
    original_op = struct.unpack_from("<i", inner, 12)[0]
    body = inner[16:]
    if payload is None:
        payload = zlib.compress(body)
    return frame(
        OP_COMPRESSED, struct.pack("<iiB", original_op, len(body), compressor_id) + payload
    )


def connect(server) -> socket.socket:
    sock = socket.create_connection((HOST, server.port), timeout=SOCKET_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    """(responseTo, body) of one OP_MSG reply."""
    length, _, response_to, op_code = struct.unpack("<iiii", recv_exact(sock, 16))
    rest = recv_exact(sock, length - 16)
    assert op_code == OP_MSG, op_code
    assert rest[4] == 0
    return response_to, bson.decode(rest[5:])


def command(sock: socket.socket, body: dict, request_id: int = 99) -> dict:
    sock.sendall(op_msg(body, request_id=request_id))
    response_to, reply = read_reply(sock)
    assert response_to == request_id
    return reply


def closed_by_server(sock: socket.socket) -> bool:
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _bad_bson() -> bytes:
    good = bson.encode({"ping": 1, "$db": "admin"})
    # An element of type 0x99 (no such BSON type) in place of the int32 `ping`.
    return good.replace(b"\x10ping\x00", b"\x99ping\x00", 1)


_PING = {"ping": 1, "$db": "admin"}

# (id, bytes the bad client sends, expected: "close" or the error code of the reply)
CASES = [
    ("length-below-16", header(8, OP_MSG) + b"\x00" * 8, "close"),
    ("negative-length", header(-1, OP_MSG) + b"\x00" * 32, "close"),
    ("length-above-max", header(48_000_001, OP_MSG) + b"\x00" * 64, "close"),
    ("unknown-opcode", frame(9999, b"\x00" * 32), "close"),
    ("removed-opcode-insert", frame(2002, b"\x00" * 32), "close"),
    ("op-reply-from-client", frame(1, b"\x00" * 36), "close"),
    ("illegal-flag-bit", op_msg(_PING, flags=1 << 5), "close"),
    ("checksum-mismatch", op_msg(_PING, flags=1, extra=b"\x00\x00\x00\x00"), "close"),
    ("body-overruns-message", frame(OP_MSG, b"\x00" * 5 + b"\xff\x00\x00\x00"), "close"),
    ("no-body-section", frame(OP_MSG, b"\x00\x00\x00\x00"), 40587),
    ("unknown-section-kind", op_msg(_PING, extra=b"\x07" + bson.encode({"a": 1})), 40432),
    ("two-body-sections", op_msg(_PING, extra=b"\x00" + bson.encode({"a": 1})), 40430),
    ("invalid-bson", op_msg(_bad_bson()), 22),
    (
        "zlib-garbage",
        compressed(op_msg(_PING), 2, payload=b"this is not a zlib stream"),
        "close",
    ),
    (
        "zlib-wrong-size",
        frame(OP_COMPRESSED, struct.pack("<iiB", OP_MSG, 5, 2) + zlib.compress(b"x" * 50)),
        "close",
    ),
    ("unknown-compressor", compressed(op_msg(_PING), 42), "close"),
    ("snappy-garbage", compressed(op_msg(_PING), 1, payload=b"\xff\xff\xff\xff\x0f"), "close"),
    ("zstd-garbage", compressed(op_msg(_PING), 3, payload=b"\x28\xb5\x2f\xfd\x00"), "close"),
    ("compressed-compressed", compressed(compressed(op_msg(_PING), 2), 2), "close"),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_frame(world, watcher, data, expected):
    bad = connect(world.server)
    try:
        bad.sendall(data)
        if expected == "close":
            assert closed_by_server(bad)
        else:
            response_to, reply = read_reply(bad)
            assert response_to == 7
            assert reply["ok"] == 0 and reply["code"] == expected, reply
            # The connection goes on: the next request is answered.
            assert command(bad, _PING)["ok"] == 1.0
        watcher()
    finally:
        bad.close()


def test_truncated_header_held_open_then_dropped(world, watcher):
    bad = connect(world.server)
    bad.sendall(header(64, OP_MSG)[:10])  # 10 of 16 header bytes, then nothing
    watcher()  # a half-sent message blocks nobody
    bad.sendall(b"\x00" * 3)  # still short of a header
    watcher()
    bad.shutdown(socket.SHUT_WR)
    assert closed_by_server(bad)
    bad.close()
    watcher()


def test_truncated_body_then_disconnect(world, watcher):
    bad = connect(world.server)
    bad.sendall(op_msg(_PING)[:-3])
    watcher()
    bad.close()
    watcher()


def test_bad_frame_after_good_requests(world, watcher):
    bad = connect(world.server)
    assert command(bad, {"hello": 1, "$db": "admin"})["isWritablePrimary"] is True
    assert command(bad, _PING)["ok"] == 1.0
    bad.sendall(header(3, OP_MSG))
    assert closed_by_server(bad)
    bad.close()
    watcher()


def test_good_request_pipelined_before_garbage_is_answered(world, watcher):
    bad = connect(world.server)
    try:
        bad.sendall(op_msg(_PING, request_id=1) + header(3, OP_MSG))  # one write
        assert read_reply(bad)[0] == 1
        assert closed_by_server(bad)
    finally:
        bad.close()
        watcher()


def test_client_disconnects_mid_get_more(world, watcher):
    server = world.server
    baseline = server.connection_count()
    before = server.cursor_ids()
    bad = connect(server)
    reply = command(
        bad,
        {
            "aggregate": "items", "pipeline": [{"$changeStream": {}}], "cursor": {},
            "$db": "shop",
        },
    )
    cursor_id = reply["cursor"]["id"]
    assert cursor_id in server.cursor_ids() - before
    bad.sendall(
        op_msg(
            {"getMore": cursor_id, "collection": "items", "maxTimeMS": 500, "$db": "shop"},
            request_id=5,
        )
    )
    bad.close()  # gone while the getMore waits for data
    watcher()
    # The server notices once the getMore ends, and forgets the connection.
    for _ in range(300):  # bounds the wait only
        if server.connection_count() <= baseline:
            break
        watcher()
    assert server.connection_count() <= baseline
    with MongoClient(server.uri) as other:
        reply = other.shop.command("killCursors", "items", cursors=[cursor_id])
        assert reply["cursorsKilled"] + reply["cursorsNotFound"] == [cursor_id]
    assert cursor_id not in server.cursor_ids()


def test_many_bad_clients_at_once(world, watcher):
    socks = []
    try:
        for i, (_, data, _) in enumerate(CASES * 3):
            sock = connect(world.server)
            sock.sendall(data[: max(1, len(data) - i % 3)])  # whole or cut short
            socks.append(sock)
        watcher()
    finally:
        for sock in socks:
            sock.close()
    watcher()


def test_malformed_commands_get_error_replies(world, watcher):
    bad = connect(world.server)
    try:
        for body, code in [
            ({"noSuchCommand": 1, "$db": "admin"}, 59),
            ({"killCursors": "items", "cursors": ["x"], "$db": "shop"}, 14),
            ({"killCursors": "items", "$db": "shop"}, 40414),
            ({"getMore": "x", "collection": "items", "$db": "shop"}, 14),
            ({"getMore": 5, "$db": "shop"}, 40414),
            (
                {"hello": 1, "topologyVersion": {}, "maxAwaitTimeMS": "soon", "$db": "admin"},
                14,
            ),
            ({"aggregate": "items", "pipeline": [{"$changeStream": {}}], "$db": "shop"}, 9),
            (
                {
                    "aggregate": "items", "pipeline": [{"$changeStream": {}}],
                    "cursor": {"batchSize": -1}, "$db": "shop",
                },
                51024,
            ),
        ]:
            reply = command(bad, body)
            assert reply["ok"] == 0 and reply["code"] == code, (body, reply)
        assert command(bad, _PING)["ok"] == 1.0  # the same connection goes on
    finally:
        bad.close()
    watcher()


def test_cursor_in_use(world, watcher):
    first, second = connect(world.server), connect(world.server)
    try:
        reply = command(
            first,
            {
                "aggregate": "busy", "pipeline": [{"$changeStream": {}}], "cursor": {},
                "$db": "shop",
            },
        )
        cursor_id = reply["cursor"]["id"]
        get_more = {"getMore": cursor_id, "collection": "busy", "$db": "shop"}
        first.sendall(op_msg({**get_more, "maxTimeMS": 5000}, request_id=11))
        cursors = world.server.state.cursors.cursors
        for _ in range(1000):  # until the first getMore holds the cursor (bounds the wait)
            if world.server.call(lambda: cursors[cursor_id].busy):
                break
            time.sleep(0.005)
        reply = command(second, {**get_more, "maxTimeMS": 1})
        assert reply["code"] == 143 and reply["codeName"] == "CursorInUse", reply
        assert reply["errmsg"] == f"cursor id {cursor_id} is already in use"
        world.oplog.insert("shop.busy", {"_id": "wake"})
        world.flush()
        response_to, reply = read_reply(first)
        assert response_to == 11
        assert [e["documentKey"]["_id"] for e in reply["cursor"]["nextBatch"]][:1] == ["wake"]
        command(second, {"killCursors": "busy", "cursors": [cursor_id], "$db": "shop"})
    finally:
        first.close()
        second.close()
    watcher()
