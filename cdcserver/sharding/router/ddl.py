"""The front's DDL: create, createIndexes, collMod, renameCollection, drop, dropIndexes and
dropDatabase on the database's primary shard, and for a sharded collection also on every
other shard that has it (written as a migration's: fromMigrate, so change streams see the
primary shard's entries only); listDatabases merged from every shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.routing import cluster_of, forward, primary_shard, route, sharded_ns

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


@command("create", "createIndexes", "renameCollection", "collMod")
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
            primary = primary_shard(cluster, src_db, create=False)
            reply = await forward(cluster, primary, cmd, db)
            if cluster.catalog.is_sharded(source):
                # The other shards' part of a sharded rename is internal (fromMigrate).
                for shard in cluster.shards:
                    if shard is not primary and shard.store.get(src_db, src_coll) is not None:
                        with shard.store.migrating():
                            await forward(cluster, shard, cmd, db)
            cluster.catalog.rename_collection(source, target)
            return reply
    ns = sharded_ns(cluster, cmd, db)
    primary = primary_shard(cluster, db, create=name != "collMod")
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


@command("drop", "dropIndexes", "deleteIndexes")
async def ddl_drop(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = sharded_ns(cluster, cmd, db)
    primary = primary_shard(cluster, db, create=False)
    if ns is None:
        return await forward(cluster, primary, cmd, db)
    reply = await _on_every_shard(cluster, primary, cmd, db)
    if next(iter(cmd)) == "drop":
        cluster.catalog.drop_collection(ns)
    return reply


@command("dropDatabase")
async def drop_database(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    primary = primary_shard(cluster, db, create=False)
    reply = await forward(cluster, primary, cmd, db)
    for shard in cluster.shards:
        if shard is not primary and db in shard.store.databases():
            with shard.store.migrating():
                await forward(cluster, shard, cmd, db)
    cluster.catalog.drop_database(db)
    return reply


@command("listDatabases")
async def list_databases(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """Every shard's databases, each once."""
    return await route(server, cmd, db)  # its policy: routing.POLICIES
