"""Snapshot reads on the copy: `find` / `aggregate` with `readConcern {level: "snapshot"}` (with
or without `atClusterTime`; a driver's snapshot session sends both) on a materialized namespace
of the sidecar read the copy as it was at that time, for any time from its consistent point
(or the retained log's oldest entry) to the last applied entry, not only mongod's last
`minSnapshotHistoryWindowInSeconds`.

`distinct` too.

* No `atClusterTime`: the read is at the last applied entry's time, which the reply names as
  `cursor.atClusterTime` and `operationTime` (mongod names its read timestamp the same way),
  so `watch(start_at_operation_time=<that time + 1 increment>)` continues with every change
  after the snapshot exactly once (docs/materialize.md; `cdcserver.client.snapshot_then_watch`).
* A time before the copy's range: SnapshotTooOld (239), mongod's words. A time after the last
  applied entry but not after the tail's cluster time: the read waits for the copy (mongod
  waits for the time to be majority-committed), at most `maxTimeMS` (else 10 s, then 50
  MaxTimeMSExpired); later than the cluster time: 72, as mongod refuses it.

Everything else (another read concern, a transaction, a namespace not materialized) goes to
the upstream as before. As mongod reads:

* documents come in the collection's natural order, mongod's record order (the copy numbers
  records as they come in: the clone in the upstream's natural order, then each insert of a
  document that was not there; updates and replacements keep theirs);
* the collection's default collation applies when the command gives none (to the filter, the
  sort, `distinct`, and an aggregate's leading `$match`, as the embedded store applies it);
* `$lookup` / `$graphLookup` (also in sub-pipelines) and a top-level `$unionWith` read the
  other collection from the copy at the same time, as mongod allows in a snapshot read; the
  collection must be materialized too (else InvalidOptions, 72: the copy has nothing else);
* an aggregate with `$out` / `$merge` goes to the upstream whole (mongod 8.0 runs them at
  readConcern snapshot, reading at T and writing now; the copy cannot write).

Filters, sorts, projections and pipelines run on the embedded store's query engine. A read
holds its result in memory, as the embedded store's does. A sidecar of a sharded cluster
reads its shards' copies merged (`Copies`; sharding/sidecar.py routes the commands here).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bson.binary import Binary
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.commands import crud_common, proxy, queries, txn_rules
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.embedded import engine, query
from cdcserver.materialize.store import MIGRATED_AWAY
from cdcserver.materialize.sync import Materializer
from cdcserver.sources.mongo_tail import UpstreamOplog
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate

_DECODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(tz_aware=False)
_ZERO_SIGNATURE = {"hash": Binary(bytes(20), 0), "keyId": Int64(0)}
WAIT_S = 10.0  # a read at a time the copy has not applied yet waits this long by default
WAIT_FOR_NEWEST_S = 1.0  # a sharded read without a time: for its idle shards' promises


class Copies:
    """What a snapshot read reads: the sidecar's copy, or a sharded sidecar's copies (one per
    shard) merged: a document held by several shards' copies at T (a migration's orphan on
    the donor until its range deletion, the recipient's clone) is the one whose newest
    version at T is newest, a deletion included, a migration's deletion not (no routing
    table history is tailed: an aborted migration's clone, deleted again on the recipient,
    is the donor's own, newer, version)."""

    def __init__(self, members: Sequence[Materializer],
                 nudge: Callable[[Timestamp], None] | None = None) -> None:
        self.members = list(members)
        self.patterns = self.members[0].patterns
        # A sharded sidecar's: has idle shards promise a time (their oplogs have no entry
        # there; sharding/sidecar_nudge.py), so that their copies can be read at it.
        self.nudge = nudge

    @staticmethod
    def _high(member: Materializer, applied: Timestamp) -> Timestamp:
        """Up to when `member` can be read: past its last applied entry when it applied all
        its shard's tail delivered and the shard promised a later time (nothing there)."""
        promise = getattr(member.source, "promise_ts", None)
        latest = member.source.latest_ts()
        if callable(promise) and latest is not None and applied >= latest:
            promised = promise()
            if isinstance(promised, Timestamp) and promised > applied:
                return promised
        return applied

    def readable_range(self) -> tuple[Timestamp, Timestamp] | None:
        spans = [m.readable_range() for m in self.members]
        if any(span is None for span in spans):
            return None
        low = max(span[0] for span in spans if span is not None)
        high = min(self._high(m, span[1]) for m, span in zip(self.members, spans)
                   if span is not None)
        # (low > high: a shard's copy became consistent after another's last readable time;
        # readable once the latter's shard promises a later time.)
        return low, high

    def newest(self) -> Timestamp | None:
        """The latest time any member can be read at (a sharded read without a time is there)."""
        spans = [(m, m.readable_range()) for m in self.members]
        highs = [self._high(m, span[1]) for m, span in spans if span is not None]
        return max(highs, default=None)

    async def wait_applied(self, ts: Timestamp, timeout_s: float) -> bool:
        if len(self.members) == 1:
            return await self.members[0].wait_applied(ts, timeout_s)
        deadline = time.monotonic() + timeout_s
        if self.nudge is not None:
            self.nudge(ts)
        while True:
            span = self.readable_range()
            if span is not None and span[1] >= ts and span[0] <= span[1]:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)  # the shards' tails and copies move meanwhile

    def documents_at(self, db: str, coll: str, at: Timestamp) -> list[dict[str, Any]]:
        """db.coll's documents at `at` in mongod's natural (record) order (a sharded one's:
        shard by shard, as the mongos passes on its shards' batches)."""
        if len(self.members) == 1:
            store = self.members[0].store
            cid = store.collection_at(db, coll, at)
            return [] if cid is None else [
                bson_bytes.decode(raw, _DECODE) for raw in store.records_at(cid, at)]
        newest: dict[bytes, tuple[int, int, int, int, bytes | None]] = {}
        for shard, member in enumerate(self.members):
            cid = member.store.collection_at(db, coll, at)
            if cid is None:
                continue
            for key, vts, ord_, rec, doc in member.store.newest_at(cid, at):
                if doc is None and rec == MIGRATED_AWAY:
                    continue  # moved to another shard, which has it (or its deletion)
                held = newest.get(key)
                if held is None or (vts, ord_) > (held[0], held[1]):
                    newest[key] = (vts, ord_, shard, rec, doc)
        live = sorted((shard, rec, doc) for _, _, shard, rec, doc in newest.values()
                      if doc is not None)
        return [bson_bytes.decode(doc, _DECODE) for _, _, doc in live]

    def default_collation(self, db: str, coll: str, at: Timestamp) -> Any:
        """db.coll's default collation at `at` (None: simple), as collation_of takes it."""
        for member in self.members:
            cid = member.store.collection_at(db, coll, at)
            raw = None if cid is None else member.store.collation(cid)
            if raw is not None:
                return bson_bytes.decode(raw, _DECODE)
        return None


def materializer_of(server: ServerState) -> Materializer | None:
    oplog = server.oplog
    if not isinstance(oplog, UpstreamOplog):
        return None
    copy = oplog.images.copy
    return copy if isinstance(copy, Materializer) else None


def copies_of(server: ServerState) -> Copies | None:
    """The copy (or a sharded sidecar's copies: its oplog's `copies`, by shard name)."""
    single = materializer_of(server)
    if single is not None:
        return Copies([single])
    oplog = server.oplog
    by_shard = getattr(oplog, "copies", None)
    if not isinstance(by_shard, Mapping) or not by_shard:
        return None
    names = sorted(by_shard)
    promises = getattr(oplog, "promises", None)

    def nudge(ts: Timestamp) -> None:
        if promises is not None:
            for name in names:
                with contextlib.suppress(Exception):  # a shard gone meanwhile: no promise
                    promises.ask(name, ts, waited=False)

    return Copies([by_shard[name] for name in names], nudge)


def on_the_copy(server: ServerState, cmd: Mapping[str, Any]) -> Copies | None:
    """The copies answering this command as a snapshot read (None: the upstream's)."""
    rc = cmd.get("readConcern")
    if not isinstance(rc, Mapping) or rc.get("level") != "snapshot":
        return None
    if txn_rules.in_transaction(cmd):
        return None  # a transaction's reads belong with its writes, on the upstream
    copy = copies_of(server)
    target = cmd.get(next(iter(cmd), ""))
    db = cmd.get("$db")
    if copy is None or not isinstance(target, str) or not isinstance(db, str):
        return None
    return copy if copy.patterns.matches(db, target) else None


def route_find(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    return snapshot_find if on_the_copy(server, cmd) is not None else proxy.forward_command


def route_distinct(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    return snapshot_distinct if on_the_copy(server, cmd) is not None else proxy.forward_command


def reads_the_copy(server: ServerState, cmd: Mapping[str, Any]) -> bool:
    """An aggregate the copy answers: a snapshot read of a materialized namespace that writes
    nothing. mongod 8.0 runs `$out` / `$merge` at readConcern snapshot (reading at T, writing
    now: jstests/libs/global_snapshot_reads_util.js); the copy cannot write, so such an
    aggregate goes to the upstream whole, which runs it as mongod does (at a T in its own
    history window)."""
    if is_change_stream_aggregate(cmd) or on_the_copy(server, cmd) is None:
        return False
    pipeline = cmd.get("pipeline")
    return not (isinstance(pipeline, list) and any(
        name in ("$out", "$merge") for name, _ in _other_collections(pipeline)))


def route_aggregate(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    if reads_the_copy(server, cmd):
        return snapshot_aggregate
    return proxy.route_aggregate(server, cmd)


async def read_time(server: ServerState, copy: Copies, cmd: Mapping[str, Any]) -> Timestamp:
    """The time the read is at (checked against the copy's range; waited for if need be)."""
    rc = cmd["readConcern"]
    at = rc.get("atClusterTime")
    span = copy.readable_range()
    if span is None:
        raise MongoError(246, "the sidecar's copy of this namespace is not ready yet (its "
                         "initial sync is running): retry the snapshot read")
    low, high = span
    if at is None:
        newest = max(copy.newest() or high, low)
        if newest <= high:
            return high
        # A sharded sidecar's idle shards: promised up to the busiest one's time if they can
        # be soon; else the latest time all can be read at (a snapshot as good).
        if await copy.wait_applied(newest, WAIT_FOR_NEWEST_S):
            return newest
        if low > high:
            raise MongoError(246, "the shards' copies cannot be read at one time yet (an "
                             "idle shard has not promised a time): retry the snapshot read")
        return high
    if not isinstance(at, Timestamp):
        raise MongoError(14, "BSON field 'atClusterTime' is the wrong type, expected type "
                         "'timestamp'")
    if at < low:
        raise MongoError(239, f"Read timestamp Timestamp({at.time}, {at.inc}) is older than "
                         "the oldest available timestamp.")
    if at > high:
        hear = getattr(server.oplog, "hear", None)
        if callable(hear):  # a sharded sidecar: the client's $clusterTime gossip counts
            hear(cmd)
        now = server.oplog.cluster_time()
        if at > now:
            raise MongoError(72, "readConcern atClusterTime value must not be greater than the "
                             f"current clusterTime. Requested clusterTime: {at}; current "
                             f"clusterTime: {now}")
        max_ms = cmd.get("maxTimeMS")
        wait = max_ms / 1000 if isinstance(max_ms, (int, float)) and max_ms > 0 else WAIT_S
        if not await copy.wait_applied(at, wait):
            raise MongoError(50, "operation exceeded time limit")
    return at


def _other_collections(pipeline: list[Any]) -> list[tuple[str, Any]]:
    """(stage, collection) for every stage of `pipeline` (and of its sub-pipelines) that reads
    another collection or writes one."""
    out: list[tuple[str, Any]] = []
    for stage in pipeline:
        if not isinstance(stage, Mapping) or not stage:
            continue
        name, arg = next(iter(stage.items()))
        if name in ("$out", "$merge"):
            out.append((name, None))
        elif name in ("$lookup", "$graphLookup") and isinstance(arg, Mapping):
            out.append((name, arg.get("from")))
            if isinstance(arg.get("pipeline"), list):
                out.extend(_other_collections(arg["pipeline"]))
        elif name == "$unionWith":
            coll = arg if isinstance(arg, str) else (
                arg.get("coll") if isinstance(arg, Mapping) else None)
            out.append((name, coll))
            if isinstance(arg, Mapping) and isinstance(arg.get("pipeline"), list):
                out.extend(_other_collections(arg["pipeline"]))
        elif name == "$facet" and isinstance(arg, Mapping):
            for sub in arg.values():
                if isinstance(sub, list):
                    out.extend(_other_collections(sub))
    return out


def check_other_collections(copy: Copies, db: str, pipeline: list[Any]) -> None:
    """`$lookup` / `$graphLookup` / `$unionWith` read the copy at the same time, so the
    collection they name must be materialized too (`$out` / `$merge` never come here:
    `reads_the_copy`)."""
    for name, coll in _other_collections(pipeline):
        if name in ("$out", "$merge"):
            continue
        if isinstance(coll, str) and not copy.patterns.matches(db, coll):
            raise MongoError(72, f"{name} reads {db}.{coll}, which the sidecar does not "
                             "materialize: a snapshot read of its copy can only read "
                             "materialized collections")


async def run_pipeline(copy: Copies, db: str, docs: list[Any], stages: list[Any],
                       at: Timestamp, collation: Any, deadline: query.Deadline) -> list[Any]:
    """`stages` over `docs`, the other collections read at `at`: `$lookup` / `$graphLookup`
    through the engine's Database, a top-level `$unionWith` here (the engine has none)."""
    cache: dict[str, dict[bytes, Any]] = {}

    def resolve(name: str) -> dict[bytes, Any] | None:
        if not copy.patterns.matches(db, name):
            return None
        if name not in cache:
            cache[name] = {str(i).encode(): d
                           for i, d in enumerate(copy.documents_at(db, name, at))}
        return cache[name]

    database = engine.query_database(db, resolve)
    current = docs
    start = 0
    for i, stage in enumerate([*stages, None]):
        union = isinstance(stage, Mapping) and next(iter(stage), "") == "$unionWith"
        if stage is not None and not union:
            continue
        out: list[Any] = []
        with crud_common.engine_errors():
            await query.run_async(query.pipeline(current, database, stages[start:i], out,
                                                  collation), deadline)
        current = out
        start = i + 1
        if union:
            assert isinstance(stage, Mapping)
            arg = stage["$unionWith"]
            coll = arg if isinstance(arg, str) else (
                arg.get("coll") if isinstance(arg, Mapping) else None)
            sub = arg.get("pipeline", []) if isinstance(arg, Mapping) else []
            if not isinstance(coll, str) or not isinstance(sub, list):
                raise MongoError(40414 if coll is None else 14,
                                 "BSON field '$unionWith.coll' is missing but a required field"
                                 if coll is None else "$unionWith: 'coll' must be a string "
                                 "and 'pipeline' an array")
            current = current + await run_pipeline(
                copy, db, copy.documents_at(db, coll, at), sub, at, collation, deadline)
    return current


def _reply(server: ServerState, reply: dict[str, Any], at: Timestamp) -> dict[str, Any]:
    """The whole reply, times included: the read's time is its operationTime (the registry
    passes a RawBSONDocument reply on as it is, as it does the upstream's). mongod names it
    in the cursor (find, aggregate), beside the values (distinct)."""
    if "cursor" in reply:
        reply["cursor"]["atClusterTime"] = at
    else:
        reply["atClusterTime"] = at
    reply["ok"] = 1.0
    reply["$clusterTime"] = {"clusterTime": max(at, server.oplog.cluster_time()),
                             "signature": _ZERO_SIGNATURE}
    reply["operationTime"] = at
    # Typed as the handlers' dict (see proxy.forward_command): a RawBSONDocument in fact.
    return RawBSONDocument(bson_bytes.encode(reply), bson_bytes.RAW)  # type: ignore[return-value]


async def snapshot_find(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    copy = on_the_copy(server, cmd)
    assert copy is not None
    coll = cmd["find"]
    filter_doc, projection, skip, limit, batch_size = crud_common.find_arguments(cmd)
    at = await read_time(server, copy, cmd)
    engine.validate_filter(filter_doc or {})
    normalized = engine.normalize(dict(filter_doc or {}))
    sort_list = crud_common._sort_list(cmd.get("sort"))
    fields = dict(projection) if projection else None

    def project_one(doc: Mapping[str, Any]) -> Any:
        assert fields is not None
        return engine.project(doc, fields)

    collation = query.collation_of(cmd.get("collation"),
                                   copy.default_collation(db, coll, at), "find")
    docs = copy.documents_at(db, coll, at)
    out: list[Any] = []
    with crud_common.engine_errors():
        scan = query.find(docs, normalized, sort_list, skip, limit, out,
                          project=project_one if fields is not None else None,
                          collation=collation)
        await query.run_async(scan, query.Deadline.of(cmd))
    reply = queries.cursor_first_batch(server, f"{db}.{coll}", out, batch_size,
                                       single_batch=cmd.get("singleBatch") is True,
                                       max_time_ms=cmd.get("maxTimeMS"))
    return _reply(server, reply, at)


async def snapshot_aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    copy = on_the_copy(server, cmd)
    assert copy is not None
    coll = cmd["aggregate"]
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, "BSON field 'aggregate.pipeline' is the wrong type, expected type "
                         "'array'")
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, Mapping):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument")
    check_other_collections(copy, db, pipeline)
    batch_size = cursor_doc.get("batchSize")
    at = await read_time(server, copy, cmd)
    stages = [engine.normalize(dict(s)) if isinstance(s, Mapping) else s for s in pipeline]
    docs = copy.documents_at(db, coll, at)
    collation = query.collation_of(cmd.get("collation"),
                                   copy.default_collation(db, coll, at), "aggregate")
    deadline = query.Deadline.of(cmd)
    if stages and isinstance(stages[0], Mapping) and list(stages[0]) == ["$match"] and (
            isinstance(stages[0]["$match"], Mapping)):
        # A leading $match under the collation (as the embedded store runs one: the engine's
        # own $match compares binary).
        matched: list[Any] = []
        with crud_common.engine_errors():
            engine.validate_filter(stages[0]["$match"])
            await query.run_async(query.select(docs, stages[0]["$match"], matched,
                                               collation=collation), deadline)
        docs, stages = matched, stages[1:]
    out = await run_pipeline(copy, db, docs, stages, at, collation, deadline)
    reply = queries.cursor_first_batch(server, f"{db}.{coll}", out,
                                       batch_size if isinstance(batch_size, int) else None,
                                       max_time_ms=cmd.get("maxTimeMS"))
    return _reply(server, reply, at)


async def snapshot_distinct(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    copy = on_the_copy(server, cmd)
    assert copy is not None
    coll = cmd["distinct"]
    key = cmd.get("key")
    if not isinstance(key, str):
        raise MongoError(
            14 if key is not None else 40414,
            "BSON field 'distinct.key' is missing but a required field" if key is None else
            "BSON field 'distinct.key' is the wrong type, expected type 'string'")
    predicate = cmd.get("query")
    if predicate is not None and not isinstance(predicate, Mapping):
        raise MongoError(14, "BSON field 'distinct.query' is the wrong type, expected type "
                         "'object'")
    at = await read_time(server, copy, cmd)
    engine.validate_filter(predicate or {})
    collation = query.collation_of(cmd.get("collation"),
                                   copy.default_collation(db, coll, at), "distinct")
    docs = copy.documents_at(db, coll, at)
    matched: list[Any] = []
    values: list[Any] = []
    deadline = query.Deadline.of(cmd)
    with crud_common.engine_errors():
        await query.run_async(query.find(docs, engine.normalize(dict(predicate or {})), None, 0,
                                         0, matched, collation=collation), deadline)
        await query.run_async(query.distinct(matched, key, values, collation), deadline)
    return _reply(server, {"values": values}, at)
