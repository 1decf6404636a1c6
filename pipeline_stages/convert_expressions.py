"""Type expressions as mongod 8.0 evaluates them: `$convert` and its shorthands `$toDouble`,
`$toString`, `$toObjectId`, `$toBool`, `$toDate`, `$toInt`, `$toLong`, `$toDecimal`
(ExpressionConvert: the conversion table, onError / onNull, 241 ConversionFailure with mongod's
messages), `$type`, `$isNumber`, `$cmp`, `$binarySize` and `$bsonSize`.

Left to mongod's newer forms and not evaluated here (NotImplementedError, "not supported"):
conversions to or from binData, a `to` document (`{type, subtype}`), the `format`, `base` and
`byteOrder` arguments, string -> date (timelib's date-string grammar), and double -> string for
a double that printf's %g and the shortest round-trip form print differently (`_format_double`).

`$cmp` orders values as Value::compare does, by their KeyString (keystring.py encodes mongod's
BSON order: canonical type, then value), a missing operand lowest but MinKey.

Installed into the expression parser by expressions.py (`OPERATORS`). Pure and synchronous.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.min_key import MinKey
from bson.objectid import ObjectId

from pipeline_stages import bson_bytes, keystring
from pipeline_stages.date_expressions import MISSING, missing_type_name, nullish, operand
from pipeline_stages.errors import MongoError
from pipeline_stages.string_expressions import fixed_arguments

__all__ = ["OPERATORS", "bson_type"]

_CONVERSION = 241  # ConversionFailure
_FAILED_TO_PARSE = 9
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_DECIMAL = decimal.Context(prec=34, Emax=6144, Emin=-6143, clamp=1, traps=[])

# BSON type numbers by typeName(), as $type answers and `to` names them.
_TYPES = {
    "missing": 0, "double": 1, "string": 2, "object": 3, "array": 4, "binData": 5,
    "undefined": 6, "objectId": 7, "bool": 8, "date": 9, "null": 10, "regex": 11,
    "dbPointer": 12, "javascript": 13, "symbol": 14, "javascriptWithScope": 15, "int": 16,
    "timestamp": 17, "long": 18, "decimal": 19, "minKey": -1, "maxKey": 127,
}
_NAMES = {number: name for name, number in _TYPES.items()}


def bson_type(value: Any) -> str:
    """typeName() of an evaluated value ("missing" for a missing one)."""
    return missing_type_name(value)


def _failure(message: str) -> MongoError:
    return MongoError(_CONVERSION, message)


def _double_string(x: float) -> str:
    """ostream << double (%g), as conversion messages print a double."""
    return "nan" if x != x else f"{x:g}"


# -- conversions ---------------------------------------------------------------------------------

_NO_ON_ERROR = "in $convert with no onError value"


def _check_finite(x: float | decimal.Decimal) -> None:
    if x != x or (isinstance(x, decimal.Decimal) and x.is_nan()):
        raise _failure(f"Attempt to convert NaN value to integer type {_NO_ON_ERROR}")
    if isinstance(x, float) and math.isinf(x) or isinstance(x, decimal.Decimal) and x.is_infinite():
        raise _failure(f"Attempt to convert infinity value to integer type {_NO_ON_ERROR}")


def _double_to_integer(x: float, target: str) -> int:
    _check_finite(x)
    low, high = _INT32 if target == "int" else _INT64
    if not low <= x <= high if target == "int" else not low <= x < 2.0**63:
        raise _failure(f"Conversion would overflow target type {_NO_ON_ERROR}: "
                       f"{_double_string(x)}")
    return int(x)


def _decimal_to_integer(value: Decimal128, target: str) -> int:
    number = value.to_decimal()
    _check_finite(number)
    whole = int(number.to_integral_value(decimal.ROUND_DOWN))
    low, high = _INT32 if target == "int" else _INT64
    if not low <= whole <= high:
        raise _failure(f"Conversion would overflow target type {_NO_ON_ERROR}: {value}")
    return whole


def _decimal_to_double(value: Decimal128) -> float:
    number = value.to_decimal()
    result = float(number)
    if number.is_finite() and (math.isinf(result) or (
            number != 0 and abs(result) < 2.2250738585072014e-308
            and decimal.Decimal(result) != number)):
        raise _failure(f"Conversion would overflow target type {_NO_ON_ERROR}: {value}")
    return result


def _double_to_decimal(x: float) -> Decimal128:
    """Decimal128(double): exactly 15 significant digits, ties to even (zero, infinities and
    NaN as they are)."""
    if x == 0:  # binary64_to_bid128's zero: 0E+0, signed
        return Decimal128("-0" if math.copysign(1.0, x) < 0 else "0")
    if math.isinf(x) or x != x:
        return Decimal128(repr(x) if x == x else "NaN")
    # binary64_to_bid128 first (34 digits, ties to even), then quantized to 15 digits
    converted = _DECIMAL.plus(decimal.Decimal(x))
    exponent = converted.adjusted() - 14
    rounded = converted.quantize(decimal.Decimal(1).scaleb(exponent), decimal.ROUND_HALF_EVEN,
                                 _DECIMAL)
    if len(rounded.as_tuple().digits) > 15:  # 9.99...95 rounded up a digit: requantize
        rounded = converted.quantize(decimal.Decimal(1).scaleb(exponent + 1),
                                     decimal.ROUND_HALF_EVEN, _DECIMAL)
    return Decimal128(rounded)


def _format_double(x: float) -> str:
    """performFormatDouble. mongod's sources print a finite double either with
    `str::stream() << x` (printf's %g) or, in later ones, with `fmt::format("{}", x)` (the
    shortest round-trip form); which of the two 8.0 ships is not established here, so a double
    the two print differently (1234567.0: "1.23457e+06" / "1234567") is not converted."""
    if math.isinf(x):
        return "-Infinity" if x < 0 else "Infinity"
    if x != x:
        return "NaN"
    if x == 0 and math.copysign(1.0, x) < 0:
        return "-0"
    shortest = repr(x)
    shortest = shortest[:-2] if shortest.endswith(".0") else shortest
    if shortest != f"{x:g}":
        raise NotImplementedError(f"$convert of the double {shortest} to a string")
    return shortest


def _date_string(moment: datetime.datetime) -> str:
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC).replace(tzinfo=None)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _date_ms(moment: datetime.datetime) -> int:
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC).replace(tzinfo=None)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _from_ms(ms: int) -> datetime.datetime:
    try:
        return _EPOCH + datetime.timedelta(milliseconds=ms)
    except OverflowError:  # beyond what the engine's datetimes hold
        raise NotImplementedError(f"a date of {ms} ms since the epoch") from None


_STRTOD = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?))")


def _parse_failure(text: str, reason: str) -> MongoError:
    return _failure(f"Failed to parse number '{text}' {_NO_ON_ERROR}: {reason}")


def _parse_double(text: str) -> float:
    """NumberParser for a double (strtod, base 0, no leading whitespace or trailing text)."""
    if not text:
        raise _parse_failure(text, "Empty string")
    if text[0] in " \t\n\v\f\r":
        raise _parse_failure(text, "Leading whitespace")
    match = _STRTOD.match(text)
    if match is None:
        raise _parse_failure(text, "Did not consume any digits")
    number = match.group()
    result = float(number.split("(")[0])
    mantissa = re.sub(r"[eE].*", "", number)
    if (math.isinf(result) and not re.search(r"(?i)inf", number)) or (
            result == 0 and re.search(r"[1-9]", mantissa)) or (
            0 < abs(result) < 2.2250738585072014e-308):
        raise _parse_failure(text, "Out of range")  # strtod's ERANGE
    if match.end() != len(text):
        raise _parse_failure(text, "Did not consume whole string.")
    return result


def _parse_integer(text: str, target: str) -> int:
    """NumberParser, base 10, for an int or a long."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body:
        raise _parse_failure(text, "No digits")
    digits = len(body) - len(body.lstrip("0123456789"))
    if digits != len(body):
        raise _parse_failure(text, "Did not consume whole string.")
    magnitude = int(body)
    low, high = _INT32 if target == "int" else _INT64
    if magnitude >= 2**64 or (-magnitude < low if text[0] == "-" else magnitude > high):
        raise _parse_failure(text, "Overflow")
    return -magnitude if text[0] == "-" else magnitude


def _parse_decimal(text: str) -> Decimal128:
    if not text:
        raise _parse_failure(text, "Empty string")
    try:
        parsed = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise _parse_failure(text, "Failed to parse string to decimal") from None
    context = _DECIMAL.copy()
    rounded = context.plus(parsed) if parsed.is_finite() else parsed
    if context.flags[decimal.Overflow]:
        raise _parse_failure(text, "Conversion from string to decimal would overflow")
    if context.flags[decimal.Underflow]:
        raise _parse_failure(text, "Conversion from string to decimal would underflow")
    return Decimal128(rounded)


def _parse_object_id(text: str) -> ObjectId:
    size = len(bson_bytes.utf8(text))
    reason = None
    if size != 24:
        reason = f"Invalid string length for parsing to OID, expected 24 but found {size}"
    else:
        bad = next((c for c in text if c not in "0123456789abcdefABCDEF"), None)
        if bad is not None:
            reason = f"Invalid character found in hex string: {bad}"
    if reason is not None:
        raise _failure(f"Failed to parse objectId '{text}' {_NO_ON_ERROR}: {reason}")
    return ObjectId(text)


def _unsupported(source: str, target: str) -> MongoError:
    return _failure(f"Unsupported conversion from {source} to {target} {_NO_ON_ERROR}")


def convert(value: Any, target: str) -> Any:
    """The conversion table of mongod 8.0's $convert for a non-nullish `value`."""
    source = bson_type(value)
    if "binData" in (source, target) and target != "bool":
        raise NotImplementedError(f"$convert from {source} to {target}")
    if target == "bool":
        if source in ("double", "int", "long"):
            return bool(value)
        if source == "decimal":
            return not value.to_decimal().is_zero()
        if source == "bool":
            return value
        if source in ("string", "objectId", "date", "timestamp", "object", "array", "binData",
                      "regex", "javascript", "javascriptWithScope", "minKey", "maxKey"):
            return True
        raise _unsupported(source, target)
    if source == target and source not in ("timestamp", "object", "array", "regex",
                                           "javascript", "javascriptWithScope", "minKey",
                                           "maxKey"):
        return Int64(value) if source == "long" else value
    if source == "double":
        if target == "string":
            return _format_double(value)
        if target == "date":
            return _from_ms(_double_to_integer(value, "long"))
        if target in ("int", "long"):
            whole = _double_to_integer(value, target)
            return Int64(whole) if target == "long" else whole
        if target == "decimal":
            return _double_to_decimal(value)
    elif source in ("int", "long"):
        if target == "double":
            return float(value)
        if target == "string":
            return str(int(value))
        if target == "long":
            return Int64(value)
        if target == "decimal":
            return Decimal128(str(int(value)))
        if target == "int" and source == "long":
            if not _INT32[0] <= value <= _INT32[1]:
                raise _failure(f"Conversion would overflow target type {_NO_ON_ERROR}: ")
            return int(value)
        if target == "date" and source == "long":
            return _from_ms(int(value))
    elif source == "decimal":
        if target == "double":
            return _decimal_to_double(value)
        if target == "string":
            return str(value)
        if target in ("int", "long"):
            whole = _decimal_to_integer(value, target)
            return Int64(whole) if target == "long" else whole
        if target == "date":
            return _from_ms(_decimal_to_integer(value, "long"))
    elif source == "string":
        if target == "double":
            _check_hex(value)
            return _parse_double(value)
        if target in ("int", "long"):
            _check_hex(value)
            whole = _parse_integer(value, target)
            return Int64(whole) if target == "long" else whole
        if target == "decimal":
            _check_hex(value)
            return _parse_decimal(value)
        if target == "objectId":
            return _parse_object_id(value)
        if target == "date":
            raise NotImplementedError("$convert of a string to a date")
    elif source == "bool":
        numbers: dict[str, Any] = {"double": float(value), "int": int(value),
                                   "long": Int64(int(value)),
                                   "decimal": Decimal128("1" if value else "0"),
                                   "string": "true" if value else "false"}
        if target in numbers:
            return numbers[target]
    elif source == "date":
        if target == "string":
            return _date_string(value)
        ms = _date_ms(value)
        if target == "double":
            return float(ms)
        if target == "long":
            return Int64(ms)
        if target == "decimal":
            return Decimal128(str(ms))
    elif source == "objectId":
        if target == "string":
            return str(value)
        if target == "date":
            return _EPOCH + datetime.timedelta(seconds=int.from_bytes(value.binary[:4], "big"))
    elif source == "timestamp" and target == "date":
        return _EPOCH + datetime.timedelta(seconds=value.time)
    raise _unsupported(source, target)


def _check_hex(text: str) -> None:
    if text.startswith(("0x", "0X")):
        raise _failure(f"Illegal hexadecimal input {_NO_ON_ERROR}: {text}")


def _target(value: Any) -> str | None:
    """ConvertTargetTypeInfo::parse of the evaluated `to`: a type name, None when nullish."""
    if nullish(value):
        return None
    if isinstance(value, str) and not isinstance(value, Code):
        if value not in _TYPES:
            raise MongoError(2, f"Unknown type name: {value}")
        return value
    if isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool):
        number = value.to_decimal() if isinstance(value, Decimal128) else value
        whole = number == number and not (isinstance(number, float) and math.isinf(number)) and (
            not isinstance(number, decimal.Decimal) or number.is_finite()) and (
            int(number) == number)
        if not whole or not _INT32[0] <= int(number) <= _INT32[1]:
            raise MongoError(_FAILED_TO_PARSE,
                             "In $convert, numeric 'to' argument is not an integer")
        code = int(number)
        if code not in _NAMES:
            raise MongoError(_FAILED_TO_PARSE, "In $convert, numeric value for 'to' does not "
                             f"correspond to a BSON type: {code}")
        return _NAMES[code]
    if isinstance(value, Mapping):
        raise NotImplementedError("$convert with a 'to' document")
    raise MongoError(_FAILED_TO_PARSE, "$convert's 'to' argument must be a string or number, "
                     f"but is {bson_type(value)}")


def _convert(parser: Any, args: Any) -> Any:
    if not isinstance(args, Mapping):
        raise MongoError(_FAILED_TO_PARSE, "$convert expects an object of named arguments but "
                         f"found: {bson_type(args)}")
    for key in args:
        if key in ("format", "base", "byteOrder"):
            raise NotImplementedError(f"$convert's '{key}' argument")
        if key not in ("input", "to", "onError", "onNull"):
            raise MongoError(_FAILED_TO_PARSE, f"$convert found an unknown argument: {key}")
    if "input" not in args:
        raise MongoError(_FAILED_TO_PARSE, "Missing 'input' parameter to $convert")
    if "to" not in args:
        raise MongoError(_FAILED_TO_PARSE, "Missing 'to' parameter to $convert")
    to = operand(parser, args["to"])
    value = operand(parser, args["input"])
    target = _target(to)
    if nullish(value):
        return operand(parser, args["onNull"]) if "onNull" in args else None
    if target is None:
        return None
    try:
        return convert(value, target)
    except MongoError as exc:
        if exc.code != _CONVERSION or "onError" not in args:
            raise
        return operand(parser, args["onError"])


def _shorthand(parser: Any, args: Any, name: str, target: str) -> Any:
    if isinstance(args, list):
        if len(args) != 1:
            raise MongoError(50723, f"{name} requires a single argument, got {len(args)}")
        args = args[0]
    value = operand(parser, args)
    return None if nullish(value) else convert(value, target)


# -- $type, $isNumber, $cmp, $binarySize, $bsonSize ----------------------------------------------


def _type(parser: Any, args: Any) -> Any:
    (value,) = fixed_arguments(parser, args, "$type", 1)
    return bson_type(value)


def _is_number(parser: Any, args: Any) -> Any:
    (value,) = fixed_arguments(parser, args, "$isNumber", 1)
    return bson_type(value) in ("int", "long", "double", "decimal")


def _order_key(value: Any) -> tuple[int, bytes]:
    if value is MISSING:
        return (1, b"")  # canonical type 0, with undefined: above MinKey, below null
    if isinstance(value, MinKey):
        return (0, b"")
    return (2, keystring.encode_values([value])[0])


def _cmp(parser: Any, args: Any) -> Any:
    left, right = (_order_key(v) for v in fixed_arguments(parser, args, "$cmp", 2))
    if left[0] != right[0]:
        return -1 if left[0] < right[0] else 1
    return (left[1] > right[1]) - (left[1] < right[1])


def _binary_size(parser: Any, args: Any) -> Any:
    (value,) = fixed_arguments(parser, args, "$binarySize", 1)
    if nullish(value):
        return None
    if isinstance(value, str) and not isinstance(value, Code):
        return len(bson_bytes.utf8(value))
    if isinstance(value, uuid.UUID):
        return 16
    if isinstance(value, (bytes, Binary)):
        return len(value)
    raise MongoError(51276, "$binarySize requires a string or BinData argument, found: "
                     f"{bson_type(value)}")


def _bson_size(parser: Any, args: Any) -> Any:
    (value,) = fixed_arguments(parser, args, "$bsonSize", 1)
    if nullish(value):
        return None
    if not isinstance(value, Mapping):
        raise MongoError(31393, f"$bsonSize requires a document input, found: {bson_type(value)}")
    return len(bson_bytes.encode(value))


def _shorthands() -> dict[str, Callable[[Any, Any], Any]]:
    targets = {"$toDouble": "double", "$toString": "string", "$toObjectId": "objectId",
               "$toBool": "bool", "$toDate": "date", "$toInt": "int", "$toLong": "long",
               "$toDecimal": "decimal"}
    return {name: (lambda parser, args, name=name, target=target:  # type: ignore[misc]
                   _shorthand(parser, args, name, target)) for name, target in targets.items()}


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$convert": _convert,
    **_shorthands(),
    "$type": _type,
    "$isNumber": _is_number,
    "$cmp": _cmp,
    "$binarySize": _binary_size,
    "$bsonSize": _bson_size,
}
