"""The front's sharding commands, as mongos hands them to the config server: the shards
(listShards, addShard, removeShard), databases (enableSharding, movePrimary), sharded
collections (shardCollection, reshardCollection, refineCollectionShardKey) and their chunks
(split, moveChunk, moveRange, the balancer).

A data move (a chunk migration, movePrimary, resharding) is `sharding/migration.py`'s
crash-safe protocol, run once the routed operations of its collections under way have ended
(`cluster.placement.critical_section`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding import migration
from cdcserver.sharding.catalog import ShardingCatalog, _key_bytes
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router import config_reads
from cdcserver.sharding.router.moves import collection_like, ensure_collection_on, migrate
from cdcserver.sharding.router.routing import cluster_of, forward
from cdcserver.sharding.router.zones import balancer_round, initial_layout, reshard_zones
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


ShardNotFound = 70  # error code


def _admin_only(name: str, db: str) -> None:
    if db != "admin":
        raise MongoError(13, f"{name} may only be run against the admin database.")


@command("listShards")
async def list_shards(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("listShards", db)
    return {"shards": config_reads.shard_docs(cluster_of(server))}


@command("enableSharding", "enablesharding")
async def enable_sharding(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("enableSharding", db)
    cluster = cluster_of(server)
    name = cmd[next(iter(cmd))]
    if not isinstance(name, str) or not name:
        raise MongoError(73, f"Invalid db name specified: {name}")
    primary = cmd.get("primaryShard")
    if primary is not None:
        found = cluster.find_shard(primary)  # a name, connection string or host
        if found is None:
            raise MongoError(70, f"Shard {primary} not found")
        primary = found
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


@command("shardCollection", "shardcollection")
async def shard_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("shardCollection", db)
    cluster = cluster_of(server)
    ns, dbname, coll = _namespace_arg(cmd, next(iter(cmd)))
    key = _check_key_pattern(cmd.get("key"))
    catalog = cluster.catalog
    existing = catalog.key_pattern(ns)
    if existing is not None and not catalog.is_unsplittable(ns):
        if existing != key:
            raise MongoError(
                20, f"sharding already enabled for collection {ns} with options "
                f"{{ shardKey: {existing} }}",
            )
        return {"collectionsharded": ns}
    unique = cmd.get("unique") is True
    primary = cluster.shard(catalog.ensure_database(dbname))
    # A tracked unsharded collection is sharded where it is (moveCollection put it there).
    home = (cluster.shard(catalog.chunks[ns][0]["shard"]) if catalog.is_unsplittable(ns)
            else primary)
    c = home.store.get(dbname, coll)
    if c is None:
        await forward(cluster, home, {"create": coll}, dbname)
        c = home.store.get(dbname, coll)
        if c is None:  # (the shard's create raises when it makes no collection)
            raise MongoError(26, f"Collection {ns} not found")  # NamespaceNotFound
    empty = not home.store.documents(c)
    # An empty collection with zone ranges: a chunk per range, on its zone's shards.
    layout = initial_layout(catalog, ns, key) if empty else None
    if list(key) != ["_id"] or key["_id"] == "hashed":
        name = "_".join(f"{f}_{v}" for f, v in key.items())
        index: dict[str, Any] = {"key": key, "name": name}
        if unique:
            index["unique"] = True
        await forward(cluster, home, {"createIndexes": coll, "indexes": [index]}, dbname)
        if home is not primary and primary.store.get(dbname, coll) is not None:
            with primary.store.migrating():  # the primary's (empty) copy: internal
                await forward(cluster, primary, {"createIndexes": coll, "indexes": [index]},
                              dbname)
    catalog.shard_collection(ns, key, unique, bytes(c.uuid), home.name, layout=layout)
    if not empty:  # only an empty collection is presplit
        catalog.chunks[ns] = catalog.chunks[ns][:1]
        catalog.chunks[ns][0].update({"min": dict.fromkeys(key, MinKey()),
                                      "max": dict.fromkeys(key, MaxKey()),
                                      "shard": home.name})
        catalog.save()
    for chunk in catalog.chunks[ns]:
        ensure_collection_on(cluster, cluster.shard(chunk["shard"]), home, dbname, coll)
    # The primary shard's no-op at the commit (notifyChangeStreamsOnShardCollection): the
    # `shardCollection` event of streams with showExpandedEvents.
    store = primary.store
    with store.batch():
        store.append_oplog("n", ns, {"msg": {"shardCollection": ns}}, ui=c.ui, o2={
            "shardCollection": ns, "shardKey": key, "unique": unique,
            "presplitHashedZones": False, "capped": False,  # (8.0 writes capped too)
        })
    return {"collectionsharded": ns}


def _check_sharded(catalog: ShardingCatalog, ns: str) -> None:
    """118 NamespaceNotSharded unless `ns` is sharded (a tracked unsharded collection is
    not: its one chunk moves with moveCollection)."""
    if not catalog.is_sharded(ns) or catalog.is_unsplittable(ns):
        raise MongoError(118, f"ns {ns} is not sharded")


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


@command("split")
async def split(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("split", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, "split")
    catalog = cluster.catalog
    _check_sharded(catalog, ns)
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


@command("moveChunk", "movechunk")
async def move_chunk(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("moveChunk", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, next(iter(cmd)))
    _check_sharded(cluster.catalog, ns)
    to = cluster.find_shard(cmd.get("to"))  # a name, connection string or host
    if to is None:
        raise MongoError(ShardNotFound, f"Could not find shard {cmd.get('to')}")
    await migrate(cluster, ns, _find_chunk_arg(cluster, ns, cmd), to)
    return {"millis": 0}


@command("moveRange")
async def move_range(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("moveRange", db)
    cluster = cluster_of(server)
    ns, _, _ = _namespace_arg(cmd, "moveRange")
    _check_sharded(cluster.catalog, ns)
    to = cluster.find_shard(cmd.get("toShard"))  # a name, connection string or host
    if to is None:
        raise MongoError(ShardNotFound, f"Could not find shard {cmd.get('toShard')}")
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


# -- adding and removing shards -------------------------------------------------------------------

@command("addShard", "addshard")
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


@command("removeShard", "removeshard")
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
    for zone in catalog.shard_zones.get(name, []):  # no zone with ranges left without shards
        if catalog.shard_required_by_zone(name, zone):
            raise MongoError(163, "Operation not allowed because it would remove the only "
                             f"shard for zone {zone} which has a chunk range is associated "
                             "with it")
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


@command("movePrimary", "moveprimary")
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
    found = cluster.find_shard(to)  # a name, connection string or host
    if found is None:
        raise MongoError(ShardNotFound, f"Shard {to} not found")
    to = found
    if to == current:
        return {}
    old = cluster.shard(current)
    colls = [c.name for c in old.store.collections_of(name)
             if not catalog.is_sharded(c.ns) and not c.name.startswith("system.")]
    async with contextlib.AsyncExitStack() as held:
        for coll in colls:  # each collection's routed operations end first
            await held.enter_async_context(cluster.placement.critical_section(f"{name}.{coll}"))
        migration.move_primary(catalog, cluster.stores(), name, to, colls,
                               collection_like(cluster, old))
    # The new primary gets a copy (empty unless it owns chunks) of each tracked collection,
    # as the old one had: the front's DDL of a collection reaches the primary first.
    new = cluster.shard(to)
    for ns in [ns for ns in catalog.collections if ns.split(".", 1)[0] == name]:
        coll = ns.split(".", 1)[1]
        if old.store.get(name, coll) is not None:
            ensure_collection_on(cluster, new, old, name, coll)
    return {}


def _current_key_pattern(catalog: ShardingCatalog, ns: str, command: str) -> dict[str, Any]:
    """The shard key `ns` has now, which `command` changes; 118 NamespaceNotSharded if none."""
    old = catalog.key_pattern(ns)
    if old is None or catalog.is_unsplittable(ns):
        raise MongoError(118, f"{command} namespace {ns} is not sharded")
    return old


@command("reshardCollection")
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
    details: dict[str, Any] = {n: cmd[n] for n in ("numInitialChunks", "collation") if n in cmd}
    zones = reshard_zones(catalog, cmd["zones"], key) if cmd.get("zones") is not None else []
    layout = initial_layout(catalog, ns, key, zones) if zones else None
    async with cluster.placement.critical_section(ns):
        migration.reshard(catalog, cluster.stores(), ns, key, unique, uuid_module.uuid4().bytes,
                          primary.name, options, indexes, details=details, zones=zones,
                          layout=layout)
    return {}


@command("refineCollectionShardKey")
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

