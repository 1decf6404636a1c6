"""Decimal128 in KeyString V1 (pipeline_stages/_keystring_decimal.py).

Values and corrupt-input cases come from mongod's key_string_test.cpp (`DecimalNumbers`,
`InvalidDecimal*`), key_string_test_util.cpp (`getInterestingElements`) and
key_string_long_running_test.cpp (`LotsOfNumbers3`, `UniformDecimalPerf`, `NumberOrderLots`).
mongod asserts no KeyString byte strings for decimals; the byte vectors below are derived by hand
from the encoding rules (and, where a decimal equals a double, from the double encoding).
"""

from __future__ import annotations

import math
import struct
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction

import pytest
from bson.decimal128 import Decimal128
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from pipeline_stages import _keystring_decimal as kd
from pipeline_stages import keystring as ks
from pipeline_stages.errors import MongoError
from pipeline_stages.keystring import TypeBitsReader, TypeBitsWriter

POSITIVE_NAN = bytes(15) + b"\x7c"


# --- helpers ----------------------------------------------------------------------------------


def bid_of(d: Decimal128 | str) -> bytes:
    return (d if isinstance(d, Decimal128) else Decimal128(d)).bid


def raw_bid(negative: bool, coefficient: int, biased_exponent: int) -> bytes:
    raw = (int(negative) << 127) | (biased_exponent << 113) | coefficient
    return raw.to_bytes(16, "little")


def encode(bid: bytes) -> tuple[bytes, bytes | None]:
    """(KeyString bytes without kEnd, serialized `_typeBits`)."""
    out = bytearray()
    bits = TypeBitsWriter()
    kd.encode_decimal(bid, out, bits)
    return bytes(out), bits.serialize()


def decode(data: bytes, type_bits: bytes | None) -> bytes:
    """Decode one decimal the way keystring's decoder calls this module."""
    reader = TypeBitsReader(type_bits)
    full = data + b"\x04"
    if full[0] == 0x29:
        return kd.decode_decimal_zero(reader.read_zero(), reader)
    assert reader.read_numeric() == 0b11
    bid, pos = kd.decode_decimal(full[0], full, 1, reader)
    assert full[pos] == 0x04, "decoder must consume exactly the value bytes"
    return bid


def roundtrip(bid: bytes) -> bytes:
    data, type_bits = encode(bid)
    out = decode(data, type_bits)
    # The same through the public KeyString decoder.
    assert ks.decode(data + b"\x04", type_bits) == [(0x13, out)]
    return out


def expected_roundtrip(bid: bytes) -> bytes:
    return POSITIVE_NAN if Decimal128.from_bid(bid).to_decimal().is_nan() else bid


def numeric_key(v: object) -> tuple[int, Decimal]:
    """Exact numeric value for ordering; NaN sorts below everything, as in KeyString."""
    if isinstance(v, Decimal128):
        d = v.to_decimal()
    elif isinstance(v, float):
        d = Decimal(v) if not math.isnan(v) else Decimal("NaN")
    else:
        d = Decimal(v)
    return (0, Decimal(0)) if d.is_nan() else (1, d)


def body(v: object) -> bytes:
    """KeyString bytes (no type bits) of a decimal, double or integer."""
    if isinstance(v, Decimal128):
        return encode(v.bid)[0]
    if isinstance(v, float):
        return ks.double_body(v)
    return ks.int_body(v)


def cmp(a: object, b: object) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


def pow2(i: int) -> float:
    return math.ldexp(1.0, i) if i <= 1023 else math.inf


def decimal_from_double(x: float, fifteen: bool, rounding: str) -> Decimal128:
    """mongod's Decimal128(double, precision, mode), via the module's port of it."""
    d = kd._dec_from_double(x, rounding, fifteen_digits=fifteen)
    return Decimal128.from_bid(kd._to_bid(kd._decimal_to_raw(d)))


def negate(bid: bytes) -> bytes:
    return bid[:15] + bytes((bid[15] ^ 0x80,))


# --- mongod's decimal lists -----------------------------------------------------------------

# key_string_test.cpp, DecimalNumbers.
DECIMAL_NUMBERS = [
    "0", "0.0", "-0", "0E5000", "-0.0000E-6172",
    "NaN", "Infinity", "-Infinity",
    "1", "2.0", "-2.0E1", "1234.56E15", "2.00000000000000000000000",
    "-9223372036854775808.00000000000000", "973555660975280180349468061728768E1",
    "1.25", "3.141592653584666550159454345703125", "-127.50",
    "243290200817664E4", "9007199254740993", "9223372036854775807", "-9223372036854775808",
    "1.23", "-1.1", "-12345.60", "3.141592653589793238462643383279502",
    "-3.141592653589793115997963468544185",
    "0.50", "-0.3552713678800500929355621337890625E-14",
    "-0.000000000000001234567890123456789012345678901234E-99",
    "0.02",
    "1234567890123456789012345678901234E6000", "-19950631168.80758384883742162683585E3000",
    "0.2512388057698744585180135042133610E-6020", "4.940656458412465441765687928682213E-324",
    "-0.8289046058458094980903836776809409E-316",
]

# key_string_test_util.cpp, getInterestingElements (the explicit decimals).
INTERESTING = [
    "0.0000000", "-0E1000",
    "0.100000000", "0.1000000000000000055511151231257827",
    "0.1000000000000000055511151231257828", "0.999999999999999", "2.22507385850721E-308",
    "9.881312916824930883531375857364428E-324", "9223372036854775808", "9223372036854776000",
    "1.797693134862315708145274237317044E308", "1.797693134862315708145274237317043E308",
    "-1.797693134862315708145274237317044E308", "-1.797693134862315708145274237317043E308",
    "9.881312916824930883531375857364427", "9.881312916824930883531375857364428",
    "-9.881312916824930883531375857364427", "-9.881312916824930883531375857364428",
    "4.940656458412465441765687928682213E-324", "4.940656458412465441765687928682214E-324",
    "-4.940656458412465441765687928682214E-324", "-4.940656458412465441765687928682213E-324",
    "3743626360493413E-165",
]


def powers_of_two_decimals() -> list[str]:
    """getInterestingElements: for 2**0..2**62 the decimal, +-1, +-0.5, +-0.1, and negations."""
    out = []
    with localcontext() as c:
        c.prec = 34
        for p in range(63):
            dec = Decimal(1 << p)
            for v in (dec, dec + 1, dec - 1, dec - Decimal("0.5"), dec + Decimal("0.5"),
                      dec - Decimal("0.1"), dec + Decimal("0.1")):
                out += [str(v), str(-v)]
    return out


ALL_LISTED = DECIMAL_NUMBERS + INTERESTING + powers_of_two_decimals()


@pytest.mark.parametrize("text", DECIMAL_NUMBERS + INTERESTING)
def test_roundtrip_mongod_lists(text: str) -> None:
    bid = bid_of(text)
    assert roundtrip(bid) == expected_roundtrip(bid)


def test_roundtrip_powers_of_two() -> None:
    for text in powers_of_two_decimals():
        bid = bid_of(text)
        assert roundtrip(bid) == bid, text


def test_roundtrip_lots_of_numbers3() -> None:
    """LotsOfNumbers3 (thinned): Decimal128(bin, 15/34 digits, down/up) and negations."""
    for i in range(-1100, 1100, 13):
        for j in (0, 1, 2, 10, 30, 51):
            for k in (0, 3, 7):
                bin_ = pow2(i) + pow2(i - j) - pow2(i - 53 + k)
                if math.isnan(bin_):
                    continue
                for fifteen in (True, False):
                    for mode in (ROUND_FLOOR, ROUND_CEILING):
                        bid = decimal_from_double(bin_, fifteen, mode).bid
                        assert roundtrip(bid) == bid, (bin_, fifteen, mode)
                        assert roundtrip(negate(bid)) == negate(bid), (bin_, fifteen, mode)


def test_all_nans_decode_as_positive_nan() -> None:
    # mongod writes one NaN (0x1E, type bits 11) and always decodes Decimal128::kPositiveNaN.
    for nan in ("NaN", "-NaN", "sNaN", "-sNaN"):
        data, bits = encode(bid_of(nan))
        assert (data, bits) == (b"\x1e", b"\x03")
        assert decode(data, bits) == POSITIVE_NAN
    payload_nan = (0x7C << 120 | 12345).to_bytes(16, "little")
    assert roundtrip(payload_nan) == POSITIVE_NAN


# --- byte vectors (derived by hand from the rules) --------------------------------------------

@pytest.mark.parametrize(
    "text, data, type_bits",
    [
        # Equal to a double: the double's bytes. Type bits: 11 + low 6 exponent bits, LSB first.
        ("1", "2B02", "07"),  # exponent 6176 & 63 = 32 -> 100000
        ("1.0", "2B02", "81FB"),  # 6175 & 63 = 31 -> 011111
        ("-1", "27FD", "07"),
        ("5.5", "2B0B80000000000000", "81FB"),  # ActualBytesDouble's bytes for the double 5.5
        ("0.50", "2AFF80000000000000", "7B"),  # 6174 & 63 = 30 -> 011110
        ("Infinity", "33FFFFFFFFFFFFFFFF", "03"),
        ("-Infinity", "1F0000000000000000", "03"),
        ("NaN", "1E", "03"),
        # Zeros: 0x29; type bits 11011 (prefix 0x1A + 6176 >> 12) then 6176 & 0xFFF.
        ("0", "29", "833B0800"),
    ],
)
def test_byte_vectors(text: str, data: str, type_bits: str) -> None:
    got_data, got_bits = encode(bid_of(text))
    assert got_data.hex().upper() == data
    assert got_bits is not None and got_bits.hex().upper() == type_bits


def test_zero_type_bits() -> None:
    # 0E0: biased exponent 6176 = 0b1_1000_0010_0000 -> prefix 0x1A + 1, then its low 12 bits.
    bits = TypeBitsWriter()
    kd.encode_decimal(bid_of("0"), bytearray(), bits)
    which = 6176
    expected = [(0x1B >> i) & 1 for i in range(4, -1, -1)] + [
        (which >> i) & 1 for i in range(11, -1, -1)
    ]
    assert bits.count == 17
    assert [(bits.value >> i) & 1 for i in range(17)] == expected
    # -0: exponent + 12288 = 18464 -> prefix 0x1A + 4 = 0b11110.
    bits = TypeBitsWriter()
    kd.encode_decimal(bid_of("-0"), bytearray(), bits)
    assert [(bits.value >> i) & 1 for i in range(5)] == [1, 1, 1, 1, 0]


def test_dcm_bytes_follow_the_double() -> None:
    # 1.23 is not a double; it is stored as the double below it with DCM 2 (15-digit equal).
    x = 1.23
    below = x if Decimal(x) < Decimal("1.23") else math.nextafter(x, 0.0)
    expected = bytearray(ks.double_body(below))
    expected[-1] |= 2
    assert encode(bid_of("1.23"))[0] == bytes(expected)
    # A 34-digit value next to that double: DCM 1 or 3 and an 8-byte continuation.
    data, _ = encode(bid_of("1.229999999999999982236431605997495"))
    assert len(data) == 17 and data[:8] == bytes(expected[:8]) and data[8] & 3 in (1, 3)


def test_easy_decimals_match_double_encoding() -> None:
    for text in ("1", "2.0", "-2.0E1", "1234.56E15", "1.25", "-127.50", "0.50",
                 "-0.3552713678800500929355621337890625E-14", "3.141592653584666550159454345703125",
                 "-9223372036854775808.00000000000000", "973555660975280180349468061728768E1"):
        assert encode(bid_of(text))[0] == ks.double_body(float(Decimal(text))), text


# --- ordering ---------------------------------------------------------------------------------


def ordering_values() -> list[object]:
    values: list[object] = [Decimal128(t) for t in ALL_LISTED]
    values += [0, -0.0, 0.0, 1, -1, 1.0, 0.1, -0.1, 2**53, 2**53 + 1, 2**63 - 1, -(2**63),
               float(2**63), -float(2**63), 5e-324, -5e-324, 2.2250738585072014e-308,
               1.7976931348623157e308, -1.7976931348623157e308, math.inf, -math.inf,
               math.nan, 3743626360493413e-165, 1.23, 9223372036854775807.0]
    for i in range(64):
        x = 1 << i
        values += [float(x), float(x) + 0.1, float(x) + 1.1, -float(x) - 0.1]
        if i < 63:
            values += [x, -x, x + 1, -x - 1]
    return values


def test_ordering_matches_numeric_order() -> None:
    values = ordering_values()
    keyed = sorted(((numeric_key(v), body(v), v) for v in values), key=lambda t: t[0])
    for (ka, ba, va), (kb, bb, vb) in zip(keyed, keyed[1:], strict=False):
        if ka == kb:
            assert ba == bb, (va, vb)
        else:
            assert ba < bb, (va, vb)


def test_equal_values_give_identical_bytes() -> None:
    same = [Decimal128("1"), Decimal128("1.0"), Decimal128("1.000000000000000000000000000000000"),
            Decimal128("0.1E1"), 1.0, 1]
    assert len({body(v) for v in same}) == 1
    assert body(Decimal128("-0")) == body(Decimal128("0E-6176")) == body(0.0) == b"\x29"
    big = 2**62 + 12345
    assert body(Decimal128(str(big))) == body(big)


# --- corrupt input: mongod's InvalidDecimal* tests ----------------------------------------------


def decode_full(data: bytes, type_bits: bytes | None) -> list[tuple[int, bytes]]:
    return ks.decode(data, type_bits)


def test_invalid_decimal_exponent_50814() -> None:
    data, bits = encode(bid_of("1125899906842624.1"))
    corrupt = bytearray(data + b"\x04")
    corrupt[1] = 0
    with pytest.raises(MongoError) as e:
        decode_full(bytes(corrupt), bits)
    assert e.value.code == 50814
    assert e.value.errmsg == (
        "KeyString format error: Unexpected exponent values after adjusting Decimal."
    )


def test_invalid_decimal_zero_50846() -> None:
    data, bits = encode(bid_of("-0"))
    assert bits is not None and bits[0] == 0x83
    corrupt_bits = bytearray(bits)
    corrupt_bits[1] = 147  # zero type 0b11001, the unused encoding
    with pytest.raises(MongoError) as e:
        decode_full(data + b"\x04", bytes(corrupt_bits))
    assert (e.value.code, e.value.errmsg) == (
        50846, "KeyString format error: Invalid numeric zero decimal."
    )


def test_invalid_decimal_continuation_50850() -> None:
    data, bits = encode(bid_of("1.797693134862315708145274237317043E308"))
    corrupt = bytearray(data + b"\x04")
    corrupt[2] = 239  # the stored double becomes a NaN
    assert bits is not None
    corrupt_bits = bytearray(bits)
    corrupt_bits[1] = 231
    with pytest.raises(MongoError) as e:
        decode_full(bytes(corrupt), bytes(corrupt_bits))
    assert (e.value.code, e.value.errmsg) == (
        50850, "KeyString format error: Invalid decimal continuation."
    )


def test_truncated_input_overflows() -> None:
    data, bits = encode(bid_of("0.1"))
    with pytest.raises(MongoError) as e:
        decode(data[:-3], bits)
    assert e.value.code == 15
    assert e.value.errmsg == "Invalid advance (8) past end of buffer[6] at offset: 0"


class Bits:
    """A minimal type-bits source: the given bits, then 50615 as mongod's reader raises."""

    def __init__(self, bits: list[int]) -> None:
        self.bits = list(bits)

    def read_bit(self) -> int:
        if not self.bits:
            raise MongoError(50615, "KeyString format error: Invalid size byte(s).")
        return self.bits.pop(0)


def test_missing_exponent_type_bits() -> None:
    data, _ = encode(bid_of("1.5"))
    full = data + b"\x04"
    assert kd.decode_decimal(full[0], full, 1, Bits([0, 1, 1, 1, 1, 1]))[0] == bid_of("1.5")
    with pytest.raises(MongoError) as e:
        kd.decode_decimal(full[0], full, 1, Bits([0, 1, 1]))
    assert e.value.code == 50615


def test_nonzero_required_50829() -> None:
    # An integer CType with a zero integer part under decimal type bits.
    with pytest.raises(MongoError) as e:
        decode_full(b"\x2b\x00\x04", b"\x03")
    assert e.value.code == 50829


# --- properties -------------------------------------------------------------------------------

COEFFICIENTS = st.integers(1, 34).flatmap(lambda n: st.integers(10 ** (n - 1), 10**n - 1))
EXPONENTS = st.one_of(
    st.integers(0, kd._MAX_BIASED_EXPONENT),  # the whole range
    st.integers(6176 - 360, 6176 + 330),  # where doubles live: most code paths are here
    st.integers(6176 - 40, 6176 + 40),
)
FINITE = st.builds(raw_bid, st.booleans(), COEFFICIENTS, EXPONENTS)
ZEROS = st.builds(raw_bid, st.booleans(), st.just(0), st.integers(0, kd._MAX_BIASED_EXPONENT))
SPECIALS = st.sampled_from([bid_of(t) for t in ("NaN", "-NaN", "sNaN", "Infinity", "-Infinity")])
NEAR_DOUBLES = st.builds(
    lambda x, fifteen, mode: decimal_from_double(x, fifteen, mode).bid,
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.sampled_from([ROUND_FLOOR, ROUND_CEILING]),
)
DECIMALS = st.one_of(FINITE, ZEROS, SPECIALS, NEAR_DOUBLES)


@given(DECIMALS)
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(bid_of("1E-6176"))
@example(bid_of("9999999999999999999999999999999999E6111"))
@example(bid_of("-1E6144"))
def test_property_roundtrip(bid: bytes) -> None:
    assert roundtrip(bid) == expected_roundtrip(bid)


@given(st.integers(0, (1 << 128) - 1))
@settings(max_examples=500, deadline=None)
def test_property_uniform_raw_bits(raw: int) -> None:
    """UniformDecimalPerf: random 128-bit patterns that are finite, non-zero decimals."""
    bid = raw.to_bytes(16, "little")
    d = Decimal128.from_bid(bid)
    assume(kd._combination(raw) < kd._COMBO_NON_CANONICAL)
    assume(0 < raw & kd._COEFF_BITS <= kd._MAX_COEFFICIENT)
    assert roundtrip(bid) == d.bid


@given(DECIMALS, st.one_of(DECIMALS, st.floats(), st.integers(-(2**63), 2**63 - 1)))
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_order(a: bytes, other: bytes | float | int) -> None:
    va = Decimal128.from_bid(a)
    vb = Decimal128.from_bid(other) if isinstance(other, bytes) else other
    expected = cmp(numeric_key(va), numeric_key(vb))
    assert cmp(body(va), body(vb)) == expected


@given(st.floats(allow_nan=False))
@settings(max_examples=500, deadline=None)
def test_property_decimal_near_double_orders_around_it(x: float) -> None:
    """Decimals rounded from a double to 15/34 digits sort exactly against that double."""
    for fifteen in (True, False):
        for mode in (ROUND_FLOOR, ROUND_CEILING):
            dec = decimal_from_double(x, fifteen, mode)
            assert cmp(body(dec), body(x)) == cmp(numeric_key(dec), numeric_key(x))


@given(st.integers(-(2**80), 2**80), st.integers(0, 60))
@settings(max_examples=500, deadline=None)
def test_property_exact_doubles_share_double_bytes(n: int, shift: int) -> None:
    """A decimal that is exactly a double encodes like that double (and like the integer)."""
    x = n / (1 << shift)
    assume(Fraction(x) == Fraction(n, 1 << shift))
    exact = Decimal(x)
    assume(len(exact.as_tuple().digits) <= 34)
    assert body(Decimal128(exact)) == ks.double_body(x)


def test_internal_double_encoder_matches_keystring() -> None:
    """The DCM-aware double writer here equals keystring.double_body when DCM is 0."""
    samples = [1.0, -1.0, 0.5, 5.5, 1e-300, -1e-310, 5e-324, 2.0**-255, 2.0**-256, 2.0**63,
               -(2.0**63), 1.7976931348623157e308, 123456789.123, -0.1, 2.0**53 - 0.5]
    for x in samples:
        out = bytearray()
        kd._append_double(out, x, 0)
        assert bytes(out) == ks.double_body(x), x


def test_struct_sanity() -> None:
    # bson's Decimal128.bid is the little-endian (low 64, high 64) layout the module assumes.
    lo, hi = struct.unpack("<QQ", Decimal128("1").bid)
    assert (lo, hi >> 49) == (1, 6176)
