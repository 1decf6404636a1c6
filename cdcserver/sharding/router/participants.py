"""The router's state of a session's transaction (mongos's src/mongo/s/transaction_router.cpp):
which shards it reached, which of them wrote (the first is its recovery shard), whether its
commit was started, and the recovery token every reply in the transaction carries.

A shard joins the transaction with the first statement the front sends it (`startTransaction`,
with the transaction's readConcern); the commit or abort goes to every shard it reached. The
state lives until the session starts another transaction (mongos keeps one per session): a
retried commitTransaction is answered from it, and one the router has never seen (another
router, or this one restarted) by the recovery shard the client's `recoveryToken` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdcserver.commands.transactions import full_lsid, lsid_str
from cdcserver.embedded.sessions import Session
from pipeline_stages.errors import MongoError


class _Store(Protocol):
    def session(self, lsid: dict[str, Any]) -> Session: ...


class _Shard(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def store(self) -> _Store: ...


class _Catalog(Protocol):
    collections: dict[str, dict[str, Any]]
    chunks: dict[str, list[dict[str, Any]]]

    def primary(self, db: str) -> str | None: ...


class _Cluster(Protocol):
    @property
    def txn_routers(self) -> TransactionRouters: ...

    @property
    def catalog(self) -> _Catalog: ...


@dataclass
class RouterTxn:
    """One session's transaction as the router knows it (TransactionRouter::Router)."""

    txn_number: int
    read_concern: Any = None
    participants: list[str] = field(default_factory=list)  # in the order they joined
    writers: set[str] = field(default_factory=set)  # participants that wrote
    recovery_shard: str | None = None  # the first participant that wrote
    commit_started: bool = False  # terminationInitiated: a commit was sent
    recovering: bool = False  # a commit of a transaction this router never ran
    committed: bool = False  # a commit answered ok (a retry is answered ok)
    # each namespace it reached -> its placement then (`placement`): a statement or commit
    # after a migration, movePrimary or resharding of one aborts the transaction
    placements: dict[str, Any] = field(default_factory=dict)
    statement: int = 0  # the client's statements so far (latestStmtId)

    def recovery_token(self) -> dict[str, Any]:
        """`recoveryToken` (appendRecoveryToken): empty while the transaction only read."""
        return {} if self.recovery_shard is None else {"recoveryShardId": self.recovery_shard}


SessionKey = tuple[bytes, bytes]  # the lsid's id and uid (the user's digest)


def session_key(lsid: Mapping[str, Any]) -> SessionKey:
    full = full_lsid(lsid)
    return (bytes(full["id"] or b""), bytes(full["uid"] or b""))


class TransactionRouters:
    """Every session's router state (mongos: one TransactionRouter per session)."""

    def __init__(self) -> None:
        self.sessions: dict[SessionKey, RouterTxn] = {}

    def of(self, cmd: Mapping[str, Any]) -> RouterTxn | None:
        """The state of the transaction `cmd` names (lsid, txnNumber), None if another."""
        lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
        if not isinstance(lsid, Mapping) or number is None:
            return None
        txn = self.sessions.get(session_key(lsid))
        return txn if txn is not None and txn.txn_number == int(number) else None

    def latest(self, lsid: Mapping[str, Any]) -> RouterTxn | None:
        return self.sessions.get(session_key(lsid))

    def begin(self, cmd: Mapping[str, Any], *, recovering: bool = False) -> RouterTxn:
        """A new transaction on the session (the previous one's state is dropped)."""
        txn = RouterTxn(int(cmd["txnNumber"]), recovering=recovering)
        self.sessions[session_key(cmd["lsid"])] = txn
        return txn

    def end_session(self, lsid: Mapping[str, Any]) -> None:
        self.sessions.pop(session_key(lsid), None)


def placement(catalog: _Catalog, ns: str) -> Any:
    """Where namespace `ns`'s documents live: its database's primary, its collection's
    incarnation (resharding makes a new one) and which shard owns each range (a split alone
    changes nothing: adjacent chunks on one shard count as one range)."""
    db = ns.split(".", 1)[0]
    coll = catalog.collections.get(ns)
    runs: list[tuple[Any, str]] = []
    for chunk in catalog.chunks.get(ns, ()):
        if not runs or runs[-1][1] != chunk["shard"]:
            runs.append((tuple(chunk["min"].items()), chunk["shard"]))
    return (catalog.primary(db), None if coll is None else coll.get("uuid"), tuple(runs))


def placement_changed(txn: RouterTxn, cmd: Mapping[str, Any], ns: str, why: str) -> MongoError:
    """StaleConfig as mongos answers a transaction whose data moved under it (it cannot
    retry a statement of one): the transaction is aborted (`in_session`)."""
    return MongoError(
        13388, f"Transaction {lsid_str(full_lsid(cmd['lsid']))}:{txn.txn_number} was aborted "
        f"on statement {txn.statement} due to: an error from cluster data placement change "
        f":: caused by :: {why} for {ns}", labels=["TransientTransactionError"])


def check_placements(cluster: _Cluster, txn: RouterTxn, cmd: Mapping[str, Any]) -> None:
    """Every namespace the transaction reached is where it was then (commit's check)."""
    for ns, seen in txn.placements.items():
        if seen[0] is not None and placement(cluster.catalog, ns) != seen:
            raise placement_changed(txn, cmd, ns, "migration commit in progress")


def in_transaction(cmd: Mapping[str, Any]) -> bool:
    return (cmd.get("autocommit") is False and isinstance(cmd.get("lsid"), Mapping)
            and cmd.get("txnNumber") is not None)


def join_transaction(cluster: _Cluster, shard: _Shard, body: dict[str, Any]) -> None:
    """mongos sends a shard the full session id (with the user's digest: two users' sessions
    are two sessions on the shard too), and starts the transaction on each shard the first
    time it sends it a statement of it (`startTransaction: true`, with the transaction's
    readConcern)."""
    lsid = body.get("lsid")
    if isinstance(lsid, Mapping) and "uid" not in lsid:
        body["lsid"] = full_lsid(lsid)
    if not in_transaction(body) or next(iter(body)) in ("commitTransaction", "abortTransaction"):
        return
    routers = cluster.txn_routers
    txn = routers.of(body)
    target, db = body.get(next(iter(body))), body.get("$db")
    if txn is not None and isinstance(target, str) and isinstance(db, str):
        ns = f"{db}.{target}"
        now = placement(cluster.catalog, ns)
        seen = txn.placements.setdefault(ns, now)
        if seen[0] is None:  # its database did not exist: made since (maybe by this one)
            txn.placements[ns] = seen = now
        if seen != now:
            raise placement_changed(txn, body, ns, "version mismatch detected")
    if body.get("startTransaction") is True:
        # The client's first statement (a txnNumber is never reused): it may reach several
        # shards; each starts the transaction once.
        if txn is None:
            txn = routers.begin(body)
            txn.read_concern = body.get("readConcern")
            if isinstance(target, str) and isinstance(db, str):
                txn.placements[f"{db}.{target}"] = placement(cluster.catalog, f"{db}.{target}")
        if shard.name in txn.participants:
            del body["startTransaction"]
            body.pop("readConcern", None)
        return
    if txn is not None and shard.name not in txn.participants:
        body["startTransaction"] = True
        if txn.read_concern is not None:
            body["readConcern"] = txn.read_concern


def note_participant(cluster: _Cluster, shard: _Shard, cmd: Mapping[str, Any]) -> None:
    """After a statement a shard answered: the shard is a participant, and a writer once its
    part of the transaction holds a write (processParticipantResponse's readOnly)."""
    if not in_transaction(cmd) or next(iter(cmd)) in ("commitTransaction", "abortTransaction"):
        return
    txn = cluster.txn_routers.of(cmd)
    if txn is None:  # a statement of a transaction this router did not start: the shard's
        return
    if shard.name not in txn.participants:
        txn.participants.append(shard.name)
    if shard.name not in txn.writers:
        part = shard.store.session(full_lsid(cmd["lsid"])).txn
        if part is not None and (part.ops or part.created):
            txn.writers.add(shard.name)
            if txn.recovery_shard is None:
                txn.recovery_shard = shard.name
