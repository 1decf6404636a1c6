"""pipeline_stages/bson_bytes.py: strings that are not UTF-8 round-trip byte for byte, and the
encoder's own path writes exactly what PyMongo's C encoder writes for everything else."""

from __future__ import annotations

import datetime
import struct
import uuid

import bson
import pytest
from bson import SON, Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from hypothesis import given
from hypothesis import strategies as st

from pipeline_stages import bson_bytes

UUID_STANDARD = CodecOptions(uuid_representation=4)

SAMPLE = {
    "a": 1, "_id": "x", "b": [1, "s", {"c": None}], "d": SON([("z", 1), ("y", 2)]),
    "e": Code("f()"), "f": Regex("a", "i"), "g": Int64(5), "h": ObjectId(),
    "i": Binary(b"\x00", 5), "j": Decimal128("1.5"), "k": datetime.datetime(2020, 1, 1),
    "l": (1, 2), "m": RawBSONDocument(bson.encode({"q": 1})), "n": True, "o": 1.5,
    "p": 2**40, "u": uuid.uuid4(), "t": Timestamp(1, 2), "mn": MinKey(), "mx": MaxKey(),
    "cs": Code("g()", {"v": 1}), "e2": {}, "l2": [],
}


def test_own_path_writes_what_the_c_encoder_writes():
    # `_id` first at the top level only, as PyMongo's encoder moves it.
    assert bson_bytes._document(SAMPLE, UUID_STANDARD, top_level=True) == bson.encode(
        SAMPLE, codec_options=UUID_STANDARD)
    nested = {"x": {"a": 1, "_id": 2}}
    assert bson_bytes._document(nested, UUID_STANDARD, top_level=True) == bson.encode(nested)


def test_a_byte_that_is_not_utf8_round_trips_in_values_and_names():
    element = b"\x02k\xff\x00" + struct.pack("<i", 4) + b"x\xc3y\x00"
    sub = struct.pack("<i", len(element) + 5) + element + b"\x00"
    outer = b"\x10_id\x00\x07\x00\x00\x00" + b"\x04arr\x00" + (
        struct.pack("<i", len(sub) + 8) + b"\x030\x00" + sub + b"\x00")
    raw = struct.pack("<i", len(outer) + 5) + outer + b"\x00"
    doc = bson_bytes.decode(raw)
    assert doc == {"_id": 7, "arr": [{"k\udcff": "x\udcc3y"}]}
    with pytest.raises(UnicodeEncodeError):
        bson.encode(doc)  # why the module exists
    assert bson_bytes.encode(doc) == raw


def test_truncation_and_checks():
    assert bson_bytes.truncate_utf8("\U0001F92A" * 2, 6) == "\U0001F92A\udcf0\udc9f"
    assert bson_bytes.is_utf8("café") and not bson_bytes.is_utf8("caf\udcc3")
    assert bson_bytes.utf8(bson_bytes.from_utf8(b"\xff\xfe")) == b"\xff\xfe"


# (never "_id", which the encoder moves first)
NAME = st.binary(max_size=6).filter(lambda b: b"\x00" not in b).map(lambda b: b"n" + b)


@given(st.lists(st.tuples(NAME, st.binary(max_size=12)), max_size=6, unique_by=lambda p: p[0]))
def test_any_bytes_round_trip(pairs):
    body = b"".join(b"\x02" + name + b"\x00" + struct.pack("<i", len(v) + 1) + v + b"\x00"
                    for name, v in pairs)
    raw = struct.pack("<i", len(body) + 5) + body + b"\x00"
    try:
        doc = bson_bytes.decode(raw)
    except bson.errors.InvalidBSON:  # two names that decode to one key: not a round trip
        return
    if len(doc) != len(pairs):
        return
    assert bson_bytes.encode(doc) == raw
