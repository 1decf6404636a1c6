"""Decimal128 values in KeyString V1, ascending order only (what resume tokens use).

A port of the decimal paths of mongod's key_string.cpp (`_appendNumberDecimal`,
`_appendTinyDecimalWithoutTypeBits`, `_appendHugeDecimalWithoutTypeBits`, the decimal branches
of `toBsonValue`, `readDecimalContinuation`, `adjustDecimalExponent`), byte for byte.

mongod does this with the Intel BID library; here Python's `decimal` plays that role with a
decimal128 context (34 digits, exponents -6176..6111). The few places where the library's
choice of *cohort* (coefficient/exponent pair) matters are reproduced explicitly:
`binary64_to_bid128` (see `_dec_from_double`) and the 15-digit `Decimal128(double)` constructor.

The idea of the encoding: a decimal is written as the double `bin` it truncates to, so it sorts
among doubles and integers, plus a 2-bit "decimal continuation marker" (DCM) and, when the double
does not pin the value down, an 8-byte continuation holding the remaining decimal digits. The
low 6 bits of the decimal's exponent go to the type bits so the exact cohort (trailing zeros,
e.g. 1.0 vs 1.00) survives a round trip.
"""

from __future__ import annotations

import math
import struct
import sys
from decimal import (
    ROUND_CEILING,
    ROUND_DOWN,
    ROUND_FLOOR,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    Inexact,
    InvalidOperation,
)
from typing import Protocol

from pipeline_stages.errors import KeyStringError, MongoError


class TypeBitsSink(Protocol):
    def append_bit(self, bit: int) -> None: ...


class TypeBitsSource(Protocol):
    def read_bit(self) -> int: ...


# --- Decimal128 layout (IEEE 754-2008 BID, as mongo::Decimal128) -----------------------------

_BIAS = 6176  # biased exponent of a coefficient whose last digit is the units place
_MAX_BIASED_EXPONENT = 12287
_MAX_COEFFICIENT = 10**34 - 1
_COEFF_BITS = (1 << 113) - 1
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
_SIGN = 1 << 127
_POSITIVE_NAN = 0x7C << 120  # Decimal128::kPositiveNaN: the only NaN a KeyString decodes to
_INFINITY = 0x78 << 120
_COMBO_NON_CANONICAL = 3 << 15
_COMBO_INFINITY = 0x1E << 12
_COMBO_NAN = 0x1F << 12

# --- CTypes and markers (key_string.cpp) ----------------------------------------------------

_NAN = 0x1E
_NEG_LARGE = 0x1F
_NEG_8BYTE_INT = 0x20
_NEG_1BYTE_INT = 0x27
_NEG_SMALL = 0x28
_ZERO = 0x29
_POS_SMALL = 0x2A
_POS_1BYTE_INT = 0x2B
_POS_8BYTE_INT = 0x32
_POS_LARGE = 0x33

# DecimalContinuationMarker: how the stored double relates to the decimal.
_DCM_EQUAL = 0  # the decimal is exactly the double
_DCM_CONT_LESS = 1  # continuation follows; value < double rounded up to 15 digits
_DCM_EQUAL_15 = 2  # the decimal is the double rounded (away from zero) to 15 digits
_DCM_CONT_GREATER = 3  # continuation follows; value > double rounded up to 15 digits

_DECIMAL_ZERO_0XXX = 0x1A  # first of the six 5-bit decimal-zero prefixes 0b11010..0b11111
_EXPONENT_BITS = 6  # TypeBits::kStoredDecimalExponentBits
_EXPONENT_MASK = (1 << _EXPONENT_BITS) - 1

_DBL_MIN = sys.float_info.min
_DBL_MAX = sys.float_info.max
_TWO_POW_53 = 2.0**53
_TWO_POW_63 = 2.0**63
_TINIEST_2BIT_DCM = 2.0**-255  # smaller doubles only have room for a 1-bit DCM
_TINY_SHIFT = 2.0**256  # tiny doubles are scaled by this to avoid subnormals

_DBL = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_U64BE = struct.Struct(">Q")


def _context(rounding: str = ROUND_HALF_EVEN) -> Context:
    """A fresh decimal128 context; fresh so the flags it collects belong to one operation."""
    return Context(
        prec=34, rounding=rounding, Emin=-6143, Emax=6144, capitals=1, clamp=1, flags=[], traps=[]
    )


def _double_bits(x: float) -> int:
    bits: int = _U64.unpack(_DBL.pack(x))[0]
    return bits


def _bits_double(b: int) -> float:
    value: float = _DBL.unpack(_U64.pack(b & _MASK64))[0]
    return value


def _decimal(negative: bool, coefficient: int, biased_exponent: int) -> Decimal:
    # Decimal(str) is exact: no context rounding is applied.
    return Decimal(f"{'-' if negative else ''}{coefficient}E{biased_exponent - _BIAS}")


def _coefficient(d: Decimal) -> int:
    return int("".join(map(str, d.as_tuple().digits)))


def _biased_exponent(d: Decimal) -> int:
    return int(d.as_tuple().exponent) + _BIAS


# --- raw 128-bit value <-> Python Decimal ---------------------------------------------------


def _combination(raw: int) -> int:
    return (raw >> 110) & 0x1FFFF


def _raw_is_nan(raw: int) -> bool:
    return _combination(raw) >= _COMBO_NAN


def _raw_is_infinite(raw: int) -> bool:
    return _COMBO_INFINITY <= _combination(raw) < _COMBO_NAN


def _raw_biased_exponent(raw: int) -> int:
    """Decimal128::getBiasedExponent, including its answers for odd encodings."""
    combo = _combination(raw)
    if combo < _COMBO_NON_CANONICAL:
        return combo >> 3
    if combo >= _COMBO_INFINITY:
        return _MAX_BIASED_EXPONENT + 1
    return (combo >> 1) & 0x3FFF  # the "11" form: its coefficient can only be non-canonical


def _raw_to_decimal(raw: int) -> Decimal:
    """A finite raw value as a Decimal; non-canonical coefficients read as zero (IEEE/Intel)."""
    if _combination(raw) < _COMBO_NON_CANONICAL:
        coefficient = raw & _COEFF_BITS
        if coefficient > _MAX_COEFFICIENT:
            coefficient = 0
    else:
        coefficient = 0
    return _decimal(bool(raw & _SIGN), coefficient, _raw_biased_exponent(raw))


def _decimal_to_raw(d: Decimal) -> int:
    sign = _SIGN if d.is_signed() else 0
    if d.is_infinite():
        return sign | _INFINITY
    coefficient, exponent = _coefficient(d), _biased_exponent(d)
    assert 0 <= exponent <= _MAX_BIASED_EXPONENT and coefficient <= _MAX_COEFFICIENT
    return sign | (exponent << 113) | coefficient


def _to_bid(raw: int) -> bytes:
    return raw.to_bytes(16, "little")


# --- the Decimal128 operations key_string.cpp uses --------------------------------------------


def _normalize(d: Decimal) -> Decimal:
    """Decimal128::normalize: add 0E-6176, which yields the cohort with the most digits."""
    return _context().add(d, Decimal("0E-6176"))


def _to_double_toward_zero(d: Decimal) -> tuple[float, bool]:
    """Decimal128::toDouble(kRoundTowardZero) of a finite non-zero d: (double, exact?)."""
    x = float(d)  # correctly rounded to nearest (inf past DBL_MAX)
    if math.isinf(x):
        return math.copysign(_DBL_MAX, x), False
    exact = Decimal(x)  # exact value of the double
    if exact == d:
        return x, True
    if exact.copy_abs() > d.copy_abs():  # copy_abs: no context rounding
        x = math.nextafter(x, 0.0)  # step back toward zero; keeps the sign of 0
    return x, False


def _dec_from_double(x: float, rounding: str, fifteen_digits: bool = False) -> Decimal:
    """Decimal128(double, kRoundTo34Digits or kRoundTo15Digits, rounding), cohort included.

    Intel's binary64_to_bid128 returns the exact value when it fits in 34 digits (integers with
    exponent 0, fractions c/2^a as c*5^a with exponent -a, which is what Decimal(float) gives)
    and otherwise the value rounded to exactly 34 digits. The 15-digit variant then quantizes
    to a 15-digit coefficient. NaN is handled by callers.
    """
    if x == 0.0:
        return Decimal("-0") if math.copysign(1.0, x) < 0 else Decimal(0)
    if math.isinf(x):
        return Decimal("-Infinity") if x < 0 else Decimal("Infinity")
    exact = Decimal(x)
    converted = exact if len(exact.as_tuple().digits) <= 34 else _context(rounding).plus(exact)
    if not fifteen_digits:
        return converted
    # Lower bound for floor(log10(|x|)) from the binary exponent, as mongod computes it.
    base2 = math.frexp(x)[1] - 1
    base10 = (base2 * 30103) // 100000
    ctx = _context()
    q = converted.quantize(Decimal(f"1E{base10 - 14}"), rounding=rounding, context=ctx)
    if _coefficient(q) > 10**15 - 1:
        q = converted.quantize(Decimal(f"1E{base10 - 13}"), rounding=rounding, context=ctx)
    return q


def _nan_raw_from_double(x: float) -> int:
    """binary64_to_bid128 of a NaN (reachable only from corrupt KeyStrings): payload kept."""
    b = _double_bits(x)
    c_hi = ((b & ((1 << 52) - 1)) << 13) & _MASK64  # the quiet bit falls off the top
    payload = (c_hi << 64) >> 18
    if payload > 10**33 - 1:
        payload = 0
    return ((b >> 63) << 127) | (0x1F << 122) | payload


def _round_away(negative: bool) -> str:
    return ROUND_FLOOR if negative else ROUND_CEILING


# Underestimates of 2**256 and 2**-256 as decimals (key_string.cpp constants).
_TINY_UP_DEC = _dec_from_double(_TINY_SHIFT, ROUND_DOWN)
_TINY_DOWN_DEC = _dec_from_double(1.0 / _TINY_SHIFT, ROUND_DOWN)


# --- encoding -------------------------------------------------------------------------------


def _append_u64(out: bytearray, v: int, invert: bool) -> None:
    out += _U64BE.pack((v ^ _MASK64) if invert else v)


def _append_preshifted_integer(out: bytearray, value: int, negative: bool) -> None:
    """An integer part already shifted left by one (low bit: has-fraction flag)."""
    n = (value.bit_length() + 7) >> 3
    if negative:
        out.append(_NEG_1BYTE_INT - (n - 1))
        out += (value ^ ((1 << (8 * n)) - 1)).to_bytes(n, "big")
    else:
        out.append(_POS_1BYTE_INT + (n - 1))
        out += value.to_bytes(n, "big")


def _append_small_double(out: bytearray, x: float, dcm: int) -> None:
    negative = x < 0
    m = -x if negative else x
    out.append(_NEG_SMALL if negative else _POS_SMALL)
    if m >= _TINIEST_2BIT_DCM:
        encoded = (_double_bits(m) << 2) | dcm  # prefix 0b11
    else:
        # Scale up to escape the subnormals; prefixes 0b01/0b10 (0b00 is for teeny decimals).
        encoded = ((_double_bits(m * _TINY_SHIFT) << 1) | (dcm != _DCM_EQUAL)) + (1 << 62)
    _append_u64(out, encoded, negative)


def _append_large_double(out: bytearray, x: float, dcm: int) -> None:
    out.append(_POS_LARGE if x > 0 else _NEG_LARGE)
    if math.isinf(x):
        encoded = _MASK64
    else:
        # Drop the sign bit, keep bit 63 clear (set only by huge decimals), 1-bit DCM.
        encoded = ((_double_bits(x) << 1) & _MASK64 & ~(1 << 63)) | (dcm != _DCM_EQUAL)
    _append_u64(out, encoded, x < 0)


def _append_double(out: bytearray, x: float, dcm: int) -> None:
    """`_appendDoubleWithoutTypeBits` (V1) with an explicit DCM."""
    negative = x < 0
    m = -x if negative else x
    if not m >= 1.0:
        if m > 0.0:
            _append_small_double(out, x, dcm)
        elif x == 0.0:
            out.append(_ZERO)
        else:
            out.append(_NAN)
        return
    if m >= _TWO_POW_63:
        _append_large_double(out, x, dcm)
        return
    integer = int(m)
    if integer == m and dcm == _DCM_EQUAL:
        _append_preshifted_integer(out, integer << 1, negative)
        return
    # Integer part (with its fraction flag) in the high bytes, binary fraction and DCM below.
    frac_bytes = (64 - (integer << 1).bit_length()) >> 3
    num, den = m.as_integer_ratio()
    encoding, rest = divmod(num << (8 * frac_bytes), den)
    assert rest == 0  # m * 256**frac_bytes is an integer (mongod dasserts this)
    encoding += (integer + 1) << (8 * frac_bytes)
    assert encoding & 3 == 0
    out.append(_NEG_8BYTE_INT + frac_bytes if negative else _POS_8BYTE_INT - frac_bytes)
    _append_u64(out, encoding | dcm, negative)


def _append_tiny_decimal(out: bytearray, magnitude: Decimal, bin_: float, negative: bool) -> None:
    """|value| below DBL_MIN and not a double (`_appendTinyDecimalWithoutTypeBits`)."""
    out.append(_NEG_SMALL if negative else _POS_SMALL)
    if bin_ == 0.0:
        # Below the smallest subnormal: the normalized decimal itself (its top bits are 00).
        raw = _decimal_to_raw(_normalize(magnitude))
        assert raw >> 126 == 0
        _append_u64(out, raw >> 64, negative)
        _append_u64(out, raw & _MASK64, negative)
        return
    # Scale in the decimal domain, rounding down at each step so the continuation stays >= 0.
    scaled_dec = _context(ROUND_DOWN).multiply(magnitude, _TINY_UP_DEC)
    scaled_bin = _to_double_toward_zero(scaled_dec)[0]
    scaled_bin = max(scaled_bin, abs(bin_) * _TINY_SHIFT)
    encoded = ((_double_bits(scaled_bin) << 1) | 1) + (1 << 62)
    _append_u64(out, encoded, negative)
    stored = _context(ROUND_DOWN).multiply(_dec_from_double(scaled_bin, ROUND_DOWN), _TINY_DOWN_DEC)
    stored = _normalize(stored)
    diff = _context().subtract(magnitude, stored)
    # mongod's dasserts: stored < value, and the difference fits the 8-byte continuation.
    assert stored < magnitude and not diff.is_signed()
    assert diff.is_zero() or _biased_exponent(diff) == _biased_exponent(stored)
    assert _coefficient(diff) <= _MASK64
    _append_u64(out, _coefficient(diff), negative)


def _append_huge_decimal(out: bytearray, magnitude: Decimal, negative: bool) -> None:
    """|value| beyond DBL_MAX: the normalized decimal with bit 127 forced on, so it sorts between
    the largest double (bit clear) and infinity (all ones)."""
    raw = _decimal_to_raw(_normalize(magnitude)) | (1 << 127)
    out.append(_NEG_LARGE if negative else _POS_LARGE)
    _append_u64(out, raw >> 64, negative)
    _append_u64(out, raw & _MASK64, negative)


def _append_decimal_bits(bits: TypeBitsSink, value: int, count: int) -> None:
    for pos in range(count - 1, -1, -1):  # most significant bit first
        bits.append_bit((value >> pos) & 1)


def encode_decimal(bid: bytes, out: bytearray, bits: TypeBitsSink) -> None:
    """Append the complete KeyString encoding (CType + value bytes) of the Decimal128 whose 16
    little-endian BSON bytes are `bid`, and its type bits, as mongod's `_appendNumberDecimal`."""
    raw = int.from_bytes(bid, "little")
    negative = bool(raw & _SIGN)

    if _raw_is_nan(raw):
        out.append(_NAN)  # every NaN collapses to one encoding (decodes as +NaN)
        _append_decimal_bits(bits, 0b11, 2)
        return
    if _raw_is_infinite(raw):
        out.append(_NEG_LARGE if negative else _POS_LARGE)
        _append_u64(out, _MASK64, negative)
        _append_decimal_bits(bits, 0b11, 2)  # no exponent bits for infinities
        return

    dec = _raw_to_decimal(raw)
    exponent = _raw_biased_exponent(raw)
    if dec.is_zero():
        # All zeros share CType 0x29; sign and exponent live in 5 + 12 type bits.
        which = exponent + (_MAX_BIASED_EXPONENT + 1 if negative else 0)
        if which >> 12 > 5:
            # mongod's invariant fires here (only reachable with a non-canonical encoding).
            raise ValueError("Decimal128 zero with an out-of-range exponent")
        _append_decimal_bits(bits, (which >> 12) + _DECIMAL_ZERO_0XXX, 5)
        _append_decimal_bits(bits, which & 0xFFF, 12)
        out.append(_ZERO)
        return

    _append_decimal_bits(bits, 0b11, 2)
    _append_decimal_bits(bits, exponent & _EXPONENT_MASK, _EXPONENT_BITS)

    bin_, exact = _to_double_toward_zero(dec)
    if exact:
        _append_double(out, bin_, _DCM_EQUAL)  # 1.5, 2.0, ...: identical to the double
        return
    abs_bin = abs(bin_)
    if abs_bin < _DBL_MIN:
        _append_tiny_decimal(out, dec.copy_abs(), bin_, negative)
        return
    if abs_bin >= _DBL_MAX:
        _append_huge_decimal(out, dec.copy_abs(), negative)
        return

    away = _round_away(negative)
    if abs_bin >= _TWO_POW_63:
        # Only one DCM bit here, so any inexact value needs a continuation.
        _append_large_double(out, bin_, _DCM_CONT_GREATER)
        stored = _dec_from_double(bin_, away)
    elif abs_bin < _TINIEST_2BIT_DCM:
        _append_small_double(out, bin_, _DCM_CONT_GREATER)
        stored = _dec_from_double(bin_, away)
    elif abs_bin >= _TWO_POW_53:
        # The double may have lost integer digits: encode the exact integer part instead.
        ctx = _context()
        truncated = dec.quantize(Decimal(0), rounding=ROUND_DOWN, context=ctx)
        integer = _coefficient(truncated)
        has_fraction = bool(ctx.flags[Inexact])
        _append_preshifted_integer(out, (integer << 1) | has_fraction, negative)
        if not has_fraction:
            return
        if integer < (1 << 55):
            # 7 integer bytes hold all 53+ bits; one more byte carries just the DCM.
            out.append(_DCM_CONT_GREATER ^ (0xFF if negative else 0))
        stored = _decimal(negative, integer, _BIAS)
    elif _coefficient(dec) < 10**15:
        # At most 15 digits: the double, read back to 15 digits, gives the decimal.
        assert _dec_from_double(abs_bin, ROUND_CEILING, fifteen_digits=True) == dec.copy_abs()
        _append_double(out, bin_, _DCM_EQUAL_15)
        return
    else:
        from_bin = _dec_from_double(bin_, away, fifteen_digits=True)
        if from_bin == dec:  # e.g. trailing zeros beyond 15 digits
            _append_double(out, bin_, _DCM_EQUAL_15)
            return
        less = (dec < from_bin) != negative
        _append_double(out, bin_, _DCM_CONT_LESS if less else _DCM_CONT_GREATER)
        stored = _dec_from_double(bin_, away)

    # The continuation: the decimal digits missing from `stored`, at its 34-digit exponent.
    stored = _normalize(stored)
    diff = _context().subtract(dec, stored)
    assert diff.is_zero() or _biased_exponent(diff) == _biased_exponent(stored)
    assert diff.is_zero() or diff.is_signed() == negative
    continuation = _coefficient(diff)
    assert continuation <= _MASK64
    _append_u64(out, continuation, negative)


# --- decoding -------------------------------------------------------------------------------


def _overflow(advance: int, remaining: int) -> MongoError:
    # BufReader::skip past the end (ConstDataRangeCursor::advance), ErrorCodes::Overflow.
    return MongoError(
        15, f"Invalid advance ({advance}) past end of buffer[{remaining}] at offset: 0"
    )


def _read_u64(data: bytes, pos: int, invert: bool) -> tuple[int, int]:
    if pos + 8 > len(data):
        raise _overflow(8, max(len(data) - pos, 0))
    v = _U64BE.unpack_from(data, pos)[0]
    return (v ^ _MASK64) if invert else v, pos + 8


def _read_u8(data: bytes, pos: int, invert: bool) -> tuple[int, int]:
    if pos >= len(data):
        raise _overflow(1, 0)
    v = data[pos]
    return (v ^ 0xFF) if invert else v, pos + 1


def _read_bits(bits: TypeBitsSource, count: int) -> int:
    v = 0
    for _ in range(count):
        v = (v << 1) | bits.read_bit()
    return v


def _is_valid_exponent(exponent: int) -> bool:
    # Decimal128::isValid(sign, exponent, 0, 0): only the exponent can be out of range here.
    return 0 <= exponent <= _MAX_BIASED_EXPONENT


def _read_continuation(
    data: bytes, pos: int, invert: bool, num: Decimal | None
) -> tuple[Decimal, int]:
    """`readDecimalContinuation`: normalize to 34 digits, add the stored low digits exactly.

    `num` is None when the double read was NaN (possible only in corrupt input)."""
    continuation, pos = _read_u64(data, pos, invert)
    if num is None or not num.is_finite():
        # NaN/Inf report exponent 12288, which Decimal128::isValid rejects.
        raise KeyStringError(50850, "Invalid decimal continuation.")
    num = _normalize(num)
    ctx = _context()
    addend = _decimal(num.is_signed(), continuation, _biased_exponent(num))
    num = ctx.add(num, addend)
    if ctx.flags[Inexact]:
        raise KeyStringError(50815, "Unexpected inexact flag set after Decimal addition.")
    return num, pos


def _quantize_flags(num: Decimal, exponent: int) -> tuple[Decimal, bool]:
    """Decimal128::quantize(1E<exponent>) with ties-to-even; returns (result, any flag set)."""
    normalized = _normalize(num)
    ref_exponent = _biased_exponent(_normalize(_decimal(False, 1, exponent)))
    if ref_exponent != 0 and _biased_exponent(normalized) - ref_exponent > 33:
        return normalized, False
    ctx = _context()
    q = num.quantize(_decimal(False, 1, exponent), context=ctx)
    return q, bool(ctx.flags[Inexact] or ctx.flags[InvalidOperation])


def _adjust_exponent(bits: TypeBitsSource, num: Decimal) -> Decimal:
    """`adjustDecimalExponent`: move `num` (same value) to the cohort whose exponent has the low
    6 bits stored in the type bits. uint32 arithmetic is kept so corrupt input fails alike."""
    if num.is_zero():
        raise KeyStringError(50829, "Expected non-zero number for decimal.")
    orig = _biased_exponent(num)
    stored = _read_bits(bits, _EXPONENT_BITS)
    high = (orig & ~_EXPONENT_MASK) | stored
    if high < orig:
        high += 1 << _EXPONENT_BITS
    if high == orig:
        return num
    # With a 64-bit coefficient the exponent can only go up by 19 (2**64 < 1E20).
    if high <= orig + 33 and (_coefficient(num) >> 64 != 0 or high <= orig + 19):
        if not _is_valid_exponent(high):
            raise KeyStringError(50845, "Unexpected exponent values after adjusting Decimal.")
        num, flagged = _quantize_flags(num, high)
        if flagged:
            raise KeyStringError(50813, "Unexpected signaling flag for Decimal quantization.")
    else:
        low = (high - (1 << _EXPONENT_BITS)) & _MASK32
        if not (low >= (orig - 33) & _MASK32 and _is_valid_exponent(low)):
            raise KeyStringError(50814, "Unexpected exponent values after adjusting Decimal.")
        num = _context().add(num, _decimal(False, 0, low))
    if _biased_exponent(num) & _EXPONENT_MASK != high & _EXPONENT_MASK:
        raise KeyStringError(50830, "Unexpected biased exponent in decimal.")
    return num


def _finish(bits: TypeBitsSource, num: Decimal, negate: bool) -> bytes:
    return _to_bid(_decimal_to_raw(_adjust_exponent(bits, num.copy_negate() if negate else num)))


def decode_decimal_zero(zero_type: int, bits: TypeBitsSource) -> bytes:
    """The Decimal128 zero whose 5-bit zero type (0x19..0x1F, from TypeBits::Reader::readZero)
    was read: read its remaining 12 bits and return the 16 BSON bytes (sign and exponent kept)."""
    which = (zero_type - _DECIMAL_ZERO_0XXX) & _MASK32  # 0x19 (unused) wraps, as in mongod
    for _ in range(12):
        which = ((which << 1) | bits.read_bit()) & _MASK32
    negative = which > _MAX_BIASED_EXPONENT
    exponent = (which - (_MAX_BIASED_EXPONENT + 1)) & _MASK32 if negative else which
    if not _is_valid_exponent(exponent):
        raise KeyStringError(50846, "Invalid numeric zero decimal.")
    return _to_bid((_SIGN if negative else 0) | (exponent << 113))


def decode_decimal(ctype: int, data: bytes, pos: int, bits: TypeBitsSource) -> tuple[bytes, int]:
    """Decode a numeric value (CType 0x1E..0x33, not 0x29) whose 2 type bits said Decimal128;
    `pos` is just after the CType byte. Returns (16 BSON bytes, position after the value)."""
    if ctype == _NAN:
        return _to_bid(_POSITIVE_NAN), pos

    if ctype in (_POS_LARGE, _NEG_LARGE):
        negative = ctype == _NEG_LARGE
        encoded, pos = _read_u64(data, pos, negative)
        has_continuation = False
        if not encoded >> 63:  # a finite double, shifted left one with its DCM bit
            has_continuation = bool(encoded & 1)
            x = _bits_double((encoded >> 1) | (1 << 62))
            if negative:
                x = -x
        elif encoded == _MASK64:
            x = -math.inf if negative else math.inf
        else:  # a huge decimal, stored directly
            low, pos = _read_u64(data, pos, negative)
            raw = ((encoded & ~(1 << 63)) << 64) | low
            if negative:
                raw ^= _SIGN
            if _raw_is_nan(raw) or _raw_is_infinite(raw):
                return _to_bid(raw), pos
            return _finish(bits, _raw_to_decimal(raw), False), pos
        if math.isnan(x):
            if has_continuation:
                _read_continuation(data, pos, negative, None)  # raises 50850
            return _to_bid(_nan_raw_from_double(x)), pos
        dec = _dec_from_double(x, _round_away(negative))
        if has_continuation:
            dec, pos = _read_continuation(data, pos, negative, dec)
        if not dec.is_finite():
            return _to_bid(_decimal_to_raw(dec)), pos
        return _finish(bits, dec, False), pos

    if ctype in (_POS_SMALL, _NEG_SMALL):
        negative = ctype == _NEG_SMALL
        encoded, pos = _read_u64(data, pos, negative)
        prefix = encoded >> 62
        if prefix == 0:
            # Smaller than the smallest subnormal: the decimal itself.
            low, pos = _read_u64(data, pos, negative)
            num = _raw_to_decimal((encoded << 64) | low)
            adjusted = _adjust_exponent(bits, num)
            return _to_bid(_decimal_to_raw(adjusted.copy_negate() if negative else adjusted)), pos
        if prefix in (1, 2):
            # Tiny: a double scaled by 2**256, always followed by a continuation.
            has_continuation = bool(encoded & 1)
            scaled = _bits_double((encoded - (1 << 62)) >> 1)
            if not has_continuation:
                raise KeyStringError(50823, "Expected decimal continuation.")
            if scaled < _DBL_MIN * _TINY_SHIFT:
                # Subnormal range: scale in the decimal domain, rounding down as the encoder did.
                dec = _context(ROUND_DOWN).multiply(
                    _dec_from_double(scaled, ROUND_DOWN), _TINY_DOWN_DEC
                )
            else:
                dec = _dec_from_double(scaled / _TINY_SHIFT, ROUND_CEILING)
            dec, pos = _read_continuation(data, pos, negative, dec)
            return _finish(bits, dec, negative), pos
        # prefix 0b11: an ordinary double below 1 with a 2-bit DCM.
        dcm = encoded & 3
        x = _bits_double(encoded >> 2)
        if dcm == _DCM_EQUAL_15:
            dec = _dec_from_double(x, ROUND_CEILING, fifteen_digits=True)
        else:
            dec = _dec_from_double(x, ROUND_CEILING)
            if dcm != _DCM_EQUAL:
                dec, pos = _read_continuation(data, pos, negative, dec)
        return _finish(bits, dec, negative), pos

    if _NEG_8BYTE_INT <= ctype <= _NEG_1BYTE_INT or _POS_1BYTE_INT <= ctype <= _POS_8BYTE_INT:
        negative = ctype <= _NEG_1BYTE_INT
        n = ctype - _POS_1BYTE_INT + 1 if not negative else _NEG_1BYTE_INT - ctype + 1
        encoded = 0
        for _ in range(n):  # mongod reads these one byte at a time
            b, pos = _read_u8(data, pos, negative)
            encoded = (encoded << 8) | b
        integer = encoded >> 1
        if not encoded & 1:
            return _finish(bits, _decimal(negative, integer, _BIAS), False), pos
        # With a fraction the value spans 8 bytes: integer bytes, then fraction bytes + DCM.
        frac_bytes = 8 - n
        fraction = integer
        for _ in range(frac_bytes):
            b, pos = _read_u8(data, pos, negative)
            fraction = ((fraction << 8) | b) & _MASK64
        x = float(fraction & ~3) * 2.0 ** (-8 * frac_bytes)  # uint64 -> double rounds, as in C
        dcm = fraction & 3 if frac_bytes else _DCM_CONT_GREATER
        if dcm == _DCM_EQUAL_15:
            dec = _dec_from_double(x, ROUND_CEILING, fifteen_digits=True)
        elif dcm == _DCM_EQUAL:
            dec = _dec_from_double(x, ROUND_CEILING)
        else:
            # Integer parts beyond 2**53 were stored exactly rather than via the double.
            if float(integer) > _TWO_POW_53:
                dec = _decimal(False, integer, _BIAS)
            else:
                dec = _dec_from_double(x, ROUND_CEILING)
            dec, pos = _read_continuation(data, pos, negative, dec)
        return _finish(bits, dec, negative), pos

    raise KeyStringError(50811, f"Unknown type: {ctype}")
