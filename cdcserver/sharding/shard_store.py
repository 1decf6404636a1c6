"""A shard's embedded store: mongod's store, with the cluster's clock and the shard key.

Every shard of the embedded cluster is a replica set of its own (its own oplog), but their
timestamps come from one cluster clock (mongod's hybrid logical clock, gossiped through
`$clusterTime`): a write anywhere gets a time after every time already handed out, so the
shards' streams merge in clusterTime order and an idle shard can promise "nothing before the
cluster's time" (`ClusterClock.next_ts`).

For a sharded collection the oplog carries the documentKey as mongod writes it: the shard
key's fields, then `_id` (insert and update `o2`, delete `o`). Chunk migrations and the
non-primary shards' part of a sharded DDL write their entries with `fromMigrate: true`, which
change streams skip.

So does a write on an orphan, as mongod's PreWriteFilter (`write_stage_common.cpp`,
featureFlagNoChangeStreamEventsDueToOrphans, on since 6.0) marks it: an insert of a document,
an update or a delete of a document (its pre-image) of a sharded collection whose shard key
falls in a chunk this shard does not own is logged `fromMigrate: true` (in a transaction, its
operation in `applyOps`), whoever sent it (a client on the shard's own port, the TTL monitor);
the write itself is done. (mongod's shards skip an orphan in an update or delete a router
sent, `kSkip`, and filter orphans out of a router's reads; the front's broadcast writes and
reads here still reach them: the orphan is written, logged fromMigrate, and read.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.embedded.store import Store, _now_ms
from cdcserver.sharding.catalog import ShardingCatalog, bound_bytes
from pipeline_stages import bson_bytes
from pipeline_stages.keystring import encode_values

# Decodes a logged entry for re-encoding as it was: sub-documents kept as their bytes.
_RAW = bson_bytes.codec_options(document_class=RawBSONDocument)


class ClusterClock:
    """One logical clock for every shard: seconds from the wall clock, increments after."""

    def __init__(self) -> None:
        self.last = Timestamp(0, 0)

    def advance_to(self, ts: Timestamp | None) -> None:
        if ts is not None and ts > self.last:
            self.last = ts

    def tick(self) -> Timestamp:
        now = int(time.time())
        last = self.last
        self.last = Timestamp(now, 1) if now > last.time else Timestamp(last.time, last.inc + 1)
        return self.last

    def next_ts(self) -> Timestamp:
        """The earliest time a write from now on can get."""
        last = self.last
        now = int(time.time())
        return Timestamp(now, 1) if now > last.time else Timestamp(last.time, last.inc + 1)


class ShardStore(Store):
    def __init__(
        self, data_dir: str | None, *, clock: ClusterClock, catalog: ShardingCatalog,
        shard_name: str | None = None, **options: Any,
    ) -> None:
        self.clock = clock
        self.sharding = catalog
        self.shard_name = shard_name  # None: no ownership check (every write is a user's)
        self._key_doc: Mapping[str, Any] | None = None  # the document of the update/delete
        self._pre_doc: Mapping[str, Any] | None = None  # the update's document before it
        # Per sharded collection, its chunk map as last seen (key pattern; each chunk's shard,
        # min, max: copies) and the chunks' bounds encoded as bounds compare.
        self._chunk_maps: dict[str, tuple[Any, list[tuple[str, bytes, bytes | None]]]] = {}
        self.from_migrate = False
        self._pinned: Timestamp | None = None
        self._prepare: tuple[Timestamp, Timestamp] | None = None
        super().__init__(data_dir, **options)
        clock.advance_to(self.latest_ts())

    def _next_ts(self) -> Timestamp:
        ts = self._pinned if self._pinned is not None else self.clock.tick()
        self._pinned = None
        self._last_ts = ts
        return ts

    @contextlib.contextmanager
    def commit_at(self, ts: Timestamp) -> Iterator[None]:
        """The next entry gets `ts` (a cross-shard transaction's commit time, one for every
        participant; taken from the cluster clock just before)."""
        self._pinned = ts
        try:
            yield
        finally:
            self._pinned = None

    @contextlib.contextmanager
    def migrating(self) -> Iterator[None]:
        """Writes in here are a migration's (or another internal writer's): fromMigrate."""
        self.from_migrate = True
        try:
            yield
        finally:
            self.from_migrate = False

    @contextlib.contextmanager
    def prepared_commit(self, prepare_ts: Timestamp, commit_ts: Timestamp) -> Iterator[None]:
        """The transaction committed in here is logged as a participant of a cross-shard
        transaction logs it: its `applyOps` with `prepare: true` at `prepare_ts`, then a
        `commitTransaction` entry (`commitTimestamp`) at `commit_ts`, linked by prevOpTime.
        Both times come from the cluster clock (every participant's prepare, then the commit
        time, the same for every participant; mongod writes the commit entry at a time of
        its own after the commitTimestamp, here they are one)."""
        self._prepare = (prepare_ts, commit_ts)
        try:
            yield
        finally:
            self._prepare = None

    def update_document(self, c: Any, pre: dict[str, Any], post: dict[str, Any],
                        **kwargs: Any) -> bool:
        self._key_doc, self._pre_doc = post, pre
        try:
            return super().update_document(c, pre, post, **kwargs)
        finally:
            self._key_doc = self._pre_doc = None

    def delete_document(self, c: Any, pre: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self._key_doc = pre
        try:
            super().delete_document(c, pre, *args, **kwargs)
        finally:
            self._key_doc = None

    def append_oplog(self, op: str, ns: str, o: Mapping[str, Any], **kwargs: Any
            ) -> tuple[Timestamp, Any]:
        orphan = False
        if op in ("i", "u", "d") and self.sharding.is_sharded(ns):
            if op == "i":
                kwargs["o2"] = self.sharding.document_key(ns, o)
                orphan = self._is_orphan(ns, o)
            elif op == "u" and self._key_doc is not None:
                kwargs["o2"] = self.sharding.document_key(ns, self._key_doc)
                orphan = self._is_orphan(ns, self._pre_doc or self._key_doc)
            elif op == "d" and self._key_doc is not None:
                orphan = self._is_orphan(ns, self._key_doc)
                o = self.sharding.document_key(ns, self._key_doc) or o
        prepare = self._prepare
        if (prepare is not None and op == "c" and self.txn is None and isinstance(o, Mapping)
                and "applyOps" in o and not o.get("partialTxn")):
            self._prepare = None
            prepare_ts, commit_ts = prepare
            self._pinned = prepare_ts
            ts, wall = super().append_oplog(op, ns, {**o, "prepare": True}, **kwargs)
            self._pinned = commit_ts
            super().append_oplog("c", "admin.$cmd",
                                 {"commitTransaction": 1, "commitTimestamp": commit_ts},
                                 session=kwargs.get("session"), wall=wall)
            return ts, wall  # the applyOps entry's: pre-images are keyed by it
        if self.from_migrate and self.txn is None:
            return self._log_from_migrate(op, ns, o, kwargs.get("ui"), kwargs.get("o2"))
        if orphan and not self.from_migrate:
            return self._log_orphan_write(op, ns, o, **kwargs)
        return super().append_oplog(op, ns, o, **kwargs)

    def _is_orphan(self, ns: str, doc: Mapping[str, Any]) -> bool:
        """`doc` (of sharded `ns`) falls in a chunk another shard owns (PreWriteFilter's
        `_documentBelongsToMe` is false); the chunk found as `ShardingCatalog.shard_for`
        finds it, from bounds encoded once per chunk map."""
        name = self.shard_name
        if name is None:
            return False
        chunks = self.sharding.chunks.get(ns)
        if not chunks:
            return False
        pattern = self.sharding.key_pattern(ns)
        seen = (pattern, [(c["shard"], c["min"], c["max"]) for c in chunks])
        cached = self._chunk_maps.get(ns)
        if cached is None or cached[0] != seen:
            snapshot = (dict(pattern or {}), [(c["shard"], dict(c["min"]), dict(c["max"]))
                                              for c in chunks])
            ranges = [(c["shard"], bound_bytes(c["min"]),
                       None if isinstance(next(iter(c["max"].values())), MaxKey)
                       else bound_bytes(c["max"])) for c in chunks]
            cached = self._chunk_maps[ns] = (snapshot, ranges)
        key = encode_values(self.sharding.key_values(ns, doc))[0]
        owner = cached[1][-1][0]
        for shard, low, high in cached[1]:
            if low <= key and (high is None or key < high):
                owner = shard
                break
        return owner != name

    def _log_orphan_write(self, op: str, ns: str, o: Mapping[str, Any], **kwargs: Any
                          ) -> tuple[Timestamp, Any]:
        """The write logged as a user's is (its session fields, its retry image, its place in a
        transaction), with `fromMigrate: true` after its `o2` (or `o`), where a migration's
        entry has it."""
        txn = self.txn
        if txn is not None:
            before = len(txn.ops)
            ts, wall = super().append_oplog(op, ns, o, **kwargs)
            if len(txn.ops) > before:
                txn.ops[-1]["fromMigrate"] = True
            return ts, wall
        persist, self.persist = self.persist, None  # persisted once marked, below
        try:
            ts, wall = super().append_oplog(op, ns, o, **kwargs)
        finally:
            self.persist = persist
        at, raw = self._pending[-1]
        raw = _marked_from_migrate(raw)
        self._pending[-1] = (at, raw)
        if persist is not None:
            persist.append_oplog(at, raw)
        return ts, wall

    def _log_from_migrate(
        self, op: str, ns: str, o: Mapping[str, Any], ui: Any, o2: Mapping[str, Any] | None
    ) -> tuple[Timestamp, Any]:
        ts = self._next_ts()
        wall = _now_ms()
        entry: dict[str, Any] = {"op": op, "ns": ns}
        if ui is not None:
            entry["ui"] = ui
        entry["o"] = o
        if o2 is not None:
            entry["o2"] = o2
        entry["fromMigrate"] = True
        entry["ts"] = ts
        entry["t"] = Int64(1)
        entry["v"] = Int64(2)
        entry["wall"] = wall
        raw = bson_bytes.encode(entry)
        self._pending.append((ts, raw))
        if self.persist is not None:
            self.persist.append_oplog(ts, raw)
        return ts, wall


def _marked_from_migrate(raw: bytes) -> bytes:
    """The encoded oplog entry `raw` with `fromMigrate: true` after its `o2` (else its `o`);
    every other field's bytes as they were."""
    entry = bson_bytes.decode(raw, _RAW)
    after = "o2" if "o2" in entry else "o"
    out: dict[str, Any] = {}
    for key, value in entry.items():
        out[key] = value
        if key == after:
            out["fromMigrate"] = True
    return bson_bytes.encode(out)
