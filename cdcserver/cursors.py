"""The cursor registry (every kind of cursor) and the change-stream cursor.

`CursorManager` is the one registry of a server's cursors, whatever their kind: change streams
(`ChangeStreamCursor` here, a sharded front's merged streams), query results
(commands/queries.py `ResultCursor`), oplog finds (commands/oplog_find.py `OplogCursor`) and
cursors held elsewhere (commands/proxy.py `ForwardedCursor`: an upstream member's or a shard's).
Each has an `id`, a namespace `ns`, an `owner` (None: this server holds its results), `last_used`,
`busy` (a getMore has it checked out) and `close()`; one reaper closes those idle too long, and
getMore / killCursors (commands/cursors.py) find every kind here.

Change-stream cursors: ids, namespaces, getMore with awaitData, idle timeout, kill.

A cursor has its own `ChangeStreamPipeline` queue (batches, post-batch token) and belongs to a
`StreamGroup` (hub.py) that reads the oplog for it, shared with identical cursors; only what is
needed to fill the batch asked for is read.

When a chunk's push needs documents the pipeline does not have (a live upstream's images or
transaction history: pipeline_stages/lookups.py), the push says so and runs nothing; the
lookups are fetched (awaited, so every other stream and connection is served meanwhile) and
the chunk is pushed again with the answers (hub.py `step_answering`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64

from cdcserver.hub import READ_CHUNK, Hub, StreamGroup, step_answering, wants_more
from cdcserver.sources.base import CappedPositionLost
from pipeline_stages.check_resumability import HISTORY_LOST_MESSAGE
from pipeline_stages.errors import MongoError
from pipeline_stages.lookups import looks_up_images
from pipeline_stages.pipeline import Batch, ChangeStreamPipeline

DEFAULT_BATCH_SIZE = 101
DEFAULT_AWAIT_MS = 1000
# Cursor kinds (`kind` of each cursor class; an object without one is a change stream).
CHANGE_STREAM = "changeStream"
QUERY_RESULT = "queryResult"
OPLOG_FIND = "oplogFind"
FORWARDED = "forwarded"


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
    _prefetch_task: asyncio.Task[None] | None = field(default=None, repr=False)
    kind = CHANGE_STREAM
    owner = None  # this server reads the oplog for it

    def touch(self) -> None:
        self.last_used = time.monotonic()

    async def first_batch(self, batch_size: int | None) -> Batch:
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        if size > 0:
            try:
                await self.pull(size)
            except CappedPositionLost:
                # Dropped since the aggregate checked its start: mongod's first scan asserts
                # its start has not fallen off the oplog, which a change stream reports as 286.
                raise MongoError(286, HISTORY_LOST_MESSAGE) from None
        return self.pipeline.next_batch(size)

    @property
    def prepares_images(self) -> bool:
        """Whether the group's pushes look images up elsewhere (a live upstream)."""
        return looks_up_images(self.group.producer)

    async def pull(self, want: int | None) -> None:
        """`StreamGroup.pull` (`want` None: a reply's 16 MiB); a chunk that needs lookups has
        them fetched (awaited) and is pushed again with the answers, then the pull goes on."""
        while (
            wants_more(self.pipeline, want)
            and not self.group.producer.invalidated
            and self.pipeline.error is None
        ):
            if want is None:
                # Up to a whole reply (tens of thousands of small events): a chunk at a time,
                # every other connection served between chunks.
                if not await self.step_answering(READ_CHUNK):
                    self.group.caught_up(self)
                    return
                await asyncio.sleep(0)
                continue
            if self.group.pull(want, self) is None:
                return  # it has `want` events, or read all there is
            if not await self.step_answering(READ_CHUNK):
                return

    async def step_answering(self, chunk: int, stop: Callable[[], bool] | None = None) -> bool:
        """hub.py `step_answering` for this cursor's group."""
        return await step_answering(self.group, self, chunk, stop)

    def start_prefetch(self, size: int, chunk: int, stopped: Callable[[], bool]) -> None:
        """After a full batch, fill the next one in a task (commands/cursors.py prefetches
        with loop callbacks, which cannot await lookups)."""
        task = self._prefetch_task
        if task is None or task.done():
            self._prefetch_task = asyncio.get_running_loop().create_task(
                self._prefetch(size, chunk, stopped)
            )

    async def _prefetch(self, size: int, chunk: int, stopped: Callable[[], bool]) -> None:
        def stop() -> bool:  # a getMore (which reads for itself) or the end of the cursor
            return self.closed or self.busy or self.draining or stopped()

        pipeline = self.pipeline
        while not stop() and pipeline.pending_count < size and not pipeline.invalidated:
            try:
                if not await self.step_answering(chunk, stop):
                    return
            except Exception:  # noqa: BLE001 - the getMore reads the same entries and reports it
                return
            await asyncio.sleep(0)  # let the reply being sent (and everyone else) go first
            pipeline = self.pipeline  # detached meanwhile: its own pipeline

    async def get_more(self, batch_size: int | None, max_time_ms: int | None) -> Batch:
        # Without batchSize, mongod's getMore returns what there is up to the 16 MiB reply
        # budget (getmore_cmd.cpp); only the initial aggregate defaults to 101.
        size = (
            None if batch_size is None
            else DEFAULT_BATCH_SIZE if batch_size <= 0 else batch_size
        )
        wait_s = (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000
        deadline = time.monotonic() + wait_s
        self.awaited_s = 0.0
        while True:
            try:
                await self.pull(size)  # the group may be replaced (detached) in here
            except CappedPositionLost as lost:
                # The capped oplog dropped entries this stream had not read: it fails, as on
                # mongod (getMore adds its context to the scan's error), never skips them.
                raise MongoError(
                    lost.code, f"Executor error during getMore :: caused by :: {lost.errmsg}"
                ) from None
            pipeline = self.pipeline
            if pipeline.pending_count or pipeline.invalidated or pipeline.error is not None:
                return pipeline.next_batch(size)  # (raises the error its filter met)
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0 or self.draining:
                # An empty batch; its token is a high-water mark at what was scanned.
                return self.pipeline.next_batch(size)
            await self.group.wait(self, remaining)  # woken only when it got something
            self.awaited_s += time.monotonic() - now

    def close(self) -> None:
        self.closed = True
        self.group.remove(self)
        task = self._prefetch_task
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # no loop any more (shutdown)
                task.cancel()


class CursorManager:
    """Every open cursor by id, whatever its kind; reaps cursors idle longer than the timeout
    (mongod: 10 min). `cursors` indexes the change streams among them (the hub's readers:
    metrics, shutdown and the change-stream getMore look there)."""

    def __init__(self, idle_timeout_s: float = 600.0) -> None:
        self.open: dict[int, Any] = {}  # every kind
        self.cursors: dict[int, ChangeStreamCursor] = {}  # the change streams among them
        self.hub = Hub()
        self.idle_timeout_s = idle_timeout_s

    def new_id(self) -> int:
        while True:
            cid = secrets.randbits(62) + 1  # positive int64, never 0
            if cid not in self.open:
                return cid

    def add(self, cursor: Any) -> None:
        self.open[cursor.id] = cursor
        if kind_of(cursor) == CHANGE_STREAM:
            self.cursors[cursor.id] = cursor

    def find(self, cursor_id: Any) -> Any:
        """The cursor with this id, of any kind, or None."""
        if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
            return None
        return self.open.get(cursor_id)

    def get(self, cursor_id: int, ns: str) -> Any:
        """The cursor a getMore names: 43 when there is none, 13 when it is another
        namespace's."""
        cursor = self.open.get(cursor_id)
        if cursor is None:
            raise MongoError(43, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise MongoError(
                13,
                f"Requested getMore on namespace '{ns}', but cursor belongs to a different "
                f"namespace {cursor.ns}",
            )
        return cursor

    def held(self) -> int:
        """The cursors whose results this server holds (all but forwarded ones)."""
        return sum(1 for c in self.open.values() if kind_of(c) != FORWARDED)

    def is_change_stream(self, cursor_id: Any) -> bool:
        return isinstance(cursor_id, int) and cursor_id in self.cursors

    def kill(self, cursor_id: int) -> bool:
        cursor = self.open.pop(cursor_id, None)
        if cursor is None:
            return False
        stream = self.cursors.pop(cursor_id, None) is not None
        cursor.close()
        if stream:
            self.hub.forget_empty()
        return True

    def reap(self) -> int:
        now = time.monotonic()
        stale = [
            c.id for c in self.open.values()
            if not c.busy and now - c.last_used > self.idle_timeout_s
        ]
        for cid in stale:
            self.kill(cid)
        return len(stale)

    async def reap_forever(self, interval: float = 60.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reap()


def kind_of(cursor: Any) -> str:
    return getattr(cursor, "kind", CHANGE_STREAM)  # a front's merged stream has none


def cursor_reply(cursor_id: int, ns: str, batch: Batch, first: bool) -> dict[str, Any]:
    """The `cursor` document of an aggregate/getMore reply, in mongod's field order."""
    doc: dict[str, Any] = {
        "firstBatch" if first else "nextBatch": batch.events,
        "postBatchResumeToken": batch.post_batch_resume_token,
    }
    if batch.invalidated:
        doc["invalidated"] = True
    doc["id"] = Int64(0 if batch.invalidated else cursor_id)
    doc["ns"] = ns
    return doc
