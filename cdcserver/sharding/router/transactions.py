"""The front's end of a transaction (mongos's src/mongo/s/transaction_router.cpp and the
coordinator): commitTransaction on one participant, or on several at one commit time
(two-phase, its decision durable first: `coordinator.py`); abortTransaction on every
participant; the session commands on every shard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cdcserver.commands import failpoints, write_concern
from cdcserver.commands.base import family
from cdcserver.commands.transactions import full_lsid, lsid_str, transaction_of
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.participants import RouterTxn, check_placements, in_transaction
from cdcserver.sharding.router.routing import cluster_of, forward, route
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


def in_session(handler: Handler) -> Handler:
    """`handler` with mongos's session info: the full session id (with the user's digest,
    initializeOperationSessionInfo) is what every shard is sent, and each reply in a
    transaction carries its `recoveryToken` after `ok` (appendRecoveryToken)."""

    async def run(
        server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
    ) -> dict[str, Any]:
        lsid = cmd.get("lsid")
        if isinstance(lsid, Mapping) and "uid" not in lsid:
            cmd["lsid"] = full_lsid(lsid)
        if not in_transaction(cmd):
            return await handler(server, conn, cmd, db)
        cluster = cluster_of(server)
        try:
            reply = await handler(server, conn, cmd, db)
        except MongoError as exc:
            if exc.code == 13388:  # its data moved: mongos aborts it (implicitly)
                await _abort_everywhere(cluster, cmd)
            raise
        finally:
            txn = cluster.txn_routers.of(cmd)
            if txn is not None:
                txn.statement += 1
        if txn is not None:
            reply["ok"] = 1.0  # (its place: the token follows it)
            reply["recoveryToken"] = txn.recovery_token()
        return reply

    run.__name__ = getattr(handler, "__name__", "run")
    run.__dict__["__wrapped__"] = handler  # tables.describe names it
    return run


@command("commitTransaction")
async def commit_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """TransactionRouter::Router::commitTransaction: one participant commits directly; one
    writer commits after the read-only ones; several writers commit in two phases (the
    decision durable first). A retry of a commit this router started asks again where the
    outcome is kept; a commit this router never ran (another router, or this one before a
    restart) asks the recovery shard the client's `recoveryToken` names."""
    cluster = cluster_of(server)
    if db != "admin":
        raise MongoError(13, "commitTransaction may only be run against the admin database.")
    txn = _router_txn(cluster, cmd, for_commit=True)
    body = {k: v for k, v in cmd.items() if k != "recoveryToken"}
    if txn.recovering:
        token = cmd.get("recoveryToken")
        if not isinstance(token, Mapping):
            raise MongoError(50940, "Cannot recover the transaction decision without a "
                             "recoveryToken")
        reply = _commit_with_recovery_token(cluster, body, token)
    elif not txn.participants:
        # Begun here but never sent to a shard (a find on a database that does not exist).
        reply = {}
    else:
        first_attempt = not txn.commit_started
        if first_attempt:
            check_placements(cluster, txn, cmd)  # 13388: aborted (`in_session`)
        txn.commit_started = True
        writers = [n for n in txn.participants if n in txn.writers]
        readers = [n for n in txn.participants if n not in txn.writers]
        if len(txn.participants) == 1 or not writers:
            reply = await _commit_directly(cluster, txn.participants, body, db)
        elif len(writers) == 1:
            if first_attempt:
                await _commit_directly(cluster, readers, body, db)
                reply = await _commit_directly(cluster, writers, body, db)
            else:  # the writer is the recovery shard: it knows the outcome
                reply = _commit_with_recovery_token(cluster, body, txn.recovery_token())
        elif first_attempt:
            _commit_across_shards(server, cluster, [cluster.shard(n) for n in writers],
                                  readers, body)
            reply = {}
        else:  # the coordinator's decision: on its shard (the recovery shard)
            reply = _commit_with_recovery_token(cluster, body, txn.recovery_token())
    txn.committed = True
    return reply


@command("abortTransaction")
async def abort_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """TransactionRouter::Router::abortTransaction: every participant aborts; the first
    error only when none could (a failed statement aborted its shard's part already)."""
    cluster = cluster_of(server)
    if db != "admin":
        raise MongoError(13, "abortTransaction may only be run against the admin database.")
    txn = _router_txn(cluster, cmd, for_commit=False)
    if not txn.participants:
        raise MongoError(251, "no known command has been sent by this router for this "
                         "transaction", labels=["TransientTransactionError"])
    txn.commit_started = True
    errors: list[MongoError] = []
    reply: dict[str, Any] = {}
    for name in txn.participants:
        try:
            reply = await forward(cluster, cluster.shard(name), cmd, db)
        except MongoError as exc:
            errors.append(exc)
    if len(errors) == len(txn.participants):
        raise errors[0]
    return reply


async def _abort_everywhere(cluster: ShardedCluster, cmd: Mapping[str, Any]) -> None:
    """implicitlyAbortTransaction: every participant aborts, errors ignored."""
    txn = cluster.txn_routers.of(cmd)
    if txn is None:
        return
    abort = {"abortTransaction": 1, "lsid": cmd["lsid"], "txnNumber": cmd["txnNumber"],
             "autocommit": False}
    for name in txn.participants:
        try:
            await forward(cluster, cluster.shard(name), abort, "admin")
        except MongoError:
            pass
    txn.commit_started = True


def _router_txn(cluster: ShardedCluster, cmd: Mapping[str, Any], *, for_commit: bool
                ) -> RouterTxn:
    """beginOrContinueTxn for commit (a transaction the router does not know is recovered)
    or abort (it must know it)."""
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if not isinstance(lsid, Mapping) or number is None:
        raise MongoError(50768, "txnNumber may only be provided for multi-document "
                         "transactions and retryable write commands")
    routers = cluster.txn_routers
    latest = routers.latest(lsid)
    if latest is not None and int(number) < latest.txn_number:
        raise MongoError(225, f"txnNumber {int(number)} is less than last txnNumber "
                         f"{latest.txn_number} seen in session {lsid_str(full_lsid(lsid))}")
    if latest is not None and latest.txn_number == int(number):
        return latest
    if for_commit:
        return routers.begin(cmd, recovering=True)
    raise MongoError(
        251, f"cannot continue txnId {latest.txn_number if latest else -1} for session "
        f"{lsid_str(full_lsid(lsid))} with txnRetryCounter 0",
        labels=["TransientTransactionError"])


async def _commit_directly(cluster: ShardedCluster, names: list[str], cmd: Mapping[str, Any],
                           db: str) -> dict[str, Any]:
    """sendCommitDirectlyToShards: the last reply, or the first error."""
    reply: dict[str, Any] = {}
    for name in names:
        reply = await forward(cluster, cluster.shard(name), cmd, db)
    return reply


def _commit_with_recovery_token(cluster: ShardedCluster, cmd: Mapping[str, Any],
                                token: Mapping[str, Any]) -> dict[str, Any]:
    """_commitWithRecoveryToken, answered as the recovery shard's coordinateCommitTransaction
    with no participants answers it: from its own part of the transaction (committed: ok;
    in progress: aborted now; otherwise NoSuchTransaction)."""
    name = token.get("recoveryShardId")
    if name is None:
        raise MongoError(251, "Recovery token is empty, meaning the transaction only "
                         "performed reads and can be safely retried",
                         labels=["TransientTransactionError"])
    if not isinstance(name, str) or name not in cluster.catalog.shard_names:
        raise MongoError(70, f"Shard {name} not found")
    store = cluster.shard(name).store
    probe = {"commitTransaction": 1, "lsid": full_lsid(cmd["lsid"]),
             "txnNumber": cmd["txnNumber"], "autocommit": False}
    with store.batch():
        part = transaction_of(store, probe)  # 251 when the shard has another number
        if part.state == "in progress":
            store.abort_transaction(part)
    if part.state != "committed":
        raise MongoError(251, "Recovering the transaction's outcome found the transaction "
                         "aborted", labels=["TransientTransactionError"])
    return write_concern.add_to_reply({}, write_concern.parse(cmd))


def _commit_across_shards(server: ServerState, cluster: ShardedCluster, shards: list[Shard],
                          readers: list[str], cmd: Mapping[str, Any]) -> None:
    """A transaction that wrote on several shards commits on all of them at one commit time
    (the coordinator's commitTimestamp), without yielding to the loop in between: no stream
    can see one participant's commit without the others'. The decision is kept before the
    first participant commits (`coordinator.py`): a crash in between is finished at the
    next start. Every participant is checked first (an aborted one fails the commit with its
    error and the others abort)."""
    txns = []
    try:
        for shard in shards:
            txns.append((shard, transaction_of(shard.store, cmd)))
    except MongoError:
        for shard, txn in txns:
            with shard.store.batch():
                shard.store.abort_transaction(txn)
        raise
    from cdcserver.embedded.store import pack_transaction

    # Two-phase commit: every participant prepares (its applyOps with prepare: true), then
    # all commit at one commitTimestamp (their commitTransaction entries).
    prepares = [cluster.clock.tick() for _ in txns]
    commit_ts = cluster.clock.tick()
    # The decision is durable before any participant commits (with --data-dir): a crash
    # in between is finished at the next start (coordinator.py).
    record = cluster.coordinator.decide_commit(
        cmd.get("lsid") or {}, int(cmd.get("txnNumber") or 0), commit_ts,
        [(shard.name, prepare_ts, txn) for (shard, txn), prepare_ts in zip(
            txns, prepares, strict=True)],
    )
    crash = failpoints.fail_points(server).points[failpoints.CRASH_AFTER_FIRST_PARTICIPANT_COMMIT]
    for k, ((shard, txn), prepare_ts) in enumerate(zip(txns, prepares, strict=True)):
        if k == 1 and crash.fire():
            os._exit(9)  # a test's crash between the participants' commits (its fail point)
        store = shard.store
        entries = pack_transaction(txn.ops, store.txn_oplog_entry_ops,
                                   store.txn_oplog_entry_bytes) if txn.ops else []
        # (A transaction in several applyOps entries is logged unprepared, at the commit
        # time: its first entry at it, the others after.)
        phase = (store.prepared_commit(prepare_ts, commit_ts) if len(entries) == 1
                 else store.commit_at(commit_ts))
        with phase, store.batch():
            store.commit_transaction(txn)
    cluster.coordinator.forget(record)
    for name in readers:  # (the coordinator tells read-only participants to commit too)
        store = cluster.shard(name).store
        with store.batch():
            store.commit_transaction(transaction_of(store, cmd))


@command("endSessions", "killSessions", "killAllSessions", "killAllSessionsByPattern",
         "refreshSessions")
async def sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """On every shard (the last one's reply); an ended or killed session's router state
    goes with it."""
    reply = await route(server, cmd, db)  # its policy: routing.POLICIES
    ended = cmd.get(next(iter(cmd)))
    if next(iter(cmd)) in ("endSessions", "killSessions") and isinstance(ended, list):
        for lsid in ended:
            if isinstance(lsid, Mapping) and "id" in lsid:
                cluster_of(server).txn_routers.end_session(lsid)
    return reply
