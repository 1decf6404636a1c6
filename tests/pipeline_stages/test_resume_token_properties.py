"""Property tests for the KeyString V1 / resume-token codec.

Checked against /work/shared/reference/resume_tokens.md §1–3:

* every BSON type that can occur in a documentKey / operationDescription (int32, int64,
  double incl. ±0/NaN/±inf/subnormals, Decimal128, string, symbol, object, array, BinData of
  every subtype and length class, ObjectId, bool, Date, Timestamp, null, undefined, regex,
  DBPointer, code, code with scope, MinKey, MaxKey) survives `keystring.encode_bson` ->
  `keystring.decode_to_bson` byte for byte, and `_typeBits` of every size class round-trips;
* `ResumeTokenData` of versions 0, 1 and 2 (events and high-water marks) survives
  `to_document()` -> `decode()` (also from lower-case hex), re-encodes to the identical
  `_data` / `_typeBits`, and `_typeBits` appears exactly when a NumberLong, double, Decimal128,
  -0.0 or Symbol occurs (§2.8); `make_event_identifier` builds the §1.4 eventIdentifier, and
  `ResumeTokenData.for_event` encodes exactly like the plain constructor;
* the string order of `_data` (`sort_key`) is the semantic order of same-version tokens, with an
  independent BSON comparator (written from MongoDB's comparison rules, not from the codec) as
  the oracle; every pair of BSON types, and every pair of hand-picked numeric edge values
  (including decimals that share one double approximation), is also checked exhaustively;
* semantically equal values (1, 1.0, NumberLong(1), NumberDecimal("1.0"), "x" vs Symbol("x"),
  ...) give the identical `_data` and differ only in `_typeBits`.

Cross-version order is intentionally not checked (version sorts before tokenType, §3).

Values are modelled as plain tuples, e.g. ("int32", 1) or ("object", (("_id", v), ...)), and
serialized by a small raw BSON builder in this file, because pymongo cannot produce undefined,
symbol or DBPointer. The builder itself is cross-checked against `bson.encode` for the types
pymongo can produce. Only the canonical NaN is generated (KeyString keeps no NaN payload).
Decimal128 needs `pipeline_stages/_keystring_decimal.py`; the tests that generate decimals are
skipped while that module does not exist. CDC_PROPERTY_SCALE=N runs N times the examples.
"""

from __future__ import annotations

import decimal
import importlib.util
import math
import os
import struct
from decimal import Decimal
from typing import NamedTuple

import bson
import pytest
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from pipeline_stages import keystring, resume_token
from pipeline_stages.resume_token import ResumeTokenData, make_event_identifier, sort_key

HAVE_DECIMAL = importlib.util.find_spec("pipeline_stages._keystring_decimal") is not None
needs_decimal = pytest.mark.skipif(
    not HAVE_DECIMAL,
    reason="pipeline_stages/_keystring_decimal.py (Decimal128 KeyString support) not present yet",
)

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# CDC_PROPERTY_SCALE=20 (say) runs 20x the examples, for a longer local soak.
_SCALE = float(os.environ.get("CDC_PROPERTY_SCALE", "1"))

PROPS = settings(
    max_examples=max(1, int(120 * _SCALE)),
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
FEWER = settings(PROPS, max_examples=max(1, int(80 * _SCALE)))
MORE = settings(PROPS, max_examples=max(1, int(400 * _SCALE)))

# ---------------------------------------------------------------------------------------------
# The value model and a raw BSON builder (independent of the codec and of pymongo).

_I32 = struct.Struct("<i")
CANONICAL_NAN = struct.unpack("<d", bytes.fromhex("000000000000f87f"))[0]

TYPE_BYTE = {
    "double": 0x01, "string": 0x02, "object": 0x03, "array": 0x04, "bindata": 0x05,
    "undefined": 0x06, "oid": 0x07, "bool": 0x08, "date": 0x09, "null": 0x0A, "regex": 0x0B,
    "dbpointer": 0x0C, "code": 0x0D, "symbol": 0x0E, "cws": 0x0F, "int32": 0x10,
    "timestamp": 0x11, "int64": 0x12, "decimal": 0x13, "minkey": 0xFF, "maxkey": 0x7F,
}
NUMERIC_KINDS = frozenset({"int32", "int64", "double", "decimal"})


def _cstring(s: str) -> bytes:
    b = s.encode()
    assert b"\x00" not in b, s
    return b + b"\x00"


def _bson_string(s: str) -> bytes:
    b = s.encode()
    return _I32.pack(len(b) + 1) + b + b"\x00"


def raw_document(fields) -> bytes:
    """int32 length + elements + 0x00."""
    body = b"".join(raw_element(name, v) for name, v in fields)
    return _I32.pack(len(body) + 5) + body + b"\x00"


def raw_element(name: str, v: tuple) -> bytes:
    """type byte + cstring name + value bytes."""
    return bytes((TYPE_BYTE[v[0]],)) + _cstring(name) + raw_value(v)


def raw_value(v: tuple) -> bytes:
    match v:
        case ("minkey",) | ("maxkey",) | ("null",) | ("undefined",):
            return b""
        case ("int32", n):
            return struct.pack("<i", n)
        case ("int64", n):
            return struct.pack("<q", n)
        case ("double", x):
            return struct.pack("<d", x)
        case ("decimal", d):
            return d.bid
        case ("string", s) | ("symbol", s) | ("code", s):
            return _bson_string(s)
        case ("object", fields):
            return raw_document(fields)
        case ("array", items):
            return raw_document([(str(i), x) for i, x in enumerate(items)])
        case ("bindata", subtype, data):
            return _I32.pack(len(data)) + bytes((subtype,)) + data
        case ("oid", b):
            return b
        case ("bool", b):
            return b"\x01" if b else b"\x00"
        case ("date", ms):
            return struct.pack("<q", ms)
        case ("timestamp", t, i):
            return struct.pack("<II", i, t)  # increment in the low half
        case ("regex", pattern, flags):
            return _cstring(pattern) + _cstring(flags)
        case ("dbpointer", ns, oid):
            return _bson_string(ns) + oid
        case ("cws", code, scope):
            body = _bson_string(code) + raw_document(scope)
            return _I32.pack(len(body) + 4) + body
    raise AssertionError(f"bad model value {v!r}")


class Unsupported(Exception):
    """The value has no pymongo representation (undefined, symbol, DBPointer, ...)."""


def to_python(v: tuple):
    """The pymongo value that `bson.encode` turns into `raw_value(v)` (builder cross-check)."""
    match v:
        case ("minkey",):
            return MinKey()
        case ("maxkey",):
            return MaxKey()
        case ("null",):
            return None
        case ("int32", n):
            return n
        case ("int64", n):
            return Int64(n)
        case ("double", x):
            return x
        case ("decimal", d):
            return d
        case ("string", s):
            return s
        case ("object", fields):
            return {name: to_python(x) for name, x in fields}
        case ("array", items):
            return [to_python(x) for x in items]
        case ("bindata", 2, data):
            # pymongo writes the old-binary inner length itself.
            if len(data) < 4 or _I32.unpack_from(data)[0] != len(data) - 4:
                raise Unsupported(v)
            return Binary(data[4:], 2)
        case ("bindata", subtype, data):
            return Binary(data, subtype)
        case ("oid", b):
            return ObjectId(b)
        case ("bool", b):
            return b
        case ("date", ms):
            return DatetimeMS(ms)
        case ("timestamp", t, i):
            return Timestamp(t, i)
        case ("regex", pattern, flags):
            return Regex(pattern, flags)
        case ("code", s):
            return Code(s)
        case ("cws", code, scope):
            return Code(code, {name: to_python(x) for name, x in scope})
    raise Unsupported(v)


def children(v: tuple):
    match v:
        case ("object", fields) | ("cws", _, fields):
            return [x for _, x in fields]
        case ("array", items):
            return list(items)
    return []


def walk(v: tuple):
    yield v
    for c in children(v):
        yield from walk(c)


def needs_type_bits(v: tuple) -> bool:
    """§2.8: some type bit is 1 iff a NumberLong, double (incl. -0.0/NaN), decimal or symbol."""
    return any(x[0] in ("int64", "double", "decimal", "symbol") for x in walk(v))


# ---------------------------------------------------------------------------------------------
# Oracle: MongoDB's BSON comparison (canonical type, then value; objects field by field).

CANONICAL_RANK = {
    "minkey": -1, "undefined": 0, "null": 5,
    "int32": 10, "int64": 10, "double": 10, "decimal": 10,
    "string": 15, "symbol": 15, "object": 20, "array": 25, "bindata": 30, "oid": 35,
    "bool": 40, "date": 45, "timestamp": 47, "regex": 50, "dbpointer": 55, "code": 60,
    "cws": 65, "maxkey": 127,
}


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def exact_number(v: tuple) -> Decimal | None:
    """The exact numeric value (Decimal(float) is exact); None for NaN."""
    kind, x = v[0], v[1]
    if kind in ("int32", "int64"):
        return Decimal(x)
    if kind == "double":
        return None if math.isnan(x) else Decimal(x)
    d = x.to_decimal()
    return None if d.is_nan() else d


def compare_values(a: tuple, b: tuple) -> int:
    ra, rb = CANONICAL_RANK[a[0]], CANONICAL_RANK[b[0]]
    if ra != rb:
        return _cmp(ra, rb)
    kind = a[0]
    if ra == 10:  # numbers: NaN == NaN < every other number; others exactly
        x, y = exact_number(a), exact_number(b)
        if x is None or y is None:
            return _cmp(x is not None, y is not None)
        return _cmp(x, y)
    if ra == 15 or kind == "code":  # string/symbol/code: bytes, shorter prefix first
        return _cmp(a[1].encode(), b[1].encode())
    if kind == "object":
        return compare_fields(a[1], b[1])
    if kind == "array":
        for x, y in zip(a[1], b[1], strict=False):
            c = _cmp(CANONICAL_RANK[x[0]], CANONICAL_RANK[y[0]]) or compare_values(x, y)
            if c:
                return c
        return _cmp(len(a[1]), len(b[1]))
    if kind == "bindata":  # length, then subtype, then bytes
        return _cmp((len(a[2]), a[1], a[2]), (len(b[2]), b[1], b[2]))
    if kind in ("oid", "bool", "date"):
        return _cmp(a[1], b[1])
    if kind == "timestamp":  # unsigned t, then i
        return _cmp((a[1], a[2]), (b[1], b[2]))
    if kind == "regex":
        return _cmp((a[1].encode(), a[2].encode()), (b[1].encode(), b[2].encode()))
    if kind == "dbpointer":  # namespace length, namespace bytes, oid
        na, nb = a[1].encode(), b[1].encode()
        return _cmp((len(na), na, a[2]), (len(nb), nb, b[2]))
    if kind == "cws":
        return _cmp(a[1].encode(), b[1].encode()) or compare_fields(a[2], b[2])
    return 0  # minkey, maxkey, null, undefined


def compare_fields(fa, fb) -> int:
    for (na, va), (nb, vb) in zip(fa, fb, strict=False):
        c = (
            _cmp(CANONICAL_RANK[va[0]], CANONICAL_RANK[vb[0]])
            or _cmp(na.encode(), nb.encode())
            or compare_values(va, vb)
        )
        if c:
            return c
    return _cmp(len(fa), len(fb))


def _cmp_optional(a, b, compare=_cmp) -> int:
    """Absent (None) sorts before any present value."""
    if a is None or b is None:
        return _cmp(a is not None, b is not None)
    return compare(a, b)


# ---------------------------------------------------------------------------------------------
# Equal-value variants (same _data, different _typeBits) and numeric helpers.


def _decimal128(d: Decimal) -> Decimal128 | None:
    try:
        return Decimal128(d)
    except (ArithmeticError, ValueError):  # decimal.Inexact / Overflow / InvalidOperation
        return None


def numeric_equivalents(v: tuple, allow_decimal: bool) -> list[tuple]:
    """Every model number (within a few representations) equal to v."""
    x = exact_number(v)
    out = [v]
    if x is None:
        out.append(("double", CANONICAL_NAN))
        if allow_decimal:
            out.append(("decimal", Decimal128("NaN")))
        return out
    if x.is_infinite():
        out.append(("double", math.copysign(math.inf, x)))
        if allow_decimal:
            out.append(("decimal", Decimal128("Infinity" if x > 0 else "-Infinity")))
        return out
    if x == x.to_integral_value(rounding=decimal.ROUND_DOWN):
        n = int(x)
        if -(2**31) <= n < 2**31:
            out.append(("int32", n))
        if -(2**63) <= n < 2**63:
            out.append(("int64", n))
    if x == 0:
        out += [("double", 0.0), ("double", -0.0)]
    else:
        f = float(x)
        if not math.isinf(f) and Decimal(f) == x:
            out.append(("double", f))
    if allow_decimal:
        if x == 0:
            out += [("decimal", Decimal128(s)) for s in ("0", "-0", "0E+7", "-0.000", "0E-6176")]
        else:
            sign, digits, exp = x.as_tuple()
            while len(digits) > 1 and digits[-1] == 0:
                digits, exp = digits[:-1], exp + 1
            for extra in (0, 1, 3):
                d = _decimal128(Decimal((sign, digits + (0,) * extra, exp - extra)))
                if d is not None and d.to_decimal() == x:
                    out.append(("decimal", d))
    return out


@st.composite
def equal_variant(draw, v: tuple, allow_decimal: bool) -> tuple:
    """A value equal to v under BSON comparison (numbers retyped, string <-> symbol)."""
    kind = v[0]
    if kind in NUMERIC_KINDS:
        return draw(st.sampled_from(numeric_equivalents(v, allow_decimal)))
    if kind in ("string", "symbol"):
        return (draw(st.sampled_from(["string", "symbol"])), v[1])
    if kind == "object":
        return ("object", draw(_equal_fields(v[1], allow_decimal)))
    if kind == "array":
        return ("array", tuple(draw(equal_variant(x, allow_decimal)) for x in v[1]))
    if kind == "cws":
        return ("cws", v[1], draw(_equal_fields(v[2], allow_decimal)))
    return v


@st.composite
def _equal_fields(draw, fields, allow_decimal: bool):
    return tuple((name, draw(equal_variant(x, allow_decimal))) for name, x in fields)


# ---------------------------------------------------------------------------------------------
# Strategies.

TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=10),
    st.sampled_from(
        ["", "\x00", "a\x00b", "a\x00", "\x00\x00", "é", "日本語", "\U0001f600", "\x7f"]
    ),
)
NUL_FREE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
NAMES = st.one_of(NUL_FREE, st.sampled_from(["", "_id", "a", "b", "ab", "x.y", "$k", "é"]))
SMALL_NAMES = st.sampled_from(["", "_id", "a", "b", "ab", "é"])

U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1]))
INT32 = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 1, -1, 2, 127, 128, -128, -129, 255, 256, 2**31 - 1, -(2**31)]),
)
INT64 = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(
        [0, 1, -1, 2**31, -(2**31) - 1, 2**32, 2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 1,
         2**62, 2**63 - 1, -(2**63), -(2**63) + 1]
    ),
)
SPECIAL_DOUBLES = [
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.1, 1.5, 5.5, -5.5, 11.112, math.inf, -math.inf,
    CANONICAL_NAN, 1e300, -1e300, 5e-324, -5e-324, 1e-310, 2.2250738585072014e-308,
    1.7976931348623157e308, 2.0**63, -(2.0**63), 2.0**64, math.nextafter(2.0**63, 0),
    math.nextafter(2.0**63, math.inf), float(2**53), float(2**53 + 2), float(2**53 - 1),
    2.0**52 + 0.5, -(2.0**52) - 0.5, 2.0**31 + 0.25, 2.0**-255, -(2.0**-255), 2.0**-256,
    math.nextafter(2.0**-255, 0), math.nextafter(1.0, 0), math.nextafter(1.0, 2), 255.5, 256.5,
]
DOUBLE = st.one_of(st.floats(allow_nan=False), st.sampled_from(SPECIAL_DOUBLES))
SPECIAL_DECIMALS = [
    "0", "-0", "0E+6111", "-0E-6176", "0.000", "1", "1.0", "1.00", "-1", "0.1", "0.5", "5.5",
    "-5.5", "NaN", "Infinity", "-Infinity", "1E+6144", "-1E+6144",
    "9.999999999999999999999999999999999E+6144", "1E-6176", "-1E-6176",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "9007199254740993",
    "18446744073709551616", "1.7976931348623157E+308", "1.7976931348623159E+308", "5E-324",
    "4.9E-324", "1E-400", "0.1000000000000000055511151231257827",
    "0.1000000000000000055511151231257828", "1234567890123456789012345678901234",
    "1.234567890123456789012345678901234", "123456789012345.6", "0.000001",
]


def _decimal_near_double(x: float, precision: int, rounding: str, extra: int | None):
    """The exact value of double x rounded to `precision` digits, maybe with one more digit:
    decimals that share x's double approximation and need continuation bytes (§2.7)."""
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.rounding = precision, rounding
        d = +Decimal(x)
    sign, digits, exp = d.as_tuple()
    if extra is not None and len(digits) < 34:
        d = Decimal((sign, digits + (extra,), exp - 1))
    return Decimal128(d)


DECIMAL = st.one_of(
    st.sampled_from(SPECIAL_DECIMALS).map(Decimal128),
    st.builds(
        _decimal_near_double,
        st.floats(allow_nan=False, allow_infinity=False),
        st.integers(1, 34),
        st.sampled_from([decimal.ROUND_DOWN, decimal.ROUND_UP, decimal.ROUND_HALF_EVEN]),
        st.one_of(st.none(), st.integers(0, 9)),
    ),
    st.builds(
        lambda sign, coef, exp: Decimal128(Decimal((sign, tuple(map(int, str(coef))), exp))),
        st.integers(0, 1),
        st.one_of(st.integers(0, 10**34 - 1), st.integers(0, 10**16)),
        st.one_of(st.integers(-6176, 6111), st.integers(-40, 20)),
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: Decimal128(repr(x))),
)

_THIRD = 1 / 3
NEAR_DOUBLE_DOUBLES = [
    0.1, math.nextafter(0.1, 0), math.nextafter(0.1, 1), _THIRD, math.nextafter(_THIRD, 1),
    1e22, 1e23, 2.0**63, math.nextafter(2.0**63, 0), 1e-300, 2.0**-1074, 1.7976931348623157e308,
]
NEAR_DOUBLE_DECIMALS = [
    "0.1", "0.10000000000000000", "0.100000000000000", "0.1000000000000000055511151231257827",
    "0.1000000000000000055511151231257828", "0.1000000000000000055511151231257826",
    "0.09999999999999999167332731531132594", "0.09999999999999999167332731531132595",
    "0.10000000000000001", "0.1000000000000000194289029309402179", "0.09999999999999999999",
    "0.1000000000000000000001", "0.0999999999999999999999999999999999",
    "0.3333333333333333", "0.333333333333333", "0.3333333333333333333333333333333333",
    "0.3333333333333333148296162562473910", "0.3333333333333333148296162562473909",
    "0.3333333333333333703407674875052180", "0.3333333333333330000001",
    "0.3333333333333329999999", "1E+22", "1.0E+22", "9999999999999999999999",
    "1E+23", "99999999999999991611392", "99999999999999991611393", "99999999999999991611391",
    "9223372036854775808", "9223372036854775807.5", "9223372036854775808.5",
    "9223372036854774784", "9223372036854774784.1", "1E-300",
    "1.000000000000000000000000000000001E-300",
    "4.940656458412465441765687928682213E-324", "4.940656458412465441765687928682214E-324",
    "1.797693134862315708145274237317043E+308", "1.797693134862315708145274237317044E+308",
]


def _sized_binary(n: int):
    return st.binary(min_size=1, max_size=4).map(lambda seed: (seed * n)[:n])


BIN_DATA = st.one_of(
    st.binary(max_size=20),
    st.sampled_from([0, 16, 254, 255, 300]).flatmap(_sized_binary),
)
OLD_BINARY = st.binary(max_size=12).map(lambda b: _I32.pack(len(b)) + b)  # well-formed subtype 2
BIN_SUBTYPES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80])
REGEX_FLAGS = st.sets(st.sampled_from("ilmsux")).map(lambda s: "".join(sorted(s)))
OIDS = st.binary(min_size=12, max_size=12)


def _fields(values, names, max_size=4):
    return st.lists(
        st.tuples(names, values), max_size=max_size, unique_by=lambda f: f[0]
    ).map(tuple)


def _containers(names):
    def extend(inner):
        return st.one_of(
            _fields(inner, names).map(lambda f: ("object", f)),
            st.lists(inner, max_size=4).map(lambda xs: ("array", tuple(xs))),
            st.tuples(TEXT, _fields(inner, names, 3)).map(lambda t: ("cws", t[0], t[1])),
        )

    return extend


def _doc_key(values, names):
    """A documentKey: `_id` first, then optional (shard key) fields."""
    other = _fields(values, names.filter(lambda n: n != "_id"), 3)
    return st.tuples(values, other).map(lambda t: ("object", (("_id", t[0]),) + t[1]))


class Strategies:
    """Value / document / token strategies, with or without Decimal128."""

    def __init__(self, allow_decimal: bool) -> None:
        self.allow_decimal = allow_decimal
        numbers = [
            INT32.map(lambda n: ("int32", n)),
            INT64.map(lambda n: ("int64", n)),
            DOUBLE.map(lambda x: ("double", x)),
        ]
        if allow_decimal:
            numbers.append(DECIMAL.map(lambda d: ("decimal", d)))
        leaves = st.one_of(
            *numbers,
            st.sampled_from([("minkey",), ("maxkey",), ("null",), ("undefined",)]),
            st.tuples(st.sampled_from(["string", "symbol", "code"]), TEXT),
            st.one_of(
                st.tuples(st.just("bindata"), BIN_SUBTYPES, BIN_DATA),
                st.tuples(st.just("bindata"), st.just(2), OLD_BINARY),
            ),
            OIDS.map(lambda b: ("oid", b)),
            st.booleans().map(lambda b: ("bool", b)),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.sampled_from([0, -1, 1, -(2**63), 2**63 - 1, 1_700_000_000_000]),
            ).map(lambda ms: ("date", ms)),
            st.tuples(st.just("timestamp"), U32, U32),
            st.tuples(st.just("regex"), NUL_FREE, REGEX_FLAGS),
            st.tuples(st.just("dbpointer"), TEXT, OIDS),
        )
        self.values = st.recursive(leaves, _containers(NAMES), max_leaves=10)

        # A small domain, so that random pairs tie often and deep comparisons get exercised.
        small_numbers = [
            0, -0.0, 1, -1, 2, 0.5, 1.5, -0.5, CANONICAL_NAN, math.inf, -math.inf, 2**53 + 1,
            2.0**63, 2**63 - 1, -(2**63), 1e300, 5e-324, 0.1,
        ]
        small_decimals = ["0.1", "1.00", "9007199254740993", "1E+6144", "-1E-6176", "NaN"]

        def small_number(x) -> st.SearchStrategy:
            if isinstance(x, float):
                base = ("double", x)
            else:
                base = ("int64", x) if not -(2**31) <= x < 2**31 else ("int32", x)
            return st.sampled_from(numeric_equivalents(base, allow_decimal))

        small_number_strategies = [small_number(x) for x in small_numbers]
        if allow_decimal:
            small_number_strategies.append(
                st.sampled_from(small_decimals).map(lambda s: ("decimal", Decimal128(s)))
            )
        small_strings = ["", "a", "a\x00", "a\x00b", "ab", "b", "é"]
        small_oids = [bytes(12), bytes(11) + b"\x01", b"\x01" + bytes(11)]
        # Families of values that compare by value rather than by canonical type.
        self.small_by_family = {
            "number": st.one_of(*small_number_strategies),
            "singleton": st.sampled_from([("minkey",), ("maxkey",), ("null",), ("undefined",)]),
            "string": st.tuples(
                st.sampled_from(["string", "symbol"]), st.sampled_from(small_strings)
            ),
            "code": st.sampled_from(small_strings).map(lambda x: ("code", x)),
            "bindata": st.tuples(
                st.just("bindata"),
                st.sampled_from([0, 4, 0x80]),
                st.one_of(
                    st.sampled_from([b"", b"a", b"b", b"ab"]),
                    st.sampled_from([254, 255]).map(lambda n: b"a" * n),
                ),
            ),
            "oid": st.sampled_from(small_oids).map(lambda b: ("oid", b)),
            "bool": st.booleans().map(lambda b: ("bool", b)),
            "date": st.sampled_from([-(2**63), -1, 0, 1, 2**63 - 1]).map(lambda ms: ("date", ms)),
            "timestamp": st.tuples(
                st.just("timestamp"), st.sampled_from([0, 1, 2**31, 2**32 - 1]),
                st.sampled_from([0, 1, 2**31, 2**32 - 1]),
            ),
            "regex": st.tuples(
                st.just("regex"), st.sampled_from(["", "a", "ab", "b"]),
                st.sampled_from(["", "i", "im", "m"]),
            ),
            "dbpointer": st.tuples(
                st.just("dbpointer"), st.sampled_from(["a.b", "ab", "a.bc", "b"]),
                st.sampled_from(small_oids),
            ),
        }
        if allow_decimal:
            # Decimals that share (or neighbour) one double approximation: the continuation
            # markers and bytes of §2.7 have to order them among themselves and the doubles.
            self.small_by_family["near_double"] = st.one_of(
                st.sampled_from(NEAR_DOUBLE_DECIMALS).map(lambda x: ("decimal", Decimal128(x))),
                st.sampled_from(NEAR_DOUBLE_DOUBLES).map(lambda x: ("double", x)),
            )
        small_leaves = st.one_of(*self.small_by_family.values())
        self.small_values = st.recursive(small_leaves, _containers(SMALL_NAMES), max_leaves=5)

        self.doc_keys = _doc_key(self.values, NAMES)
        self.small_doc_keys = _doc_key(self.small_values, SMALL_NAMES)
        self.descriptions = _fields(self.values, NAMES).map(lambda f: ("object", f))
        self.small_descriptions = _fields(self.small_values, SMALL_NAMES, 2).map(
            lambda f: ("object", f)
        )
        self.value_lists = st.lists(self.values, max_size=6)
        same_family_pairs = st.sampled_from(sorted(self.small_by_family)).flatmap(
            lambda f: st.tuples(self.small_by_family[f], self.small_by_family[f])
        )
        self.value_pairs = st.one_of(
            st.tuples(self.small_values, self.small_values),
            same_family_pairs,
            same_family_pairs,
            self.values.flatmap(
                lambda a: st.tuples(
                    st.just(a),
                    st.one_of(
                        equal_variant(a, allow_decimal),
                        mutated(a, self),
                        self.small_values,
                        self.values,
                    ),
                )
            ),
        )
        self.tokens = st.sampled_from([0, 1, 2]).flatmap(lambda v: token_specs(self, v))
        self.token_pairs = token_pairs(self)


FAMILY = {
    "int32": "number", "int64": "number", "double": "number", "decimal": "number",
    "minkey": "singleton", "maxkey": "singleton", "null": "singleton", "undefined": "singleton",
    "string": "string", "symbol": "string",
}


@st.composite
def mutated_document(draw, v: tuple, s: Strategies, protect_first: bool) -> tuple:
    """An object with one field changed, renamed, dropped or added (`_id` kept first)."""
    return ("object", draw(_mutated_fields(v[1], s, protect_first)))


@st.composite
def mutated(draw, v: tuple, s: Strategies) -> tuple:
    """v with one leaf replaced (often by a value of the same family, so that the comparison
    goes down to the value), or one object/array/scope shortened, extended or renamed."""
    kind = v[0]
    if kind == "object" and draw(st.booleans()):
        return ("object", draw(_mutated_fields(v[1], s, False)))
    if kind == "cws" and draw(st.booleans()):
        return ("cws", v[1], draw(_mutated_fields(v[2], s, False)))
    if kind == "array" and draw(st.booleans()):
        items = list(v[1])
        op = draw(st.sampled_from(["child", "truncate", "append"] if items else ["append"]))
        if op == "child":
            i = draw(st.integers(0, len(items) - 1))
            items[i] = draw(mutated(items[i], s))
        elif op == "truncate":
            items = items[: draw(st.integers(0, len(items) - 1))]
        else:
            items.append(draw(s.small_values))
        return ("array", tuple(items))
    same = s.small_by_family.get(FAMILY.get(kind, kind))
    if same is not None and draw(st.integers(0, 3)):
        return draw(same)
    return draw(s.small_values)


@st.composite
def _mutated_fields(draw, fields, s: Strategies, protect_first: bool):
    fields = list(fields)
    lo = 1 if protect_first else 0
    ops = ["append"] + (["child", "child", "truncate", "rename"] if len(fields) > lo else [])
    op = draw(st.sampled_from(ops))
    used = {name for name, _ in fields}
    fresh = st.one_of(SMALL_NAMES, NUL_FREE).filter(lambda n: n not in used)
    if op == "child":
        i = draw(st.integers(0, len(fields) - 1))
        fields[i] = (fields[i][0], draw(mutated(fields[i][1], s)))
    elif op == "truncate":
        fields = fields[: draw(st.integers(lo, len(fields) - 1))]
    elif op == "rename":
        i = draw(st.integers(lo, len(fields) - 1))
        fields[i] = (draw(fresh), fields[i][1])
    else:
        fields.append((draw(fresh), draw(s.small_values)))
    return tuple(fields)


# ---------------------------------------------------------------------------------------------
# Tokens.

# Reference §1.4: the classic operation types (bare documentKey as v0/v1 eventIdentifier).
CLASSIC_OPS = frozenset(
    {"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate",
     "reshardBegin", "reshardDoneCatchUp", "kNewShardDetected"}
)
CRUD_OPS = ["insert", "update", "replace", "delete"]
CLASSIC_DDL_OPS = ["drop", "rename", "dropDatabase"]
EXPANDED_OPS = [
    "create", "createIndexes", "dropIndexes", "modify", "shardCollection",
    "refineCollectionShardKey", "reshardCollection",
]
HWM, EVENT = 0, 128


class TokenSpec(NamedTuple):
    t: int
    i: int
    version: int
    token_type: int
    txn_op_index: int
    from_invalidate: bool
    uuid: bytes | None
    op_type: str | None
    document_key: tuple | None
    operation_description: tuple | None
    fragment_num: int | None

    def identifier_model(self) -> tuple | None:
        """The expected eventIdentifier (reference §1.4), built without the codec."""
        if self.op_type is None:
            return None
        if self.op_type in CLASSIC_OPS and self.version <= 1:
            return self.document_key
        fields = [("operationType", ("string", self.op_type))]
        if self.document_key is not None:
            fields.append(("documentKey", self.document_key))
        elif self.operation_description is not None:
            fields.append(("operationDescription", self.operation_description))
        return ("object", tuple(fields))

    def event_identifier(self) -> bytes | None:
        if self.op_type is None:
            return None
        return make_event_identifier(
            self.op_type,
            self.version,
            document_key=None if self.document_key is None else raw_value(self.document_key),
            operation_description=(
                None
                if self.operation_description is None
                else raw_value(self.operation_description)
            ),
        )

    def data(self) -> ResumeTokenData:
        return ResumeTokenData(
            Timestamp(self.t, self.i),
            version=self.version,
            token_type=self.token_type,
            txn_op_index=self.txn_op_index,
            from_invalidate=self.from_invalidate,
            uuid=self.uuid,
            event_identifier=self.event_identifier(),
            fragment_num=self.fragment_num,
        )

    def needs_type_bits(self) -> bool:
        ident = self.identifier_model()
        return ident is not None and needs_type_bits(ident)


def compare_tokens(a: TokenSpec, b: TokenSpec) -> int:
    """Semantic order of same-version tokens (reference §3)."""
    return (
        _cmp((a.t, a.i), (b.t, b.i))
        or _cmp(a.version, b.version)
        or _cmp(a.token_type, b.token_type)  # HWM (0) < event (128)
        or _cmp(a.txn_op_index, b.txn_op_index)
        or _cmp(a.from_invalidate, b.from_invalidate)
        or _cmp_optional(a.uuid, b.uuid)  # v2 null / v0-v1 absent < any UUID, then bytes
        or _cmp_optional(a.identifier_model(), b.identifier_model(), compare_values)
        or _cmp_optional(a.fragment_num, b.fragment_num)
    )


# Levels at which two tokens can first differ, in encoding order.
L_TS, L_TYPE, L_TXN, L_INV, L_UUID, L_IDENT, L_FRAG, L_ALL = range(8)
SMALL_UUIDS = [bytes(16), bytes(15) + b"\x01", b"\xff" * 16]


@st.composite
def token_specs(draw, s: Strategies, version: int, small: bool = False,
                like: TokenSpec | None = None, keep: int = 0) -> TokenSpec:
    """A token that the codec can encode; the first `keep` levels are copied from `like`."""

    def copy(level: int) -> bool:
        return like is not None and level < keep

    if copy(L_TS):
        t, i = like.t, like.i
    elif small:
        t, i = draw(st.sampled_from([(0, 0), (1, 0), (1, 1), (2**31, 0), (2**32 - 1, 2**32 - 1)]))
    else:
        t, i = draw(U32), draw(U32)

    if version == 0:
        token_type = EVENT  # v0 has no tokenType: it always decodes as an event token
    elif copy(L_TYPE):
        token_type = like.token_type
    else:
        token_type = draw(st.sampled_from([HWM, EVENT, EVENT, EVENT]))
    if token_type == HWM:
        return TokenSpec(t, i, version, HWM, 0, False, None, None, None, None, None)

    if copy(L_TXN):
        txn = like.txn_op_index
    elif small:
        txn = draw(st.sampled_from([0, 1, 2**30 - 1]))
    else:
        txn = draw(st.one_of(st.integers(0, 2**30 - 1), st.sampled_from([0, 1, 2, 2**30 - 1])))

    if version == 0:
        from_invalidate = False  # not encoded in v0
    elif copy(L_INV):
        from_invalidate = like.from_invalidate
    else:
        from_invalidate = draw(st.booleans())

    if copy(L_UUID):
        uuid = like.uuid
    elif small:
        uuid = draw(st.sampled_from([None, *SMALL_UUIDS]))
    else:
        uuid = draw(st.one_of(st.none(), st.binary(min_size=16, max_size=16)))

    doc_keys = s.small_doc_keys if small else s.doc_keys
    descriptions = s.small_descriptions if small else s.descriptions
    if copy(L_IDENT) or (like is not None and keep == L_IDENT and draw(st.booleans())):
        # Same op type; an equal documentKey/description (copy), or a near one (divergence).
        op_type = like.op_type
        document_key, description = like.document_key, like.operation_description
        if copy(L_IDENT):
            if document_key is not None:
                document_key = draw(equal_variant(document_key, s.allow_decimal))
            elif description is not None:
                description = draw(equal_variant(description, s.allow_decimal))
        elif document_key is not None:
            document_key = draw(mutated_document(document_key, s, True))
        elif description is not None:
            description = draw(mutated_document(description, s, False))
    elif version < 2 and uuid is None:
        # A v0/v1 eventIdentifier needs a UUID (50788): only events without one are possible.
        op_type = draw(st.sampled_from(CLASSIC_DDL_OPS))
        document_key = description = None
    else:
        category = draw(st.sampled_from(["crud", "ddl", "expanded"]))
        document_key = description = None
        if category == "crud":
            op_type = draw(st.sampled_from(CRUD_OPS))
            document_key = draw(doc_keys)
        else:
            op_type = draw(st.sampled_from(CLASSIC_DDL_OPS if category == "ddl" else EXPANDED_OPS))
            description = draw(st.one_of(st.none(), descriptions))
            if op_type in CLASSIC_OPS and version <= 1:
                description = None  # not part of a v0/v1 token

    fragment = None
    if version == 2:
        if copy(L_FRAG):
            fragment = like.fragment_num
        elif small:
            fragment = draw(st.sampled_from([None, 0, 1, 2]))
        else:
            fragment = draw(st.one_of(st.none(), st.integers(0, 2**30 - 1)))

    return TokenSpec(t, i, version, EVENT, txn, from_invalidate, uuid, op_type, document_key,
                     description, fragment)


@st.composite
def token_pairs(draw, s: Strategies) -> tuple[TokenSpec, TokenSpec]:
    """Two tokens of one version that agree on a prefix of levels, then (maybe) differ."""
    version = draw(st.sampled_from([0, 1, 2]))
    a = draw(token_specs(s, version, small=draw(st.booleans())))
    # Weighted towards the eventIdentifier, where the interesting comparisons are.
    keep = draw(st.sampled_from([L_TS, L_TYPE, L_TXN, L_INV, L_UUID, L_FRAG, L_FRAG, L_ALL,
                                 *[L_IDENT] * 6]))
    b = draw(token_specs(s, version, small=True, like=a, keep=keep))
    if draw(st.booleans()):
        a, b = b, a
    return a, b


S = Strategies(allow_decimal=False)
SD = Strategies(allow_decimal=True)

# ---------------------------------------------------------------------------------------------
# Checks (shared by the plain and the Decimal128 variants of each test).


def _keystring_of(v: tuple) -> tuple[bytes, bytes | None]:
    return keystring.encode_bson(raw_document([("0", v)]))


def check_builder_matches_pymongo(v: tuple) -> None:
    try:
        py = to_python(v)
    except Unsupported:
        return
    assert bson.encode({"v": py}) == raw_document([("v", v)])


def check_value_roundtrip(values: list[tuple]) -> None:
    raw = raw_document([(str(i), v) for i, v in enumerate(values)])
    note(f"raw BSON: {raw.hex()}")
    ks, type_bits = keystring.encode_bson(raw)
    note(f"KeyString: {ks.hex().upper()} typeBits: {type_bits and type_bits.hex()}")
    assert ks.endswith(b"\x04")
    assert keystring.decode_to_bson(ks, type_bits) == raw
    assert (type_bits is not None) == any(needs_type_bits(v) for v in values)


def check_document_roundtrip(doc_key: tuple) -> None:
    # Nested one level down, so that the field names are part of the KeyString.
    raw = raw_document([("0", doc_key)])
    ks, type_bits = keystring.encode_bson(raw)
    note(f"KeyString: {ks.hex().upper()} typeBits: {type_bits and type_bits.hex()}")
    assert keystring.decode_to_bson(ks, type_bits) == raw
    assert (type_bits is not None) == needs_type_bits(doc_key)


def check_value_order(a: tuple, b: tuple) -> None:
    (ka, ta), (kb, tb) = _keystring_of(a), _keystring_of(b)
    note(f"a: {ka.hex().upper()} / {ta and ta.hex()}")
    note(f"b: {kb.hex().upper()} / {tb and tb.hex()}")
    expected = compare_values(a, b)
    assert _cmp(ka, kb) == expected
    if expected == 0:
        # Equal values: identical KeyString; the type bits alone tell the BSON types apart,
        # so they differ exactly when the BSON bytes differ (the round trip is lossless).
        assert (ta == tb) == (raw_value(a) == raw_value(b) and a[0] == b[0])


def check_token_roundtrip(spec: TokenSpec) -> None:
    ident = spec.event_identifier()
    expected_ident = spec.identifier_model()
    assert ident == (None if expected_ident is None else raw_value(expected_ident))

    data = spec.data()
    doc = data.to_document()
    note(f"token: {doc!r}")
    assert list(doc)[0] == "_data" and set(doc) <= {"_data", "_typeBits"}
    hex_data = doc["_data"]
    assert hex_data == hex_data.upper()
    ks = bytes.fromhex(hex_data)
    assert ks[:9] == b"\x82" + struct.pack(">II", spec.t, spec.i)
    assert ks.endswith(b"\x04")
    if "_typeBits" in doc:
        assert isinstance(doc["_typeBits"], Binary) and doc["_typeBits"].subtype == 0
    assert ("_typeBits" in doc) == spec.needs_type_bits()

    decoded = resume_token.decode(doc)
    assert decoded == data
    assert decoded.cluster_time == Timestamp(spec.t, spec.i)
    assert (decoded.version, decoded.token_type, decoded.txn_op_index) == (
        spec.version, spec.token_type, spec.txn_op_index,
    )
    assert decoded.from_invalidate is spec.from_invalidate
    assert decoded.uuid == spec.uuid
    assert decoded.event_identifier == ident  # byte-identical, names and types included
    assert decoded.fragment_num == spec.fragment_num
    assert decoded.is_high_water_mark == (spec.token_type == HWM)
    assert decoded.to_document() == doc
    # Decoders accept lower-case hex as well.
    assert resume_token.decode({**doc, "_data": hex_data.lower()}).to_document() == doc


def check_for_event_matches_constructor(spec: TokenSpec) -> None:
    """`ResumeTokenData.for_event` (cached identifier head) encodes like the plain constructor."""
    if spec.op_type is None:
        return
    data = ResumeTokenData.for_event(
        Timestamp(spec.t, spec.i),
        spec.op_type,
        uuid=spec.uuid,
        document_key=None if spec.document_key is None else raw_value(spec.document_key),
        operation_description=(
            None
            if spec.operation_description is None
            else raw_value(spec.operation_description)
        ),
        txn_op_index=spec.txn_op_index,
        version=spec.version,
    )
    data.from_invalidate = spec.from_invalidate
    data.fragment_num = spec.fragment_num
    expected = spec.data()
    assert data.to_document() == expected.to_document()
    assert data.to_keystring() == expected.to_keystring()
    assert data.event_identifier == expected.event_identifier
    assert data == expected


def check_token_order(a: TokenSpec, b: TokenSpec) -> None:
    da, db = a.data().to_document(), b.data().to_document()
    note(f"a: {da!r}")
    note(f"b: {db!r}")
    expected = compare_tokens(a, b)
    assert _cmp(sort_key(da), sort_key(db)) == expected
    assert (a.data() == b.data()) == (expected == 0)
    if expected == 0:
        assert hash(a.data()) == hash(b.data())
        assert da["_data"] == db["_data"]
        same_bytes = a.event_identifier() == b.event_identifier()
        assert (da.get("_typeBits") == db.get("_typeBits")) == same_bytes


# ---------------------------------------------------------------------------------------------
# Tests.


@PROPS
@given(SD.values)
def test_raw_builder_matches_pymongo(v):
    """The test's raw BSON builder agrees with bson.encode wherever pymongo can encode."""
    check_builder_matches_pymongo(v)


@FEWER
@given(SD.value_pairs)
def test_oracle_is_a_consistent_order(pair):
    """Sanity of the oracle itself: antisymmetric, and equal variants compare equal."""
    a, b = pair
    assert compare_values(a, b) == -compare_values(b, a)
    assert compare_values(a, a) == 0


@PROPS
@given(S.value_lists)
def test_keystring_value_roundtrip(values):
    check_value_roundtrip(values)


@needs_decimal
@PROPS
@given(SD.value_lists)
def test_keystring_value_roundtrip_decimal(values):
    check_value_roundtrip(values)


@PROPS
@given(S.doc_keys)
def test_keystring_document_roundtrip(doc_key):
    check_document_roundtrip(doc_key)


@needs_decimal
@PROPS
@given(SD.doc_keys)
def test_keystring_document_roundtrip_decimal(doc_key):
    check_document_roundtrip(doc_key)


_NUMBER_KINDS = st.sampled_from(
    [("int32", 7), ("int32", 0), ("int64", 7), ("int64", 0), ("double", 7.0), ("double", -0.0),
     ("double", 0.0), ("string", "s"), ("symbol", "s")]
)


@FEWER
@given(st.sampled_from([1, 3, 4, 5, 63, 64, 65, 127, 508, 509, 520]).flatmap(
    lambda n: st.lists(_NUMBER_KINDS, min_size=n, max_size=n)
))
def test_type_bits_sizes(values):
    """Type bits of every length: single byte, 0x80|n form, and the >127-byte long form."""
    check_value_roundtrip(values)


@MORE
@given(S.value_pairs)
def test_keystring_value_order(pair):
    check_value_order(*pair)


@needs_decimal
@MORE
@given(SD.value_pairs)
def test_keystring_value_order_decimal(pair):
    check_value_order(*pair)


@PROPS
@given(S.tokens)
def test_token_roundtrip(spec):
    check_token_roundtrip(spec)


@needs_decimal
@PROPS
@given(SD.tokens)
def test_token_roundtrip_decimal(spec):
    check_token_roundtrip(spec)


@FEWER
@given(S.tokens)
def test_for_event_matches_constructor(spec):
    check_for_event_matches_constructor(spec)


@needs_decimal
@FEWER
@given(SD.tokens)
def test_for_event_matches_constructor_decimal(spec):
    check_for_event_matches_constructor(spec)


@PROPS
@given(S.token_pairs)
def test_token_order_is_semantic_order(pair):
    check_token_order(*pair)


@needs_decimal
@PROPS
@given(SD.token_pairs)
def test_token_order_is_semantic_order_decimal(pair):
    check_token_order(*pair)


@FEWER
@given(S.doc_keys.flatmap(lambda k: st.tuples(st.just(k), equal_variant(k, False))))
def test_equal_values_same_data_typebits_tell_types(pair):
    """1, 1.0 and NumberLong(1) (and string/symbol) give the same _data; only _typeBits differ."""
    a, b = pair
    (ka, ta), (kb, tb) = _keystring_of(a), _keystring_of(b)
    assert ka == kb
    assert (ta == tb) == (raw_value(a) == raw_value(b))
    ta_tok = TokenSpec(1, 1, 2, EVENT, 0, False, None, "insert", a, None, None).data().to_document()
    tb_tok = TokenSpec(1, 1, 2, EVENT, 0, False, None, "insert", b, None, None).data().to_document()
    assert ta_tok["_data"] == tb_tok["_data"]
    assert resume_token.decode(ta_tok) == resume_token.decode(tb_tok)


# One value of every kind, for the exhaustive cross-type checks below.
REPRESENTATIVES = [
    ("minkey",), ("undefined",), ("null",), ("double", CANONICAL_NAN), ("int32", -1),
    ("int64", 2), ("double", 0.5), ("string", "s"), ("symbol", "r"),
    ("object", (("a", ("null",)),)), ("array", (("null",),)), ("bindata", 0, b"x"),
    ("oid", bytes(12)), ("bool", False), ("bool", True), ("date", -1), ("timestamp", 2**31, 0),
    ("regex", "a", ""),
    ("dbpointer", "a.b", bytes(12)), ("code", "c"), ("cws", "c", ()), ("maxkey",),
]
if HAVE_DECIMAL:
    REPRESENTATIVES.append(("decimal", Decimal128("1.5")))


def test_every_type_pair_orders_like_bson():
    """Each pair of types, bare, as a field value (same and different names) and in an array:
    the per-field generic CTypes must follow MongoDB's canonical type order."""
    wraps = [
        lambda v, name: v,
        lambda v, name: ("object", (("a", v),)),
        lambda v, name: ("object", ((name, v),)),
        lambda v, name: ("array", (v,)),
    ]
    for x in REPRESENTATIVES:
        for y in REPRESENTATIVES:
            for wrap in wraps:
                a, b = wrap(x, "b"), wrap(y, "a")
                got = _cmp(_keystring_of(a)[0], _keystring_of(b)[0])
                assert got == compare_values(a, b), (a, b)


def _exhaustive_number_order(numbers: list[tuple]) -> None:
    encoded = [(v, _keystring_of(v)) for v in numbers]
    for v, (ks, type_bits) in encoded:
        assert keystring.decode_to_bson(ks, type_bits) == raw_document([("0", v)]), v
    bad = [
        (a, b)
        for a, (ka, _) in encoded
        for b, (kb, _) in encoded
        if _cmp(ka, kb) != compare_values(a, b)
    ]
    assert not bad, f"{len(bad)} misordered pairs, e.g. {bad[:3]}"


SPECIAL_INTEGERS = [
    ("int32", n) for n in (0, 1, -1, 127, 128, -128, -129, 2**31 - 1, -(2**31))
] + [
    ("int64", n)
    for n in (2**53 - 1, 2**53, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), -(2**63) + 1, 10**18)
]


def test_special_numbers_order_exhaustively():
    """Every pair of the hand-picked integer/double edge values (deterministic)."""
    _exhaustive_number_order(
        SPECIAL_INTEGERS + [("double", x) for x in SPECIAL_DOUBLES + NEAR_DOUBLE_DOUBLES]
    )


@needs_decimal
def test_special_decimals_order_exhaustively():
    """Every pair of edge decimals, doubles and integers, including decimals that share one
    double approximation (continuation markers and bytes, reference §2.7)."""
    _exhaustive_number_order(
        SPECIAL_INTEGERS
        + [("double", x) for x in SPECIAL_DOUBLES + NEAR_DOUBLE_DOUBLES]
        + [("decimal", Decimal128(x)) for x in SPECIAL_DECIMALS + NEAR_DOUBLE_DECIMALS]
    )


def test_int_and_double_differ_only_in_type_bits():
    """Reference §2.8 / §4.4: int 1 and double 1.0 share `_data`; `_typeBits` tells them apart."""
    docs = {}
    for kind, one in (("int32", 1), ("int64", 1), ("double", 1.0)):
        key = ("object", (("_id", (kind, one)),))
        docs[kind] = TokenSpec(1666193824, 1, 2, EVENT, 0, False, bytes(16), "insert", key,
                               None, None).data().to_document()
    assert docs["int32"]["_data"] == docs["int64"]["_data"] == docs["double"]["_data"]
    assert "_typeBits" not in docs["int32"]
    assert bytes(docs["int64"]["_typeBits"]) == bytes.fromhex("820001")
    assert bytes(docs["double"]["_typeBits"]) == bytes.fromhex("828000")
