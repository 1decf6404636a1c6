"""The change-stream cursor: its own `ChangeStreamPipeline` queue (batches, post-batch token)
in a `StreamGroup` (hub.py) that reads the oplog for it, shared with identical cursors; only
what is needed to fill the batch asked for is read.

When a chunk's push needs documents the pipeline does not have (a live upstream's images or
transaction history: pipeline_stages/lookups.py), the push says so and runs nothing; the
lookups are fetched (awaited, so every other stream and connection is served meanwhile) and
the chunk is pushed again with the answers (hub.py `step_answering`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64

from cdcserver.cursors.cursor import (
    CHANGE_STREAM,
    DEFAULT_AWAIT_MS,
    DEFAULT_BATCH_SIZE,
    GetMore,
    HeldHere,
)
from cdcserver.hub import READ_CHUNK, StreamGroup, step_answering, wants_more
from cdcserver.scan_deadline import ScanBudget
from cdcserver.sources.base import CappedPositionLost, SourceFailed
from pipeline_stages.check_resumability import HISTORY_LOST_MESSAGE
from pipeline_stages.errors import MongoError
from pipeline_stages.lookups import NeedsLookup, looks_up_images
from pipeline_stages.pipeline import Batch, ChangeStreamPipeline


@dataclass(eq=False)
class ChangeStreamCursor(HeldHere):
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
    finished: bool = False  # its last batch was the invalidate: the getMore closes it
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
        them fetched (awaited) and is pushed again with the answers, then the pull goes on. A
        long read (history its filter drops: the retained log, an old resume point) gives the
        loop a turn every 5 ms (cdcserver/scan_deadline.py)."""
        try:
            await self._pull(want)
        except SourceFailed:
            if self.pipeline.pending_count:
                return  # the events before the failure go out first; the next read raises it
            raise

    async def _pull(self, want: int | None) -> None:
        budget = ScanBudget()  # no deadline: a change stream's getMore maxTimeMS is its wait
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
            # StreamGroup.pull's loop, a chunk at a time
            stepped = self.group.step(self, READ_CHUNK)
            if isinstance(stepped, NeedsLookup):
                if not await self.step_answering(READ_CHUNK):
                    return
            elif not stepped:
                self.group.caught_up(self)
                return  # it read all there is
            await budget.step(READ_CHUNK)

    async def step_answering(self, chunk: int, stop: Callable[[], bool] | None = None) -> bool:
        """hub.py `step_answering` for this cursor's group."""
        return await step_answering(self.group, self, chunk, stop)

    def start_prefetch(self, size: int, chunk: int, stopped: Callable[[], bool]) -> None:
        """After a full batch, fill the next one in a task (`prefetch_after` prefetches
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
            try:
                await self.group.wait(self, remaining)  # woken only when it got something
            except SourceFailed:
                pass  # the pull returns what is queued, or raises it
            self.awaited_s += time.monotonic() - now

    @property
    def done(self) -> bool:
        return self.finished

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        """A getMore's batch, then (after a full one) the next prepared while the client
        reads this one."""
        batch = await self.get_more(more.batch_size, more.max_time_ms)
        self.finished = batch.invalidated
        if not batch.invalidated:
            prefetch_after(self, more.batch_size, len(batch.events), more.stopping)
        return {"cursor": cursor_reply(self.id, self.ns, batch, first=False)}

    def close(self) -> None:
        self.closed = True
        self.group.remove(self)
        task = self._prefetch_task
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # no loop any more (shutdown)
                task.cancel()



# Oplog entries read per prefetch step: small, so the reply being sent (and every other
# connection) is served between steps.
PREFETCH_STEP = 100


def prefetch_after(cursor: ChangeStreamCursor, batch_size: int | None, sent: int,
                   stopping: Callable[[], bool]) -> None:
    """After a full batch, prepare the next one while the client reads this one.

    The client works through a batch before it sends the next getMore; filling the cursor's
    queue meanwhile (on the event loop, between I/O) overlaps the two instead of running them
    one after the other. The getMore then finds its events queued: what it returns is what it
    would have produced itself, since the queue is filled from the same oplog in the same order.
    """
    if batch_size is None:
        # A getMore without batchSize took what there was up to 16 MiB: it was full when it
        # left events queued; the next one is prepared as large (bounded by this one's bytes).
        if not cursor.pipeline.pending_count:
            return
        size = max(sent, DEFAULT_BATCH_SIZE)
    else:
        size = DEFAULT_BATCH_SIZE if batch_size <= 0 else batch_size
    if sent < size:
        return  # the stream caught up with the oplog: nothing to get ahead of
    if cursor.prepares_images:  # its lookups are awaited: a task, not loop callbacks
        cursor.start_prefetch(size, PREFETCH_STEP, stopping)
        return
    asyncio.get_running_loop().call_soon(_prefetch_step, cursor, size, stopping)


def _prefetch_step(cursor: ChangeStreamCursor, size: int, stopping: Callable[[], bool]) -> None:
    if cursor.closed or cursor.busy or cursor.draining or stopping():
        return  # a getMore (which reads for itself) or the end of the cursor
    pipeline = cursor.pipeline
    if pipeline.pending_count >= size or pipeline.invalidated:
        return
    try:
        if cursor.group.step(cursor, PREFETCH_STEP) is not True:
            return  # the end of the oplog for now, or lookups to await (the getMore's)
    except Exception:  # noqa: BLE001 - the getMore reads the same entries and reports it
        return
    asyncio.get_running_loop().call_soon(_prefetch_step, cursor, size, stopping)


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
