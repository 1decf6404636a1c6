"""moveCollection and unshardCollection, as mongod 8.0 runs them: a resharding under
`{_id: 1}` into one chunk on the shard named (`ReshardCollectionRequest` with
`provenance: moveCollection | unshardCollection`, `shardDistribution: [toShard]`,
`forceRedistribution: true`), so crash-safe as resharding is (`migration.reshard`). The
collection gets a new UUID and becomes a tracked unsharded one: in config.collections with
`unsplittable: true` and one chunk; its documents are on that shard alone (the database's
primary keeps an empty copy, as it does of every sharded collection, for the DDL the front
sends it first; the other shards drop theirs); the shard it moved to writes the
`reshardCollection` no-op of the move's provenance.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Mapping
from typing import Any

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding import migration
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.arguments import admin_only
from cdcserver.sharding.router.moves import holder
from cdcserver.sharding.router.routing import cluster_of
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

NamespaceNotFound = 26
ShardNotFound = 70
NamespaceNotSharded = 118


def _namespace(cmd: Mapping[str, Any], name: str) -> tuple[str, str, str]:
    ns = cmd[next(iter(cmd))]
    if not isinstance(ns, str):
        raise MongoError(14, f"BSON field '{name}.{name}' is the wrong type "
                         f"'{type_name(ns)}', expected type 'string'")
    db, dot, coll = ns.partition(".")
    if not db or not dot or not coll:
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    return ns, db, coll


def _to_shard(cluster: ShardedCluster, cmd: Mapping[str, Any], name: str) -> str:
    to = cmd["toShard"]
    if not isinstance(to, str):
        raise MongoError(14, f"BSON field '{name}.toShard' is the wrong type "
                         f"'{type_name(to)}', expected type 'string'")
    found = cluster.find_shard(to)
    if found is None or found in cluster.catalog.draining:
        raise MongoError(ShardNotFound, f"Shard {to} not found")
    return found


def _least_data(cluster: ShardedCluster) -> str:
    """unshardCollection without toShard: the shard with the least data (here: documents)."""
    def held(name: str) -> int:
        store = cluster.shard(name).store
        return sum(len(store.documents(c)) for d in store.databases()
                   for c in store.collections_of(d))

    names = cluster.catalog.placement_shards()
    return min(names, key=lambda n: (held(n), names.index(n)))


async def move_to(cluster: ShardedCluster, ns: str, to: str, provenance: str) -> None:
    """`ns` resharded under `{_id: 1}` into one chunk on `to` (a tracked unsharded
    collection), once the routed operations of `ns` under way have ended."""
    catalog = cluster.catalog
    db = ns.split(".", 1)[0]
    primary = catalog.primary(db) or cluster.shards[0].name
    source = holder(cluster, ns).store.get(db, ns.split(".", 1)[1])
    options = dict(source.options) if source is not None else {}
    indexes = [dict(i) for i in (source.indexes if source is not None else [])
               if i.get("name") != "_id_"]
    async with cluster.placement.critical_section(ns):
        migration.reshard(catalog, cluster.stores(), ns, {"_id": 1}, False,
                          uuid_module.uuid4().bytes, primary, options, indexes,
                          provenance=provenance, to=to)


@command("moveCollection")
async def move_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """An unsharded collection (tracked or not) to shard `toShard`; 26 for a sharded or
    missing one."""
    admin_only("moveCollection", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    ns, dbname, coll = _namespace(cmd, "moveCollection")
    if "toShard" not in cmd:
        raise MongoError(40414, "BSON field 'moveCollection.toShard' is missing but a "
                         "required field")
    if catalog.primary(dbname) is None:
        raise MongoError(NamespaceNotFound, f"Database {dbname} not found")
    to = _to_shard(cluster, cmd, "moveCollection")
    exists = holder(cluster, ns).store.get(dbname, coll) is not None
    if not exists or (catalog.is_sharded(ns) and not catalog.is_unsplittable(ns)):
        raise MongoError(NamespaceNotFound,
                         "MoveCollection can only be called on an unsharded collection.")
    await move_to(cluster, ns, to, migration.MOVE_COLLECTION)
    return {}


@command("unshardCollection")
async def unshard_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A sharded collection onto one shard (`toShard`, else the one with the least data):
    afterwards a tracked unsharded collection there."""
    admin_only("unshardCollection", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    ns, dbname, coll = _namespace(cmd, "unshardCollection")
    if catalog.primary(dbname) is None:
        raise MongoError(NamespaceNotFound, f"Database {dbname} not found")
    to = _to_shard(cluster, cmd, "unshardCollection") if "toShard" in cmd else None
    if not catalog.is_sharded(ns) and holder(cluster, ns).store.get(dbname, coll) is None:
        raise MongoError(NamespaceNotFound, f"Collection {ns} not found")
    if not catalog.is_sharded(ns) or catalog.is_unsplittable(ns):
        raise MongoError(NamespaceNotSharded,
                         "Namespace must be sharded to perform an unshardCollection command")
    await move_to(cluster, ns, to or _least_data(cluster), migration.UNSHARD_COLLECTION)
    return {}
