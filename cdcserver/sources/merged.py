"""A sharded cluster's oplogs read as one: every member's entries in timestamp order.

A mongos front (the embedded cluster's, a sidecar's, recorded shard oplogs') has no oplog of
its own: its change streams read each shard's and merge them (`sharding/streams.py`). What
the server asks of its oplog otherwise (the time replies report, the namespaces listed, a read
of the entries) is this union of the shards' oplogs. Shards of one cluster take their times
from one clock, so the union is ordered as the cluster's history.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Sequence

from bson.timestamp import Timestamp

from cdcserver.sources.base import OplogLog, SourceFailed
from pipeline_stages.oplog_entry import Entry


def _ts(entry: Entry) -> Timestamp:
    ts: Timestamp = entry["ts"]
    return ts


class MergedOplog(OplogLog):
    """The members' oplogs (`members()`, asked each time: shards come and go) as one."""

    def __init__(self, members: Callable[[], Sequence[OplogLog]]) -> None:
        super().__init__()
        self.members = members

    def latest_ts(self) -> Timestamp | None:
        times = [t for t in (m.latest_ts() for m in self.members()) if t is not None]
        return max(times) if times else None

    def oldest_entry(self) -> Entry | None:
        firsts = [e for e in (m.oldest_entry() for m in self.members()) if e is not None]
        return min(firsts, key=_ts) if firsts else None

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        # Each member's first `limit` from `start` holds every entry of the union's first
        # `limit`.
        parts = [m.read_from(start, limit) for m in self.members()]
        merged = heapq.merge(*parts, key=_ts)
        return [entry for entry, _ in zip(merged, range(limit), strict=False)]

    def entry_at(self, ts: Timestamp) -> Entry | None:
        for member in self.members():
            entry = member.entry_at(ts)
            if entry is not None:
                return entry
        return None

    def failure(self) -> SourceFailed | None:
        # The union cannot go past a member that stopped: its first failure is the union's.
        for member in self.members():
            failure = member.failure()
            if failure is not None:
                return failure
        return None

    def namespaces(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for member in self.members():
            out |= member.namespaces()
        return out

    def __len__(self) -> int:
        return sum(len(m) for m in self.members())

    def changed_event(self) -> asyncio.Event:
        """Set at the next `notify` (a member's new entries): what a merged stream waits on."""
        return self._changed
