"""What the CRUD commands (writes.py, queries.py) share: the arguments they check alike
(collection name, maxTimeMS, find's filter / projection / skip / limit / batchSize, sort), the
query engine's errors raised as mongod's, and projection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, overload

from cdcserver.commands import write_parsing
from cdcserver.commands.arguments import is_number, is_string, safe_long
from cdcserver.commands.base import int_arg
from cdcserver.embedded import engine
from cdcserver.embedded.store import Store
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name


def coll_arg(cmd: Mapping[str, Any], name: str) -> str:
    value = cmd.get(name)
    if not is_string(value):
        raise MongoError(
            73 if value is not None else 40414,
            f"collection name has invalid type {type_name(value)}",
        )
    if not value:
        raise MongoError(73, f"Invalid namespace specified '{cmd.get('$db')}.'")
    if "\0" in value:  # NamespaceString's constructor: the whole command fails
        raise MongoError(73, "namespaces cannot have embedded null characters")
    coll: str = value
    return coll


def _int(cmd: Mapping[str, Any], name: str, where: str, default: int = 0) -> int:
    value: int = int_arg(cmd, name, where, default)
    return value


def max_time_ms_arg(cmd: Mapping[str, Any], where: str | None) -> None:
    """`maxTimeMS` as mongod checks it: by the command's IDL first where it declares the field
    (find, aggregate: a number, >= 0), then the generic parseMaxTimeMS (count, distinct and
    every command: a whole number within an int)."""
    value = cmd.get("maxTimeMS")
    if where is not None and value is not None:
        if not is_number(value):
            raise MongoError(
                14, f"BSON field '{where}.maxTimeMS' is the wrong type '{type_name(value)}', "
                "expected types '[long, int, decimal, double']",
            )
        if safe_long(value) < 0:
            raise MongoError(51024, "BSON field 'maxTimeMS' value must be >= 0, actual value "
                             f"'{safe_long(value)}'")
    write_parsing.check_max_time_ms(cmd)


def find_arguments(cmd: Mapping[str, Any]) -> tuple[Any, Any, int, int, int | None]:
    """`find`'s filter, projection, skip, limit and batchSize, checked as mongod checks them."""
    filter_doc = _doc_arg(cmd, "filter", "find")
    projection = _doc_arg(cmd, "projection", "find")
    skip = _int(cmd, "skip", "find")
    limit = _int(cmd, "limit", "find")
    if skip < 0:
        raise MongoError(51024, f"BSON field 'skip' value must be >= 0, actual value '{skip}'")
    if limit < 0:
        raise MongoError(51024, f"BSON field 'limit' value must be >= 0, actual value '{limit}'")
    batch_size = cmd.get("batchSize")
    if batch_size is not None:
        batch_size = _int(cmd, "batchSize", "find")
        if batch_size < 0:
            raise MongoError(51024, "BSON field 'batchSize' value must be >= 0, actual value "
                             f"'{batch_size}'")
    return filter_doc, projection, skip, limit, batch_size


def _doc_arg(cmd: Mapping[str, Any], name: str, where: str) -> dict[str, Any] | None:
    value = cmd.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise MongoError(
            14,
            f"BSON field '{where}.{name}' is the wrong type '{type_name(value)}', expected type "
            "'object'",
        )
    return dict(value)


def _sort_list(sort: Any) -> list[tuple[str, Any]] | None:
    if not sort:
        return None
    if not isinstance(sort, Mapping):
        raise MongoError(14, "Expected field sortto be of type object")
    out = []
    for k, v in sort.items():
        if isinstance(v, Mapping):  # {$meta: ...}
            raise MongoError(2, "$meta sort is not supported by cdcserver's embedded store")
        if v not in (1, -1):
            raise MongoError(15974, "Illegal key in $sort specification: " + f"{k}: {v}")
        out.append((k, int(v)))
    return out


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    try:
        yield
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine.engine_error(exc) from None


@overload
def project(
    store: Store, db: str, coll: str, doc: dict[str, Any], fields: Any
) -> dict[str, Any]: ...


@overload
def project(
    store: Store, db: str, coll: str, doc: dict[str, Any] | None, fields: Any
) -> dict[str, Any] | None: ...


def project(
    store: Store, db: str, coll: str, doc: dict[str, Any] | None, fields: Any
) -> dict[str, Any] | None:
    if doc is None or not fields:
        return doc
    return engine.project(doc, fields)


def check_explain_write_concern(cmd: Mapping[str, Any]) -> None:
    """aggregation_request_helper's refusal of a write concern on an aggregate with
    `explain: true` (the explain command's inner aggregate too), before its pipeline is
    parsed: an explain writes nothing, even with `$out` / `$merge`."""
    if cmd.get("explain") is True and cmd.get("writeConcern") is not None:
        raise MongoError(9, "Aggregation explain does not support the'writeConcern' option")
