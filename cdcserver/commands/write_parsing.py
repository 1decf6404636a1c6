"""insert / update / delete / findAndModify requests parsed whole before anything runs.

mongod parses a write command through its IDL (`write_ops.idl`) before it executes a single
statement: a wrong-typed, unknown or missing field anywhere (in the top level or inside any
statement) fails the whole command with ok:0, and nothing is written. Only what the IDL leaves
to execution (the filter's operators, the update's modifiers, a pipeline's stages, duplicate
keys, validation) is a per-statement write error. Fields are checked in document order, as the
generated parser walks them, so the first bad one is the one reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128

from cdcserver.commands.arguments import (
    is_number,
    is_string,
    missing,
    safe_long,
    unknown_field,
    wrong_type,
)
from pipeline_stages.errors import MongoError

MAX_WRITE_BATCH = 100_000  # write_ops::kMaxWriteBatchSize
INT32_MAX = 2**31 - 1
# IDL `safeBool`: a boolean or any number.
SAFE_BOOL_TYPES = "[bool, long, int, decimal, double]"

# Generic arguments every command accepts (generic_argument.idl); the IDL parser leaves them to
# the command's invocation, so a strict command does not refuse them.
GENERIC_ARGUMENTS = frozenset({
    "apiVersion", "apiStrict", "apiDeprecationErrors", "$db", "maxTimeMS", "readConcern",
    "writeConcern", "lsid", "clientOperationKey", "txnNumber", "autocommit", "startTransaction",
    "stmtId", "comment", "$readPreference", "$clusterTime", "$audit", "$client",
    "$configServerState", "allowImplicitCollectionCreation", "$oplogQueryData", "$queryOptions",
    "$replData", "databaseVersion", "shardVersion", "tracking_info", "coordinator",
    "maxTimeMSOpOnly", "$configTime", "$topologyTime", "txnRetryCounter",
    "mayBypassWriteBlocking", "$tenant", "expectPrefix", "rawData", "$traceCtx",
})
# WriteCommandRequestBase, chained into insert, update and delete.
_BASE_FIELDS = frozenset({
    "bypassDocumentValidation", "ordered", "stmtId", "stmtIds", "isTimeseriesNamespace",
    "collectionUUID", "encryptionInformation", "bypassEmptyTsReplacement", "$_originalQuery",
    "$_originalCollation",
})
_STATEMENTS = {"insert": "documents", "update": "updates", "delete": "deletes"}


@dataclass
class WriteRequest:
    """What the handlers need of a parsed insert / update / delete."""

    statements: list[Any]  # documents, or update / delete statements (nulls dropped, as mongod)
    ordered: bool
    bypass_validation: bool


def _absent(value: Any) -> bool:
    # checkAndAssertType skips null (and undefined, which pymongo decodes as None)
    return value is None


def _check_bool(value: Any, path: str) -> None:
    if not _absent(value) and not isinstance(value, bool):
        raise wrong_type(path, value, "bool")


def _check_safe_bool(value: Any, path: str) -> bool:
    """IDL `safeBool`: a bool or a number, read as BSONElement::trueValue."""
    if _absent(value):
        return False
    if not isinstance(value, bool) and not is_number(value):
        raise wrong_type(path, value, SAFE_BOOL_TYPES)
    if isinstance(value, Decimal128):
        dec = value.to_decimal()
        return dec.is_nan() or dec != 0
    return bool(value)


def _check_object(value: Any, path: str) -> None:
    if not _absent(value) and not isinstance(value, Mapping):
        raise wrong_type(path, value, "object")


def _check_int(value: Any, path: str) -> None:
    if not _absent(value) and (isinstance(value, bool) or not isinstance(value, int)
                               or not -(2**31) <= value <= INT32_MAX):
        raise wrong_type(path, value, "int")


def _check_uuid(value: Any, path: str) -> None:
    if _absent(value):
        return
    if not isinstance(value, (Binary, bytes)):
        raise wrong_type(path, value, "binData")
    subtype = value.subtype if isinstance(value, Binary) else 0  # bson decodes subtype 0 as bytes
    if subtype != 4:
        raise MongoError(14, f"BSON field '{path}' is the wrong binData type "
                         f"'{_bindata_name(subtype)}', expected type 'UUID'")


def _bindata_name(subtype: int) -> str:
    return {0: "general", 1: "function", 2: "binary", 3: "uuid_old", 5: "MD5", 6: "encrypt",
            7: "Column", 8: "Sensitive", 9: "Vector"}.get(subtype, "udt")


def _array_of(value: Any, path: str, of: str) -> list[Any]:
    """An IDL `array<T>`: the elements that are not null, each checked for type `of`."""
    if _absent(value):
        return []
    if not isinstance(value, list):
        raise wrong_type(path, value, "array")
    out = []
    for i, item in enumerate(value):
        if _absent(item):
            continue  # the generated parser skips null elements
        if of == "object" and not isinstance(item, Mapping):
            raise wrong_type(f"{path}.{i}", item, "object")
        if of == "int":
            _check_int(item, f"{path}.{i}")
        out.append(item)
    return out


def check_hint(value: Any) -> None:
    """IDL `indexHint` (an `any` type: null reaches the deserializer too)."""
    if not is_string(value) and not isinstance(value, Mapping):
        raise MongoError(9, "Hint must be a string or an object")


def check_update_modification(value: Any) -> None:
    """UpdateModification::parseFromBSON: an object (replacement or modifiers) or a pipeline."""
    if isinstance(value, Mapping):
        return
    if not isinstance(value, list):
        raise MongoError(9, "Update argument must be either an object or an array")
    for stage in value:
        if not isinstance(stage, Mapping):
            raise MongoError(14, "Each element of the 'pipeline' array must be an object")


def _number_double(value: Any) -> float:
    """BSONElement::numberDouble: a number's value, 0 for any other type."""
    if isinstance(value, bool) or not is_number(value):
        return 0.0
    if isinstance(value, Decimal128):
        return float(value.to_decimal())
    return float(value)


def delete_limit(value: Any) -> bool:
    """readMultiDeleteProperty: True (multi) for 0, False for 1; anything not a number counts as
    0, as BSONElement::numberDouble reads it."""
    limit = _number_double(value)
    if limit not in (0.0, 1.0):
        raise MongoError(9, f"The limit field in delete objects must be 0 or 1. Got {limit:g}")
    return limit == 0.0


_UPDATE_FIELDS = {
    "q", "u", "c", "sort", "arrayFilters", "hint", "multi", "upsert", "upsertSupplied",
    "collation", "sampleId", "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery",
}
_DELETE_FIELDS = {"q", "limit", "hint", "collation", "sampleId"}


def _parse_update_statement(spec: Mapping[str, Any], ctx: str) -> None:
    seen: set[str] = set()
    for key, value in spec.items():
        path = f"{ctx}.{key}"
        if key == "q":
            _check_object(value, path)
        elif key == "u":
            check_update_modification(value)
        elif key in ("c", "sort", "collation"):
            _check_object(value, path)
        elif key == "arrayFilters":
            _array_of(value, path, "object")
        elif key == "hint":
            check_hint(value)
        elif key in ("multi", "upsert", "upsertSupplied",
                     "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery"):
            _check_bool(value, path)
        elif key == "sampleId":
            _check_uuid(value, path)
        else:
            raise unknown_field(path)
        if not _absent(value) or key in ("u", "hint"):
            seen.add(key)  # a null in a typed field leaves it unset
    for required in ("q", "u"):
        if required not in seen:
            raise missing(f"{ctx}.{required}")


def _parse_delete_statement(spec: Mapping[str, Any], ctx: str) -> None:
    seen: set[str] = set()
    for key, value in spec.items():
        path = f"{ctx}.{key}"
        if key == "q":
            _check_object(value, path)
        elif key == "limit":
            delete_limit(value)
        elif key == "hint":
            check_hint(value)
        elif key == "collation":
            _check_object(value, path)
        elif key == "sampleId":
            _check_uuid(value, path)
        else:
            raise unknown_field(path)
        if not _absent(value) or key in ("limit", "hint"):
            seen.add(key)
    for required in ("q", "limit"):
        if required not in seen:
            raise missing(f"{ctx}.{required}")


def check_max_time_ms(cmd: Mapping[str, Any]) -> None:
    """The generic `maxTimeMS`, as the service entry point's parseMaxTimeMS reads it."""
    if "maxTimeMS" not in cmd:
        return
    value = cmd["maxTimeMS"]
    if isinstance(value, bool) or not is_number(value):
        raise MongoError(2, "maxTimeMS must be a number")
    as_long = safe_long(value)
    if as_long < 0 or as_long > INT32_MAX:
        raise MongoError(2, f"{as_long} value for maxTimeMS is out of range")
    if isinstance(value, float) and (math.isnan(value) or math.floor(value) != value):
        raise MongoError(2, "maxTimeMS has non-integral value")


def parse_write_command(cmd: Mapping[str, Any], name: str) -> WriteRequest:
    """insert / update / delete parsed as mongod's IDL parses it (the collection name is checked
    by the caller); raises the first error in document order."""
    field = _STATEMENTS[name]
    statements: list[Any] | None = None
    ordered, bypass = True, False
    for i, (key, value) in enumerate(cmd.items()):
        if i == 0:
            continue  # the command name: the collection
        path = f"{name}.{key}"
        if key == field:
            if _absent(value):
                continue  # left unset: "missing" below
            statements = _array_of(value, path, "object")
            for spec in statements:
                if name == "update":
                    _parse_update_statement(spec, path)
                elif name == "delete":
                    _parse_delete_statement(spec, path)
        elif key == "ordered":
            _check_bool(value, path)
            ordered = value is not False
        elif key == "bypassDocumentValidation":
            bypass = _check_safe_bool(value, path)
        elif key == "stmtId":
            _check_int(value, path)
        elif key == "stmtIds":
            _array_of(value, path, "int")
        elif key in ("isTimeseriesNamespace", "bypassEmptyTsReplacement"):
            _check_bool(value, path)
        elif key == "collectionUUID":
            _check_uuid(value, path)
        elif key in ("encryptionInformation", "$_originalQuery", "$_originalCollation"):
            _check_object(value, path)
        elif key in ("let", "runtimeConstants") and name != "insert":
            _check_object(value, path)
        elif key in GENERIC_ARGUMENTS:
            continue
        else:
            raise unknown_field(path)
    if statements is None:
        raise missing(f"{name}.{field}")
    if not statements or len(statements) > MAX_WRITE_BATCH:
        raise MongoError(16, f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. "
                         f"Got {len(statements)} operations.")
    check_max_time_ms(cmd)
    return WriteRequest(statements, ordered, bypass)


def true_value(value: Any) -> bool:
    """BSONElement::trueValue of an IDL `safeBool` field already parsed (absent/null: False)."""
    if _absent(value):
        return False
    if isinstance(value, Decimal128):
        dec = value.to_decimal()
        return dec.is_nan() or dec != 0
    return bool(value)


def parse_find_and_modify(cmd: Mapping[str, Any]) -> None:
    """findAndModify parsed as its IDL (`FindAndModifyCommandRequest`) parses it, before the
    command checks how its options combine."""
    ctx = "findAndModify"  # the parser's context, also for the `findandmodify` alias
    for i, (key, value) in enumerate(cmd.items()):
        if i == 0:
            continue
        path = f"{ctx}.{key}"
        if key in ("query", "fields", "sort", "collation", "let", "runtimeConstants",
                   "encryptionInformation", "$_originalQuery", "$_originalCollation"):
            _check_object(value, path)
        elif key in ("batchSize", "stmtId"):
            _check_int(value, path)
        elif key in ("singleBatch", "bypassEmptyTsReplacement",
                     "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery",
                     "isTimeseriesNamespace"):
            _check_bool(value, path)
        elif key == "hint":
            check_hint(value)
        elif key == "arrayFilters":
            _array_of(value, path, "object")
        elif key in ("remove", "upsert", "new", "bypassDocumentValidation"):
            _check_safe_bool(value, path)
        elif key == "update":
            check_update_modification(value)
        elif key == "sampleId":
            _check_uuid(value, path)
        elif key in GENERIC_ARGUMENTS:
            continue
        else:
            raise unknown_field(path)
    check_max_time_ms(cmd)
