"""The database profiler (`profile` levels 1 and 2): a `<db>.system.profile` document per
profiled operation, as mongod's profiler writes it (op, ns, command, the counts the operation
reports, millis, ts, client, appName, allUsers, user). Level 2 profiles every operation on the
database, level 1 those that took at least slowms.

As on mongod, `system.profile` is a capped collection (1 MiB) the profiler creates on first
use, local to the node: its writes are not in the oplog (nor in any change stream), so the
documents go into the store's working set directly, oldest dropped first past its size.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64

from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded.catalog import Collection
from cdcserver.embedded.store import Store
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError

log = logging.getLogger(__name__)

PROFILE_COLL = "system.profile"
PROFILE_SIZE = 1024 * 1024  # mongod's default system.profile size
_OP = {"find": "query", "getMore": "getmore", "insert": "insert", "update": "update",
       "delete": "remove"}


def level_of(server: ServerState, db: str) -> int:
    return server.profile_levels.get(db, 0)


def record(
    server: ServerState, conn: ConnectionState, db: str, name: str, cmd: Mapping[str, Any],
    reply: Mapping[str, Any] | None, error: MongoError | None, seconds: float,
) -> None:
    """Write the profile document of one finished command, if its database profiles it."""
    level = level_of(server, db)
    if level <= 0 or db in ("admin", "local", "config"):
        return
    if level == 1 and seconds < server.slow_s:
        return
    store = server.store
    if store is None:
        return
    target = cmd.get("collection") if name == "getMore" else cmd.get(name)
    if name == "profile" or target == PROFILE_COLL:
        return  # mongod does not profile reads of the profile itself
    try:
        doc = _document(store, conn, db, name, cmd, reply, error, seconds, target)
        _insert(store, db, doc)
    except Exception:  # noqa: BLE001 - profiling never fails the operation it profiles
        log.exception("profiling %r failed", name)


def _document(
    store: Store, conn: ConnectionState, db: str, name: str, cmd: Mapping[str, Any],
    reply: Mapping[str, Any] | None, error: MongoError | None, seconds: float, target: Any,
) -> dict[str, Any]:
    ns = f"{db}.{target}" if isinstance(target, str) else f"{db}.$cmd"
    doc: dict[str, Any] = {"op": _OP.get(name, "command"), "ns": ns, "command": dict(cmd)}
    cursor = reply.get("cursor") if reply is not None else None
    if isinstance(cursor, Mapping):
        batch = cursor.get("firstBatch", cursor.get("nextBatch"))
        if cursor.get("id"):
            doc["cursorid"] = Int64(cursor["id"])
        if name in ("find", "getMore", "aggregate"):
            doc["keysExamined"] = 0
            doc["docsExamined"] = _scanned(store, db, target) if name == "find" else 0
            if not cursor.get("id"):
                doc["cursorExhausted"] = True
        doc["numYield"] = 0
        doc["nreturned"] = len(batch) if isinstance(batch, list) else 0
    elif reply is not None:
        if name == "insert":
            doc["ninserted"] = int(reply.get("n", 0))
        elif name == "update":
            doc["nMatched"] = int(reply.get("n", 0)) - len(reply.get("upserted") or [])
            doc["nModified"] = int(reply.get("nModified", 0))
            if reply.get("upserted"):
                doc["nUpserted"] = len(reply["upserted"])
        elif name == "delete":
            doc["ndeleted"] = int(reply.get("n", 0))
        doc["numYield"] = 0
    if error is not None:
        doc["ok"] = 0.0
        doc["errMsg"] = error.errmsg
        doc["errName"] = error.code_name
        doc["errCode"] = error.code
    doc["locks"] = {}
    doc["flowControl"] = {}
    if reply is not None:
        doc["responseLength"] = len(bson_bytes.encode(_plain(reply)))
    doc["protocol"] = "op_msg"
    doc["millis"] = int(seconds * 1000)
    if name in ("find", "count", "distinct", "aggregate", "update", "delete"):
        doc["planSummary"] = "COLLSCAN"
    now = datetime.datetime.now(datetime.UTC)
    doc["ts"] = now.replace(microsecond=now.microsecond // 1000 * 1000)  # a BSON date: ms
    doc["client"] = conn.peer.rsplit(":", 1)[0] if isinstance(conn.peer, str) else ""
    app = (conn.client_metadata or {}).get("application")
    if isinstance(app, Mapping) and isinstance(app.get("name"), str):
        doc["appName"] = app["name"]
    users = conn.auth.users if conn.auth is not None else []
    doc["allUsers"] = [{"user": u.full_name.split("@", 1)[0], "db": u.full_name.split("@")[-1]}
                       for u in users]
    doc["user"] = users[0].full_name if users else ""
    return doc


def _plain(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    return reply if isinstance(reply, dict) else dict(reply)


def _scanned(store: Store, db: str, coll: Any) -> int:
    c = store.get(db, coll) if isinstance(coll, str) else None
    return len(c.records) if c is not None else 0


def _insert(store: Store, db: str, doc: dict[str, Any]) -> None:
    c = store.get(db, PROFILE_COLL)
    if c is None:
        c = Collection(db, PROFILE_COLL, uuid.uuid4().bytes,
                       {"capped": True, "size": PROFILE_SIZE})
        store.catalog[(db, PROFILE_COLL)] = c
    c.last_record_id += 1  # the record's key: the profile documents have no _id
    key = b"\x00profile" + c.last_record_id.to_bytes(8, "big")
    size = len(bson_bytes.encode(doc))
    c.records[key] = doc
    c.secondary.clear()  # index tables rebuilt when read (index_table.py)
    c.capped_sizes[key] = (doc, size)
    total = sum(s for _, s in c.capped_sizes.values())
    while total > PROFILE_SIZE and len(c.records) > 1:
        oldest = next(iter(c.records))
        del c.records[oldest]
        total -= c.capped_sizes.pop(oldest, (None, 0))[1]
