"""cdcserver.wire: framing of OP_MSG, OP_QUERY/OP_REPLY and OP_COMPRESSED.

Ground truth comes from pymongo: its own message encoders (``pymongo.message``) and
compressors (``pymongo.compression_support``) for the frames we parse, its reply parser and
decompressor for the frames we build, and handshakes captured from real clients (below).
"""

from __future__ import annotations

import random
import struct
import tracemalloc
import types
import zlib
from collections import OrderedDict

import bson
import pytest
from bson import Int64
from bson.codec_options import DEFAULT_CODEC_OPTIONS
from bson.raw_bson import RawBSONDocument
from bson.son import SON
from pymongo import compression_support, message

from cdcserver import wire
from cdcserver.wire import (
    CHECKSUM_PRESENT,
    EXHAUST_ALLOWED,
    MORE_TO_COME,
    Frame,
    FrameReader,
    OpCode,
    OpMsg,
    OpQuery,
    ProtocolError,
    crc32c,
    decode_request,
    encode_op_msg,
    encode_op_query,
    encode_reply,
    pack_header,
    parse_op_msg,
    parse_op_query,
)
from pipeline_stages import bson_bytes

# --- fixtures captured from real drivers ---------------------------------------------------
# The first message a `MongoClient(..., appname="cdcserver-wire-fixture")` sent to a listening
# socket (pymongo 4.20.0, CPython 3.11, Linux): an OP_MSG `isMaster` handshake.
PYMONGO_4_20_HANDSHAKE = bytes.fromhex(
    "7d01000067458b6b00000000dd0700000000000000680100001069736d617374657200010000000868656c"
    "6c6f4f6b0001026261636b70726573737572650002000000320003636c69656e7400200100000364726976"
    "6572002e000000026e616d65000a00000050794d6f6e676f7c63000276657273696f6e0008000000342e32"
    "302e307c0000036f73005b000000027479706500060000004c696e757800026e616d6500060000004c696e"
    "7578000261726368697465637475726500070000007838365f3634000276657273696f6e00100000003"
    "62e31382e34342d66632d76363537000002706c6174666f726d001700000043507974686f6e20332e31312e"
    "372e66696e616c2e3000036170706c69636174696f6e0026000000026e616d650017000000636463736572"
    "7665722d776972652d66697874757265000003656e76002900000003636f6e7461696e6572001900000002"
    "72756e74696d650007000000646f636b65720000000002246462000600000061646d696e0000"
)
# The same capture with pymongo 4.8.0, which still opened connections with OP_QUERY.
PYMONGO_4_8_HANDSHAKE = bytes.fromhex(
    "6801000067458b6b00000000d40700000000000061646d696e2e24636d640000000000ffffffff4101000010"
    "69736d617374657200010000000868656c6c6f4f6b000103636c69656e74001c01000003647269766572002a"
    "000000026e616d65000800000050794d6f6e676f000276657273696f6e0006000000342e382e300000036f"
    "73005b000000027479706500060000004c696e757800026e616d6500060000004c696e757800026172636869"
    "7465637475726500070000007838365f3634000276657273696f6e0010000000362e31382e34342d66632d"
    "76363537000002706c6174666f726d001700000043507974686f6e20332e31312e372e66696e616c2e3000"
    "036170706c69636174696f6e0026000000026e616d6500170000006364637365727665722d776972652d66"
    "697874757265000003656e76002900000003636f6e7461696e657200190000000272756e74696d65000700"
    "0000646f636b65720000000000"
)
# pymongo 4.8.0 `message._query(4, "admin.$cmd", 0, -1, SON([("$query", {"ismaster": 1}),
# ("$readPreference", {"mode": "secondaryPreferred"})]), {"x": 1}, DEFAULT_CODEC_OPTIONS)`.
PYMONGO_4_8_WRAPPED_QUERY = bytes.fromhex(
    "8600000067458b6b00000000d40700000400000061646d696e2e24636d640000000000ffffffff5300000003"
    "24717565727900130000001069736d6173746572000100000000032472656164507265666572656e636500"
    "22000000026d6f646500130000007365636f6e646172795072656665727265640000000c00000010780001"
    "00000000"
)
# pymongo 4.8.0 `message._query(0, "test.$cmd", 0, 1, SON([("hello", 1), ("comment", "z")]),
# None, DEFAULT_CODEC_OPTIONS, ZlibContext(6))`: OP_COMPRESSED around OP_QUERY.
PYMONGO_4_8_ZLIB_QUERY = bytes.fromhex(
    "4c000000882ff12900000000dc070000d40700003500000002789c6360606028492d2ed15349ce4d610001"
    "4620960762818cd49c9c7c309729393f373735af848109c8a962600000f06508fd"
)

OPTS = DEFAULT_CODEC_OPTIONS
COMPRESSION_CONTEXTS = [
    pytest.param(compression_support.SnappyContext(), id="snappy"),
    pytest.param(compression_support.ZlibContext(6), id="zlib"),
    pytest.param(compression_support.ZstdContext(), id="zstd"),
]


# --- helpers -------------------------------------------------------------------------------


def pymongo_op_msg(command: dict, db: str = "db", ctx=None, flags: int = 0) -> tuple[int, bytes]:
    """An OP_MSG exactly as pymongo sends a command (moving insert's documents to kind 1)."""
    request_id, data, _, _ = message._op_msg(flags, dict(command), db, None, OPTS, ctx)
    return request_id, data


def pymongo_insert_batch(docs: list[dict], w: int = 1, ctx=None) -> tuple[int, bytes]:
    """The OP_MSG `insert_many` sends: pymongo's batched writer behind a fake connection."""
    limits = dict(
        max_bson_size=16 * 1024 * 1024, max_message_size=48_000_000, max_write_batch_size=100_000
    )
    conn = types.SimpleNamespace(compression_context=ctx, **limits)
    bulk = types.SimpleNamespace(conn=conn, max_split_size=limits["max_bson_size"], **limits)
    if ctx is not None:  # pymongo leaves room for the OP_COMPRESSED header
        bulk.max_message_size -= 16
    command = SON([("insert", "coll"), ("ordered", True), ("writeConcern", {"w": w})])
    request_id, data, sent = message._do_batched_op_msg(
        "db.coll", message._INSERT, command, docs, DEFAULT_CODEC_OPTIONS, bulk
    )
    assert len(sent) == len(docs)
    return request_id, data


def raw_msg(sections: bytes, flags: int = 0, request_id: int = 7, checksum: bool = False) -> bytes:
    """A hand-built OP_MSG from raw section bytes (for malformed messages)."""
    if checksum:
        flags |= CHECKSUM_PRESENT
    body = struct.pack("<I", flags) + sections
    length = 16 + len(body) + (4 if checksum else 0)
    out = pack_header(length, request_id, 0, OpCode.MSG) + body
    if checksum:
        out += struct.pack("<I", crc32c(out))
    return out


def kind0(doc: dict | bytes) -> bytes:
    return b"\x00" + (doc if isinstance(doc, bytes) else bson.encode(doc))


def kind1(name: str, docs: list[dict | bytes], size_delta: int = 0) -> bytes:
    payload = (
        name.encode()
        + b"\x00"
        + b"".join(d if isinstance(d, bytes) else bson.encode(d) for d in docs)
    )
    return b"\x01" + struct.pack("<i", 4 + len(payload) + size_delta) + payload


def raise_protocol_error(fn, *args, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args, **kwargs)
    return info.value


# --- header and FrameReader ----------------------------------------------------------------


def test_header_round_trip_and_limits():
    data = pack_header(100, 11, 22, OpCode.MSG)
    assert wire.parse_header(data) == (100, 11, 22, 2013)
    assert wire.MAX_BSON_OBJECT_SIZE == 16 * 1024 * 1024
    assert wire.MAX_MESSAGE_SIZE_BYTES == 48_000_000
    wire.check_header(wire.parse_header(pack_header(48_000_000, 1, 0, OpCode.MSG)))  # boundary
    wire.check_header(wire.parse_header(pack_header(16, 1, 0, OpCode.QUERY)))


def test_truncated_header():
    err = raise_protocol_error(wire.parse_header, b"\x10\x00\x00\x00\x01\x00")
    assert "truncated" in err.errmsg and err.fatal
    raise_protocol_error(decode_request, b"\x10\x00\x00\x00\x01\x00")


@pytest.mark.parametrize("length", [15, 0, -1, -(2**31)])
def test_length_below_header_size_is_rejected(length):
    reader = FrameReader()
    err = raise_protocol_error(reader.feed, pack_header(length, 5, 0, OpCode.MSG))
    assert err.fatal and err.request_id == 5


def test_length_above_max_is_rejected_before_the_body_arrives():
    reader = FrameReader()
    # Only the header of a 48,000,001-byte message: refused at once, nothing buffered.
    raise_protocol_error(reader.feed, pack_header(48_000_001, 1, 0, OpCode.MSG))
    assert reader.buffered == 0
    raise_protocol_error(FrameReader(max_message_size=1000).feed, pack_header(1001, 1, 0, 2013))
    at_limit = FrameReader(max_message_size=1000)
    assert at_limit.feed(pack_header(1000, 1, 0, OpCode.MSG)) == []  # accepted, waits for body
    assert at_limit.needed == 1000 - 16


@pytest.mark.parametrize("op_code", [1, 2001, 2002, 2005, 2006, 2007, 2010, 2011, 9999, -2013])
def test_unknown_or_legacy_opcode_is_rejected(op_code):
    frame = pack_header(21, 1, 0, op_code) + b"\x00" * 5
    err = raise_protocol_error(FrameReader().feed, frame)
    assert str(op_code) in err.errmsg
    raise_protocol_error(Frame.from_bytes, frame)


def test_frame_reader_byte_by_byte_yields_exactly_one_frame():
    _, data = pymongo_op_msg({"ping": 1})
    reader = FrameReader()
    frames = []
    for i in range(len(data)):
        got = reader.feed(data[i : i + 1])
        if i < len(data) - 1:
            assert got == []
            assert reader.buffered == i + 1
            assert reader.needed == (16 if i < 15 else len(data)) - i - 1
        frames += got
    assert len(frames) == 1
    assert frames[0].data == data
    assert frames[0].op_code == OpCode.MSG
    assert reader.buffered == 0 and reader.needed == 16
    reader.eof()  # clean boundary: no error


def test_frame_reader_random_chunking_preserves_order():
    messages = [pymongo_op_msg({"ping": i})[1] for i in range(20)]
    messages.append(PYMONGO_4_8_HANDSHAKE)
    stream = b"".join(messages)
    rng = random.Random(1234)
    for _ in range(20):
        reader = FrameReader()
        out = []
        pos = 0
        while pos < len(stream):
            step = rng.randint(1, 200)
            out += reader.feed(memoryview(stream)[pos : pos + step])
            pos += step
        assert [f.data for f in out] == messages
    # Everything in one chunk, plus the first half of another message.
    reader = FrameReader()
    frames = reader.feed(stream + messages[0][:30])
    assert [f.data for f in frames] == messages
    assert reader.buffered == 30


def test_frame_reader_is_unusable_after_an_error():
    reader = FrameReader()
    raise_protocol_error(reader.feed, pack_header(3, 1, 0, OpCode.MSG))
    # Even a valid message is refused afterwards: the stream is out of sync.
    raise_protocol_error(reader.feed, pymongo_op_msg({"ping": 1})[1])


def test_frames_completed_before_a_bad_header_come_first():
    good = pymongo_op_msg({"ping": 1})[1]
    reader = FrameReader()
    frames = reader.feed(good + pack_header(3, 1, 0, OpCode.MSG))
    assert [f.data for f in frames] == [good]
    assert reader.error is not None
    raise_protocol_error(reader.feed, b"")


def test_frame_reader_eof_mid_message():
    data = pymongo_op_msg({"ping": 1})[1]
    reader = FrameReader()
    reader.feed(data[:10])
    err = raise_protocol_error(reader.eof)
    assert "header" in err.errmsg
    reader = FrameReader()
    reader.feed(data[:-1])
    err = raise_protocol_error(reader.eof)
    assert "truncated message" in err.errmsg


def test_frame_from_bytes_checks_declared_length():
    data = pymongo_op_msg({"ping": 1})[1]
    assert Frame.from_bytes(data).data == data
    raise_protocol_error(Frame.from_bytes, data + b"\x00")
    raise_protocol_error(Frame.from_bytes, data[:-1])


# --- OP_MSG: parsing pymongo's frames ------------------------------------------------------


def test_parse_pymongo_command():
    cmd = SON([("find", "coll"), ("filter", {"a": {"$gt": 1}}), ("batchSize", 2)])
    request_id, data = pymongo_op_msg(cmd, db="test")
    req = decode_request(data)
    assert isinstance(req, OpMsg)
    assert req.request_id == request_id and req.response_to == 0
    assert list(req.body.items()) == [*cmd.items(), ("$db", "test")]
    assert req.command_name == "find" and req.database == "test"
    assert req.sequences == {} and req.flags == 0 and req.compressor_id is None
    assert not req.more_to_come and not req.checksum_present and not req.exhaust_allowed


def test_parse_pymongo_handshake_capture():
    req = decode_request(PYMONGO_4_20_HANDSHAKE)
    assert isinstance(req, OpMsg)
    assert list(req.body)[:2] == ["ismaster", "helloOk"]
    assert req.body["client"]["driver"]["name"] == "PyMongo|c"
    assert req.body["client"]["application"] == {"name": "cdcserver-wire-fixture"}
    assert req.database == "admin"


def test_insert_many_document_sequence_is_merged_into_the_command():
    docs = [{"_id": i, "v": "x" * i} for i in range(50)]
    request_id, data = pymongo_insert_batch(docs)
    # pymongo really used a kind-1 section: "documents" is not inside the body document.
    body_size = struct.unpack_from("<i", data, 21)[0]
    assert b"documents\x00" not in data[21 : 21 + body_size]
    assert data[21 + body_size] == 1
    req = decode_request(data)
    assert req.request_id == request_id
    assert req.sequences == {"documents": docs}
    assert req.body["documents"] == docs
    assert list(req.body) == ["insert", "ordered", "writeConcern", "$db", "documents"]
    assert not req.more_to_come


def test_unacknowledged_write_exposes_more_to_come():
    _, data = pymongo_insert_batch([{"_id": 1}], w=0)
    req = decode_request(data)
    assert req.more_to_come and req.flags == MORE_TO_COME
    assert req.body["documents"] == [{"_id": 1}]


def test_raw_sequences_keep_document_bytes():
    docs = [SON([("_id", i), ("b", 1.5), ("a", [1, {"z": None}])]) for i in range(3)]
    _, data = pymongo_insert_batch(docs)
    req = parse_op_msg(data, raw_sequences=True)
    got = req.sequences["documents"]
    assert all(isinstance(d, RawBSONDocument) for d in got)
    assert [d.raw for d in got] == [bson.encode(d) for d in docs]
    assert req.body["documents"] is got


@pytest.mark.parametrize("ctx", COMPRESSION_CONTEXTS)
def test_pymongo_compressed_messages(ctx):
    docs = [{"_id": i, "pad": "abc" * 20} for i in range(200)]
    _, plain = pymongo_insert_batch(docs)
    request_id, data = pymongo_insert_batch(docs, ctx=ctx)
    assert struct.unpack_from("<i", data, 12)[0] == OpCode.COMPRESSED
    req = decode_request(data)
    assert req.compressor_id == ctx.compressor_id
    assert req.request_id == request_id
    assert req.body == decode_request(plain).body
    # A plain command, too.
    rid, data = pymongo_op_msg({"ping": 1}, ctx=ctx)
    req = decode_request(data)
    assert req.body == {"ping": 1, "$db": "db"} and req.compressor_id == ctx.compressor_id
    # The decompressed message is the original one byte for byte (header rebuilt).
    inner, cid = wire.decompress_message(data)
    assert cid == ctx.compressor_id
    assert inner == pack_header(len(inner), rid, 0, OpCode.MSG) + inner[16:]
    plain, _, _ = message._op_msg_no_header(0, {"ping": 1, "$db": "db"}, "", None, OPTS)
    assert inner[16:] == plain


# --- OP_MSG: building and round trips ------------------------------------------------------


def test_round_trip_with_sequences_and_flags():
    body = SON([("insert", "c"), ("ordered", False), ("$db", "d")])
    seqs = {"documents": [{"_id": 1}, {"_id": Int64(2), "x": [1, 2]}], "other": []}
    data = encode_op_msg(
        body, request_id=42, response_to=9, sequences=seqs, flags=MORE_TO_COME | EXHAUST_ALLOWED
    )
    req = parse_op_msg(data)
    assert (req.request_id, req.response_to) == (42, 9)
    assert req.more_to_come and req.exhaust_allowed and not req.checksum_present
    assert req.sequences == seqs
    assert req.body == {**body, **seqs}


def test_reply_is_understood_by_pymongo():
    doc = SON([("cursor", {"id": Int64(0), "ns": "db.c", "firstBatch": [{"a": 1}]}), ("ok", 1.0)])
    data = encode_op_msg(doc, request_id=3, response_to=77)
    assert struct.unpack_from("<iiii", data) == (len(data), 3, 77, 2013)
    reply = message._OpMsg.unpack(data[16:])
    assert reply.unpack_response()[0] == doc
    assert not reply.more_to_come
    exhaust = encode_op_msg(doc, request_id=4, response_to=77, flags=MORE_TO_COME)
    assert message._OpMsg.unpack(exhaust[16:]).more_to_come


def test_raw_documents_are_embedded_without_reencoding():
    # Duplicate keys cannot survive a decode/encode cycle: their presence proves the bytes
    # were copied, not re-encoded.
    dup = b"\x02a\x00\x02\x00\x00\x00x\x00\x10a\x00\x02\x00\x00\x00"
    raw_bytes = struct.pack("<i", len(dup) + 5) + dup + b"\x00"
    raw = RawBSONDocument(raw_bytes)
    reply = {"cursor": {"firstBatch": [raw, raw], "id": Int64(0)}, "ok": 1.0}
    data = encode_op_msg(reply, request_id=1, response_to=1)
    assert data.count(raw_bytes) == 2
    # A RawBSONDocument or pre-encoded bytes as the whole body are used verbatim.
    assert encode_op_msg(raw, request_id=1).endswith(raw_bytes)
    assert encode_op_msg(raw_bytes, request_id=1) == encode_op_msg(raw, request_id=1)


def test_encode_reply_chooses_the_clients_format():
    msg_req = decode_request(pymongo_op_msg({"ping": 1})[1])
    out = encode_reply(msg_req, {"ok": 1.0}, request_id=5)
    assert struct.unpack_from("<iiii", out)[1:] == (5, msg_req.request_id, 2013)
    query_req = decode_request(PYMONGO_4_8_HANDSHAKE)
    out = encode_reply(query_req, {"ok": 1.0}, request_id=6)
    assert struct.unpack_from("<iiii", out)[1:] == (6, query_req.request_id, 1)
    # Checksummed requests get checksummed replies; compressed ones can be compressed back.
    summed = parse_op_msg(encode_op_msg({"ping": 1, "$db": "a"}, request_id=8, checksum=True))
    out = encode_reply(summed, {"ok": 1.0}, request_id=9, more_to_come=True)
    assert parse_op_msg(out).checksum_present and parse_op_msg(out).more_to_come
    out = encode_reply(msg_req, {"ok": 1.0}, request_id=10, compressor="zlib")
    _, rid, response_to, op, orig_op, _, cid = struct.unpack_from("<iiiiiiB", out)
    assert (rid, response_to, op, orig_op, cid) == (10, msg_req.request_id, 2012, 2013, 2)
    inner, _ = wire.decompress_message(out)
    assert parse_op_msg(inner).body == {"ok": 1.0}


# --- OP_MSG: checksum ----------------------------------------------------------------------


def test_crc32c_known_vectors():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"") == 0
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283


def test_crc32c_is_the_c_package_and_agrees_with_the_fallback():
    """google-crc32c (a dependency) computes it; the pure-Python fallback gives the same values
    on every length and alignment, whole and continued."""
    from cdcserver.wire.crc32c import IMPLEMENTATION, crc32c_python

    assert IMPLEMENTATION == "c"
    rng = random.Random(16)
    for n in [*range(0, 70), 255, 256, 257, 4095, 4096, 65537]:
        data = rng.randbytes(n)
        assert crc32c(data) == crc32c_python(data)
        assert crc32c(memoryview(data)) == crc32c(bytearray(data)) == crc32c_python(data)
        cut = n // 3
        assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c_python(data)
        assert crc32c_python(data[cut:], crc32c_python(data[:cut])) == crc32c(data)


def test_largest_checksummed_message_is_verified():
    """A 48 MB checksummed OP_MSG (maxMessageSizeBytes) is parsed and verified whole, and the
    same message with one bit flipped anywhere is refused (288)."""
    docs = [{"_id": i, "pad": "x" * 1_000_000} for i in range(47)]
    data = encode_op_msg({"insert": "c", "$db": "d"}, request_id=3, checksum=True,
                         sequences={"documents": docs})
    assert 47_000_000 < len(data) <= wire.MAX_MESSAGE_SIZE_BYTES
    assert len(parse_op_msg(data).sequences["documents"]) == 47
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    assert raise_protocol_error(parse_op_msg, bytes(flipped)).code == 288


def test_checksum_generation_and_verification():
    data = encode_op_msg({"ping": 1, "$db": "admin"}, request_id=1, checksum=True)
    flags = struct.unpack_from("<I", data, 16)[0]
    assert flags & CHECKSUM_PRESENT
    assert struct.unpack_from("<I", data, len(data) - 4)[0] == crc32c(data[:-4])
    req = parse_op_msg(data)
    assert req.checksum_present and req.body == {"ping": 1, "$db": "admin"}
    # Same body, hand-built by an independent path.
    assert data == raw_msg(kind0({"ping": 1, "$db": "admin"}), request_id=1, checksum=True)


def test_wrong_checksum_is_rejected():
    data = bytearray(encode_op_msg({"ping": 1, "$db": "admin"}, request_id=1, checksum=True))
    data[-1] ^= 0x01
    err = raise_protocol_error(parse_op_msg, bytes(data))
    assert (err.code, err.code_name, err.fatal) == (288, "ChecksumMismatch", True)
    data = bytearray(encode_op_msg({"ping": 1, "$db": "admin"}, request_id=1, checksum=True))
    data[30] ^= 0x40  # corrupt the body, keep the checksum
    assert raise_protocol_error(parse_op_msg, bytes(data)).code == 288
    # checksumPresent set but no room for sections and a checksum.
    tiny = raw_msg(b"\x00\x00\x00\x00", flags=CHECKSUM_PRESENT)
    assert raise_protocol_error(parse_op_msg, tiny).code == 51251


# --- OP_MSG: malformed messages ------------------------------------------------------------


@pytest.mark.parametrize("bit", [2, 3, 8, 15])
def test_unknown_required_flag_bits_are_rejected(bit):
    data = raw_msg(kind0({"ping": 1}), flags=1 << bit)
    err = raise_protocol_error(decode_request, data)
    assert (err.code, err.code_name, err.fatal) == (223, "IllegalOpMsgFlag", True)
    assert err.errmsg == f"Message contains illegal flags value: Ob{1 << bit:032b}"


def test_optional_flag_bits_are_accepted():
    req = parse_op_msg(raw_msg(kind0({"ping": 1}), flags=EXHAUST_ALLOWED | (1 << 20)))
    assert req.exhaust_allowed and req.body == {"ping": 1}


def test_document_sequence_overrunning_the_message():
    data = raw_msg(kind0({"insert": "c"}) + kind1("documents", [{"_id": 1}], size_delta=1))
    err = raise_protocol_error(parse_op_msg, data)
    assert err.fatal and "overruns" in err.errmsg
    # A size too small to hold even the identifier.
    data = raw_msg(kind0({"insert": "c"}) + b"\x01" + struct.pack("<i", 3))
    assert raise_protocol_error(parse_op_msg, data).fatal
    # A sequence size field cut off by the end of the message.
    data = raw_msg(kind0({"insert": "c"}) + b"\x01\x10\x00")
    assert raise_protocol_error(parse_op_msg, data).fatal
    # An identifier without its terminating NUL.
    data = raw_msg(kind0({"insert": "c"}) + b"\x01" + struct.pack("<i", 8) + b"docs")
    assert "not terminated" in raise_protocol_error(parse_op_msg, data).errmsg


def test_document_not_filling_its_sequence():
    # The sequence claims 3 bytes more than its documents hold.
    seq = kind1("documents", [{"_id": 1}]) + b"\x00\x00\x00"
    seq = seq[:1] + struct.pack("<i", struct.unpack_from("<i", seq, 1)[0] + 3) + seq[5:]
    err = raise_protocol_error(parse_op_msg, raw_msg(kind0({"insert": "c"}) + seq))
    assert (err.code, err.fatal) == (22, False)


def test_body_overrunning_the_message():
    body = bson.encode({"ping": 1})
    data = raw_msg(b"\x00" + body[:-2])
    assert raise_protocol_error(parse_op_msg, data).fatal


@pytest.mark.parametrize("kind", [3, 7, 255])
def test_unknown_section_kind(kind):
    data = raw_msg(kind0({"ping": 1}) + bytes([kind]) + bson.encode({}))
    err = raise_protocol_error(parse_op_msg, data)
    assert (err.code, err.errmsg, err.fatal) == (40432, f"Unknown section kind {kind}", False)


def test_security_token_section_is_refused():
    err = raise_protocol_error(parse_op_msg, raw_msg(b"\x02" + bson.encode({}) + kind0({"a": 1})))
    assert (err.code, err.code_name) == (13, "Unauthorized")


def test_invalid_bson_body():
    bad_eoo = bson.encode({"ping": 1})[:-1] + b"\x01"
    err = raise_protocol_error(parse_op_msg, raw_msg(b"\x00" + bad_eoo, request_id=99))
    assert (err.code, err.code_name, err.fatal, err.request_id) == (22, "InvalidBSON", False, 99)
    assert err.to_error_document()["code"] == 22
    # An unknown element type (0x42).
    elements = b"\x42a\x00\x00"
    bad_type = struct.pack("<i", len(elements) + 5) + elements + b"\x00"
    assert raise_protocol_error(parse_op_msg, raw_msg(b"\x00" + bad_type)).code == 22


def test_strings_that_are_not_utf8_are_taken_as_their_bytes():
    # mongod validates structure, not UTF-8: {a: "\xff"} is a valid body, kept byte for byte.
    elements = b"\x02a\x00\x02\x00\x00\x00\xff\x00"
    not_utf8 = struct.pack("<i", len(elements) + 5) + elements + b"\x00"
    body = parse_op_msg(raw_msg(b"\x00" + not_utf8)).body
    assert body == {"a": "\udcff"}
    assert bson_bytes.encode(body) == not_utf8


def test_invalid_bson_in_a_sequence():
    bad = bson.encode({"_id": 1})[:-1] + b"\x07"
    data = raw_msg(kind0({"insert": "c"}) + kind1("documents", [{"_id": 0}, bad]))
    assert raise_protocol_error(parse_op_msg, data).code == 22
    # raw_sequences still validates.
    assert raise_protocol_error(parse_op_msg, data, raw_sequences=True).code == 22


def test_section_structure_errors():
    two_bodies = raw_msg(kind0({"a": 1}) + kind0({"b": 1}))
    assert raise_protocol_error(parse_op_msg, two_bodies).code == 40430
    no_body = raw_msg(kind1("documents", [{"_id": 1}]))
    assert raise_protocol_error(parse_op_msg, no_body).code == 40587
    empty = raw_msg(b"")
    assert raise_protocol_error(parse_op_msg, empty).code == 40587
    dup_seq = raw_msg(kind0({"insert": "c"}) + kind1("documents", []) + kind1("documents", []))
    err = raise_protocol_error(parse_op_msg, dup_seq)
    assert (err.code, err.errmsg) == (40431, "Duplicate document sequence: documents")
    clash = raw_msg(kind0({"insert": "c", "documents": []}) + kind1("documents", []))
    assert raise_protocol_error(parse_op_msg, clash).code == 40433
    dotted = raw_msg(kind0({"u": {"v": 1}}) + kind1("u.v", []))
    assert raise_protocol_error(parse_op_msg, dotted).code == 40433
    three = raw_msg(kind0({"x": 1}) + kind1("a", []) + kind1("b", []) + kind1("c", []))
    err = raise_protocol_error(parse_op_msg, three)
    assert (err.code, err.fatal) == (233, True)
    # Two sequences (client bulkWrite's ops + nsInfo) are fine, in either section order.
    ok = raw_msg(kind1("ops", [{"insert": 0}]) + kind0({"bulkWrite": 1}) + kind1("nsInfo", []))
    req = parse_op_msg(ok)
    assert req.body == {"bulkWrite": 1, "ops": [{"insert": 0}], "nsInfo": []}


def test_too_short_and_mismatched_op_msg():
    raise_protocol_error(parse_op_msg, pack_header(18, 1, 0, OpCode.MSG) + b"\x00\x00")
    good = raw_msg(kind0({"a": 1}))
    raise_protocol_error(parse_op_msg, good + b"\x00")  # length mismatch
    raise_protocol_error(parse_op_msg, PYMONGO_4_8_HANDSHAKE)  # not an OP_MSG


def test_document_size_limit():
    big = {"x": "y" * 2000}
    data = raw_msg(kind0(big))
    err = raise_protocol_error(parse_op_msg, data, max_bson_size=1000)
    assert (err.code, err.code_name, err.fatal) == (10334, "BSONObjectTooLarge", False)
    assert parse_op_msg(data).body == big
    seq = raw_msg(kind0({"insert": "c"}) + kind1("documents", [big]))
    assert raise_protocol_error(decode_request, seq, max_bson_size=1000).code == 10334


def test_datetimes_outside_python_range_are_valid_bson():
    elements = b"\x09d\x00" + struct.pack("<q", 2**62)
    doc = struct.pack("<i", len(elements) + 5) + elements + b"\x00"
    req = parse_op_msg(raw_msg(b"\x00" + doc))
    assert int(req.body["d"]) == 2**62


def test_custom_document_class():
    opts = DEFAULT_CODEC_OPTIONS.with_options(document_class=OrderedDict)
    req = parse_op_msg(raw_msg(kind0({"b": 1, "a": 2})), codec_options=opts)
    assert isinstance(req.body, OrderedDict) and list(req.body) == ["b", "a"]
    # RawBSONDocument: the body becomes a dict whose sub-documents stay raw, still validated.
    opts = DEFAULT_CODEC_OPTIONS.with_options(document_class=RawBSONDocument)
    nested = {"q": {"x": 1}}
    req = parse_op_msg(raw_msg(kind0(nested)), codec_options=opts)
    assert type(req.body) is dict and isinstance(req.body["q"], RawBSONDocument)
    assert req.body["q"].raw == bson.encode({"x": 1})
    elements = b"\x42a\x00\x00"  # an unknown element type
    bad_inner = struct.pack("<i", len(elements) + 5) + elements + b"\x00"
    outer = b"\x03q\x00" + bad_inner
    bad = struct.pack("<i", len(outer) + 5) + outer + b"\x00"
    assert raise_protocol_error(parse_op_msg, raw_msg(b"\x00" + bad), codec_options=opts).code == 22


# --- OP_QUERY / OP_REPLY -------------------------------------------------------------------


def test_parse_legacy_handshake_capture():
    req = decode_request(PYMONGO_4_8_HANDSHAKE)
    assert isinstance(req, OpQuery)
    assert req.full_collection_name == "admin.$cmd" and req.is_command
    assert (req.flags, req.number_to_skip, req.number_to_return) == (0, 0, -1)
    assert list(req.query)[:2] == ["ismaster", "helloOk"]
    assert req.return_fields_selector is None
    cmd = req.to_command()
    assert cmd["ismaster"] == 1 and cmd["$db"] == "admin" and "$readPreference" not in cmd


def test_parse_wrapped_query_with_selector():
    req = parse_op_query(PYMONGO_4_8_WRAPPED_QUERY)
    assert req.flags == wire.QUERY_SECONDARY_OK
    assert req.return_fields_selector == {"x": 1}
    assert req.to_command() == {
        "ismaster": 1,
        "$readPreference": {"mode": "secondaryPreferred"},
        "$db": "admin",
    }


def test_parse_compressed_legacy_query():
    req = decode_request(PYMONGO_4_8_ZLIB_QUERY)
    assert isinstance(req, OpQuery) and req.compressor_id == 2
    assert req.to_command() == {"hello": 1, "comment": "z", "$db": "test"}


def test_op_query_round_trip_and_upconversion():
    data = encode_op_query(
        {"hello": 1},
        request_id=12,
        full_collection_name="db.$cmd",
        number_to_return=1,
        flags=wire.QUERY_SECONDARY_OK,
        return_fields_selector={"f": 0},
    )
    req = parse_op_query(data)
    assert (req.request_id, req.database, req.collection) == (12, "db", "$cmd")
    assert req.query == {"hello": 1} and req.return_fields_selector == {"f": 0}
    assert req.to_command() == {
        "hello": 1,
        "$readPreference": {"mode": "secondaryPreferred"},
        "$db": "db",
    }


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"full_collection_name": "db.coll"}, 40473),
        ({"flags": wire.QUERY_EXHAUST}, 18527),
        ({"number_to_return": 0}, 16979),
        ({"number_to_return": 2}, 16979),
        ({"query": {"hello": 1, "$db": "x"}}, 40621),
        ({"query": {"$query": {"hello": 1}, "$maxTimeMS": 5}}, 72),
    ],
)
def test_op_query_upconversion_errors(kwargs, code):
    args = {"full_collection_name": "admin.$cmd", "query": {"hello": 1}, **kwargs}
    req = parse_op_query(encode_op_query(args.pop("query"), request_id=3, **args))
    err = raise_protocol_error(req.to_command)
    assert (err.code, err.fatal, err.request_id) == (code, False, 3)


def test_malformed_op_query():
    good = encode_op_query({"hello": 1}, request_id=1, full_collection_name="admin.$cmd")
    # A third document after query and returnFieldsSelector.
    extra = good[16:] + bson.encode({"a": 1}) + bson.encode({})
    extra = pack_header(16 + len(extra), 1, 0, OpCode.QUERY) + extra
    assert "trailing" in raise_protocol_error(parse_op_query, extra).errmsg
    # Stray bytes that are not a document.
    stray = pack_header(len(good) + 2, 1, 0, OpCode.QUERY) + good[16:] + b"\x01\x02"
    assert raise_protocol_error(parse_op_query, stray).code == 22
    # No NUL after the collection name.
    no_nul = pack_header(16 + 4 + 5, 1, 0, OpCode.QUERY) + b"\x00" * 4 + b"admin"
    raise_protocol_error(parse_op_query, no_nul)
    # Missing query document.
    short = good[: 16 + 4 + 11 + 8]
    short = pack_header(len(short), 1, 0, OpCode.QUERY) + short[16:]
    raise_protocol_error(parse_op_query, short)
    # Invalid BSON in the query.
    bad = bytearray(good)
    bad[-1] = 1
    assert raise_protocol_error(parse_op_query, bytes(bad)).code == 22


def test_op_reply_layout():
    req = decode_request(PYMONGO_4_8_HANDSHAKE)
    doc = SON([("ismaster", True), ("maxWireVersion", 21), ("ok", 1.0)])
    data = encode_reply(req, doc, request_id=500)
    length, rid, response_to, op = struct.unpack_from("<iiii", data)
    assert (length, rid, response_to, op) == (len(data), 500, req.request_id, 1)
    flags, cursor_id, starting_from, returned = struct.unpack_from("<iqii", data, 16)
    assert (flags, cursor_id, starting_from, returned) == (wire.REPLY_AWAIT_CAPABLE, 0, 0, 1)
    assert bson.decode(data[36:]) == doc
    assert data[36:] == bson.encode(doc)


# --- OP_COMPRESSED -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["noop", "snappy", "zlib", "zstd"])
def test_compress_round_trip(name):
    original = encode_op_msg(
        {"cursor": {"firstBatch": [{"a": "b" * 100}] * 50}, "ok": 1.0},
        request_id=31,
        response_to=30,
    )
    packed = wire.compress_message(original, name)
    length, rid, response_to, op = struct.unpack_from("<iiii", packed)
    assert (length, rid, response_to, op) == (len(packed), 31, 30, OpCode.COMPRESSED)
    orig_op, size, cid = struct.unpack_from("<iiB", packed, 16)
    assert (orig_op, size, cid) == (OpCode.MSG, len(original) - 16, wire.COMPRESSOR_IDS[name])
    if name != "noop":
        assert len(packed) < len(original)
    assert wire.decompress_message(packed) == (original, cid)
    if name != "noop":  # pymongo's own decompressor reads our payload
        assert compression_support.decompress(packed[25:], cid, 48_000_000) == original[16:]


def test_compressed_reply_read_by_pymongo_reply_parser():
    doc = {"ok": 1.0, "n": 3}
    req = decode_request(pymongo_op_msg({"ping": 1}, ctx=compression_support.ZstdContext())[1])
    packed = encode_reply(req, doc, request_id=2, compressor=req.compressor_id)
    _, _, _, op = struct.unpack_from("<iiii", packed)
    orig_op, _, cid = struct.unpack_from("<iiB", packed, 16)
    assert (op, orig_op, cid) == (2012, 2013, 3)
    payload = compression_support.decompress(packed[25:], cid, 48_000_000)
    assert message._OpMsg.unpack(payload).unpack_response()[0] == doc


def _compressed(payload: bytes, size: int, cid: int, original: int = OpCode.MSG) -> bytes:
    return (
        pack_header(25 + len(payload), 1, 0, OpCode.COMPRESSED)
        + struct.pack("<iiB", original, size, cid)
        + payload
    )


@pytest.mark.parametrize(
    ("payload", "cid"),
    [
        (b"not zlib at all", 2),
        (b"\x28\xb5\x2f\xfd garbage", 3),
        (b"\x15\xff\xff\xff", 1),
        (b"", 2),
    ],
)
def test_bad_compressed_payload(payload, cid):
    err = raise_protocol_error(decode_request, _compressed(payload, 21, cid))
    assert err.fatal


def test_compressed_size_and_header_checks():
    inner = raw_msg(kind0({"ping": 1}))[16:]
    good = zlib.compress(inner)
    assert decode_request(_compressed(good, len(inner), 2)).body == {"ping": 1}
    raise_protocol_error(decode_request, _compressed(good, len(inner) + 1, 2))  # claims more
    raise_protocol_error(decode_request, _compressed(good, len(inner) - 1, 2))  # claims less
    for claimed in (len(inner) + 1, len(inner) - 1):  # caught before any OP_MSG parsing
        err = raise_protocol_error(wire.decompress_message, _compressed(good, claimed, 2))
        assert "uncompressedSize" in err.errmsg
    raise_protocol_error(decode_request, _compressed(good[:-3], len(inner), 2))  # truncated
    raise_protocol_error(decode_request, _compressed(good + b"xx", len(inner), 2))  # trailing
    raise_protocol_error(decode_request, _compressed(good, 48_000_000, 2))  # over the limit
    raise_protocol_error(decode_request, _compressed(good, -1, 2))
    err = raise_protocol_error(decode_request, _compressed(good, len(inner), 7))  # unknown id
    assert "not available" in err.errmsg
    raise_protocol_error(decode_request, _compressed(good, len(inner), 2), allowed_compressors={3})
    raise_protocol_error(decode_request, _compressed(good, len(inner), 2, OpCode.COMPRESSED))
    raise_protocol_error(decode_request, _compressed(good, len(inner), 2, 2002))
    raise_protocol_error(decode_request, pack_header(20, 1, 0, OpCode.COMPRESSED) + b"\x00" * 4)
    snappy_inner = compression_support.SnappyContext.compress(inner)
    raise_protocol_error(decode_request, _compressed(snappy_inner, len(inner) + 5, 1))


@pytest.mark.parametrize("cid", [1, 2, 3])
def test_decompression_is_bounded(cid):
    # 40 MB of zeros compress to a few KB; a message claiming 100 bytes must be refused
    # without inflating it all (peak Python allocation stays far below 40 MB).
    packed = wire.compress_message(
        pack_header(40_000_016, 1, 0, OpCode.MSG) + bytes(40_000_000), cid
    )
    bomb = _compressed(packed[25:], 100, cid)
    tracemalloc.start()
    try:
        err = raise_protocol_error(decode_request, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.fatal
    assert peak < 4_000_000


def test_negotiate_compressors():
    assert wire.negotiate_compressors(["zstd", "zlib", "snappy"]) == ["zstd", "zlib", "snappy"]
    assert wire.negotiate_compressors(["lz4", "zlib", 3, "zlib", "noop"]) == ["zlib"]
    assert wire.negotiate_compressors(["zstd", "zlib"], enabled=["zlib"]) == ["zlib"]
    assert wire.negotiate_compressors([]) == []
    assert set(wire.available_compressors()) == {"snappy", "zlib", "zstd"}
    assert wire.compressor_id("zstd") == 3 and wire.compressor_id(1) == 1
    with pytest.raises(ValueError):
        wire.compressor_id("lz4")


def test_protocol_error_document():
    err = ProtocolError("boom", code=40432, code_name="Location40432", fatal=False)
    assert err.to_error_document() == {
        "ok": 0.0,
        "errmsg": "boom",
        "code": 40432,
        "codeName": "Location40432",
    }
    assert str(err) == "boom" and "fatal=False" in repr(err)
