"""Handshake and server-information commands, answered as a replica-set primary would."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.commands import arguments
from cdcserver.commands import auth as auth_commands
from cdcserver.commands.admin import ELECTION_ID
from cdcserver.commands.base import Handler, family
from cdcserver.context import ConnectionState, ServerState
from pipeline_stages.errors import MongoError

# The handshake commands' own table (which modes serve them: cdcserver/deployments/).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

# The version and the electionId live with the admin commands (serverStatus reports them too).
_ELECTION_ID = ELECTION_ID


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def hello_reply(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], legacy: bool
) -> dict[str, Any]:
    ts = server.oplog.cluster_time()
    op_time = {"ts": ts, "t": Int64(1)}
    write_date = (
        datetime.datetime.fromtimestamp(ts.time, datetime.UTC) if ts.time else server.started
    )
    reply: dict[str, Any] = {
        "topologyVersion": topology_version(server),
        "hosts": [server.me],
        "setName": server.set_name,
        "setVersion": 1,
    }
    if legacy:
        reply["ismaster"] = True
    else:
        reply["isWritablePrimary"] = True
    reply.update(
        {
            "secondary": False,
            "primary": server.me,
            "me": server.me,
            "electionId": _ELECTION_ID,
            "lastWrite": {
                "opTime": op_time,
                "lastWriteDate": write_date,
                "majorityOpTime": op_time,
                "majorityWriteDate": write_date,
            },
            "maxBsonObjectSize": 16 * 1024 * 1024,
            "maxMessageSizeBytes": server.max_message_bytes,
            "maxWriteBatchSize": 100_000,
            "localTime": _now(),
            "logicalSessionTimeoutMinutes": 30,
            "connectionId": conn.id,
            "minWireVersion": 0,
            "maxWireVersion": server.release.max_wire_version,
            "readOnly": False,
        }
    )
    if cmd.get("helloOk") is True:
        reply["helloOk"] = True
    offered = cmd.get("compression")
    if isinstance(offered, list) and conn.compressor is None:
        agreed = [c for c in offered if c in server.compressors]
        if agreed:
            reply["compression"] = agreed
            conn.compressor = agreed[0]
    if isinstance(cmd.get("client"), dict):
        conn.client_metadata = cmd["client"]
    reply.update(auth_commands.hello_auth_fields(server, conn, cmd))
    return reply


def topology_version(server: ServerState) -> dict[str, Any]:
    """This process's topologyVersion (the SDAM spec's): a processId made when the process
    started, and a counter that nothing a client can see moves while it runs. Every mode
    answers with its own process's: the embedded replica set, a recording, a shard of the
    embedded cluster (each shard is its own process to its clients), the front (mongos: its
    own process's, as MongosTopologyCoordinator's), and a sidecar (`--upstream`, replica set
    or sharded): its clients see cdcserver, one primary or one mongos, never the upstream's
    members, so a step-down upstream is the sidecar's tail's to follow, not a topology change
    for its clients. Shutting down is not a new version here: a waiting monitor gets 91, as
    mongod's quiesce mode answers it."""
    return {"processId": server.process_id, "counter": Int64(0)}


def awaitable_arguments(cmd: dict[str, Any]) -> tuple[dict[str, Any] | None, int | None]:
    """(topologyVersion, maxAwaitTimeMS) of an awaitable hello, (None, None) of another; the
    errors of mongod's HelloCommand parse (hello.idl: the IDL context is "hello" for its
    aliases too) and of CmdHello::run (31368 one without the other, 31372)."""
    # maxAwaitTimeMS is checked first (mongod parses in the request's field order: the two
    # differ only for a request where both are malformed).
    wait = arguments.safe_int_arg(cmd, "maxAwaitTimeMS", "hello")
    if wait is not None and wait < 0:
        raise MongoError(
            51024, f"BSON field 'maxAwaitTimeMS' value must be >= 0, actual value '{wait}'"
        )
    version = arguments.object_arg(cmd, "topologyVersion", "hello")
    if version is not None:
        where = "hello.topologyVersion"
        for key in version:  # TopologyVersion is a strict struct
            if key not in ("processId", "counter"):
                raise arguments.unknown_field(f"{where}.{key}")
        process_id = version.get("processId")
        if process_id is not None and not isinstance(process_id, ObjectId):
            raise arguments.wrong_type(f"{where}.processId", process_id, "objectId")
        counter = arguments.long_arg(version, "counter", where)
        if process_id is None:
            raise arguments.missing(f"{where}.processId")
        if counter is None:
            raise arguments.missing(f"{where}.counter")
        version = {"processId": process_id, "counter": Int64(counter)}
    if version is None or wait is None:
        if version is not None:
            raise MongoError(31368, "A request with a 'topologyVersion' must include "
                                    "'maxAwaitTimeMS'")
        if wait is not None:
            raise MongoError(31368, "A request with 'maxAwaitTimeMS' must include a "
                                    "'topologyVersion'")
        return None, None
    if version["counter"] < 0:
        raise MongoError(31372, "topologyVersion must have a non-negative counter")
    return version, wait


# How long one awaitable hello waits at most (a hang guard: a monitor asks 10 s).
MAX_AWAIT_S = 60.0


async def await_topology_change(
    server: ServerState, client: dict[str, Any], wait_ms: int, *, router: bool = False
) -> None:
    """The awaitable hello's wait (the SDAM spec's streaming protocol; mongod's
    shouldParkHelloAwaitingTopologyChange, mongos's MongosTopologyCoordinator): at once when
    the client's topologyVersion is another process's or older than ours; when it is ours,
    until the topology changes (here: the server starts shutting down) or `wait_ms` has
    passed. A counter ahead of ours is an error (31382; mongos's 51761)."""
    current = topology_version(server)
    if client["processId"] == current["processId"]:
        theirs, ours = int(client["counter"]), int(current["counter"])
        if theirs > ours:
            code, whose = (51761, "mongos") if router else (31382, "server")
            raise MongoError(
                code, f"Received a topology version with counter: {theirs} which is greater "
                f"than the {whose} topology version counter: {ours}",
            )
        if theirs == ours:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    server.quiescing.wait(), min(wait_ms / 1000, MAX_AWAIT_S)
                )
    if server.shutting_down:
        raise MongoError(91, "The server is in quiesce mode and will shut down")


async def _hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str, legacy: bool,
    *, router: bool = False,
) -> dict[str, Any]:
    """hello / isMaster; its awaitable form (a driver's monitor) waits first. With OP_MSG's
    exhaustAllowed the service layer (server.py) sends its reply with moreToCome and runs it
    again with the reply's topologyVersion, reply after reply, as mongod's exhaust hello."""
    version, wait_ms = awaitable_arguments(cmd)
    if version is not None and wait_ms is not None:
        await await_topology_change(server, version, wait_ms, router=router)
    return hello_reply(server, conn, cmd, legacy)


@command("hello")
async def hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _hello(server, conn, cmd, db, legacy=False)


@command("isMaster", "ismaster")
async def is_master(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _hello(server, conn, cmd, db, legacy=True)


@command("ping")
async def ping(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {}


@command("buildInfo", "buildinfo")
async def build_info(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {
        "version": server.release.version,
        "gitVersion": "cdcserver",
        "versionArray": server.release.version_array,
        "bits": 64,
        "debug": False,
        "maxBsonObjectSize": 16 * 1024 * 1024,
        "storageEngines": ["wiredTiger"],
        "javascriptEngine": "none",
        "modules": [],
    }


@command("connectionStatus")
async def connection_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {"authInfo": auth_commands.auth_info(conn)}


@command("whatsmyuri")
async def whats_my_uri(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {"you": conn.peer}


@command("refreshSessions", "startSession")  # endSessions, killSessions: transactions.py
async def sessions(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {}


@command("listDatabases")
async def list_databases(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    names = sorted({d for d, _ in server.oplog.namespaces()})
    dbs = [{"name": name, "sizeOnDisk": Int64(0), "empty": False} for name in names]
    if cmd.get("nameOnly"):
        dbs = [{"name": d["name"]} for d in dbs]
    return {"databases": dbs, "totalSize": Int64(0), "totalSizeMb": Int64(0)}


@command("listCollections")
async def list_collections(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    colls = sorted(c for d, c in server.oplog.namespaces() if d == db and c)
    batch = [{"name": c, "type": "collection", "options": {}, "info": {"readOnly": False}}
             for c in colls]
    return {"cursor": {"id": Int64(0), "ns": f"{db}.$cmd.listCollections", "firstBatch": batch}}
