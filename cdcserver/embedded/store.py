"""The embedded store: documents, catalog, unique indexes, and the oplog mongod 8.0 would write.

The working set is each collection's documents in plain dicts (`Collection.records`); query,
update and aggregation semantics come from the query engine (`engine.py` over
`pipeline_stages/query_engine.py`). Every write goes through the store one document at a time,
as mongod does, and leaves:

* the document change in the working set (and, in durable mode, in SQLite, `persist.py`);
* one oplog entry shaped as mongod 8.0 writes it (field order `[lsid, txnNumber,] op, ns, ui,
  o, o2, [stmtId,] ts, t, v, wall[, prevOpTime]`, `ts` strictly increasing);
* a `config.system.preimages` document when the collection has
  `changeStreamPreAndPostImages.enabled`.

A command runs inside `with store.batch():`; its oplog entries become visible to readers (and
durable) together when the batch ends, before the reply is sent.

This module is the facade: `Store` is assembled from one mixin per seam of mongod's, each in
its own module (and the names callers import are re-exported here):

* `catalog.py`: collections, views, DDL;
* `indexes.py`: index specs, index keys, unique checks;
* `writes.py`: one document's insert, update or delete;
* `oplog_writer.py`: oplog entries as mongod 8.0 writes them, batches, the capped oplog;
* `sessions.py`, `transactions.py`: sessions, transactions, snapshots, write conflicts;
* `images.py`: pre-images and retryable findAndModify images;
* `ttl.py`: the TTL monitor;
* `persist.py`: SQLite durability.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import bson
import bson.errors
from bson.timestamp import Timestamp

from cdcserver.embedded.catalog import (
    OPTION_ORDER,
    SYSTEM_VIEWS,
    VIEW_MAX_DEPTH,
    CatalogMixin,
    bson_string,
    ordered_options,
    validate_collection_name,
)
from cdcserver.embedded.images import ImagesMixin
from cdcserver.embedded.indexes import DuplicateKeyError, IndexMixin, index_entries
from cdcserver.embedded.oplog_writer import (
    MAX_BSON,
    NULL_OP_TIME,
    TXN_OPLOG_ENTRY_OPS,
    OplogWriterMixin,
    _now_ms,
    durable_op_size,
    pack_transaction,
    simple_diff,
)
from cdcserver.embedded.persist import _DECODE, Persistence, corrupt, int_ts
from cdcserver.embedded.sessions import (
    LoggedWrite,
    OpSession,
    Session,
    TxnBlocked,
    _Version,
    session_key,
)
from cdcserver.embedded.store_types import (
    ID_INDEX,
    Collection,
    DocumentValidationError,
    StoreImages,
    Txn,
    id_key,
)
from cdcserver.embedded.transactions import TransactionMixin
from cdcserver.embedded.ttl import BATCHED_DELETES_TARGET_DOCS, TTLMixin
from cdcserver.embedded.writes import WritesMixin
from cdcserver.sources.base import EntryList
from pipeline_stages import bson_bytes

__all__ = [
    "BATCHED_DELETES_TARGET_DOCS", "ID_INDEX", "MAX_BSON", "NULL_OP_TIME", "OPTION_ORDER",
    "SYSTEM_VIEWS", "TXN_OPLOG_ENTRY_OPS", "VIEW_MAX_DEPTH", "Collection",
    "DocumentValidationError", "DuplicateKeyError", "LoggedWrite", "OpSession", "Session",
    "Store", "StoreImages", "Txn", "TxnBlocked", "_now_ms", "bson_string", "durable_op_size",
    "id_key", "index_entries", "ordered_options", "pack_transaction", "session_key",
    "simple_diff", "validate_collection_name",
]


class Store(
    CatalogMixin,
    IndexMixin,
    WritesMixin,
    TransactionMixin,
    ImagesMixin,
    TTLMixin,
    OplogWriterMixin,
    EntryList,
):

    def __init__(
        self,
        data_dir: str | None = None,
        *,
        synchronous: str = "full",
        oplog_size_bytes: int = 1024 * 1024 * 1024,
        oplog_min_retention_hours: float = 0.0,
        txn_oplog_entry_bytes: int = MAX_BSON,
        txn_oplog_entry_ops: int = TXN_OPLOG_ENTRY_OPS,
        ttl_monitor_sleep_secs: float = 60.0,
        transaction_lifetime_limit_seconds: float = 60.0,
    ) -> None:
        # mongod's TTL monitor pass interval (ttlMonitorSleepSecs); 0 turns the monitor off
        # (ttlMonitorEnabled false, until setParameter turns it on).
        self.ttl_monitor_sleep_secs = ttl_monitor_sleep_secs
        self.ttl_monitor_enabled = ttl_monitor_sleep_secs > 0
        # How mongod splits a transaction into applyOps entries: BSONObjMaxUserSize and the
        # maxNumberOfTransactionOperationsInSingleOplogEntry server parameter.
        self.txn_oplog_entry_bytes = txn_oplog_entry_bytes
        self.txn_oplog_entry_ops = txn_oplog_entry_ops
        self.catalog: dict[tuple[str, str], Collection] = {}
        # Databases whose last collection was dropped: mongod keeps such a database open (in
        # its DatabaseHolder) until dropDatabase, which then still logs its entry.
        self.emptied_dbs: set[str] = set()
        self.images = StoreImages(self)
        # Snapshot reads outside transactions (readConcern "snapshot"): the read-only
        # transaction each point in time is read through (commands/transactions.py).
        self.snapshot_reads_at: dict[Timestamp, Txn] = {}
        self.oplog_size_bytes = oplog_size_bytes
        # mongod's oplogMinRetentionHours: entries younger than this stay even past the size
        # (0: the size alone decides).
        self.oplog_min_retention_hours = oplog_min_retention_hours
        super().__init__()  # EntryList: the oplog's bytes, timestamps, decoded window
        self._oplog_bytes = 0
        self._pending: list[tuple[Timestamp, bytes]] = []
        self._last_ts = Timestamp(0, 0)
        self._depth = 0
        self._lock = threading.RLock()
        self.listeners: list[Callable[[], None]] = []
        # session_key(lsid) -> its session (active txnNumber, statements, transaction)
        self.sessions: dict[bytes, Session] = {}
        # config.transactions documents this batch wrote, made durable with its oplog entries
        self._session_records: dict[bytes, dict[str, Any]] = {}
        self._session_undo: dict[bytes, Any] = {}  # see StoreState
        self.commit_failing = False
        # config.transactions: session_key -> its document (what `find` on it reads)
        self.transaction_records: dict[bytes, dict[str, Any]] = {}
        self._pre_image_ts: dict[bytes, Timestamp] = {}
        # key -> (_id, operationTime) of each config.system.preimages document
        self._pre_image_meta: dict[bytes, tuple[dict[str, Any], datetime.datetime]] = {}
        self.txn: Txn | None = None  # the transaction of the command running now
        # (collection uuid, document key) -> the transaction in progress that wrote it
        self._owners: dict[tuple[bytes, bytes], Txn] = {}
        # (collection uuid, unique index name, index key) -> the transaction in progress
        # that added or removed it
        self._index_owners: dict[tuple[bytes, str, bytes], Txn] = {}
        self._live: dict[int, Txn] = {}  # id -> each transaction in progress
        # commit sequence number: +1 per committed write (a transaction, a drop, a rename: +1)
        self._seq = 0
        self._history: list[_Version] = []  # kept while an older snapshot is open
        # (since, until, (db, name), collection) of each name the catalog no longer has (a
        # drop, a rename) while an older snapshot is open: see CatalogMixin._retire
        self._retired: list[tuple[int, int, tuple[str, str], Collection]] = []
        self._last_write: dict[tuple[bytes, bytes], int] = {}  # seq of each in _history
        # collection uuid -> the running transaction's view of its documents, which stands in
        # for its working set (until its command's batch ends)
        self._views: dict[bytes, Any] = {}
        # mongod's transactionLifetimeLimitSeconds: older transactions are aborted; 0: never
        self.transaction_lifetime_limit_seconds = transaction_lifetime_limit_seconds
        self.waiting_writes = 0  # writes waiting now for a transaction to end
        # lsid id -> its `config.image_collection` document (retryable findAndModify images)
        self.retry_images: dict[bytes, dict[str, Any]] = {}
        self.persist = Persistence(data_dir, synchronous) if data_dir else None
        if self.persist is not None:
            try:
                self._load()
            except (sqlite3.DatabaseError, bson.errors.BSONError) as exc:
                # Rows SQLite's check let through but that are not what was written: refused
                # whole, never served half-loaded.
                self.persist.close()
                raise corrupt(self.persist.path, exc) from None

    # -- loading ----------------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.persist is not None
        for db, coll, uuid, meta_raw in self.persist.collections():
            meta = bson_bytes.decode(meta_raw, _DECODE)
            c = Collection(db, coll, bytes(uuid), meta["options"], meta["indexes"])
            self.catalog[(db, coll)] = c
            for key, raw in self.persist.documents(c.uuid):
                c.records[bytes(key)] = bson_bytes.decode(raw, _DECODE)
            self._rebuild_unique(c)
        for ts_value, raw in self.persist.oplog():
            raw = bytes(raw)
            self._raw.append(raw)
            self._ts.append(int_ts(ts_value))
            self._oplog_bytes += len(raw)
        if self._ts:
            self._last_ts = self._ts[-1]
        for _, raw in self.persist.retry_images():
            doc = bson_bytes.decode(raw, _DECODE)
            self.retry_images[session_key(doc["_id"])] = doc
        self._load_sessions()
        for key, ts_value, raw in self.persist.pre_images():
            doc = bson_bytes.decode(raw, _DECODE)
            self.images._pre_images[bytes(key)] = doc["preImage"]
            self._pre_image_ts[bytes(key)] = int_ts(ts_value)
            self._pre_image_meta[bytes(key)] = (doc["_id"], doc["operationTime"])

    def byte_size(self) -> int:
        return self._oplog_bytes  # the running total its capping keeps

    @property
    def data_dir(self) -> str | None:
        """The directory the store persists in (mongod's dbPath); None in memory."""
        return os.path.dirname(self.persist.path) if self.persist is not None else None

    def close(self) -> None:
        if self.persist is not None:
            self.persist.close()
