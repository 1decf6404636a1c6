"""Values printed the way mongod's `Value`/`Document` stream them into error messages.

Several errors quote a document (e.g. 40647 quotes the whole token, 280 the `_id` of the
event that passed the resume point), so the message text depends on this formatting.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Mapping

from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes


def _double(x: float) -> str:
    # C++ ostream default: 6 significant digits, like printf("%g").
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return f"{x:g}"


def value_string(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, Int64):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _double(v)
    if isinstance(v, Mapping):
        return document_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value_string(x) for x in v) + "]"
    if isinstance(v, ObjectId):
        return f"ObjectId('{v}')"
    if isinstance(v, Timestamp):
        return f"Timestamp({v.time}, {v.inc})"
    if isinstance(v, uuid.UUID):
        return f"BinData(4, {v.hex.upper()})"
    if isinstance(v, Binary):
        return f"BinData({v.subtype}, {bytes(v).hex().upper()})"
    if isinstance(v, bytes):
        return f"BinData(0, {v.hex().upper()})"
    if isinstance(v, Decimal128):
        return str(v)
    if isinstance(v, (datetime.datetime, DatetimeMS)):
        ms = v if isinstance(v, DatetimeMS) else DatetimeMS(v)
        return f"Date({int(ms)})"
    if isinstance(v, Regex):
        return f"/{v.pattern}/{_regex_flags(v.flags)}"
    if isinstance(v, Code):
        return str(v)
    if isinstance(v, MinKey):
        return "MinKey"
    if isinstance(v, MaxKey):
        return "MaxKey"
    return str(v)


def _regex_flags(flags: int | str) -> str:
    if isinstance(flags, str):
        return flags
    return "".join(c for c, bit in zip("ilmsux", (2, 4, 8, 16, 32, 64)) if flags & bit)


def document_string(doc: Mapping[str, object]) -> str:
    if not doc:
        return "{}"
    return "{" + ", ".join(f"{k}: {value_string(v)}" for k, v in doc.items()) + "}"


def raw_document_string(raw: bytes) -> str:
    return document_string(bson_bytes.decode(raw))


def type_name(value: object) -> str:
    """mongod's `typeName()` of a decoded value, as TypeMismatch messages print it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Code):  # before str: pymongo's Code is a str subclass
        return "javascript" if value.scope is None else "javascriptWithScope"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, (Binary, bytes, uuid.UUID)):
        return "binData"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return "date"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, Decimal128):
        return "decimal"
    if isinstance(value, (Regex, re.Pattern)):
        return "regex"
    if isinstance(value, DBRef):
        return "object"  # a DBRef is stored as an ordinary document
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    return type(value).__name__


def nice_double(x: float) -> str:
    """StringBuilder::appendDoubleNice: "%.16g", then ".0" unless it has '.', 'E' or 'N'."""
    s = format(x, ".16g")
    if "." not in s and "E" not in s and "N" not in s:
        s += ".0"
    return s


def _cut(data: bytes, limit: int, keep: int) -> tuple[bytes, bool]:
    return (data[:keep], True) if len(data) > limit else (data, False)


def bson_obj_string(value: object) -> str:
    """BSONElement::toString(full=false) of a value, and so BSONObj::toString() of a document,
    as mongod streams them into messages (duplicate keys, "not authorized ... command { ... }",
    update and $match errors): `{ a: 1, b: "x" }`, spaced, unlike the `Document` stream above.
    Written as mongod writes it: nothing escaped; a string over 159 bytes cut to 150 and `..."`,
    JavaScript over 79 to 70 and `...`, BinData over 80 bytes to 70 and `...` (a character cut
    in two stays cut: its first bytes, which are not UTF-8, as mongod sends them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Code):  # before str: Code is a str subclass
        if value.scope is not None:
            return f"CodeWScope( {value}, {bson_obj_string(value.scope)})"
        code, cut = _cut(bson_bytes.utf8(str(value)), 79, 70)
        return bson_bytes.from_utf8(code) + ("..." if cut else "")
    if isinstance(value, str):
        data, cut = _cut(bson_bytes.utf8(value), 159, 150)
        return '"' + bson_bytes.from_utf8(data) + ('..."' if cut else '"')
    if isinstance(value, int):  # int and Int64
        return str(int(value))
    if isinstance(value, float):
        return nice_double(value)
    if isinstance(value, DBRef):
        value = value.as_doc()
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {bson_obj_string(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[ " + ", ".join(bson_obj_string(v) for v in value) + " ]"
    if isinstance(value, uuid.UUID):
        return f'UUID("{value}")'
    if isinstance(value, (bytes, Binary)):
        subtype = value.subtype if isinstance(value, Binary) else 0
        raw = bytes(value)
        if subtype == 4 and len(raw) == 16:
            return f'UUID("{uuid.UUID(bytes=raw)}")'
        data, cut = _cut(raw, 80, 70)
        return f"BinData({subtype}, {data.hex().upper()}{'...' if cut else ''})"
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        ms = value if isinstance(value, DatetimeMS) else DatetimeMS(value)
        return f"new Date({int(ms)})"
    if isinstance(value, Regex):
        return f"/{value.pattern}/{_regex_flags(value.flags)}"
    if isinstance(value, MinKey):
        return "MinKey"
    if isinstance(value, MaxKey):
        return "MaxKey"
    return str(value)
