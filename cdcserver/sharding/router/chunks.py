"""The router's chunk commands (mongos's cluster_split_cmd, cluster_move_chunk_cmd,
cluster_move_range_cmd): `split`, `moveChunk` and `moveRange`, their arguments checked as
mongos checks them; a move is `moves.migrate` (`migration.py`'s crash-safe protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.catalog import ShardingCatalog, _key_bytes, bound_bytes
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.arguments import (
    ShardNotFound,
    admin_only,
    check_object,
    check_sharded,
    namespace_arg,
    type_name,
)
from cdcserver.sharding.router.moves import migrate
from cdcserver.sharding.router.routing import cluster_of
from cdcserver.sharding.router.zones import balancer_round
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


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


def _is_shard_key(pattern: Mapping[str, Any], bound: Any) -> bool:
    """ShardKeyPattern::isShardKey: exactly the pattern's fields, none an array."""
    return (isinstance(bound, Mapping) and len(bound) == len(pattern)
            and all(f in bound and not isinstance(bound[f], list) for f in pattern))


def _normalized(pattern: Mapping[str, Any], bound: Mapping[str, Any]) -> dict[str, Any]:
    """normalizeShardKey: the bound's fields in the pattern's order."""
    return {f: bound[f] for f in pattern}


def _shard_key_from_query(pattern: Mapping[str, Any], query: Mapping[str, Any]
                          ) -> list[Any] | None:
    """extractShardKeyFromQuery: each field of the key an equality of the query (hashed
    fields hashed), else None (no shard key in the query)."""
    from cdcserver.sharding.catalog import hashed_value

    values = []
    for field, kind in pattern.items():
        if field not in query:
            return None
        value = query[field]
        if isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
            if list(value) != ["$eq"]:
                return None
            value = value["$eq"]
        if isinstance(value, list):
            return None
        values.append(hashed_value(value) if kind == "hashed" else value)
    return values


def _move_chunk_target(catalog: ShardingCatalog, ns: str, cmd: Mapping[str, Any]
                       ) -> dict[str, Any]:
    """cluster_move_chunk_cmd.cpp: the chunk a moveChunk names, by `find` or `bounds`."""
    pattern = catalog.key_pattern(ns) or {}
    find, bounds = cmd.get("find"), cmd.get("bounds")
    if find is not None:
        values = _shard_key_from_query(pattern, find)
        if values is None:
            raise MongoError(656450, f"no shard key found in chunk query {document_string(find)}")
        return catalog.chunk_for_values(ns, values)
    assert isinstance(bounds, list)
    low, high = bounds[0], bounds[-1]
    if not (_is_shard_key(pattern, low) and _is_shard_key(pattern, high)):
        raise MongoError(
            656451, f"shard key bounds [{document_string(low)},{document_string(high)}) are "
            f"not valid for shard key pattern {document_string(pattern)}")
    low, high = _normalized(pattern, low), _normalized(pattern, high)
    chunk = catalog.chunk_for_values(ns, list(low.values()))
    if bound_bytes(chunk["min"]) != bound_bytes(low) or bound_bytes(
            chunk["max"]) != bound_bytes(high):
        raise MongoError(656452, "no chunk found with the shard key bounds "
                         f"[{document_string(low)}, {document_string(high)})")
    return chunk


@command("split")
async def split(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    admin_only("split", db)
    cluster = cluster_of(server)
    ns, _, _ = namespace_arg(cmd, "split")
    catalog = cluster.catalog
    check_sharded(catalog, ns)
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
    admin_only("moveChunk", db)
    cluster = cluster_of(server)
    ns, _, _ = namespace_arg(cmd, next(iter(cmd)))
    # The IDL (ClusterMoveChunkRequest): `find` an object, `bounds` an array of objects.
    if cmd.get("find") is not None:
        check_object("moveChunk", "find", cmd["find"])
    bounds = cmd.get("bounds")
    if bounds is not None:
        if not isinstance(bounds, list):
            raise MongoError(14, "BSON field 'moveChunk.bounds' is the wrong type "
                             f"'{type_name(bounds)}', expected type 'array'")
        for i, bound in enumerate(bounds):
            check_object("moveChunk", f"bounds.{i}", bound)
    check_sharded(cluster.catalog, ns)
    if bounds is not None and len(bounds) != 2:
        raise MongoError(72, "bounds can only have exactly 2 elements")
    if cmd.get("find") is not None and bounds is not None:
        raise MongoError(72, "cannot specify bounds and query at the same time")
    if cmd.get("find") is None and bounds is None:
        raise MongoError(72, "need to specify query or bounds")
    to = cluster.find_shard(cmd.get("to"))  # a name, connection string or host
    if to is None:
        raise MongoError(ShardNotFound, f"Could not find shard {cmd.get('to')}")
    await migrate(cluster, ns, _move_chunk_target(cluster.catalog, ns, cmd), to)
    return {"millis": 0}


def _chunk_ending_at(catalog: ShardingCatalog, ns: str, max_bound: Mapping[str, Any]
                     ) -> dict[str, Any]:
    """balancer.cpp getChunkForMaxBound: the chunk whose max is `max_bound`, else the one
    holding it."""
    for chunk in catalog.chunks.get(ns, []):
        if bound_bytes(chunk["max"]) == bound_bytes(max_bound):
            return chunk
    return _chunk_at(catalog, ns, max_bound)


def _inside(chunk: Mapping[str, Any], point: Mapping[str, Any]) -> bool:
    """`point` strictly between the chunk's bounds (a split point of it)."""
    return bound_bytes(chunk["min"]) < bound_bytes(point) < bound_bytes(chunk["max"])


@command("moveRange")
async def move_range(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """moveRange: [min, max) moves, split off its chunk first where a bound is inside it;
    either bound may be left out (since 7.0): the other one's chunk end (min given) or start
    (max given: the chunk ending at max, balancer.cpp getChunkForMaxBound)."""
    admin_only("moveRange", db)
    cluster = cluster_of(server)
    ns, _, _ = namespace_arg(cmd, "moveRange")
    for field in ("min", "max"):
        if cmd.get(field) is not None:
            check_object("moveRange", field, cmd[field])
    check_sharded(cluster.catalog, ns)
    to = cluster.find_shard(cmd.get("toShard"))  # a name, connection string or host
    if to is None:
        raise MongoError(ShardNotFound, f"Could not find shard {cmd.get('toShard')}")
    low, high = cmd.get("min"), cmd.get("max")
    if low is None and high is None:
        raise MongoError(72, "Missing required bound: min or max")
    catalog = cluster.catalog
    pattern = catalog.key_pattern(ns) or {}
    for bound in (low, high):
        if bound is not None and not _is_shard_key(pattern, bound):
            raise MongoError(
                72, f"Range bound {document_string(bound)} is not valid for collection {ns} "
                f"with key pattern {document_string(pattern)}")
    if low is not None:
        low = _normalized(pattern, low)
        chunk = _chunk_at(catalog, ns, low)
    else:
        assert high is not None
        chunk = _chunk_ending_at(catalog, ns, _normalized(pattern, high))
        low = dict(chunk["min"])
    if high is not None:
        high = _normalized(pattern, high)
        if bound_bytes(high) <= bound_bytes(low):
            raise MongoError(72, f"Range min {document_string(low)} must be less than max "
                             f"{document_string(high)}")
        if _inside(chunk, high):
            catalog.split(ns, high)  # moves only [min, max)
    if bound_bytes(chunk["min"]) != bound_bytes(low):
        catalog.split(ns, low)
        chunk = _chunk_at(catalog, ns, low)
    await migrate(cluster, ns, chunk, to)
    return {}
