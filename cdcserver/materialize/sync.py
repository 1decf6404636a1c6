"""The `Materializer`: a sidecar's copy of its materialized namespaces, kept from the tail.

Initial sync is mongod's (`InitialSyncer`): note T0, the newest entry the retained log has
(every later entry will be appended to it), clone every matching collection with plain `find`s
(no snapshot to outlive, however long the clone takes), note T1, the upstream's majority
commit point once the clone ended, then apply the retained entries after T0 idempotently (an
insert of an existing document replaces it, an update of a missing one is skipped). From T1
on the copy is consistent: the `consistent` point below which no image or snapshot read is
answered from it.

The apply loop reads the retained log (`RetainedLog.read_from`) from where it stopped, a batch
per SQLite transaction, and wakes with the tail (`wait_for_entries`). When the retained log no
longer covers that position (the tail found a gap in the upstream's oplog and emptied it,
retention dropped entries the copy had not applied yet, or the patterns changed) the copy is
thrown away and synced again, logged. A clone interrupted (process killed) starts again.
Versions older than the retained log's oldest entry are pruned (each document keeps its newest
one from before it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.materialize.apply import (
    Ddl,
    Op,
    Skipped,
    Transactions,
    apply_crud,
    collation_bson,
    ddl_of,
    document_id,
    id_key,
    stored_id_key,
)
from cdcserver.materialize.patterns import Patterns
from cdcserver.materialize.store import MIGRATED_AWAY, UNKNOWN, CopyStore
from cdcserver.sources.mongo_common import RAW, UpstreamError, next_ts
from cdcserver.sources.mongo_tail import UpstreamOplog, _majority_ts
from cdcserver.sources.retained import RetainedLog, pre_image_key

log = logging.getLogger(__name__)

APPLY_BATCH = 256  # retained entries read at a time
# A batch's work on the event loop: past this, the batch commits what it applied and the loop
# serves everyone else before the next (SQLite is synchronous).
APPLY_SLICE_S = 0.01
CLONE_BATCH = 1000  # documents per SQLite transaction while cloning
PRUNE_EVERY_S = 5.0
RETRY_S = 1.0  # after a failed pass (an unreachable upstream while cloning, a full disk)
PRUNE_STEPS = 20  # prune calls (each at most store.prune's limit of documents) per pass


class Resync(Exception):  # noqa: N818 - a signal: the copy must be synced again
    """The copy cannot follow on from here (logged with the reason)."""


class Materializer:
    """Owns the copy store; `run` is its background task (next to the tail)."""

    def __init__(self, source: UpstreamOplog, patterns: Sequence[str], data_dir: str) -> None:
        self.source = source
        self.patterns = Patterns(patterns)
        self.store = CopyStore(data_dir)
        self.txns = Transactions()
        self.resyncs = 0  # syncs after the first (status, tests)
        self.images_served = 0  # pre-images answered from the copy (status, tests)
        self.cloned_documents = 0  # by the last initial sync
        self.failures = 0  # passes that failed and were retried (status, tests)
        self._progress = asyncio.Event()
        self.state = "empty"
        self.t0: Timestamp | None = None
        self.consistent: Timestamp | None = None
        self.applied: Timestamp | None = None
        self._next: Timestamp | None = None  # the next retained entry to read
        self._load()
        self._rolled_back_seen = 0  # the retained log's rollback count when last checked
        retained = source.retained
        last = None if retained is None else retained.last_ts()
        if self.state == "ready" and self.applied is not None and (
                last is None or last < self.applied):
            # The retained log lost entries the copy applied (dropped as rolled back, then the
            # process ended before the copy noticed): what the copy holds cannot be vouched for.
            log.error("materialize: the copy applied entries up to %s the retained log no longer "
                      "has (newest %s): syncing again", self.applied, last)
            self.resyncs += 1
            self._discard()
        if self.state == "ready" and self.store.patterns() != list(self.patterns.patterns):
            log.warning("materialize: the patterns changed (%s -> %s): syncing again",
                        self.store.patterns(), list(self.patterns.patterns))
            self._discard()

    def _discard(self) -> None:
        """The copy is to be synced again: said durably at once, so that nothing (a restart, a
        failed pass reloading the state) serves it meanwhile."""
        self.store.begin()
        self.store.set_meta("state", "empty")
        self.store.commit()
        self.state = "empty"

    def _load(self) -> None:
        store = self.store
        self.state = str(store.meta("state") or "empty")
        self.t0 = store.meta_ts("t0")
        self.consistent = store.meta_ts("consistent")
        self.applied = store.meta_ts("applied")
        self._next = store.meta_ts("resume")

    # -- what others ask ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """serverStatus's `materialized` section and the metrics (commands/admin.py,
        metrics.py): `lagSeconds` is how far the copy is behind the newest retained entry (the
        tail's own lag is the retained log's)."""
        retained = self.source.retained
        newest = None if retained is None else retained.last_ts()
        lag = 0.0
        if newest is not None and (self.applied is None or self.applied < newest):
            lag = float(newest.time - (self.applied.time if self.applied is not None
                                       else (self.t0 or newest).time))
        return {
            "state": self.state, "patterns": list(self.patterns.patterns),
            "consistentAt": self.consistent, "appliedThrough": self.applied,
            "retainedThrough": newest, "lagSeconds": max(0.0, lag),
            "resyncs": self.resyncs, "failures": self.failures,
            "imagesServed": self.images_served, "clonedDocuments": self.cloned_documents,
            **self.store.stats(),
        }

    def readable_range(self) -> tuple[Timestamp, Timestamp] | None:
        """The times a snapshot read can be at: from the consistent point (or the retained
        log's oldest entry, if later) to the last applied entry."""
        if self.state != "ready" or self.consistent is None or self.applied is None:
            return None
        if self.applied < self.consistent:
            return None
        low = self.consistent
        retained = self.source.retained
        oldest = None if retained is None else retained.oldest_ts()
        if oldest is not None and oldest > low:
            low = oldest
        return low, self.applied

    async def wait_applied(self, ts: Timestamp, timeout_s: float) -> bool:
        """Until every entry up to `ts` is applied (False after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while self.applied is None or self.applied < ts or self.state != "ready":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            event = self._progress
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return True

    async def answer_pre_images(
        self, ids: Sequence[Mapping[str, Any]], answers: Any, timeout_s: float
    ) -> list[Mapping[str, Any]]:
        if self.state != "ready":
            return list(ids)  # an initial sync is running: the upstream path, without waiting
        uuids = self.store.uuids()
        mine = [i for i in ids if _uuid(i["nsUUID"]) in uuids]
        if not mine:
            return list(ids)
        rest = [i for i in ids if _uuid(i["nsUUID"]) not in uuids]
        # Everything the tail has delivered, not only the writes' own times: a prepared
        # transaction's writes are applied at its commit entry, after its applyOps' ts.
        target = max(i["ts"] for i in mine)
        delivered = self.source.latest_ts()
        if delivered is not None and delivered > target:
            target = delivered
        await self.wait_applied(target, timeout_s)
        consistent = self.consistent
        late: list[Mapping[str, Any]] = []
        for id_doc in mine:
            ts = id_doc["ts"]
            if self.state != "ready" or consistent is None or self.applied is None:
                rest.append(id_doc)
                continue
            if ts > self.applied:
                late.append(id_doc)  # the copy is behind: not a null image, a retry
                continue
            image = self.store.before_write(
                pre_image_key(_uuid(id_doc["nsUUID"]), ts, int(id_doc["applyOpsIndex"])),
                consistent,
            )
            if image is UNKNOWN:
                rest.append(id_doc)
                continue
            answers.put_pre_image(
                id_doc, None if image is None else RawBSONDocument(image, codec_options=RAW))
            self.images_served += 1
        if late:
            answers.fail_pre_images(late, UpstreamError(
                89, f"the sidecar's materialized copy has not applied {late[0]['ts']} yet "
                f"(it is at {self.applied})"))
        return rest

    # -- the background task --------------------------------------------------------------------

    async def run(self) -> None:
        last_prune = 0.0
        try:
            while True:
                try:
                    if self.state != "ready":
                        await self._initial_sync()
                        continue
                    if self._apply_available():
                        await asyncio.sleep(0)  # others run between batches
                        continue
                except Resync as why:
                    self.resyncs += 1
                    log.error("materialize: %s: the copy is synced again", why)
                    self._discard()
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the upstream away, a full disk: go on later
                    self.failures += 1
                    log.exception("materialize: %s failed; retrying in %.0fs",
                                  "the initial sync" if self.state != "ready" else "applying",
                                  RETRY_S)
                    await asyncio.sleep(RETRY_S)
                    # From what is durable: the open transactions' entries are read again.
                    self._load()
                    self.txns = Transactions()
                    continue
                now = time.monotonic()
                if now - last_prune >= PRUNE_EVERY_S:
                    last_prune = now
                    self._prune()
                assert self._next is not None
                waited = time.monotonic()
                await self.source.wait_for_entries(self._next, 1.0)
                if time.monotonic() - waited < 0.001:
                    await asyncio.sleep(0.01)  # readable, yet nothing to apply: never spin
        finally:
            self.store.close()

    def _retained(self) -> RetainedLog:
        retained = self.source.retained
        if retained is None:
            raise RuntimeError("materialize needs the retained log (upstream.retain_dir)")
        return retained

    async def _initial_sync(self) -> None:
        store, patterns = self.store, self.patterns
        retained = self._retained()
        while retained.last_ts() is None:  # the tail has delivered nothing yet
            await asyncio.sleep(0.05)
        t0 = retained.last_ts()
        assert t0 is not None
        if self.store.meta("state") == "cloning":
            log.warning("materialize: the previous initial sync was interrupted: starting over")
        store.wipe(patterns.patterns)
        store.begin()
        store.set_meta("state", "cloning")
        store.set_meta("t0", t0)
        store.commit()
        self.txns = Transactions()
        log.info("materialize: initial sync of %s from %s", ", ".join(patterns.patterns), t0)
        started = time.monotonic()
        client = self.source.async_client()
        count = 0
        wanted = patterns.databases()
        for db in sorted(await client.list_database_names()):
            if db not in wanted:
                continue
            cursor = await client[db].list_collections()
            for info in await cursor.to_list():
                name = info.get("name", "")
                if info.get("type", "collection") != "collection" or not patterns.matches(db, name):
                    continue
                uuid = (info.get("info") or {}).get("uuid")
                if uuid is None:
                    continue
                collation = collation_bson((info.get("options") or {}).get("collation"))
                count += await self._clone(client, db, name, _uuid(uuid), t0, collation)
        hello = await client.admin.command("hello")
        t1 = _majority_ts(hello) or retained.last_ts() or t0
        if t1 < t0:
            t1 = t0
        store.begin()
        store.set_meta("state", "ready")
        store.set_meta("consistent", t1)
        store.set_meta("applied", t0)
        store.set_meta("resume", next_ts(t0))
        store.commit()
        self._load()
        self.cloned_documents = count
        log.info("materialize: cloned %d documents in %.3fs; consistent from %s", count,
                 time.monotonic() - started, t1)

    async def _clone(self, client: Any, db: str, name: str, uuid: bytes, t0: Timestamp,
                     collation: bytes | None) -> int:
        store = self.store
        store.begin()
        cid = store.create(uuid, db, name, t0, collation)
        store.commit()
        coll = client[db].get_collection(name, codec_options=RAW)
        n = 0
        batch: list[tuple[int, bytes, Timestamp, int, bytes | None, bytes | None, int]] = []
        # In the upstream's natural order (a plain find's, as mongod's collection cloner's),
        # numbered so: the copy's record order is the source's.
        async for doc in coll.find({}, batch_size=CLONE_BATCH):
            raw = bytes(doc.raw)
            batch.append((cid, stored_id_key(raw), t0, -1, raw, None, store.new_record()))
            if len(batch) >= CLONE_BATCH:
                n += self._write_clone(batch)
        n += self._write_clone(batch)
        return n

    def _write_clone(self, batch: list[Any]) -> int:
        if not batch:
            return 0
        self.store.begin()
        self.store.put_versions(batch)
        self.store.commit()
        n = len(batch)
        batch.clear()
        return n

    # -- applying -------------------------------------------------------------------------------

    def _apply_available(self) -> bool:
        """Apply the next batch of retained entries; False when there is none."""
        retained = self._retained()
        start = self._next
        assert start is not None and self.applied is not None
        if not retained.covers(start):
            raise Resync(f"the retained log no longer has the entry at {start} (it starts at "
                         f"{retained.covered_from})")
        if retained.rolled_back != self._rolled_back_seen:
            self._rolled_back_seen = retained.rolled_back
            held = retained.covered_from is not None and retained.covered_from <= self.applied
            if held and retained.entry_at(self.applied) is None:
                raise Resync(f"the upstream rolled back entries the copy had applied (up to "
                             f"{self.applied})")
        entries = retained.read_from(start, APPLY_BATCH)
        if not entries:
            return False
        store = self.store
        applied = self.applied
        store.begin()
        try:
            until = time.monotonic() + APPLY_SLICE_S
            last = start
            for entry in entries:
                ts = last = entry["ts"]
                ops = self.txns.feed(entry)
                if ts > applied:  # (at or before: read again for a transaction left open)
                    self._apply_ops(ops, ts)
                if time.monotonic() >= until:
                    break
            open_from = self.txns.oldest_open()
            store.set_meta("applied", max(last, applied))
            store.set_meta("resume", open_from if open_from is not None else next_ts(last))
            store.commit()
        except BaseException:
            store.rollback()
            raise
        self.applied = max(last, applied)
        self._next = next_ts(last)
        self._progress.set()
        self._progress = asyncio.Event()
        return True

    def _apply_ops(self, ops: list[Op], ts: Timestamp) -> None:
        store = self.store
        initial = self.consistent is not None and ts <= self.consistent
        for ord_, op in enumerate(ops):
            if op.op in ("i", "u", "d"):
                if not self.patterns.matches_ns(op.ns):
                    continue
                cid = store.coll_id(op.uuid)
                if cid is None:
                    if initial or op.uuid is None:
                        continue  # created and dropped while cloning
                    raise Resync(f"a write to {op.ns}, a collection the copy does not have")
                key = id_key(document_id(op))
                current, rec = store.current_record(cid, key)
                try:
                    doc = apply_crud(op, current)
                except Skipped:
                    if not initial:
                        log.warning("materialize: %s %s at %s: no such document in the copy",
                                    op.op, op.ns, ts)
                    continue
                pre = None
                if op.op in ("u", "d") and op.uuid is not None:
                    pre = pre_image_key(op.uuid, op.entry_ts, op.index)
                if rec is None:  # a document coming in: the next record id (mongod's)
                    rec = store.new_record() if doc is not None else 0
                if doc is None and op.from_migrate:
                    rec = MIGRATED_AWAY  # merged snapshot reads: not a deletion (snapshot.py)
                store.put_versions([(cid, key, ts, ord_, doc, pre, rec)])
            elif op.op == "c":
                self._apply_ddl(ddl_of(op), ts, initial)

    def _apply_ddl(self, ddl: Ddl, ts: Timestamp, initial: bool) -> None:
        store, patterns = self.store, self.patterns
        if ddl.kind == "create":
            if ddl.uuid is not None and patterns.matches(ddl.db, ddl.coll):
                if store.coll_id(ddl.uuid) is None:
                    store.create(ddl.uuid, ddl.db, ddl.coll, ts, ddl.collation)
        elif ddl.kind == "drop":
            if ddl.uuid is not None:
                store.drop(ddl.uuid, ts)
        elif ddl.kind == "drop_database":
            for dropped in store.alive_in(ddl.db):
                store.drop(dropped, ts)
        elif ddl.kind == "rename":
            if ddl.drop_target is not None:
                store.drop(ddl.drop_target, ts)
            uuid: bytes | None = ddl.uuid
            if uuid is None:
                uuid = store.uuid_named(ddl.db, ddl.coll)
            if uuid is None or store.coll_id(uuid) is None:
                if patterns.matches(ddl.to_db, ddl.to_coll) and not initial:
                    raise Resync(f"{ddl.db}.{ddl.coll} (not materialized) was renamed to "
                                 f"{ddl.to_db}.{ddl.to_coll} (materialized)")
                return
            if patterns.matches(ddl.to_db, ddl.to_coll):
                store.rename(uuid, ddl.to_db, ddl.to_coll, ts)
            else:
                store.drop(uuid, ts)  # renamed out of the materialized namespaces

    def _prune(self) -> None:
        """Versions older than the retained log's oldest entry (a bounded amount per pass)."""
        oldest = self._retained().oldest_ts()
        if oldest is None:
            return
        store = self.store
        for _ in range(PRUNE_STEPS):
            store.begin()
            try:
                store.prune(oldest)
                store.commit()
            except BaseException:
                store.rollback()
                raise
            if store.meta_ts("pruned") is None or store.meta_ts("pruned") >= oldest:
                return


def _uuid(value: Any) -> bytes:
    return bytes(value.bytes if hasattr(value, "bytes") else value)
