"""The merging half of an aggregation on a sharded collection (mongos's
`cluster_aggregation_planner` / `sharded_agg_helpers`): the stages after the shards' part
(`$group`, `$sort`, `$limit`...) run over the shards' results through the query engine's
library entry point (`embedded/query.pipeline`), as one collection's aggregation does; the
collections they read besides (`$lookup`, `$graphLookup`) are the cluster's, each document
from the shard that owns it. A final `$out` / `$merge` writes on the target's shard.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from cdcserver.embedded import engine, query
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.routing import forward, primary_shard
from pipeline_stages.errors import MongoError
from pipeline_stages.query_engine import Database

_WRITE_STAGES = ("$out", "$merge")


def cluster_database(cluster: ShardedCluster, db: str) -> Database:
    """Database `db` as the cluster holds it, for the stages that read other collections:
    a sharded collection's documents on the shards owning them (a migration's copies not
    counted twice: the ownership filter shards apply), an unsharded one's on its shard."""

    def resolve(name: str) -> OrderedDict[bytes, dict[str, Any]] | None:
        ns = f"{db}.{name}"
        catalog = cluster.catalog
        sharded = catalog.is_sharded(ns)
        shards = cluster.shards if sharded else [primary_shard(cluster, db, create=False)]
        found: OrderedDict[bytes, dict[str, Any]] | None = None
        for shard in shards:
            c = shard.store.get(db, name)
            if c is None:
                continue
            found = found if found is not None else OrderedDict()
            for key, doc in shard.store.documents(c).items():
                if not sharded or catalog.shard_for(ns, doc) == shard.name:
                    found[shard.name.encode() + b"\0" + key] = doc
        return found

    return engine.query_database(db, resolve)


def _default_collation(cluster: ShardedCluster, ns: str) -> Any:
    db, coll = ns.split(".", 1)
    for shard in cluster.shards:
        c = shard.store.get(db, coll)
        if c is not None:
            return c.options.get("collation")
    return None


async def merge_pipeline(cluster: ShardedCluster, docs: list[Any], stages: list[Any],
                         cmd: Mapping[str, Any], ns: str) -> list[Any]:
    """`stages` over `docs` (the shards' results), under the command's collation (else the
    collection's) and `let`, within its maxTimeMS; the results (none after `$out` /
    `$merge`, which wrote them)."""
    db = ns.split(".", 1)[0]
    stages = [engine.normalize(dict(s)) if isinstance(s, Mapping) else s for s in stages]
    if cmd.get("let") is not None:
        bound = engine.bind_let({"aggregate": ns.split(".", 1)[1], "pipeline": stages,
                                 "let": cmd["let"]})
        stages = list(bound["pipeline"])
    write = None
    if stages and isinstance(stages[-1], Mapping) and next(iter(stages[-1]), "") in (
        _WRITE_STAGES
    ):
        write = stages.pop()
    collation = query.collation_of(cmd.get("collation"), _default_collation(cluster, ns),
                                   "aggregate")
    deadline = query.Deadline.of(cmd)
    results: list[Any] = []
    await query.run_async(query.pipeline(docs, cluster_database(cluster, db), stages, results,
                                         collation), deadline)
    deadline.check()
    if write is not None:
        await _write_results(cluster, db, write, results)
        return []
    return results


async def _write_results(cluster: ShardedCluster, db: str, stage: Mapping[str, Any],
                         results: list[Any]) -> None:
    """`$out` / `$merge` of the merged results, run where the target lives: the shard of an
    unsharded target (its database's primary), as mongos sends the merging half there."""
    name = next(iter(stage))
    spec = stage[name]
    target_db: Any = db
    target: Any = spec if isinstance(spec, str) else None
    if isinstance(spec, Mapping):
        target = spec.get("into") if name == "$merge" else spec.get("coll")
        if name == "$out":
            target_db = spec.get("db", db)
        if isinstance(target, Mapping):
            target_db, target = target.get("db", db), target.get("coll")
    if not isinstance(target, str) or not isinstance(target_db, str):
        raise MongoError(9, f"{name} needs a target collection")
    if cluster.catalog.is_sharded(f"{target_db}.{target}"):
        # (mongos: each shard merges its own documents into the target's chunks)
        raise MongoError(20, f"cdcserver: {name} into the sharded collection "
                         f"{target_db}.{target} through the router is not supported")
    shard = primary_shard(cluster, target_db, create=True)
    await forward(cluster, shard, {"aggregate": 1, "pipeline": [
        {"$documents": results}, dict(stage)], "cursor": {}}, db)
