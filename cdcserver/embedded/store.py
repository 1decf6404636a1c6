"""The embedded store: documents, catalog, unique indexes, and the oplog mongod 8.0 would write.

The working set is an in-memory mongomock server (query, update and aggregation semantics come
from mongomock, see `engine.py`). Every write goes through this module one document at a time,
as mongod does, and leaves:

* the document change in the working set (and, in durable mode, in SQLite, `persist.py`);
* one oplog entry shaped as mongod 8.0 writes it (field order `[lsid, txnNumber,] op, ns, ui,
  o, o2, [stmtId,] ts, t, v, wall[, prevOpTime]`, `ts` strictly increasing);
* a `config.system.preimages` document when the collection has
  `changeStreamPreAndPostImages.enabled`.

A command runs inside `with store.batch():`; its oplog entries become visible to readers (and
durable) together when the batch ends, before the reply is sent.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import sqlite3
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any, NoReturn

import bson
import bson.errors
import mongomock
from bson.binary import Binary
from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.embedded import engine
from cdcserver.embedded.bson_depth import check_insert_depth, check_update_depth
from cdcserver.embedded.persist import Persistence, corrupt, int_ts
from cdcserver.sources.base import EntryList
from pipeline_stages import keystring
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import (
    Document,
    MemoryImageSource,
    _pre_image_key,
    matches_document_key,
    pre_image_id,
)
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.value_string import bson_obj_string

try:  # mongod's $v:2 diff, written by update_diff.py
    from cdcserver.embedded.update_diff import (  # type: ignore[attr-defined]
        modifier_update_diff,
        pipeline_update_diff,
    )
except ImportError:  # pragma: no cover - until update_diff.py lands
    modifier_update_diff = None
    pipeline_update_diff = None

ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
SYSTEM_VIEWS = "system.views"
VIEW_MAX_DEPTH = 20  # ViewGraph::kMaxViewDepth
TXN_OPLOG_ENTRY_OPS = 2**31 - 1  # maxNumberOfTransactionOperationsInSingleOplogEntry
_BSON_ARRAY_ELEMENT_OVERHEAD = 8  # TransactionOperations::ApplyOpsInfo
_REPL_OPERATION_OVERHEAD = 256  # ~sizeof(DurableReplOperation) + its stmtId vector
NULL_OP_TIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}
MAX_BSON = 16 * 1024 * 1024
# CollectionOptions::toBSON's order (mongod 8.0), used for create entries and listCollections.
OPTION_ORDER = (
    "clusteredIndex", "capped", "size", "max", "autoIndexId", "temp",
    "changeStreamPreAndPostImages", "storageEngine", "indexOptionDefaults", "validator",
    "validationLevel", "validationAction", "collation", "viewOn", "pipeline", "timeseries",
    "expireAfterSeconds", "encryptedFields",
)
_DECODE = CodecOptions(tz_aware=False)


def id_key(value: Any) -> bytes:
    """Bytes equal exactly when two `_id` values are equal (their KeyString)."""
    return keystring.encode_values((value,))[0]


def ordered_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: options[k] for k in OPTION_ORDER if k in options}
    if out.get("changeStreamPreAndPostImages", {}).get("enabled") is False:
        del out["changeStreamPreAndPostImages"]  # toBSON leaves out a disabled option
    return out


BATCHED_DELETES_TARGET_DOCS = 100  # mongod's batchedDeletesTargetBatchDocs


def _ttl_date(doc: Mapping[str, Any], path: str) -> datetime.datetime | None:
    """The date a TTL index reads from `doc`: the field's date, or an array's earliest one."""
    values = _path_values(doc, path.split("."))
    dates = [v for v in values if isinstance(v, datetime.datetime)]
    if not dates:
        return None
    return min(d.replace(tzinfo=None) for d in dates)


def _now_ms() -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# ---------------------------------------------------------------------------------------------
# mongod's BSONObj::toString, as DuplicateKey messages print keys


# Documents quoted in command-level messages (duplicate keys, index specs): BSONObj::toString.
bson_string = bson_obj_string


class DocumentValidationError(MongoError):
    """121 DocumentValidationFailure, with the `errInfo` mongod adds."""

    def __init__(self, doc_id: Any, details: dict[str, Any] | None = None) -> None:
        super().__init__(121, "Document failed validation")
        self.err_info: dict[str, Any] = {"failingDocumentId": doc_id}
        if details is not None:
            self.err_info["details"] = details

    def extra(self) -> dict[str, Any]:
        return {"errInfo": self.err_info}

    def to_reply(self) -> dict[str, object]:
        reply = super().to_reply()
        labels = reply.pop("errorLabels", None)
        reply.update(self.extra())
        if labels:
            reply["errorLabels"] = labels
        return reply


class DuplicateKeyError(MongoError):
    """11000, with the `keyPattern` / `keyValue` fields mongod adds to the error."""

    def __init__(self, ns: str, index: str, pattern: dict, key_value: dict) -> None:
        super().__init__(
            11000,
            f"E11000 duplicate key error collection: {ns} index: {index} dup key: "
            f"{bson_string(key_value)}",
        )
        self.key_pattern = pattern
        self.key_value = key_value

    def extra(self) -> dict[str, Any]:
        return {"keyPattern": self.key_pattern, "keyValue": self.key_value}

    def to_reply(self) -> dict[str, object]:
        reply = super().to_reply()
        labels = reply.pop("errorLabels", None)
        reply.update(self.extra())
        if labels:
            reply["errorLabels"] = labels
        return reply


# ---------------------------------------------------------------------------------------------
# Catalog


@dataclass
class Collection:
    db: str
    name: str
    uuid: bytes
    options: dict[str, Any] = field(default_factory=dict)
    indexes: list[dict[str, Any]] = field(default_factory=lambda: [dict(ID_INDEX)])
    # unique index name -> index key bytes -> document key
    unique: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    # the transaction in progress that created it (mongod's UncommittedCatalogUpdates): it is
    # durable and others may write to it only once that transaction commits
    created_by: Txn | None = None

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def ui(self) -> Binary:
        return Binary(self.uuid, 4)

    @property
    def pre_images(self) -> bool:
        opt = self.options.get("changeStreamPreAndPostImages")
        return isinstance(opt, Mapping) and opt.get("enabled") is True

    def check_valid(self, doc: Mapping[str, Any], pre: Mapping[str, Any] | None = None) -> None:
        """The collection's validator, as mongod applies it (`validationLevel` strict or
        moderate, `validationAction` error or warn), `$jsonSchema` included."""
        validator = self.options.get("validator")
        if not validator:
            return
        level = self.options.get("validationLevel", "strict")
        if level == "off" or self.options.get("validationAction", "error") != "error":
            return
        try:
            failed, details = engine.validator_failure(validator, doc)
            if not failed:
                return
            if level == "moderate" and pre is not None and engine.validator_failure(
                validator, pre
            )[0]:
                return  # moderate: documents already invalid may stay invalid
        except MongoError as exc:
            if "not supported" in exc.errmsg or "not implemented" in exc.errmsg:
                return
            raise
        raise DocumentValidationError(doc.get("_id"), details)

    def meta_bytes(self) -> bytes:
        return bson.encode({"options": self.options, "indexes": self.indexes})

    def index(self, name: str) -> dict[str, Any] | None:
        return next((i for i in self.indexes if i["name"] == name), None)


def _path_values(value: Any, parts: Sequence[str]) -> list[Any]:
    """The values an index key path reaches (arrays expand to their elements)."""
    if not parts:
        if isinstance(value, list):
            return list(value) if value else [None]
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        if head not in value:
            return [None]
        return _path_values(value[head], rest)
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            return _path_values(value[int(head)], rest)
        out: list[Any] = []
        for element in value:
            out.extend(_path_values(element, parts) if isinstance(element, Mapping) else [None])
        return out or [None]
    return [None]


def index_entries(spec: Mapping[str, Any], doc: Mapping[str, Any]) -> list[tuple[bytes, dict]]:
    """(key bytes, {field: value}) of each index key `doc` produces in the index `spec`."""
    fields = list(spec["key"])
    if spec.get("sparse") and all(
        _path_values(doc, f.split(".")) == [None] and not _has_path(doc, f) for f in fields
    ):
        return []
    pfe = spec.get("partialFilterExpression")
    if pfe is not None and not engine.matches(pfe, doc):
        return []
    per_field = [_path_values(doc, f.split(".")) for f in fields]
    out = []
    seen: set[bytes] = set()
    for combo in product(*per_field):
        key = keystring.encode_values(combo)[0]
        if key not in seen:
            seen.add(key)
            out.append((key, dict(zip(fields, combo))))
    return out


def _has_path(doc: Any, path: str) -> bool:
    for part in path.split("."):
        if isinstance(doc, Mapping) and part in doc:
            doc = doc[part]
        else:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Sessions (retryable writes)


@dataclass
class OpSession:
    """The `lsid` / `txnNumber` a retryable write carries into its oplog entries."""

    lsid: dict[str, Any]
    txn_number: int
    prev_ts: Timestamp | None = None


@dataclass(frozen=True)
class LoggedWrite:
    """A retryable write statement known from its oplog entry only (the store was restarted
    since): what mongod rebuilds a retried statement's result from (`config.transactions`
    points it at the entry)."""

    op: str  # i | u | d
    doc_id: Any
    ts: Timestamp | None = None  # the entry's
    needs_retry_image: str | None = None  # the entry's `needsRetryImage` (findAndModify)


@dataclass(eq=False)
class Txn:
    """A multi-document transaction in progress, isolated as mongod's are (read concern
    "snapshot"): it sees what was committed when it started plus its own writes; nobody else
    sees its writes before it commits.

    Its writes go to its own overlay (its latest version of each document it wrote, None once
    deleted), never to the working set, which holds committed documents only. We chose this
    over keeping committed pre-versions next to uncommitted documents in the working set: every
    read outside transactions (the common case, and change streams' `updateLookup`) stays on
    the working set untouched, and an abort only drops the overlay. The transaction's own
    commands read a view built for it (`Store._view`): the working set, minus what was
    committed since its snapshot (`Store._history`), plus its overlay. At commit the overlay is
    applied to the working set and logged as one `applyOps` entry (or a `partialTxn` chain of
    them when large, as mongod does); its documents reach SQLite then.

    An instance without `lsid` collects the deletes of one batched (TTL) delete, which are
    applied at once."""

    lsid: dict[str, Any]
    txn_number: int
    ops: list[dict[str, Any]] = field(default_factory=list)
    persist: list[tuple[bytes, bytes, bytes | None]] = field(default_factory=list)
    pre_images: list[tuple[Collection, int, dict[str, Any]]] = field(default_factory=list)
    state: str = "in progress"  # | committed | aborted
    snapshot: int = 0  # the store's commit sequence number when it started
    # collection uuid -> document key -> (its version here or None once deleted, whether it is
    # a record the transaction inserted: last in natural order)
    overlay: dict[bytes, dict[bytes, tuple[dict[str, Any] | None, bool]]] = field(
        default_factory=dict
    )
    colls: dict[bytes, Collection] = field(default_factory=dict)
    # (collection uuid, document key) of each document it wrote: its write locks
    keys: set[tuple[bytes, bytes]] = field(default_factory=set)
    # (collection uuid, unique index name, index key) its writes added or removed: locked too
    index_keys: set[tuple[bytes, str, bytes]] = field(default_factory=set)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set at commit or abort
    expiry: asyncio.TimerHandle | None = None  # transactionLifetimeLimitSeconds


def session_key(lsid: Mapping[str, Any]) -> bytes:
    """A logical session's key: its id and its user digest (`{id, uid}`), so the same id from
    another user is another session, as in mongod's session catalog."""
    return bytes(lsid["id"]) + bytes(lsid["uid"])


@dataclass(eq=False)
class Session:
    """A logical session as mongod's session catalog and `config.transactions` know it: the
    active txnNumber, which is a retryable write (`txn` None: its executed statements) or a
    multi-document transaction (`txn`, in progress, committed or aborted)."""

    lsid: dict[str, Any]  # {id, uid}
    txn_number: int = -1  # kUninitializedTxnNumber
    txn: Txn | None = None
    stmts: dict[int, Any] = field(default_factory=dict)  # retryable write: stmtId -> result
    last_write: Timestamp | None = None  # its latest oplog entry: the next one's prevOpTime
    incomplete: bool = False  # the capped oplog lost part of its statements' history

    def set_txn_number(self, txn_number: int, txn: Txn | None) -> None:
        self.txn_number, self.txn = txn_number, txn
        self.stmts = {}
        self.last_write, self.incomplete = None, False


class TxnBlocked(Exception):  # noqa: N818 - a signal to the command, never a reply
    """A write outside transactions met a document (or unique index key) that an open
    transaction has written. mongod's writeConflictRetry makes such a write wait until the
    transaction commits or aborts, then retry; this is raised before the statement changed
    anything, so the command can await `txn.ended` and go on from that statement."""

    def __init__(self, txn: Txn) -> None:
        super().__init__("write blocked by an open transaction")
        self.txn = txn


@dataclass
class _Version:
    """A committed version that a write replaced while a transaction that started before it was
    open: what that transaction's snapshot still sees."""

    seq: int
    uuid: bytes
    key: bytes
    before: dict[str, Any] | None  # None: the write inserted the document
    deleted: bool  # the write deleted it; it goes back after `pred` (its predecessor then)
    pred: bytes | None


# ---------------------------------------------------------------------------------------------
# Images for the change-stream pipeline


class StoreImages(MemoryImageSource):
    """Pre-images kept by the store; `updateLookup` reads the store's current documents."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        meta = self.store.catalog.get((db, coll))
        if meta is None or (uuid is not None and bytes(uuid) != meta.uuid):
            return [None] * len(keys)
        docs = self.store.documents(meta)
        out: list[Document | None] = []
        for key in keys:
            if "_id" in key:
                doc = docs.get(id_key(key["_id"]))
                out.append(doc if doc is not None and matches_document_key(doc, key) else None)
            else:
                out.append(
                    next((d for d in docs.values() if matches_document_key(d, key)), None)
                )
        return out


# ---------------------------------------------------------------------------------------------
# The store


class Store(EntryList):
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
        # mongod's TTL monitor pass interval (ttlMonitorSleepSecs); 0 turns the monitor off.
        self.ttl_monitor_sleep_secs = ttl_monitor_sleep_secs
        # How mongod splits a transaction into applyOps entries: BSONObjMaxUserSize and the
        # maxNumberOfTransactionOperationsInSingleOplogEntry server parameter.
        self.txn_oplog_entry_bytes = txn_oplog_entry_bytes
        self.txn_oplog_entry_ops = txn_oplog_entry_ops
        self.client = mongomock.MongoClient()
        self.server_store = self.client._store
        self.catalog: dict[tuple[str, str], Collection] = {}
        # Databases whose last collection was dropped: mongod keeps such a database open (in
        # its DatabaseHolder) until dropDatabase, which then still logs its entry.
        self.emptied_dbs: set[str] = set()
        self.images = StoreImages(self)
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
        self._seq = 0  # commit sequence number: +1 per committed write (a transaction: +1)
        self._history: list[_Version] = []  # kept while an older snapshot is open
        self._last_write: dict[tuple[bytes, bytes], int] = {}  # seq of each in _history
        # collection uuid -> (its mongomock store, its working-set documents) while the running
        # transaction's view stands in for them (until its command's batch ends)
        self._views: dict[bytes, tuple[Any, Any]] = {}
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

    # -- loading --------------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.persist is not None
        for db, coll, uuid, meta_raw in self.persist.collections():
            meta = bson.decode(meta_raw, _DECODE)
            c = Collection(db, coll, bytes(uuid), meta["options"], meta["indexes"])
            self.catalog[(db, coll)] = c
            cs = self._cs(c)
            cs.create()
            for key, raw in self.persist.documents(c.uuid):
                cs[bytes(key)] = bson.decode(raw, _DECODE)
            self._rebuild_unique(c)
        for ts_value, raw in self.persist.oplog():
            raw = bytes(raw)
            self._raw.append(raw)
            self._ts.append(int_ts(ts_value))
            self._oplog_bytes += len(raw)
        if self._ts:
            self._last_ts = self._ts[-1]
        for _, raw in self.persist.retry_images():
            doc = bson.decode(raw, _DECODE)
            self.retry_images[session_key(doc["_id"])] = doc
        self._load_sessions()
        for key, ts_value, raw in self.persist.pre_images():
            doc = bson.decode(raw, _DECODE)
            self.images._pre_images[bytes(key)] = doc["preImage"]
            self._pre_image_ts[bytes(key)] = int_ts(ts_value)
            self._pre_image_meta[bytes(key)] = (doc["_id"], doc["operationTime"])

    def session(self, lsid: dict[str, Any]) -> Session:
        """The session of `lsid` (`{id, uid}`), made on first use."""
        key = session_key(lsid)
        found = self.sessions.get(key)
        if found is None:
            found = self.sessions[key] = Session(lsid)
        return found

    def _load_sessions(self) -> None:
        """Each session's active txnNumber as `config.transactions` recorded it (a committed
        transaction's outcome, a retryable write's last entry), and the statements a retryable
        write executed, from its oplog chain: what makes a retried commit answer ok and a
        retried statement not run again after a restart."""
        assert self.persist is not None
        entries: dict[Timestamp, dict[str, Any]] = {}
        for raw in self._raw:
            if raw[5:10] == b"lsid\x00":  # `lsid` is the first field when present
                entry = decode_entry(raw)
                if entry.get("txnNumber") is not None:
                    entries[entry["ts"]] = entry
        records = [bson.decode(bytes(raw), _DECODE) for _, raw in self.persist.transactions()]
        for record in records:
            self.transaction_records[session_key(record["_id"])] = record
            session = self.session(dict(record["_id"]))
            session.txn_number = int(record["txnNum"])
            session.last_write = record["lastWriteOpTime"]["ts"]
            if record.get("state") == "committed":
                session.txn = Txn(session.lsid, session.txn_number, state="committed")
                session.txn.ended.set()
                continue
            ts = session.last_write
            while ts != NULL_OP_TIME["ts"]:  # the retryable write's chain, newest first
                entry = entries.get(ts)
                if entry is None:  # truncated from the capped oplog
                    session.incomplete = True
                    break
                self._record_statements(session, entry)
                ts = entry.get("prevOpTime", NULL_OP_TIME)["ts"]
        recorded = {session_key(r["_id"]) for r in records}
        for entry in entries.values():  # sessions last written before records were kept
            if session_key(entry["lsid"]) not in recorded:
                self._load_from_entry(entry)

    def _load_from_entry(self, entry: dict[str, Any]) -> None:
        session = self.session(dict(entry["lsid"]))
        number, op = int(entry["txnNumber"]), entry.get("op")
        if number < session.txn_number:
            return
        applied = op == "c" and "applyOps" in entry["o"]
        if number > session.txn_number:
            session.set_txn_number(number, None)
        if applied and not entry["o"].get("partialTxn") and not entry["o"].get("prepare"):
            session.txn = Txn(session.lsid, number, state="committed")
            session.txn.ended.set()
        elif session.txn is None:
            self._record_statements(session, entry)
        session.last_write = entry["ts"]

    @staticmethod
    def _record_statements(session: Session, entry: dict[str, Any]) -> None:
        op, stmt = entry.get("op"), entry.get("stmtId")
        if stmt is None or op not in ("i", "u", "d"):
            return
        doc_key = entry["o2"] if op == "u" else entry["o"]
        for stmt_id in stmt if isinstance(stmt, list) else [stmt]:
            session.stmts[int(stmt_id)] = LoggedWrite(
                op, doc_key.get("_id"), entry["ts"], entry.get("needsRetryImage")
            )

    def close(self) -> None:
        if self.persist is not None:
            self.persist.close()

    # -- the TTL monitor ------------------------------------------------------------------------

    async def ttl_monitor(self) -> None:
        """mongod's TTL monitor: a pass every `ttl_monitor_sleep_secs`. The server runs it among
        its background tasks (the store lives on the server's loop) and cancels it at close."""
        if self.ttl_monitor_sleep_secs <= 0:
            return
        while True:
            await asyncio.sleep(self.ttl_monitor_sleep_secs)
            self.ttl_pass()

    def ttl_pass(self, now: datetime.datetime | None = None) -> int:
        """One TTL monitor pass: delete the documents whose TTL index date is past
        `expireAfterSeconds` (the earliest date of an array; non-dates never expire). As mongod
        8.0 does it: deletes batched per index into one `applyOps` entry (without lsid) of up to
        `batchedDeletesTargetBatchDocs` (100), a batch of one as a plain delete entry, and one
        delete entry per document on collections with pre-images (their deletes are not
        batched). Returns the number of documents deleted."""
        now = (now or datetime.datetime.now(datetime.UTC)).replace(tzinfo=None)
        deleted = 0
        with self.batch():
            if self.txn is not None:
                return 0
            for c in list(self.catalog.values()):
                for spec in list(c.indexes[1:]):
                    expire = spec.get("expireAfterSeconds")
                    if expire is None or len(spec["key"]) != 1:
                        continue
                    field_path = next(iter(spec["key"]))
                    limit = now - datetime.timedelta(seconds=float(expire))
                    expired = []
                    for key, doc in self.documents(c).items():
                        if (c.uuid, key) in self._owners:
                            continue  # mongod's pass meets a write conflict: a later pass
                        when = _ttl_date(doc, field_path)
                        if when is not None and when <= limit:
                            expired.append((when, doc))
                    expired.sort(key=lambda pair: pair[0])  # the index's order
                    docs = [doc for _, doc in expired]
                    if c.pre_images:
                        for doc in docs:
                            self.delete_document(c, doc)
                    else:
                        for i in range(0, len(docs), BATCHED_DELETES_TARGET_DOCS):
                            self._batched_delete(c, docs[i:i + BATCHED_DELETES_TARGET_DOCS])
                    deleted += len(docs)
        return deleted

    def _batched_delete(self, c: Collection, docs: list[dict[str, Any]]) -> None:
        if len(docs) == 1:
            self.delete_document(c, docs[0])
            return
        batch = Txn({}, -1)  # collects the deletes as a transaction collects its operations
        self.txn = batch
        try:
            for doc in docs:
                self.delete_document(c, doc)
        finally:
            self.txn = None
        self.log("c", "admin.$cmd", {"applyOps": batch.ops})
        if self.persist is not None:
            for uuid, key, _ in batch.persist:
                self.persist.delete_document(uuid, key)

    # -- batches --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One command's writes: durable and visible together when the outermost batch ends."""
        with self._lock:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.txn = None
                    self._restore_views()
                    self._commit()

    def _commit(self) -> None:
        if self.persist is not None:
            for key, record in self._session_records.items():  # same SQLite transaction
                self.persist.put_transaction(key, bson.encode(record))
            self.persist.commit()
        self.transaction_records.update(self._session_records)
        self._session_records.clear()
        if not self._pending:
            return
        for ts, raw in self._pending:
            self._raw.append(raw)
            self._ts.append(ts)
            self._oplog_bytes += len(raw)
        self._pending.clear()
        self._truncate()
        for listener in list(self.listeners):
            listener()

    def _truncate(self) -> None:
        """Capped oplog: drop the oldest entries beyond the size (never the newest one), but
        none younger than the minimum retention: as mongod, the oplog then grows past its size
        until they are old enough (dropped at a later write, e.g. the periodic no-op)."""
        if self._oplog_bytes <= self.oplog_size_bytes:
            return
        hours = self.oplog_min_retention_hours
        # An entry's ts carries its wall-clock second, which mongod's retention compares.
        keep_from = time.time() - hours * 3600 if hours > 0 else None
        n = 0
        while self._oplog_bytes > self.oplog_size_bytes and n < len(self._raw) - 1:
            if keep_from is not None and self._ts[n].time > keep_from:
                break
            self._oplog_bytes -= len(self._raw[n])
            n += 1
        if not n:
            return
        del self._raw[:n]
        del self._ts[:n]
        oldest = self._ts[0]
        for key in [k for k, doc in self._pre_image_ts.items() if doc < oldest]:
            self.images._pre_images.pop(key, None)
            self._pre_image_meta.pop(key, None)
            del self._pre_image_ts[key]
        if self.persist is not None:
            self.persist.truncate_oplog(oldest)
            self.persist.commit()

    # -- the oplog ------------------------------------------------------------------------------

    def _next_ts(self) -> Timestamp:
        now = int(time.time())
        last = self._last_ts
        ts = Timestamp(now, 1) if now > last.time else Timestamp(last.time, last.inc + 1)
        self._last_ts = ts
        return ts

    def log(
        self,
        op: str,
        ns: str,
        o: Mapping[str, Any],
        *,
        ui: Binary | None = None,
        o2: Mapping[str, Any] | None = None,
        session: OpSession | None = None,
        stmt_id: int | None = None,
        wall: datetime.datetime | None = None,
        needs_retry_image: str | None = None,
    ) -> tuple[Timestamp, datetime.datetime]:
        if self.txn is not None and (op in ("i", "u", "d") or (op == "c" and self.txn.lsid)):
            # DDL in a transaction (create, createIndexes on a new collection) is one of the
            # transaction's operations, logged in its applyOps as mongod's OpObserver does
            inner: dict[str, Any] = {"op": op, "ns": ns, "ui": ui, "o": o}
            if o2 is not None:
                inner["o2"] = o2
            self.txn.ops.append(inner)
            return Timestamp(0, len(self.txn.ops) - 1), _now_ms()
        ts = self._next_ts()
        wall = wall or _now_ms()
        entry: dict[str, Any] = {}
        if session is not None:
            entry["lsid"] = session.lsid
            entry["txnNumber"] = Int64(session.txn_number)
        entry["op"] = op
        entry["ns"] = ns
        if ui is not None:
            entry["ui"] = ui
        entry["o"] = o
        if o2 is not None:
            entry["o2"] = o2
        if needs_retry_image is not None:
            entry["needsRetryImage"] = needs_retry_image
        if session is not None and stmt_id is not None:
            entry["stmtId"] = stmt_id
        entry["ts"] = ts
        entry["t"] = Int64(1)
        entry["v"] = Int64(2)
        entry["wall"] = wall
        if session is not None:
            prev = session.prev_ts
            entry["prevOpTime"] = (
                dict(NULL_OP_TIME) if prev is None else {"ts": prev, "t": Int64(1)}
            )
            session.prev_ts = ts
            # config.transactions: the session's txnNumber and last write, durable with it
            self._session_records[session_key(session.lsid)] = {
                "_id": session.lsid, "txnNum": Int64(session.txn_number),
                "lastWriteOpTime": {"ts": ts, "t": Int64(1)}, "lastWriteDate": wall,
            }
        raw = bson.encode(entry)
        self._pending.append((ts, raw))
        if self.persist is not None:
            self.persist.append_oplog(ts, raw)
        return ts, wall

    def oplog_entries(self) -> list[bytes]:
        return list(self._raw)

    def oplog_count(self) -> int:
        return len(self._raw)

    def noop(self, msg: str = "periodic noop") -> None:
        with self.batch():
            self.log("n", "", {"msg": msg})

    # -- catalog --------------------------------------------------------------------------------

    def _cs(self, c: Collection) -> Any:
        return self.server_store[c.db][c.name]

    def documents(self, c: Collection) -> dict[bytes, dict[str, Any]]:
        txn = self.txn
        if txn is not None and txn.lsid and c.uuid not in self._views and (
            c.uuid in txn.overlay or self._history
        ):
            self._swap_view(c, txn)
        return self._cs(c)._documents

    def mongomock_collection(self, db: str, coll: str) -> mongomock.Collection:
        return self.client[db][coll]

    def get(self, db: str, coll: str) -> Collection | None:
        return self.catalog.get((db, coll))

    def databases(self) -> list[str]:
        return sorted({db for db, _ in self.catalog})

    def collections_of(self, db: str) -> list[Collection]:
        return sorted((c for (d, _), c in self.catalog.items() if d == db), key=lambda c: c.name)

    def _save_meta(self, c: Collection) -> None:
        if self.persist is not None and c.created_by is None:  # else at its commit
            self.persist.put_collection(c.db, c.name, c.uuid, c.meta_bytes())

    def create_collection(
        self, db: str, coll: str, options: Mapping[str, Any] | None = None,
        id_index: Mapping[str, Any] | None = None,
    ) -> Collection:
        validate_collection_name(db, coll)
        options = ordered_options(options or {})
        c = Collection(db, coll, uuid_module.uuid4().bytes, options)
        # The _id index as mongod builds it: the requested version, its own name and key, and
        # the collection's default collation; a clustered collection has none (its clustered
        # index, an option, takes its place).
        id_spec: dict[str, Any] | None = {
            "v": (id_index or {}).get("v", 2), "key": {"_id": 1}, "name": "_id_"
        }
        collation = options.get("collation")
        if isinstance(collation, Mapping) and collation.get("locale") != "simple":
            id_spec["collation"] = collation
        if "clusteredIndex" in options:
            id_spec = None
        else:
            c.indexes[0] = id_spec
        txn = self._txn()
        if txn is not None:
            c.created_by = txn
            txn.colls[c.uuid] = c
        self.catalog[(db, coll)] = c
        cs = self._cs(c)
        cs.drop()
        cs.create()
        self._save_meta(c)
        self.log("c", f"{db}.$cmd",
                 {"create": coll, **options, **({"idIndex": id_spec} if id_spec else {})},
                 ui=c.ui)
        return c

    def ensure_collection(self, db: str, coll: str) -> Collection:
        c = self.catalog.get((db, coll))
        if c is not None:
            return c
        self.check_not_view(db, coll)
        return self.create_collection(db, coll)

    # -- views ----------------------------------------------------------------------------------
    # As on mongod, a view is a document `{_id: "<db>.<view>", viewOn, pipeline[, collation]}`
    # of the collection `<db>.system.views` (created with the first view); creating, modifying
    # and dropping a view insert, replace and delete that document, which is all the oplog
    # records (and what change streams turn into create/modify/drop events).

    def view(self, db: str, name: str) -> dict[str, Any] | None:
        """The definition of the view `db.name`, or None."""
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:
            return None
        return self.documents(system_views).get(id_key(f"{db}.{name}"))

    def views_of(self, db: str) -> list[dict[str, Any]]:
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:
            return []
        prefix = db + "."
        return [d for d in self.documents(system_views).values()
                if isinstance(d.get("_id"), str) and d["_id"].startswith(prefix)]

    def check_not_view(self, db: str, coll: str) -> None:
        """166 CommandNotSupportedOnView, as mongod refuses writes and collection commands on a
        view."""
        if self.view(db, coll) is not None:
            raise MongoError(166, f"Namespace {db}.{coll} is a view, not a collection")

    def put_view(
        self, db: str, name: str, view_on: str, pipeline: list[Any],
        collation: Mapping[str, Any] | None = None,
    ) -> None:
        """Create or redefine a (validated) view: an insert into `system.views`, or a
        replacement of its document (mongod's ViewsForDatabase::_upsertIntoCatalog)."""
        doc: dict[str, Any] = {"_id": f"{db}.{name}", "viewOn": view_on, "pipeline": pipeline}
        if collation:
            doc["collation"] = dict(collation)
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        if system_views is None:  # mongod creates it in its own write unit, before the insert
            system_views = self.create_collection(db, SYSTEM_VIEWS)
        old = self.documents(system_views).get(id_key(doc["_id"]))
        if old is None:
            self.insert_document(system_views, doc)
        else:
            self.update_document(system_views, old, doc, kind="replacement", update=doc)

    def drop_view(self, db: str, name: str) -> bool:
        system_views = self.catalog.get((db, SYSTEM_VIEWS))
        old = self.view(db, name)
        if system_views is None or old is None:
            return False
        self.delete_document(system_views, old)
        return True

    def resolve_view(self, db: str, name: str) -> tuple[str, list[Any]] | None:
        """(the collection a view reads, the pipeline that reads it: the innermost view's
        stages first), or None when `db.name` is no view (view_catalog_helpers::resolveView)."""
        pipeline: list[Any] = []
        current = name
        for _ in range(VIEW_MAX_DEPTH):
            view = self.view(db, current)
            if view is None:
                return (current, pipeline) if current != name else None
            pipeline = [*view.get("pipeline", []), *pipeline]
            current = view["viewOn"]
        raise MongoError(165, "View depth too deep or view cycle detected; maximum depth is "
                         f"{VIEW_MAX_DEPTH}")

    def drop_collection(self, db: str, coll: str) -> Collection | None:
        c = self.catalog.pop((db, coll), None)
        if c is None:
            return None
        n = len(self.documents(c))
        self._cs(c).drop()
        self.server_store[db]._collections.pop(coll, None)
        if self.persist is not None:
            self.persist.delete_collection(db, coll, c.uuid)
        self.log("c", f"{db}.$cmd", {"drop": coll}, ui=c.ui, o2={"numRecords": n})
        if not self.collections_of(db):
            self.emptied_dbs.add(db)
        return c

    def drop_database(self, db: str) -> bool:
        colls = self.collections_of(db)
        if not colls and db not in self.emptied_dbs:
            return False
        for c in colls:
            self.drop_collection(db, c.name)
        self.emptied_dbs.discard(db)
        self.log("c", f"{db}.$cmd", {"dropDatabase": 1})
        return True

    def rename_collection(
        self, src: Collection, to_db: str, to_coll: str, drop_target: bool, stay_temp: bool = False
    ) -> None:
        validate_collection_name(to_db, to_coll)
        target = self.catalog.get((to_db, to_coll))
        if src.db != to_db:
            self._rename_across_databases(src, to_db, to_coll, drop_target)
            return
        o: dict[str, Any] = {
            "renameCollection": src.ns, "to": f"{to_db}.{to_coll}", "stayTemp": stay_temp,
        }
        if target is not None:
            o["dropTarget"] = target.ui
            self.catalog.pop((to_db, to_coll))
            self._cs(target).drop()
            if self.persist is not None:
                self.persist.delete_collection(to_db, to_coll, target.uuid)
        self.log("c", f"{src.db}.$cmd", o, ui=src.ui)
        del self.catalog[(src.db, src.name)]
        store_db = self.server_store[src.db]
        cs = store_db._collections.pop(src.name)
        cs.name = to_coll
        store_db._collections[to_coll] = cs
        if self.persist is not None:
            self.persist.rename_collection(src.db, src.name, to_db, to_coll)
        src.name = to_coll
        self.catalog[(to_db, to_coll)] = src
        if "temp" in src.options and not stay_temp:
            del src.options["temp"]
            self._save_meta(src)

    def _rename_across_databases(
        self, src: Collection, to_db: str, to_coll: str, drop_target: bool
    ) -> None:
        """mongod's renameBetweenDBs: copy into a temporary collection of the target database,
        rename it onto the target, drop the source."""
        suffix = uuid_module.uuid4().hex[:5]
        tmp = self.create_collection(
            to_db, f"tmp{suffix}.renameCollection", {**src.options, "temp": True}
        )
        for spec in src.indexes[1:]:
            self._add_index(tmp, dict(spec), empty=True)
        for doc in list(self.documents(src).values()):
            self.insert_document(tmp, dict(doc))
        self.rename_collection(tmp, to_db, to_coll, drop_target, stay_temp=False)
        self.drop_collection(src.db, src.name)

    # -- indexes --------------------------------------------------------------------------------

    def _rebuild_unique(self, c: Collection) -> None:
        c.unique = {}
        for spec in c.indexes[1:]:
            if spec.get("unique"):
                self._build_unique(c, spec)

    def _build_unique(self, c: Collection, spec: dict[str, Any]) -> None:
        table: dict[bytes, bytes] = {}
        for key, doc in self.documents(c).items():
            for entry_key, key_value in index_entries(spec, doc):
                if entry_key in table and table[entry_key] != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
                table[entry_key] = key
        c.unique[spec["name"]] = table

    def _add_index(self, c: Collection, spec: dict[str, Any], empty: bool) -> None:
        if spec.get("unique"):
            self._build_unique(c, spec)
        c.indexes.append(spec)
        self._save_meta(c)
        if empty:
            self.log("c", f"{c.db}.$cmd", {"createIndexes": c.name, **spec}, ui=c.ui)

    def create_indexes(self, c: Collection, specs: list[dict[str, Any]]) -> None:
        """Add new (already validated) index specs: one `createIndexes` entry each on an empty
        collection, else a two-phase build (`startIndexBuild` + `commitIndexBuild`)."""
        if not self.documents(c):
            for spec in specs:
                self._add_index(c, spec, empty=True)
            return
        for spec in specs:
            if spec.get("unique"):
                try:
                    self._build_unique(c, spec)
                except DuplicateKeyError as exc:
                    c.unique.pop(spec["name"], None)
                    for other in specs:
                        c.unique.pop(other["name"], None) if other is not spec else None
                    raise MongoError(
                        11000,
                        f"Index build failed: {uuid_module.uuid4()}: Collection {c.ns} "
                        f"( {uuid_module.UUID(bytes=c.uuid)} ) :: caused by :: {exc.errmsg}",
                    ) from None
        build = Binary(uuid_module.uuid4().bytes, 4)
        self.log("c", f"{c.db}.$cmd",
                 {"startIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs}, ui=c.ui)
        c.indexes.extend(specs)
        self._save_meta(c)
        self.log("c", f"{c.db}.$cmd",
                 {"commitIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs}, ui=c.ui)

    def drop_index(self, c: Collection, name: str) -> None:
        spec = c.index(name)
        assert spec is not None
        c.indexes.remove(spec)
        c.unique.pop(name, None)
        self._save_meta(c)
        self.log("c", f"{c.db}.$cmd", {"dropIndexes": c.name, "index": name}, ui=c.ui, o2=spec)

    def coll_mod(
        self, c: Collection, o: dict[str, Any], new_options: dict[str, Any],
        index_changes: tuple[str, dict[str, Any], dict[str, Any]] | None,
    ) -> None:
        """Apply a validated collMod: `o` is the oplog's `o` (the options as given)."""
        o2: dict[str, Any] = {"collectionOptions_old": {"uuid": c.ui, **c.options}}
        if index_changes is not None:
            name, changes, old = index_changes
            spec = c.index(name)
            assert spec is not None
            o2["indexOptions_old"] = old
            for k, v in changes.items():
                if k == "unique" and v and spec.get("unique") is not True:
                    spec.pop("prepareUnique", None)
                    trial = {**spec, "unique": True}
                    self._build_unique(c, trial)
                if k == "hidden" and v is False:
                    spec.pop("hidden", None)
                elif k == "prepareUnique" and v is False:
                    spec.pop("prepareUnique", None)
                else:
                    spec[k] = v
        c.options = ordered_options({**c.options, **new_options})
        self._save_meta(c)
        self.log("c", f"{c.db}.$cmd", o, ui=c.ui, o2=o2)

    # -- unique checks --------------------------------------------------------------------------

    def _check_unique(
        self, c: Collection, key: bytes, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """Raise DuplicateKey if `new` (replacing `old`) collides; returns the index edits."""
        txn = self._txn()
        if txn is not None:
            self._check_unique_in_txn(txn, c, key, new)
            return []
        edits = []
        for spec in c.indexes[1:]:
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            old_keys = [k for k, _ in index_entries(spec, old)] if old is not None else []
            new_entries = index_entries(spec, new)
            for k, key_value in new_entries:
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner.state == "in progress":
                    raise TxnBlocked(owner)
                holder = table.get(k)
                if holder is not None and holder != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
            edits.append((table, old_keys, [k for k, _ in new_entries]))
        return edits

    @staticmethod
    def _apply_edits(edits: list, key: bytes) -> None:
        for table, old_keys, new_keys in edits:
            for k in old_keys:
                if table.get(k) == key:
                    del table[k]
            for k in new_keys:
                table[k] = key

    # -- document writes ------------------------------------------------------------------------

    def _txn(self) -> Txn | None:
        """The transaction the running command belongs to (not a batched delete)."""
        txn = self.txn
        return txn if txn is not None and txn.lsid else None

    def _write_conflict(self, txn: Txn) -> NoReturn:
        self.abort_transaction(txn)
        raise MongoError(
            112, "Write conflict during plan execution and yielding is disabled. :: Please "
            "retry your operation or multi-document transaction.",
            labels=["TransientTransactionError"],
        )

    def _check_write_conflict(self, c: Collection, key: bytes) -> None:
        """As on mongod: a transaction writing a document that another transaction in progress
        has written (the first writer wins), or that was committed after its snapshot, gets
        112 WriteConflict with TransientTransactionError and is aborted; a write outside
        transactions waits for the other transaction to end (TxnBlocked)."""
        txn = self._txn()
        owner = self._owners.get((c.uuid, key))
        creator = c.created_by
        if creator is not None and creator is not txn and creator.state == "in progress":
            owner = creator  # a collection another transaction is creating
        if owner is not None and owner is not txn and owner.state == "in progress":
            if txn is None:
                raise TxnBlocked(owner)
            self._write_conflict(txn)
        if txn is not None and self._last_write.get((c.uuid, key), -1) > txn.snapshot:
            self._write_conflict(txn)

    def check_ddl_lock(self, colls: Sequence[Collection]) -> None:
        """mongod's DDL takes a collection's exclusive lock, which waits for every transaction
        holding an intent lock on it (one that wrote or created it) to end: TxnBlocked, so the
        command waits as outside writes do."""
        for txn in list(self._live.values()):
            if txn.lsid and txn.state == "in progress" and any(
                c.uuid in txn.colls for c in colls
            ):
                raise TxnBlocked(txn)

    def _check_unique_in_txn(
        self, txn: Txn, c: Collection, key: bytes, new: Mapping[str, Any]
    ) -> None:
        """Unique indexes as the transaction sees them: committed keys it has not changed, and
        its own documents' keys. A key another open transaction holds, or one committed after
        its snapshot, is a write conflict (as WiredTiger reports it to mongod)."""
        entries = txn.overlay.get(c.uuid, {})
        for spec in c.indexes[1:]:
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            for k, key_value in index_entries(spec, new):
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner is not txn and owner.state == "in progress":
                    self._write_conflict(txn)
                holders = {table[k]} if k in table else set()
                holders.update(
                    other for other, (doc, _) in entries.items()
                    if doc is not None and any(e == k for e, _ in index_entries(spec, doc))
                )
                holders.discard(key)
                for holder in holders:
                    if holder in entries:
                        doc = entries[holder][0]
                        if doc is None or all(e != k for e, _ in index_entries(spec, doc)):
                            continue  # the transaction changed or deleted that document
                    elif self._last_write.get((c.uuid, holder), -1) > txn.snapshot:
                        self._write_conflict(txn)
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)

    def _release(self, txn: Txn) -> None:
        for k in txn.keys:
            if self._owners.get(k) is txn:
                del self._owners[k]
        txn.keys.clear()
        for ik in txn.index_keys:
            if self._index_owners.get(ik) is txn:
                del self._index_owners[ik]
        txn.index_keys.clear()

    def insert_document(
        self, c: Collection, doc: dict[str, Any], session: OpSession | None = None,
        stmt_id: int | None = None, validate: bool = False,
    ) -> None:
        """Insert one document (`_id` first, normalized). Raises DuplicateKeyError."""
        raw = bson.encode(doc)
        check_insert_depth(doc, raw)  # first, as mongod's fixDocumentForInsert
        key = id_key(doc["_id"])
        self._check_write_conflict(c, key)
        docs = self.documents(c)
        if validate:
            c.check_valid(doc)
        if key in docs:
            raise DuplicateKeyError(c.ns, "_id_", {"_id": 1}, {"_id": doc["_id"]})
        edits = self._check_unique(c, key, None, doc)
        if len(raw) > MAX_BSON:
            raise MongoError(10334, f"object to insert too large. size in bytes: {len(raw)}, "
                             f"max size: {MAX_BSON}")
        self.log("i", c.ns, doc, ui=c.ui, o2={"_id": doc["_id"]}, session=session,
                 stmt_id=stmt_id)
        self._put(c, key, None, doc, raw, edits)

    def update_document(
        self,
        c: Collection,
        pre: dict[str, Any],
        post: dict[str, Any],
        *,
        kind: str,  # "replacement" | "modifier" | "pipeline"
        update: Any = None,
        array_filters: list[Any] | None = None,
        session: OpSession | None = None,
        stmt_id: int | None = None,
        validate: bool = False,
        retry_image: str | None = None,
    ) -> bool:
        """Replace `pre` by `post`; False (and nothing written) when nothing changed."""
        pre_raw, post_raw = bson.encode(pre), bson.encode(post)
        if pre_raw == post_raw:
            return False
        if "_id" not in post or id_key(post["_id"]) != id_key(pre["_id"]):
            if kind == "replacement":
                raise MongoError(
                    66,
                    "After applying the update, the (immutable) field '_id' was found to have "
                    f"been altered to _id: {_value(post.get('_id'))}",
                )
            raise MongoError(
                66, "Performing an update on the path '_id' would modify the immutable field "
                "'_id'",
            )
        check_update_depth(post, post_raw)
        if len(post_raw) > MAX_BSON:
            raise MongoError(17419, f"Resulting document after update is larger than {MAX_BSON}")
        self._check_write_conflict(c, id_key(pre["_id"]))
        if validate:
            c.check_valid(post, pre)
        key = id_key(pre["_id"])
        edits = self._check_unique(c, key, pre, post)
        o = self._update_o(pre, post, kind, update, array_filters)
        image = self._retry_image_kind(session, retry_image)
        ts, wall = self.log("u", c.ns, o, ui=c.ui, o2={"_id": post["_id"]}, session=session,
                            stmt_id=stmt_id, needs_retry_image=image)
        if c.pre_images:
            self._save_pre_image(c, ts, wall, pre)
        if image is not None and session is not None:
            self._save_retry_image(session, ts, image, pre if image == "preImage" else post)
        self._put(c, key, pre, post, post_raw, edits)
        return True

    def delete_document(
        self, c: Collection, pre: dict[str, Any], session: OpSession | None = None,
        stmt_id: int | None = None, retry_image: str | None = None,
    ) -> None:
        key = id_key(pre["_id"])
        self._check_write_conflict(c, key)
        image = self._retry_image_kind(session, retry_image)
        ts, wall = self.log("d", c.ns, {"_id": pre["_id"]}, ui=c.ui, session=session,
                            stmt_id=stmt_id, needs_retry_image=image)
        if c.pre_images:
            self._save_pre_image(c, ts, wall, pre)
        if image is not None and session is not None:
            self._save_retry_image(session, ts, image, pre)
        self._put(c, key, pre, None, None, self._index_edits(c, pre, None))

    def _index_edits(
        self, c: Collection, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """The unique index edits of replacing `old` by `new` (either may be None), unchecked."""
        return [
            (c.unique[s["name"]],
             [k for k, _ in index_entries(s, old)] if old is not None else [],
             [k for k, _ in index_entries(s, new)] if new is not None else [])
            for s in c.indexes[1:] if s["name"] in c.unique
        ]

    def _put(
        self, c: Collection, key: bytes, pre: dict[str, Any] | None,
        doc: dict[str, Any] | None, raw: bytes | None, edits: list,
    ) -> None:
        """One checked document write (None: delete): into the running transaction's overlay,
        or into the working set (and SQLite), remembered for older open snapshots."""
        txn = self._txn()
        if txn is not None:
            self._txn_put(txn, c, key, doc)
            return
        self._seq += 1
        cs = self._cs(c)
        self._remember(c, key, pre, doc is None, cs._documents)
        if doc is None:
            del cs[key]
        else:
            cs[key] = doc
        self._apply_edits(edits, key)
        self._persist_doc(c, key, raw, pre)

    def _txn_put(self, txn: Txn, c: Collection, key: bytes, doc: dict[str, Any] | None) -> None:
        self._swap_view(c, txn)
        view = self._cs(c)._documents
        entries = txn.overlay.setdefault(c.uuid, {})
        txn.colls[c.uuid] = c
        old = view.get(key)
        _, new_record = entries.get(key, (None, False))
        if doc is None:
            view.pop(key, None)
        elif old is None:  # an insert: a new record, last in natural order
            new_record = True
            entries.pop(key, None)
            view[key] = doc
        else:
            view[key] = doc
        entries[key] = (doc, new_record)
        txn.keys.add((c.uuid, key))
        self._owners[(c.uuid, key)] = txn
        for spec in c.indexes[1:]:  # unique keys it adds or removes are its own until it ends
            if spec["name"] not in c.unique:
                continue
            for version in (old, doc):
                for k, _ in index_entries(spec, version) if version is not None else []:
                    ik = (c.uuid, spec["name"], k)
                    txn.index_keys.add(ik)
                    self._index_owners[ik] = txn

    def _persist_doc(
        self, c: Collection, key: bytes, raw: bytes | None, pre: dict[str, Any] | None
    ) -> None:
        if self.txn is not None:  # a batched delete: to SQLite at its end
            self.txn.persist.append((c.uuid, key, raw))
            return
        if self.persist is None:
            return
        if raw is None:
            self.persist.delete_document(c.uuid, key)
        else:
            self.persist.put_document(c.uuid, key, raw)

    def _save_pre_image(
        self, c: Collection, ts: Timestamp, wall: datetime.datetime, pre: dict[str, Any],
        index: int = 0,
    ) -> None:
        if self.txn is not None:  # ts is the op's index until the applyOps entry is written
            self.txn.pre_images.append((c, ts.inc, pre))
            return
        doc = {"_id": pre_image_id(c.ui, ts, index), "operationTime": wall, "preImage": pre}
        key = _pre_image_key(doc["_id"])
        self.images._pre_images[key] = pre
        self._pre_image_ts[key] = ts
        self._pre_image_meta[key] = (doc["_id"], wall)
        if self.persist is not None:
            self.persist.put_pre_image(key, ts, bson.encode(doc))

    def pre_image_documents(self, keys: Sequence[bytes] | None = None) -> list[dict[str, Any]]:
        """`config.system.preimages` as mongod holds it (`{_id: {nsUUID, ts, applyOpsIndex},
        operationTime, preImage}`, in `_id` order): all, or those with the given keys."""
        if keys is None:
            keys = list(self._pre_image_meta)
        out = []
        for key in keys:
            meta = self._pre_image_meta.get(key)
            image = self.images._pre_images.get(key)
            if meta is None or image is None:
                continue
            out.append({"_id": meta[0], "operationTime": meta[1], "preImage": image})
        out.sort(key=lambda d: (bytes(d["_id"]["nsUUID"]), d["_id"]["ts"],
                                d["_id"]["applyOpsIndex"]))
        return out

    # -- transactions ---------------------------------------------------------------------------

    def begin_transaction(self, lsid: dict[str, Any], txn_number: int) -> Txn:
        """A new transaction. Its snapshot is what is committed now; mongod's reaper aborts it
        once it outlives transactionLifetimeLimitSeconds (a timer on the server's loop)."""
        txn = Txn(lsid, txn_number, snapshot=self._seq)
        self._live[id(txn)] = txn
        if self.transaction_lifetime_limit_seconds > 0:
            with contextlib.suppress(RuntimeError):  # no running loop: the store used directly
                txn.expiry = asyncio.get_running_loop().call_later(
                    self.transaction_lifetime_limit_seconds, self._expire, txn
                )
        return txn

    def _expire(self, txn: Txn) -> None:
        with self.batch():
            self.abort_transaction(txn)

    def enter_snapshot(self, txn: Txn) -> None:
        """The running command belongs to `txn`: until its batch ends, its reads see the
        transaction's snapshot and own writes, and its writes go to the overlay."""
        self.txn = txn
        uuids = set(txn.overlay) | {v.uuid for v in self._history if v.seq > txn.snapshot}
        if uuids:
            for c in list(self.catalog.values()):
                if c.uuid in uuids:
                    self._swap_view(c, txn)

    def _swap_view(self, c: Collection, txn: Txn) -> None:
        if c.uuid in self._views:
            return
        cs = self._cs(c)
        self._views[c.uuid] = (cs, cs._documents)
        cs._documents = self._view(c, txn)

    def _restore_views(self) -> None:
        for cs, docs in self._views.values():
            cs._documents = docs
        self._views.clear()

    def _view(self, c: Collection, txn: Txn) -> Any:
        """`c`'s documents as `txn` sees them, in natural order."""
        docs = self._cs(c)._documents
        view = type(docs)(docs)
        later = [v for v in self._history if v.uuid == c.uuid and v.seq > txn.snapshot]
        for v in reversed(later):  # undo the commits its snapshot does not see, newest first
            if v.before is None:
                view.pop(v.key, None)
            elif not v.deleted or v.key in view:
                view[v.key] = v.before
            else:
                items = list(view.items())
                at = 0
                if v.pred is not None:
                    at = next((i + 1 for i, (k, _) in enumerate(items) if k == v.pred),
                              len(items))
                items.insert(at, (v.key, v.before))
                view = type(docs)(items)
        for key, (doc, new_record) in txn.overlay.get(c.uuid, {}).items():
            if doc is None:
                view.pop(key, None)
            else:
                view[key] = doc
                if new_record:
                    view.move_to_end(key)
        return view

    def _remember(
        self, c: Collection, key: bytes, before: dict[str, Any] | None, deleted: bool,
        docs: Mapping[bytes, Any],
    ) -> None:
        """Keep the committed version a write (numbered `self._seq`) replaces, while open
        transactions started before it."""
        if not self._live:
            return
        pred = None
        if deleted:
            for k in docs:
                if k == key:
                    break
                pred = k
        self._history.append(_Version(self._seq, c.uuid, key, before, deleted, pred))
        self._last_write[(c.uuid, key)] = self._seq

    def _end(self, txn: Txn, state: str) -> None:
        txn.state = state
        self._release(txn)
        # its session keeps it (the outcome) until the next txnNumber: not its writes
        txn.ops, txn.persist, txn.pre_images, txn.overlay = [], [], [], {}
        self._live.pop(id(txn), None)
        if txn.expiry is not None:
            txn.expiry.cancel()
        txn.ended.set()
        if not self._live:
            self._history.clear()
            self._last_write.clear()
            return
        oldest = min(t.snapshot for t in self._live.values())
        if self._history and self._history[0].seq <= oldest:
            self._history = [v for v in self._history if v.seq > oldest]
            self._last_write = {(v.uuid, v.key): v.seq for v in self._history}

    def commit_transaction(self, txn: Txn) -> None:
        """Log the transaction's writes as `applyOps` entries (one, or a chain linked by
        `prevOpTime` whose entries but the last carry `partialTxn: true` and the last
        `count`, as mongod splits a large transaction), apply its overlay to the working set
        and make it durable."""
        if txn.state != "in progress":
            return
        for c in txn.colls.values():
            if c.created_by is txn:  # its collections become everyone's, and durable
                c.created_by = None
                if self.catalog.get((c.db, c.name)) is c:
                    self._save_meta(c)
        if not txn.ops:
            self._end(txn, "committed")
            return
        session = OpSession(txn.lsid, txn.txn_number)
        wall = _now_ms()
        chunks = pack_transaction(txn.ops, self.txn_oplog_entry_ops, self.txn_oplog_entry_bytes)
        # op index in the transaction -> (ts of the entry holding it, its index there)
        where: list[tuple[Timestamp, int]] = []
        for k, ops in enumerate(chunks):
            o: dict[str, Any] = {"applyOps": ops}
            last = k == len(chunks) - 1
            if not last:
                o["partialTxn"] = True
            elif k > 0:
                o["count"] = Int64(len(txn.ops))
            ts, _ = self.log("c", "admin.$cmd", o, session=session, wall=wall)
            where.extend((ts, i) for i in range(len(ops)))
        # the outcome, in config.transactions with the commit's entries: a retried
        # commitTransaction answers ok after a restart, other statements 256
        record = self._session_records.get(session_key(txn.lsid))
        if record is not None:
            record["state"] = "committed"
        self._seq += 1
        for uuid, entries in txn.overlay.items():
            c = txn.colls[uuid]
            if self.catalog.get((c.db, c.name)) is not c:
                continue  # dropped since
            docs = self._cs(c)._documents
            for key, (doc, new_record) in entries.items():
                old = docs.get(key)
                if old is None and doc is None:
                    continue
                self._remember(c, key, old, doc is None, docs)
                self._apply_edits(self._index_edits(c, old, doc), key)
                if doc is None:
                    del docs[key]
                else:
                    docs[key] = doc
                    if new_record:
                        docs.move_to_end(key)
                if self.persist is not None:
                    if doc is None or (new_record and old is not None):
                        self.persist.delete_document(uuid, key)  # a new record: a new row
                    if doc is not None:
                        self.persist.put_document(uuid, key, bson.encode(doc))
        for c, index, pre in txn.pre_images:
            ts, in_entry = where[index]
            self._save_pre_image(c, ts, wall, pre, in_entry)
        self._end(txn, "committed")

    def abort_transaction(self, txn: Txn) -> None:
        """Drop the transaction's writes: they never reached the working set, the oplog or
        SQLite."""
        if txn.state != "in progress":
            return
        for c in txn.colls.values():
            if c.created_by is txn and self.catalog.get((c.db, c.name)) is c:
                del self.catalog[(c.db, c.name)]  # never logged, never persisted
                self._cs(c).drop()
                self.server_store[c.db]._collections.pop(c.name, None)
        self._end(txn, "aborted")

    def kill_sessions(self, matches: Callable[[Mapping[str, Any]], bool]) -> int:
        """killSessions / killAllSessions / endSessions: abort the open transaction of each
        session whose lsid `matches` (mongod's killSessionsAbortUnpreparedTransactions); the
        session keeps its txnNumber, so its later statements get 251 (aborted). Returns how
        many transactions were aborted."""
        aborted = 0
        with self.batch():
            for session in list(self.sessions.values()):
                txn = session.txn
                if txn is not None and txn.state == "in progress" and matches(session.lsid):
                    self.abort_transaction(txn)
                    aborted += 1
        return aborted

    # -- retryable findAndModify images ---------------------------------------------------------

    def _retry_image_kind(self, session: OpSession | None, kind: str | None) -> str | None:
        """mongod 8.0 keeps a retryable findAndModify's pre- or post-image in
        `config.image_collection` (and marks the entry with `needsRetryImage`); not in a
        transaction (its oplog entries are applyOps)."""
        return kind if session is not None and self._txn() is None else None

    def _save_retry_image(
        self, session: OpSession, ts: Timestamp, kind: str, image: dict[str, Any]
    ) -> None:
        doc = {"_id": session.lsid, "txnNum": Int64(session.txn_number), "ts": ts,
               "imageKind": kind, "image": image, "invalidated": False}
        sid = session_key(session.lsid)  # config.image_collection's _id: the whole lsid
        self.retry_images[sid] = doc
        if self.persist is not None:
            self.persist.put_retry_image(sid, bson.encode(doc))

    def retry_image(
        self, lsid: Mapping[str, Any], txn_number: int, ts: Timestamp | None
    ) -> Any:
        """The image a retried findAndModify answers with, or None when it is gone (a newer
        statement of the session replaced it)."""
        doc = self.retry_images.get(session_key(lsid))
        if doc is None or int(doc["txnNum"]) != txn_number or doc.get("invalidated"):
            return None
        if ts is not None and doc["ts"] != ts:
            return None
        return doc["image"]

    def entry_at(self, ts: Timestamp) -> dict[str, Any] | None:
        """The oplog entry with this `ts`, decoded, if still in the oplog."""
        i = bisect.bisect_left(self._ts, ts)
        if i < len(self._ts) and self._ts[i] == ts:
            return decode_entry(self._raw[i])
        return None

    def image_collection(self) -> list[dict[str, Any]]:
        """`config.image_collection` as mongod holds it."""
        return list(self.retry_images.values())

    @staticmethod
    def _update_o(
        pre: dict[str, Any], post: dict[str, Any], kind: str, update: Any,
        array_filters: list[Any] | None,
    ) -> dict[str, Any]:
        """The update entry's `o`: a `$v:2` delta, or the whole document for a replacement (and
        for a pipeline update whose delta would not be smaller, as mongod decides)."""
        if kind == "replacement":
            return post
        diff = None
        try:
            if kind == "modifier" and modifier_update_diff is not None:
                diff = modifier_update_diff(pre, post, update, array_filters=array_filters)
            elif kind == "pipeline" and pipeline_update_diff is not None:
                diff = pipeline_update_diff(pre, post)
                if diff is None:
                    return post
        except (ValueError, TypeError, KeyError):  # a shape the diff builder does not know
            diff = None
        if diff is None:
            diff = simple_diff(pre, post)
        return {"$v": 2, "diff": diff}


def durable_op_size(op: Mapping[str, Any]) -> int:
    """mongod's DurableOplogEntry::getDurableReplOperationSize: the operation's in-memory
    size (its `ns`, `o` and `o2`, plus the struct itself, approximated by a constant)."""
    size = _REPL_OPERATION_OVERHEAD + len(op["ns"]) + len(bson.encode(op["o"]))
    if op.get("o2") is not None:
        size += len(bson.encode(op["o2"]))
    return size


def pack_transaction(
    ops: list[dict[str, Any]], max_ops: int, max_bytes: int
) -> list[list[dict[str, Any]]]:
    """The transaction's operations in applyOps entries, as mongod's
    packOperationsIntoApplyOps fills them: an entry takes operations while it has fewer than
    `max_ops` and the next one keeps its running size (each operation's BSON plus 8 bytes of
    array-element overhead) within `max_bytes`; an entry always takes at least one."""
    chunks: list[list[dict[str, Any]]] = []
    i = 0
    while i < len(ops):
        chunk: list[dict[str, Any]] = []
        total = 0
        while i < len(ops) and len(chunk) < max_ops:
            op = ops[i]
            if chunk and total + durable_op_size(op) > max_bytes:
                break
            total += len(bson.encode(op)) + _BSON_ARRAY_ELEMENT_OVERHEAD
            chunk.append(op)
            i += 1
        chunks.append(chunk)
    return chunks


def _value(v: Any) -> str:
    from pipeline_stages.value_string import value_string

    return value_string(v)


def simple_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any]:
    """A `$v:2` document diff of `pre` -> `post` (fallback when update_diff.py is absent):
    removed fields in `d`, changed ones in `u`, new ones in `i`, sub-documents recursed."""
    d: dict[str, Any] = {}
    u: dict[str, Any] = {}
    i: dict[str, Any] = {}
    s: dict[str, Any] = {}
    for k in pre:
        if k not in post:
            d[k] = False
    for k, v in post.items():
        if k not in pre:
            i[k] = v
            continue
        old = pre[k]
        if bson.encode({"v": old}) == bson.encode({"v": v}):
            continue
        if isinstance(old, Mapping) and isinstance(v, Mapping) and list(old) == list(v)[
            : len(old)
        ]:
            sub = simple_diff(old, v)
            if sub:
                s["s" + k] = sub
                continue
        u[k] = v
    out: dict[str, Any] = {}
    if d:
        out["d"] = d
    if u:
        out["u"] = u
    if i:
        out["i"] = i
    out.update(s)
    return out


def validate_collection_name(db: str, coll: str) -> None:
    if not db or any(ch in db for ch in '/\\. "$\0'):
        raise MongoError(73, f"Invalid database name: '{db}'")
    if not coll:
        raise MongoError(73, f"Invalid namespace specified '{db}.{coll}'")
    if "$" in coll or "\0" in coll or coll.startswith("."):
        raise MongoError(73, f"Invalid collection name: {coll}")
