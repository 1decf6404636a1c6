"""The front's end of a transaction (mongos's src/mongo/s/transaction_router.cpp and the
coordinator): commitTransaction on one participant, or on several at one commit time
(two-phase, its decision durable first: `coordinator.py`); abortTransaction on every
participant; the session commands on every shard.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cdcserver.commands import failpoints
from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.routing import cluster_of, forward, route
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


@command("commitTransaction", "abortTransaction")
async def end_transaction(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    key = None
    if isinstance(lsid, Mapping) and number is not None:
        key = (bytes(lsid.get("id", b"")), int(number))
    shards = cluster.participants.get(key, []) if key is not None else []
    if not shards:
        return await forward(cluster, cluster.shards[0], cmd, db)
    reply: dict[str, Any] = {}
    if next(iter(cmd)) == "commitTransaction" and len(shards) > 1:
        if db != "admin":
            raise MongoError(13, "commitTransaction may only be run against the admin "
                             "database.")
        _commit_across_shards(server, cluster, [cluster.shard(n) for n in shards], cmd)
    elif next(iter(cmd)) == "abortTransaction":
        # Every participant aborts, even when one already had (a failed statement aborts its
        # shard's part): the first error only if none could.
        errors: list[MongoError] = []
        for name in shards:
            try:
                reply = await forward(cluster, cluster.shard(name), cmd, db)
            except MongoError as exc:
                errors.append(exc)
        if len(errors) == len(shards):
            raise errors[0]
    else:
        for name in shards:
            reply = await forward(cluster, cluster.shard(name), cmd, db)
    if key is not None:
        cluster.participants.pop(key, None)
        cluster.txn_read_concern.pop(key, None)
    return reply


def _commit_across_shards(server: ServerState, cluster: ShardedCluster, shards: list[Shard],
                          cmd: Mapping[str, Any]) -> None:
    """A transaction that wrote on several shards commits on all of them at one commit time
    (the coordinator's commitTimestamp), without yielding to the loop in between: no stream
    can see one participant's commit without the others'. The decision is kept before the
    first participant commits (`coordinator.py`): a crash in between is finished at the
    next start. Every participant is checked first (an aborted one fails the commit with its
    error and the others abort)."""
    from cdcserver.commands.transactions import transaction_of

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


@command("endSessions", "killSessions", "killAllSessions", "killAllSessionsByPattern",
         "refreshSessions")
async def sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """On every shard (the last one's reply)."""
    return await route(server, cmd, db)  # its policy: routing.POLICIES
