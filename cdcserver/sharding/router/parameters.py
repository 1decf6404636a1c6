"""mongos's server parameters: the front answers getParameter and setParameter itself, as
mongos does with its own parameter set (each process has its own: mongos does not pass
either command to a shard), and leaves the shards' parameters alone.

The parameters are those of the server's that mongos 8.0 has too (authentication
mechanisms, cursorTimeoutMillis, enableTestCommands, the logical session cache's, maxBSONDepth,
requireApiVersion, tlsMode: IDL parameters linked into mongos), read and set on the front:
its cursorTimeoutMillis reaps the front's cursors, its requireApiVersion holds at the front.
mongod's storage and transaction parameters (transactionLifetimeLimitSeconds,
ttlMonitorEnabled, ttlMonitorSleepSecs) are no parameters of mongos: 72, as any unknown one.
"""

from __future__ import annotations

from typing import Any

from cdcserver.commands import admin
from cdcserver.context import ConnectionState, ServerState


async def get_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """getParameter on the front's own parameters (the front has no store: none of mongod's
    storage parameters)."""
    return await admin.get_parameter(server, conn, cmd, db)


async def set_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """setParameter on the front's own parameters."""
    return await admin.set_parameter(server, conn, cmd, db)
