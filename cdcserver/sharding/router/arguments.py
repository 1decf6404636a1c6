"""The argument checks the router's sharding commands share, as mongos's IDL parsers and
command bodies make them (codes and messages as mongod's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.sharding.catalog import ShardingCatalog
from pipeline_stages.errors import MongoError

ShardNotFound = 70  # error code


def admin_only(name: str, db: str) -> None:
    if db != "admin":
        raise MongoError(13, f"{name} may only be run against the admin database.")


def namespace_arg(cmd: Mapping[str, Any], name: str) -> tuple[str, str, str]:
    ns = cmd.get(name)
    if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db, coll = ns.split(".", 1)
    return ns, db, coll


def check_object(command: str, field: str, value: Any) -> None:
    """An IDL `object` field: 14 TypeMismatch for anything else."""
    if not isinstance(value, Mapping):
        raise MongoError(14, f"BSON field '{command}.{field}' is the wrong type "
                         f"'{type_name(value)}', expected type 'object'")


def type_name(value: Any) -> str:
    return {str: "string", int: "int", float: "double", bool: "bool", dict: "object",
            list: "array"}.get(type(value), type(value).__name__)


def check_sharded(catalog: ShardingCatalog, ns: str) -> None:
    """118 NamespaceNotSharded unless `ns` is sharded (a tracked unsharded collection is
    not: its one chunk moves with moveCollection)."""
    if not catalog.is_sharded(ns) or catalog.is_unsplittable(ns):
        raise MongoError(118, f"ns {ns} is not sharded")
