"""KeyString V1, ascending: the order-preserving byte encoding inside resume tokens.

Reproduces mongod's `key_string::Builder` / `toBsonSafe` for an all-ascending `Ordering` with no
RecordId, which is exactly what `ResumeToken` uses. Values come in and go out as raw BSON so
that every BSON type survives a round trip, including the ones pymongo cannot represent as
Python values (undefined, symbol, DBPointer) and the numeric types (int32/int64/double/decimal)
that only the type bits tell apart. See ../shared/reference/resume_tokens.md §2.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from types import ModuleType

from pipeline_stages import bson_bytes
from pipeline_stages.errors import KeyStringError, MongoError

# CType bytes (key_string.cpp `CType`).
MIN_KEY = 0x0A
UNDEFINED = 0x0F
NULLISH = 0x14
NUMERIC = 0x1E  # generic numeric header, and NaN
NUMERIC_NEG_LARGE = 0x1F
NUMERIC_NEG_8BYTE_INT = 0x20
NUMERIC_NEG_1BYTE_INT = 0x27
NUMERIC_NEG_SMALL = 0x28
NUMERIC_ZERO = 0x29
NUMERIC_POS_SMALL = 0x2A
NUMERIC_POS_1BYTE_INT = 0x2B
NUMERIC_POS_8BYTE_INT = 0x32
NUMERIC_POS_LARGE = 0x33
STRING_LIKE = 0x3C
OBJECT = 0x46
ARRAY = 0x50
BINDATA = 0x5A
OID = 0x64
BOOL_FALSE = 0x6E
BOOL_TRUE = 0x6F
DATE = 0x78
TIMESTAMP = 0x82
REGEX = 0x8C
DBREF = 0x96
CODE = 0xA0
CODE_WITH_SCOPE = 0xAA
MAX_KEY = 0xF0
END = 0x04

# Numeric kinds as the type bits store them: (first bit, second bit).
KIND_INT, KIND_LONG, KIND_DOUBLE, KIND_DECIMAL = 0, 1, 2, 3
NEGATIVE_DOUBLE_ZERO = 0b11000

# The generic CType written before a field name inside an object, by BSON type byte.
GENERIC_CTYPE: dict[int, int] = {
    0x01: NUMERIC, 0x10: NUMERIC, 0x12: NUMERIC, 0x13: NUMERIC,
    0x02: STRING_LIKE, 0x0E: STRING_LIKE,
    0x03: OBJECT, 0x04: ARRAY, 0x05: BINDATA, 0x06: UNDEFINED, 0x07: OID,
    0x08: BOOL_FALSE, 0x09: DATE, 0x0A: NULLISH, 0x0B: REGEX, 0x0C: DBREF,
    0x0D: CODE, 0x0F: CODE_WITH_SCOPE, 0x11: TIMESTAMP, 0xFF: MIN_KEY, 0x7F: MAX_KEY,
}
_GENERIC_BYTE = {t: bytes((c,)) for t, c in GENERIC_CTYPE.items()}

_MASK64 = (1 << 64) - 1
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_U64BE = struct.Struct(">Q")
_U32BE = struct.Struct(">I")
_DBL = struct.Struct("<d")
_DBL_BITS = struct.Struct("<Q")
_TWO_POW_63 = float(1 << 63)
_TWO_POW_M255 = 2.0**-255
_INVERT = bytes(255 - i for i in range(256))


class TypeBitsWriter:
    """mongod's `TypeBits` as it is appended to: bits packed LSB-first, a byte per 8 bits."""

    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0
        self.count = 0

    def append_bit(self, bit: int) -> None:
        if bit:
            self.value |= 1 << self.count
        self.count += 1

    def append_numeric(self, kind: int) -> None:
        # Two bits, the kind's high bit first.
        self.value |= ((kind >> 1) | ((kind & 1) << 1)) << self.count
        self.count += 2

    def serialize(self) -> bytes | None:
        """The `_typeBits` payload, or None when every bit is 0 (mongod then omits it)."""
        if not self.value:
            return None
        n = (self.count + 7) >> 3
        data = self.value.to_bytes(n, "little")
        if n == 1 and data[0] < 0x80:
            return data
        if n <= 127:
            return bytes((0x80 | n,)) + data
        return b"\x80" + n.to_bytes(4, "little") + data


def serialize_type_bits(value: int, count: int) -> bytes | None:
    w = TypeBitsWriter()
    w.value, w.count = value, count
    return w.serialize()


class TypeBitsReader:
    """mongod's `TypeBits::Reader` over a serialized `_typeBits` payload."""

    __slots__ = ("_value", "_size_bits", "_all_zero", "pos")

    def __init__(self, payload: bytes | None) -> None:
        self.pos = 0
        data = _parse_type_bits(payload or b"")
        self._all_zero = not data
        self._value = int.from_bytes(data, "little")
        self._size_bits = len(data) * 8

    def read_bit(self) -> int:
        if self._all_zero:
            return 0
        p = self.pos
        if p >= self._size_bits:
            raise KeyStringError(50615, "Invalid size byte(s).")
        self.pos = p + 1
        return (self._value >> p) & 1

    def read_numeric(self) -> int:
        high = self.read_bit()
        return (high << 1) | self.read_bit()

    def read_zero(self) -> int:
        kind = self.read_numeric()
        if kind == 0b11:  # negative and decimal zeros take 3 more bits in V1
            kind = (kind << 1) | self.read_bit()
            kind = (kind << 1) | self.read_bit()
            kind = (kind << 1) | self.read_bit()
        return kind


def _overflow(advance: int, length: int) -> MongoError:
    # BufReader's ConstDataRangeCursor status for a read past the end.
    return MongoError(
        15, f"Invalid advance ({advance}) past end of buffer[{length}] at offset: 0"
    )


def _parse_type_bits(payload: bytes) -> bytes:
    """The data bytes of a serialized TypeBits (`TypeBits::resetFromBuffer`)."""
    if not payload:
        return b""
    first = payload[0]
    if first < 0x80:
        # A single byte that is its own data; 0 means all zeros.
        return payload[:1] if first else b""
    rest = payload[1:]
    if first > 0x80:
        size = first & 0x7F
    else:
        if len(rest) < 4:
            raise MongoError(
                15,
                f"buffer size too small to read (4) bytes out of buffer[{len(rest)}] at offset: 0",
            )
        size = int.from_bytes(rest[:4], "little")
        if size <= 127:
            raise KeyStringError(50910, "Invalid overlong encoding.")
        rest = rest[4:]
    if size > len(rest):
        raise _overflow(size, len(rest))
    return rest[:size]


# ---------------------------------------------------------------------------------------------
# Numbers


def _int_body(n: int) -> bytes:
    """CType + bytes of a non-zero integer with |n| < 2**63 (fraction flag clear)."""
    if n > 0:
        v = n << 1
        k = (v.bit_length() + 7) >> 3
        return bytes((0x2A + k,)) + v.to_bytes(k, "big")
    v = (-n) << 1
    k = (v.bit_length() + 7) >> 3
    return bytes((0x28 - k,)) + (((1 << (8 * k)) - 1) ^ v).to_bytes(k, "big")


_SMALL_INTS = {n: _int_body(n) for n in range(-256, 257) if n}


def _large_magnitude(x: float) -> bytes:
    """|x| >= 2**63 or infinite: 0x33/0x1F + 8 bytes."""
    neg = x < 0
    if x in (float("inf"), float("-inf")):
        e = _MASK64
    else:
        e = ((_DBL_BITS.unpack(_DBL.pack(x))[0] << 1) & _MASK64) & ~(1 << 63)
    if neg:
        return bytes((NUMERIC_NEG_LARGE,)) + _U64BE.pack(e ^ _MASK64)
    return bytes((NUMERIC_POS_LARGE,)) + _U64BE.pack(e)


def int_body(n: int) -> bytes:
    """KeyString bytes of an int32/int64 value (no type bits)."""
    if not n:
        return b"\x29"
    b = _SMALL_INTS.get(n)
    if b is not None:
        return b
    if n == -(1 << 63):
        return _large_magnitude(-_TWO_POW_63)  # int64 min has no integer encoding
    return _int_body(n)


def double_body(x: float) -> bytes:
    """KeyString bytes of a double (no type bits); integral values encode as integers."""
    if x != x:
        return b"\x1e"
    if x == 0.0:
        return b"\x29"
    neg = x < 0
    m = -x if neg else x
    if m < 1.0:
        if m >= _TWO_POW_M255:
            e = _DBL_BITS.unpack(_DBL.pack(m))[0] << 2
        else:
            e = (_DBL_BITS.unpack(_DBL.pack(m * 2.0**256))[0] << 1) + (1 << 62)
        if neg:
            return bytes((NUMERIC_NEG_SMALL,)) + _U64BE.pack(e ^ _MASK64)
        return bytes((NUMERIC_POS_SMALL,)) + _U64BE.pack(e)
    if m >= _TWO_POW_63:
        return _large_magnitude(x)
    i = int(m)
    if i == m:
        return int_body(-i if neg else i)
    # Integer part with its fraction flag set, then the binary fraction in the spare bytes.
    f = (64 - (i << 1).bit_length()) >> 3
    e = (((i << 1) | 1) << (8 * f)) | int((m - i) * float(1 << (8 * f)))
    if neg:
        return bytes((NUMERIC_NEG_8BYTE_INT + f,)) + _U64BE.pack(e ^ _MASK64)
    return bytes((NUMERIC_POS_8BYTE_INT - f,)) + _U64BE.pack(e)


def _decimal_module() -> ModuleType:  # imported lazily: decimals in keys are rare
    from pipeline_stages import _keystring_decimal

    return _keystring_decimal


# ---------------------------------------------------------------------------------------------
# Encoding


class Builder(TypeBitsWriter):
    """Appends values to a KeyString (`out`) and to its type bits (inherited); `finish()`
    adds kEnd."""

    __slots__ = ("out",)

    def __init__(self, prefix: bytes = b"", prefix_bits: tuple[int, int] = (0, 0)) -> None:
        # `prefix`: already-encoded leading values; `prefix_bits`: their (bits, bit count).
        self.out = bytearray(prefix)
        self.value, self.count = prefix_bits

    def finish(self) -> tuple[bytes, bytes | None]:
        self.out.append(END)
        return bytes(self.out), self.serialize()

    # Typed appends used by the resume token encoder: they mirror BSONObjBuilder's choices.
    def append_int32(self, n: int) -> None:
        self.out += int_body(n)
        self.count += 2

    def append_bool(self, b: bool) -> None:
        self.out.append(BOOL_TRUE if b else BOOL_FALSE)

    def append_null(self) -> None:
        self.out.append(NULLISH)

    def append_timestamp(self, t: int, i: int) -> None:
        self.out.append(TIMESTAMP)
        self.out += _U64BE.pack((t << 32) | i)

    def append_uuid(self, raw16: bytes) -> None:
        self.out += b"\x5a\x10\x04"
        self.out += raw16

    def append_string(self, s: str) -> None:
        out = self.out
        out.append(STRING_LIKE)
        b = bson_bytes.utf8(s)
        out += b.replace(b"\x00", b"\x00\xff") if b"\x00" in b else b
        out.append(0)
        self.count += 1

    def append_document(self, raw: bytes, pos: int = 0) -> int:
        """Append a BSON document (starting at `pos` in `raw`) as a KeyString object."""
        self.out.append(OBJECT)
        return self._append_fields(raw, pos)

    def append_values(self, raw: bytes, pos: int = 0) -> int:
        """Append every value of a BSON document in order, ignoring names (top level)."""
        end: int = pos + _I32.unpack_from(raw, pos)[0] - 1
        pos += 4
        while pos < end:
            t = raw[pos]
            pos = raw.index(0, pos + 1) + 1
            pos = self.append_element(t, raw, pos)
        return end + 1

    def _append_fields(self, raw: bytes, pos: int) -> int:
        out = self.out
        end: int = pos + _I32.unpack_from(raw, pos)[0] - 1
        pos += 4
        while pos < end:
            t = raw[pos]
            name_end = raw.index(0, pos + 1)
            out += _GENERIC_BYTE[t]
            out += raw[pos + 1 : name_end + 1]
            pos = self.append_element(t, raw, name_end + 1)
        out.append(0)
        return end + 1

    def append_element(self, t: int, raw: bytes, pos: int) -> int:
        """Append the BSON value of type `t` found at `pos`; return the position after it."""
        out = self.out
        bits = self
        if t == 0x07:  # ObjectId
            out.append(OID)
            out += raw[pos : pos + 12]
            return pos + 12
        if t == 0x02 or t == 0x0E or t == 0x0D:  # string, symbol, code
            n: int = _I32.unpack_from(raw, pos)[0]
            s = raw[pos + 4 : pos + 3 + n]
            out.append(CODE if t == 0x0D else STRING_LIKE)
            out += bytes(s).replace(b"\x00", b"\x00\xff") if 0 in s else s
            out.append(0)
            if t == 0x02:
                bits.count += 1
            elif t == 0x0E:
                bits.value |= 1 << bits.count
                bits.count += 1
            return pos + 4 + n
        if t == 0x10:
            out += int_body(_I32.unpack_from(raw, pos)[0])
            bits.count += 2
            return pos + 4
        if t == 0x12:
            out += int_body(_I64.unpack_from(raw, pos)[0])
            bits.value |= 2 << bits.count
            bits.count += 2
            return pos + 8
        if t == 0x01:
            x = _DBL.unpack_from(raw, pos)[0]
            out += double_body(x)
            if x == 0.0 and math.copysign(1.0, x) < 0:
                bits.value |= 0b11 << bits.count  # bits 1,1,0,0,0
                bits.count += 5
            else:
                bits.value |= 1 << bits.count
                bits.count += 2
            return pos + 8
        if t == 0x03:
            out.append(OBJECT)
            return self._append_fields(raw, pos)
        if t == 0x04:
            out.append(ARRAY)
            end: int = pos + _I32.unpack_from(raw, pos)[0] - 1
            p = pos + 4
            while p < end:
                et = raw[p]
                p = raw.index(0, p + 1) + 1
                p = self.append_element(et, raw, p)
            out.append(0)
            return end + 1
        if t == 0x05:
            n = _I32.unpack_from(raw, pos)[0]
            out.append(BINDATA)
            if n < 0xFF:
                out.append(n)
            else:
                out.append(0xFF)
                out += _U32BE.pack(n)
            out += raw[pos + 4 : pos + 5 + n]  # subtype byte, then the bytes
            return pos + 5 + n
        if t == 0x08:
            out.append(BOOL_TRUE if raw[pos] else BOOL_FALSE)
            return pos + 1
        if t == 0x09:
            out.append(DATE)
            out += _U64BE.pack(_U64.unpack_from(raw, pos)[0] ^ (1 << 63))
            return pos + 8
        if t == 0x0A:
            out.append(NULLISH)
            return pos
        if t == 0x11:
            out.append(TIMESTAMP)
            out += _U64BE.pack(_U64.unpack_from(raw, pos)[0])
            return pos + 8
        if t == 0x13:
            _decimal_module().encode_decimal(bytes(raw[pos : pos + 16]), out, bits)
            return pos + 16
        if t == 0x0B:  # pattern and flags are already NUL-terminated C strings
            end = raw.index(0, raw.index(0, pos) + 1) + 1
            out.append(REGEX)
            out += raw[pos:end]
            return end
        if t == 0x0C:  # DBPointer: namespace length (without its NUL), namespace, OID
            n = _I32.unpack_from(raw, pos)[0]
            out.append(DBREF)
            out += _U32BE.pack(n - 1)
            out += raw[pos + 4 : pos + 3 + n]
            out += raw[pos + 4 + n : pos + 16 + n]
            return pos + 16 + n
        if t == 0x0F:  # code with scope: int32 total, string, document
            n = _I32.unpack_from(raw, pos + 4)[0]
            s = raw[pos + 8 : pos + 7 + n]
            out.append(CODE_WITH_SCOPE)
            out += bytes(s).replace(b"\x00", b"\x00\xff") if 0 in s else s
            out.append(0)
            return self._append_fields(raw, pos + 8 + n)
        if t == 0x06:
            out.append(UNDEFINED)
            return pos
        if t == 0xFF:
            out.append(MIN_KEY)
            return pos
        if t == 0x7F:
            out.append(MAX_KEY)
            return pos
        raise MongoError(2, f"cannot encode BSON type {t} in a KeyString")


def encode_bson(raw: bytes) -> tuple[bytes, bytes | None]:
    """KeyString of every value of a BSON document, in order (`Builder(V1, obj, allAscending)`)."""
    b = Builder()
    b.append_values(raw)
    return b.finish()


def encode_values(values: Iterable[object]) -> tuple[bytes, bytes | None]:
    """KeyString of Python/bson values (convenience; names are irrelevant)."""
    return encode_bson(bson_bytes.encode({str(i): v for i, v in enumerate(values)}))


# ---------------------------------------------------------------------------------------------
# Decoding (toBsonSafe): KeyString + type bits -> raw BSON elements


class _Reader:
    __slots__ = ("data", "pos", "bits")

    def __init__(self, data: bytes, bits: TypeBitsReader) -> None:
        self.data = data
        self.pos = 0
        self.bits = bits

    def take(self, n: int) -> bytes:
        p = self.pos
        if p + n > len(self.data):
            raise _overflow(n, len(self.data) - p)
        self.pos = p + n
        return self.data[p : p + n]

    def byte(self) -> int:
        p = self.pos
        if p >= len(self.data):
            raise _overflow(1, 0)
        self.pos = p + 1
        return self.data[p]

    def cstring(self) -> bytes:
        """Bytes up to the next NUL (field names, regex parts: no escaping)."""
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise KeyStringError(50816, "Failed to find null terminator in string.")
        s = self.data[self.pos : end]
        self.pos = end + 1
        return s

    def string_like(self) -> bytes:
        """A string body: NUL is escaped as 00 FF; a bare 00 ends it."""
        data = self.data
        start = self.pos
        end = data.find(b"\x00", start)
        if end < 0:
            raise KeyStringError(50816, "Failed to find null terminator in string.")
        if end + 1 < len(data) and data[end + 1] == 0xFF:
            parts = []
            while end + 1 < len(data) and data[end + 1] == 0xFF:
                parts.append(data[start : end + 1])
                start = end + 2
                end = data.find(b"\x00", start)
                if end < 0:
                    raise KeyStringError(50816, "Failed to find null terminator in string.")
            parts.append(data[start:end])
            self.pos = end + 1
            return b"".join(parts)
        self.pos = end + 1
        return data[start:end]

    def value(self, ctype: int) -> tuple[int, bytes]:
        """One value whose CType byte was just read, as (BSON type, BSON value bytes)."""
        if ctype == OID:
            return 0x07, self.take(12)
        if ctype == STRING_LIKE:
            s = self.string_like()
            t = 0x0E if self.bits.read_bit() else 0x02
            return t, _I32.pack(len(s) + 1) + s + b"\x00"
        if NUMERIC <= ctype <= NUMERIC_POS_LARGE:
            return self.number(ctype)
        if ctype == OBJECT:
            return 0x03, self.document()
        if ctype == ARRAY:
            parts = []
            i = 0
            while True:
                c = self.byte()
                if c == 0:
                    break
                t, v = self.value(c)
                parts.append(bytes((t,)) + str(i).encode() + b"\x00" + v)
                i += 1
            body = b"".join(parts)
            return 0x04, _I32.pack(len(body) + 5) + body + b"\x00"
        if ctype == BOOL_FALSE:
            return 0x08, b"\x00"
        if ctype == BOOL_TRUE:
            return 0x08, b"\x01"
        if ctype == NULLISH:
            return 0x0A, b""
        if ctype == BINDATA:
            n = self.byte()
            if n == 0xFF:
                n = _U32BE.unpack(self.take(4))[0]
            sub = self.take(1)
            return 0x05, _I32.pack(n) + sub + self.take(n)
        if ctype == DATE:
            return 0x09, _U64.pack(_U64BE.unpack(self.take(8))[0] ^ (1 << 63))
        if ctype == TIMESTAMP:
            return 0x11, _U64.pack(_U64BE.unpack(self.take(8))[0])
        if ctype == MIN_KEY:
            return 0xFF, b""
        if ctype == MAX_KEY:
            return 0x7F, b""
        if ctype == UNDEFINED:
            return 0x06, b""
        if ctype == REGEX:
            pattern = self.cstring()
            flags = self.cstring()
            return 0x0B, pattern + b"\x00" + flags + b"\x00"
        if ctype == DBREF:
            n = _U32BE.unpack(self.take(4))[0]
            ns = self.take(n)
            return 0x0C, _I32.pack(n + 1) + ns + b"\x00" + self.take(12)
        if ctype == CODE:
            s = self.string_like()
            return 0x0D, _I32.pack(len(s) + 1) + s + b"\x00"
        if ctype == CODE_WITH_SCOPE:
            s = self.string_like()
            scope = self.document()
            body = _I32.pack(len(s) + 1) + s + b"\x00" + scope
            return 0x0F, _I32.pack(len(body) + 4) + body
        raise KeyStringError(50811, f"Unknown type: {ctype}")

    def document(self) -> bytes:
        parts = []
        while True:
            c = self.byte()
            if c == 0:
                break
            name = self.cstring()
            t, v = self.value(self.byte())
            parts.append(bytes((t,)) + name + b"\x00" + v)
        body = b"".join(parts)
        return _I32.pack(len(body) + 5) + body + b"\x00"

    def number(self, ctype: int) -> tuple[int, bytes]:
        bits = self.bits
        if ctype == NUMERIC_ZERO:
            kind = bits.read_zero()
            if kind == KIND_INT:
                return 0x10, b"\x00\x00\x00\x00"
            if kind == KIND_LONG:
                return 0x12, bytes(8)
            if kind == KIND_DOUBLE:
                return 0x01, bytes(8)
            if kind == NEGATIVE_DOUBLE_ZERO:
                return 0x01, _DBL.pack(-0.0)
            return 0x13, _decimal_module().decode_decimal_zero(kind, bits)
        kind = bits.read_numeric()
        if kind == KIND_DECIMAL:
            dec, self.pos = _decimal_module().decode_decimal(ctype, self.data, self.pos, bits)
            return 0x13, dec
        if ctype == NUMERIC:
            if kind != KIND_DOUBLE:
                raise KeyStringError(50819, "Invalid type bits for numeric NaN")
            return 0x01, _DBL.pack(float("nan"))
        neg = ctype < NUMERIC_ZERO
        if ctype == NUMERIC_POS_LARGE or ctype == NUMERIC_NEG_LARGE:
            e = _U64BE.unpack(self.take(8))[0]
            if neg:
                e ^= _MASK64
            if e == _MASK64:
                x = float("inf")
            elif e >> 63:
                raise KeyStringError(50818, "Invalid type bits for decimal number.")
            else:
                x = _DBL.unpack(_DBL_BITS.pack((e >> 1) | (1 << 62)))[0]
            if neg:
                x = -x
            if kind == KIND_DOUBLE:
                return 0x01, _DBL.pack(x)
            if kind == KIND_LONG and x == -_TWO_POW_63:
                return 0x12, _I64.pack(-(1 << 63))
            if kind == KIND_LONG:
                raise KeyStringError(50821, "Unexpected value for large number.")
            raise KeyStringError(50826, "Unexpected type of large number.")
        if ctype == NUMERIC_POS_SMALL or ctype == NUMERIC_NEG_SMALL:
            word = self.data[self.pos : self.pos + 8]
            top = (word[0] ^ (0xFF if neg else 0)) >> 6 if word else 0
            if top == 0:  # below the smallest double: only a decimal encodes this way
                dec, self.pos = _decimal_module().decode_decimal(
                    ctype, self.data, self.pos, bits
                )
                return 0x13, dec
            e = _U64BE.unpack(self.take(8))[0]
            if neg:
                e ^= _MASK64
            if kind != KIND_DOUBLE:
                if top == 0b11:
                    raise KeyStringError(
                        50825, "Unexpected type for small number, expected decimal."
                    )
                raise KeyStringError(50823, "Expected decimal continuation.")
            if top == 0b11:
                if e & 3:
                    raise KeyStringError(50824, "Decimal contuation mismatch.")
                x = _DBL.unpack(_DBL_BITS.pack(e >> 2))[0]
            else:
                if e & 1:
                    raise KeyStringError(50822, "Unexpected decimal continuation.")
                x = _DBL.unpack(_DBL_BITS.pack((e - (1 << 62)) >> 1))[0] * 2.0**-256
            return 0x01, _DBL.pack(-x if neg else x)
        k = ctype - NUMERIC_POS_SMALL if not neg else NUMERIC_NEG_SMALL - ctype
        if self.pos + k > len(self.data):  # mongod reads these bytes one at a time
            raise _overflow(1, 0)
        raw = self.take(k)
        if neg:
            raw = raw.translate(_INVERT)
        e = int.from_bytes(raw, "big")
        i = e >> 1
        if not e & 1:
            n = -i if neg else i
            if kind == KIND_INT:  # a C cast: only the low 32 bits survive
                return 0x10, _I32.pack(((n + (1 << 31)) & 0xFFFFFFFF) - (1 << 31))
            if kind == KIND_LONG:
                return 0x12, _I64.pack(n)
            return 0x01, _DBL.pack(float(n))
        if kind != KIND_DOUBLE:
            raise KeyStringError(50810, "Expected type Decimal.")
        rest = self.take(8 - k)
        if neg:
            rest = rest.translate(_INVERT)
        frac = int.from_bytes(rest, "big") & ~3
        x = float(i) + frac * 2.0 ** (-8 * (8 - k))
        return 0x01, _DBL.pack(-x if neg else x)


def decode(
    data: bytes, type_bits: bytes | TypeBitsReader | None = None
) -> list[tuple[int, bytes]]:
    """Top-level values of a KeyString as (BSON type, BSON value bytes), up to kEnd."""
    if not isinstance(type_bits, TypeBitsReader):
        type_bits = TypeBitsReader(type_bits)
    r = _Reader(data, type_bits)
    values = []
    n = len(data)
    while r.pos < n:
        c = r.byte()
        if c == END:
            break
        values.append(r.value(c))
    return values


def decode_to_bson(data: bytes, type_bits: bytes | None = None) -> bytes:
    """The values as one BSON document with field names '0', '1', ... (an array body)."""
    body = b"".join(
        bytes((t,)) + str(i).encode() + b"\x00" + v
        for i, (t, v) in enumerate(decode(data, type_bits))
    )
    return _I32.pack(len(body) + 5) + body + b"\x00"


def element_to_python(t: int, v: bytes) -> object:
    """A decoded value as pymongo gives it (lossy for undefined/symbol/DBPointer)."""
    return bson_bytes.decode(_wrap(t, v))[""]


def _wrap(t: int, v: bytes) -> bytes:
    body = bytes((t,)) + b"\x00" + v
    return _I32.pack(len(body) + 5) + body + b"\x00"
