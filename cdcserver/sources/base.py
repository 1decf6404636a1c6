"""What every oplog source gives the hub: an ordered log to read from, and a wake-up.

One source object is shared by every cursor (one scan of the source, many readers): a cursor
keeps only its own position and reads the entries after it. Sources: a recorded file
(`file.py`), the embedded store's own oplog (`embedded.py`), a live replica set (`mongo.py`,
a facade over `mongo_tail.py`, `mongo_history.py`, `mongo_images.py`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp

from pipeline_stages.errors import MongoError
from pipeline_stages.lookups import LookupAnswers, NeedsLookup
from pipeline_stages.oplog_entry import Entry, decode_entry
from pipeline_stages.release import Release


class CappedPositionLost(MongoError):
    """mongod's CollectionScan error for a cursor whose last seen record the capped oplog
    deleted: the entries after it may be gone too, so the cursor cannot go on without a gap.
    An oplog entry's RecordId is its `ts` as a 64-bit integer."""

    def __init__(self, last_seen: Timestamp) -> None:
        record_id = (last_seen.time << 32) | last_seen.inc
        super().__init__(
            136,
            "CollectionScan died due to position in capped collection being deleted. "
            f"Last seen record id: RecordId({record_id})",
        )
        self.last_seen = last_seen


class SourceFailed(MongoError):
    """The source stopped for good where a stream would read on (a followed file met an entry
    it cannot serve). mongod has no analogue (its oplog does not go bad under a reader): 280,
    ChangeStreamFatalError, is the non-resumable change-stream error, so a driver does not
    retry into the same wall; the message names the file and the place."""

    def __init__(self, message: str) -> None:
        super().__init__(280, message)


def begins_the_set(entry: Entry | None) -> bool:
    """The replica set's very first entry: nothing was ever before it."""
    if entry is None or entry.get("op") != "n":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and o.get("msg") == "initiating set"


class OplogLog:
    def __init__(self) -> None:
        self._changed = asyncio.Event()

    # Subclasses implement these five.
    def latest_ts(self) -> Timestamp | None:
        raise NotImplementedError

    def oldest_entry(self) -> Entry | None:
        raise NotImplementedError

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        """Up to `limit` entries with `ts >= start`, ascending."""
        raise NotImplementedError

    def entry_at(self, ts: Timestamp) -> Entry | None:
        """The entry at exactly `ts` (transaction chains), or None if it is gone."""
        raise NotImplementedError

    def __len__(self) -> int:
        """How many entries it holds now (a count of `local.oplog.rs`)."""
        raise NotImplementedError

    async def fetch_lookups(self, needs: NeedsLookup, answers: LookupAnswers) -> None:
        """Read what a push said it needs (pipeline_stages/lookups.py) into `answers`. Only a
        source whose documents are elsewhere (a live upstream) makes a push say so; the
        in-memory ones answer every lookup where it is asked."""
        raise RuntimeError(f"{type(self).__name__} does not look documents up elsewhere")

    def upstream_release(self) -> Release | None:
        """The release of the deployment this log is read from, when that is another server
        (a sidecar answers as it); None for the embedded store and recorded files."""
        return None

    def upstream_fcv(self) -> dict[str, Any] | None:
        """That deployment's featureCompatibilityVersion as its getParameter shows it
        (`{version[, targetVersion, previousVersion]}`), when followed; else None."""
        return None

    def namespaces(self) -> set[tuple[str, str]]:
        """(db, coll) pairs seen, for listDatabases / listCollections."""
        return set()

    def position_lost(self, position: Timestamp) -> bool:
        """Whether a reader that has read every entry before `position` lost its place: the
        capped oplog dropped every entry up to `position` (the last one the reader saw, and
        perhaps some it has not read yet). Sources that never drop entries say False."""
        return False

    def failure(self) -> SourceFailed | None:
        """Why nothing after the last entry will ever be read (a followed file's bad entry):
        a stream that read everything fails with it. None while the source can grow."""
        return None

    def cluster_time(self) -> Timestamp:
        """The time replies report as operationTime/$clusterTime: the last entry read."""
        return self.latest_ts() or Timestamp(0, 0)

    def start_for_new_stream(self) -> Timestamp:
        """Last applied time plus one increment: a new stream starts after what exists."""
        latest = self.latest_ts()
        if latest is None:
            return Timestamp(0, 1)
        return Timestamp(latest.time, latest.inc + 1)

    def notify(self) -> None:
        """New entries were appended: wake every waiting getMore."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_entries(self, start: Timestamp, timeout: float) -> None:
        """Return once an entry with `ts >= start` exists, or after `timeout` seconds."""
        event = self._changed  # taken before the check, so a notify in between is not lost
        latest = self.latest_ts()
        if latest is not None and latest >= start:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass


# Decoded entries kept for sharing between cursors: the most recently decoded ones.
DECODED_WINDOW = 4096


class EntryList:
    """Oplog entries kept as their BSON bytes with a parallel, ascending list of `ts`, read by
    bisection (a recorded file and the embedded store's oplog both hold theirs this way).

    An entry is decoded once for every cursor reading it: cursors near the head of the oplog
    read the same entries, so the last `DECODED_WINDOW` decoded entries are kept (the
    pipeline only reads entries, never changes them). A cursor far behind decodes its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self._raw: list[bytes] = []
        self._ts: list[Timestamp] = []
        # Keyed by the entry's bytes object, not its Timestamp: bson's Timestamp hash is
        # time ^ inc, which collides across neighbouring entries (long probe chains of
        # Python-level __eq__ calls); a bytes object caches its hash, and a hit is an identity.
        # An OrderedDict, not a dict: evicting a plain dict's first key scans past every
        # deleted slot before it (measured ~1.5 us per entry at this window size).
        self._decoded: OrderedDict[bytes, Entry] = OrderedDict()

    def latest_ts(self) -> Timestamp | None:
        return self._ts[-1] if self._ts else None

    def oldest_entry(self) -> Entry | None:
        return decode_entry(self._raw[0]) if self._raw else None

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        ts_list, raw_list = self._ts, self._raw
        i = bisect.bisect_left(ts_list, start)
        cache = self._decoded
        out = []
        for k in range(i, min(i + limit, len(ts_list))):
            raw = raw_list[k]
            entry = cache.get(raw)
            if entry is None:
                entry = cache[raw] = decode_entry(raw)
                if len(cache) > DECODED_WINDOW:
                    cache.popitem(last=False)  # the oldest decoded
            out.append(entry)
        return out

    # For the metrics (read at scrape time, never on the request path).
    def oldest_ts(self) -> Timestamp | None:
        return self._ts[0] if self._ts else None

    def entry_count(self) -> int:
        return len(self._ts)

    def parallel_lists(self) -> tuple[list[Timestamp], list[bytes]]:
        """The entries' `ts` and BSON, in order: the lists themselves (read, never changed,
        by an oplog find's binary search)."""
        return self._ts, self._raw

    def byte_size(self) -> int:
        """The bytes of the entries held (one pass over the lengths of bytes objects)."""
        return sum(len(raw) for raw in self._raw)

    def count_from(self, start: Timestamp) -> int:
        """How many entries have `ts >= start`."""
        return len(self._ts) - bisect.bisect_left(self._ts, start)

    def decoded_count(self) -> int:
        return len(self._decoded)

    def entry_at(self, ts: Timestamp) -> Entry | None:
        i = bisect.bisect_left(self._ts, ts)
        if i < len(self._ts) and self._ts[i] == ts:
            return decode_entry(self._raw[i])
        return None
