"""`$_internalChangeStreamUnwindTransaction`: one entry per operation of a transaction (§3).

An `applyOps` entry (an unprepared transaction's commit point, a batched write, a user
`applyOps`) or a `commitTransaction` entry (a prepared transaction's commit point) becomes one
synthetic entry per inner operation that passes the unwind filter, in transaction order. Earlier
entries of the transaction are found by following `prevOpTime` links through a
`TransactionHistory`. Every other entry passes through unchanged.

Followed: `document_source_change_stream_unwind_transaction.cpp` (master revision, which has
the 8.0 `multiOpType` handling; its master-only `commitTimestamp` field and the feature-flagged
`endOfTransaction` event are not reproduced) and `transaction_history_iterator.cpp`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from bson.int64 import Int64
from bson.timestamp import Timestamp

from .errors import MongoError
from .oplog_entry import Entry
from .value_string import type_name, value_string

# repl::MultiOplogEntryType::kApplyOpsAppliedSeparately: a retryable batched write, not a txn.
APPLY_OPS_APPLIED_SEPARATELY = 1

HISTORY_LOST_CONTEXT = (
    "Oplog no longer has history necessary for $changeStream to observe operations from a "
    "committed transaction."
)

UNINITIALIZED_TERM = Int64(-1)

_MISSING: Any = object()


class TransactionHistory(Protocol):
    """Read access to the oplog for following `prevOpTime` chains."""

    def entry_at(self, ts: Timestamp) -> Entry | None:
        """The entry whose `ts` is `ts`; None when it is not (or no longer) in the oplog."""
        ...


OpFilter = Callable[[Mapping[str, Any]], bool]


def bson_type_name(value: Any) -> str:
    """mongod's `typeName()`; `missing` for an absent field."""
    return "missing" if value is _MISSING else type_name(value)


def _check_type(value: Any, field: str, expected: str) -> None:
    """`DocumentSourceChangeStream::checkValueType` (uassert 40532)."""
    found = bson_type_name(value)
    if found != expected:
        raise MongoError(40532, f'Entry field "{field}" should be {expected}, found: {found}')


def _check_type_or_missing(value: Any, field: str, expected: str) -> None:
    if value is not _MISSING:
        _check_type(value, field, expected)


def is_transaction_entry(entry: Mapping[str, Any]) -> bool:
    """An `op: "c"` entry whose `o` has `applyOps` or `commitTransaction`."""
    if entry.get("op") != "c":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and ("applyOps" in o or "commitTransaction" in o)


def _op_time_string(ts: Timestamp, t: Any) -> str:
    """`OpTime::toBSON().toString()`, as quoted in IncompleteTransactionHistory messages."""
    return f"{{ ts: Timestamp({ts.time}, {ts.inc}), t: {value_string(t)} }}"


def _history_lost(ts: Timestamp, t: Any) -> MongoError:
    reason = (
        "oplog no longer contains the complete write history of this transaction, log with "
        f"opTime {_op_time_string(ts, t)} cannot be found"
    )
    return MongoError(286, f"{HISTORY_LOST_CONTEXT} :: caused by :: {reason}")


def _op_time_ts(ts: Any) -> Timestamp:
    """The `ts` of an OpTime, checked as the `OpTimeBase` IDL parser does."""
    if isinstance(ts, Timestamp):
        return ts
    if ts is _MISSING:
        raise MongoError(40414, "BSON field 'OpTimeBase.ts' is missing but a required field")
    raise MongoError(
        14,
        f"BSON field 'OpTimeBase.ts' is the wrong type '{bson_type_name(ts)}', "
        "expected type 'timestamp'",
    )


def _parse_op_time(value: Mapping[str, Any]) -> tuple[Timestamp, Any]:
    """`repl::OpTime::parse` of a `{ts, t}` document (t defaults to -1, the uninitialised term)."""
    return _op_time_ts(value.get("ts", _MISSING)), value.get("t", UNINITIALIZED_TERM)


def _find(history: TransactionHistory | None, ts: Timestamp, t: Any) -> Entry:
    """The oplog entry at OpTime {ts, t}, or 286. mongod queries `OpTime::asQuery()`:
    `{ts, t}`, or `{ts, t: {$exists: false}}` for the uninitialised term (pv0 oplogs)."""
    entry = history.entry_at(ts) if history is not None else None
    if entry is not None and entry.get("ts") == ts:
        term = entry.get("t", _MISSING)
        if (term is _MISSING) if t == UNINITIALIZED_TERM else (term == t):
            return entry
    raise _history_lost(ts, t)


def _collect_chain(
    history: TransactionHistory | None, first: Mapping[str, Any]
) -> list[tuple[Timestamp, Any]]:
    """OpTimes of the earlier entries of a transaction, newest first, starting at `first`
    (a `prevOpTime`) and following each entry's own `prevOpTime` until the null OpTime."""
    chain: list[tuple[Timestamp, Any]] = []
    ts, t = _parse_op_time(first)
    while ts.time != 0:  # OpTime::isNull(): a null timestamp (seconds == 0)
        entry = _find(history, ts, t)
        prev = entry.get("prevOpTime", _MISSING)
        if not isinstance(prev, Mapping):
            projected = "{}" if prev is _MISSING else f"{{ prevOpTime: {value_string(prev)} }}"
            raise MongoError(
                9,
                "Missing prevOpTime field on oplog entry of previous write in transaction: "
                + projected,
            )
        chain.append((ts, t))
        ts, t = _parse_op_time(prev)
    return chain


def _apply_ops_of(entry: Mapping[str, Any], code: int) -> list[Any]:
    o = entry.get("o")
    ops = o.get("applyOps", _MISSING) if isinstance(o, Mapping) else _MISSING
    if not isinstance(ops, list):
        raise MongoError(code, f"Expected 'applyOps' type array, found {bson_type_name(ops)}")
    return ops


def unwind(
    entry: Entry, op_filter: OpFilter, history: TransactionHistory | None
) -> Iterator[Entry]:
    """The entries this stage outputs for `entry`.

    Non-transaction entries: `entry` itself. `applyOps`/`commitTransaction`: a synthetic entry
    (a dict) per inner operation accepted by `op_filter` (normally
    `OplogFilter.matches_transaction_op`). An `abortTransaction` yields nothing (mongod never
    lets one reach this stage). The chain of earlier entries is read before anything is
    yielded, so a missing link raises `MongoError` 286 from this call itself.
    """
    if entry.get("op") != "c":
        return iter((entry,))
    o = entry.get("o")
    if not isinstance(o, Mapping) or ("applyOps" not in o and "commitTransaction" not in o):
        if isinstance(o, Mapping) and "abortTransaction" in o:
            return iter(())
        return iter((entry,))
    return _TransactionOps(entry, o, op_filter, history).ops()


class _TransactionOps:
    """mongod's `TransactionOpIterator`: the committed transaction at one commit point."""

    __slots__ = ("_filter", "_history", "_sources", "_fields")

    def __init__(
        self,
        entry: Entry,
        o: Mapping[str, Any],
        op_filter: OpFilter,
        history: TransactionHistory | None,
    ) -> None:
        self._filter = op_filter
        self._history = history

        multi_op_type = entry.get("multiOpType", _MISSING)
        _check_type_or_missing(multi_op_type, "multiOpType", "int")
        applied_separately = multi_op_type == APPLY_OPS_APPLIED_SEPARATELY

        # Fields stamped on every unwound op, in mongod's order. lsid/txnNumber are ignored
        # for an applyOps that is a retryable write rather than a transaction.
        lsid: Any = _MISSING
        txn_number: Any = _MISSING
        if not applied_separately:
            lsid = entry.get("lsid", _MISSING)
            _check_type_or_missing(lsid, "lsid", "object")
            txn_number = entry.get("txnNumber", _MISSING)
            _check_type_or_missing(txn_number, "txnNumber", "long")
        ts = _op_time_ts(entry.get("ts", _MISSING))
        wall = entry.get("wall", _MISSING)
        fields: dict[str, Any] = {"ts": ts}
        # Entries written before 3.6 have no `wall`: mongod 8.0 fails on them (40532); we
        # replay old oplogs, so the events just have no wallTime (see transform.py).
        if wall is not _MISSING:
            _check_type(wall, "wall", "date")
            fields["wall"] = wall
        if lsid is not _MISSING:
            fields["lsid"] = lsid
        if txn_number is not _MISSING:
            fields["txnNumber"] = Int64(txn_number)
        self._fields = fields

        apply_ops = o.get("applyOps", _MISSING)
        if apply_ops is _MISSING and "commitTransaction" not in o:
            raise MongoError(5543803, f"Unexpected op at {_ts_string(ts)}")

        # The earlier links (oldest last), read up front as mongod does.
        chain: list[tuple[Timestamp, Any]] = []
        prev = entry.get("prevOpTime", _MISSING)
        if not applied_separately and isinstance(prev, Mapping):
            chain = _collect_chain(history, prev)
        chain.reverse()

        # (applyOpsTs, ops or None=read from history) for each applyOps, oldest first.
        sources: list[tuple[Timestamp, Any, list[Any] | None]] = [
            (link_ts, link_t, None) for link_ts, link_t in chain
        ]
        if apply_ops is not _MISSING:
            # An applyOps commit point is itself the newest link; its array is in hand.
            sources.append((ts, entry.get("t"), apply_ops))
        if not sources:
            raise MongoError(5543804, "No transaction oplog entries found")
        self._sources = sources

    def ops(self) -> Iterator[Entry]:
        op_filter = self._filter
        fields = self._fields
        txn_op_index = 0
        for position, (apply_ops_ts, term, ops) in enumerate(self._sources):
            if ops is None:
                ops = _apply_ops_of(
                    _find(self._history, apply_ops_ts, term), 5543806 if position == 0 else 5543807
                )
            else:
                _check_type(ops, "applyOps", "array")
            for apply_ops_index, op in enumerate(ops):
                # Both counters move for every op, matching or not.
                txn_op_index += 1
                if not isinstance(op, Mapping):
                    op = {}
                op_type = op.get("op", _MISSING)
                if type(op_type) is not str:
                    raise MongoError(
                        5543808,
                        "Unexpected format for entry within a transaction oplog entry: "
                        f"'op' field was type {bson_type_name(op_type)}",
                    )
                if op_type == "n":
                    raise MongoError(
                        5543809,
                        "Unexpected noop entry within a transaction "
                        + _value_or_missing(op.get("o", _MISSING)),
                    )
                if not op_filter(op):
                    continue
                out: dict[str, Any] = dict(op.items())
                out["txnOpIndex"] = Int64(txn_op_index - 1)
                out["applyOpsIndex"] = Int64(apply_ops_index)
                out["applyOpsTs"] = apply_ops_ts
                out.update(fields)
                yield out


def _value_or_missing(value: Any) -> str:
    """`Value::toString()`, which prints an absent value as MISSING."""
    return "MISSING" if value is _MISSING else value_string(value)


def _ts_string(ts: Timestamp) -> str:
    """`Timestamp::toString()`."""
    return f"Timestamp({ts.time}, {ts.inc})"
