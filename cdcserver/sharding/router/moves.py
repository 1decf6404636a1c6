"""The front's side of a data move: the collection a move creates on a shard (like the one
on the database's primary), and a chunk migration run once the routed operations of its
collection under way have ended (`cluster.placement.critical_section`). The protocols
themselves are `sharding/migration.py`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcserver.embedded.store_types import Collection
from cdcserver.sharding import migration
from cdcserver.sharding.cluster import ShardedCluster

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard


def ensure_collection_on(cluster: ShardedCluster, shard: Shard, primary: Shard, db: str,
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


def collection_like(cluster: ShardedCluster, primary: Shard) -> migration.EnsureCollection:
    """A data move's target collection on a shard: like the one on `primary`."""
    return lambda shard, db, coll: ensure_collection_on(
        cluster, cluster.shard(shard), primary, db, coll)


def holder(cluster: ShardedCluster, ns: str) -> Shard:
    """The shard whose copy of `ns` a new copy is made like: the database's primary, unless
    it lacks the collection and a shard owning a chunk of it has it."""
    db, coll = ns.split(".", 1)
    primary = cluster.shard(cluster.catalog.primary(db) or cluster.shards[0].name)
    if primary.store.get(db, coll) is None:
        for chunk in cluster.catalog.chunks.get(ns, []):
            owner = cluster.shard(chunk["shard"])
            if owner.store.get(db, coll) is not None:
                return owner
    return primary


async def migrate(cluster: ShardedCluster, ns: str, chunk: dict[str, Any], to: str) -> None:
    """A chunk migration (`migration.migrate`: crash-safe; its writes are fromMigrate, no
    change-stream events), once the routed operations of `ns` under way have ended."""
    async with cluster.placement.critical_section(ns):
        migration.migrate(cluster.catalog, cluster.stores(), ns, chunk, to,
                          collection_like(cluster, holder(cluster, ns)))
