"""Logical sessions, retryable writes and transactions: the state the store keeps of them.

mongod's session catalog and `config.transactions`: each session's active txnNumber, the
statements a retryable write executed, and a multi-document transaction's writes (`Txn`). The
code that runs transactions is in `transactions.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

if TYPE_CHECKING:
    from cdcserver.embedded.catalog import Collection


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
    # (db, name) -> each collection it created (explicitly, implicitly or by createIndexes):
    # mongod's UncommittedCatalogUpdates, seen by this transaction only until it commits
    created: dict[tuple[str, str], Collection] = field(default_factory=dict)
    # (collection uuid, document key) of each document it wrote: its write locks
    keys: set[tuple[bytes, bytes]] = field(default_factory=set)
    # (collection uuid, unique index name, index key) its writes added or removed: locked too
    index_keys: set[tuple[bytes, str, bytes]] = field(default_factory=set)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set at commit or abort
    # the readConcern its first command gave (startTransaction), kept for its other commands
    read_concern: dict[str, Any] | None = None
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
