"""`find` / `getMore` on `local.oplog.rs`, as mongod answers them: other oplog tailers (and
cdcserver's own live-upstream source) can use any cdcserver as their upstream.

Whatever the source (the embedded store's oplog, a recorded oplog), `local.oplog.rs` is the
server's oplog: a capped collection in `ts` order. Supported as on mongod:

* `filter` with any predicate; those on `ts` (`$gt`, `$gte`, `$lt`, `$lte`, `$eq`, equality,
  also under a top-level `$and`) bound the scan (a bisection, never a scan from the start),
  the rest is matched by the query engine on the decoded entry;
* `sort` / `hint` `{$natural: 1 | -1}` (or `{ts: 1 | -1}`, the same order), `skip`, `limit`,
  `batchSize`, `singleBatch`, `projection`;
* `tailable` and `tailable` + `awaitData` cursors: the cursor stays open at the end of the
  oplog, and a `getMore` on an awaitData cursor waits for new entries (up to its `maxTimeMS`,
  1 s by default) before answering with an empty batch; a cursor whose position was truncated
  off the capped oplog fails with CappedPositionLost (136), as on mongod.
* `maxTimeMS`: the scan counts the entries it examines against the find's deadline (50
  MaxTimeMSExpired) and gives the loop a turn every 5 ms of work (cdcserver/scan_deadline.py);
  a getMore of a cursor without awaitData has what is left of it, as on mongod (an awaitData
  getMore's maxTimeMS is its wait, not a deadline).

Entries are sent as their stored BSON bytes (never decoded and re-encoded).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.cursors import OPLOG_FIND, GetMore, HeldHere
from cdcserver.scan_deadline import ScanBudget
from cdcserver.sources.base import CappedPositionLost, EntryList, OplogLog
from cdcserver.sources.embedded import EmbeddedOplog
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import encode_in_order

OPLOG_DB = "local"
OPLOG_COLL = "oplog.rs"
OPLOG_NS = f"{OPLOG_DB}.{OPLOG_COLL}"
DEFAULT_BATCH = 101
MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_AWAIT_MS = 1000  # mongod's await on an awaitData getMore without maxTimeMS
SCAN_CHUNK = 1024  # entries read per step
_RAW = bson_bytes.codec_options(document_class=RawBSONDocument)
_DECODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options()
_TS_OPS = ("$eq", "$gt", "$gte", "$lt", "$lte")
MIN_TS = Timestamp(0, 0)
MAX_TS = Timestamp(0xFFFFFFFF, 0xFFFFFFFF)


def is_oplog(db: str, coll: Any) -> bool:
    return db == OPLOG_DB and coll == OPLOG_COLL


def _next(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def _prev(ts: Timestamp) -> Timestamp:
    if ts.inc > 0:
        return Timestamp(ts.time, ts.inc - 1)
    return Timestamp(ts.time - 1, 0xFFFFFFFF) if ts.time else MIN_TS


# ---------------------------------------------------------------------------------------------
# Reading the source's entries as bytes


def _lists(log: OplogLog) -> tuple[list[Timestamp], list[bytes]] | None:
    """The parallel `ts` / BSON lists of a source kept as an `EntryList` (a recorded oplog,
    the embedded store's), else None."""
    holder = log.store if isinstance(log, EmbeddedOplog) else log
    return holder.parallel_lists() if isinstance(holder, EntryList) else None


def _slice(
    log: OplogLog, lo: Timestamp, hi: Timestamp, n: int, reverse: bool, budget: ScanBudget,
) -> list[bytes]:
    """Up to `n` stored entries with `lo <= ts <= hi`, ascending (descending if `reverse`);
    a read that must go through more entries than it returns counts them in `budget`."""
    lists = _lists(log)
    ts_list, raw_list = lists if lists is not None else (None, None)
    if ts_list is not None and raw_list is not None:  # an EntryList: bisect its parallel lists
        i = bisect.bisect_left(ts_list, lo)
        j = bisect.bisect_right(ts_list, hi)
        if reverse:
            return raw_list[max(i, j - n):j][::-1]
        return raw_list[i:min(j, i + n)]
    if reverse:  # a source without random access: read forward, keep the last n
        out: list[bytes] = []
        pos = lo
        while True:
            entries = log.read_from(pos, SCAN_CHUNK)
            budget.examined(len(entries))  # its deadline holds here too (this read never pauses)
            entries = [e for e in entries if e["ts"] <= hi]
            if not entries:
                break
            out = (out + [encode_in_order(e) for e in entries])[-n:]
            pos = _next(entries[-1]["ts"])
        return out[::-1]
    return [encode_in_order(e) for e in log.read_from(lo, n) if e["ts"] <= hi]


def _entry_ts(raw: bytes) -> Timestamp:
    ts: Timestamp = RawBSONDocument(raw, _RAW)["ts"]  # every oplog entry's ts is one
    return ts


def _oldest_ts(log: OplogLog) -> Timestamp | None:
    lists = _lists(log)
    if lists is not None:
        return lists[0][0] if lists[0] else None
    oldest = log.oldest_entry()
    return oldest["ts"] if oldest is not None else None


# ---------------------------------------------------------------------------------------------
# The filter: bounds on ts, the rest for the query engine


@dataclass
class Bounds:
    lo: Timestamp = MIN_TS
    hi: Timestamp = MAX_TS

    def add(self, op: str, value: Any) -> None:
        if not isinstance(value, Timestamp):
            # A ts compared with another type matches nothing (type bracketing).
            self.lo, self.hi = MAX_TS, MIN_TS
            return
        if op in ("$eq", "$gte", "$gt"):
            lo = _next(value) if op == "$gt" else value
            self.lo = max(self.lo, lo)
        if op in ("$eq", "$lte", "$lt"):
            hi = _prev(value) if op == "$lt" else value
            self.hi = min(self.hi, hi)

    @property
    def empty(self) -> bool:
        return self.lo > self.hi


def split_filter(filter_doc: Mapping[str, Any]) -> tuple[Bounds, dict[str, Any]]:
    """The `ts` bounds a filter implies (top level and top-level `$and`), and the rest of the
    filter, which the query engine evaluates."""
    bounds = Bounds()
    rest: dict[str, Any] = {}
    and_rest: list[Any] = []

    def take(doc: Mapping[str, Any]) -> dict[str, Any]:
        left: dict[str, Any] = {}
        for key, cond in doc.items():
            if key == "$and" and isinstance(cond, list):
                for sub in cond:
                    if isinstance(sub, Mapping):
                        sub_rest = take(sub)
                        if sub_rest:
                            and_rest.append(sub_rest)
                    else:
                        raise MongoError(2, "$and/$or/$nor entries need to be full objects")
                continue
            if key == "ts":
                if isinstance(cond, Mapping) and cond and all(k.startswith("$") for k in cond):
                    if not all(k in _TS_OPS for k in cond):
                        raise MongoError(
                            2, "cdcserver's oplog scan supports $eq, $gt, $gte, $lt and $lte "
                            "on ts, not " + ", ".join(k for k in cond if k not in _TS_OPS),
                        )
                    for op, value in cond.items():
                        bounds.add(op, value)
                else:
                    bounds.add("$eq", cond)
                continue
            left[key] = cond
        return left

    rest = take(filter_doc)
    if and_rest:
        rest = {**rest, "$and": and_rest} if rest else (
            and_rest[0] if len(and_rest) == 1 else {"$and": and_rest}
        )
    return bounds, rest


def _matcher(rest: dict[str, Any]) -> Callable[[bytes], bool] | None:
    if not rest:
        return None
    from cdcserver.embedded import engine

    engine.matches(rest, {})  # a bad filter fails the find, not the first match

    def match(raw: bytes) -> bool:
        entry = bson_bytes.decode(raw, _DECODE)  # (named: inline, mypy reads the codec as Mapping)
        return engine.matches(rest, entry)

    return match


def _project(raw: bytes, projection: Mapping[str, Any]) -> dict[str, Any]:
    from cdcserver.embedded import engine

    entry = bson_bytes.decode(raw, _DECODE)  # (named: inline, mypy reads the codec as Mapping)
    return engine.project(entry, projection)


# ---------------------------------------------------------------------------------------------
# The cursor


@dataclass(eq=False)
class OplogCursor(HeldHere):
    id: int
    log: OplogLog
    bounds: Bounds
    match: Callable[[bytes], bool] | None
    projection: dict[str, Any] | None
    reverse: bool
    skip: int
    remaining: int | None  # the limit still to return; None: no limit
    tailable: bool
    await_data: bool
    ns: str = OPLOG_NS
    position: Timestamp = MIN_TS  # the next ts to look at (forward) / the last + 1 (reverse)
    last_seen: Timestamp | None = None
    exhausted: bool = False
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    awaited_s: float = 0.0  # the last getMore's wait for entries
    find_max_time_ms: Any = None  # the find's maxTimeMS: its first batch's deadline
    # What is left of it for the getMores of a cursor without awaitData (None: no deadline).
    leftover_s: float | None = None
    kind = OPLOG_FIND  # a cursor of the registry (cdcserver/cursors/)
    owner = None

    def __post_init__(self) -> None:
        self.position = self.bounds.hi if self.reverse else self.bounds.lo

    @property
    def done(self) -> bool:
        """Nothing more can come: the cursor is closed after this batch."""
        if self.remaining is not None and self.remaining <= 0:
            return True
        return self.exhausted

    def _check_position(self) -> None:
        """Before each step of a forward scan: if the capped oplog deleted the last entry the
        cursor saw, the entries after it may be gone too; fail rather than skip them."""
        if self.last_seen is None or self.reverse:
            return
        oldest = _oldest_ts(self.log)
        if oldest is not None and oldest > self.last_seen:
            raise CappedPositionLost(self.last_seen)

    async def fill(self, want: int | None, budget: ScanBudget | None = None) -> list[Any]:
        """Scan from the position until `want` documents (None: no count limit), 16 MiB, or
        the end of the oplog, within `budget` (None: the find's first batch, within the
        find's maxTimeMS; what is left of it is kept for getMores)."""
        if budget is None:
            budget = ScanBudget(self.find_max_time_ms)
            try:
                return await self._fill(want, budget)
            finally:
                self.leftover_s = budget.remaining_s()
        return await self._fill(want, budget)

    async def _fill(self, want: int | None, budget: ScanBudget) -> list[Any]:
        self._check_position()
        if self.remaining is not None:
            want = self.remaining if want is None else min(want, self.remaining)
        out: list[Any] = []
        if want == 0:
            return out
        size = 0
        bounds = self.bounds
        while not self.exhausted:
            if bounds.empty:
                self.exhausted = True
                break
            self._check_position()  # also after each yield: writes may have truncated meanwhile
            if self.reverse:
                chunk = _slice(self.log, bounds.lo, self.position, SCAN_CHUNK, True, budget)
            else:
                chunk = _slice(self.log, self.position, bounds.hi, SCAN_CHUNK, False, budget)
            if not chunk:
                # The end; a tailable cursor waits there for what is written next.
                if not self.tailable or bounds.hi != MAX_TS:
                    self.exhausted = True
                elif self.last_seen is None and not self.reverse:
                    # Nothing scanned yet (its filter starts after the newest entry): its place
                    # is after the newest entry, as mongod's scan, which seeks to the entry
                    # before its start, has it; if that entry is dropped, so may be what follows.
                    latest = self.log.latest_ts()
                    if latest is not None and latest < self.position:
                        self.last_seen = latest
                break
            for raw in chunk:
                ts = _entry_ts(raw)
                if self.match is None or self.match(raw):
                    if self.skip:
                        self.skip -= 1
                    else:
                        if out and size + len(raw) > MAX_BATCH_BYTES:
                            return out  # it starts the next batch (position not advanced)
                        out.append(
                            RawBSONDocument(raw, _RAW) if self.projection is None
                            else _project(raw, self.projection)
                        )
                        size += len(raw)
                        if self.remaining is not None:
                            self.remaining -= 1
                self.last_seen = ts
                if self.reverse:
                    if ts == MIN_TS:
                        self.exhausted = True
                        return out
                    self.position = _prev(ts)
                else:
                    self.position = _next(ts)
                if want is not None and len(out) >= want:
                    return out
                if budget.examined():
                    # A long scan lets other connections run; it goes on from its position
                    # (the capped oplog may have been truncated meanwhile: checked above).
                    await budget.pause()
                    break
        return out

    async def get_more(self, batch_size: int | None, max_time_ms: int | None) -> list[Any]:
        self.awaited_s = 0.0  # this getMore's wait for entries: not its work (slow log)
        if self.await_data:  # its maxTimeMS is how long it waits for entries
            budget = ScanBudget()
        else:  # what the find's maxTimeMS left (mongod: getLeftoverMaxTimeMicros)
            budget = ScanBudget(remaining_s=self.leftover_s)
            try:
                return await self.fill(batch_size, budget)
            finally:
                self.leftover_s = budget.remaining_s()
        batch = await self.fill(batch_size, budget)
        if batch or not self.tailable or self.done:
            return batch
        wait_s = (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return batch
            waited_from = time.monotonic()
            await self.log.wait_for_entries(self.position, remaining)
            self.awaited_s += time.monotonic() - waited_from
            batch = await self.fill(batch_size, budget)
            if batch or self.done:
                return batch

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        """getMore's reply (commands/cursors.py checks the cursor out and closes it)."""
        batch = await self.get_more(more.batch_size or None, more.max_time_ms)
        return reply(self, batch, first=False)

    def close(self) -> None:
        self.exhausted = True


# ---------------------------------------------------------------------------------------------
# Commands


def _direction(spec: Any, what: str) -> int | None:
    if not spec:
        return None
    if not isinstance(spec, Mapping):
        if what == "hint":
            return None  # an index name: there are no indexes on the oplog but $natural
        raise MongoError(14, f"Expected field {what}to be of type object")
    items = list(spec.items())
    if len(items) == 1 and items[0][0] in ("$natural", "ts") and items[0][1] in (1, -1):
        return int(items[0][1])
    if what == "hint":
        raise MongoError(2, "error processing query: planner returned error :: caused by :: "
                         "hint provided does not correspond to an existing index")
    raise MongoError(2, "cdcserver sorts local.oplog.rs only in its natural ($natural or ts) "
                     "order")


def validate_tailable(cmd: Mapping[str, Any]) -> tuple[bool, bool]:
    """(tailable, awaitData), checked as mongod's validateFindCommandRequest does."""
    tailable = cmd.get("tailable") is True
    await_data = cmd.get("awaitData") is True
    if await_data and not tailable:
        raise MongoError(9, "Cannot set 'awaitData' without also setting 'tailable'")
    for what in ("sort", "hint"):
        spec = cmd.get(what)
        if isinstance(spec, Mapping) and "$natural" in spec and (
            list(spec.items()) not in ([("$natural", 1)], [("$natural", -1)])
            or isinstance(spec["$natural"], bool)
        ):
            raise MongoError(2, f"$natural {what} cannot be set to a value other than -1 or 1.")
    if tailable:
        sort = cmd.get("sort")
        if sort and not (isinstance(sort, Mapping) and list(sort.items()) == [("$natural", 1)]):
            raise MongoError(2, "cannot use tailable option with a sort other than {$natural: 1}")
        if cmd.get("singleBatch") is True:
            raise MongoError(2, "cannot use tailable option with the 'singleBatch' option")
    return tailable, await_data


def open_cursor(
    log: OplogLog, cursor_id: int, cmd: Mapping[str, Any], filter_doc: Mapping[str, Any] | None,
    projection: Mapping[str, Any] | None, skip: int, limit: int,
) -> OplogCursor:
    tailable, await_data = validate_tailable(cmd)
    sort = _direction(cmd.get("sort"), "sort")
    hint = _direction(cmd.get("hint"), "hint")
    direction = sort or hint or 1
    if tailable and direction != 1:  # a hint {$natural: -1}: a tailable scan goes forward
        direction = 1
    bounds, rest = split_filter(filter_doc or {})
    return OplogCursor(
        id=cursor_id,
        log=log,
        bounds=bounds,
        match=_matcher(rest),
        projection=dict(projection) if projection else None,
        reverse=direction == -1,
        skip=skip,
        remaining=limit or None,
        tailable=tailable,
        await_data=await_data,
        find_max_time_ms=cmd.get("maxTimeMS"),
    )


async def scan(
    log: OplogLog, filter_doc: Mapping[str, Any] | None, skip: int = 0, limit: int = 0,
    max_time_ms: Any = None,
) -> list[RawBSONDocument]:
    """Every entry matching the filter (for `count` and `aggregate` on the oplog), within the
    command's `max_time_ms`."""
    cursor = open_cursor(log, 0, {}, filter_doc, None, skip, limit)
    budget = ScanBudget(max_time_ms)
    out: list[RawBSONDocument] = []
    while not cursor.done:
        out.extend(await cursor.fill(None, budget))
    return out


def decoded(entries: list[RawBSONDocument]) -> list[dict[str, Any]]:
    return [bson_bytes.decode(e.raw, _DECODE) for e in entries]


def collection_info(log: OplogLog) -> dict[str, Any]:
    """`local.oplog.rs` as listCollections shows it on mongod (a capped collection without
    an _id index)."""
    holder = getattr(log, "store", log)  # the embedded oplog's size is its store's
    size = getattr(holder, "oplog_size_bytes", 0)
    return {
        "name": OPLOG_COLL,
        "type": "collection",
        "options": {"capped": True, "size": float(size), "autoIndexId": False},
        "info": {"readOnly": False},
    }


def reply(cursor: OplogCursor, batch: list[Any], first: bool) -> dict[str, Any]:
    return {
        "cursor": {
            "firstBatch" if first else "nextBatch": batch,
            "id": Int64(0 if cursor.done else cursor.id),
            "ns": cursor.ns,
        }
    }
