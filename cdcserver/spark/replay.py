"""`cdcserver spark-replay`: the change-stream pipeline over oplog archives, on Spark.

For one oplog (one `--oplog` with one or more files that continue each other) the output is,
event for event and byte for byte, what `cdcserver replay` writes, in the same order. Several
`--oplog` options are several shards: each shard's stream is what `cdcserver replay` gives for
that shard, and the streams are merged by resume token (`_id._data`), as mongos merges shard
streams.

How
---
1. **Plan.** Each file is cut into byte ranges (`--split-size`, default 64 MiB); a task finds
   its range's first entry itself (`splits.py`). A file is sorted by `ts`, so a range is a
   clusterTime range: partitions are clusterTime ranges without a shuffle.
2. **Scan** (one task per range, small results to the driver): where the range's entries start
   and stop, how many, first/last `ts`; the entries that transactions chain to (`o.partialTxn`,
   `o.prepare`) and the `prevOpTime`s that transaction entries point at; the entry at the
   resume point; and the range's first invalidating entry, found by running the real pipeline
   (without user stages or the resume-token check) over the range's DDL entries only.
   The driver checks that each range starts where the previous one stopped (a file that fails
   this is scanned again as one range), checks the files as `cdcserver replay` does (same
   messages), and builds each shard's `TransactionHistory` from the chain entries (fetching any
   other entry a `prevOpTime` names, so chains resolve as against the whole file).
3. **Replay** (one task per range): `ChangeStreamPipeline` — the server's own, unchanged — over
   the range's entries, with the shard's history broadcast so a transaction whose earlier
   `applyOps` links lie in other ranges unwinds whole, and prepared transactions commit with
   their `prepare` entry wherever it is.
4. **Write**: one shard is already in token order (ranges in file order); several are sorted by
   (`_id`, shard, position). Parquet with the columns of `rows.py`, or JSON lines: one canonical
   Extended JSON event per line, the very lines `cdcserver replay` writes.

The stages that carry state from one entry to the next, and how each is kept exact:

* **invalidate** (collection and database streams end at the invalidating event): the scan
  finds each range's first invalidating entry with the real stages; the driver takes the
  first one of the shard and replay tasks read nothing after it (the range holding it stops
  there by itself, as the reference does). Across shards, the merged stream ends at the first
  invalidate in token order.
* **resume** (`resumeAfter`/`startAfter`/`startAtOperationTime`): every task starts its
  pipeline at the same start time, so entries before it are skipped by the pipeline itself,
  and every event after the resume point's clusterTime sorts after the token. Whether the
  resumed-from event exists (else 280) is decided by the one entry at the resume point: the
  driver runs the pipeline over that entry first and tells the tasks (`EnsureResumeTokenPresent`
  seen the token). When it is absent, the stream fails at its first event after the resume
  point: each range's pipeline reports where it would fail and the earliest one is the error.
  `ChangeStreamHistoryLost` (286) is checked against each shard's oldest entry.

Errors: a bad file or an invalid option gives the message `cdcserver replay` gives and no
output; a pipeline error (e.g. 286 for a transaction whose chain is not in the file) fails the
job with the code, codeName and message, and writes nothing (`cdcserver replay` writes the
events it had produced before the failing batch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.spark import splits as sp
from cdcserver.spark.rows import event_row, spark_schema
from pipeline_stages.check_resumability import check_history
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import Entry, decode_entry
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import ChangeStreamSpec, parse_aggregate

log = logging.getLogger("cdcserver")

PUSH_BATCH = 1000  # entries per push, as `cdcserver replay` reads them
ARROW_BATCH = 2048  # events per Arrow record batch
_ERROR_MARK = "CDCSERVER-MONGO-ERROR:"


class ReplayError(Exception):
    """What stops a replay, with the message `cdcserver replay` would print."""


def _ts_key(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def _ts_of(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


def _mongo_message(exc: MongoError) -> str:
    return f"{exc.code} {exc.code_name}: {exc.errmsg}"


# -- the pipeline as each task builds it ---------------------------------------------------------


class RawHistory:
    """A `TransactionHistory` over the entries transactions chain to (BSON by `ts`)."""

    def __init__(self, by_ts: Mapping[int, bytes]) -> None:
        self.by_ts = by_ts

    def entry_at(self, ts: Timestamp) -> Entry | None:
        raw = self.by_ts.get(_ts_key(ts))
        return None if raw is None else decode_entry(raw)


def _probe_command(cmd: Mapping[str, Any]) -> dict[str, Any]:
    """The command without the user's stages: invalidation is decided before them."""
    return {**cmd, "pipeline": list(cmd["pipeline"][:1])}


def _is_txn_entry(entry: Entry) -> bool:
    if entry.get("op") != "c":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and ("applyOps" in o or "commitTransaction" in o)


def _prev_ref(entry: Entry) -> int | None:
    """The `ts` the entry's `prevOpTime` names, when the pipeline would follow it."""
    if entry.get("multiOpType") == 1:
        return None
    prev = entry.get("prevOpTime")
    if not isinstance(prev, Mapping):
        return None
    ts = prev.get("ts")
    if not isinstance(ts, Timestamp) or ts.time == 0:
        return None
    return _ts_key(ts)


# -- pass 1: scan -------------------------------------------------------------------------------


@dataclass(slots=True)
class ScanContext:
    cmd: dict[str, Any]
    db: str
    start: int | None  # the resume point's ts when the spec has one (same for every shard)
    probe: bool  # look for invalidating entries (collection and database streams)


def scan_split(split: sp.Split, ctx: ScanContext) -> dict[str, Any]:
    """Pass 1 over one range: its extent, its chain entries, its first invalidation."""
    meta: dict[str, Any] = {
        "key": split.key, "first": None, "stop": None, "n": 0, "lines": 0,
        "first_ts": None, "last_ts": None, "first_line": 0, "first_raw": None,
        "chain": {}, "refs": [], "start_raw": None, "probe": None, "error": None,
    }
    probe: ChangeStreamPipeline | None = None
    if ctx.probe:
        spec = parse_aggregate(_probe_command(ctx.cmd), ctx.db)
        start = _ts_of(ctx.start) if ctx.start is not None else Timestamp(0, 0)
        probe = ChangeStreamPipeline(spec, start)
        probe.ensure_token = None  # the resume point is the driver's business
    chain: dict[int, bytes] = meta["chain"]
    refs: set[int] = set()
    stats: dict[str, int] = {}
    with sp.Input(split.path) as src:
        if split.is_json:
            first = sp.find_json_start(src, split.start, split.end)
        else:
            first = sp.find_bson_start(src, split.start, split.end)
        meta["first"] = first
        if first is None:
            return meta
        n = 0
        try:
            for _offset, line, raw, entry in sp.iter_split(src, split, first, stats=stats):
                ts = entry["ts"]
                key = _ts_key(ts)
                n += 1
                if n == 1:
                    meta["first_ts"], meta["first_raw"], meta["first_line"] = key, raw, line
                meta["last_ts"] = key
                if ctx.start is not None and key == ctx.start:
                    meta["start_raw"] = raw
                if entry.get("op") != "c":
                    continue
                if _is_txn_entry(entry):
                    o = entry["o"]
                    if "partialTxn" in o or "prepare" in o:
                        chain[key] = raw
                    ref = _prev_ref(entry)
                    if ref is not None:
                        refs.add(ref)
                elif probe is not None and meta["probe"] is None:
                    try:
                        probe.push([entry])
                    except MongoError:
                        continue  # the replay raises it, if it gets that far
                    if probe.invalidated:
                        token = probe.next_batch(None).post_batch_resume_token
                        meta["probe"] = (key, token["_data"].upper())
        except sp.SplitError as exc:
            meta["error"] = {"message": exc.message, "line": exc.line}
        meta["n"] = n
    meta["stop"] = stats.get("stop", first)
    meta["lines"] = stats.get("lines", 0)
    meta["refs"] = sorted(refs)
    return meta


def fetch_entries(split: sp.Split, first: int, wanted: frozenset[int]) -> list[tuple[int, bytes]]:
    """The entries of a range whose `ts` is in `wanted` (chain links pass 1 did not keep)."""
    out = []
    with sp.Input(split.path) as src:
        for _offset, _line, raw, entry in sp.iter_split(src, split, first):
            key = _ts_key(entry["ts"])
            if key in wanted:
                out.append((key, raw))
    return out


# -- pass 2: replay -----------------------------------------------------------------------------


@dataclass(slots=True)
class ReplayTask:
    split: sp.Split
    first: int
    stop: int
    start: int  # the shard's start ts
    cut: int | None  # the shard's invalidating entry: nothing after it is read
    seq_base: int  # orders the task's events within the shard


@dataclass(slots=True)
class ReplayContext:
    cmd: dict[str, Any]
    db: str
    histories: dict[int, dict[int, bytes]]  # shard -> ts -> chain entry
    token_seen: bool  # EnsureResumeTokenPresent: the resumed-from event exists
    cut_token: str | None  # several shards: the first invalidate in token order
    shards: int


def replay_task(task: ReplayTask, ctx: ReplayContext, counts: list[int] | None = None):
    """The events of one range: (row, seq) pairs, in stream order. Raises MongoError."""
    split = task.split
    spec = parse_aggregate(ctx.cmd, ctx.db)
    start = _ts_of(task.start)
    pipeline = ChangeStreamPipeline(
        spec, start, history=RawHistory(ctx.histories.get(split.shard, {}))
    )
    if ctx.token_seen and pipeline.ensure_token is not None:
        pipeline.ensure_token.found = True
    cut = _ts_of(task.cut) if task.cut is not None else None
    cut_token = ctx.cut_token
    seq = task.seq_base
    entries = 0

    def drain() -> Iterator[tuple[RawBSONDocument, int]]:
        nonlocal seq
        while True:
            for event in pipeline.next_batch(None).events:
                if cut_token is not None and event["_id"]["_data"].upper() > cut_token:
                    continue
                seq += 1
                yield event, seq
            if not pipeline.pending_count:
                return

    batch: list[Entry] = []
    with sp.Input(split.path) as src:
        for _offset, _line, _raw, entry in sp.iter_split(src, split, task.first, task.stop):
            ts = entry["ts"]
            if ts < start:
                continue
            if cut is not None and ts > cut:
                break
            batch.append(entry)
            if len(batch) >= PUSH_BATCH:
                entries += len(batch)
                pipeline.push(batch, scanned_to=ts)
                batch = []
                yield from drain()
                if pipeline.invalidated:
                    break
        if batch and not pipeline.invalidated:
            entries += len(batch)
            pipeline.push(batch, scanned_to=batch[-1]["ts"])
            yield from drain()
    if counts is not None:
        counts[0] += entries


def _arrow_schema(with_order: bool):
    import pyarrow as pa

    fields = [
        pa.field("_id", pa.string(), False),
        pa.field("clusterTime", pa.struct([("t", pa.int64()), ("i", pa.int64())])),
        pa.field("operationType", pa.string()),
        pa.field("db", pa.string()),
        pa.field("coll", pa.string()),
        pa.field("documentKey", pa.string()),
        pa.field("event", pa.binary(), False),
        pa.field("eventJson", pa.string(), False),
    ]
    if with_order:
        fields += [pa.field("_shard", pa.int32(), False), pa.field("_seq", pa.int64(), False)]
    return pa.schema(fields)


def _spark_schema(with_order: bool):
    from pyspark.sql.types import IntegerType, LongType, StructField

    schema = spark_schema()
    if with_order:
        schema = schema.add(StructField("_shard", IntegerType(), False))
        schema = schema.add(StructField("_seq", LongType(), False))
    return schema


def _record_batches(
    tasks: Iterable[ReplayTask], ctx: ReplayContext, with_order: bool, accs: Any
) -> Iterator[Any]:
    import pyarrow as pa

    schema = _arrow_schema(with_order)
    names = schema.names

    def batch_of(rows: list[tuple]) -> pa.RecordBatch:
        columns = list(zip(*rows))
        times = columns[1]
        arrays = [
            None if i == 1 else pa.array(col, type=schema.field(i).type)
            for i, col in enumerate(columns)
        ]
        arrays[1] = pa.StructArray.from_arrays(
            [pa.array([c["t"] for c in times], pa.int64()),
             pa.array([c["i"] for c in times], pa.int64())],
            names=["t", "i"],
        )
        return pa.RecordBatch.from_arrays(arrays, names=names)

    for task in tasks:
        counts = [0]
        rows: list[tuple] = []
        events = 0
        try:
            for event, seq in replay_task(task, ctx, counts):
                row = event_row(event)
                if with_order:
                    row = (*row, task.split.shard, seq)
                rows.append(row)
                if len(rows) >= ARROW_BATCH:
                    events += len(rows)
                    yield batch_of(rows)
                    rows = []
        except MongoError as exc:
            detail = {"code": exc.code, "errmsg": exc.errmsg}
            raise RuntimeError(_ERROR_MARK + json.dumps(detail)) from None
        if rows:
            events += len(rows)
            yield batch_of(rows)
        if accs is not None:
            accs[0].add(counts[0])
            accs[1].add(events)


def _mongo_error_in(exc: BaseException) -> MongoError | None:
    """The MongoError a task raised, from the (Java) exception that failed the job."""
    text = str(exc)
    i = text.find(_ERROR_MARK)
    if i < 0:
        return None
    try:
        detail, _ = json.JSONDecoder().raw_decode(text[i + len(_ERROR_MARK) :])
    except ValueError:
        return None
    return MongoError(detail["code"], detail["errmsg"])


def dry_task(task: ReplayTask, ctx: ReplayContext) -> tuple[tuple[int, int, int], Any]:
    """The error a range's pipeline raises, without output (for the 280 decision)."""
    try:
        for _ in replay_task(task, ctx):
            pass
    except MongoError as exc:
        return task.split.key, (exc.code, exc.errmsg)
    return task.split.key, None


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class ReplaySummary:
    entries: int = 0  # entries run through the pipeline
    events: int = 0
    scanned: int = 0  # entries in the files
    splits: int = 0
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"spark-replay: {self.entries} entries read, {self.events} events written "
            f"in {self.seconds:.1f}s ({self.scanned} entries in {self.splits} splits)"
        )


@dataclass
class _Shard:
    index: int
    paths: list[str]
    splits: list[sp.Split] = field(default_factory=list)
    metas: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)
    start: Timestamp | None = None
    history: dict[int, bytes] = field(default_factory=dict)
    cut: int | None = None
    cut_token: str | None = None


def plan(shards: list[list[str]], split_size: int) -> list[_Shard]:
    out = []
    for s, paths in enumerate(shards):
        shard = _Shard(s, list(paths))
        for f, path in enumerate(paths):
            try:
                with sp.Input(path) as src:
                    size = src.size
                    is_json = sp.looks_like_json(src.read(0, 64))
            except OSError as exc:
                raise ReplayError(f"{path}: {exc.strerror or exc}") from None
            shard.splits += sp.plan_splits(s, f, path, size, is_json, split_size)
        out.append(shard)
    return out


def _verify(shard: _Shard) -> tuple[set[int], str | None]:
    """Walk the shard's ranges in order: (files whose ranges do not join up, the first error
    in file order with `cdcserver replay`'s message)."""
    broken: set[int] = set()
    prev_ts: int | None = None
    by_file: dict[int, list[sp.Split]] = {}
    for split in shard.splits:
        by_file.setdefault(split.file, []).append(split)
    for f in sorted(by_file):
        expected = 0
        lines_before = 0
        for split in by_file[f]:
            meta = shard.metas[split.key]
            first = meta["first"]
            if first is None:
                if expected < split.end:
                    broken.add(f)  # an entry should start in this range
                    break
                continue
            if first != expected:
                broken.add(f)
                break
            first_ts = meta["first_ts"]
            if first_ts is not None and prev_ts is not None and first_ts <= prev_ts:
                if split.is_json:
                    where = f"{split.path}: line {lines_before + meta['first_line']}"
                else:
                    where = f"{split.path}: byte offset {first}"
                return broken, (
                    f"{where}: entries are not in timestamp order "
                    f"({_ts_of(first_ts)} after {_ts_of(prev_ts)})"
                )
            error = meta["error"]
            if error is not None:
                message = error["message"]
                if error["line"] is not None:
                    message = message.replace(sp.LINE_MARK, str(lines_before + error["line"]))
                return broken, message
            if meta["last_ts"] is not None:
                prev_ts = meta["last_ts"]
            expected = meta["stop"]
            lines_before += meta["lines"]
    return broken, None


class SparkReplay:
    """One replay: `run(spark)` plans, scans, replays and writes; returns a summary."""

    def __init__(
        self,
        shards: list[list[str]],
        cmd: dict[str, Any],
        db: str,
        out: str,
        *,
        fmt: str = "parquet",
        split_size: int = sp.DEFAULT_SPLIT_SIZE,
        mode: str = "errorifexists",
    ) -> None:
        if fmt not in ("parquet", "jsonl"):
            raise ValueError(f"format must be parquet or jsonl, not {fmt!r}")
        if not shards or any(not paths for paths in shards):
            raise ValueError("give at least one oplog file per shard")
        self.shards_paths = shards
        self.cmd = cmd
        self.db = db
        self.out = out
        self.fmt = fmt
        self.split_size = split_size
        self.mode = mode

    def run(self, spark: Any) -> ReplaySummary:
        started = time.monotonic()
        summary = ReplaySummary()
        sc = spark.sparkContext
        try:
            spec = parse_aggregate(self.cmd, self.db)
        except MongoError as exc:
            raise ReplayError(_mongo_message(exc)) from None
        resume_ts = spec.resume_token.cluster_time if spec.resume_token is not None else None
        if resume_ts is None and spec.start_at_operation_time is not None:
            resume_ts = spec.start_at_operation_time
        scan_ctx = ScanContext(
            self.cmd, self.db, None if resume_ts is None else _ts_key(resume_ts),
            probe=spec.scope != "cluster",
        )

        # 1. plan and scan
        shards = plan(self.shards_paths, self.split_size)
        all_splits = [s for shard in shards for s in shard.splits]
        summary.splits = len(all_splits)
        metas = self._scan(sc, all_splits, scan_ctx)
        for shard in shards:
            shard.metas = {s.key: metas[s.key] for s in shard.splits}
            broken, error = _verify(shard)
            if broken:
                log.warning(
                    "spark-replay: ranges of %s do not join up; reading them as one range",
                    ", ".join(shard.paths[f] for f in sorted(broken)),
                )
                self._rescan_whole(sc, shard, broken, scan_ctx)
                broken, error = _verify(shard)
                assert not broken
            if error is not None:
                raise ReplayError(error)
            summary.scanned += sum(m["n"] for m in shard.metas.values())
        summary.timings["scan"] = time.monotonic() - started

        # 2. start points, history, resume point, invalidation
        for shard in shards:
            oldest = next(
                (
                    decode_entry(shard.metas[s.key]["first_raw"])
                    for s in shard.splits
                    if shard.metas[s.key]["n"]
                ),
                None,
            )
            if resume_ts is not None:
                shard.start = resume_ts
            elif oldest is not None:
                shard.start = oldest["ts"]
            else:
                shard.start = Timestamp(0, 1)  # an empty oplog: nothing to replay
            try:
                check_history(oldest, shard.start)
            except MongoError as exc:
                raise ReplayError(_mongo_message(exc)) from None
            for s in shard.splits:
                shard.history.update(shard.metas[s.key]["chain"])
            self._complete_history(sc, shard)
            for s in shard.splits:  # the first invalidation, in file order
                probe = shard.metas[s.key]["probe"]
                if probe is not None:
                    shard.cut, shard.cut_token = probe
                    break
        token_seen = self._resume_point(spec, shards)
        cut_token = None
        if len(shards) > 1:
            tokens = [s.cut_token for s in shards if s.cut_token is not None]
            cut_token = min(tokens) if tokens else None

        ctx = ReplayContext(
            self.cmd, self.db, {s.index: s.history for s in shards}, token_seen, cut_token,
            len(shards),
        )
        tasks = self._tasks(shards)
        if spec.resume_token is not None and not spec.resume_token.is_high_water_mark and (
            not token_seen
        ):
            # The stream fails at its first event after the resume point (280), if any.
            self._fail_at_first_event(sc, tasks, ctx)
            tasks = []  # no error: there is no event after the resume point

        # 3. replay and write
        summary.timings["plan"] = time.monotonic() - started - summary.timings["scan"]
        self._write(spark, tasks, ctx, summary)
        summary.seconds = time.monotonic() - started
        summary.timings["replay"] = summary.seconds - summary.timings["scan"] - summary.timings[
            "plan"
        ]
        return summary

    # -- steps ----------------------------------------------------------------------------------

    def _scan(
        self, sc: Any, splits: list[sp.Split], ctx: ScanContext
    ) -> dict[tuple[int, int, int], dict[str, Any]]:
        if not splits:
            return {}
        results = (
            sc.parallelize(splits, len(splits)).map(lambda s: scan_split(s, ctx)).collect()
        )
        return {m["key"]: m for m in results}

    def _rescan_whole(
        self, sc: Any, shard: _Shard, files: set[int], ctx: ScanContext
    ) -> None:
        kept = [s for s in shard.splits if s.file not in files]
        whole = []
        for f in sorted(files):
            parts = [s for s in shard.splits if s.file == f]
            last = parts[-1]
            whole.append(
                sp.Split(shard.index, f, 0, last.path, 0, last.size, last.size, last.is_json)
            )
        shard.splits = sorted(kept + whole, key=lambda s: s.key)
        shard.metas = {k: m for k, m in shard.metas.items() if k[1] not in files}
        shard.metas.update(self._scan(sc, whole, ctx))

    def _complete_history(self, sc: Any, shard: _Shard) -> None:
        """Fetch the entries `prevOpTime`s name that pass 1 did not keep (not `partialTxn` or
        `prepare` entries: unusual oplogs), until every link in the history resolves."""
        refs = {r for m in shard.metas.values() for r in m["refs"]}
        absent: set[int] = set()
        for _ in range(16):
            missing = frozenset(refs - shard.history.keys() - absent)
            if not missing:
                return
            lo, hi = min(missing), max(missing)
            targets = [
                (s, shard.metas[s.key]["first"])
                for s in shard.splits
                if shard.metas[s.key]["n"]
                and shard.metas[s.key]["first_ts"] <= hi
                and shard.metas[s.key]["last_ts"] >= lo
            ]
            found: list[tuple[int, bytes]] = []
            if targets:
                found = (
                    sc.parallelize(targets, len(targets))
                    .flatMap(lambda t, wanted=missing: fetch_entries(t[0], t[1], wanted))
                    .collect()
                )
            absent |= missing - {k for k, _ in found}
            refs = set()
            for key, raw in found:
                shard.history[key] = raw
                ref = _prev_ref(decode_entry(raw))
                if ref is not None:
                    refs.add(ref)

    def _resume_point(self, spec: ChangeStreamSpec, shards: list[_Shard]) -> bool:
        """Whether the resumed-from event is in the stream, decided by the pipeline over the
        entry at the resume point (events after that entry all sort after the token)."""
        token = spec.resume_token
        if token is None or token.is_high_water_mark:
            return False
        seen = False
        for shard in shards:
            raw = next(
                (
                    shard.metas[s.key]["start_raw"]
                    for s in shard.splits
                    if shard.metas[s.key]["start_raw"] is not None
                ),
                None,
            )
            if raw is None:
                continue
            pipeline = ChangeStreamPipeline(
                spec, token.cluster_time, history=RawHistory(shard.history)
            )
            try:
                pipeline.push([decode_entry(raw)])
            except MongoError as exc:
                raise ReplayError(_mongo_message(exc)) from None
            ensure = pipeline.ensure_token
            if ensure is None or ensure.found:
                seen = True
        return seen

    def _tasks(self, shards: list[_Shard]) -> list[ReplayTask]:
        tasks = []
        for shard in shards:
            assert shard.start is not None
            start = _ts_key(shard.start)
            for s in shard.splits:
                meta = shard.metas[s.key]
                if not meta["n"] or meta["last_ts"] < start:
                    continue
                if shard.cut is not None and meta["first_ts"] > shard.cut:
                    continue
                seq_base = (s.file << 44) | (s.index << 28)
                tasks.append(ReplayTask(s, meta["first"], meta["stop"], start, shard.cut, seq_base))
        return tasks

    def _fail_at_first_event(self, sc: Any, tasks: list[ReplayTask], ctx: ReplayContext) -> None:
        if not tasks:
            return
        results = dict(
            sc.parallelize(tasks, len(tasks)).map(lambda t: dry_task(t, ctx)).collect()
        )
        for task in tasks:
            error = results.get(task.split.key)
            if error is not None:
                raise ReplayError(_mongo_message(MongoError(*error)))

    def _write(
        self, spark: Any, tasks: list[ReplayTask], ctx: ReplayContext, summary: ReplaySummary
    ) -> None:
        import pickle

        from pyspark import StorageLevel

        sc = spark.sparkContext
        with_order = ctx.shards > 1
        accs = (sc.accumulator(0), sc.accumulator(0))
        shared = sc.broadcast(ctx)
        # One replay task per partition, in file order: partition i's events are range i's.
        blobs = [(pickle.dumps(t),) for t in tasks]
        task_df = spark.createDataFrame(sc.parallelize(blobs, max(1, len(blobs))), "task binary")

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            return _record_batches(_tasks_in(batches), shared.value, with_order, accs)

        df = task_df.mapInArrow(run, _spark_schema(with_order))
        cached = None
        if with_order:
            # Several shards: merged by token. The sort samples its input first, so the
            # events are kept rather than replayed twice.
            cached = df.persist(StorageLevel.MEMORY_AND_DISK)
            df = cached.orderBy("_id", "_shard", "_seq").drop("_shard", "_seq")
        writer = (df.select("eventJson") if self.fmt == "jsonl" else df).write.mode(self.mode)
        try:
            if self.fmt == "jsonl":
                writer.text(self.out)
            else:
                writer.parquet(self.out)
        except Exception as exc:
            error = _mongo_error_in(exc)
            if error is not None:
                raise ReplayError(_mongo_message(error)) from None
            raise
        finally:
            if cached is not None:
                cached.unpersist()
            shared.destroy()
        summary.entries = accs[0].value
        summary.events = accs[1].value


def _tasks_in(batches: Iterable[Any]) -> Iterator[ReplayTask]:
    import pickle

    for batch in batches:
        for blob in batch.column(0).to_pylist():
            yield pickle.loads(blob)


# -- command line -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `cdcserver spark-replay` (also those of `replay.py` under spark-submit)."""
    parser.add_argument(
        "--oplog", nargs="+", action="append", required=True, metavar="PATH",
        help="one oplog's files, in order; repeat --oplog for each shard of a cluster",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--format", choices=("parquet", "jsonl"), default="parquet",
        help="parquet (all columns) or jsonl (one canonical Extended JSON event per line)",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--ns", help="DB.COLL: a collection stream")
    scope.add_argument("--db", help="DB: a database stream")
    scope.add_argument("--cluster", action="store_true", help="a whole-cluster stream")
    parser.add_argument("--pipeline", help="stages after $changeStream, as a JSON array")
    parser.add_argument("--options", help="$changeStream options, as a JSON object")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, or local[*])")
    parser.add_argument(
        "--split-size", type=int, default=sp.DEFAULT_SPLIT_SIZE, metavar="BYTES",
        help="bytes of oplog per task (default 64 MiB)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the output directory if it exists"
    )


def session(master: str | None = None, app_name: str = "cdcserver spark-replay", **conf: Any):
    """A SparkSession; in local mode the workers run this interpreter (and so find cdcserver)."""
    from pyspark.sql import SparkSession

    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def run_args(args: argparse.Namespace, spark: Any = None) -> int:
    """`cdcserver spark-replay` with parsed arguments; the exit status."""
    from cdcserver.cli import _spec_command

    try:
        cmd, db = _spec_command(args)
    except ValueError as exc:
        print(f"cdcserver spark-replay: {exc}", file=sys.stderr)
        return 2
    job = SparkReplay(
        args.oplog, cmd, db, args.out, fmt=args.format, split_size=args.split_size,
        mode="overwrite" if args.overwrite else "errorifexists",
    )
    own = False
    if spark is None:
        from pyspark.sql import SparkSession

        own = SparkSession.getActiveSession() is None  # else: leave the caller's running
        spark = session(args.master)
    try:
        summary = job.run(spark)
    except ReplayError as exc:
        print(f"cdcserver spark-replay: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # Spark's own (an output that exists, a lost executor, ...)
        first = str(exc).strip().splitlines()[:1] or [type(exc).__name__]
        print(f"cdcserver spark-replay: {first[0]}", file=sys.stderr)
        return 1
    finally:
        if own:
            spark.stop()
    log.info("%s", summary.line())
    return 0


def main(argv: list[str] | None = None) -> int:
    """`spark-submit .../cdcserver/spark/replay.py --oplog ... --out ...`"""
    from cdcserver.cli import _setup_logging

    parser = argparse.ArgumentParser(
        prog="spark-replay", description="the change-stream pipeline over oplog files, on Spark"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    _setup_logging("info", "text")
    return run_args(args)


if __name__ == "__main__":
    # Under spark-submit this file is __main__: run the imported module's main, so that what
    # tasks unpickle refers to cdcserver.spark.replay (installed on the executors).
    from cdcserver.spark.replay import main as _main

    sys.exit(_main())
