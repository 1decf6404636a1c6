"""Generated wire messages: the variety test_server_adversity.py's hand-built cases cannot list.

Each example opens a raw socket and sends one hypothesis-built message with valid framing (the
header's length is the message's length) but anything inside it: OP_MSG with random flag bits,
section kinds, document sequences and a right or wrong CRC-32C checksum; OP_QUERY against odd
namespaces; OP_COMPRESSED with every compressor id around good and bad payloads. Then it sends
a ping. Properties: the server answers the ping or closes the connection (never a hang: a
socket timeout far above any real answer is the guard), every OP_MSG reply it sends before is
well formed with no InternalError, and a second client's change stream on the same server
still delivers an insert made afterwards.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson import SON
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcserver.testing import HOST, EmbeddedServer
from cdcserver.wire.crc32c import crc32c
from tests.server.test_command_fuzz import EXAMPLES, HUNT, VALUES, check_reply

OP_REPLY, OP_QUERY, OP_COMPRESSED, OP_MSG = 1, 2004, 2012, 2013
MORE_TO_COME = 1 << 1
PING_ID = 0x5EED
HANG_GUARD_S = 20.0  # a socket timeout against a hang, never a performance expectation

# -- message strategies ------------------------------------------------------------------------

_NAMES = st.sampled_from(["ping", "hello", "isMaster", "find", "insert", "getMore",
                          "aggregate", "buildInfo", "bogus", "", "$x"])


@st.composite
def command_docs(draw: st.DrawFn) -> bytes:
    """A command body: a name, maybe $db, maybe other fields; or raw garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=24))  # not BSON at all
    doc = SON([(draw(_NAMES), draw(st.one_of(st.just(1), VALUES)))])
    if draw(st.booleans()):
        doc["$db"] = draw(st.one_of(st.sampled_from(["admin", "fz", "", "a.b", "$x"]), VALUES))
    for key in draw(st.lists(st.sampled_from(["documents", "filter", "lsid", "$readPreference",
                                              "cursor", "maxTimeMS", "x"]), max_size=2)):
        doc[key] = draw(VALUES)
    return bson.encode(doc)


_DOCS = st.one_of(st.dictionaries(st.sampled_from(["_id", "a", "$x", "q", "u"]), VALUES,
                                  max_size=2).map(bson.encode), st.binary(max_size=12))


@st.composite
def sections(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from([0, 0, 1, 1, 2, 7, 255]))
    if kind == 0:
        return b"\x00" + draw(command_docs())
    if kind == 1:
        ident = draw(st.sampled_from([b"documents", b"updates", b"deletes", b"x", b"",
                                      b"ping"]))
        docs = b"".join(draw(st.lists(_DOCS, max_size=3)))
        size = 4 + len(ident) + 1 + len(docs)
        size = draw(st.sampled_from([size, size, size - 1, size + 3, 0, -1]))
        return b"\x01" + struct.pack("<i", size) + ident + b"\x00" + docs
    return bytes([kind]) + draw(st.binary(max_size=16))


def frame(op_code: int, payload: bytes, request_id: int = 7) -> bytes:
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, op_code) + payload


@st.composite
def op_msgs(draw: st.DrawFn, more_to_come: bool = False) -> bytes:
    # checksumPresent (0), moreToCome (1), exhaustAllowed (16), and bits mongod rejects.
    flags = MORE_TO_COME if more_to_come else 0
    for bit in draw(st.lists(st.sampled_from([0, 1, 16, 2, 15, 17, 31]), max_size=2)):
        flags |= 1 << bit
    body = struct.pack("<I", flags) + b"".join(draw(st.lists(sections(), max_size=3)))
    if flags & 1:
        whole = frame(OP_MSG, body + b"\x00\x00\x00\x00")  # length counts the checksum
        crc = crc32c(whole[:-4])
        if draw(st.booleans()):
            crc ^= draw(st.integers(1, 2**32 - 1))  # a wrong one
        return whole[:-4] + struct.pack("<I", crc)
    return frame(OP_MSG, body)


@st.composite
def op_queries(draw: st.DrawFn) -> bytes:
    ns = draw(st.one_of(
        st.sampled_from([b"admin.$cmd", b"fz.$cmd", b"fz.c", b"$cmd", b".$cmd", b"admin.",
                         b"", b"a.b.$cmd", b"local.oplog.rs", b"\xff\xfe.$cmd"]),
        st.binary(max_size=12).map(lambda b: b.replace(b"\x00", b"")),
    ))
    flags = draw(st.sampled_from([0, 4, 32, 1 << 31, 0xFFFF]))
    skip, limit = draw(st.integers(-2, 2)), draw(st.integers(-2, 2))
    query = draw(st.one_of(command_docs(), st.builds(
        lambda q: bson.encode({"$query": q}), st.dictionaries(st.just("hello"), VALUES))))
    selector = draw(st.sampled_from([b"", bson.encode({"a": 1}), b"\x05\x00"]))
    return frame(OP_QUERY, struct.pack("<I", flags) + ns + b"\x00"
                 + struct.pack("<ii", skip, limit) + query + selector)


def _compress(compressor: int, data: bytes) -> bytes:
    if compressor == 0:
        return data
    if compressor == 2:
        return zlib.compress(data)
    if compressor == 1:
        snappy = pytest.importorskip("snappy")
        return snappy.compress(data)
    if compressor == 3:
        try:
            from backports import zstd  # what pymongo uses on Python < 3.14
        except ImportError:
            from compression import zstd  # type: ignore[import-not-found,no-redef]
        return zstd.compress(data)
    return data


@st.composite
def op_compressed(draw: st.DrawFn) -> bytes:
    inner = draw(st.one_of(op_msgs(), op_queries()))
    original_op = draw(st.sampled_from([struct.unpack_from("<i", inner, 12)[0], OP_MSG,
                                        OP_QUERY, OP_COMPRESSED, 1, 9999]))
    body = inner[16:]
    compressor = draw(st.sampled_from([0, 1, 2, 3, 4, 255]))
    if draw(st.booleans()):
        payload = _compress(compressor, body)
    else:
        payload = draw(st.binary(max_size=32))
    size = draw(st.sampled_from([len(body), len(body), len(body) + 1, 0, -1, 2**31 - 1]))
    return frame(OP_COMPRESSED, struct.pack("<iiB", original_op, size, compressor) + payload)


MESSAGES = st.one_of(op_msgs(), op_queries(), op_compressed())


@st.composite
def compressed_more_to_come(draw: st.DrawFn) -> bytes:
    """A well-formed OP_COMPRESSED around an OP_MSG with moreToCome (anything inside it)."""
    inner = draw(op_msgs(more_to_come=True))
    compressor = draw(st.sampled_from([0, 2, 3]))
    body = inner[16:]
    return frame(OP_COMPRESSED, struct.pack("<iiB", OP_MSG, len(body), compressor)
                 + _compress(compressor, body))


# moreToCome set, anything else mutated: mongod never answers such a message (it closes the
# connection on the fatal parse errors, and drops every other reply, errors included).
MORE_TO_COME_MESSAGES = st.one_of(op_msgs(more_to_come=True), compressed_more_to_come())

# -- the world ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watch(server: EmbeddedServer) -> Iterator[Any]:
    client = server.client()
    coll = client.wire_sentinel.s
    stream = coll.watch(max_await_time_ms=100)
    assert stream.try_next() is None
    counter = iter(range(1 << 30))

    def still_served() -> None:
        key = next(counter)
        coll.insert_one({"_id": key})
        for _ in range(200):  # bounded: an iteration is one awaitData getMore
            event = stream.try_next()
            if event is not None:
                assert event["documentKey"] == {"_id": key}
                break
        else:
            pytest.fail("the change stream stopped delivering")
        assert client.admin.command("ping")["ok"] == 1.0

    yield still_served
    stream.close()
    client.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None  # closed by the server
        data += chunk
    return data


def _decompress(compressor: int, payload: bytes) -> bytes:
    if compressor == 2:
        return zlib.decompress(payload)
    if compressor == 1:
        import snappy

        return snappy.decompress(payload)
    if compressor == 3:
        try:
            from backports import zstd
        except ImportError:
            from compression import zstd  # type: ignore[import-not-found,no-redef]
        return zstd.decompress(payload)
    assert compressor == 0, compressor
    return payload


def _check_message(header: bytes, op_code: int, rest: bytes) -> None:
    """A reply the server sent: well formed, and no InternalError in it."""
    compressed = op_code == OP_COMPRESSED
    if compressed:  # answered compressed in kind
        op_code, size, compressor = struct.unpack_from("<iiB", rest)
        rest = _decompress(compressor, rest[9:])
        assert len(rest) == size
    if op_code == OP_MSG:
        (flags,) = struct.unpack_from("<I", rest)
        if flags & 1:  # answered with a checksum, as asked with one: it must be right
            crc = struct.unpack_from("<I", rest, len(rest) - 4)[0]
            assert compressed or crc32c(header + rest[:-4]) == crc
            rest = rest[:-4]
        assert rest[4] == 0  # a body section
        check_reply({}, bson.decode(rest[5:]))
    else:
        assert op_code == OP_REPLY, op_code
        (returned,) = struct.unpack_from("<i", rest, 16)
        assert returned == 1
        check_reply({}, bson.decode(rest[20:]))


def answered_or_closed(sock: socket.socket, only_ping: bool = False) -> str:
    """Read until the ping's reply ("answered") or the end of the connection ("closed");
    a socket timeout (a hang) fails the test. `only_ping`: no other reply may come first."""
    while True:
        header = _recv_exact(sock, 16)
        if header is None:
            return "closed"
        length, _, response_to, op_code = struct.unpack("<iiii", header)
        assert 16 <= length <= 48_000_000, length
        rest = _recv_exact(sock, length - 16)
        if rest is None:
            return "closed"
        _check_message(header, op_code, rest)
        assert response_to == PING_ID or not only_ping, f"a reply to {response_to}"
        if response_to == PING_ID:
            return "answered"


_PING = frame(OP_MSG, struct.pack("<I", 0) + b"\x00" + bson.encode({"ping": 1, "$db": "admin"}),
              PING_ID)


@settings(max_examples=10 * EXAMPLES, deadline=None, derandomize=not HUNT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(message=MESSAGES)
def test_generated_messages(server, watch, message):
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(message + _PING)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: a close is an allowed outcome
        outcome = answered_or_closed(sock)
        assert outcome in ("answered", "closed")
    watch()


@settings(max_examples=2 * EXAMPLES, deadline=None, derandomize=not HUNT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGES, min_size=2, max_size=5))
def test_generated_message_streams(server, watch, messages):
    """Several messages back to back on one connection (pipelined), then a ping."""
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S) as sock:
        try:
            sock.sendall(b"".join(messages) + _PING)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answered_or_closed(sock)
    watch()


@settings(max_examples=10 * EXAMPLES, deadline=None, derandomize=not HUNT,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(messages=st.lists(MORE_TO_COME_MESSAGES, min_size=1, max_size=3))
def test_more_to_come_messages_get_no_reply(server, watch, messages):
    """Mutated moreToCome messages, then a ping: the first reply (if the connection was not
    closed) is the ping's, by its responseTo."""
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(b"".join(messages) + _PING)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answered_or_closed(sock, only_ping=True)
    watch()


def test_valid_compressed_ping_is_answered(server):
    """The generator's "good payload" path is real: a zlib-compressed ping gets its reply."""
    inner = frame(OP_MSG, struct.pack("<I", 0) + b"\x00"
                  + bson.encode({"ping": 1, "$db": "admin"}))
    body = inner[16:]
    message = frame(OP_COMPRESSED, struct.pack("<iiB", OP_MSG, len(body), 2)
                    + zlib.compress(body), PING_ID)
    with socket.create_connection((HOST, server.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(message)
        header = _recv_exact(sock, 16)
        assert header is not None
        length, _, response_to, op_code = struct.unpack("<iiii", header)
        assert response_to == PING_ID
        rest = _recv_exact(sock, length - 16)
        assert rest is not None
    if op_code == OP_COMPRESSED:  # the server answers compressed in kind
        original, _, compressor = struct.unpack_from("<iiB", rest)
        assert (original, compressor) == (OP_MSG, 2)
        rest = zlib.decompress(rest[9:])
    reply = bson.decode(rest[5:])
    assert reply["ok"] == 1.0
