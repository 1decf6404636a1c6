"""An OP_MSG with `moreToCome` (flagBits bit 1) never gets a reply.

mongod (service_entry_point_common.cpp, makeCommandResponse) builds the reply of a
`moreToCome` message, error or not, and then drops it: a client that sent one reads nothing for
it, so any reply would be taken for the answer to its next request. Only the connection-fatal
parse errors (illegal flags, too many document sequences, a wrong checksum) close the
connection. Each case below sends one such message over a raw socket, then a ping: the first
reply that comes must be the ping's (its responseTo), on the same connection.
"""

from __future__ import annotations

import socket
import struct
import zlib

import bson
import pytest

from cdcserver.testing import HOST

OP_MSG, OP_COMPRESSED = 2013, 2012
MORE_TO_COME = 1 << 1
PING_ID, MESSAGE_ID = 0x51, 0x33
HANG_GUARD_S = 20.0  # a socket timeout against a hang, never a performance expectation


def frame(op_code: int, payload: bytes, request_id: int) -> bytes:
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, op_code) + payload


def op_msg(sections: bytes, flags: int = MORE_TO_COME, request_id: int = MESSAGE_ID) -> bytes:
    return frame(OP_MSG, struct.pack("<I", flags) + sections, request_id)


def body(doc: dict) -> bytes:
    return b"\x00" + bson.encode(doc)


def sequence(ident: bytes, *docs: dict) -> bytes:
    encoded = b"".join(bson.encode(d) for d in docs)
    size = struct.pack("<i", 4 + len(ident) + 1 + len(encoded))
    return b"\x01" + size + ident + b"\x00" + encoded


PING = op_msg(body({"ping": 1, "$db": "admin"}), flags=0, request_id=PING_ID)
INSERT = {"insert": "mtc", "$db": "mtc"}

# What each malformed message gets from mongod when it is answered (moreToCome off): the
# same messages with moreToCome on must get nothing.
CASES = {
    "two body sections (40430)": (body({"ping": 1, "$db": "admin"}) * 2, 40430),
    # {a: <element type 0x42>}: a type BSON does not have
    "invalid BSON in the body (22)": (b"\x00\x08\x00\x00\x00\x42a\x00\x00", 22),
    "duplicate document sequence (40431)": (
        body(INSERT) + sequence(b"documents", {"_id": 1}) + sequence(b"documents", {"_id": 2}),
        40431,
    ),
    "unknown section kind (40432)": (body({"ping": 1, "$db": "admin"}) + b"\x07abc", 40432),
    "no body section (40587)": (sequence(b"documents", {"_id": 1}), 40587),
    "sequence also in the body (40433)": (
        body({**INSERT, "documents": []}) + sequence(b"documents", {"_id": 1}), 40433,
    ),
    "a command that fails (59)": (body({"noSuchCommand": 1, "$db": "admin"}), 59),
}


def read_reply(sock: socket.socket) -> tuple[int, dict]:
    """(responseTo, body) of the next message; fails on a closed connection."""
    header = recv_exact(sock, 16)
    length, _, response_to, op_code = struct.unpack("<iiii", header)
    rest = recv_exact(sock, length - 16)
    assert op_code == OP_MSG, op_code
    return response_to, bson.decode(rest[5:])


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def connect(server) -> socket.socket:
    sock = socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@pytest.mark.parametrize("case", list(CASES))
def test_error_is_answered_without_more_to_come(server, case):
    """The control: each message is really an error mongod answers (so the next test's silence
    is the flag's doing, not a message the server ignores anyway)."""
    sections, code = CASES[case]
    with connect(server) as sock:
        sock.sendall(op_msg(sections, flags=0))
        response_to, reply = read_reply(sock)
    assert response_to == MESSAGE_ID
    assert (reply["ok"], reply["code"]) == (0.0, code), reply


@pytest.mark.parametrize("case", list(CASES))
def test_more_to_come_error_gets_no_reply(server, case):
    sections, _ = CASES[case]
    with connect(server) as sock:
        sock.sendall(op_msg(sections) + PING)
        response_to, reply = read_reply(sock)
        assert response_to == PING_ID, reply  # not an answer to the moreToCome message
        assert reply["ok"] == 1.0
        sock.sendall(PING)  # the connection goes on
        assert read_reply(sock)[0] == PING_ID


def test_compressed_more_to_come_error_gets_no_reply(server):
    """The flag of the OP_MSG inside an OP_COMPRESSED counts the same."""
    inner = op_msg(body({"ping": 1, "$db": "admin"}) * 2)[16:]  # 40430 inside
    message = frame(OP_COMPRESSED, struct.pack("<iiB", OP_MSG, len(inner), 2)
                    + zlib.compress(inner), MESSAGE_ID)
    with connect(server) as sock:
        sock.sendall(message + PING)
        assert read_reply(sock)[0] == PING_ID


def test_more_to_come_write_is_applied_without_reply(server, client):
    """An unacknowledged insert: no reply, and the document is there afterwards."""
    with connect(server) as sock:
        sock.sendall(op_msg(body(INSERT) + sequence(b"documents", {"_id": "unacked"})) + PING)
        assert read_reply(sock)[0] == PING_ID
    assert client.mtc.mtc.find_one({"_id": "unacked"}) == {"_id": "unacked"}


def test_fatal_error_still_closes(server):
    """Illegal flag bits close the connection with or without moreToCome (mongod's
    ConnectionFatalMessageParseError)."""
    with connect(server) as sock:
        sock.sendall(op_msg(body({"ping": 1, "$db": "admin"}), flags=MORE_TO_COME | 1 << 5)
                     + PING)
        assert sock.recv(16) == b""
