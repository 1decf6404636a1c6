"""`cdcserver spark-replay`: the change-stream pipeline over oplog archives, on Spark.

For one oplog (one `--oplog` with one or more files that continue each other) the output is,
event for event and byte for byte, what `cdcserver replay` writes, in the same order. Several
`--oplog` options are several shards: the output is what `cdcserver replay` gives for them,
each shard's stream merged with the others by `pipeline_stages/merge.py` (mongos's merge).

Memory is bounded by the split size, not by the archive: nothing the size of the input is
collected to the driver, broadcast, cached or sorted.

How
---
1. **Plan.** Each file is cut into byte ranges (`--split-size`, default 64 MiB); a task finds
   its range's first entry itself (`splits.py`). A file is sorted by `ts`, so a range is a
   clusterTime range.
2. **Scan** (one task per range, small results to the driver): where the range's entries start
   and stop, how many, first/last `ts`; a sparse index of (`ts`, offset) every
   `split_size / 8` bytes (segments); the transaction entries that other segments need (the
   links of chains, `o.partialTxn` / `o.prepare`, that are not committed or aborted within
   their own segment) and the `prevOpTime`s that point outside the range; the entry at the
   resume point; and the range's first invalidating entry, found by running the real pipeline
   (without user stages or the resume-token check) over the range's DDL entries only.
   The driver checks that each range starts where the previous one stopped (a file that fails
   this is scanned again as one range), checks the files as `cdcserver replay` does (same
   messages), and builds each shard's cross-segment `TransactionHistory` (fetching any other
   entry a `prevOpTime` names, so chains resolve as against the whole file).
3. **Replay** (one task per clusterTime range; one shard: one per byte range): for each shard,
   `ChangeStreamPipeline` (the server's own, unchanged) over the shard's entries in the time
   range, read from the segment where the range starts (entries before it only fill the task's
   own transaction history); the shards' streams merged in the task by `merge.py`, with each
   pipeline's post-batch resume tokens as the shards' promises. Time ranges are cut where the
   shards' segments start, about `--split-size` bytes of all shards together each, so the
   merged stream is the concatenation of the tasks' outputs: no shuffle, no sort.
4. **Write**: partition i is time range i, written in order (Parquet with the columns of
   `rows.py`, or JSON lines: one canonical Extended JSON event per line, the very lines
   `cdcserver replay` writes). The replay task writes its own part file (`output.py`: a
   staging directory, committed by the driver as Hadoop's committer does); the events never
   go to the JVM, which only schedules the tasks, so they have the cores to themselves.

The stages that carry state from one entry to the next, and how each is kept exact:

* **transactions**: a task sees every link of a chain, from the broadcast history (links in
  other segments) or from what it read itself.
* **invalidate** (collection and database streams end at the invalidating event): the scan
  finds each range's first invalidating entry with the real stages; the driver takes the
  first one of the shard and replay tasks read nothing after it. Across shards, the merged
  stream ends at the first invalidate in token order (as `cdcserver replay` of the shards).
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

import bisect
import logging
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.spark import splits as sp
from cdcserver.spark.output import Output, PartWriter, TaskOutput
from cdcserver.spark.rows import arrow_schema, event_line, event_row
from pipeline_stages.check_resumability import check_history
from pipeline_stages.errors import MongoError
from pipeline_stages.lookups import answer_from, push_answering
from pipeline_stages.merge import ShardMerge
from pipeline_stages.oplog_entry import Entry, decode_entry
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import ChangeStreamSpec, parse_aggregate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PUSH_BATCH = 1000  # entries per push, as `cdcserver replay` reads them
PUSH_BYTES = 8 * 1024 * 1024  # ... or fewer when they are large
ARROW_BATCH = 2048  # events per write (an Arrow record batch for Parquet)
ARROW_BYTES = 4 * 1024 * 1024  # ... or fewer when they are large
SEGMENTS_PER_SPLIT = 8  # index points per range: where time ranges of several shards start
SCAN_TASKS_PER_CORE = 4  # scan tasks: at most this many per core of the cluster
_END = 1 << 64  # after every ts key


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
    """A `TransactionHistory` over the transaction entries a task has (BSON by `ts`)."""

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


def _is_link(entry: Entry) -> bool:
    """An entry a later transaction entry chains to (`partialTxn` or `prepare`)."""
    o = entry.get("o")
    return isinstance(o, Mapping) and ("partialTxn" in o or "prepare" in o)


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


def _prev_any(entry: Entry) -> int | None:
    """The `prevOpTime` of any entry (an `abortTransaction` closes its chain too)."""
    prev = entry.get("prevOpTime")
    ts = prev.get("ts") if isinstance(prev, Mapping) else None
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
    segment_bytes: int = 8 * 1024 * 1024  # index points at least this far apart


def scan_split(split: sp.Split, ctx: ScanContext, counter: Any = None) -> dict[str, Any]:
    """Pass 1 over one range: its extent, index, cross-segment chain links, first invalidation."""
    cpu, began = time.process_time(), time.time()
    meta: dict[str, Any] = {
        "key": split.key, "first": None, "stop": None, "n": 0, "lines": 0,
        "first_ts": None, "last_ts": None, "first_line": 0, "index": [],
        "links": [], "terminals": [], "refs": [], "start_raw": None, "probe": None, "error": None,
    }
    probe: ChangeStreamPipeline | None = None
    if ctx.probe:
        spec = parse_aggregate(_probe_command(ctx.cmd), ctx.db)
        start = _ts_of(ctx.start) if ctx.start is not None else Timestamp(0, 0)
        probe = ChangeStreamPipeline(spec, start)
        probe.ensure_token = None  # the resume point is the driver's business
    # Links seen in this range: ts -> [offset, segment, prevOpTime ts, terminal ts]. A chain
    # committed or aborted in the segment of all its links is dropped: only that segment's
    # reader needs it, and it reads it itself.
    pending: dict[int, list[Any]] = {}
    refs: set[int] = set()
    terminals: list[tuple[int, int]] = meta["terminals"]
    stats: dict[str, int] = {}
    index: list[tuple[int, int]] = meta["index"]
    segment = -1
    segment_start = -ctx.segment_bytes
    with sp.Input(split.path) as src:
        if split.is_json:
            first = sp.find_json_start(src, split.start, split.end)
        else:
            first = sp.find_bson_start(src, split.start, split.end)
        meta["first"] = first
        if first is None:
            meta["span"] = (began, time.time())
            return meta
        n = 0
        try:
            for offset, line, raw, entry in sp.iter_split(src, split, first, stats=stats):
                ts = entry["ts"]
                key = _ts_key(ts)
                n += 1
                if n == 1:
                    meta["first_ts"], meta["first_line"] = key, line
                meta["last_ts"] = key
                if offset - segment_start >= ctx.segment_bytes:
                    segment, segment_start = segment + 1, offset
                    index.append((key, offset))
                if ctx.start is not None and key == ctx.start:
                    meta["start_raw"] = raw
                if entry.get("op") != "c":
                    continue
                o = entry.get("o")
                if _is_txn_entry(entry) or (isinstance(o, Mapping) and "abortTransaction" in o):
                    _follow_chain(entry, key, offset, segment, pending, refs, terminals)
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
        if counter is not None:
            counter.add(n)
    meta["cpu"] = time.process_time() - cpu
    meta["span"] = (began, time.time())
    meta["stop"] = stats.get("stop", first)
    meta["lines"] = stats.get("lines", 0)
    meta["links"] = [(k, o, prev, end) for k, (o, _seg, prev, end) in pending.items()]
    meta["refs"] = sorted(refs)
    return meta


def _follow_chain(
    entry: Entry,
    key: int,
    offset: int,
    segment: int,
    pending: dict[int, list[Any]],
    refs: set[int],
    terminals: list[tuple[int, int]],
) -> None:
    """Scan bookkeeping of one transaction entry (see `scan_split`): a link is kept; a commit
    or abort drops its chain when all of it is in its own segment, else marks the links it
    ends with its `ts` (and reports the part of the chain before the range)."""
    txn = _is_txn_entry(entry)
    ref = _prev_ref(entry) if txn else _prev_any(entry)
    chain: list[int] = []
    outside = None
    cur = ref
    while cur is not None:
        got = pending.get(cur)
        if got is None:
            outside = cur
            if txn:
                refs.add(cur)  # before the range: the driver resolves it
            break
        chain.append(cur)
        cur = got[2]
    if _is_link(entry):
        pending[key] = [offset, segment, ref, None]
        return
    if outside is None and all(pending[k][1] == segment for k in chain):
        for k in chain:
            del pending[k]
        return
    for k in chain:
        pending[k][3] = key
    if outside is not None:
        terminals.append((outside, key))


def fetch_entries(
    split: sp.Split, first: int, wanted: frozenset[int]
) -> list[tuple[int, int, int | None]]:
    """(ts, offset, prevOpTime ts) of the entries of a range whose `ts` is in `wanted` (links
    pass 1 did not keep: entries a `prevOpTime` names that are not `partialTxn`/`prepare`)."""
    out = []
    with sp.Input(split.path) as src:
        for offset, _line, _raw, entry in sp.iter_split(src, split, first):
            key = _ts_key(entry["ts"])
            if key in wanted:
                out.append((key, offset, _prev_ref(entry)))
    return out


def read_raw_at(src: sp.Input, split: sp.Split, offset: int) -> bytes:
    """The entry (BSON) starting at `offset` of a range."""
    for _offset, _line, raw, _entry in sp.iter_split(src, split, offset):
        return raw
    raise ValueError(f"{split.path}: no entry at {offset}")


def read_entry_at(split: sp.Split, offset: int) -> Entry | None:
    """The entry starting at `offset` of a range (the driver reads the oldest one itself)."""
    with sp.Input(split.path) as src:
        for _offset, _line, _raw, entry in sp.iter_split(src, split, offset):
            return entry
    return None


def scan_groups(splits: list[sp.Split], tasks: int) -> list[list[sp.Split]]:
    """The ranges cut into at most `tasks` runs of consecutive ranges, about equal in bytes
    (a run may span files; a scan's results are per range, whatever the grouping)."""
    tasks = max(1, min(tasks, len(splits)))
    total = sum(s.end - s.start for s in splits) or 1
    groups: list[list[sp.Split]] = [[] for _ in range(tasks)]
    done = 0
    for split in splits:
        # The group whose share of the bytes the range's middle falls in.
        middle = done + (split.end - split.start) / 2
        groups[min(tasks - 1, int(middle * tasks / total))].append(split)
        done += split.end - split.start
    return [g for g in groups if g]


# -- pass 2: replay -----------------------------------------------------------------------------


@dataclass(slots=True)
class ShardPart:
    """What a time range reads of one shard: byte ranges in order, from the segment where the
    time range starts; entries before `lo` only fill the task's history."""

    shard: int
    segments: list[tuple[sp.Split, int, int]]  # (range, first offset, stop offset)
    start: int  # the shard's start ts
    cut: int | None  # the shard's invalidating entry: nothing after it is read
    # Links before `segments` of the transactions that end in the time range (read first).
    links: list[tuple[sp.Split, int]] = field(default_factory=list)


@dataclass(slots=True)
class ReplayTask:
    index: int
    lo: int  # the time range [lo, hi) of ts keys
    hi: int
    parts: list[ShardPart]

    @property
    def key(self) -> int:
        return self.index

    @property
    def size(self) -> int:
        """Bytes of oplog the task reads (its work, roughly)."""
        return sum(stop - first for part in self.parts for _s, first, stop in part.segments)


@dataclass(slots=True)
class ReplayContext:
    cmd: dict[str, Any]
    db: str
    token_seen: bool  # EnsureResumeTokenPresent: the resumed-from event exists
    cut_token: str | None  # several shards: the first invalidate in token order
    shards: int


def _shard_batches(
    part: ShardPart, task: ReplayTask, ctx: ReplayContext, counts: list[int]
) -> Iterator[tuple[list[RawBSONDocument], dict[str, Any]]]:
    """One shard's stream over the task's time range: (events, post-batch resume token)."""
    spec = parse_aggregate(ctx.cmd, ctx.db)
    start = _ts_of(part.start)
    local: dict[int, bytes] = {}
    by_path: dict[str, list[tuple[sp.Split, int]]] = {}
    for split, offset in part.links:
        by_path.setdefault(split.path, []).append((split, offset))
    for path, links in by_path.items():
        with sp.Input(path) as src:
            for split, offset in sorted(links, key=lambda t: t[1]):
                raw = read_raw_at(src, split, offset)
                local[_ts_key(decode_entry(raw)["ts"])] = raw
    pipeline = ChangeStreamPipeline(spec, start, history=RawHistory(local))
    # A push that needs a lookup is answered from the task's history (it holds every link).
    answer = answer_from(pipeline.history, None)
    if ctx.token_seen and pipeline.ensure_token is not None:
        pipeline.ensure_token.found = True
    lo = _ts_of(max(task.lo, part.start))
    hi = task.hi
    cut = _ts_of(part.cut) if part.cut is not None else None
    batch: list[Entry] = []
    size = 0

    def drain() -> Iterator[tuple[list[RawBSONDocument], dict[str, Any]]]:
        while True:
            out = pipeline.next_batch(None)
            yield out.events, out.post_batch_resume_token
            if not pipeline.pending_count:
                return

    def entries() -> Iterator[tuple[bytes, Entry]]:
        for split, first, stop in part.segments:
            with sp.Input(split.path) as src:
                for _offset, _line, raw, entry in sp.iter_split(src, split, first, stop):
                    yield raw, entry

    for raw, entry in entries():
        ts = entry["ts"]
        if _ts_key(ts) >= hi or (cut is not None and ts > cut):
            break
        if _is_link(entry):
            local[_ts_key(ts)] = raw
        if ts < lo:
            continue
        batch.append(entry)
        size += len(raw)
        if len(batch) >= PUSH_BATCH or size >= PUSH_BYTES:
            counts[0] += len(batch)
            push_answering(pipeline, batch, ts, answer)
            batch, size = [], 0
            yield from drain()
            if pipeline.invalidated:
                return
    if batch:
        counts[0] += len(batch)
        push_answering(pipeline, batch, batch[-1]["ts"], answer)
        yield from drain()


def replay_task(
    task: ReplayTask, ctx: ReplayContext, counts: list[int] | None = None
) -> Iterator[RawBSONDocument]:
    """The events of one time range, in stream order (shards merged). Raises MongoError."""
    if counts is None:
        counts = [0]
    cut_token = ctx.cut_token
    if len(task.parts) == 1:
        for events, _token in _shard_batches(task.parts[0], task, ctx, counts):
            for event in events:
                if cut_token is not None and event["_id"]["_data"].upper() > cut_token:
                    return
                yield event
        return
    merge: ShardMerge[RawBSONDocument] = ShardMerge(p.shard for p in task.parts)
    streams: dict[Hashable, Iterator[tuple[list[RawBSONDocument], dict[str, Any]]]] = {
        p.shard: _shard_batches(p, task, ctx, counts) for p in task.parts
    }
    while not merge.exhausted:
        for event in merge:
            if cut_token is not None and event["_id"]["_data"].upper() > cut_token:
                return
            yield event
        shard = merge.blocking()
        if shard is None:
            continue
        batch = next(streams[shard], None)  # the shard that holds the merge back
        if batch is None:
            merge.close(shard)
        else:
            merge.push(shard, *batch)


def _row_batches(
    task: ReplayTask, ctx: ReplayContext, fmt: str, counts: list[int]
) -> Iterator[list[Any]]:
    """The task's events as rows (JSON lines, or `event_row` tuples), in lists of at most
    `ARROW_BATCH` rows or about `ARROW_BYTES`."""
    jsonl = fmt == "jsonl"
    rows: list[Any] = []
    size = 0
    for event in replay_task(task, ctx, counts):
        rows.append(event_line(event) + "\n" if jsonl else event_row(event))
        size += len(event.raw) * (1 if jsonl else 2)
        if len(rows) >= ARROW_BATCH or size >= ARROW_BYTES:
            yield rows
            rows, size = [], 0
    if rows:
        yield rows


def _record_batch(rows: list[Any]) -> Any:
    """A Parquet output's Arrow record batch of `event_row` tuples."""
    import pyarrow as pa

    schema = arrow_schema("parquet")
    columns = list(zip(*rows))
    arrays = [
        None if i == 1 else pa.array(col, type=schema.field(i).type)
        for i, col in enumerate(columns)
    ]
    times = columns[1]
    arrays[1] = pa.StructArray.from_arrays(
        [pa.array([c["t"] for c in times], pa.int64()),
         pa.array([c["i"] for c in times], pa.int64())],
        names=["t", "i"],
    )
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def write_task(
    task: ReplayTask, ctx: ReplayContext, fmt: str, out: str, job: str, attempt: int,
    accs: Any = None,
) -> TaskOutput:
    """Replay one time range into its own file in the staging directory (`output.py`)."""
    cpu, began = time.process_time(), time.time()
    counts = [0]
    events = 0
    writer = PartWriter(out, job, task.index, attempt, fmt)
    try:
        for rows in _row_batches(task, ctx, fmt, counts):
            events += len(rows)
            if fmt == "jsonl":
                writer.write_lines("".join(rows).encode())
            else:
                writer.write_batch(_record_batch(rows))
        name = writer.close()
    except MongoError as exc:
        # Returned, not raised: the job's error is the one of the earliest time range that
        # fails (as `cdcserver replay` meets it), whatever order the tasks ran in.
        writer.discard()
        return TaskOutput(task.index, None, counts[0], events, time.process_time() - cpu,
                          (exc.code, exc.errmsg), (began, time.time()))
    except BaseException:
        writer.discard()
        raise
    if accs is not None:
        accs[0].add(counts[0])
        accs[1].add(events)
    return TaskOutput(
        task.index, name, counts[0], events, time.process_time() - cpu, None,
        (began, time.time()),
    )


def dry_task(task: ReplayTask, ctx: ReplayContext) -> tuple[int, Any]:
    """The error a range's pipeline raises, without output (for the 280 decision)."""
    try:
        for _ in replay_task(task, ctx):
            pass
    except MongoError as exc:
        return task.key, (exc.code, exc.errmsg)
    return task.key, None


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class ReplaySummary:
    entries: int = 0  # entries run through the pipeline
    events: int = 0
    scanned: int = 0  # entries in the files
    splits: int = 0
    tasks: int = 0  # replay tasks (time ranges)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # The CPU seconds of each task's Python (its process time), by phase, in task order:
    # what the job would take on idle cores, apart from Spark's own work.
    task_cpu: dict[str, list[float]] = field(default_factory=dict)
    # Wall-clock marks of each Spark job (time.time()): submitted, its first task started,
    # its last task ended, results back on the driver; and the driver's own steps after it.
    spans: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"spark-replay: {self.entries} entries read, {self.events} events written "
            f"in {self.seconds:.1f}s ({self.scanned} entries in {self.splits} splits)"
        )

    def cpu_line(self) -> str:
        """The tasks' CPU by phase: `scan 16 tasks 1.20s (longest 0.10s), ...`."""
        return "spark-replay: task CPU: " + ", ".join(
            f"{phase} {len(cpu)} tasks {sum(cpu):.2f}s (longest {max(cpu):.2f}s)"
            for phase, cpu in self.task_cpu.items() if cpu
        )

    def phase_line(self) -> str:
        """Where the job's seconds went: per Spark job, the wait for its first task, the
        tasks, and the wait for the results; the driver's own steps (`plan`, `commit`)."""
        parts = []
        for phase, value in self.timings.items():
            span = self.spans.get(phase)
            if span is None:
                parts.append(f"{phase} {value:.2f}s")
                continue
            submitted, first, last, back = span
            parts.append(
                f"{phase} {value:.2f}s (first task after {first - submitted:.2f}s, tasks "
                f"{last - first:.2f}s, results after {back - last:.2f}s)"
            )
        return "spark-replay: phases: " + ", ".join(parts)


@dataclass
class _Shard:
    index: int
    paths: list[str]
    splits: list[sp.Split] = field(default_factory=list)
    metas: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)
    start: Timestamp | None = None
    # Transaction links other segments need: ts -> [range, offset, prevOpTime ts, ending ts]
    links: dict[int, list[Any]] = field(default_factory=dict)
    split_of: dict[tuple[int, int, int], sp.Split] = field(default_factory=dict)
    by_end: list[tuple[int, int]] = field(default_factory=list)  # (ending ts, link ts)
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
                    where = f"{split.path}:{lines_before + meta['first_line']}"
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


def time_ranges(shards: list[_Shard], target_bytes: int) -> list[tuple[int, int]]:
    """Time ranges [lo, hi) of ts keys. One shard: its byte ranges. Several: about
    `target_bytes` of all shards together each, cut where some shard's segment starts."""
    if len(shards) == 1:
        keys = [
            shards[0].metas[s.key]["first_ts"]
            for s in shards[0].splits
            if shards[0].metas[s.key]["n"]
        ]
        return list(zip([0, *keys[1:]], [*keys[1:], _END])) if keys else []
    points: list[tuple[int, int]] = []  # (ts key, bytes from there to the next point)
    for shard in shards:
        for s in shard.splits:
            meta = shard.metas[s.key]
            if not meta["n"]:
                continue
            index = meta["index"]
            ends = [o for _, o in index[1:]] + [meta["stop"]]
            points += [(k, end - o) for (k, o), end in zip(index, ends)]
    if not points:
        return []
    points.sort()
    cuts: list[int] = []
    acc = 0
    for k, n in points:
        if acc >= target_bytes and (not cuts or k > cuts[-1]) and k > 0:
            cuts.append(k)
            acc = 0
        acc += n
    return list(zip([0, *cuts], [*cuts, _END]))


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
        progress: Callable[[str, int, int, int, float], None] | None = None,
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
        # progress(phase, tasks done, tasks, entries so far, seconds in the phase): called
        # from a watcher thread
        self.progress = progress
        self.progress_interval = 5.0
        # (phase, tasks, entry counter, when it started)
        self._phase: tuple[str, int, Any, float] | None = None

    def run(self, spark: Any) -> ReplaySummary:
        started = time.monotonic()
        self._spans: list[tuple[float, list[tuple[float, float]], float]] = []
        self._mark = started
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
            segment_bytes=max(64 * 1024, self.split_size // SEGMENTS_PER_SPLIT),
        )
        output = Output(self.out, self.mode, self.fmt)
        try:
            output.setup()
        except FileExistsError as exc:
            raise ReplayError(str(exc)) from None
        watcher = _Watcher(sc, self, self.progress_interval) if self.progress is not None else None
        try:
            self._run(spark, sc, spec, resume_ts, scan_ctx, summary, started, output)
        except BaseException:
            output.abort()
            raise
        finally:
            if watcher is not None:
                watcher.stop()
        return summary

    def _run(
        self, spark: Any, sc: Any, spec: ChangeStreamSpec, resume_ts: Timestamp | None,
        scan_ctx: ScanContext, summary: ReplaySummary, started: float, output: Output,
    ) -> None:
        # 1. plan and scan
        shards = plan(self.shards_paths, self.split_size)
        all_splits = [s for shard in shards for s in shard.splits]
        summary.splits = len(all_splits)
        metas = self._scan(sc, all_splits, scan_ctx)
        summary.task_cpu["scan"] = [metas[s.key].get("cpu", 0.0) for s in all_splits]
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
        summary.spans["scan"] = _span(
            self._spans[0][0], [t for _, spans, _ in self._spans for t in spans],
            self._spans[-1][2],
        ) if self._spans else (0.0, 0.0, 0.0, 0.0)

        # 2. start points, history, resume point, invalidation
        for shard in shards:
            first = next((s for s in shard.splits if shard.metas[s.key]["n"]), None)
            oldest = None
            if first is not None:
                oldest = read_entry_at(first, shard.metas[first.key]["first"])
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
            self._links(sc, shard)
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

        ctx = ReplayContext(self.cmd, self.db, token_seen, cut_token, len(shards))
        tasks = self._tasks(shards)
        summary.tasks = len(tasks)
        if spec.resume_token is not None and not spec.resume_token.is_high_water_mark and (
            not token_seen
        ):
            # The stream fails at its first event after the resume point (280), if any.
            self._fail_at_first_event(sc, tasks, ctx)
            tasks = []  # no error: there is no event after the resume point

        # 3. replay and write
        summary.timings["plan"] = time.monotonic() - started - summary.timings["scan"]
        self._mark = time.monotonic()
        self._write(spark, tasks, ctx, summary, output)
        summary.seconds = time.monotonic() - started

    # -- steps ----------------------------------------------------------------------------------

    def _scan(
        self, sc: Any, splits: list[sp.Split], ctx: ScanContext
    ) -> dict[tuple[int, int, int], dict[str, Any]]:
        if not splits:
            return {}
        counter = sc.accumulator(0)
        self._phase = ("scan", len(splits), counter, time.monotonic())
        sc.setJobGroup("cdcserver-scan", "spark-replay: scan")
        submitted = time.time()
        # Consecutive ranges of a file share a task, a few tasks per core: a scan task is
        # short (its CPU is mostly decoding the entries' top level), so Spark's cost per task
        # (~50 ms: scheduling, the JVM/Python hand-off) weighed as much as the scan itself.
        groups = scan_groups(splits, SCAN_TASKS_PER_CORE * max(1, sc.defaultParallelism))
        results = (
            sc.parallelize(groups, len(groups))
            .flatMap(lambda group: [scan_split(s, ctx, counter) for s in group])
            .collect()
        )
        self._spans.append((submitted, [m["span"] for m in results], time.time()))
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

    def _links(self, sc: Any, shard: _Shard) -> None:
        """The shard's cross-segment links, each with the `ts` of the entry that ends its
        transaction: the scan's, then the entries `prevOpTime`s name that it did not keep
        (unusual oplogs), until every chain resolves."""
        links = shard.links
        shard.split_of = {s.key: s for s in shard.splits}
        terminals: list[tuple[int, int]] = []
        refs: set[int] = set()
        for s in shard.splits:
            meta = shard.metas[s.key]
            for k, offset, prev, end in meta["links"]:
                links[k] = [s.key, offset, prev, end]
            terminals += meta["terminals"]
            refs.update(meta["refs"])
        absent: set[int] = set()
        for _ in range(16):
            missing = frozenset(refs - links.keys() - absent)
            if not missing:
                break
            lo, hi = min(missing), max(missing)
            targets = [
                (s, shard.metas[s.key]["first"])
                for s in shard.splits
                if shard.metas[s.key]["n"]
                and shard.metas[s.key]["first_ts"] <= hi
                and shard.metas[s.key]["last_ts"] >= lo
            ]
            found: list[tuple[tuple[int, int, int], int, int, int | None]] = []
            if targets:
                found = (
                    sc.parallelize(targets, len(targets))
                    .flatMap(
                        lambda t, wanted=missing: [
                            (t[0].key, *f) for f in fetch_entries(t[0], t[1], wanted)
                        ]
                    )
                    .collect()
                )
            absent |= missing - {k for _, k, _, _ in found}
            refs = set()
            for split_key, k, offset, prev in found:
                links[k] = [split_key, offset, prev, None]
                if prev is not None:
                    refs.add(prev)
        for ref, end in terminals:  # chains ended in a later range
            cur: int | None = ref
            while cur is not None and cur in links:
                links[cur][3] = end
                cur = links[cur][2]
        # A link nothing ends (a prepared transaction never committed) no range needs.
        shard.by_end = sorted((e, k) for k, (_s, _o, _p, e) in links.items() if e is not None)

    def _links_for(self, shard: _Shard, lo: int, hi: int) -> list[Any]:
        """The kept links of the transactions that end in [lo, hi) (those the task reads in
        its own segments too: an entry a `prevOpTime` names need not be a link)."""
        i = bisect.bisect_left(shard.by_end, (lo, -1))
        j = bisect.bisect_left(shard.by_end, (hi, -1))
        out = []
        for _end, k in shard.by_end[i:j]:
            split_key, offset = shard.links[k][:2]
            out.append((shard.split_of[split_key], offset))
        return out

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
            entry = decode_entry(raw)
            local = self._chain_of(shard, entry) if _is_txn_entry(entry) else {}
            pipeline = ChangeStreamPipeline(spec, token.cluster_time, history=RawHistory(local))
            try:
                pipeline.push([entry])
            except MongoError as exc:
                raise ReplayError(_mongo_message(exc)) from None
            ensure = pipeline.ensure_token
            if ensure is None or ensure.found:
                seen = True
        return seen

    def _chain_of(self, shard: _Shard, entry: Entry) -> dict[int, bytes]:
        """The links of one transaction entry's chain, read on the driver."""
        out: dict[int, bytes] = {}
        ref = _prev_ref(entry)
        while ref is not None and ref not in out:
            link = shard.links.get(ref)
            split: sp.Split | None
            if link is not None:
                split = shard.split_of[link[0]]
                with sp.Input(split.path) as src:
                    out[ref] = read_raw_at(src, split, link[1])
            else:  # in the segment of the entry: not among the kept links
                split = next(
                    (s for s in shard.splits
                     if shard.metas[s.key]["n"] and shard.metas[s.key]["first_ts"] <= ref
                     <= shard.metas[s.key]["last_ts"]),
                    None,
                )
                if split is None:
                    break
                first = shard.metas[split.key]["first"]
                found = fetch_entries(split, first, frozenset([ref]))
                if not found:
                    break
                with sp.Input(split.path) as src:
                    out[ref] = read_raw_at(src, split, found[0][1])
            ref = _prev_ref(decode_entry(out[ref]))
        return out

    def _tasks(self, shards: list[_Shard]) -> list[ReplayTask]:
        tasks: list[ReplayTask] = []
        self._marks: dict[int, tuple[list[sp.Split], list[tuple[int, int, int]], list[int]]] = {}
        for lo, hi in time_ranges(shards, self.split_size):
            parts: list[ShardPart] = []
            for shard in shards:
                part = self._part(shard, lo, hi)
                if part is not None:
                    parts.append(part)
            if parts:
                tasks.append(ReplayTask(len(tasks), lo, hi, parts))
        return tasks

    def _part(self, shard: _Shard, lo: int, hi: int) -> ShardPart | None:
        assert shard.start is not None
        start = _ts_key(shard.start)
        if hi <= start or (shard.cut is not None and lo > shard.cut):
            return None
        cached = self._marks.get(shard.index)
        if cached is None:
            splits = [s for s in shard.splits if shard.metas[s.key]["n"]]
            # Index points of the shard in order: (ts, position of the range, offset).
            marks = [
                (k, i, o)
                for i, s in enumerate(splits)
                for k, o in (shard.metas[s.key]["index"] or [(shard.metas[s.key]["first_ts"],
                                                              shard.metas[s.key]["first"])])
            ]
            cached = self._marks[shard.index] = (splits, marks, [k for k, _, _ in marks])
        splits, marks, keys = cached
        if not marks:
            return None
        at = bisect.bisect_right(keys, max(lo, start)) - 1
        _begin, i, offset = marks[max(0, at)]
        if at < 0:
            offset = shard.metas[splits[0].key]["first"]
        segments = []
        for j in range(i, len(splits)):
            meta = shard.metas[splits[j].key]
            if meta["first_ts"] >= hi:
                break
            if meta["last_ts"] < lo:
                continue
            segments.append((splits[j], offset if j == i else meta["first"], meta["stop"]))
        if not segments:
            return None
        links = self._links_for(shard, max(lo, start), hi)
        return ShardPart(shard.index, segments, start, shard.cut, links)

    def _fail_at_first_event(self, sc: Any, tasks: list[ReplayTask], ctx: ReplayContext) -> None:
        if not tasks:
            return
        results = dict(
            sc.parallelize(tasks, len(tasks)).map(lambda t: dry_task(t, ctx)).collect()
        )
        for task in tasks:
            error = results.get(task.key)
            if error is not None:
                raise ReplayError(_mongo_message(MongoError(*error)))

    def _write(
        self, spark: Any, tasks: list[ReplayTask], ctx: ReplayContext, summary: ReplaySummary,
        output: Output,
    ) -> None:
        sc = spark.sparkContext
        fmt, out, job = self.fmt, self.out, output.job
        accs = (sc.accumulator(0), sc.accumulator(0))
        shared = sc.broadcast(ctx)

        def run(items: Iterator[ReplayTask]) -> Iterator[TaskOutput]:
            from pyspark import TaskContext

            task_context = TaskContext.get()
            assert task_context is not None  # run by Spark, in a task
            attempt = task_context.attemptNumber()
            for task in items:
                yield write_task(task, shared.value, fmt, out, job, attempt, accs)

        self._phase = ("replay", len(tasks), accs[0], time.monotonic())
        sc.setJobGroup("cdcserver-replay", "spark-replay: replay and write")
        # One replay task per partition, the largest first (each writes the part file of its
        # time range, whatever the order they run in): the last ones to start are short, so
        # the cores finish together rather than one finishing a long task alone.
        order = sorted(tasks, key=lambda t: (-t.size, t.index))
        submitted = time.time()
        try:
            results = (
                sc.parallelize(order, len(order)).mapPartitions(run).collect() if order else []
            )
        finally:
            shared.destroy()
        if results:
            summary.spans["replay"] = _span(submitted, [r.span for r in results], time.time())
        summary.timings["replay"] = time.monotonic() - self._mark
        self._mark = time.monotonic()
        failed = sorted((r.partition, r.error) for r in results if r.error is not None)
        if failed:
            raise ReplayError(_mongo_message(MongoError(*failed[0][1])))
        output.commit(results)
        summary.timings["commit"] = time.monotonic() - self._mark
        summary.task_cpu["replay"] = [r.cpu for r in sorted(results, key=lambda r: r.partition)]
        summary.entries = sum(r.entries for r in results)
        summary.events = sum(r.events for r in results)


def _span(
    submitted: float, spans: list[tuple[float, float]], back: float
) -> tuple[float, float, float, float]:
    """(submitted, first task started, last task ended, results back) of a Spark job."""
    return submitted, min(b for b, _ in spans), max(e for _, e in spans), back


class _Watcher:
    """Calls `job.progress` every few seconds from a daemon thread: the phase, its tasks done
    and in all (Spark's status tracker), and the entries counted so far (accumulators, which
    the driver merges as tasks end)."""

    def __init__(self, sc: Any, job: SparkReplay, interval: float = 5.0) -> None:
        import threading

        self.sc, self.job, self.interval = sc, job, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spark-replay progress",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.interval):
            phase = self.job._phase
            if phase is None or self.job.progress is None:
                continue
            name, total, counter, started = phase
            try:
                done = 0
                for job in tracker.getJobIdsForGroup(f"cdcserver-{name}"):
                    info = tracker.getJobInfo(job)
                    for stage in info.stageIds if info is not None else ():
                        stage_info = tracker.getStageInfo(stage)
                        if stage_info is not None:
                            done = max(done, stage_info.numCompletedTasks)
                self.job.progress(
                    name, min(done, total), total, counter.value, time.monotonic() - started
                )
            except Exception:  # noqa: BLE001 - progress must never fail the job
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)


def session(
    master: str | None = None, app_name: str = "cdcserver spark-replay", **conf: Any
) -> SparkSession:
    """A SparkSession; in local mode the workers run this interpreter (and so find cdcserver)."""
    from pyspark.sql import SparkSession

    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    # Workers forked with the replay's modules already imported (daemon.py).
    builder = builder.config("spark.python.daemon.module", "cdcserver.spark.daemon")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()

