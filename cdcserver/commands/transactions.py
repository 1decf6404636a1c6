"""Logical sessions of the embedded store: retryable writes, multi-document transactions
(`commitTransaction`, `abortTransaction`) and ending sessions (`endSessions`, `killSessions`,
`killAllSessions`), answered as mongod 8.0's TransactionParticipant and session commands do.

A session is `{id, uid}`: the client's `lsid.id` and the digest of the user who runs the
command (`cdcserver.auth.SESSION_USER_DIGEST`), so the same id sent by another user is another
session, with its own txnNumber, transaction and retryable statements. Each session has one
active txnNumber, a retryable write's or a transaction's (`TransactionParticipant::
beginOrContinue`); its outcome is kept in the store's `config.transactions` (store.py).
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bson.binary import Binary
from bson.timestamp import Timestamp

from cdcserver import auth
from cdcserver.commands import txn_rules, write_concern
from cdcserver.commands.base import Handler, family
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded.store import LoggedWrite, OpSession, Session, Store, Txn, session_key
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# The transaction and session commands' table (which modes serve them: cdcserver/deployments/).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

_TRANSIENT = ["TransientTransactionError"]


def get_store(server: ServerState) -> Store:
    store = server.store
    if store is None:
        raise _no_store()
    return store


def _no_store() -> MongoError:
    return MongoError(
        115, "this cdcserver serves a recorded oplog; writes need the embedded store "
        "(`cdcserver serve` without --oplog)",
    )


async def needs_store(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The recorded mode's entry for a command that works only on the embedded store (115,
    as its handler would answer first thing there: deployments/recorded.py)."""
    raise _no_store()


def full_lsid(lsid: Mapping[str, Any]) -> dict[str, Any]:
    """The session id as mongod makes it (makeLogicalSessionId): the client's id and the
    running user's digest (a `uid` the client sent was allowed by ServerAuth.check)."""
    uid = lsid.get("uid")
    if uid is None:
        uid = Binary(auth.SESSION_USER_DIGEST.get(), 0)
    return {"id": lsid.get("id"), "uid": uid}


def lsid_str(lsid: Mapping[str, Any]) -> str:
    """A LogicalSessionId as mongod streams it into messages: id - uid (base64) - - ."""
    try:
        uid = base64.b64encode(bytes(lsid["uid"])).decode()
        return f"{uuid.UUID(bytes=bytes(lsid['id']))} - {uid} -  - "
    except Exception:  # noqa: BLE001
        return str(lsid)


def _session(store: Store, cmd: Mapping[str, Any]) -> Session:
    return store.session(full_lsid(cmd["lsid"]))


# ---------------------------------------------------------------------------------------------
# Retryable writes


@dataclass
class Retry:
    """A write command's session state: the statements its txnNumber already executed."""

    session: OpSession | None
    owner: Session | None = None

    def result(self, stmt_id: int, command: str = "insert") -> Any:
        """What the statement answered when it ran (`NOT_DONE` if it did not)."""
        if self.owner is None:
            return NOT_DONE
        done = self.owner.stmts.get(stmt_id, NOT_DONE)
        if done is NOT_DONE and self.owner.incomplete:  # _checkStatementExecuted
            assert self.session is not None
            raise MongoError(
                217, f"Incomplete history detected for transaction {self.owner.txn_number} "
                f"on session {lsid_str(self.session.lsid)}",
            )
        if isinstance(done, LoggedWrite):  # known from the oplog only (after a restart)
            if command == "update":
                return (1, 0, (done.doc_id,)) if done.op == "i" else (1, 1, None)
            if command == "findAndModify":
                return done  # its reply is rebuilt from config.image_collection
            return 1
        return done

    def record(self, stmt_id: int, result: Any) -> None:
        if self.owner is not None:
            self.owner.stmts[stmt_id] = result

    def finish(self) -> None:
        """The session's last write is the next statement's prevOpTime."""
        if self.owner is not None and self.session is not None:
            self.owner.last_write = self.session.prev_ts


NOT_DONE = object()


def _too_old(session: Session, number: int, transaction: bool) -> MongoError:
    """225 TransactionTooOld (beginOrContinue: a newer txnNumber has started)."""
    current = "retryable write" if session.txn is None else "transaction"
    if not transaction:
        return MongoError(
            225, f"Retryable write with txnNumber {number} is prohibited on session "
            f"{lsid_str(session.lsid)} because a newer {current} with txnNumber "
            f"{session.txn_number} has already started on this session.",
        )
    counter = -1 if session.txn is None else 0
    return MongoError(
        225, f"Cannot start transaction with {{ txnNumber: {number} }} on session "
        f"{lsid_str(session.lsid)} because a newer {current} with txnNumberAndRetryCounter "
        f"{{ txnNumber: {session.txn_number}, txnRetryCounter: {counter} }} has already "
        "started on this session.",
    )


def retry_state(store: Store, cmd: Mapping[str, Any]) -> Retry:
    """A write command's session: a retryable write (lsid + txnNumber), a statement of a
    transaction (autocommit: false; its writes go to the transaction), or neither."""
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if cmd.get("autocommit") is False:
        check_txn_namespace(cmd)
        store.enter_snapshot(transaction_of(store, cmd))
        return Retry(None)
    if not isinstance(lsid, Mapping) or number is None:
        return Retry(None)
    session = _session(store, cmd)
    number = int(number)
    if number < session.txn_number:
        raise _too_old(session, number, transaction=False)
    if number > session.txn_number:  # a new retryable write (ends an open transaction)
        if session.txn is not None and session.txn.state == "in progress":
            store.abort_transaction(session.txn)
        session.set_txn_number(number, None)
    elif session.txn is not None:  # _beginOrContinueRetryableWrite
        raise MongoError(
            217, "Cannot retry a retryable write that has been converted into a transaction"
        )
    return Retry(OpSession(session.lsid, number, session.last_write), session)


# ---------------------------------------------------------------------------------------------
# Transactions


def transaction_of(store: Store, cmd: Mapping[str, Any]) -> Txn:
    """The transaction a command with `autocommit: false` belongs to, started by
    `startTransaction: true` (TransactionParticipant::beginOrContinue, then the checks of
    unstashTransactionResources for the command)."""
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if not isinstance(lsid, Mapping) or number is None:
        raise MongoError(50768, "txnNumber may only be provided for multi-document transactions "
                         "and retryable write commands")
    session = _session(store, cmd)
    number = int(number)
    name = next(iter(cmd), "")
    if number < session.txn_number:
        raise _too_old(session, number, transaction=True)
    started_here = session.txn is not None and session.txn.started_by is cmd
    if cmd.get("startTransaction") is True and not started_here:  # (this command reads again)
        if number == session.txn_number:  # a replica set never restarts the active number
            raise MongoError(117, "Only servers in a sharded cluster can start a new "
                             "transaction at the active transaction number")
        if session.txn is not None and session.txn.state == "in progress":
            store.abort_transaction(session.txn)
        session.set_txn_number(number, store.begin_transaction(session.lsid, number))
        assert session.txn is not None
        session.txn.started_by = cmd
        rc = cmd.get("readConcern")
        session.txn.read_concern = dict(rc) if isinstance(rc, Mapping) else None
    elif number != session.txn_number or session.txn is None:
        # _continueMultiDocumentTransaction (commit/abort too: a first statement failed by a
        # fail point never started the transaction)
        raise MongoError(
            251, f"Given transaction number {number} does not match any in-progress "
            f"transactions. The active transaction number is {session.txn_number}",
            labels=list(_TRANSIENT),
        )
    txn = session.txn
    assert txn is not None
    if txn.state == "aborted":  # _checkIsCommandValidWithTxnState
        raise MongoError(251, f"Transaction with {{ txnNumber: {number} }} has been aborted.",
                         labels=list(_TRANSIENT))
    if txn.state == "committed" and name != "commitTransaction":  # only a commit may retry
        raise MongoError(256, f"Transaction with {{ txnNumber: {number} }} has been "
                         "committed.")
    return txn


def check_txn_namespace(cmd: Mapping[str, Any]) -> None:
    """mongod's CommandHelpers::canUseTransactions checks of the namespace."""
    db = cmd.get("$db")
    coll = next(iter(cmd.values()), None)
    if db == "local":
        raise MongoError(263, "Cannot run command against the 'local' database in a "
                         "transaction.")
    if db == "config":
        raise MongoError(263, "Cannot run command against the config database in a "
                         "transaction.")
    if coll in ("system.views", "system.profile"):
        raise MongoError(263, f"Cannot run command against the '{db}.{coll}' collection in a "
                         "transaction.")


def txn_write_error(store: Store) -> bool:
    """In a transaction, a write error ends the batch and aborts the transaction (mongod's
    handleError in write_ops_exec)."""
    txn = store.txn
    if txn is not None and txn.lsid:
        store.abort_transaction(txn)
        return True
    return False


@contextlib.contextmanager
def snapshot_reads(store: Store, cmd: Mapping[str, Any]) -> Iterator[None]:
    """A read in a transaction sees the transaction's snapshot and its own writes (mongod's
    read concern "snapshot" for transactions); a snapshot read outside transactions sees the
    store as it was at its atClusterTime; other reads see committed documents."""
    if cmd.get("autocommit") is not False:
        at = snapshot_read_time(cmd)
        if at is None:
            yield
            return
        with store.batch():
            store.enter_snapshot(_snapshot_at(store, at))
            yield
        return
    check_txn_namespace(cmd)
    with store.batch():
        store.enter_snapshot(transaction_of(store, cmd))
        yield


def _abort_failed_transaction(server: ServerState, cmd: Mapping[str, Any]) -> None:
    """A command failed inside its transaction: abort that transaction (the very session and
    txnNumber; a stale txnNumber's error leaves the newer transaction alone)."""
    store = server.store
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if not isinstance(store, Store) or not isinstance(lsid, Mapping) or number is None:
        return
    session = store.sessions.get(session_key(full_lsid(lsid)))
    txn = session.txn if session is not None else None
    if txn is not None and txn.txn_number == int(number) and txn.state == "in progress":
        with store.batch():
            store.abort_transaction(txn)


txn_rules.ERROR_HOOKS.append(_abort_failed_transaction)


@command("commitTransaction")
async def commit_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    if db != "admin":
        raise MongoError(13, "commitTransaction may only be run against the admin database.")
    wc = write_concern.parse(cmd)
    with store.batch():
        txn = transaction_of(store, cmd)
        store.commit_transaction(txn)  # a committed one: a retry, answered ok
    return write_concern.add_to_reply({}, wc)


@command("abortTransaction")
async def abort_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    if db != "admin":
        raise MongoError(13, "abortTransaction may only be run against the admin database.")
    wc = write_concern.parse(cmd)
    with store.batch():
        store.abort_transaction(transaction_of(store, cmd))  # 256 / 251 when it has ended
    return write_concern.add_to_reply({}, wc)


# ---------------------------------------------------------------------------------------------
# Ending sessions


_BIN_DATA_TYPES = {0: "general", 1: "function", 2: "binary (old)", 3: "uuid (old)", 4: "UUID",
                   5: "MD5", 6: "encrypt", 7: "Column", 8: "Sensitive", 9: "Vector"}


def _session_ids(cmd: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    """The LogicalSessionFromClient array of endSessions / killSessions, typed as mongod's
    IDL parser checks it."""
    value = cmd.get(name)
    if not isinstance(value, list):
        raise MongoError(14, f"BSON field '{name}.{name}' is the wrong type "
                         f"'{type_name(value)}', expected type 'array'")
    where = f"{name}.{name}FromClient"
    out: list[Mapping[str, Any]] = []
    for i, element in enumerate(value):
        if not isinstance(element, Mapping):
            raise MongoError(14, f"BSON field '{where}.{i}' is the wrong type "
                             f"'{type_name(element)}', expected type 'object'")
        sid = element.get("id")
        if sid is None:
            raise MongoError(40414, f"BSON field '{where}.id' is missing but a required field")
        if not isinstance(sid, bytes):
            raise MongoError(14, f"BSON field '{where}.id' is the wrong type "
                             f"'{type_name(sid)}', expected type 'binData'")
        subtype = sid.subtype if isinstance(sid, Binary) else 0
        if subtype != 4:
            kind = _BIN_DATA_TYPES.get(subtype, "user")
            raise MongoError(14, f"BSON field '{where}.id' is the wrong binData type '{kind}', "
                             "expected type 'UUID'")
        if len(sid) != 16:
            raise MongoError(207, "uuid must be a 16-byte binary field with UUID (4) subtype")
        out.append(element)
    return out


def _may_kill_any_session(server: ServerState, conn: ConnectionState) -> bool:
    server_auth = server.auth
    if server_auth is None or not server_auth.enabled:
        return True
    return auth.is_authorized(server_auth.of(conn).users,
                              [(("cluster",), ("killAnySession",))])


def _by_ids(
    server: ServerState, conn: ConnectionState, elements: list[Mapping[str, Any]]
) -> set[bytes]:
    """makeLogicalSessionIds: each id with the running user's digest; a `uid` other than the
    running user's only with killAnySession."""
    keys: set[bytes] = set()
    for element in elements:
        uid = element.get("uid")
        own = isinstance(uid, bytes) and bytes(uid) == auth.SESSION_USER_DIGEST.get()
        if "uid" in element and not own and not _may_kill_any_session(server, conn):
            raise MongoError(13, "Unauthorized to set user digest in LogicalSessionId")
        keys.add(session_key(full_lsid(element)))
    return keys


def _end(server: ServerState, keys: set[bytes] | None, uids: set[bytes] | None) -> None:
    """Abort the open transactions of the sessions named by key, or of every session of the
    users whose digests are `uids` (None: every session)."""
    store = server.store
    if not isinstance(store, Store):
        return  # a recorded oplog: no sessions to end

    def matches(lsid: Mapping[str, Any]) -> bool:
        if keys is not None:
            return session_key(lsid) in keys
        return uids is None or bytes(lsid["uid"]) in uids

    store.kill_sessions(matches)


@command("endSessions")
async def end_sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    # mongod ends them at its next session-cache refresh; their transactions end with them
    _end(server, _by_ids(server, conn, _session_ids(cmd, "endSessions")), None)
    return {}


@command("killSessions")
async def kill_sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    elements = _session_ids(cmd, "killSessions")
    if elements:
        _end(server, _by_ids(server, conn, elements), None)
        return {}
    # an empty list: every session of the logged-in user (every session without auth)
    server_auth = server.auth
    if server_auth is None or not server_auth.enabled:
        _end(server, None, None)
    else:
        _end(server, None, {auth.user_digest(u) for u in server_auth.of(conn).users})
    return {}


@command("killAllSessions")
async def kill_all_sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    users = cmd.get("killAllSessions")
    where = "KillAllSessionsCmd.killAllSessions"
    if not isinstance(users, list):
        raise MongoError(14, f"BSON field '{where}' is the wrong type '{type_name(users)}', "
                         "expected type 'array'")
    uids: set[bytes] = set()
    for i, user in enumerate(users):
        if not isinstance(user, Mapping):
            raise MongoError(14, f"BSON field '{where}.{i}' is the wrong type "
                             f"'{type_name(user)}', expected type 'object'")
        for name in ("db", "user"):
            if name not in user:
                raise MongoError(40414, f"BSON field '{where}.{name}' is missing but a "
                                 "required field")
            if not isinstance(user[name], str):
                raise MongoError(14, f"BSON field '{where}.{name}' is the wrong type "
                                 f"'{type_name(user[name])}', expected type 'string'")
        uids.add(auth.user_name_digest(user["user"], user["db"]))
    _end(server, None, uids if users else None)  # [] : every session of every user
    return {}


@command("killAllSessionsByPattern")
async def kill_all_sessions_by_pattern(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """Each pattern names a session (`lsid`), a user's sessions (`uid`) or, with neither, every
    session (`users` / `roles` are impersonation data, not filters); [] is every session."""
    patterns = cmd.get("killAllSessionsByPattern")
    where = "KillAllSessionsByPatternCmd.killAllSessionsByPattern"
    if not isinstance(patterns, list):
        raise MongoError(14, f"BSON field '{where}' is the wrong type '{type_name(patterns)}', "
                         "expected type 'array'")
    keys: set[bytes] = set()
    uids: set[bytes] = set()
    for i, pattern in enumerate(patterns):
        if not isinstance(pattern, Mapping):
            raise MongoError(14, f"BSON field '{where}.{i}' is the wrong type "
                             f"'{type_name(pattern)}', expected type 'object'")
        lsid, uid = pattern.get("lsid"), pattern.get("uid")
        if isinstance(lsid, Mapping) and isinstance(lsid.get("id"), bytes):
            keys.add(session_key(full_lsid(lsid)))
        elif isinstance(uid, bytes):
            uids.add(bytes(uid))
        elif lsid is None and uid is None:
            _end(server, None, None)  # a pattern without a filter: every session
            return {}
        else:
            raise MongoError(14, f"BSON field '{where}.{'lsid' if lsid is not None else 'uid'}' "
                             "is the wrong type "
                             f"'{type_name(lsid if lsid is not None else uid)}', expected type "
                             f"'{'object' if lsid is not None else 'binData'}'")
    if not patterns:
        _end(server, None, None)
        return {}
    if keys:
        _end(server, keys, None)
    if uids:
        _end(server, None, uids)
    return {}


# ---------------------------------------------------------------------------------------------
# Snapshot reads outside transactions (readConcern level "snapshot", 5.0+): find / aggregate /
# distinct read the store as it was at `atClusterTime`; the first read of a snapshot session
# has none, reads now and answers the time it read at (the driver sends it with the next
# reads). The store keeps that moment's snapshot as long as a transaction's
# (transactionLifetimeLimitSeconds); a time older than what is kept is 239 SnapshotTooOld.


def snapshot_read_time(cmd: Mapping[str, Any]) -> Timestamp | None:
    """The atClusterTime a snapshot read reads at (set by `open_snapshot_read`), else None."""
    rc = cmd.get("readConcern")
    if cmd.get("autocommit") is False or not isinstance(rc, Mapping):
        return None
    at = rc.get("atClusterTime")
    return at if rc.get("level") == "snapshot" and isinstance(at, Timestamp) else None


def _snapshots(store: Store) -> dict[Timestamp, Txn]:
    snapshots = store.snapshot_reads_at
    for at in [at for at, txn in snapshots.items() if txn.state != "in progress"]:
        del snapshots[at]  # expired (its lifetime) or aborted
    return snapshots


def open_snapshot_read(store: Store, cmd: dict[str, Any], now: Timestamp) -> Timestamp:
    """Before a snapshot read runs: the time it reads at (its atClusterTime, else `now`), the
    store's snapshot of that time kept; the command's readConcern then names that time."""
    rc = dict(cmd["readConcern"])
    at = rc.get("atClusterTime")
    if not isinstance(at, Timestamp):
        at = now
    snapshots = _snapshots(store)
    if at not in snapshots:
        latest = store.latest_ts()
        if latest is not None and latest > at:  # written since: that past is not kept
            raise MongoError(
                239, f"Read timestamp Timestamp({at.time}, {at.inc}) is older than the oldest "
                "available timestamp.",
            )
        lsid = cmd.get("lsid")
        owner = full_lsid(lsid) if isinstance(lsid, Mapping) else {"snapshotRead": at}
        snapshots[at] = store.begin_transaction(owner, -1)  # reads only; never committed
    rc["atClusterTime"] = at
    cmd["readConcern"] = rc
    return at


def _snapshot_at(store: Store, at: Timestamp) -> Txn:
    txn = _snapshots(store).get(at)
    if txn is None:
        raise MongoError(239, f"Read timestamp Timestamp({at.time}, {at.inc}) is older than "
                         "the oldest available timestamp.")
    return txn
