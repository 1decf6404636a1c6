"""The front's command table: `TABLE`, the commands mongos answers itself (hello with
`msg: "isdbgrid"`, the sharding commands, `config.*` reads) and the routed ones (CRUD by
shard key, DDL on the database's primary shard or on every shard of a sharded collection,
change streams merged from every shard), one family per module of this package. The mode's
whole table (`deployments/cluster.py` `CLUSTER`) adds fail points and, for every other
command a shard knows, `routing.forward_default`; each entry `gossiping`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.commands.tables import merge
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.router import (
    admin,
    chunks,
    collection_moves,
    ddl,
    handshake,
    query,
    transactions,
    write_ops,
    zones,
)
from cdcserver.sharding.router.query import note_shard_cursor
from cdcserver.sharding.router.routing import cluster_of

# The families do not overlap (`merge` says so if they come to).
TABLE: dict[str, Handler] = merge(
    handshake.TABLE,  # hello, isMaster, isdbgrid, ping, serverStatus
    admin.TABLE,  # listShards, enableSharding, shardCollection, shards, resharding, refine
    chunks.TABLE,  # split, moveChunk, moveRange
    zones.TABLE,  # addShardToZone, removeShardFromZone, updateZoneKeyRange, the balancer
    collection_moves.TABLE,  # moveCollection, unshardCollection
    write_ops.TABLE,  # insert, update, delete, findAndModify
    query.TABLE,  # find, count, distinct, aggregate (config.* reads, change streams)
    ddl.TABLE,  # create, createIndexes, collMod, renameCollection, drops, listDatabases
    transactions.TABLE,  # commitTransaction, abortTransaction, the session commands
)


def gossiping(handler: Handler) -> Handler:
    """mongos advances its logical clock to the `$clusterTime` a client gossips (no key
    checks: the cluster signs nothing, as a cluster without auth)."""

    async def run(
        server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
    ) -> dict[str, Any]:
        gossip = cmd.get("$clusterTime")
        if isinstance(gossip, Mapping) and isinstance(gossip.get("clusterTime"), Timestamp):
            cluster_of(server).clock.advance_to(gossip["clusterTime"])
        reply = await handler(server, conn, cmd, db)
        note_shard_cursor(server, reply)
        return reply

    run.__name__ = getattr(handler, "__name__", "forward")
    run.__dict__["__wrapped__"] = handler  # tables.describe names it
    return run

