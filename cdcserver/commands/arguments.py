"""Command arguments checked as mongod's IDL parser checks them, with its error messages.

mongod parses every command through generated IDL code (`src/mongo/idl/idl_parser.cpp`): a
field of the wrong BSON type fails with 14 TypeMismatch "BSON field '<ctx>.<field>' is the
wrong type '<actual>', expected type '<expected>'", a missing required field with 40414, an
unknown field of a strict struct with 40415. Handlers use these helpers instead of converting
client values with `int()`/`dict()` (which raise Python errors the client would see as 1
InternalError).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
# IDL `safeInt64` / `safeInt` / `exactInt64` accept any numeric BSON type.
NUMERIC_TYPES = "[long, int, decimal, double]"
UUID_SUBTYPE = 4

__all__ = [
    "LONG_MAX",
    "LONG_MIN",
    "array_arg",
    "bool_arg",
    "check_read_concern",
    "check_session_arguments",
    "cursor_batch_size",
    "is_number",
    "is_string",
    "long_arg",
    "missing",
    "object_arg",
    "safe_int_arg",
    "safe_long",
    "type_name",
    "unknown_field",
    "wrong_type",
]


def wrong_type(path: str, value: Any, expected: str) -> MongoError:
    """14 TypeMismatch for `path` (e.g. "find.limit"); `expected` is one IDL type name, or a
    bracketed list like NUMERIC_TYPES."""
    if expected.startswith("["):
        # idl_parser.cpp's throwBadType closes the quote inside the bracket: '[int, long']
        return MongoError(
            14, f"BSON field '{path}' is the wrong type '{type_name(value)}', expected types "
            f"'{expected[:-1]}']",
        )
    return MongoError(
        14, f"BSON field '{path}' is the wrong type '{type_name(value)}', expected type "
        f"'{expected}'",
    )


def missing(path: str) -> MongoError:
    return MongoError(40414, f"BSON field '{path}' is missing but a required field")


def unknown_field(path: str) -> MongoError:
    return MongoError(40415, f"BSON field '{path}' is an unknown field.")


def is_string(value: Any) -> bool:
    """A BSON string (pymongo decodes JavaScript code as `Code`, a `str` subclass)."""
    return isinstance(value, str) and not isinstance(value, Code)


def is_number(value: Any) -> bool:
    """int, long, double or decimal (never bool, which Python counts as an int)."""
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)


def safe_long(value: Any) -> int:
    """BSONElement::safeNumberLong of a numeric value: doubles truncated, NaN as 0, values
    beyond the long range clamped to it."""
    if isinstance(value, Decimal128):
        dec = value.to_decimal()
        if dec.is_nan():
            return 0
        if dec.is_infinite():
            return LONG_MAX if dec > 0 else LONG_MIN
        return max(LONG_MIN, min(LONG_MAX, int(dec)))
    if isinstance(value, float):
        if math.isnan(value):
            return 0
        if math.isinf(value):
            return LONG_MAX if value > 0 else LONG_MIN
        return max(LONG_MIN, min(LONG_MAX, int(value)))
    return int(value)


def safe_int_arg(doc: Mapping[str, Any], name: str, where: str, default: Any = None) -> Any:
    """An IDL `safeInt64` field of `doc` (absent or null: `default`), or mongod's 14."""
    value = doc.get(name)
    if value is None:
        return default
    if not is_number(value):
        raise wrong_type(f"{where}.{name}", value, NUMERIC_TYPES)
    return safe_long(value)


def long_arg(doc: Mapping[str, Any], name: str, where: str, default: Any = None) -> Any:
    """An IDL `long` field: exactly a BSON long (an int32 or a double is the wrong type)."""
    value = doc.get(name)
    if value is None:  # the IDL parser skips null like an absent field
        return default
    if not isinstance(value, Int64):
        raise wrong_type(f"{where}.{name}", value, "long")
    return int(value)


def bool_arg(doc: Mapping[str, Any], name: str, where: str, default: Any = None) -> Any:
    """An IDL `bool` field: exactly a BSON boolean."""
    value = doc.get(name)
    if value is None:  # the IDL parser skips null like an absent field
        return default
    if not isinstance(value, bool):
        raise wrong_type(f"{where}.{name}", value, "bool")
    return value


def object_arg(doc: Mapping[str, Any], name: str, where: str, default: Any = None) -> Any:
    """An IDL `object` field (absent: `default`)."""
    value = doc.get(name)
    if value is None:  # the IDL parser skips null like an absent field
        return default
    if not isinstance(value, Mapping):
        raise wrong_type(f"{where}.{name}", value, "object")
    return value


def array_arg(
    doc: Mapping[str, Any], name: str, where: str, default: Any = None, *, of: str | None = None
) -> Any:
    """An IDL `array` field (absent: `default`); with `of="object"` each element must be a
    document ("BSON field 'update.updates.arrayFilters.0' is the wrong type ...")."""
    value = doc.get(name)
    if value is None:  # the IDL parser skips null like an absent field
        return default
    if not isinstance(value, list):
        raise wrong_type(f"{where}.{name}", value, "array")
    if of == "object":
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise wrong_type(f"{where}.{name}.{i}", item, "object")
    return value


# OperationSessionInfoFromClientBase (logical_session_id.idl): parsed from every command's
# generic arguments before the command runs, under the context name "OperationSessionInfo".
_SESSION_CTX = "OperationSessionInfo"
_LSID_FIELDS = ("id", "uid", "txnNumber", "txnUUID")


def _check_uuid(doc: Mapping[str, Any], name: str, where: str) -> None:
    value = doc[name]
    if not isinstance(value, (Binary, bytes)):
        raise wrong_type(f"{where}.{name}", value, "binData")
    subtype = value.subtype if isinstance(value, Binary) else 0
    if subtype != UUID_SUBTYPE:
        raise MongoError(
            14, f"BSON field '{where}.{name}' is the wrong binData type '{_bindata_name(subtype)}'"
            ", expected type 'UUID'",
        )
    if len(value) != 16:
        raise MongoError(207, "uuid must be a 16-byte binary field with UUID (4) subtype")


def _bindata_name(subtype: int) -> str:
    return {0: "general", 1: "function", 2: "binary", 3: "uuid_old", 4: "UUID", 5: "MD5",
            6: "encrypt", 7: "Column", 8: "Sensitive", 9: "Vector"}.get(subtype, "udt")


def check_session_arguments(cmd: Mapping[str, Any]) -> None:
    """`lsid`, `txnNumber`, `autocommit`, `startTransaction` of any command, typed as mongod
    parses them (a driver never sends anything else, so only hand-built commands get these)."""
    where = _SESSION_CTX
    lsid = object_arg(cmd, "lsid", where)
    if lsid is not None:
        ctx = f"{where}.lsid"
        for key in lsid:
            if key not in _LSID_FIELDS:
                raise unknown_field(f"{ctx}.{key}")
        if "id" not in lsid:
            raise missing(f"{ctx}.id")
        _check_uuid(lsid, "id", ctx)
        if "uid" in lsid:
            uid = lsid["uid"]
            if not isinstance(uid, (Binary, bytes)):
                raise wrong_type(f"{ctx}.uid", uid, "binData")
        long_arg(lsid, "txnNumber", ctx)
        if "txnUUID" in lsid:
            _check_uuid(lsid, "txnUUID", ctx)
    long_arg(cmd, "txnNumber", where)
    bool_arg(cmd, "autocommit", where)
    bool_arg(cmd, "startTransaction", where)


READ_CONCERN_LEVELS = ("local", "majority", "linearizable", "available", "snapshot")


def check_read_concern(cmd: Mapping[str, Any]) -> None:
    """The `readConcern` of any command, parsed as mongod 8.0 parses it (read_concern_args.cpp
    `initialize`, then its IDL `ReadConcernIdl`): 9 FailedToParse when it is not a document,
    14 for a level that is not a string, 2 BadValue for a level that is not one of mongod's."""
    if "readConcern" not in cmd:
        return
    rc = cmd["readConcern"]
    if not isinstance(rc, Mapping):
        raise MongoError(9, "readConcern field should be an object")
    level = rc.get("level")
    if level is None:
        return
    if not is_string(level):
        raise wrong_type("readConcern.level", level, "string")
    if level not in READ_CONCERN_LEVELS:
        raise MongoError(2, f"Enumeration value '{level}' for field 'readConcern.level' is not "
                         "a valid value.")


def cursor_batch_size(cmd: Mapping[str, Any], where: str) -> int | None:
    """`cursor.batchSize` of a command taking IDL `SimpleCursorOptions` (aggregate,
    listCollections, listIndexes): the `cursor` document and its safeInt64 batchSize (>= 0)."""
    cursor = object_arg(cmd, "cursor", where)
    if cursor is None:
        return None
    batch_size: int | None = safe_int_arg(cursor, "batchSize", f"{where}.cursor")
    if batch_size is not None and batch_size < 0:
        raise MongoError(
            51024, f"BSON field 'batchSize' value must be >= 0, actual value '{batch_size}'"
        )
    return batch_size
