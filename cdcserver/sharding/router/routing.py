"""The front's routing: the cluster a front serves, `forward` (one command on one shard, in
process), where a command goes (the database's primary shard, the one shard an equality on
the shard key targets, the shards owning a sharded collection's chunks), and the commands
whose routing is no more than that, as data: `POLICIES`, command name -> where it goes and
how the shards' replies combine (as redis-py's request/response policies).

A shard's error comes back to the client as the shard gave it (code, codeName, message,
labels): `ShardError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from cdcserver.commands.registry import run_command
from cdcserver.context import ConnectionState, ServerState
from cdcserver.sharding.catalog import _MISSING, _key_bytes, hashed_value
from cdcserver.sharding.cluster import ClusterLog, ShardedCluster
from cdcserver.sharding.router.participants import join_transaction, note_participant
from cdcserver.sharding.shard_error import ShardError
from pipeline_stages.dotted_path import document_value

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard

_REPLY_TIME_FIELDS = ("ok", "$clusterTime", "operationTime")


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
    join_transaction(cluster, shard, body)
    reply = await run_command(shard.state, shard.conn, body)
    if reply.get("ok") != 1:
        raise ShardError(reply)
    out = {k: v for k, v in reply.items() if k not in _REPLY_TIME_FIELDS}
    cursor = out.get("cursor")
    if isinstance(cursor, Mapping) and cursor.get("id"):
        cluster.cursor_owner[int(cursor["id"])] = shard.name
    note_participant(cluster, shard, cmd)
    return out


def primary_shard(cluster: ShardedCluster, db: str, create: bool) -> Shard:
    if db in ("admin", "config", "local"):
        return cluster.shards[0]
    name = cluster.catalog.ensure_database(db) if create else cluster.catalog.primary(db)
    return cluster.shard(name) if name is not None else cluster.shards[0]


async def forward_default(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongos passes a command it does not route otherwise to the database's primary shard."""
    return await route(server, cmd, db, PRIMARY)


def sharded_ns(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> str | None:
    coll = cmd.get(next(iter(cmd)))
    if not isinstance(coll, str):
        return None
    ns = f"{db}.{coll}"
    return ns if cluster.catalog.is_sharded(ns) else None


# `{locale: "simple"}`: binary comparisons, as with no collation at all.
SIMPLE_COLLATION: Mapping[str, Any] = {"locale": "simple"}


def collection_collation(cluster: ShardedCluster, ns: str) -> Mapping[str, Any] | None:
    """The collection's default collation (on its database's primary shard); None: simple."""
    db, _, coll = ns.partition(".")
    c = primary_shard(cluster, db, create=False).store.get(db, coll)
    collation = c.options.get("collation") if c is not None else None
    if isinstance(collation, Mapping) and dict(collation) != SIMPLE_COLLATION:
        return collation
    return None


def _simple_collation(cluster: ShardedCluster, ns: str, collation: Any) -> bool:
    """Whether a query's comparisons are binary (mongod's `hasSimpleCollation` in
    `ChunkManager::findIntersectingChunk`): `{locale: "simple"}`, or none given (or `{}`) on
    a collection without a default collation."""
    if isinstance(collation, Mapping) and collation:
        return dict(collation) == SIMPLE_COLLATION
    return collection_collation(cluster, ns) is None


def _collatable(value: Any) -> bool:
    """A string, an object or an array: what a collation compares differently
    (`CollationIndexKey::isCollatableType`)."""
    return isinstance(value, (str, Mapping, list, tuple))


def targeted_shard(cluster: ShardedCluster, ns: str, query: Any,
                   collation: Any = SIMPLE_COLLATION) -> Shard | None:
    """The one shard a query's equality on the whole shard key targets (None: broadcast).

    `collation`: the query's (None or `{}`: none given, so the collection's default). Under
    a non-simple one, mongos cannot target by a shard key value it compares differently (a
    string, an object, an array) nor by a hashed field (its hash may be a string's), so the
    query goes to every shard owning a chunk, as `findIntersectingChunk` refuses
    (ShardKeyNotFound) and the targeter falls back to the query's bounds, which a collation
    the shard key index does not have leaves whole."""
    if not isinstance(query, Mapping):
        return None
    pattern = cluster.catalog.key_pattern(ns) or {}
    values = []
    simple: bool | None = None  # looked up once a value needs it
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
        if kind == "hashed" or _collatable(value):
            if simple is None:
                simple = _simple_collation(cluster, ns, collation)
            if not simple:
                return None
        values.append(hashed_value(value) if kind == "hashed" else value)
    return cluster.shard(cluster.catalog.chunk_for_values(ns, values)["shard"])


def owning_shards(cluster: ShardedCluster, ns: str) -> list[Shard]:
    names = {c["shard"] for c in cluster.catalog.chunks.get(ns, [])}
    return [s for s in cluster.shards if s.name in names]


# -- routing policies -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Targets:
    """Where a command goes: `shards`; `merged` False: to one shard, whose reply is the
    answer as it is; True: the policy's merge combines the replies (of none, one or more)."""

    shards: list[Shard]
    merged: bool


Targeting = Callable[[ShardedCluster, Mapping[str, Any], str], Targets]
# (the client's command, the shards' replies in the order of `Targets.shards`) -> the reply
Merge = Callable[[Mapping[str, Any], list[dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class Policy:
    targeting: Targeting
    merge: Merge


def to_primary(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> Targets:
    """The database's primary shard (shard0 for admin, config and local)."""
    return Targets([primary_shard(cluster, db, create=False)], merged=False)


def to_owning_shards(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> Targets:
    """A sharded collection's command: every shard owning a chunk of it; else the primary."""
    ns = sharded_ns(cluster, cmd, db)
    if ns is None:
        return to_primary(cluster, cmd, db)
    return Targets(owning_shards(cluster, ns), merged=True)


def to_query_shards(field: str) -> Targeting:
    """A sharded collection's read whose filter is `cmd[field]`: the one shard its equality
    on the shard key targets (under the command's collation: `targeted_shard`), else every
    shard owning a chunk of it; an unsharded one's: the primary."""

    def targeting(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> Targets:
        ns = sharded_ns(cluster, cmd, db)
        if ns is None:
            return to_primary(cluster, cmd, db)
        shard = targeted_shard(cluster, ns, cmd.get(field), cmd.get("collation"))
        return Targets([shard] if shard is not None else owning_shards(cluster, ns),
                       merged=True)

    return targeting


def to_every_shard(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str) -> Targets:
    return Targets(cluster.shards, merged=True)


def the_reply(cmd: Mapping[str, Any], replies: list[dict[str, Any]]) -> dict[str, Any]:
    """(A policy that is never merged.)"""
    return replies[0]


def sum_of_n(cmd: Mapping[str, Any], replies: list[dict[str, Any]]) -> dict[str, Any]:
    return {"n": sum(int(reply.get("n", 0)) for reply in replies)}


def union_of_values(cmd: Mapping[str, Any], replies: list[dict[str, Any]]) -> dict[str, Any]:
    """Each value once, in the order of their keys (BSON order)."""
    seen: dict[bytes, Any] = {}
    for reply in replies:
        for value in reply.get("values", []):
            seen.setdefault(_key_bytes([value]), value)
    return {"values": [seen[k] for k in sorted(seen)]}


def last_reply(cmd: Mapping[str, Any], replies: list[dict[str, Any]]) -> dict[str, Any]:
    return replies[-1] if replies else {}


def databases_by_name(cmd: Mapping[str, Any], replies: list[dict[str, Any]]) -> dict[str, Any]:
    """Each database once (the first shard's entry), by name."""
    seen: dict[str, dict[str, Any]] = {}
    for reply in replies:
        for entry in reply.get("databases", []):
            seen.setdefault(entry["name"], entry)
    out: dict[str, Any] = {"databases": [seen[k] for k in sorted(seen)]}
    if not cmd.get("nameOnly"):
        out["totalSize"] = Int64(0)
        out["totalSizeMb"] = Int64(0)
    return out


# A command that goes nowhere else: the primary shard of its database, its reply as it is.
PRIMARY = Policy(to_primary, the_reply)
_SESSIONS = Policy(to_every_shard, last_reply)

# The commands whose routing is a policy (their handlers: `route`). The others' routing is
# their handler's own (writes by shard key, merged finds and aggregations, DDL, the
# sharding commands, transactions).
POLICIES: dict[str, Policy] = {
    "count": Policy(to_query_shards("query"), sum_of_n),
    "distinct": Policy(to_query_shards("query"), union_of_values),
    "listDatabases": Policy(to_every_shard, databases_by_name),
    "endSessions": _SESSIONS,
    "killSessions": _SESSIONS,
    "killAllSessions": _SESSIONS,
    "killAllSessionsByPattern": _SESSIONS,
    "refreshSessions": _SESSIONS,
}


async def route(server: ServerState, cmd: Mapping[str, Any], db: str,
                policy: Policy | None = None) -> dict[str, Any]:
    """`cmd` run where its policy (`POLICIES` by its name, unless given) sends it, one shard
    after the other, the replies combined by the policy's merge."""
    if policy is None:
        policy = POLICIES[next(iter(cmd))]
    cluster = cluster_of(server)
    targets = policy.targeting(cluster, cmd, db)
    if not targets.merged:
        return await forward(cluster, targets.shards[0], cmd, db)
    replies = [await forward(cluster, shard, cmd, db) for shard in targets.shards]
    return policy.merge(cmd, replies)
