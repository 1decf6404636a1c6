"""The mongos front of the embedded cluster: its commands and the routing.

`TABLE` is the front's own family: the commands mongos answers itself (hello with
`msg: "isdbgrid"`, the sharding commands, `config.*` reads), and the routed ones (CRUD by shard
key, DDL on the database's primary shard or on every shard of a sharded collection, change
streams merged from every shard). The mode's whole table (`deployments/cluster.py` `CLUSTER`)
adds fail points and, for every other command a shard knows, `forward_default`: forwarding to
the database's primary shard (shard0 for admin).

A forwarded command runs through the shard's own `run_command` in-process; a shard's error
comes back to the client as the shard gave it (code, codeName, message, labels).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from cdcserver.commands import failpoints, handshake
from cdcserver.commands.registry import int_arg, run_command
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.cursors import FORWARDED, QUERY_RESULT, GetMore, HeldHere, cursor_reply
from cdcserver.embedded.store import id_key as _id_key
from cdcserver.embedded.store_types import Collection
from cdcserver.sharding import migration
from cdcserver.sharding.catalog import (
    _MISSING,
    ShardingCatalog,
    _key_bytes,
    hashed_value,
)
from cdcserver.sharding.cluster import ClusterLog, ShardedCluster
from cdcserver.sharding.shard_error import ShardError
from cdcserver.sharding.streams import MergedChangeStream, MergedCluster
from pipeline_stages.dotted_path import document_value
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate, parse_aggregate
from pipeline_stages.value_string import document_string

if TYPE_CHECKING:
    from _typeshed import SupportsAllComparisons

    from cdcserver.sharding.cluster import Shard

# The front's own commands (its mode's table: deployments/cluster.py).
TABLE: dict[str, Handler] = {}

_REPLY_TIME_FIELDS = ("ok", "$clusterTime", "operationTime")
ShardNotFound = 70  # error code


def front(*names: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            TABLE[name] = handler
        return handler

    return register


def cluster_of(server: ServerState) -> ShardedCluster:
    """The cluster this front serves (its deployment's oplog is the cluster's)."""
    oplog = server.oplog
    if not isinstance(oplog, ClusterLog):  # the table of another mode: a bug, not a request
        raise TypeError(f"the sharded front's command on {type(oplog).__name__}")
    return oplog.cluster


async def forward(cluster: ShardedCluster, shard: Shard, cmd: Mapping[str, Any], db: str
                  ) -> dict[str, Any]:
    """Run `cmd` on `shard`; its reply without ok/times, or its error raised."""
    body = {k: v for k, v in cmd.items() if k != "$clusterTime"}
    body["$db"] = db
    _join_transaction(cluster, shard, body)
    reply = await run_command(shard.state, shard.conn, body)
    if reply.get("ok") != 1:
        raise ShardError(reply)
    out = {k: v for k, v in reply.items() if k not in _REPLY_TIME_FIELDS}
    cursor = out.get("cursor")
    if isinstance(cursor, Mapping) and cursor.get("id"):
        cluster.cursor_owner[int(cursor["id"])] = shard.name
    _note_participant(cluster, shard, cmd)
    return out


def _txn_key(cmd: Mapping[str, Any]) -> tuple[bytes, int] | None:
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if cmd.get("autocommit") is False and isinstance(lsid, Mapping) and number is not None:
        return (bytes(lsid.get("id", b"")), int(number))
    return None


def _join_transaction(cluster: ShardedCluster, shard: Shard, body: dict[str, Any]) -> None:
    """mongos starts the transaction on each shard the first time it sends it a statement of
    it (`startTransaction: true`, with the transaction's readConcern)."""
    key = _txn_key(body)
    if key is None or next(iter(body)) in ("commitTransaction", "abortTransaction"):
        return
    if body.get("startTransaction") is True:
        # The client's first statement (a txnNumber is never reused): it may reach several
        # shards; each starts the transaction once.
        cluster.participants.setdefault(key, [])
        cluster.txn_read_concern.setdefault(key, body.get("readConcern"))
        if shard.name in cluster.participants[key]:
            del body["startTransaction"]
            body.pop("readConcern", None)
        return
    if shard.name not in cluster.participants.get(key, [shard.name]):
        body["startTransaction"] = True
        read_concern = cluster.txn_read_concern.get(key)
        if read_concern is not None:
            body["readConcern"] = read_concern


def _note_participant(cluster: ShardedCluster, shard: Shard, cmd: Mapping[str, Any]) -> None:
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if cmd.get("autocommit") is False and isinstance(lsid, Mapping) and number is not None:
        key = (bytes(lsid.get("id", b"")), int(number))
        shards = cluster.participants.setdefault(key, [])
        if shard.name not in shards:
            shards.append(shard.name)


def _primary(cluster: ShardedCluster, db: str, create: bool) -> Shard:
    if db in ("admin", "config", "local"):
        return cluster.shards[0]
    name = cluster.catalog.ensure_database(db) if create else cluster.catalog.primary(db)
    return cluster.shard(name) if name is not None else cluster.shards[0]


async def forward_default(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongos passes a command it does not route otherwise to the database's primary shard."""
    cluster = cluster_of(server)
    return await forward(cluster, _primary(cluster, db, create=False), cmd, db)


# -- handshake ------------------------------------------------------------------------------------

# In mongos's order (cluster_hello_cmd.cpp: maxWireVersion before minWireVersion).
_HELLO_KEEP = ("maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize", "localTime",
               "logicalSessionTimeoutMinutes", "connectionId", "maxWireVersion",
               "minWireVersion")


async def _front_hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str, legacy: bool
) -> dict[str, Any]:
    base = await handshake._hello(server, conn, cmd, db, legacy)
    reply: dict[str, Any] = {}
    if cmd.get("helloOk") is True:
        reply["helloOk"] = True
    reply["ismaster" if legacy else "isWritablePrimary"] = True
    reply["msg"] = "isdbgrid"
    reply["topologyVersion"] = base["topologyVersion"]
    for key in _HELLO_KEEP:
        reply[key] = base[key]
    for key, value in base.items():  # compression, saslSupportedMechs, speculative auth
        if key not in reply and key not in (
            "hosts", "setName", "setVersion", "secondary", "primary", "me", "electionId",
            "lastWrite", "readOnly", "ismaster", "isWritablePrimary",
        ):
            reply[key] = value
    return reply


@front("hello")
async def hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _front_hello(server, conn, cmd, db, legacy=False)


@front("isMaster", "ismaster")
async def is_master(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _front_hello(server, conn, cmd, db, legacy=True)


@front("isdbgrid")
async def isdbgrid(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    import socket

    return {"isdbgrid": 1, "hostname": socket.gethostname()}


@front("ping")
async def ping(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {}


@front("serverStatus")
async def server_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A shard's serverStatus, as the process it describes is the router."""
    reply = await forward_default(server, conn, cmd, db)
    if "process" in reply:
        reply["process"] = "mongos"
    return reply


# -- sharding commands ----------------------------------------------------------------------------

def _admin_only(name: str, db: str) -> None:
    if db != "admin":
        raise MongoError(13, f"{name} may only be run against the admin database.")


@front("listShards")
async def list_shards(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("listShards", db)
    return {"shards": _shard_docs(cluster_of(server))}


def _shard_docs(cluster: ShardedCluster) -> list[dict[str, Any]]:
    catalog = cluster.catalog
    return [
        {"_id": s.name, "host": s.host_string, "state": 1,
         "topologyTime": catalog.topology_time[s.name],
         **({"draining": True} if s.name in catalog.draining else {})}
        for s in cluster.shards
    ]


@front("enableSharding", "enablesharding")
async def enable_sharding(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("enableSharding", db)
    cluster = cluster_of(server)
    name = cmd[next(iter(cmd))]
    if not isinstance(name, str) or not name:
        raise MongoError(73, f"Invalid db name specified: {name}")
    primary = cmd.get("primaryShard")
    if primary is not None and primary not in cluster.catalog.shard_names:
        raise MongoError(70, f"Shard {primary} not found")
    current = cluster.catalog.primary(name)
    if current is not None and primary is not None and current != primary:
        raise MongoError(
            48, f"Database {name} already exists with primary shard {current}",
        )
    cluster.catalog.ensure_database(name, primary)
    return {}


def _namespace_arg(cmd: Mapping[str, Any], name: str) -> tuple[str, str, str]:
    ns = cmd.get(name)
    if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db, coll = ns.split(".", 1)
    return ns, db, coll


def _check_key_pattern(key: Any) -> dict[str, Any]:
    if not isinstance(key, Mapping) or not key:
        raise MongoError(2, "Shard key cannot be empty")
    hashed = 0
    for value in key.values():
        if value == "hashed":
            hashed += 1
        elif value != 1 or isinstance(value, bool):
            raise MongoError(
                2, f"Shard key {dict(key)} must be a pattern with values 1 or 'hashed'"
            )
    if hashed > 1:
        raise MongoError(31303, "A shard key pattern cannot contain more than 1 hashed field")
    return dict(key)


@front("shardCollection", "shardcollection")
async def shard_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("shardCollection", db)
    cluster = cluster_of(server)
    ns, dbname, coll = _namespace_arg(cmd, next(iter(cmd)))
    key = _check_key_pattern(cmd.get("key"))
    catalog = cluster.catalog
    existing = catalog.key_pattern(ns)
    if existing is not None:
        if existing != key:
            raise MongoError(
                20, f"sharding already enabled for collection {ns} with options "
                f"{{ shardKey: {existing} }}",
            )
        return {"collectionsharded": ns}
    unique = cmd.get("unique") is True
    primary = cluster.shard(catalog.ensure_database(dbname))
    store = primary.store
    c = store.get(dbname, coll)
    if c is None:
        await forward(cluster, primary, {"create": coll}, dbname)
        c = store.get(dbname, coll)
        if c is None:  # (the shard's create raises when it makes no collection)
            raise MongoError(26, f"Collection {ns} not found")  # NamespaceNotFound
    if list(key) != ["_id"] or key["_id"] == "hashed":
        name = "_".join(f"{f}_{v}" for f, v in key.items())
        index: dict[str, Any] = {"key": key, "name": name}
        if unique:
            index["unique"] = True
        await forward(cluster, primary, {"createIndexes": coll, "indexes": [index]}, dbname)
    empty = not store.documents(c)
    catalog.shard_collection(ns, key if empty else key, unique, bytes(c.uuid), primary.name)
    if not empty:  # only an empty collection is presplit
        catalog.chunks[ns] = catalog.chunks[ns][:1]
        catalog.chunks[ns][0].update({"min": dict.fromkeys(key, MinKey()),
                                      "max": dict.fromkeys(key, MaxKey()),
                                      "shard": primary.name})
        catalog.save()
    for chunk in catalog.chunks[ns]:
        _ensure_collection_on(cluster, cluster.shard(chunk["shard"]), primary, dbname, coll)
    # The primary shard's no-op at the commit (notifyChangeStreamsOnShardCollection): the
    # `shardCollection` event of streams with showExpandedEvents.
    with store.batch():
        store.append_oplog("n", ns, {"msg": {"shardCollection": ns}}, ui=c.ui, o2={
            "shardCollection": ns, "shardKey": key, "unique": unique,
            "presplitHashedZones": False,
        })
    return {"collectionsharded": ns}


def _ensure_collection_on(cluster: ShardedCluster, shard: Shard, primary: Shard, db: str,
                          coll: str) -> Collection:
    """The sharded collection on a shard that owns a chunk of it: same UUID and indexes as on
    the primary, created as a migration does (fromMigrate: invisible to change streams)."""
    c = shard.store.get(db, coll)
    if c is not None:
        return c
    source = primary.store.get(db, coll)
    with shard.store.migrating(), shard.store.batch():
        c = shard.store.create_collection(db, coll, dict(source.options) if source else {},
                                          uuid=source.uuid if source is not None else None)
        if source is not None:
            extra = [dict(i) for i in source.indexes if i.get("name") != "_id_"]
            if extra:
                shard.store.create_indexes(c, extra)
    return c


def _chunk_at(catalog: ShardingCatalog, ns: str, point: Mapping[str, Any]) -> dict[str, Any]:
    """The chunk starting at (else holding) `point`; 61 if `ns` has no chunks."""
    chunk = catalog.find_chunk(ns, point)
    if chunk is None:
        raise MongoError(61, f"no chunk found for {ns}")
    return chunk


def _find_chunk_arg(cluster: ShardedCluster, ns: str, cmd: Mapping[str, Any]) -> dict[str, Any]:
    catalog = cluster.catalog
    if "bounds" in cmd:
        return _chunk_at(catalog, ns, cmd["bounds"][0])
    if "min" in cmd:
        return _chunk_at(catalog, ns, cmd["min"])
    if "find" in cmd:
        return catalog.chunk_for_values(ns, catalog.key_values(ns, cmd["find"]))
    raise MongoError(72, "need to specify either a find query, or both lower and upper "
                     "bounds.")


@front("split")
async def split(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("split", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, "split")
    catalog = cluster.catalog
    if not catalog.is_sharded(ns):
        raise MongoError(118, f"ns {ns} is not sharded")  # NamespaceNotSharded
    if "middle" in cmd:
        catalog.split(ns, cmd["middle"])
    else:
        chunk = _find_chunk_arg(cluster, ns, cmd)
        values = _median(cluster, ns, chunk)
        if values is not None:
            catalog.split(ns, values)
    if catalog.balancer:  # switched on: a round after every split
        await balancer_round(cluster)
    return {}


def _median(cluster: ShardedCluster, ns: str, chunk: Mapping[str, Any]
            ) -> dict[str, Any] | None:
    db, coll = ns.split(".", 1)
    store = cluster.shard(chunk["shard"]).store
    c = store.get(db, coll)
    if c is None:  # no documents to split at
        return None
    pattern = cluster.catalog.key_pattern(ns) or {}
    docs = [d for d in store.documents(c).values() if cluster.catalog.in_chunk(ns, chunk, d)]
    if len(docs) < 2:
        return None
    keys = sorted((cluster.catalog.key_values(ns, d) for d in docs), key=_key_bytes)
    mid = keys[len(keys) // 2]
    return dict(zip(pattern, mid, strict=True))


@front("moveChunk", "movechunk")
async def move_chunk(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("moveChunk", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, next(iter(cmd)))
    if not cluster.catalog.is_sharded(ns):
        raise MongoError(118, f"ns {ns} is not sharded")
    to = cmd.get("to")
    if to not in cluster.catalog.shard_names:
        raise MongoError(ShardNotFound, f"Could not find shard {to}")
    await migrate(cluster, ns, _find_chunk_arg(cluster, ns, cmd), to)
    return {"millis": 0}



@front("moveRange")
async def move_range(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("moveRange", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, "moveRange")
    if not cluster.catalog.is_sharded(ns):
        raise MongoError(118, f"ns {ns} is not sharded")
    to = cmd.get("toShard")
    if to not in cluster.catalog.shard_names:
        raise MongoError(ShardNotFound, f"Could not find shard {to}")
    if "min" not in cmd:
        raise MongoError(40414, "BSON field 'moveRange.min' is missing but a required field")
    catalog = cluster.catalog
    chunk = _chunk_at(catalog, ns, cmd["min"])
    if "max" in cmd:
        catalog.split(ns, cmd["max"])  # moves only [min, max)
    if _key_bytes(list(chunk["min"].values())) != _key_bytes(list(cmd["min"].values())):
        catalog.split(ns, cmd["min"])
        chunk = _chunk_at(catalog, ns, cmd["min"])
    await migrate(cluster, ns, chunk, to)
    return {}


async def migrate(cluster: ShardedCluster, ns: str, chunk: dict[str, Any], to: str) -> None:
    """A chunk migration (`migration.migrate`: crash-safe; its writes are fromMigrate, no
    change-stream events), once the routed operations of `ns` under way have ended."""
    async with cluster.placement.critical_section(ns):
        db = ns.split(".", 1)[0]
        primary = cluster.shard(cluster.catalog.primary(db) or chunk["shard"])
        migration.migrate(cluster.catalog, cluster.stores(), ns, chunk, to,
                          _collection_like(cluster, primary))


def _collection_like(cluster: ShardedCluster, primary: Shard) -> migration.EnsureCollection:
    """A data move's target collection on a shard: like the one on `primary`."""
    return lambda shard, db, coll: _ensure_collection_on(
        cluster, cluster.shard(shard), primary, db, coll)


@front("balancerStart", "balancerStop", "balancerStatus")
async def balancer(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only(next(iter(cmd)), db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    name = next(iter(cmd))
    if name == "balancerStart":
        catalog.balancer = True
        await balancer_round(cluster)
    elif name == "balancerStop":
        catalog.balancer = False
    else:
        return {"mode": "full" if catalog.balancer else "off", "inBalancerRound": False,
                "numBalancerRounds": Int64(cluster.balancer_rounds)}
    return {}


async def balancer_round(cluster: ShardedCluster) -> int:
    """One balancer round: chunks move (as migrations: no events) from the shard with the
    most chunks of a collection to the one with the fewest until they differ by at most one.
    (mongod 8.0 balances by data size; here by chunk count.) Returns the chunks moved."""
    catalog = cluster.catalog
    moved = 0
    targets = catalog.placement_shards()
    for ns in list(catalog.collections):
        while True:
            counts = dict.fromkeys(catalog.shard_names, 0)
            for chunk in catalog.chunks.get(ns, []):
                counts[chunk["shard"]] += 1
            least = min(targets, key=lambda n: counts[n])
            # A draining shard's chunks go first, whatever the counts.
            draining = [n for n in catalog.draining if counts.get(n)]
            most = draining[0] if draining else max(targets, key=lambda n: counts[n])
            if not draining and counts[most] - counts[least] <= 1:
                break
            chunk = next(c for c in catalog.chunks[ns] if c["shard"] == most)
            await migrate(cluster, ns, chunk, least)
            moved += 1
    cluster.balancer_rounds += 1
    return moved


# -- adding and removing shards -------------------------------------------------------------------

@front("addShard", "addshard")
async def add_shard(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """addShard: the embedded cluster can only add a shard of its own (a new embedded replica
    set, on a new loopback port); the connection string gives its name (the replica set's, as
    mongod takes it, unless `name` says otherwise)."""
    _admin_only("addShard", db)
    cluster = cluster_of(server)
    target = cmd[next(iter(cmd))]
    if not isinstance(target, str):
        raise MongoError(14, "BSON field 'addShard.addShard' is the wrong type "
                         f"'{_type_name(target)}', expected type 'string'")
    set_name, sep, hosts = target.partition("/")
    if not sep:
        set_name, hosts = "", target
    if not hosts or any(not h for h in hosts.split(",")):
        raise MongoError(9, f"Invalid connection string {target}")  # FailedToParse
    name = cmd.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise MongoError(93, "shard name cannot be empty")
    catalog = cluster.catalog
    existing = cluster.shard_names_ever()
    if set_name and set_name in catalog.shard_names and name in (None, set_name):
        return {"shardAdded": set_name}  # the same replica set again: nothing to do
    if set_name and set_name in existing and name is None:
        raise MongoError(20, f"A shard already exists containing the replica set '{set_name}'")
    if name is None:
        name = set_name or _generated_shard_name(set(catalog.shard_names), existing)
    if name in existing:
        raise MongoError(20, f"A shard named {name} already exists")
    await cluster.add_shard(name)
    if catalog.balancer:  # switched on: the new shard takes its share (migrations: no events)
        await balancer_round(cluster)
    return {"shardAdded": name}


def _type_name(value: Any) -> str:
    return {str: "string", int: "int", float: "double", bool: "bool", dict: "object",
            list: "array"}.get(type(value), type(value).__name__)


def _generated_shard_name(members: set[str], existing: set[str]) -> str:
    """mongod's generated names: shard0000, shard0001... after the highest of the members
    (skipping a removed shard's, whose oplog is still kept under its name)."""
    numbers = [int(n[5:]) for n in members if n.startswith("shard") and n[5:].isdigit()]
    k = max(numbers) + 1 if numbers else 0
    while f"shard{k:04d}" in existing:
        k += 1
    return f"shard{k:04d}"


@front("removeShard", "removeshard")
async def remove_shard(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """removeShard as the config server runs it: the first call marks the shard draining
    (the balancer then moves its chunks off: here at once, as migrations), later calls report
    what is left (databases whose primary it is: `movePrimary` them), the last one removes it."""
    _admin_only("removeShard", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    name = cmd[next(iter(cmd))]
    if not isinstance(name, str):
        raise MongoError(14, "BSON field 'removeShard.removeShard' is the wrong type "
                         f"'{_type_name(name)}', expected type 'string'")
    if name not in catalog.shard_names:
        raise MongoError(ShardNotFound, f"Shard {name} does not exist")
    if not any(n != name and n not in catalog.draining for n in catalog.shard_names):
        raise MongoError(20, "Operation not allowed because it would remove the last shard")
    dbs = sorted(d for d, entry in catalog.databases.items() if entry["primary"] == name)
    db_info = {"note": "you need to drop or movePrimary these databases", "dbsToMove": dbs}
    if name not in catalog.draining:
        catalog.start_draining(name)
        await balancer_round(cluster)  # the draining shard's chunks move off
        return {"msg": "draining started successfully", "state": "started", "shard": name,
                **db_info}
    chunks = sum(1 for cs in catalog.chunks.values() for c in cs if c["shard"] == name)
    if chunks or dbs:
        if chunks:
            await balancer_round(cluster)
        return {"msg": "draining ongoing", "state": "ongoing",
                "remaining": {"chunks": Int64(chunks), "dbs": Int64(len(dbs)),
                              "jumboChunks": Int64(0)},
                **db_info}
    cluster.retire_shard(cluster.shard(name))
    return {"msg": "removeshard completed successfully", "state": "completed", "shard": name}


@front("movePrimary", "moveprimary")
async def move_primary(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """movePrimary: the database's unsharded collections are cloned to the new primary and
    dropped on the old one, as migrations (fromMigrate: no change-stream events)."""
    _admin_only("movePrimary", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    name = cmd[next(iter(cmd))]
    if not isinstance(name, str) or not name:
        raise MongoError(73, f"invalid db name specified: {name}")
    to = cmd.get("to")
    if not isinstance(to, str) or not to:
        raise MongoError(ShardNotFound, "you have to specify where you want to move it")
    if name in ("admin", "config", "local"):
        raise MongoError(20, f"Can't move primary for {name} database")
    current = catalog.primary(name)
    if current is None:
        raise MongoError(26, f"Database {name} not found")
    if to not in catalog.shard_names:
        raise MongoError(ShardNotFound, f"Shard {to} not found")
    if to == current:
        return {}
    old = cluster.shard(current)
    colls = [c.name for c in old.store.collections_of(name)
             if not catalog.is_sharded(c.ns) and not c.name.startswith("system.")]
    async with contextlib.AsyncExitStack() as held:
        for coll in colls:  # each collection's routed operations end first
            await held.enter_async_context(cluster.placement.critical_section(f"{name}.{coll}"))
        migration.move_primary(catalog, cluster.stores(), name, to, colls,
                               _collection_like(cluster, old))
    return {}


def _current_key_pattern(catalog: ShardingCatalog, ns: str, command: str) -> dict[str, Any]:
    """The shard key `ns` has now, which `command` changes; 118 NamespaceNotSharded if none."""
    old = catalog.key_pattern(ns)
    if old is None:
        raise MongoError(118, f"{command} namespace {ns} is not sharded")
    return old


@front("reshardCollection")
async def reshard_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The collection under a new shard key (`migration.reshard`: cloned to their new owners
    under a new UUID, crash-safe, no events but the primary shard's `reshardCollection`
    no-op)."""
    import uuid as uuid_module

    _admin_only("reshardCollection", db)
    cluster = cluster_of(server)
    ns, dbname, coll = _namespace_arg(cmd, "reshardCollection")
    catalog = cluster.catalog
    _current_key_pattern(catalog, ns, "reshardCollection")  # 118 unless sharded
    key = _check_key_pattern(cmd.get("key"))
    unique = cmd.get("unique") is True
    primary = cluster.shard(catalog.primary(dbname) or cluster.shards[0].name)
    source = primary.store.get(dbname, coll)
    options = dict(source.options) if source is not None else {}
    indexes = [dict(i) for i in (source.indexes if source is not None else [])
               if i.get("name") != "_id_"]
    if list(key) != ["_id"] or key["_id"] == "hashed":
        name = "_".join(f"{f}_{v}" for f, v in key.items())
        if all(i.get("name") != name for i in indexes):
            indexes.append({"v": 2, "key": dict(key), "name": name})
    async with cluster.placement.critical_section(ns):
        migration.reshard(catalog, cluster.stores(), ns, key, unique, uuid_module.uuid4().bytes,
                          primary.name, options, indexes)
    return {}


@front("refineCollectionShardKey")
async def refine_collection_shard_key(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("refineCollectionShardKey", db)
    cluster = cluster_of(server)
    ns, dbname, coll = _namespace_arg(cmd, "refineCollectionShardKey")
    catalog = cluster.catalog
    old = _current_key_pattern(catalog, ns, "refineCollectionShardKey")
    key = _check_key_pattern(cmd.get("key"))
    if list(key)[: len(old)] != list(old) or any(key[f] != old[f] for f in old):
        raise MongoError(
            72, f"refineCollectionShardKey: the proposed shard key {document_string(key)} does "
            f"not extend the current shard key {document_string(old)}",
        )
    entry = catalog.collections[ns]
    entry["key"] = dict(key)
    for chunk in catalog.chunks[ns]:  # the new fields start at MinKey in every bound
        for bound in ("min", "max"):
            first = next(iter(chunk[bound].values()))
            filler = MaxKey() if isinstance(first, MaxKey) else MinKey()
            chunk[bound] = {f: chunk[bound].get(f, filler) for f in key}
    catalog.save()
    primary = cluster.shard(catalog.primary(dbname) or cluster.shards[0].name)
    store = primary.store
    c = store.get(dbname, coll)
    with store.batch():  # notifyChangeStreamsOnRefineCollectionShardKeyComplete
        store.append_oplog("n", ns, {"msg": f"Refine shard key for collection {ns} with "
                                            f"{document_string(key)}"},
                           ui=c.ui if c is not None else None,
                           o2={"refineCollectionShardKey": ns, "shardKey": key,
                               "oldShardKey": old})
    return {}


# -- routing of CRUD --------------------------------------------------------------------------

def _sharded_ns(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> str | None:
    coll = cmd.get(next(iter(cmd)))
    if not isinstance(coll, str):
        return None
    ns = f"{db}.{coll}"
    return ns if cluster.catalog.is_sharded(ns) else None


def _target(cluster: ShardedCluster, ns: str, query: Any) -> Shard | None:
    """The one shard a query's equality on the whole shard key targets (None: broadcast)."""
    if not isinstance(query, Mapping):
        return None
    pattern = cluster.catalog.key_pattern(ns) or {}
    values = []
    for field, kind in pattern.items():
        value = query.get(field, _MISSING)
        if value is _MISSING:
            value = document_value(query, field, _MISSING)
        if value is _MISSING:
            return None
        if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
            if set(value) == {"$eq"}:
                value = value["$eq"]
            else:
                return None
        if isinstance(value, list):
            return None
        values.append(hashed_value(value) if kind == "hashed" else value)
    return cluster.shard(cluster.catalog.chunk_for_values(ns, values)["shard"])


def _owning_shards(cluster: ShardedCluster, ns: str) -> list[Shard]:
    names = {c["shard"] for c in cluster.catalog.chunks.get(ns, [])}
    return [s for s in cluster.shards if s.name in names]


def _merge_write_replies(replies: list[tuple[list[int], dict[str, Any]]]) -> dict[str, Any]:
    """Per-shard write replies into one (indexes mapped back to the client's statements)."""
    out: dict[str, Any] = {"n": 0}
    modified = None
    upserted: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for indexes, reply in replies:
        out["n"] += int(reply.get("n", 0))
        if "nModified" in reply:
            modified = (modified or 0) + int(reply["nModified"])
        for u in reply.get("upserted", []):
            upserted.append({**u, "index": indexes[u["index"]]})
        for e in reply.get("writeErrors", []):
            errors.append({**e, "index": indexes[e["index"]]})
    if upserted:
        out["upserted"] = sorted(upserted, key=lambda u: u["index"])
    if modified is not None:
        out["nModified"] = modified
    if errors:
        out["writeErrors"] = sorted(errors, key=lambda e: e["index"])
    return out


@front("insert")
async def insert(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, _primary(cluster, db, create=True), cmd, db)
    docs = cmd.get("documents")
    if not isinstance(docs, list):
        return await forward(cluster, _primary(cluster, db, create=True), cmd, db)
    docs = [d if not isinstance(d, dict) or "_id" in d else {"_id": ObjectId(), **d}
            for d in docs]
    by_shard: dict[str, list[int]] = {}
    for i, doc in enumerate(docs):
        shard = cluster.catalog.shard_for(ns, doc) if isinstance(doc, Mapping) else \
            cluster.shards[0].name
        by_shard.setdefault(shard, []).append(i)
    replies = []
    ordered = cmd.get("ordered", True) is not False
    for name, indexes in by_shard.items():
        sub = {**cmd, "documents": [docs[i] for i in indexes]}
        reply = await forward(cluster, cluster.shard(name), sub, db)
        replies.append((indexes, reply))
        if ordered and reply.get("writeErrors"):
            break
    return _merge_write_replies(replies)


async def _routed_writes(
    server: ServerState, cmd: dict[str, Any], db: str, field: str,
    multi_of: Callable[[Mapping[str, Any]], bool],
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    statements = cmd.get(field)
    if ns is None or not isinstance(statements, list):
        create = field == "updates"
        return await forward(cluster, _primary(cluster, db, create=create), cmd, db)
    groups: dict[str, list[int]] = {}
    broadcast: list[int] = []
    replies = []
    for i, stmt in enumerate(statements):
        if field == "updates" and _may_change_shard_key(cluster, ns, stmt):
            moved = await _update_changing_shard_key(cluster, cmd, db, ns, stmt)
            if moved is not None:
                replies.append(([i], moved))
                continue
        shard = _target(cluster, ns, stmt.get("q") if isinstance(stmt, Mapping) else None)
        if shard is None:
            broadcast.append(i)
        else:
            groups.setdefault(shard.name, []).append(i)
    for name, indexes in groups.items():
        sub = {**cmd, field: [statements[i] for i in indexes]}
        replies.append((indexes, await forward(cluster, cluster.shard(name), sub, db)))
    for i in broadcast:
        stmt = statements[i]
        shards = _owning_shards(cluster, ns)
        if field == "updates" and stmt.get("upsert") is True and not multi_of(stmt):
            # 8.0's write without shard key: the first shard with a match updates it; with no
            # match anywhere, the document the upsert makes goes to the shard of its key.
            replies.append(([i], await _upsert_without_shard_key(cluster, cmd, db, ns, stmt)))
            continue
        if field == "updates" and stmt.get("upsert") is True:
            # A multi-document upsert must know its shard: mongos targets it by the query's
            # shard key.
            replies.append(([i], {"n": 0, "nModified": 0, "writeErrors": [{
                "index": 0, "code": 61,
                "errmsg": "Failed to target upsert by query :: could not extract exact shard "
                          "key",
            }]}))
            if cmd.get("ordered", True) is not False:
                break
            continue
        if multi_of(stmt):
            for shard in shards:
                replies.append(([i], await forward(cluster, shard, {**cmd, field: [stmt]}, db)))
            continue
        # One document without the shard key: the first shard that has a match takes it.
        for k, shard in enumerate(shards):
            one = dict(stmt)
            if k < len(shards) - 1 and field == "updates":
                one["upsert"] = False
            reply = await forward(cluster, shard, {**cmd, field: [one]}, db)
            if reply.get("n") or reply.get("writeErrors") or k == len(shards) - 1:
                replies.append(([i], reply))
                break
    return _merge_write_replies(replies)


async def _upsert_without_shard_key(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str,
                                    ns: str, stmt: Mapping[str, Any]) -> dict[str, Any]:
    # The probe is a read (a retryable write's txnNumber goes with the one write only); in
    # the user's transaction it is a statement of it.
    coll = ns.split(".", 1)[1]
    find: dict[str, Any] = {"find": coll, "filter": stmt.get("q") or {}, "limit": 1,
                            "singleBatch": True, "projection": {"_id": 1}}
    if "collation" in stmt:
        find["collation"] = stmt["collation"]
    if cmd.get("autocommit") is False:
        find.update({k: v for k, v in cmd.items()
                     if k in ("lsid", "txnNumber", "autocommit", "startTransaction")})
    for shard in _owning_shards(cluster, ns):
        found = (await forward(cluster, shard, find, db))["cursor"]["firstBatch"]
        if found:
            match = {**stmt, "q": {"$and": [stmt.get("q") or {}, {"_id": found[0]["_id"]}]}}
            return await forward(cluster, shard, {**cmd, "updates": [match]}, db)
    doc = await cluster.upsert_document(stmt)
    if doc is None:  # the shard gives the update's own error
        return await forward(cluster, _owning_shards(cluster, ns)[0],
                             {**cmd, "updates": [stmt]}, db)
    # The _id the merger chose, pinned, so the shard inserts the document that was targeted
    # (a generated _id could belong to another shard under a key on _id).
    pinned = {**stmt, "q": {"$and": [stmt.get("q") or {}, {"_id": doc["_id"]}]}}
    owner = cluster.shard(cluster.catalog.shard_for(ns, doc))
    return await forward(cluster, owner, {**cmd, "updates": [pinned]}, db)


def _may_change_shard_key(cluster: ShardedCluster, ns: str, stmt: Any) -> bool:
    """Whether a single update may write a shard key field (a replacement, a pipeline, or an
    operator on a path that is, contains or is inside a key field)."""
    if not isinstance(stmt, Mapping) or stmt.get("multi") is True:
        return False
    update = stmt.get("u")
    if not isinstance(update, Mapping) or not update or not all(
        str(k).startswith("$") for k in update
    ):
        return True
    fields = list(cluster.catalog.key_pattern(ns) or {})
    for args in update.values():
        if not isinstance(args, Mapping):
            continue
        for path in args:
            for field in fields:
                if path == field or path.startswith(field + ".") or field.startswith(path + "."):
                    return True
    return False


async def _update_changing_shard_key(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str,
                                     ns: str, stmt: Mapping[str, Any],
                                     moved: list[Any] | None = None) -> dict[str, Any] | None:
    """A single update whose new shard key belongs to another shard (WouldChangeOwningShard):
    mongos deletes the document on its shard and inserts it on the new one, in one
    transaction; without a txnNumber it is refused (20 IllegalOperation). None: the document
    stays where it is (the update goes its usual way)."""
    coll = ns.split(".", 1)[1]
    target = _target(cluster, ns, stmt.get("q"))
    shards = [target] if target is not None else _owning_shards(cluster, ns)
    find = {"find": coll, "filter": stmt.get("q") or {}, "limit": 1, "singleBatch": True}
    for option in ("collation", "sort"):
        if option in stmt:
            find[option] = stmt[option]
    for shard in shards:
        found = (await forward(cluster, shard, find, db))["cursor"]["firstBatch"]
        if found:
            break
    else:
        return None
    pre = found[0]
    post = await cluster.apply_update(pre, stmt)
    if post is None:
        return None
    owner = cluster.catalog.shard_for(ns, post)
    if owner == shard.name:
        return None
    if cmd.get("txnNumber") is None:
        return {"n": 0, "nModified": 0, "writeErrors": [{
            "index": 0, "code": 20,
            "errmsg": "Must run update to shard key field in a multi-statement transaction or "
                      "with retryWrites: true.",
        }]}
    key = cluster.catalog.document_key(ns, pre) or {"_id": pre["_id"]}
    if cmd.get("autocommit") is False:  # the user's transaction: two more statements of it
        base = {k: v for k, v in cmd.items()
                if k in ("lsid", "txnNumber", "autocommit", "startTransaction", "readConcern",
                         "comment", "bypassDocumentValidation")}
        await forward(cluster, shard, {"delete": coll, "deletes": [{"q": key, "limit": 1}],
                                       **base}, db)
        await forward(cluster, cluster.shard(owner), {"insert": coll, "documents": [post],
                                                      **base}, db)
        if moved is not None:
            moved.extend((pre, post))
        return {"n": 1, "nModified": 1}
    # A retryable write: both shards' writes at one time, without yielding in between.
    db_name = db
    source, dest = shard.store, cluster.shard(owner).store
    c_source, c_dest = source.get(db_name, coll), dest.get(db_name, coll)
    current = source.documents(c_source).get(_id_key(pre["_id"])) if c_source else None
    if current is None or c_dest is None:
        return None
    at = cluster.clock.tick()
    with source.commit_at(at), source.batch():
        source.delete_document(c_source, current)
    with dest.commit_at(at), dest.batch():
        dest.insert_document(c_dest, post)
    if moved is not None:
        moved.extend((pre, post))
    return {"n": 1, "nModified": 1}


@front("update")
async def update(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _routed_writes(server, cmd, db, "updates", lambda s: s.get("multi") is True)


@front("delete")
async def delete(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _routed_writes(server, cmd, db, "deletes", lambda s: s.get("limit") == 0)


@front("findAndModify", "findandmodify")
async def find_and_modify(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, _primary(cluster, db, create=True), cmd, db)
    if not cmd.get("remove") and "update" in cmd:
        stmt = {"q": cmd.get("query") or {}, "u": cmd["update"]}
        for option in ("collation", "sort", "arrayFilters"):
            if option in cmd:
                stmt[option] = cmd[option]
        if _may_change_shard_key(cluster, ns, stmt):
            moved_reply = await _find_and_modify_changing_shard_key(cluster, cmd, db, ns, stmt)
            if moved_reply is not None:
                return moved_reply
    shard = _target(cluster, ns, cmd.get("query"))
    if shard is not None:
        return await forward(cluster, shard, cmd, db)
    shards = _owning_shards(cluster, ns)
    for k, shard in enumerate(shards):
        reply = await forward(cluster, shard, cmd, db)
        if reply.get("value") is not None or k == len(shards) - 1:
            return reply
    return {}


async def _find_and_modify_changing_shard_key(
    cluster: ShardedCluster, cmd: Mapping[str, Any], db: str, ns: str, stmt: dict[str, Any],
) -> dict[str, Any] | None:
    """findAndModify whose new shard key belongs to another shard (WouldChangeOwningShard): in
    a transaction or a retryable write the document moves (a delete and an insert, as for
    update), else 20 IllegalOperation as mongos 8.0 answers. None: it stays on its shard."""
    moved: list[Any] = []
    reply = await _update_changing_shard_key(cluster, cmd, db, ns, stmt, moved)
    if reply is None:
        return None
    if not moved:  # refused: no transaction, not retryable
        error = reply["writeErrors"][0]
        raise MongoError(error["code"], error["errmsg"])
    pre, post = moved
    value = post if cmd.get("new") is True else pre
    fields = cmd.get("fields")
    if isinstance(fields, Mapping) and fields:
        projected = await cluster.merge_pipeline([value], [{"$project": fields}], {}, ns)
        value = projected["cursor"]["firstBatch"][0]
    return {"lastErrorObject": {"n": 1, "updatedExisting": True}, "value": value}


def _sort_key(sort: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], SupportsAllComparisons]:
    def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
        for field, direction in sort.items():
            va, vb = document_value(a, field, _MISSING), document_value(b, field, _MISSING)
            ka = _key_bytes([None if va is _MISSING else va])
            kb = _key_bytes([None if vb is _MISSING else vb])
            if ka != kb:
                less = ka < kb
                return (-1 if less else 1) * (1 if direction != -1 else -1)
        return 0

    return functools.cmp_to_key(compare)


async def _drain(cluster: ShardedCluster, shard: Shard, cmd: dict[str, Any], db: str
                 ) -> list[Any]:
    reply = await forward(cluster, shard, cmd, db)
    cursor = reply["cursor"]
    out = list(cursor.get("firstBatch", []))
    cursor_id = int(cursor.get("id", 0))
    coll = cursor["ns"].split(".", 1)[1]
    while cursor_id:
        more = await forward(cluster, shard, {"getMore": Int64(cursor_id), "collection": coll},
                             db)
        out.extend(more["cursor"]["nextBatch"])
        cursor_id = int(more["cursor"]["id"])
    cluster.cursor_owner.pop(int(cursor.get("id", 0)), None)
    return out


@front("find")
async def find(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    if db == "config" and cmd.get("find") in ("shards", "databases", "collections", "chunks"):
        return _config_find(cluster, cmd)
    ns = _sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, _primary(cluster, db, create=False), cmd, db)
    shard = _target(cluster, ns, cmd.get("filter"))
    if shard is not None:
        return await forward(cluster, shard, cmd, db)
    skip = int_arg(cmd, "skip", "find", 0) or 0
    limit = int_arg(cmd, "limit", "find", 0) or 0
    sub = {k: v for k, v in cmd.items() if k not in ("skip", "limit", "batchSize",
                                                     "singleBatch")}
    if limit:
        sub["limit"] = skip + abs(limit)
    docs: list[Any] = []
    for shard in _owning_shards(cluster, ns):
        docs.extend(await _drain(cluster, shard, sub, db))
    sort = cmd.get("sort")
    if isinstance(sort, Mapping) and sort:
        docs.sort(key=_sort_key(sort))
    docs = docs[skip:]
    if limit:
        docs = docs[: abs(limit)]
    single = cmd.get("singleBatch") is True or (limit or 0) < 0
    return _results_reply(server, cluster, docs, ns, int_arg(cmd, "batchSize", "find"), single)


# A reply's batch holds up to 16 MiB of documents, 101 by default in a first batch.
_MAX_BATCH_BYTES = 16 * 1024 * 1024


def _take(docs: deque[Any], size: int | None) -> list[Any]:
    out: list[Any] = []
    total = 0
    while docs and (size is None or len(out) < size):
        n = len(bson.encode(docs[0]))
        if out and total + n > _MAX_BATCH_BYTES:
            break
        total += n
        out.append(docs.popleft())
    return out


class FrontResults(HeldHere):
    """Results merged on the front, kept for getMore: a query-result cursor of the front's
    registry (cdcserver/cursors/), reaped when idle as every cursor is."""

    kind = QUERY_RESULT
    owner = None

    def __init__(self, cursor_id: int, ns: str, rest: deque[Any]) -> None:
        self.id, self.ns, self.rest = cursor_id, ns, rest
        self.last_used = time.monotonic()
        self.busy = False
        self.awaited_s = 0.0

    @property
    def done(self) -> bool:
        return not self.rest

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        batch = _take(self.rest, more.batch_size)
        return {"cursor": {"nextBatch": batch, "id": Int64(self.id if self.rest else 0),
                           "ns": self.ns}}

    def close(self) -> None:
        self.rest.clear()


class ShardCursor:
    """A shard's cursor that a client reads through the front (its getMore and killCursors go
    to the owner shard): in the front's registry, so that an abandoned one is forgotten when
    idle (the shard reaps its own)."""

    kind = FORWARDED

    def __init__(self, cluster: ShardedCluster, cursor_id: int, ns: str, owner: str) -> None:
        self.cluster = cluster
        self.id, self.ns, self.owner = cursor_id, ns, owner
        self.last_used = time.monotonic()
        self.busy = False
        self.awaited_s = 0.0
        self.finished = False  # the shard's last batch (a failed getMore closes it too)

    @property
    def done(self) -> bool:
        return self.finished

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        """The shard's reply (its error raised as the shard gave it)."""
        reply = await forward(self.cluster, self.cluster.shard(self.owner), more.cmd, more.db)
        self.finished = not reply.get("cursor", {}).get("id")
        return reply

    async def kill(self, cmd: Mapping[str, Any], db: str) -> bool:
        self.close()
        reply = await forward(self.cluster, self.cluster.shard(self.owner),
                              {**cmd, "cursors": [Int64(self.id)]}, db)
        return bool(reply.get("cursorsKilled"))

    def close(self) -> None:
        self.cluster.cursor_owner.pop(self.id, None)


def _note_shard_cursor(server: ServerState, reply: Mapping[str, Any]) -> None:
    """A reply handing the client a shard's cursor: the front's registry keeps it."""
    cursor = reply.get("cursor")
    if not isinstance(cursor, Mapping):
        return
    cid = cursor.get("id")
    if not isinstance(cid, int) or not cid or server.cursors.find(int(cid)) is not None:
        return
    cluster = cluster_of(server)
    owner = cluster.cursor_owner.get(int(cid))
    if owner is not None:
        server.cursors.add(ShardCursor(cluster, int(cid), str(cursor.get("ns", "")), owner))


def _results_reply(server: ServerState, cluster: ShardedCluster, docs: list[Any], ns: str,
                   batch_size: int | None, single: bool = False) -> dict[str, Any]:
    """Results merged on the front (a broadcast find, the merging half of an aggregation):
    a first batch, and a cursor of the front's own for the rest."""
    rest = deque(docs)
    first = _take(rest, 101 if batch_size is None else batch_size)
    cursor_id = 0
    if rest and not single:
        cursor_id = server.cursors.new_id()
        server.cursors.add(FrontResults(cursor_id, ns, rest))
    return {"cursor": {"firstBatch": first, "id": Int64(cursor_id), "ns": ns}}


def _config_find(cluster: ShardedCluster, cmd: Mapping[str, Any]) -> dict[str, Any]:
    catalog = cluster.catalog
    name = cmd["find"]
    if name == "shards":
        docs = _shard_docs(cluster)
    elif name == "databases":
        docs = list(catalog.databases.values())
    elif name == "collections":
        docs = list(catalog.collections.values())
    else:
        docs = [c for cs in catalog.chunks.values() for c in cs]
    flt = cmd.get("filter") or {}
    docs = [d for d in docs if all(d.get(k) == v for k, v in flt.items())]
    if name == "chunks":
        docs = [{k: v for k, v in d.items() if k != "ns"} for d in docs]
    return {"cursor": {"firstBatch": docs, "id": Int64(0), "ns": f"config.{name}"}}


@front("count")
async def count(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, _primary(cluster, db, create=False), cmd, db)
    total = 0
    for shard in _owning_shards(cluster, ns):
        total += int((await forward(cluster, shard, cmd, db)).get("n", 0))
    return {"n": total}


@front("distinct")
async def distinct(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, _primary(cluster, db, create=False), cmd, db)
    seen: dict[bytes, Any] = {}
    for shard in _owning_shards(cluster, ns):
        for value in (await forward(cluster, shard, cmd, db)).get("values", []):
            seen.setdefault(_key_bytes([value]), value)
    return {"values": [seen[k] for k in sorted(seen)]}


# -- DDL ----------------------------------------------------------------------------------------

@front("create", "createIndexes", "renameCollection", "collMod")
async def ddl_create(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    name = next(iter(cmd))
    if name == "renameCollection":
        source = cmd.get("renameCollection")
        target = cmd.get("to")
        if isinstance(source, str) and isinstance(target, str):
            src_db, _, src_coll = source.partition(".")
            primary = _primary(cluster, src_db, create=False)
            reply = await forward(cluster, primary, cmd, db)
            if cluster.catalog.is_sharded(source):
                # The other shards' part of a sharded rename is internal (fromMigrate).
                for shard in cluster.shards:
                    if shard is not primary and shard.store.get(src_db, src_coll) is not None:
                        with shard.store.migrating():
                            await forward(cluster, shard, cmd, db)
            cluster.catalog.rename_collection(source, target)
            return reply
    ns = _sharded_ns(cluster, cmd, db)
    primary = _primary(cluster, db, create=name != "collMod")
    if ns is None:
        return await forward(cluster, primary, cmd, db)
    return await _on_every_shard(cluster, primary, cmd, db)


async def _on_every_shard(cluster: ShardedCluster, primary: Shard, cmd: Mapping[str, Any],
                          db: str) -> dict[str, Any]:
    """A sharded collection's DDL: the primary shard's entries are the ones change streams
    see; the other shards' are written as a migration's (fromMigrate)."""
    reply = await forward(cluster, primary, cmd, db)
    for shard in cluster.shards:
        if shard is primary:
            continue
        coll = cmd.get(next(iter(cmd)))
        if not isinstance(coll, str) or shard.store.get(db, coll) is None:
            continue
        with shard.store.migrating():
            await forward(cluster, shard, cmd, db)
    return reply


@front("drop", "dropIndexes", "deleteIndexes")
async def ddl_drop(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = _sharded_ns(cluster, cmd, db)
    primary = _primary(cluster, db, create=False)
    if ns is None:
        return await forward(cluster, primary, cmd, db)
    reply = await _on_every_shard(cluster, primary, cmd, db)
    if next(iter(cmd)) == "drop":
        cluster.catalog.drop_collection(ns)
    return reply


@front("dropDatabase")
async def drop_database(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    primary = _primary(cluster, db, create=False)
    reply = await forward(cluster, primary, cmd, db)
    for shard in cluster.shards:
        if shard is not primary and db in shard.store.databases():
            with shard.store.migrating():
                await forward(cluster, shard, cmd, db)
    cluster.catalog.drop_database(db)
    return reply


@front("listDatabases")
async def list_databases(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    seen: dict[str, dict[str, Any]] = {}
    for shard in cluster.shards:
        reply = await forward(cluster, shard, cmd, db)
        for entry in reply.get("databases", []):
            seen.setdefault(entry["name"], entry)
    out: dict[str, Any] = {"databases": [seen[k] for k in sorted(seen)]}
    if not cmd.get("nameOnly"):
        out["totalSize"] = Int64(0)
        out["totalSizeMb"] = Int64(0)
    return out


# -- sessions and transactions ------------------------------------------------------------------

@front("commitTransaction", "abortTransaction")
async def end_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    key = None
    if isinstance(lsid, Mapping) and number is not None:
        key = (bytes(lsid.get("id", b"")), int(number))
    shards = cluster.participants.get(key, []) if key is not None else []
    if not shards:
        return await forward(cluster, cluster.shards[0], cmd, db)
    reply: dict[str, Any] = {}
    if next(iter(cmd)) == "commitTransaction" and len(shards) > 1:
        if db != "admin":
            raise MongoError(13, "commitTransaction may only be run against the admin "
                             "database.")
        _commit_across_shards(server, cluster, [cluster.shard(n) for n in shards], cmd)
    elif next(iter(cmd)) == "abortTransaction":
        # Every participant aborts, even when one already had (a failed statement aborts its
        # shard's part): the first error only if none could.
        errors: list[MongoError] = []
        for name in shards:
            try:
                reply = await forward(cluster, cluster.shard(name), cmd, db)
            except MongoError as exc:
                errors.append(exc)
        if len(errors) == len(shards):
            raise errors[0]
    else:
        for name in shards:
            reply = await forward(cluster, cluster.shard(name), cmd, db)
    if key is not None:
        cluster.participants.pop(key, None)
        cluster.txn_read_concern.pop(key, None)
    return reply


def _commit_across_shards(server: ServerState, cluster: ShardedCluster, shards: list[Shard],
                          cmd: Mapping[str, Any]) -> None:
    """A transaction that wrote on several shards commits on all of them at one commit time
    (the coordinator's commitTimestamp), without yielding to the loop in between: no stream
    can see one participant's commit without the others'. The decision is kept before the
    first participant commits (`coordinator.py`): a crash in between is finished at the
    next start. Every participant is checked first (an aborted one fails the commit with its
    error and the others abort)."""
    from cdcserver.commands.transactions import transaction_of

    txns = []
    try:
        for shard in shards:
            txns.append((shard, transaction_of(shard.store, cmd)))
    except MongoError:
        for shard, txn in txns:
            with shard.store.batch():
                shard.store.abort_transaction(txn)
        raise
    from cdcserver.embedded.store import pack_transaction

    # Two-phase commit: every participant prepares (its applyOps with prepare: true), then
    # all commit at one commitTimestamp (their commitTransaction entries).
    prepares = [cluster.clock.tick() for _ in txns]
    commit_ts = cluster.clock.tick()
    # The decision is durable before any participant commits (with --data-dir): a crash
    # in between is finished at the next start (coordinator.py).
    record = cluster.coordinator.decide_commit(
        cmd.get("lsid") or {}, int(cmd.get("txnNumber") or 0), commit_ts,
        [(shard.name, prepare_ts, txn) for (shard, txn), prepare_ts in zip(
            txns, prepares, strict=True)],
    )
    crash = failpoints.fail_points(server).points[failpoints.CRASH_AFTER_FIRST_PARTICIPANT_COMMIT]
    for k, ((shard, txn), prepare_ts) in enumerate(zip(txns, prepares, strict=True)):
        if k == 1 and crash.fire():
            os._exit(9)  # a test's crash between the participants' commits (its fail point)
        store = shard.store
        entries = pack_transaction(txn.ops, store.txn_oplog_entry_ops,
                                   store.txn_oplog_entry_bytes) if txn.ops else []
        # (A transaction in several applyOps entries is logged unprepared, at the commit
        # time: its first entry at it, the others after.)
        phase = (store.prepared_commit(prepare_ts, commit_ts) if len(entries) == 1
                 else store.commit_at(commit_ts))
        with phase, store.batch():
            store.commit_transaction(txn)
    cluster.coordinator.forget(record)


@front("endSessions", "killSessions", "killAllSessions", "killAllSessionsByPattern",
       "refreshSessions")
async def sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    reply: dict[str, Any] = {}
    for shard in cluster.shards:
        reply = await forward(cluster, shard, cmd, db)
    return reply


# -- cursors ------------------------------------------------------------------------------------

@front("aggregate")
async def aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    if not is_change_stream_aggregate(cmd):
        ns = _sharded_ns(cluster, cmd, db)
        if ns is None:
            return await forward(cluster, _primary(cluster, db, create=False), cmd, db)
        return await _sharded_aggregate(server, cluster, cmd, db, ns)
    return await open_change_stream(server, cluster, cmd, db)


async def open_change_stream(server: ServerState, cluster: MergedCluster, cmd: Mapping[str, Any],
                             db: str) -> dict[str, Any]:
    """aggregate with $changeStream through a front: one stream per shard of `cluster` (the
    embedded cluster, a sidecar's shards, recorded shard oplogs), merged."""
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, dict):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    batch_size = int_arg(cursor_doc, "batchSize", "aggregate.cursor")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, "BSON field 'batchSize' value must be >= 0, actual value "
                         f"'{batch_size}'")
    spec = parse_aggregate(cmd, db)
    start = spec.requested_start()
    if start is None:
        start = cluster.start_for_new_stream()
    ns = f"{db}.{spec.coll}" if spec.scope == "collection" else f"{db}.$cmd.aggregate"
    stream = MergedChangeStream(server.cursors.new_id(), ns, cluster, spec, start)
    try:
        batch = await stream.first_batch(batch_size)
    except MongoError:
        stream.close()
        raise
    if batch.invalidated:
        stream.close()
    else:
        server.cursors.add(stream)
    return {"cursor": cursor_reply(stream.id, ns, batch, first=True)}


# Stages a shard runs alone on its documents; the first other stage and what follows it run on
# the merger (mongos's merging half of a split pipeline).
_SHARD_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot",
                           "$replaceWith", "$unwind", "$redact"})


async def _sharded_aggregate(server: ServerState, cluster: ShardedCluster, cmd: Mapping[str, Any],
                             db: str, ns: str) -> dict[str, Any]:
    pipeline = list(cmd.get("pipeline") or [])
    split = next((i for i, st in enumerate(pipeline)
                  if not isinstance(st, Mapping) or next(iter(st), "") not in _SHARD_STAGES),
                 len(pipeline))
    shard_part = {**cmd, "pipeline": pipeline[:split], "cursor": {}}
    docs: list[Any] = []
    for shard in _owning_shards(cluster, ns):
        docs.extend(await _drain(cluster, shard, shard_part, db))
    if split < len(pipeline):
        reply = await cluster.merge_pipeline(docs, pipeline[split:], cmd, ns)
        docs = reply["cursor"]["firstBatch"]
    cursor_doc = cmd.get("cursor")
    size = int_arg(cursor_doc, "batchSize", "aggregate.cursor") if isinstance(
        cursor_doc, Mapping) else None
    return _results_reply(server, cluster, docs, ns, size)


def gossiping(handler: Handler) -> Handler:
    """mongos advances its logical clock to the `$clusterTime` a client gossips (no key
    checks: the cluster signs nothing, as a cluster without auth)."""

    async def run(
        server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
    ) -> dict[str, Any]:
        gossip = cmd.get("$clusterTime")
        if isinstance(gossip, Mapping) and isinstance(gossip.get("clusterTime"), Timestamp):
            cluster_of(server).clock.advance_to(gossip["clusterTime"])
        reply = await handler(server, conn, cmd, db)
        _note_shard_cursor(server, reply)
        return reply

    run.__name__ = getattr(handler, "__name__", "forward")
    run.__dict__["__wrapped__"] = handler  # tables.describe names it
    return run

