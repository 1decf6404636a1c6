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
* `$out` / `$merge` are refused with InvalidOptions (72).

Filters, sorts, projections and pipelines run on the embedded store's query engine. A read
holds its result in memory, as the embedded store's does. A sidecar of a sharded cluster
sends its snapshot reads to the mongos (each shard's copy answers images only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson.binary import Binary
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.commands import crud_common, proxy, queries, txn_rules
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.embedded import engine, query
from cdcserver.materialize.sync import Materializer
from cdcserver.sources.mongo_tail import UpstreamOplog
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate

_DECODE: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=False)
_ZERO_SIGNATURE = {"hash": Binary(bytes(20), 0), "keyId": Int64(0)}
WAIT_S = 10.0  # a read at a time the copy has not applied yet waits this long by default


def materializer_of(server: ServerState) -> Materializer | None:
    oplog = server.oplog
    if not isinstance(oplog, UpstreamOplog):
        return None
    copy = oplog.images.copy
    return copy if isinstance(copy, Materializer) else None


def on_the_copy(server: ServerState, cmd: Mapping[str, Any]) -> Materializer | None:
    """The materializer answering this command as a snapshot read (None: the upstream's)."""
    rc = cmd.get("readConcern")
    if not isinstance(rc, Mapping) or rc.get("level") != "snapshot":
        return None
    if txn_rules.in_transaction(cmd):
        return None  # a transaction's reads belong with its writes, on the upstream
    copy = materializer_of(server)
    target = cmd.get(next(iter(cmd), ""))
    db = cmd.get("$db")
    if copy is None or not isinstance(target, str) or not isinstance(db, str):
        return None
    return copy if copy.patterns.matches(db, target) else None


def route_find(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    return snapshot_find if on_the_copy(server, cmd) is not None else proxy.forward_command


def route_distinct(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    return snapshot_distinct if on_the_copy(server, cmd) is not None else proxy.forward_command


def route_aggregate(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    if not is_change_stream_aggregate(cmd) and on_the_copy(server, cmd) is not None:
        return snapshot_aggregate
    return proxy.route_aggregate(server, cmd)


async def read_time(server: ServerState, copy: Materializer, cmd: Mapping[str, Any]) -> Timestamp:
    """The time the read is at (checked against the copy's range; waited for if need be)."""
    rc = cmd["readConcern"]
    at = rc.get("atClusterTime")
    span = copy.readable_range()
    if span is None:
        raise MongoError(246, "the sidecar's copy of this namespace is not ready yet (its "
                         "initial sync is running): retry the snapshot read")
    low, high = span
    if at is None:
        return high
    if not isinstance(at, Timestamp):
        raise MongoError(14, "BSON field 'atClusterTime' is the wrong type, expected type "
                         "'timestamp'")
    if at < low:
        raise MongoError(239, f"Read timestamp Timestamp({at.time}, {at.inc}) is older than "
                         "the oldest available timestamp.")
    if at > high:
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


def documents_at(copy: Materializer, db: str, coll: str, at: Timestamp) -> list[dict[str, Any]]:
    """db.coll's documents at `at` in mongod's natural (record) order."""
    cid = copy.store.collection_at(db, coll, at)
    if cid is None:
        return []
    return [bson.decode(raw, _DECODE) for raw in copy.store.records_at(cid, at)]


def default_collation(copy: Materializer, db: str, coll: str, at: Timestamp) -> Any:
    """db.coll's default collation at `at` (None: simple), as collation_of takes it."""
    cid = copy.store.collection_at(db, coll, at)
    raw = None if cid is None else copy.store.collation(cid)
    return None if raw is None else bson.decode(raw, _DECODE)


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


def check_other_collections(copy: Materializer, db: str, pipeline: list[Any]) -> None:
    """`$out` / `$merge` are refused as mongod refuses them in a snapshot read (InvalidOptions);
    `$lookup` / `$graphLookup` / `$unionWith` read the copy at the same time, so the
    collection they name must be materialized too."""
    for name, coll in _other_collections(pipeline):
        if name in ("$out", "$merge"):
            raise MongoError(72, f"{name} cannot be used with a 'snapshot' read concern level")
        if isinstance(coll, str) and not copy.patterns.matches(db, coll):
            raise MongoError(72, f"{name} reads {db}.{coll}, which the sidecar does not "
                             "materialize: a snapshot read of its copy can only read "
                             "materialized collections")


async def run_pipeline(copy: Materializer, db: str, docs: list[Any], stages: list[Any],
                       at: Timestamp, collation: Any, deadline: query.Deadline) -> list[Any]:
    """`stages` over `docs`, the other collections read at `at`: `$lookup` / `$graphLookup`
    through the engine's Database, a top-level `$unionWith` here (the engine has none)."""
    cache: dict[str, dict[bytes, Any]] = {}

    def resolve(name: str) -> dict[bytes, Any] | None:
        if not copy.patterns.matches(db, name):
            return None
        if name not in cache:
            cache[name] = {str(i).encode(): d
                           for i, d in enumerate(documents_at(copy, db, name, at))}
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
                copy, db, documents_at(copy, db, coll, at), sub, at, collation, deadline)
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
    return RawBSONDocument(bson.encode(reply))  # type: ignore[return-value]


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
                                   default_collation(copy, db, coll, at), "find")
    docs = documents_at(copy, db, coll, at)
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
    docs = documents_at(copy, db, coll, at)
    collation = query.collation_of(cmd.get("collation"),
                                   default_collation(copy, db, coll, at), "aggregate")
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
                                   default_collation(copy, db, coll, at), "distinct")
    docs = documents_at(copy, db, coll, at)
    matched: list[Any] = []
    values: list[Any] = []
    deadline = query.Deadline.of(cmd)
    with crud_common.engine_errors():
        await query.run_async(query.find(docs, engine.normalize(dict(predicate or {})), None, 0,
                                         0, matched, collation=collation), deadline)
        await query.run_async(query.distinct(matched, key, values, collation), deadline)
    return _reply(server, {"values": values}, at)
