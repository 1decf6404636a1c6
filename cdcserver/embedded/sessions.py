"""Logical sessions, retryable writes and transactions: the state the store keeps of them.

mongod's session catalog and `config.transactions`: each session's active txnNumber, the
statements a retryable write executed, and a multi-document transaction's writes (`Txn`,
defined in store_types.py with the collections it refers to, re-exported here). The code that
runs transactions is in `transactions.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.embedded.store_types import Txn as Txn


@dataclass
class OpSession:
    """The `lsid` / `txnNumber` a retryable write carries into its oplog entries."""

    lsid: dict[str, Any]
    txn_number: int
    prev_ts: Timestamp | None = None

    @functools.cached_property
    def key(self) -> bytes:  # session_key(lsid), once: each of its entries needs it
        return session_key(self.lsid)


@dataclass(frozen=True)
class LoggedWrite:
    """A retryable write statement known from its oplog entry only (the store was restarted
    since): what mongod rebuilds a retried statement's result from (`config.transactions`
    points it at the entry)."""

    op: str  # i | u | d
    doc_id: Any
    ts: Timestamp | None = None  # the entry's
    needs_retry_image: str | None = None  # the entry's `needsRetryImage` (findAndModify)


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
