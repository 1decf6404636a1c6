"""What `currentOp` / `$currentOp` report besides the commands in progress: idle cursors
(`idleCursors: true`) and idle sessions, the sessions of multi-document transactions in
progress that no command is running at the moment (`idleSessions`, on by default), with
mongod 8.0's fields (CommonMongodProcessInterface::_reportCurrentOpsForIdleCursors,
TransactionParticipant::Observer::reportStashedState, SingleTransactionStats::report).

The cursor registry knows which cursors are open and which a getMore holds; what mongod's
GenericCursor adds (creation and last access dates, documents and batches returned, the
originating command, the session) is noted here from each command that opens or moves a
cursor. Likewise each transaction's start, time active and last client come from its
commands. Records whose cursor or transaction is gone are dropped when next listed.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.context import ConnectionState, ServerState
from cdcserver.cursors.cursor import FORWARDED

__all__ = ["IdleOps", "auth_on", "idle_cursors", "idle_sessions", "note_finished", "note_started"]

# Past this many records the ones for closed cursors / ended transactions are dropped at once
# (then past twice those left and this many: pruning stays linear in the records noted).
_PRUNE_AT = 10_000


@dataclass
class CursorRecord:
    ns: str
    lsid: dict[str, Any] | None
    created: datetime.datetime
    last_access: datetime.datetime
    docs: int
    batches: int
    no_cursor_timeout: bool
    tailable: bool
    await_data: bool
    command: dict[str, Any]


@dataclass
class TxnRecord:
    started: datetime.datetime
    started_mono: float
    read_concern: dict[str, Any] | None
    active_s: float = 0.0
    client: dict[str, Any] = field(default_factory=dict)  # the last command's client


class IdleOps:
    """A server part (ServerState.part): the records above."""

    def __init__(self) -> None:
        self.cursors: dict[int, CursorRecord] = {}
        self.txns: dict[tuple[bytes, int], TxnRecord] = {}
        self.cursors_prune_at = _PRUNE_AT
        self.txns_prune_at = _PRUNE_AT


def _now() -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)  # a BSON date's precision


def _iso_local(when: datetime.datetime) -> str:
    """mongod's dateToISOStringLocal: "2013-07-23T18:42:14.072-05:00"."""
    return when.astimezone().isoformat(timespec="milliseconds")


def _user_digest(conn: ConnectionState) -> bytes:
    users = conn.auth.users if conn.auth is not None else None
    return hashlib.sha256((users[0].full_name if users else "").encode()).digest()


def auth_on(server: ServerState) -> bool:
    return server.auth is not None and bool(server.auth.enabled)


def _lsid(conn: ConnectionState, cmd: Mapping[str, Any]) -> dict[str, Any] | None:
    """The command's logical session as mongod reports it: {id, uid}."""
    lsid = cmd.get("lsid")
    if not isinstance(lsid, Mapping) or not isinstance(lsid.get("id"), bytes):
        return None
    uid = lsid.get("uid")
    digest = bytes(uid) if isinstance(uid, bytes) else _user_digest(conn)
    return {"id": Binary(bytes(lsid["id"]), 4), "uid": Binary(digest, 0)}


def _client_info(conn: ConnectionState) -> dict[str, Any]:
    metadata = conn.client_metadata if isinstance(conn.client_metadata, Mapping) else {}
    application = metadata.get("application")
    app = application.get("name") if isinstance(application, Mapping) else None
    return {"client": conn.peer, "connectionId": conn.id,
            "appName": app if isinstance(app, str) else "", "clientMetadata": dict(metadata)}


def _txn_key(cmd: Mapping[str, Any]) -> tuple[bytes, int] | None:
    """(lsid.id, txnNumber) of a command of a multi-document transaction."""
    if cmd.get("autocommit") is not False:
        return None
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if not isinstance(lsid, Mapping) or not isinstance(lsid.get("id"), bytes):
        return None
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return bytes(lsid["id"]), int(number)


def note_started(server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any]) -> None:
    """A command begins: one that starts a transaction opens its record."""
    if cmd.get("startTransaction") is not True:
        return
    key = _txn_key(cmd)
    if key is None:
        return
    rc = cmd.get("readConcern")
    table = server.part(IdleOps)
    table.txns[key] = TxnRecord(_now(), time.monotonic(),
                                dict(rc) if isinstance(rc, Mapping) else None)
    if len(table.txns) > table.txns_prune_at:
        _prune_txns(server, table)
        table.txns_prune_at = 2 * len(table.txns) + _PRUNE_AT


def note_finished(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any],
    reply: Mapping[str, Any] | None, started: float,
) -> None:
    """A command ended (`reply` None if it failed): the cursor it opened or moved, the time
    its transaction was active and the client it last ran for."""
    key = _txn_key(cmd)
    if key is not None:
        table = server.part(IdleOps)
        if name in ("commitTransaction", "abortTransaction"):
            table.txns.pop(key, None)
        else:
            record = table.txns.get(key)
            if record is not None:
                record.active_s += max(0.0, time.monotonic() - started)
                record.client = _client_info(conn)
    if reply is None:
        return
    cursor = reply.get("cursor")
    if not isinstance(cursor, Mapping):
        return
    cursor_id = cursor.get("id")
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        return
    if name == "getMore":
        _note_get_more(server, int(cursor_id), cursor)
    elif cursor_id:
        _note_opened(server, conn, name, cmd, int(cursor_id), cursor)


def _batch_len(cursor: Mapping[str, Any], key: str) -> int:
    batch = cursor.get(key)
    return len(batch) if isinstance(batch, list) else 0


def _note_opened(server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any],
                 cursor_id: int, cursor: Mapping[str, Any]) -> None:
    table = server.part(IdleOps)
    stream = name == "aggregate" and _is_change_stream(cmd)
    tailable = stream or cmd.get("tailable") is True
    now = _now()
    ns = cursor.get("ns")
    table.cursors[cursor_id] = CursorRecord(
        ns=ns if isinstance(ns, str) else "", lsid=_lsid(conn, cmd), created=now,
        last_access=now, docs=_batch_len(cursor, "firstBatch"), batches=1,
        no_cursor_timeout=cmd.get("noCursorTimeout") is True, tailable=tailable,
        await_data=stream or (tailable and cmd.get("awaitData") is True), command=dict(cmd),
    )
    if len(table.cursors) > table.cursors_prune_at:
        _prune_cursors(server, table)
        table.cursors_prune_at = 2 * len(table.cursors) + _PRUNE_AT


def _note_get_more(server: ServerState, cursor_id: int, cursor: Mapping[str, Any]) -> None:
    table = server.part(IdleOps)
    if not cursor_id:  # exhausted: the getMore closed it
        return
    record = table.cursors.get(cursor_id)
    if record is not None:
        record.last_access = _now()
        record.docs += _batch_len(cursor, "nextBatch")
        record.batches += 1


def _is_change_stream(cmd: Mapping[str, Any]) -> bool:
    pipeline = cmd.get("pipeline")
    return (isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[0], Mapping)
            and "$changeStream" in pipeline[0])


def _prune_cursors(server: ServerState, table: IdleOps) -> None:
    open_ids = server.cursors.open
    for cursor_id in [c for c in table.cursors if c not in open_ids]:
        del table.cursors[cursor_id]


def _in_progress_txns(server: ServerState) -> dict[tuple[bytes, int], Any]:
    """(lsid.id, txnNumber) -> the store's session, of each transaction in progress."""
    store = server.store
    if store is None:
        return {}
    return {
        (bytes(s.lsid["id"]), s.txn_number): s for s in list(store.sessions.values())
        if s.txn is not None and s.txn.state == "in progress"
    }


def _prune_txns(server: ServerState, table: IdleOps) -> None:
    live = _in_progress_txns(server)
    for key in [k for k in table.txns if k not in live]:
        del table.txns[key]


# -- what currentOp lists ------------------------------------------------------------------------


def idle_cursors(server: ServerState, host: str, conn: ConnectionState,
                 all_users: bool) -> list[dict[str, Any]]:
    """One `idleCursor` document per open cursor no getMore holds now (forwarded cursors are
    their holder's to list); without `allUsers`, only the connection's user's."""
    table = server.part(IdleOps)
    _prune_cursors(server, table)
    mine = _user_digest(conn) if not all_users and auth_on(server) else None
    owners = server.auth.cursor_owners if server.auth is not None else {}
    me = conn.auth.users[0].full_name if conn.auth is not None and conn.auth.users else ""
    out = []
    for cursor_id, cursor in list(server.cursors.open.items()):
        if cursor.busy or cursor.kind == FORWARDED:
            continue
        record = table.cursors.get(cursor_id)
        if record is None:
            continue  # opened before this server noted cursors: nothing to report of it
        if mine is not None:
            # the cursor's authenticated user (isCoauthorizedWith), else its session's
            owner = owners.get(cursor_id)
            if owner is not None and me not in owner:
                continue
            if owner is None and (record.lsid is None or bytes(record.lsid["uid"]) != mine):
                continue
        doc: dict[str, Any] = {"type": "idleCursor", "host": host, "ns": record.ns}
        if record.lsid is not None:
            doc["lsid"] = dict(record.lsid)
        doc["planSummary"] = "COLLSCAN"  # no query planner: every plan is a scan
        doc["cursor"] = {
            "cursorId": Int64(cursor_id),
            "createdDate": record.created,
            "lastAccessDate": record.last_access,
            "nDocsReturned": Int64(record.docs),
            "nBatchesReturned": Int64(record.batches),
            "noCursorTimeout": record.no_cursor_timeout,
            "tailable": record.tailable,
            "awaitData": record.await_data,
            "originatingCommand": dict(record.command),
        }
        out.append(doc)
    return out


def idle_sessions(server: ServerState, host: str, conn: ConnectionState, all_users: bool,
                  running: Iterable[bytes]) -> list[dict[str, Any]]:
    """One `idleSession` document per transaction in progress whose session no command is
    using (`running`: the lsid ids of the commands in progress)."""
    table = server.part(IdleOps)
    live = _in_progress_txns(server)
    for key in [k for k in table.txns if k not in live]:
        del table.txns[key]
    busy = set(running)
    mine = _user_digest(conn) if not all_users and auth_on(server) else None
    store = server.store
    limit = store.transaction_lifetime_limit_seconds if store is not None else 0
    out = []
    now_mono = time.monotonic()
    for (session_id, txn_number), session in live.items():
        if session_id in busy:
            continue
        uid = bytes(session.lsid["uid"])
        if mine is not None and uid != mine:
            continue
        record = table.txns.get((session_id, txn_number))
        if record is None:  # begun before this server noted transactions
            record = TxnRecord(_now(), now_mono, None)
        doc: dict[str, Any] = {"type": "idleSession", "host": host,
                               "desc": "inactive transaction"}
        doc.update(record.client or {"client": "", "connectionId": 0, "appName": "",
                                     "clientMetadata": {}})
        doc["lsid"] = {"id": Binary(session_id, 4), "uid": Binary(uid, 0)}
        doc["transaction"] = _transaction_stats(record, txn_number, limit, now_mono)
        doc["waitingForLock"] = False
        doc["active"] = False
        doc["locks"] = {}
        doc["lockStats"] = {}
        out.append(doc)
    return out


def _transaction_stats(record: TxnRecord, txn_number: int, limit: float,
                       now_mono: float) -> dict[str, Any]:
    """SingleTransactionStats::report of a multi-document transaction."""
    parameters: dict[str, Any] = {"txnNumber": Int64(txn_number), "txnRetryCounter": 0,
                                  "autocommit": False}
    if record.read_concern is not None:
        parameters["readConcern"] = {**record.read_concern, "provenance": "clientSupplied"}
    else:
        parameters["readConcern"] = {"level": "local", "provenance": "implicitDefault"}
    open_us = int(max(0.0, now_mono - record.started_mono) * 1_000_000)
    active_us = min(open_us, int(record.active_s * 1_000_000))
    stats: dict[str, Any] = {
        "parameters": parameters,
        "readTimestamp": Timestamp(0, 0),
        "startWallClockTime": _iso_local(record.started),
        "timeOpenMicros": Int64(open_us),
        "timeActiveMicros": Int64(active_us),
        "timeInactiveMicros": Int64(open_us - active_us),
    }
    if limit > 0:
        stats["expiryTime"] = _iso_local(record.started + datetime.timedelta(seconds=limit))
    return stats
