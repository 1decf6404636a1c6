"""KeyString V1 single-value encodings: the computed table of reference §4.4 (consistent with
MongoDB's `ActualBytesDouble` unit test), decoded back to the identical BSON."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.timestamp import Timestamp

from pipeline_stages import keystring

UTC = datetime.UTC

# (value, KeyString hex of the value alone + kEnd, serialized type bits or None)
VECTORS = [
    (1, "2B0204", None),
    (Int64(1), "2B0204", b"\x02"),
    (1.0, "2B0204", b"\x01"),
    (5.5, "2B0B8000000000000004", b"\x01"),  # key_string_test.cpp ActualBytesDouble
    (1.5, "2B038000000000000004", b"\x01"),
    (-5.5, "27F47FFFFFFFFFFFFF04", b"\x01"),
    (0.5, "2AFF8000000000000004", b"\x01"),
    (-0.5, "28007FFFFFFFFFFFFF04", b"\x01"),
    (0.1, "2AFEE666666666666804", b"\x01"),
    (0.0, "2904", b"\x01"),
    (-0.0, "2904", b"\x03"),
    (float("inf"), "33FFFFFFFFFFFFFFFF04", b"\x01"),
    (float("-inf"), "1F000000000000000004", b"\x01"),
    (-1, "27FD04", None),
    (127, "2BFE04", None),
    (128, "2C010004", None),
    (-128, "26FEFF04", None),
    (2**31 - 1, "2EFFFFFFFE04", None),
    (-(2**31), "23FEFFFFFFFF04", None),
    (Int64(2**53), "314000000000000004", b"\x02"),
    (Int64(2**63 - 1), "32FFFFFFFFFFFFFFFE04", b"\x02"),
    (Int64(-(2**63)), "1FF83FFFFFFFFFFFFF04", b"\x02"),
    (11.112, "2B171CAC083126E98004", b"\x01"),  # from a real token (reference §4)
    (2.0**63, "3307C000000000000004", b"\x01"),
    ("a\0b", "3C6100FF620004", None),
    ("", "3C0004", None),
    (True, "6F04", None),
    (False, "6E04", None),
    (None, "1404", None),
    (MinKey(), "0A04", None),
    (MaxKey(), "F004", None),
    (datetime.datetime(1970, 1, 1, tzinfo=UTC), "78800000000000000004", None),
    (datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
     "787FFFFFFFFFFFFFFF04", None),
    (Timestamp(1, 2), "82000000010000000204", None),
    (Binary(b"ab", 0), "5A0200616204", None),
    ({"a": 1, "b": "x"}, "461E61002B023C62003C78000004", None),
    ([1, "x"], "502B023C78000004", None),
]


@pytest.mark.parametrize(("value", "hex_", "type_bits"), VECTORS, ids=repr)
def test_single_value(value, hex_, type_bits):
    data, bits = keystring.encode_values([value])
    assert (data.hex().upper(), bits) == (hex_, type_bits)
    assert keystring.decode_to_bson(data, bits) == bson.encode({"0": value})


def test_nan_is_one_byte_and_decodes_to_nan():
    data, bits = keystring.encode_values([float("nan")])
    assert (data, bits) == (b"\x1e\x04", b"\x01")
    (t, v), = keystring.decode(data, bits)
    assert t == 0x01 and keystring.element_to_python(t, v) != keystring.element_to_python(t, v)


def test_binary_over_254_bytes_uses_a_4_byte_length():
    data, _ = keystring.encode_values([Binary(b"x" * 300, 5)])
    assert data[:7] == bytes.fromhex("5AFF0000012C05")
    assert keystring.decode_to_bson(data) == bson.encode({"0": Binary(b"x" * 300, 5)})


def test_undefined_symbol_and_dbpointer_from_raw_bson():
    # pymongo can't build these, so the raw elements are written out: undefined (06),
    # symbol (0E) "s", DBPointer (0C) "db.c" + ObjectId.
    oid = bytes(range(12))
    body = (
        b"\x060\x00"
        + b"\x0e1\x00" + (2).to_bytes(4, "little") + b"s\x00"
        + b"\x0c2\x00" + (5).to_bytes(4, "little") + b"db.c\x00" + oid
    )
    raw = (len(body) + 5).to_bytes(4, "little") + body + b"\x00"
    data, bits = keystring.encode_bson(raw)
    assert data == bytes.fromhex("0F" "3C7300" "96" "00000004") + b"db.c" + oid + b"\x04"
    assert bits == b"\x01"  # the symbol's string bit
    assert keystring.decode_to_bson(data, bits) == raw


def test_type_bits_over_127_bytes_use_the_long_form():
    values = [Int64(1)] * 600  # 1200 bits = 150 bytes
    data, bits = keystring.encode_values(values)
    assert bits[:5] == b"\x80" + (150).to_bytes(4, "little")
    assert len(bits) == 155
    assert keystring.decode_to_bson(data, bits) == bson.encode(
        {str(i): v for i, v in enumerate(values)}
    )


def test_equal_numbers_share_bytes_and_differ_only_in_type_bits():
    encodings = [keystring.encode_values([v]) for v in (3, Int64(3), 3.0)]
    assert len({d for d, _ in encodings}) == 1
    assert [b for _, b in encodings] == [None, b"\x02", b"\x01"]
