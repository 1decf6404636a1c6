"""Tailable cursors on a capped collection of the embedded store (`find` with `tailable`, and
`awaitData`), as mongod runs them: a forward collection scan in insertion order (RecordId)
that stays open at the end of the collection; each getMore goes on after the last record it
returned, an awaitData one waiting up to its maxTimeMS (1 s by default) for new documents. A
cursor whose last seen record was deleted (the collection capped past it) fails with 136
CappedPositionLost, as mongod's CollectionScan does.

The scan counts the records it examines against the operation's deadline (the find's
`maxTimeMS`; a getMore without awaitData has what is left of it, as on mongod) and a getMore
gives the loop a turn every 5 ms of work (cdcserver/scan_deadline.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.cursors import QUERY_RESULT, GetMore, HeldHere
from cdcserver.embedded import engine
from cdcserver.scan_deadline import ScanBudget
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError

DEFAULT_AWAIT_MS = 1000  # mongod's getMore on an awaitData cursor without maxTimeMS
MAX_BATCH_BYTES = 16 * 1024 * 1024


def non_capped_error(db: str, coll: str) -> MongoError:
    """mongod's error for `tailable` on a collection that is not capped (or is missing)."""
    return MongoError(
        2, f"error processing query: ns={db}.{coll}Tree: $and\nSort: {{}}\nProj: {{}}\n "
        "tailable cursor requested on non capped collection",
    )


@dataclass(eq=False)
class CappedCursor(HeldHere):
    id: int
    ns: str
    store: Any
    log: Any  # the server's oplog: its new entries wake an awaitData getMore
    db: str
    coll: str
    uuid: bytes
    match: Callable[[Mapping[str, Any]], bool]
    projection: Mapping[str, Any] | None
    skip: int
    remaining: int | None  # the limit still to return; None: no limit
    await_data: bool
    last_id: int = 0  # the RecordId of the last record scanned (0: none yet)
    last_key: bytes = b""  # that record's key (its RecordId found again in O(1))
    exhausted: bool = False
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    awaited_s: float = 0.0
    max_time_ms: int | None = None
    # What the find's maxTimeMS left for getMores without awaitData (None: no deadline).
    leftover_s: float | None = None
    kind = QUERY_RESULT
    owner = None

    @property
    def done(self) -> bool:
        return self.exhausted or (self.remaining is not None and self.remaining <= 0)

    def _collection(self) -> Any:
        c = self.store.get(self.db, self.coll)
        if c is None or c.uuid != self.uuid:  # dropped (or renamed) under the cursor
            self.exhausted = True
            raise MongoError(175, f"collection dropped. UUID {uuid.UUID(bytes=self.uuid)}")
        return c

    def _check_position(self) -> dict[bytes, int]:
        """The collection's record ids, once the last record scanned is known to be there."""
        ids: dict[bytes, int] = self.store.record_ids(self._collection())
        if self.last_id and ids.get(self.last_key) != self.last_id:
            self.exhausted = True
            raise MongoError(
                136, "CollectionScan died due to position in capped collection being deleted. "
                f"Last seen record id: RecordId({self.last_id})",
            )
        return ids

    async def fill(self, want: int | None, budget: ScanBudget) -> list[Any]:
        """The records after the last one scanned that match, up to `want` and 16 MiB,
        within `budget`'s deadline, giving the loop a turn when `budget` says so."""
        out: list[Any] = []
        for _ in self._filling(want, out, budget):
            await budget.pause()
            self._check_position()  # the collection may have been capped past it meanwhile
        return out

    def _filling(self, want: int | None, out: list[Any], budget: ScanBudget) -> Iterator[None]:
        """The scan, step by step: each `next` is a point where it may pause."""
        ids = self._check_position()
        # The records as they are now: a pause cannot change what this pass reads (the
        # store replaces a record on write, never changes one in place).
        records = list(self.store.documents(self._collection()).items())
        if self.remaining is not None:
            want = self.remaining if want is None else min(want, self.remaining)
        size = 0
        for key, doc in records:
            rid = ids.get(key, 0)
            if rid <= self.last_id:
                if budget.examined():
                    yield
                continue
            if want is not None and len(out) >= want:
                break
            if self.match(doc):
                if self.skip:
                    self.skip -= 1
                else:
                    shown = engine.project(doc, self.projection) if self.projection else doc
                    n = len(bson_bytes.encode(shown))
                    if out and size + n > MAX_BATCH_BYTES:
                        break
                    out.append(shown)
                    size += n
                    if self.remaining is not None:
                        self.remaining -= 1
            self.last_id, self.last_key = rid, key
            if budget.examined():
                yield

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        batch_size, max_time_ms = more.batch_size, more.max_time_ms
        self.awaited_s = 0.0
        if not self.await_data:  # what the find's maxTimeMS left (getLeftoverMaxTimeMicros)
            budget = ScanBudget(remaining_s=self.leftover_s)
            try:
                batch = await self.fill(batch_size or None, budget)
            finally:
                self.leftover_s = budget.remaining_s()
            return self._reply(batch)
        budget = ScanBudget()  # an awaitData getMore's maxTimeMS is how long it waits
        batch = await self.fill(batch_size or None, budget)
        if not batch and not self.done:
            wait_s = (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000
            deadline = time.monotonic() + wait_s
            while not batch and not self.done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                latest = self.log.latest_ts()
                start = Timestamp(latest.time, latest.inc + 1) if latest else Timestamp(0, 1)
                waited_from = time.monotonic()
                await self.log.wait_for_entries(start, remaining)
                self.awaited_s += time.monotonic() - waited_from
                batch = await self.fill(batch_size or None, budget)
        return self._reply(batch)

    def _reply(self, batch: list[Any]) -> dict[str, Any]:
        return {"cursor": {"nextBatch": batch, "id": Int64(0 if self.done else self.id),
                           "ns": self.ns}}

    def close(self) -> None:
        self.exhausted = True


async def open_tailable(
    server: Any, store: Any, c: Any, db: str, coll: str, cmd: Mapping[str, Any],
    filter_doc: Mapping[str, Any] | None, projection: Any, skip: int, limit: int,
    batch_size: int | None, await_data: bool, default_batch: int,
) -> dict[str, Any]:
    """`find` with `tailable` on capped collection `c`: its first batch; the cursor is kept
    unless the collection is empty (mongod's shouldSaveCursor: a tailable cursor on an empty
    collection is not kept) or its limit is reached."""
    engine.validate_filter(filter_doc or {})
    matcher = engine.matcher(engine.normalize(dict(filter_doc or {})))
    cursor = CappedCursor(
        id=server.cursors.new_id(), ns=f"{db}.{coll}", store=store, log=server.oplog, db=db,
        coll=coll, uuid=c.uuid, match=matcher, projection=projection or None, skip=skip,
        remaining=limit or None, await_data=await_data,
    )
    max_time_ms = cmd.get("maxTimeMS")
    if isinstance(max_time_ms, int) and max_time_ms > 0:
        cursor.max_time_ms = max_time_ms
    budget = ScanBudget(max_time_ms)
    batch = await cursor.fill(default_batch if batch_size is None else batch_size, budget)
    cursor.leftover_s = budget.remaining_s()
    keep = bool(store.documents(c)) and not cursor.done
    if keep:
        server.cursors.add(cursor)
    return {"cursor": {"firstBatch": batch, "id": Int64(cursor.id if keep else 0),
                       "ns": cursor.ns}}
