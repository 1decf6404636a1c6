"""The embedded store's oplog writer: entries exactly as mongod 8.0 writes them.

Field order `[lsid, txnNumber,] op, ns, ui, o, o2, [isTimeseries,] [needsRetryImage,] [stmtId,]
ts, t, v, wall[, prevOpTime]`, `ts` strictly increasing; update entries carry mongod's `$v:2` diff
(`update_diff.py`); a transaction's operations are packed into `applyOps` entries as mongod's
packOperationsIntoApplyOps does. A command's entries become visible to readers (and durable)
together when its `batch()` ends; the oplog is capped (size, minimum retention). A mixin of
`Store` (`store.py`).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import logging
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.embedded.persist import CommitFailed
from cdcserver.embedded.rollback import commit_error, restore_committed
from cdcserver.embedded.sessions import OpSession
from cdcserver.embedded.timeseries import is_viewless
from cdcserver.embedded.update_diff import modifier_update_diff, pipeline_update_diff
from pipeline_stages import bson_bytes
from pipeline_stages.oplog_entry import decode_entry

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
else:
    StoreState = object  # a base for the type checker only (state.py)

TXN_OPLOG_ENTRY_OPS = 2**31 - 1  # maxNumberOfTransactionOperationsInSingleOplogEntry
_BSON_ARRAY_ELEMENT_OVERHEAD = 8  # TransactionOperations::ApplyOpsInfo
_REPL_OPERATION_OVERHEAD = 256  # ~sizeof(DurableReplOperation) + its stmtId vector
NULL_OP_TIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}
MAX_BSON = 16 * 1024 * 1024

log = logging.getLogger(__name__)


def _now_ms() -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_T = Int64(1)  # the term of every entry (immutable: shared)
_V = Int64(2)


_INT32 = struct.Struct("<i")
_TERM, _VERSION = int(_T), int(_V)
# An insert entry's fields after `o`, as bson.encode gives them (o2's document is spliced in
# before): stmtId, ts, t, v, wall [, prevOpTime]. A timestamp is its inc then its time.
_TAIL = struct.Struct("<4sII 3sq 3sq 6sq")  # ts, t, v, wall
_TAIL_NAMES = (b"\x11ts\x00", b"\x12t\x00", b"\x12v\x00", b"\x09wall\x00")
_STMT_ID = struct.Struct("<8si")
_PREV_OP_TIME = struct.Struct("<12si 4sII 3sq x")
# The `_id` value sizes, by BSON type, of the ids whose element an insert's o2 copies from
# the document's bytes (a fixed size, or an int32 prefix: its value counts from after it,
# plus what the type adds to it; a document counts itself)
_FIXED_ID_SIZES = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8,
                   0x13: 16}
_PREFIXED_ID_EXTRA = {0x02: 4, 0x05: 5, 0x03: 0, 0x04: 0}


def _id_element(raw: bytes) -> bytes | None:
    """The `_id` element that begins the document `raw`, if it does and its type's size is
    known (else None: the caller encodes it)."""
    if raw[5:9] != b"_id\x00":
        return None
    kind = raw[4]
    size = _FIXED_ID_SIZES.get(kind)
    if size is None:
        extra = _PREFIXED_ID_EXTRA.get(kind)
        if extra is None:
            return None
        size = _INT32.unpack_from(raw, 9)[0] + extra
    end = 9 + size
    return raw[4:end] if end < len(raw) else None


def _tail(o2: Mapping[str, Any] | None, marked: bool, needs_retry_image: str | None,
          session: OpSession | None, stmt_id: int | None, ts: Timestamp,
          wall: datetime.datetime, prev: Timestamp | None) -> dict[str, Any]:
    """An entry's fields after `o`, in mongod's order."""
    tail: dict[str, Any] = {}
    if o2 is not None:
        tail["o2"] = o2
    if marked:
        tail["isTimeseries"] = True
    if needs_retry_image is not None:
        tail["needsRetryImage"] = needs_retry_image
    if session is not None and stmt_id is not None:
        tail["stmtId"] = stmt_id
    tail["ts"] = ts
    tail["t"] = _T
    tail["v"] = _V
    tail["wall"] = wall
    if session is not None:
        tail["prevOpTime"] = dict(NULL_OP_TIME) if prev is None else {"ts": prev, "t": _T}
    return tail


def _insert_tail(o_raw: bytes, in_session: bool, stmt_id: int | None, ts: Timestamp,
                 wall_ms: int, prev: Timestamp | None) -> bytes | None:
    """bson.encode of an insert entry's fields after `o` (o2 = {_id: o's _id}, [stmtId], ts,
    t, v, wall [, prevOpTime]), packed; None where o's `_id` element is not copied."""
    element = _id_element(o_raw)
    if element is None:
        return None
    parts = [b"\x03o2\x00", _INT32.pack(len(element) + 5), element, b"\x00"]
    if in_session and stmt_id is not None:
        parts.append(_STMT_ID.pack(b"\x10stmtId\x00", stmt_id))
    names = _TAIL_NAMES
    parts.append(_TAIL.pack(names[0], ts.inc, ts.time, names[1], _TERM, names[2], _VERSION,
                            names[3], wall_ms))
    if in_session:
        if prev is None:
            parts.append(_PREV_OP_TIME.pack(b"\x03prevOpTime\x00", 28, b"\x11ts\x00", 0, 0,
                                            b"\x12t\x00", -1))
        else:
            parts.append(_PREV_OP_TIME.pack(b"\x03prevOpTime\x00", 28, b"\x11ts\x00",
                                            prev.inc, prev.time, b"\x12t\x00", _TERM))
    body = b"".join(parts)
    return b"".join((_INT32.pack(len(body) + 5), body, b"\x00"))


def _entry_head(op: str, ns: str, ui: Binary | None, session: OpSession | None
                ) -> dict[str, Any]:
    """An entry's fields before `o`, in mongod's order."""
    head: dict[str, Any] = {}
    if session is not None:
        head["lsid"] = session.lsid
        head["txnNumber"] = Int64(session.txn_number)
    head["op"] = op
    head["ns"] = ns
    if ui is not None:
        head["ui"] = ui
    return head


class OplogWriterMixin(StoreState):
    """Oplog entries, the batches that publish them, and the capped oplog."""

    # Called before a retryable write's statement is logged (a test fail point,
    # onPrimaryTransactionalWrite: it may fail the statement, so nothing is written).
    before_retryable_write: Callable[[OpSession], None] | None = None
    # mongod's UnreplicatedWritesBlock: catalog writes that log nothing (9.0's time-series
    # conversion logs one entry for all of them; catalog.py).
    unreplicated: bool = False
    # The UUIDs of the viewless time-series collections, whose entries carry
    # `isTimeseries: true` (9.0's featureFlagMarkTimeseriesEventsInOplog, on from the FCV that
    # makes them viewless): built from the catalog when first needed, then kept by the
    # catalog's create and conversions. A dropped UUID is never reused, so it stays.
    _timeseries_uuids: set[bytes] | None = None

    def timeseries_uuids(self) -> set[bytes]:
        if self._timeseries_uuids is None:
            self._timeseries_uuids = {c.uuid for c in self.catalog.values() if is_viewless(c)}
        return self._timeseries_uuids

    # -- batches ----------------------------------------------------------------------------------

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
            try:
                for key, record in self._session_records.items():  # same SQLite transaction
                    self.persist.put_transaction(key, bson_bytes.encode(record))
            except CommitFailed:
                pass  # commit() rolls it back and raises, with what the batch changed
            try:
                self.persist.commit()
            except CommitFailed as failure:
                self._roll_back(failure)
                raise commit_error(failure, self.persist.path) from None
            if self.commit_failing:
                self.commit_failing = False
                log.warning("writes to %s succeed again", self.persist.path)
        self._session_undo.clear()
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

    def _roll_back(self, failure: CommitFailed) -> None:
        """SQLite refused the batch: every layer back to what it committed (rollback.py), its
        oplog entries never published, its sessions as they were before it, a transaction it
        committed aborted instead."""
        assert self.persist is not None
        if not self.commit_failing:
            self.commit_failing = True
            log.error("writes to %s fail: %s; they are refused until it can be written again",
                      self.persist.path, failure.error)
        restore_committed(self, failure.journal)
        self._pending.clear()
        for key, record in self._session_records.items():
            session = self.sessions.get(key)
            if record.get("state") == "committed" and session is not None and (
                session.txn is not None and session.txn.state == "committed"
            ):
                session.txn.state = "aborted"
        for session, op_session, prev_ts, stmts, last_write in self._session_undo.values():
            op_session.prev_ts = prev_ts
            if session is not None:
                session.stmts, session.last_write = stmts, last_write
        self._session_undo.clear()
        self._session_records.clear()

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
            try:
                self.persist.truncate_oplog(oldest)
                self.persist.commit()
            except CommitFailed:
                pass  # SQLite keeps the older entries until a later truncation removes them

    # -- the oplog --------------------------------------------------------------------------------

    def _next_ts(self) -> Timestamp:  # a sharded cluster's shard overrides it (its clock)
        now = int(time.time())
        last = self._last_ts
        ts = Timestamp(now, 1) if now > last.time else Timestamp(last.time, last.inc + 1)
        self._last_ts = ts
        return ts

    # the last wall clock millisecond read and its datetime (kept: many entries share one)
    _wall_ms = -1
    _wall = _EPOCH

    def _now_wall(self) -> datetime.datetime:
        """_now_ms(), without building a datetime for each entry of the same millisecond."""
        ms = time.time_ns() // 1_000_000
        if ms != self._wall_ms:
            self._wall_ms, self._wall = ms, _EPOCH + datetime.timedelta(milliseconds=ms)
        return self._wall

    def append_oplog(
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
        o_raw: bytes | None = None,
    ) -> tuple[Timestamp, datetime.datetime]:
        """Log one entry (into the running transaction's operations, in one); `o_raw`: `o`'s
        BSON, put in the entry as it is."""
        if self.unreplicated:
            return self._last_ts, _now_ms()
        if session is not None and op in ("i", "u", "d") and self.before_retryable_write:
            self.before_retryable_write(session)  # a retryable write's statement (not a commit)
        marked = ui is not None and bytes(ui) in self.timeseries_uuids()
        if self.txn is not None and (op in ("i", "u", "d") or (op == "c" and self.txn.lsid)):
            # DDL in a transaction (create, createIndexes on a new collection) is one of the
            # transaction's operations, logged in its applyOps as mongod's OpObserver does
            inner: dict[str, Any] = {"op": op, "ns": ns, "ui": ui, "o": o}
            if o2 is not None:
                inner["o2"] = o2
            if marked:
                inner["isTimeseries"] = True
            self.txn.ops.append(inner)
            return Timestamp(0, len(self.txn.ops) - 1), _now_ms()
        ts = self._next_ts()
        wall_ms = -1  # wall's milliseconds, when read here (a wall given is not converted)
        if wall is None:
            wall = self._now_wall()
            wall_ms = self._wall_ms
        prev = session.prev_ts if session is not None else None
        if session is not None:
            key = session.key
            if key not in self._session_undo:  # as it was before this batch (_roll_back)
                owner = self.sessions.get(key)
                self._session_undo[key] = (
                    owner, session, prev,
                    dict(owner.stmts) if owner is not None else {},
                    owner.last_write if owner is not None else None,
                )
            session.prev_ts = ts
            # config.transactions: the session's txnNumber and last write, durable with it
            self._session_records[key] = {
                "_id": session.lsid, "txnNum": Int64(session.txn_number),
                "lastWriteOpTime": {"ts": ts, "t": _T}, "lastWriteDate": wall,
            }
        if o_raw is None:
            entry = _entry_head(op, ns, ui, session)
            entry["o"] = o
            entry.update(_tail(o2, marked, needs_retry_image, session, stmt_id, ts, wall, prev))
            raw = bson_bytes.encode(entry)
        else:
            # the bytes bson.encode gives for the whole entry, `o` spliced in as it is: the
            # fields before it encoded once for a command's run of entries, those after it
            # encoded alone (an insert's packed, its o2's `_id` copied from `o`)
            head = self._head_elements(op, ns, ui, session)
            after = None
            if (wall_ms >= 0 and not marked and needs_retry_image is None and o2 is not None
                    and len(o2) == 1 and o2.get("_id", o2) is o.get("_id", o)):
                after = _insert_tail(o_raw, session is not None, stmt_id, ts, wall_ms, prev)
            if after is None:
                after = bson_bytes.encode(
                    _tail(o2, marked, needs_retry_image, session, stmt_id, ts, wall, prev))
            raw = b"".join((_INT32.pack(len(head) + len(o_raw) + len(after) + 3), head,
                            b"\x03o\x00", o_raw, after[4:-1], b"\x00"))
        self._pending.append((ts, raw))
        if self.persist is not None:
            self.persist.append_oplog(ts, raw)
        return ts, wall

    # (op, ns, ui, lsid, txnNumber, BSON elements) of the last entry head encoded; ui and the
    # lsid are held, so the identities compared are never another object's
    _head: tuple[Any, ...] = ()

    def _head_elements(self, op: str, ns: str, ui: Binary | None,
                       session: OpSession | None) -> bytes:
        """The BSON elements of an entry's fields before `o` (lsid, txnNumber, op, ns, ui)."""
        lsid = session.lsid if session is not None else None
        number = session.txn_number if session is not None else None
        last = self._head
        # identity for ui (Collection.ui is built once) and lsid: cheap, and a miss only
        # encodes the head again
        if last and last[3] is lsid and last[2] is ui and last[0] == op and last[1] == ns and (
                last[4] == number):
            elements: bytes = last[5]
            return elements
        elements = bson_bytes.encode(_entry_head(op, ns, ui, session))[4:-1]
        self._head = (op, ns, ui, lsid, number, elements)
        return elements

    def oplog_entries(self) -> list[bytes]:
        return list(self._raw)

    def oplog_count(self) -> int:
        return len(self._raw)

    def noop(self, msg: str = "periodic noop") -> None:
        with self.batch():
            self.append_oplog("n", "", {"msg": msg})

    def entry_at(self, ts: Timestamp) -> Mapping[str, Any] | None:
        """The oplog entry with this `ts`, decoded, if still in the oplog."""
        i = bisect.bisect_left(self._ts, ts)
        if i < len(self._ts) and self._ts[i] == ts:
            return decode_entry(self._raw[i])
        return None

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
            if kind == "modifier":
                diff = modifier_update_diff(pre, post, update, array_filters=array_filters)
            elif kind == "pipeline":
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
    size = _REPL_OPERATION_OVERHEAD + len(op["ns"]) + len(bson_bytes.encode(op["o"]))
    if op.get("o2") is not None:
        size += len(bson_bytes.encode(op["o2"]))
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
            total += len(bson_bytes.encode(op)) + _BSON_ARRAY_ELEMENT_OVERHEAD
            chunk.append(op)
            i += 1
        chunks.append(chunk)
    return chunks


def simple_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any]:
    """A `$v:2` document diff of `pre` -> `post` (fallback for a shape update_diff.py's
    builders do not know, or an update kind they do not cover):
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
        if bson_bytes.encode({"v": old}) == bson_bytes.encode({"v": v}):
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
