"""Handshake and server-information commands, answered as a replica-set primary would."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

from bson.int64 import Int64

from cdcserver.commands import auth as auth_commands
from cdcserver.commands.admin import ELECTION_ID, MAX_WIRE_VERSION, SERVER_VERSION
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
        "topologyVersion": {"processId": server.process_id, "counter": Int64(0)},
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
            "maxWireVersion": MAX_WIRE_VERSION,
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


async def _hello(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str, legacy: bool
) -> dict[str, Any]:
    # Streaming form used by monitors: wait up to maxAwaitTimeMS for a topology change; ours
    # never changes, so answer when the time is up.
    if isinstance(cmd.get("topologyVersion"), dict) and "maxAwaitTimeMS" in cmd:
        wait = cmd["maxAwaitTimeMS"]
        if isinstance(wait, bool) or not isinstance(wait, (int, float)):
            from pipeline_stages.value_string import type_name

            raise MongoError(
                14,
                f"BSON field '{next(iter(cmd))}.maxAwaitTimeMS' is the wrong type "
                f"'{type_name(wait)}', expected types '[long, int, decimal, double']",
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                server.quiescing.wait(), min(max(int(wait), 0), 60_000) / 1000
            )
        if server.shutting_down:
            raise MongoError(91, "The server is in quiesce mode and will shut down")
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
    major, minor, patch = (int(x) for x in SERVER_VERSION.split("."))
    return {
        "version": SERVER_VERSION,
        "gitVersion": "cdcserver",
        "versionArray": [major, minor, patch, 0],
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
