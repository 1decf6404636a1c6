"""Tailable cursors on a capped collection of the embedded store (`find` with `tailable`, and
`awaitData`), as mongod runs them: a forward collection scan in insertion order (RecordId)
that stays open at the end of the collection; each getMore goes on after the last record it
returned, an awaitData one waiting up to its maxTimeMS (1 s by default) for new documents. A
cursor whose last seen record was deleted (the collection capped past it) fails with 136
CappedPositionLost, as mongod's CollectionScan does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.cursors import QUERY_RESULT, GetMore, HeldHere
from cdcserver.embedded import engine
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
    exhausted: bool = False
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)
    awaited_s: float = 0.0
    max_time_ms: int | None = None
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

    def fill(self, want: int | None) -> list[Any]:
        """The records after the last one scanned that match, up to `want` and 16 MiB."""
        c = self._collection()
        records = self.store.documents(c)
        ids = self.store.record_ids(c)
        if self.last_id and self.last_id not in self._live(ids):
            self.exhausted = True
            raise MongoError(
                136, "CollectionScan died due to position in capped collection being deleted. "
                f"Last seen record id: RecordId({self.last_id})",
            )
        if self.remaining is not None:
            want = self.remaining if want is None else min(want, self.remaining)
        out: list[Any] = []
        size = 0
        for key, doc in records.items():
            rid = ids.get(key, 0)
            if rid <= self.last_id:
                continue
            if want is not None and len(out) >= want:
                break
            if self.match(doc):
                if self.skip:
                    self.skip -= 1
                else:
                    shown = engine.project(doc, self.projection) if self.projection else doc
                    n = len(bson.encode(shown))
                    if out and size + n > MAX_BATCH_BYTES:
                        break
                    out.append(shown)
                    size += n
                    if self.remaining is not None:
                        self.remaining -= 1
            self.last_id = rid
        return out

    @staticmethod
    def _live(ids: dict[bytes, int]) -> set[int]:
        return set(ids.values())

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        batch_size, max_time_ms = more.batch_size, more.max_time_ms
        self.awaited_s = 0.0
        batch = self.fill(batch_size or None)
        if not batch and self.await_data and not self.done:
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
                batch = self.fill(batch_size or None)
        return {"cursor": {"nextBatch": batch, "id": Int64(0 if self.done else self.id),
                           "ns": self.ns}}

    def close(self) -> None:
        self.exhausted = True


def open_tailable(
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
    batch = cursor.fill(default_batch if batch_size is None else batch_size)
    keep = bool(store.documents(c)) and not cursor.done
    if keep:
        server.cursors.add(cursor)
    return {"cursor": {"firstBatch": batch, "id": Int64(cursor.id if keep else 0),
                       "ns": cursor.ns}}
