"""Reads of the config server's collections through the router (`config.shards`,
`config.databases`, `config.collections`, `config.chunks`, `config.tags`): the catalog's
documents, read by `find`, `count` and `aggregate` through the query engine as any
collection's are (mongos sends them to the config server, which holds them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64

from cdcserver.embedded import engine, query
from cdcserver.sharding.cluster import ShardedCluster

CONFIG_COLLECTIONS = frozenset({"shards", "databases", "collections", "chunks", "tags"})


def shard_docs(cluster: ShardedCluster) -> list[dict[str, Any]]:
    """config.shards (and listShards)."""
    catalog = cluster.catalog
    return [
        {"_id": s.name, "host": s.host_string, "state": 1,
         "topologyTime": catalog.topology_time[s.name],
         **({"draining": True} if s.name in catalog.draining else {}),
         **({"tags": list(catalog.shard_zones[s.name])} if s.name in catalog.shard_zones
            else {})}
        for s in cluster.shards
    ]


def is_config_read(cmd: Mapping[str, Any], db: str) -> bool:
    return db == "config" and cmd.get(next(iter(cmd), "")) in CONFIG_COLLECTIONS


def _documents(cluster: ShardedCluster, name: str) -> list[dict[str, Any]]:
    catalog = cluster.catalog
    if name == "shards":
        return shard_docs(cluster)
    if name == "databases":
        return [dict(d) for d in catalog.databases.values()]
    if name == "collections":
        return [dict(c) for c in catalog.collections.values()]
    if name == "tags":
        return [dict(t) for t in catalog.tags]
    return [dict(c) for cs in catalog.chunks.values() for c in cs]


async def _run(cluster: ShardedCluster, name: str, stages: list[Any], cmd: Mapping[str, Any]
               ) -> list[Any]:
    docs = _documents(cluster, name)
    if name == "chunks":
        # (a filter may still name `ns`, as before 5.0; the documents shown do not hold it)
        match = [s for s in stages[:1] if isinstance(s, Mapping) and "$match" in s]
        if match:
            keep = engine.matcher(match[0]["$match"])
            docs, stages = [d for d in docs if keep(d)], stages[1:]
        docs = [{k: v for k, v in d.items() if k != "ns"} for d in docs]
    out: list[Any] = []
    collation = query.collation_of(cmd.get("collation"), None, "aggregate")
    await query.run_async(query.pipeline(docs, None, stages, out, collation),
                          query.Deadline.of(cmd))
    return out


def _reply(docs: list[Any], name: str) -> dict[str, Any]:
    return {"cursor": {"firstBatch": docs, "id": Int64(0), "ns": f"config.{name}"}}


async def find(cluster: ShardedCluster, cmd: Mapping[str, Any]) -> dict[str, Any]:
    """A find's filter, sort, skip, limit and projection over the catalog's documents (one
    batch: they are few)."""
    name = cmd["find"]
    stages: list[Any] = []
    if isinstance(cmd.get("filter"), Mapping) and cmd["filter"]:
        stages.append({"$match": dict(cmd["filter"])})
    if isinstance(cmd.get("sort"), Mapping) and cmd["sort"]:
        stages.append({"$sort": dict(cmd["sort"])})
    if cmd.get("skip"):
        stages.append({"$skip": int(cmd["skip"])})
    if cmd.get("limit"):
        stages.append({"$limit": abs(int(cmd["limit"]))})
    docs = await _run(cluster, name, stages, cmd)
    projection = cmd.get("projection")
    if isinstance(projection, Mapping) and projection:
        docs = [engine.project(d, projection) for d in docs]
    return _reply(docs, name)


async def count(cluster: ShardedCluster, cmd: Mapping[str, Any]) -> dict[str, Any]:
    name = cmd["count"]
    stages: list[Any] = []
    if isinstance(cmd.get("query"), Mapping) and cmd["query"]:
        stages.append({"$match": dict(cmd["query"])})
    n = len(await _run(cluster, name, stages, cmd))
    n = max(0, n - int(cmd.get("skip") or 0))
    if cmd.get("limit"):
        n = min(n, abs(int(cmd["limit"])))
    return {"n": n}


async def aggregate(cluster: ShardedCluster, cmd: Mapping[str, Any]) -> dict[str, Any]:
    name = cmd["aggregate"]
    pipeline = list(cmd.get("pipeline") or [])
    return _reply(await _run(cluster, name, pipeline, cmd), name)
