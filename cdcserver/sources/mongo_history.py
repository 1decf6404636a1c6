"""The upstream's history behind the live window: segments, and transaction entries.

* A stream that starts before the live window (`startAtOperationTime`, an old resume token,
  or a consumer slower than the window) reads the upstream's oplog from its position in a
  *segment*: a non-tailable `find {ts: {$gte: T}}` fetched a batch at a time, on demand,
  shared by every stream reading near that position. A segment whose start is older than the
  upstream's oldest entry fails its streams with 286.
* An entry of a transaction's `prevOpTime` chain that neither the window, a segment nor the
  retained log holds is not read in the middle of a push: `entry_at` raises `LookupNeeded`
  (pipeline_stages/lookups.py), the push says it needs it, and `fetch_oplog_entries` reads it
  with AsyncMongoClient before the push is run again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from typing import cast

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.sources.base import DECODED_WINDOW, EntryList, begins_the_set
from cdcserver.sources.mongo_common import (
    CAPPED_POSITION_LOST,
    UpstreamLink,
    close_cursor,
    history_lost,
    next_batch,
    next_ts,
)
from pipeline_stages.errors import MongoError
from pipeline_stages.lookups import LookupAnswers, LookupNeeded, NeedsLookup
from pipeline_stages.oplog_entry import Entry, decode_entry

log = logging.getLogger(__name__)


class Segment(EntryList):
    """Entries of the upstream's oplog read from `start` on (a history reader): every entry
    with `base <= ts <= covered_to` is held."""

    def __init__(self, start: Timestamp) -> None:
        super().__init__()
        self.start = start
        self.base = start
        self.covered_to: Timestamp | None = None
        self.error: MongoError | None = None
        self.want = asyncio.Event()
        self.last_used = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    @property
    def reach(self) -> Timestamp:
        """The last start this segment can serve (its next entry, when it comes)."""
        return self.start if self.covered_to is None else next_ts(self.covered_to)

    def serves(self, start: Timestamp) -> bool:
        return self.base <= start <= self.reach

    def append(self, items: list[tuple[Timestamp, bytes, Entry]], keep: int) -> None:
        for ts, raw, entry in items:
            self._raw.append(raw)
            self._ts.append(ts)
            self._decoded[raw] = entry
            if len(self._decoded) > DECODED_WINDOW:
                del self._decoded[next(iter(self._decoded))]
        if items:
            self.covered_to = items[-1][0]
        excess = len(self._ts) - keep
        if excess > 0:
            self.base = next_ts(self._ts[excess - 1])
            del self._raw[:excess]
            del self._ts[:excess]


class UpstreamHistory:
    """The history readers (segments) of one upstream source, and its transaction-entry
    lookups."""

    def __init__(self, source: UpstreamLink) -> None:
        self.source = source
        self.segments: list[Segment] = []
        self.entries_fetched = 0  # transaction entries read for pushes (tests check the path)

    # -- reading --------------------------------------------------------------------------------

    def segment_for(self, start: Timestamp) -> Segment | None:
        best = None
        for seg in self.segments:
            if seg.serves(start) and (best is None or seg.base > best.base):
                best = seg
        return best

    def read(self, start: Timestamp, limit: int) -> list[Entry]:
        """Up to `limit` entries from `start`, from a segment (opened here: its first batch
        comes later, and the source notifies)."""
        seg = self.segment_for(start)
        if seg is None:
            self.open(start)
            return []
        seg.last_used = time.monotonic()
        if seg.error is not None:
            raise seg.error
        out = seg.read_from(start, limit)
        if not out or (seg._ts and out[-1]["ts"] == seg._ts[-1]):
            seg.want.set()  # the reader is at the end of what was fetched: fetch ahead
        return out

    def readable(self, start: Timestamp) -> bool:
        """Whether a read from `start` would return something (or its error) now."""
        seg = self.segment_for(start)
        if seg is None:
            return True  # the next read opens a history reader
        return seg.error is not None or (bool(seg._ts) and seg._ts[-1] >= start)

    def entry_at(self, ts: Timestamp) -> Entry | None:
        """The entry at `ts` if a segment holds it."""
        for seg in self.segments:
            entry = seg.entry_at(ts)
            if entry is not None:
                return entry
        return None

    def missing_entry(self, ts: Timestamp) -> LookupNeeded:
        """What `entry_at` raises for an entry held nowhere in memory: the push needs it."""
        needs = NeedsLookup()
        needs.add_oplog_entry(ts)
        return LookupNeeded(needs)

    # -- segments -------------------------------------------------------------------------------

    def open(self, start: Timestamp) -> Segment:
        while len(self.segments) >= self.source.options.history_segments:
            self.close(min(self.segments, key=lambda s: s.last_used))
        seg = Segment(start)
        seg.want.set()
        self.segments.append(seg)
        seg.task = asyncio.get_running_loop().create_task(self._run(seg))
        return seg

    def close(self, seg: Segment) -> None:
        if seg in self.segments:
            self.segments.remove(seg)
        if seg.task is not None:
            seg.task.cancel()

    def close_idle(self, now: float) -> None:
        for seg in list(self.segments):
            if now - seg.last_used > self.source.options.history_idle_s:
                self.close(seg)

    def tasks(self) -> list[asyncio.Task[None]]:
        return [s.task for s in self.segments if s.task is not None]

    async def _run(self, seg: Segment) -> None:
        """Fetch the segment's next batch each time a reader reaches its end."""
        source = self.source
        options = source.options
        initial = options.backoff_initial_ms / 1000
        backoff = initial
        cursor = None
        try:
            while True:
                await seg.want.wait()
                await source.until_ready()
                try:
                    if cursor is None:
                        frm = seg.start if seg.covered_to is None else seg.covered_to
                        cursor = source.oplog_collection(source.async_client()).find(
                            {"ts": {"$gte": frm}}, batch_size=options.history_batch
                        )
                        batch = await next_batch(cursor)
                        batch = await self._continuity(seg, frm, batch)
                    else:
                        batch = await next_batch(cursor)
                    backoff = initial
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    await close_cursor(cursor)
                    cursor = None
                    if getattr(exc, "code", None) == CAPPED_POSITION_LOST:
                        seg.error = history_lost()
                    elif isinstance(exc, MongoError):
                        seg.error = exc
                    if seg.error is not None:
                        source.notify()
                        return
                    log.debug("upstream history read: %s", exc)
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, options.backoff_max_ms / 1000)
                    continue
                limit = source.majority_commit_point or Timestamp(0, 0)
                items = []
                at_head = not cursor.alive
                for doc in batch:
                    raw = cast(bytes, doc.raw)  # pymongo: bytes | memoryview (mongo_common.RAW)
                    entry = decode_entry(raw)
                    ts = entry["ts"]
                    if ts > limit:
                        at_head = True  # not majority-committed yet: the window brings it
                        break
                    if seg.covered_to is not None and ts <= seg.covered_to:
                        continue
                    items.append((ts, raw, entry))
                seg.append(items, options.history_keep)
                if at_head:
                    await close_cursor(cursor)
                    cursor = None
                seg.want.clear()
                source.notify()
                if at_head and not items:
                    # The reader is at the upstream's head: the tail will deliver what comes.
                    await asyncio.sleep(max(0.01, options.majority_poll_ms / 1000))
        finally:
            await source.close_own_cursor(cursor)

    async def _continuity(
        self, seg: Segment, frm: Timestamp, batch: list[RawBSONDocument]
    ) -> list[RawBSONDocument]:
        """Check that the upstream still has everything from `frm` on: the first entry is at
        `frm`, or the oldest entry is not newer than `frm` (read after the find, so a
        truncation before the find is seen). Raises 286 otherwise."""
        continuing = seg.covered_to is not None
        if batch and batch[0]["ts"] == frm:
            return batch[1:] if continuing else batch
        oldest = await self.source.refresh_oldest(self.source.async_client())
        if oldest is not None and oldest["ts"] > frm and not (
            not continuing and begins_the_set(oldest)
        ):
            raise history_lost()
        return batch

    # -- transaction entries --------------------------------------------------------------------

    async def fetch_oplog_entries(
        self, times: Sequence[Timestamp], answers: LookupAnswers
    ) -> None:
        """Read the entries at `times` (the earlier entries of a transaction's `prevOpTime`
        chain) from the upstream into `answers`: the entry, None when the upstream no longer
        has it (the unwinder then reports 286), or the lookup's error."""
        import pymongo

        if not times:
            return
        source = self.source
        what = "reading a transaction's oplog entry"
        try:
            source.lookup_allowed(what)
            oplog = source.oplog_collection(source.async_client())
            with pymongo.timeout(source.options.lookup_timeout_ms / 1000):
                # One `{ts: T}` each (an equality on ts, which every oplog scan serves).
                docs = await asyncio.gather(*(oplog.find_one({"ts": ts}) for ts in times))
        except pymongo.errors.PyMongoError as exc:
            error: BaseException = source.lookup_error(what, exc)
        except Exception as exc:  # noqa: BLE001 - lookup_allowed's: raised where it is asked
            error = exc
        else:
            self.entries_fetched += len(times)
            for ts, doc in zip(times, docs):
                answers.put_oplog_entry(ts, None if doc is None else decode_entry(doc.raw))
            return
        for ts in times:
            answers.fail_oplog_entry(ts, error)
