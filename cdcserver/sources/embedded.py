"""The embedded store's own oplog, as the source every change stream reads."""

from __future__ import annotations

import asyncio
import contextlib
import time

from bson.timestamp import Timestamp

from cdcserver.embedded.store import Store
from cdcserver.sources.base import OplogLog, begins_the_set
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import Entry


class EmbeddedOplog(OplogLog):
    """Reads the store's oplog; every committed batch of writes wakes waiting getMores."""

    def __init__(self, store: Store, noop_interval_s: float = 10.0) -> None:
        super().__init__()
        self.store = store
        self.noop_interval_s = noop_interval_s
        store.listeners.append(self.notify)
        if store.latest_ts() is None:
            store.noop("initiating set")  # a new replica set's first entry

    async def follow(self) -> None:
        """mongod's periodic no-op writer: an entry every `noop_interval_s` of idleness, so
        change streams' post-batch resume tokens keep advancing."""
        interval = self.noop_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval / 4)
            latest = self.store.latest_ts()
            if latest is None or time.time() - latest.time >= interval:
                with contextlib.suppress(MongoError):  # a failed commit (logged): retried
                    self.store.noop()

    def latest_ts(self) -> Timestamp | None:
        return self.store.latest_ts()

    def oldest_entry(self) -> Entry | None:
        return self.store.oldest_entry()

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        return self.store.read_from(start, limit)

    def entry_at(self, ts: Timestamp) -> Entry | None:
        return self.store.entry_at(ts)

    def position_lost(self, position: Timestamp) -> bool:
        # The store's oplog is capped (store.py `_truncate`): once its oldest entry is newer
        # than `position`, the entry a reader last saw is gone, unless the oldest is the set's
        # first entry (nothing was dropped: a stream may start before it).
        oldest = self.store.oldest_ts()
        if oldest is None or oldest <= position:
            return False
        return not begins_the_set(self.store.oldest_entry())

    def namespaces(self) -> set[tuple[str, str]]:
        return set(self.store.catalog)

    def __len__(self) -> int:
        return self.store.oplog_count()
