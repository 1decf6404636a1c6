"""The front's sharding commands, as mongos hands them to the config server: the shards
(listShards, addShard, removeShard), databases (enableSharding, movePrimary) and sharded
collections (shardCollection, reshardCollection, refineCollectionShardKey); their chunks
are `chunks.py`'s, zones and the balancer `zones.py`'s.

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
from cdcserver.sharding.catalog import ShardingCatalog
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router import config_reads, parameters
from cdcserver.sharding.router.arguments import (
    ShardNotFound,
    admin_only,
    check_object,
    namespace_arg,
    type_name,
)
from cdcserver.sharding.router.moves import (
    collection_like,
    ensure_collection_on,
    holder,
)
from cdcserver.sharding.router.routing import cluster_of, forward
from cdcserver.sharding.router.shard_key import (
    PLEASE_CREATE,
    check_key_pattern,
    simple_collation,
    useful_index,
)
from cdcserver.sharding.router.zones import balancer_round, initial_layout, reshard_zones
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)




@command("listShards")
async def list_shards(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    admin_only("listShards", db)
    return {"shards": config_reads.shard_docs(cluster_of(server))}


@command("enableSharding", "enablesharding")
async def enable_sharding(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    admin_only("enableSharding", db)
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


def _presplit_hashed(catalog: ShardingCatalog, count: Any
                     ) -> list[tuple[Any, Any, str]] | None:
    """`numInitialChunks` of an empty collection with a hashed key: that many chunks over
    the hash space, dealt out to the shards in turn (None: the default layout)."""
    if isinstance(count, bool) or not isinstance(count, (int, float)) or int(count) < 1:
        return None
    n = int(count)
    names = catalog.placement_shards()
    # calculateHashedSplitPoints: points symmetric about 0, an interval apart.
    interval = ((2**63 - 1) // n) * 2
    points: list[int] = []
    current = 0
    if n % 2 == 0:
        points.append(0)
        current += interval
    else:
        current += interval // 2
    for _ in range((n - 1) // 2):
        points += [current, -current]
        current += interval
    bounds: list[Any] = [MinKey(), *(Int64(p) for p in sorted(points)), MaxKey()]
    per = -(-n // len(names))  # contiguous runs, as mongod's presplit
    return [(bounds[i], bounds[i + 1], names[min(i // per, len(names) - 1)])
            for i in range(n)]


@command("shardCollection", "shardcollection")
async def shard_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """shardCollection (create_collection_coordinator.cpp, shard_key_util.cpp): the key's
    collation must be simple (given, or the collection's default), a hashed key cannot be
    unique, an index must support the key (created only on an empty collection), and a
    collection sharded already answers ok only for the same key and options."""
    admin_only("shardCollection", db)
    cluster = cluster_of(server)
    ns, dbname, coll = namespace_arg(cmd, next(iter(cmd)))
    key = check_key_pattern(cmd.get("key"))
    collation = cmd.get("collation")
    if collation is not None:
        check_object("shardCollection", "collation", collation)
        if not simple_collation(collation):
            raise MongoError(2, "The collation for shardCollection must be {locale: 'simple'}, "
                             f"but found: {document_string(collation)}")
    unique = cmd.get("unique") is True
    if unique and "hashed" in key.values():
        raise MongoError(72, "Hashed shard keys cannot be declared unique. It's possible to "
                         "ensure uniqueness on the hashed field by declaring an additional "
                         "(non-hashed) unique index on the field.")
    catalog = cluster.catalog
    existing = catalog.key_pattern(ns)
    if existing is not None and not catalog.is_unsplittable(ns):
        if existing != key or list(existing) != list(key) or (
                catalog.collections[ns].get("unique") is True) != unique:
            raise MongoError(
                20, f"sharding already enabled for collection {ns} with options "
                f"{{ shardKey: {existing} }}",
            )
        return {"collectionsharded": ns}
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
    default_collation = c.options.get("collation")
    if collation is None and not simple_collation(default_collation):
        raise MongoError(2, f"Collection has default collation: "
                         f"{document_string(default_collation or {})}. Must specify collation "
                         "{locale: 'simple'}")
    docs = list(home.store.documents(c).values())
    empty = not docs
    found, why = useful_index(ns, key, [dict(i) for i in c.indexes], docs, unique)
    if not found and not empty:
        raise MongoError(72, PLEASE_CREATE + why)
    # An empty collection with zone ranges: a chunk per range, on its zone's shards.
    layout = initial_layout(catalog, ns, key) if empty else None
    if empty and not layout and "hashed" in key.values() and "numInitialChunks" in cmd:
        layout = _presplit_hashed(catalog, cmd["numInitialChunks"])
    if not found:
        name = "_".join(f"{f}_{v}" for f, v in key.items())
        index: dict[str, Any] = {"key": key, "name": name}
        if unique:
            index["unique"] = True
        if not simple_collation(default_collation):
            index["collation"] = {"locale": "simple"}
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


# -- adding and removing shards -------------------------------------------------------------------

@command("addShard", "addshard")
async def add_shard(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """addShard: the embedded cluster can only add a shard of its own (a new embedded replica
    set, on a new loopback port); the connection string gives its name (the replica set's, as
    mongod takes it, unless `name` says otherwise)."""
    admin_only("addShard", db)
    cluster = cluster_of(server)
    target = cmd[next(iter(cmd))]
    if not isinstance(target, str):
        raise MongoError(14, "BSON field 'addShard.addShard' is the wrong type "
                         f"'{type_name(target)}', expected type 'string'")
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


@command("setFeatureCompatibilityVersion")
async def set_feature_compatibility_version(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongos hands setFeatureCompatibilityVersion to the config server, which takes every
    shard through it in phases (set_feature_compatibility_version_command.cpp's
    kStart / kPrepare / kComplete): every shard's transitional FCV document, then every
    shard's time-series conversions, then every final one. shard0 (the config server's
    part: the admin database's) goes first in each, so that a command it refuses (a version
    its release does not accept, no `confirm`, not admin) changes none. A shard's error
    comes back as it gave it, and leaves the cluster where it was: the shards that took the
    phase show its `targetVersion` (getParameter, admin.system.version), and the same
    command again finishes the transition, as mongod's retried setFCV does (each shard's
    phases are idempotent: fcv.py)."""
    cluster = cluster_of(server)
    base = {k: v for k, v in cmd.items() if k not in ("phase", "fromConfigServer")}
    for phase in ("start", "prepare", "complete"):
        for shard in list(cluster.shards):
            await forward(cluster, shard, {**base, "phase": phase, "fromConfigServer": True},
                          db)
    return {}


@command("getParameter")
async def get_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongos's own parameters (router/parameters.py), not a shard's; the FCV is no
    parameter of mongos's own: an 8.0 mongos answers its binary's (feature_compatibility_
    version.idl linked into it, whatever the cluster's FCV: SERVER-100224); from 8.3 it has
    none, so asked only that, 72 as for any unknown parameter (SERVER-118760). The cluster's
    FCV is each shard's (or admin.system.version's)."""
    reply = await parameters.get_parameter(server, conn, cmd, db)
    name = "featureCompatibilityVersion"
    if name not in reply:
        return reply
    if server.release.router_fcv_parameter:
        value: Any = {"version": server.release.fcv}
        detailed = reply[name]
        if isinstance(detailed, Mapping) and "value" in detailed:  # showDetails
            value = {**detailed, "value": value}
        reply[name] = value
        return reply
    del reply[name]
    if not any(k != "ok" for k in reply):
        raise MongoError(72, "no option found to get")
    return reply


command("setParameter")(parameters.set_parameter)


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
    admin_only("removeShard", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    name = cmd[next(iter(cmd))]
    if not isinstance(name, str):
        raise MongoError(14, "BSON field 'removeShard.removeShard' is the wrong type "
                         f"'{type_name(name)}', expected type 'string'")
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
    admin_only("movePrimary", db)
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

    admin_only("reshardCollection", db)
    cluster = cluster_of(server)
    ns, dbname, coll = namespace_arg(cmd, "reshardCollection")
    catalog = cluster.catalog
    _current_key_pattern(catalog, ns, "reshardCollection")  # 118 unless sharded
    key = check_key_pattern(cmd.get("key"))
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


def _string_arg(cmd: Mapping[str, Any], command: str, field: str) -> None:
    """An IDL `string` (or namespace) field: 14 TypeMismatch for anything else."""
    value = cmd.get(field)
    if not isinstance(value, str):
        raise MongoError(14, f"BSON field '{command}.{field}' is the wrong type "
                         f"'{type_name(value)}', expected type 'string'")


def _shard_docs(cluster: ShardedCluster, ns: str) -> list[Mapping[str, Any]]:
    """The documents of `ns` on the shards owning its chunks."""
    db, coll = ns.split(".", 1)
    docs: list[Mapping[str, Any]] = []
    for name in sorted({c["shard"] for c in cluster.catalog.chunks.get(ns, [])}):
        store = cluster.shard(name).store
        c = store.get(db, coll)
        if c is not None:
            docs.extend(store.documents(c).values())
    return docs


@command("refineCollectionShardKey")
async def refine_collection_shard_key(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """refineCollectionShardKey: mongos parses the command (its IDL: 14, 40414), the
    database must exist (26) and not be `config` (203), the collection be sharded (118), the
    new key extend the old one (72) and an index support it (72, with each index's reasons:
    it is not created); the collection then gets a new epoch and timestamp."""
    import datetime

    from bson.objectid import ObjectId
    from bson.timestamp import Timestamp

    admin_only("refineCollectionShardKey", db)
    cluster = cluster_of(server)
    _string_arg(cmd, "refineCollectionShardKey", "refineCollectionShardKey")
    if "key" not in cmd:
        raise MongoError(40414, "BSON field 'refineCollectionShardKey.key' is missing but a "
                         "required field")
    check_object("refineCollectionShardKey", "key", cmd["key"])
    ns, dbname, coll = namespace_arg(cmd, "refineCollectionShardKey")
    catalog = cluster.catalog
    if dbname == "config":
        raise MongoError(203, f"sharding not enabled for db {dbname}")  # NoShardingEnabled
    if catalog.primary(dbname) is None:
        raise MongoError(26, f"Database {dbname} not found")  # NamespaceNotFound
    old = _current_key_pattern(catalog, ns, "refineCollectionShardKey")
    key = check_key_pattern(cmd.get("key"), two_hashed_code=2)
    if list(key)[: len(old)] != list(old) or any(key[f] != old[f] for f in old):
        raise MongoError(
            72, f"refineCollectionShardKey: the proposed shard key {document_string(key)} does "
            f"not extend the current shard key {document_string(old)}",
        )
    entry = catalog.collections[ns]
    home = holder(cluster, ns)
    source = home.store.get(dbname, coll)
    indexes = [dict(i) for i in (source.indexes if source is not None else [])]
    found, why = useful_index(ns, key, indexes, _shard_docs(cluster, ns),
                              entry.get("unique") is True
                              and cmd.get("enforceUniquenessCheck") is not False,
                              check_unique_indexes=False)
    if not found:
        raise MongoError(72, PLEASE_CREATE + why)
    entry["key"] = dict(key)
    # A refine is a new version of the routing table: a new epoch and timestamp.
    entry["lastmodEpoch"] = ObjectId()
    entry["lastmod"] = datetime.datetime.now(datetime.UTC)
    previous = entry.get("timestamp")
    now = Timestamp(int(datetime.datetime.now(datetime.UTC).timestamp()), 1)
    if isinstance(previous, Timestamp) and (now.time, now.inc) <= (previous.time,
                                                                   previous.inc):
        now = Timestamp(previous.time, previous.inc + 1)
    entry["timestamp"] = now
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
