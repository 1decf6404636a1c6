"""The front's handshake: hello / isMaster as mongos answers them (`msg: "isdbgrid"`, no
replica-set fields), isdbgrid, ping, and serverStatus (a shard's, as the router's process).

mongos: src/mongo/s/commands/cluster_hello_cmd.cpp. `_front_hello` also answers for the
modes that are a mongos to their clients without being this cluster (sharding/sidecar.py,
sharding/recorded.py). Its awaitable form is mongos's (MongosTopologyCoordinator): the
router's own process's topologyVersion (a sidecar's too: `handshake.topology_version`),
51761 for a counter ahead of it; exhaust (moreToCome) is the service layer's (server.py).
"""

from __future__ import annotations

from typing import Any

from cdcserver.commands import handshake
from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.router.routing import forward_default

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


# In mongos's order (cluster_hello_cmd.cpp: maxWireVersion before minWireVersion).
_HELLO_KEEP = ("maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize", "localTime",
               "logicalSessionTimeoutMinutes", "connectionId", "maxWireVersion",
               "minWireVersion")


async def _front_hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str, legacy: bool
) -> dict[str, Any]:
    base = await handshake._hello(server, conn, cmd, db, legacy, router=True)
    reply: dict[str, Any] = {}
    if cmd.get("helloOk") is True:
        reply["helloOk"] = True
    reply["ismaster" if legacy else "isWritablePrimary"] = True
    reply["msg"] = "isdbgrid"
    reply["topologyVersion"] = base["topologyVersion"]
    for key in _HELLO_KEEP:
        reply[key] = base[key]
    for key, value in base.items():  # compression, saslSupportedMechs, speculative auth
        if key not in reply and key not in (
            "hosts", "setName", "setVersion", "secondary", "primary", "me", "electionId",
            "lastWrite", "readOnly", "ismaster", "isWritablePrimary",
        ):
            reply[key] = value
    return reply


@command("hello")
async def hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _front_hello(server, conn, cmd, db, legacy=False)


@command("isMaster", "ismaster")
async def is_master(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _front_hello(server, conn, cmd, db, legacy=True)


@command("isdbgrid")
async def isdbgrid(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    import socket

    return {"isdbgrid": 1, "hostname": socket.gethostname()}


@command("ping")
async def ping(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {}


@command("serverStatus")
async def server_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A shard's serverStatus, as the process it describes is the router."""
    reply = await forward_default(server, conn, cmd, db)
    if "process" in reply:
        reply["process"] = "mongos"
    return reply
