"""Change-stream cursors: ids, namespaces, getMore with awaitData, idle timeout, kill.

A cursor has its own `ChangeStreamPipeline` queue (batches, post-batch token) and belongs to a
`StreamGroup` (hub.py) that reads the oplog for it, shared with identical cursors; only what is
needed to fill the batch asked for is read.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

from bson.int64 import Int64

from cdcserver.hub import Hub, StreamGroup
from pipeline_stages.errors import MongoError
from pipeline_stages.pipeline import Batch, ChangeStreamPipeline

DEFAULT_BATCH_SIZE = 101
DEFAULT_AWAIT_MS = 1000


@dataclass(eq=False)
class ChangeStreamCursor:
    id: int
    ns: str  # db.coll, db.$cmd.aggregate or admin.$cmd.aggregate
    pipeline: ChangeStreamPipeline  # this cursor's batches and post-batch token
    group: StreamGroup  # who reads the oplog for it (shared with identical cursors)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    closed: bool = False
    draining: bool = False  # the server shuts down: an awaiting getMore answers now
    awaited_s: float = 0.0  # the last getMore's wait for events (not counted as its work)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def first_batch(self, batch_size: int | None) -> Batch:
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        if size > 0:
            self.group.pull(size, self)
        return self.pipeline.next_batch(size)

    async def get_more(self, batch_size: int | None, max_time_ms: int | None) -> Batch:
        size = DEFAULT_BATCH_SIZE if batch_size is None or batch_size <= 0 else batch_size
        wait_s = (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000
        deadline = time.monotonic() + wait_s
        self.awaited_s = 0.0
        while True:
            self.group.pull(size, self)  # the group may be replaced (detached) in here
            if self.pipeline.pending_count or self.pipeline.invalidated:
                return self.pipeline.next_batch(size)
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0 or self.draining:
                # An empty batch; its token is a high-water mark at what was scanned.
                return self.pipeline.next_batch(size)
            await self.group.log.wait_for_entries(self.group.next_ts, remaining)
            self.awaited_s += time.monotonic() - now

    def close(self) -> None:
        self.closed = True
        self.group.remove(self)


class CursorManager:
    """Open cursors by id; reaps cursors idle longer than the timeout (mongod: 10 min)."""

    def __init__(self, idle_timeout_s: float = 600.0) -> None:
        self.cursors: dict[int, ChangeStreamCursor] = {}
        self.hub = Hub()
        self.idle_timeout_s = idle_timeout_s

    def new_id(self) -> int:
        while True:
            cid = secrets.randbits(62) + 1  # positive int64, never 0
            if cid not in self.cursors:
                return cid

    def add(self, cursor: ChangeStreamCursor) -> None:
        self.cursors[cursor.id] = cursor

    def get(self, cursor_id: int, ns: str) -> ChangeStreamCursor:
        cursor = self.cursors.get(cursor_id)
        if cursor is None:
            raise MongoError(43, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise MongoError(
                13,
                f"Requested getMore on namespace '{ns}', but cursor belongs to a different "
                f"namespace {cursor.ns}",
            )
        return cursor

    def kill(self, cursor_id: int) -> bool:
        cursor = self.cursors.pop(cursor_id, None)
        if cursor is None:
            return False
        cursor.close()
        self.hub.forget_empty()
        return True

    def reap(self) -> int:
        now = time.monotonic()
        stale = [
            c.id for c in self.cursors.values()
            if not c.busy and now - c.last_used > self.idle_timeout_s
        ]
        for cid in stale:
            self.kill(cid)
        return len(stale)

    async def reap_forever(self, interval: float = 60.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reap()


def cursor_reply(cursor_id: int, ns: str, batch: Batch, first: bool) -> dict:
    """The `cursor` document of an aggregate/getMore reply, in mongod's field order."""
    doc: dict = {
        "firstBatch" if first else "nextBatch": batch.events,
        "postBatchResumeToken": batch.post_batch_resume_token,
    }
    if batch.invalidated:
        doc["invalidated"] = True
    doc["id"] = Int64(0 if batch.invalidated else cursor_id)
    doc["ns"] = ns
    return doc
