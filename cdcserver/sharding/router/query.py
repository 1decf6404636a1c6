"""The front's reads (mongos's src/mongo/s/query/): find, count, distinct and aggregate on
a sharded collection sent to the shards that own its chunks (or to the one shard an equality
on the shard key targets), their results merged on the front; `FrontResults` keeps merged
results for getMore, `ShardCursor` a shard's cursor read through the front. The `config.*`
collections a client reads are answered from the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from cdcserver.commands import search
from cdcserver.commands.base import family
from cdcserver.commands.registry import int_arg
from cdcserver.commands.stream_namespace import refusal, store_kind, stream_collection
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.cursors import FORWARDED, QUERY_RESULT, GetMore, HeldHere
from cdcserver.sharding.catalog import _MISSING, _key_bytes
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router import config_reads
from cdcserver.sharding.router.change_streams import open_change_stream
from cdcserver.sharding.router.merge import merge_pipeline
from cdcserver.sharding.router.routing import (
    cluster_of,
    forward,
    owning_shards,
    primary_shard,
    route,
    sharded_ns,
    targeted_shard,
)
from pipeline_stages import bson_bytes
from pipeline_stages.dotted_path import document_value
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate

if TYPE_CHECKING:
    from _typeshed import SupportsAllComparisons

    from cdcserver.sharding.cluster import Shard

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


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
        # in the find's session and transaction, as mongos sends its getMores to the shards
        session: dict[str, Any] = {k: cmd[k] for k in ("lsid", "txnNumber", "autocommit")
                                   if k in cmd}
        more = await forward(cluster, shard, {"getMore": Int64(cursor_id), "collection": coll,
                                              **session}, db)
        out.extend(more["cursor"]["nextBatch"])
        cursor_id = int(more["cursor"]["id"])
    cluster.cursor_owner.pop(int(cursor.get("id", 0)), None)
    return out


@command("find")
async def find(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    if config_reads.is_config_read(cmd, db):
        return await config_reads.find(cluster, cmd)
    ns = sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, primary_shard(cluster, db, create=False), cmd, db)
    shard = targeted_shard(cluster, ns, cmd.get("filter"), cmd.get("collation"))
    if shard is not None:
        return await forward(cluster, shard, cmd, db)
    skip = int_arg(cmd, "skip", "find", 0) or 0
    limit = int_arg(cmd, "limit", "find", 0) or 0
    sub = {k: v for k, v in cmd.items() if k not in ("skip", "limit", "batchSize",
                                                     "singleBatch")}
    if limit:
        sub["limit"] = skip + abs(limit)
    docs: list[Any] = []
    for shard in owning_shards(cluster, ns):
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
        n = len(bson_bytes.encode(docs[0]))
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
        self.finished = True  # killed on the shard here, not again by close
        self.close()
        reply = await forward(self.cluster, self.cluster.shard(self.owner),
                              {**cmd, "cursors": [Int64(self.id)]}, db)
        return bool(reply.get("cursorsKilled"))

    def close(self) -> None:
        """Forgotten here; a shard's cursor still open (the front's reaper, its shutdown) is
        killed on the shard, as mongos's ClusterCursorManager kills a cursor's remotes."""
        self.cluster.cursor_owner.pop(self.id, None)
        if self.finished:
            return
        self.finished = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (the server is gone): the shard reaps its own
        db, _, coll = self.ns.partition(".")
        task = loop.create_task(self._kill_on_shard(db, coll))
        _KILLS.add(task)
        task.add_done_callback(_KILLS.discard)

    async def _kill_on_shard(self, db: str, coll: str) -> None:
        with contextlib.suppress(MongoError):
            await forward(self.cluster, self.cluster.shard(self.owner),
                          {"killCursors": coll, "cursors": [Int64(self.id)]}, db)


# killCursors sent to shards for cursors the front closed (held until done).
_KILLS: set[asyncio.Task[None]] = set()


def note_shard_cursor(server: ServerState, reply: Mapping[str, Any]) -> None:
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


@command("count")
async def count(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """Summed over the shards owning the collection's chunks (a sharded collection's)."""
    if config_reads.is_config_read(cmd, db):
        return await config_reads.count(cluster_of(server), cmd)
    return await route(server, cmd, db)  # its policy: routing.POLICIES


@command("distinct")
async def distinct(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """Each shard's values once, in BSON order (a sharded collection's)."""
    return await route(server, cmd, db)  # its policy: routing.POLICIES


@command("aggregate")
async def aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    if not is_change_stream_aggregate(cmd):
        # mongos parses the pipeline itself: a search stage refuses there (31082, no mongot),
        # before the collection is routed.
        search.check_search_stages(cmd.get("pipeline"))
        if config_reads.is_config_read(cmd, db):
            return await config_reads.aggregate(cluster, cmd)
        ns = sharded_ns(cluster, cmd, db)
        if ns is None:
            return await forward(cluster, primary_shard(cluster, db, create=False), cmd, db)
        return await _sharded_aggregate(server, cluster, cmd, db, ns)

    async def shards_check() -> None:
        # Each shard takes the stream's namespace against its own catalog (a view lives on
        # the database's primary, a viewless collection on the shards holding it): the
        # first shard's refusal is the stream's, as mongos passes a shard's error on.
        coll = stream_collection(cmd)
        if coll is None:
            return
        raw_data = cmd.get("rawData") is True
        for shard in cluster.shards:
            error = refusal(store_kind(shard.store, db, coll), db, coll, server.release,
                            raw_data)
            if error is not None:
                raise error

    return await open_change_stream(server, cluster, cmd, db, shards_check)


# Stages a shard runs alone on its documents; the first other stage and what follows it run on
# the merger (mongos's merging half of a split pipeline).
_SHARD_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot",
                           "$replaceWith", "$unwind", "$redact"})


def _match_shards(cluster: ShardedCluster, ns: str, pipeline: list[Any], collation: Any
                  ) -> list[Shard]:
    """The shards an aggregation reads: the one its leading `$match`'s equality on the shard
    key targets (under its collation: `targeted_shard`), else every shard owning a chunk."""
    first = pipeline[0] if pipeline else None
    if isinstance(first, Mapping) and len(first) == 1 and "$match" in first:
        shard = targeted_shard(cluster, ns, first["$match"], collation)
        if shard is not None:
            return [shard]
    return owning_shards(cluster, ns)


async def _sharded_aggregate(server: ServerState, cluster: ShardedCluster, cmd: Mapping[str, Any],
                             db: str, ns: str) -> dict[str, Any]:
    pipeline = list(cmd.get("pipeline") or [])
    split = next((i for i, st in enumerate(pipeline)
                  if not isinstance(st, Mapping) or next(iter(st), "") not in _SHARD_STAGES),
                 len(pipeline))
    shard_part = {**cmd, "pipeline": pipeline[:split], "cursor": {}}
    docs: list[Any] = []
    for shard in _match_shards(cluster, ns, pipeline, cmd.get("collation")):
        docs.extend(await _drain(cluster, shard, shard_part, db))
    if split < len(pipeline):
        docs = await merge_pipeline(cluster, docs, pipeline[split:], cmd, ns)
    cursor_doc = cmd.get("cursor")
    size = int_arg(cursor_doc, "batchSize", "aggregate.cursor") if isinstance(
        cursor_doc, Mapping) else None
    return _results_reply(server, cluster, docs, ns, size)
