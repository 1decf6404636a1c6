"""Cluster parameters: `setClusterParameter` and `getClusterParameter`, as mongod 8.0 answers
them on a replica set (set_cluster_parameter_command.cpp, get_cluster_parameter_command.cpp
and their *_invocation.cpp).

The one cluster parameter cdcserver has is `changeStreamOptions` (change_stream_options.idl):
`{preAndPostImages: {expireAfterSeconds: <positive number> | "off"}}`, how mongod 8.0 expires
change streams' pre-images (the store's pre-image remover applies it: embedded/images.py). As
mongod, a parameter that was set is a document of `config.clusterParameters` (`_id`: its name,
`clusterParameterTime`: the cluster time it was set at, then its fields), written by an upsert
like any other (in the oplog, durable with the store); one never set answers its default with
`clusterParameterTime: Timestamp(0, 0)`.

A shard of the embedded cluster refuses `setClusterParameter` (238, as a `--shardsvr` mongod
does: only mongos sets one) and takes `_shardsvrSetClusterParameter` from the front, which
sends it to every shard with the time the front chose (`sharding/cluster_parameters.py`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.commands.arguments import (
    is_number,
    is_string,
    missing,
    safe_long,
    unknown_field,
    wrong_type,
)
from cdcserver.commands.base import Handler, family
from cdcserver.commands.transactions import get_store
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded.images import CHANGE_STREAM_OPTIONS, CLUSTER_PARAMETERS
from cdcserver.embedded.store import Store
from cdcserver.embedded.store_types import id_key
from pipeline_stages.errors import MongoError

TABLE: dict[str, Handler] = {}
command = family(TABLE)
# A shard's own entries (deployments/shard.py puts them over the embedded ones).
SHARD_TABLE: dict[str, Handler] = {}
shard_command = family(SHARD_TABLE)

# mongod 8.0 keeps its persistent query settings in this cluster parameter, but never shows it.
_QUERY_SETTINGS = "querySettings"
_UNSET_TIME = Timestamp(0, 0)  # LogicalTime::kUninitialized: a parameter never set
# IDL `variant: [string, safeInt64]`: a string or any number.
_STRING_OR_NUMBER = "[string, long, int, decimal, double]"


def _admin_only(name: str, db: str) -> None:
    if db != "admin":
        raise MongoError(13, f"{name} may only be run against the admin database.")


def _unknown(name: str) -> MongoError:
    return MongoError(4, f"Unknown server parameter: {name}")


# -- changeStreamOptions --------------------------------------------------------------------------


def _parse_failure(error: MongoError) -> MongoError:
    # ChangeStreamOptionsParameter::validate appends the IDL parser's reason without a space.
    return MongoError(2, f"Failed parsing new changeStreamOptions value{error.args[0]}")


def _check_change_stream_options(doc: Mapping[str, Any]) -> None:
    """ChangeStreamOptionsParameter::validate of the document to be written: both fields
    present, then the IDL parse of ChangeStreamOptions (strict: unknown fields refused), then
    the value: a positive number or "off". Every failure is a 2 BadValue."""
    where = CHANGE_STREAM_OPTIONS
    images = doc.get("preAndPostImages")
    if "preAndPostImages" not in doc:
        raise _parse_failure(missing(f"{where}.preAndPostImages"))
    # A non-document has no field: mongod reports the missing field first.
    if not isinstance(images, Mapping) or "expireAfterSeconds" not in images:
        raise _parse_failure(missing(f"{where}.expireAfterSeconds"))
    for field in doc:
        if field not in ("_id", "clusterParameterTime", "preAndPostImages"):
            raise _parse_failure(unknown_field(f"{where}.{field}"))
    for field in images:
        if field != "expireAfterSeconds":
            raise _parse_failure(unknown_field(f"{where}.preAndPostImages.{field}"))
    expire = images["expireAfterSeconds"]
    if is_string(expire):
        if expire != "off":
            raise MongoError(2, "Non-numeric value of 'expireAfterSeconds' should be 'off'")
    elif is_number(expire):
        if safe_long(expire) <= 0:
            raise MongoError(2, "Numeric value of 'expireAfterSeconds' should be positive")
    else:
        raise _parse_failure(wrong_type(f"{where}.preAndPostImages.expireAfterSeconds", expire,
                                        _STRING_OR_NUMBER))


def _change_stream_options_reply(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameter as mongod holds it in memory (ChangeStreamOptions::toBSON): a number as
    the long IDL `safeInt64` serializes, the default "off" when never set."""
    expire: Any = "off"
    when = _UNSET_TIME
    if doc is not None:
        images = doc.get("preAndPostImages")
        value = images.get("expireAfterSeconds") if isinstance(images, Mapping) else None
        expire = Int64(safe_long(value)) if is_number(value) else "off"
        stored = doc.get("clusterParameterTime")
        when = stored if isinstance(stored, Timestamp) else _UNSET_TIME
    return {"_id": CHANGE_STREAM_OPTIONS, "clusterParameterTime": when,
            "preAndPostImages": {"expireAfterSeconds": expire}}


# The cluster parameters cdcserver knows: name -> (the check of a new document, its reply).
_PARAMETERS = {
    CHANGE_STREAM_OPTIONS: (_check_change_stream_options, _change_stream_options_reply),
}


# -- setClusterParameter --------------------------------------------------------------------------


def _requested_change(cmd: Mapping[str, Any], name: str) -> tuple[str, Any]:
    """The command's own checks (SetClusterParameterCommand::typedRun): its IDL type, exactly
    one parameter, never the hidden query settings."""
    body = cmd.get(name)
    if not isinstance(body, Mapping):
        raise wrong_type(f"{name}.{name}", body, "object")
    if not body:
        raise MongoError(4, "No cluster parameter provided")
    if len(body) != 1:
        raise MongoError(72, f"{name} only supports setting exactly one parameter")
    param, value = next(iter(body.items()))
    if param == _QUERY_SETTINGS:
        raise _unknown(param)
    return param, value


def parameter_to_set(cmd: Mapping[str, Any], name: str = "setClusterParameter"
                     ) -> tuple[str, Mapping[str, Any]]:
    """The parameter `cmd` sets and its new fields, checked as mongod checks them before it
    chooses a time: the command's checks, then SetClusterParameterInvocation's (a known
    parameter, an object)."""
    param, value = _requested_change(cmd, name)
    if param not in _PARAMETERS:
        raise _unknown(param)
    if not isinstance(value, Mapping):
        raise MongoError(2, "Cluster parameter value must be an object")
    return param, value


def parameter_document(param: str, value: Mapping[str, Any], when: Timestamp
                       ) -> dict[str, Any]:
    """The document mongod upserts (normalizeParameter): `_id`, `clusterParameterTime`, then
    the fields as given; refused (2 BadValue) unless the parameter's check takes it."""
    doc: dict[str, Any] = {"_id": param, "clusterParameterTime": when}
    fields = list(value.items())
    for field, item in fields:
        if field in doc:  # the IDL parse of the new value sees the name twice
            raise _parse_failure(MongoError(40413, f"BSON field '{param}.{field}' is a "
                                            "duplicate field"))
        doc[field] = item
    _PARAMETERS[param][0](doc)
    return doc


def cluster_time_now(server: ServerState) -> Timestamp:
    """The time a parameter is set at: the cluster time now (the vector clock's), before the
    write that records it (a store without entries yet: this second)."""
    now = server.oplog.cluster_time()
    return now if now != _UNSET_TIME else Timestamp(int(time.time()), 0)


def write_parameter(store: Store, doc: dict[str, Any]) -> None:
    """Upsert `doc` into `config.clusterParameters` (created by the first one)."""
    with store.batch():
        c = store.ensure_collection(*CLUSTER_PARAMETERS)
        pre = store.documents(c).get(id_key(doc["_id"]))
        if pre is None:
            store.insert_document(c, doc)
        else:
            store.update_document(c, pre, doc, kind="replacement", update=doc)


@command("setClusterParameter")
async def set_cluster_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("setClusterParameter", db)
    param, value = parameter_to_set(cmd)
    store = get_store(server)
    write_parameter(store, parameter_document(param, value, cluster_time_now(server)))
    return {}


@shard_command("setClusterParameter")
async def set_cluster_parameter_on_shard(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A `--shardsvr` mongod makes the command's own checks, then refuses: mongos sets
    parameters (setClusterParameterImplShard)."""
    _admin_only("setClusterParameter", db)
    _requested_change(cmd, "setClusterParameter")
    raise MongoError(238, "setClusterParameter can only run on mongos in sharded clusters")


@shard_command("_shardsvrSetClusterParameter")
async def shardsvr_set_cluster_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """What the config server sends each shard: the parameter and the time it is set at."""
    _admin_only("_shardsvrSetClusterParameter", db)
    param, value = parameter_to_set(cmd, "_shardsvrSetClusterParameter")
    when = cmd.get("clusterParameterTime")
    if not isinstance(when, Timestamp):
        raise wrong_type("_shardsvrSetClusterParameter.clusterParameterTime", when, "timestamp")
    write_parameter(get_store(server), parameter_document(param, value, when))
    return {}


# -- getClusterParameter --------------------------------------------------------------------------


def requested_parameters(cmd: Mapping[str, Any]) -> list[str]:
    """The names `getClusterParameter` asks for: one, a list, or "*" (all), each known."""
    arg = cmd.get("getClusterParameter")
    names: list[str] = []
    if isinstance(arg, str) and is_string(arg):
        if arg == "*":
            return list(_PARAMETERS)
        names.append(arg)
    elif isinstance(arg, list):
        if not arg:
            raise MongoError(2, "Must supply at least one cluster server parameter name to "
                             "getClusterParameter")
        for i, item in enumerate(arg):
            if not isinstance(item, str) or not is_string(item):
                raise wrong_type(f"getClusterParameter.getClusterParameter.{i}", item,
                                 "string")
            names.append(item)
    else:
        raise wrong_type("getClusterParameter.getClusterParameter", arg, "[string, array]")
    for name in names:
        if name == _QUERY_SETTINGS or name not in _PARAMETERS:
            raise _unknown(name)
    return names


def parameter_replies(store: Store, names: list[str]) -> list[dict[str, Any]]:
    return [_PARAMETERS[name][1](store.cluster_parameter(name)) for name in names]


@command("getClusterParameter")
async def get_cluster_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("getClusterParameter", db)
    names = requested_parameters(cmd)
    return {"clusterParameters": parameter_replies(get_store(server), names)}
