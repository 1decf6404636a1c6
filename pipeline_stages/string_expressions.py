"""String expressions as mongod 8.0 evaluates them (src/mongo/db/exec/expression/
evaluate_string.cpp, str_trim_utils.cpp, substr_utils.cpp; parse errors from expression.cpp):
`$concat`, `$strcasecmp`, `$toUpper`, `$toLower`, `$strLenBytes`, `$strLenCP`, `$substrBytes`
(and its alias `$substr`), `$substrCP`, `$trim`, `$ltrim`, `$rtrim`, `$split`, `$replaceOne`,
`$replaceAll`, `$regexFind`, `$regexFindAll` (evaluate_regex.cpp: `idx` in code points, the
next search after an empty match one code point on, PCRE's meaning through regex.py's RE2
translation where it holds, Python's `re` otherwise).

mongod works on a string's bytes, never decoding them: case mapping is ASCII only, byte by byte
(boost::to_upper in the "C" locale: "café" -> "CAFé"); code points are counted by their lead
bytes (a byte that is not a continuation byte starts one), so bytes that are not UTF-8 are
counted, cut and compared as mongod does. Strings here hold such bytes decoded with
surrogateescape (bson_bytes.py), so every operator works on `bson_bytes.utf8()` of its input.

Installed into the expression parser by expressions.py (`OPERATORS`). Pure and synchronous.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes
from pipeline_stages import regex as pcre
from pipeline_stages.date_expressions import MISSING, missing_type_name, nullish, operand

try:  # the linear-time engine regex.py uses; without it every pattern runs on Python's `re`
    import re2 as _re2  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - a dependency in pyproject.toml
    _re2 = None  # type: ignore[assignment,unused-ignore]
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

__all__ = ["MISSING", "OPERATORS", "coerce_to_string", "fixed_arguments", "missing_type_name"]


_INT32 = (-(2**31), 2**31 - 1)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_INT64 = (-(2**63), 2**63 - 1)


def _shown(value: Any) -> str:
    """Value::toString() of an operand (operator<<(ostream&, const Value&)): MISSING for a
    missing one, an ObjectId as its hex, a date as its ISO string, Code("..."),
    BinData(t, "HEX"), documents and arrays of those; the rest as value_string prints it."""
    if value is MISSING:
        return "MISSING"
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, datetime.datetime):
        return coerce_to_string(value)
    if isinstance(value, Code) and value.scope is None:
        return f'Code("{value}")'
    if isinstance(value, (Binary, bytes)) and not isinstance(value, str):
        subtype = value.subtype if isinstance(value, Binary) else 0
        return f'BinData({subtype}, "{bytes(value).hex().upper()}")'
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return value_string(value)


def fixed_arguments(parser: Any, args: Any, name: str, count: int) -> list[Any]:
    """The evaluated operands of a fixed-arity expression (ExpressionFixedArity: 16020)."""
    operands = args if isinstance(args, list) else [args]
    if len(operands) != count:
        raise MongoError(16020, f"Expression {name} takes exactly {count} arguments. "
                         f"{len(operands)} were passed in.")
    return [operand(parser, e) for e in operands]


def _double_string(x: float) -> str:
    """StringBuilder << double: printf's %g."""
    if x != x:
        return "nan" if str(x)[0] != "-" else "-nan"
    return f"{x:g}"


def coerce_to_string(value: Any) -> str:
    """Value::coerceToString(): numbers, dates and timestamps as mongod prints them, nullish as
    "", anything else 16007."""
    if isinstance(value, str):  # String, Code and Symbol alike
        return value
    if nullish(value):
        return ""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):  # int and Int64
        return str(int(value))
    elif isinstance(value, float):
        return _double_string(value)
    elif isinstance(value, Decimal128):
        return str(value)
    elif isinstance(value, datetime.datetime):
        moment = value
        if moment.tzinfo is not None:
            moment = moment.astimezone(datetime.UTC).replace(tzinfo=None)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    elif isinstance(value, Timestamp):
        # Timestamp::toStringPretty: ctime()'s "Mmm dd hh:mm:ss" (weekday and year cut off),
        # a colon and the increment; ctime is local time, and the server runs in UTC
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=value.time)
        return (f"{_MONTHS[moment.month - 1]} {moment.day:2d} "
                f"{moment:%H:%M:%S}:{value.inc}")
    raise MongoError(16007, f"can't convert from BSON type {missing_type_name(value)} to String")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)


def _exact(value: Any) -> decimal.Decimal | float | int:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    return value  # type: ignore[no-any-return]


def _coerce_to_long(value: Any) -> int:
    """Value::coerceToLong() of a number: doubles truncated, decimals rounded half to even,
    31109 out of range."""
    number = _exact(value)
    if isinstance(number, int):
        return int(number)
    finite = number == number and number not in (float("inf"), float("-inf"))
    if isinstance(number, decimal.Decimal):
        finite = number.is_finite()
    if finite:
        whole = int(number) if isinstance(number, float) else int(
            number.to_integral_value(decimal.ROUND_HALF_EVEN))
        if _INT64[0] <= whole <= _INT64[1]:
            return whole
    raise MongoError(31109, f"Can't coerce out of range value {_shown(value)} to long")


def _integral32(value: Any) -> bool:
    """Value::integral(): representable as a 32-bit int without loss."""
    number = _exact(value)
    if isinstance(number, bool) or not _numeric(value):
        return False
    if isinstance(number, float):
        if not (number == number and number.is_integer()):
            return False
    elif isinstance(number, decimal.Decimal):
        if not number.is_finite() or number != number.to_integral_value():
            return False
    return _INT32[0] <= int(number) <= _INT32[1]


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _code_point_length(byte: int) -> int:
    """str::getCodePointLength: the number of leading one bits of a lead byte."""
    if byte & 0x80 == 0:
        return 1
    length = 0
    while byte & 0x80:
        length += 1
        byte = (byte << 1) & 0xFF
    return length


def _string(data: bytes) -> str:
    return bson_bytes.from_utf8(data)


# -- $concat, $strcasecmp, $toUpper, $toLower ----------------------------------------------------


def _concat(parser: Any, args: Any) -> Any:
    pieces = []
    for e in args if isinstance(args, list) else [args]:
        value = operand(parser, e)
        if nullish(value):
            return None
        if not isinstance(value, str) or isinstance(value, Code):
            raise MongoError(16702, f"$concat only supports strings, not "
                             f"{missing_type_name(value)}")
        pieces.append(bson_bytes.utf8(value))
    return _string(b"".join(pieces))


def _strcasecmp(parser: Any, args: Any) -> Any:
    first, second = fixed_arguments(parser, args, "$strcasecmp", 2)
    left = bson_bytes.utf8(coerce_to_string(first)).upper()  # bytes.upper: ASCII only
    right = bson_bytes.utf8(coerce_to_string(second)).upper()
    return (left > right) - (left < right)


def _case(parser: Any, args: Any, name: str) -> Any:
    (value,) = fixed_arguments(parser, args, name, 1)
    data = bson_bytes.utf8(coerce_to_string(value))
    return _string(data.upper() if name == "$toUpper" else data.lower())


# -- lengths and substrings ----------------------------------------------------------------------


def _str_len(parser: Any, args: Any, name: str) -> Any:
    (value,) = fixed_arguments(parser, args, name, 1)
    if not isinstance(value, str) or isinstance(value, Code):
        raise MongoError(34473 if name == "$strLenBytes" else 34471,
                         f"{name} requires a string argument, found: "
                         f"{missing_type_name(value)}")
    data = bson_bytes.utf8(value)
    if name == "$strLenBytes":
        return len(data)
    return sum(1 for byte in data if not _is_continuation(byte))


def _substr_bytes(parser: Any, args: Any) -> Any:
    name = "$substrBytes"  # $substr is ExpressionSubstrBytes, and its messages say so
    operands = args if isinstance(args, list) else [args]
    if len(operands) != 3:
        raise MongoError(16020, f"Expression {name} takes exactly 3 arguments. "
                         f"{len(operands)} were passed in.")
    string, lower, length = (operand(parser, e) for e in operands)
    data = bson_bytes.utf8(coerce_to_string(string))
    if not _numeric(lower):
        raise MongoError(16034, f"{name}:  starting index must be a numeric type (is BSON type "
                         f"{missing_type_name(lower)})")
    if not _numeric(length):
        raise MongoError(16035, f"{name}:  length must be a numeric type (is BSON type "
                         f"{missing_type_name(length)})")
    start = _coerce_to_long(lower)
    if start < 0:
        raise MongoError(50752, f"{name}:  starting index must be non-negative (got: {start})")
    count = _coerce_to_long(length)
    size = len(data) if count < 0 else count
    if start < len(data) and _is_continuation(data[start]):
        raise MongoError(28656, f"{name}:  Invalid range, starting index is a UTF-8 "
                         "continuation byte.")
    if start + size < len(data) and _is_continuation(data[start + size]):
        raise MongoError(28657, f"{name}:  Invalid range, ending index is in the middle of a "
                         "UTF-8 character.")
    return _string(data[start:start + size])


def _substr_cp(parser: Any, args: Any) -> Any:
    name = "$substrCP"
    string, lower, length = fixed_arguments(parser, args, name, 3)
    data = bson_bytes.utf8(coerce_to_string(string))
    if not _numeric(lower):
        raise MongoError(34450, f"{name}: starting index must be a numeric type (is BSON type "
                         f"{missing_type_name(lower)})")
    if not _integral32(lower):
        raise MongoError(34451, f"{name}: starting index cannot be represented as a 32-bit "
                         f"integral value: {_shown(lower)}")
    if not _numeric(length):
        raise MongoError(34452, f"{name}: length must be a numeric type (is BSON type "
                         f"{missing_type_name(length)})")
    if not _integral32(length):
        raise MongoError(34453, f"{name}: length cannot be represented as a 32-bit integral "
                         f"value: {_shown(length)}")
    start, count = int(_exact(lower)), int(_exact(length))
    if count < 0:
        raise MongoError(34454, f"{name}: length must be a nonnegative integer.")
    if start < 0:
        raise MongoError(34455, f"{name}: the starting index must be nonnegative integer.")
    begin = 0
    for _ in range(start):
        if begin >= len(data):
            return ""
        if _is_continuation(data[begin]):
            raise MongoError(34456, "$substrCP: invalid UTF-8 string")
        step = _code_point_length(data[begin])
        if step > 4:
            raise MongoError(34457, "$substrCP: invalid UTF-8 string")
        begin += step
    end = begin
    for _ in range(count):
        if end >= len(data):
            break
        if _is_continuation(data[end]):
            raise MongoError(34458, "$substrCP: invalid UTF-8 string")
        step = _code_point_length(data[end])
        if step > 4:
            raise MongoError(34459, "$substrCP: invalid UTF-8 string")
        end += step
    return _string(data[begin:end])


# -- $trim, $ltrim, $rtrim -----------------------------------------------------------------------

# str_trim_utils::kDefaultTrimWhitespaceChars: NUL, space, \t \n \v \f \r, NBSP, the Unicode
# spaces U+1680 and U+2000..U+200A.
_WHITESPACE = tuple(ch.encode() for ch in (
    "\0", " ", "\t", "\n", "\v", "\f", "\r", "\u00a0", "\u1680",
    *map(chr, range(0x2000, 0x200B))))


def _trim_characters(chars: bytes) -> tuple[bytes, ...]:
    points = []
    i = 0
    while i < len(chars):
        if _is_continuation(chars[i]):
            raise MongoError(5156305, 'Failed to parse "chars" argument to $trim/$ltrim/$rtrim: '
                             "Detected invalid UTF-8. Got continuation byte when expecting the "
                             "start of a new code point.")
        lead = chars[i]
        step = 4 if lead & 0xF8 == 0xF0 else 3 if lead & 0xF0 == 0xE0 else (
            2 if lead & 0xE0 == 0xC0 else 1)
        points.append(chars[i:i + step])
        i += step
    return tuple(points)


def _trim(parser: Any, args: Any, name: str) -> Any:
    if not isinstance(args, Mapping):
        raise MongoError(50696, f"{name} only supports an object as an argument, found "
                         f"{type_name(args)}")
    for key in args:
        if key not in ("input", "chars"):
            raise MongoError(50694, f"{name} found an unknown argument: {key}")
    if "input" not in args:
        raise MongoError(50695, f"{name} requires an 'input' field")
    value = operand(parser, args["input"])
    if nullish(value):
        return None
    if not isinstance(value, str) or isinstance(value, Code):
        raise MongoError(50699, f"{name} requires its input to be a string, got "
                         f"{_shown(value)} (of type {missing_type_name(value)}) instead.")
    points = _WHITESPACE
    if "chars" in args:
        chars = operand(parser, args["chars"])
        if nullish(chars):
            return None
        if not isinstance(chars, str) or isinstance(chars, Code):
            raise MongoError(50700, f"{name} requires 'chars' to be a string, got "
                             f"{_shown(chars)} (of type {missing_type_name(chars)}) instead.")
        points = _trim_characters(bson_bytes.utf8(chars))
    data = bson_bytes.utf8(value)
    begin, end = 0, len(data)
    if name in ("$trim", "$ltrim"):
        while begin < end:
            found = next((p for p in points if data.startswith(p, begin)), None)
            if found is None:
                break
            begin += len(found)
    if name in ("$trim", "$rtrim"):
        while begin < end:
            found = next((p for p in points if len(p) <= end - begin and
                          data.startswith(p, end - len(p))), None)
            if found is None:
                break
            end -= len(found)
    return _string(data[begin:end])


# -- $split, $replaceOne, $replaceAll ------------------------------------------------------------


def _split(parser: Any, args: Any) -> Any:
    string, separator = fixed_arguments(parser, args, "$split", 2)
    if nullish(string) or nullish(separator):
        return None
    if not isinstance(string, str) or isinstance(string, Code):
        raise MongoError(40085, "$split requires an expression that evaluates to a string as a "
                         f"first argument, found: {type_name(string)}")
    if not isinstance(separator, str) or isinstance(separator, Code):
        raise MongoError(40086, "$split requires an expression that evaluates to a string as a "
                         f"second argument, found: {type_name(separator)}")
    if not separator:
        raise MongoError(40087, "$split requires a non-empty separator")
    return [_string(part) for part in bson_bytes.utf8(string).split(bson_bytes.utf8(separator))]


def _replace(parser: Any, args: Any, name: str) -> Any:
    if not isinstance(args, Mapping):
        raise MongoError(51751, f"{name} requires an object as an argument, found: "
                         f"{type_name(args)}")
    for key in args:
        if key not in ("input", "find", "replacement"):
            raise MongoError(51750, f"{name} found an unknown argument: {key}")
    for key, code in (("input", 51749), ("find", 51748), ("replacement", 51747)):
        if key not in args:
            raise MongoError(code, f"{name} requires '{key}' to be specified")
    values = {key: operand(parser, args[key]) for key in ("input", "find", "replacement")}
    for key, code in (("input", 51746), ("find", 51745), ("replacement", 51744)):
        value = values[key]
        if not nullish(value) and (not isinstance(value, str) or isinstance(value, Code)):
            raise MongoError(code, f"{name} requires that '{key}' be a string, found: "
                             f"{_shown(value)}")
    if any(nullish(value) for value in values.values()):
        return None
    data, find, replacement = (bson_bytes.utf8(values[k]) for k in (
        "input", "find", "replacement"))
    if name == "$replaceOne":
        return _string(data.replace(find, replacement, 1))
    if not find:  # the empty string matches before every byte and at the end
        return _string(replacement + b"".join(data[i:i + 1] + replacement
                                              for i in range(len(data))))
    return _string(data.replace(find, replacement))


# -- $regexFind, $regexFindAll -------------------------------------------------------------------

_COMPILED: dict[tuple[str, str], Any] = {}


def _compile(pattern: str, options: str, name: str) -> Any:
    """A compiled pattern with `search(text, pos)` returning match objects: RE2 when it means
    what PCRE means (regex.py's translation), else Python's `re`."""
    key = (pattern, options)
    found = _COMPILED.get(key)
    if found is not None:
        return found
    for flag in options:
        if flag not in "imsux":  # pcre_util::flagsToOptions
            raise MongoError(51108, f"{name} invalid flag in regex options: {flag}")
    if not bson_bytes.is_utf8(pattern):
        raise NotImplementedError(f"{name} of a pattern that is not UTF-8")
    compiled: Any = None
    translated = pcre.to_re2(pattern, "m" in options, "x" in options) if _re2 else None
    # regex.py spells PCRE's `$` / `\Z` (end, or before a final newline) for RE2 as a newline
    # consumed at the end: right for a yes/no match, not for the text matched.
    if translated is not None and "(?:\\n?\\z)" not in translated:
        prefix = "".join(f for f in "is" if f in options) + ("m" if "m" in options else "")
        settings = _re2.Options()
        settings.log_errors = False
        try:
            compiled = _re2.compile(f"(?{prefix}){translated}" if prefix else translated,
                                    settings)
        except Exception:  # noqa: BLE001 - a feature RE2 lacks: Python's `re` below
            compiled = None
    if compiled is None:
        flags = 0
        for flag, bit in (("i", re.I), ("m", re.M), ("s", re.S), ("x", re.X)):
            if flag in options:
                flags |= bit
        try:
            compiled = re.compile(_python_end_anchors(pcre.python_pattern(pattern)), flags)
        except (re.error, OverflowError, RecursionError, ValueError) as exc:
            raise MongoError(51111, f"Invalid Regex in {name}: {exc}") from None
    if len(_COMPILED) >= 512:
        _COMPILED.clear()
    _COMPILED[key] = compiled
    return compiled


def _python_end_anchors(pattern: str) -> str:
    r"""PCRE's `\Z` (the end, or before a final newline) in Python's spelling (Python's `\Z` is
    PCRE's `\z`; `$` already means the same in both)."""
    out = []
    i = 0
    while i < len(pattern):
        pair = pattern[i:i + 2]
        if pattern[i] == "\\" and len(pair) == 2:
            out.append(r"(?=\n?\Z)" if pair == r"\Z" else r"\Z" if pair == r"\z" else pair)
            i += 2
            continue
        out.append(pattern[i])
        i += 1
    return "".join(out)


def _regex_state(parser: Any, args: Any, name: str) -> tuple[Any, str] | None:
    """The compiled regex and the input of a $regexFind / $regexFindAll (buildInitialState),
    None when either is nullish."""
    if not isinstance(args, Mapping):
        raise MongoError(51103, f"{name} expects an object of named arguments but found: "
                         f"{type_name(args)}")
    for key in args:
        if key not in ("input", "regex", "options"):
            raise MongoError(31024, f"{name} found an unknown argument: {key}")
    if "input" not in args:
        raise MongoError(31022, f"{name} requires 'input' parameter")
    if "regex" not in args:
        raise MongoError(31023, f"{name} requires 'regex' parameter")
    text = operand(parser, args["input"])
    regex = operand(parser, args["regex"])
    options = operand(parser, args["options"]) if "options" in args else None
    is_regex = isinstance(regex, (Regex, re.Pattern))
    if not (nullish(regex) or is_regex or (isinstance(regex, str) and
                                            not isinstance(regex, Code))):
        raise MongoError(51105, f"{name} needs 'regex' to be of type string or regex")
    if not (nullish(options) or isinstance(options, str) and not isinstance(options, Code)):
        raise MongoError(51106, f"{name} needs 'options' to be of type string")
    pattern: str | None = None
    flags: str | None = None
    if is_regex:
        own = pcre.options_of(regex)
        pattern = regex.pattern if isinstance(regex.pattern, str) else bson_bytes.from_utf8(
            regex.pattern)
        if own and not nullish(options):
            raise MongoError(51107, f"{name}: found regex option(s) specified in both 'regex' "
                             "and 'option' fields")
        flags = own or None
    elif isinstance(regex, str):
        pattern = regex
    if not nullish(options):
        flags = options
    if pattern is not None and "\0" in pattern:
        raise MongoError(51109, f"{name}: regular expression cannot contain an embedded null "
                         "byte")
    if flags is not None and "\0" in flags:
        raise MongoError(51110, f"{name}: regular expression options cannot contain an "
                         "embedded null byte")
    compiled = _compile(pattern, flags or "", name) if pattern is not None else None
    if not (nullish(text) or isinstance(text, str) and not isinstance(text, Code)):
        raise MongoError(51104, f"{name} needs 'input' to be of type string")
    if compiled is None or nullish(text):
        return None
    if not bson_bytes.is_utf8(text):  # PCRE's UTF check fails the match: 51156
        raise NotImplementedError(f"{name} of a string that is not UTF-8")
    return compiled, text


def _match_document(match: Any) -> dict[str, Any]:
    return {"match": match.group(0), "idx": match.start(), "captures": list(match.groups())}


def _regex_find(parser: Any, args: Any) -> Any:
    state = _regex_state(parser, args, "$regexFind")
    if state is None:
        return None
    compiled, text = state
    match = compiled.search(text, 0)
    return None if match is None else _match_document(match)


def _regex_find_all(parser: Any, args: Any) -> Any:
    state = _regex_state(parser, args, "$regexFindAll")
    if state is None:
        return []
    compiled, text = state
    found = []
    position = 0
    while True:  # at least once: an empty input can match
        match = compiled.search(text, position)
        if match is None:
            break
        found.append(_match_document(match))
        if match.end() == match.start():  # the next search starts a code point further on
            if match.start() >= len(text):
                break
            position = match.start() + 1
        else:
            position = match.end()
        if position >= len(text):
            break
    return found


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$concat": _concat,
    "$strcasecmp": _strcasecmp,
    "$toUpper": lambda parser, args: _case(parser, args, "$toUpper"),
    "$toLower": lambda parser, args: _case(parser, args, "$toLower"),
    "$strLenBytes": lambda parser, args: _str_len(parser, args, "$strLenBytes"),
    "$strLenCP": lambda parser, args: _str_len(parser, args, "$strLenCP"),
    "$substrBytes": _substr_bytes,
    "$substr": _substr_bytes,
    "$substrCP": _substr_cp,
    "$trim": lambda parser, args: _trim(parser, args, "$trim"),
    "$ltrim": lambda parser, args: _trim(parser, args, "$ltrim"),
    "$rtrim": lambda parser, args: _trim(parser, args, "$rtrim"),
    "$split": _split,
    "$replaceOne": lambda parser, args: _replace(parser, args, "$replaceOne"),
    "$replaceAll": lambda parser, args: _replace(parser, args, "$replaceAll"),
    "$regexFind": _regex_find,
    "$regexFindAll": _regex_find_all,
}
