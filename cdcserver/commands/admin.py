"""Administrative commands, answered as a single-node replica-set primary (mongod 8.0) does:
the ones drivers' and tools' test harnesses and mongosh call (getCmdLineOpts, getParameter,
replSetGetStatus, serverStatus, hostInfo, listCommands, explain, validate, profile, dbStats,
collStats, usersInfo, currentOp) and the `$currentOp` / `$collStats` aggregation sources.

This module has its own table, `TABLE`, taken into the modes' tables (commands/tables.py
`OWN`, in each mode's table in cdcserver/deployments/). It imports no other command module;
the commands it runs on behalf of another (explain) are looked up in the server's table
(`server.commands`).
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.auth import SYSTEM_USER, User, true_value
from cdcserver.commands import crud_common, idle_ops, oplog_find, profiler, search
from cdcserver.commands.arguments import is_number, is_string, safe_long
from cdcserver.commands.failpoints import FailPoints
from cdcserver.commands.fcv import fcv_document
from cdcserver.commands.write_parsing import GENERIC_ARGUMENTS
from cdcserver.config import unix_socket_mode
from cdcserver.context import ConnectionState, Handler, Route, ServerState
from cdcserver.cursors import ChangeStreamCursor
from cdcserver.embedded import engine, index_table, query
from cdcserver.embedded.catalog import Collection
from cdcserver.embedded.store import Store
from cdcserver.materialize.protocol import insert_section, status_section
from cdcserver.sources.base import EntryList
from cdcserver.sources.mongo import UpstreamOplog
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.value_string import type_name, value_string

GIT_VERSION = "cdcserver"
# The electionId of a primary that won term 1.
ELECTION_ID = ObjectId("7fffffff0000000000000001")
_REPLICA_SET_ID = ObjectId("000000000000000000000001")

TABLE: dict[str, Handler] = {}


def _command(*names: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            TABLE[name] = handler
        return handler

    return register


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _admin_only(name: str, db: str) -> None:
    if db != "admin":
        raise MongoError(13, f"{name} may only be run against the admin database.")


def _store(server: ServerState) -> Store | None:
    return server.store


# -- counters (serverStatus opcounters / metrics) and the operations in progress (currentOp) --


# 9.0's option counters, in serverStatus's (name) order: a flag counts when true, a resume
# option when the client gave it, an enumerated option per value other than the default.
_OPTION_COUNTERS = (
    "fullDocument.required", "fullDocument.updateLookup", "fullDocument.whenAvailable",
    "fullDocumentBeforeChange.required", "fullDocumentBeforeChange.whenAvailable",
    "ignoreRemovedShards", "matchCollectionUUIDForUpdateLookup", "resumeAfter",
    "showExpandedEvents", "showMigrationEvents", "showRawUpdateDescription", "showSystemEvents",
    "startAfter", "startAtOperationTime",
)
_SCOPE_COUNTER = {"cluster": "cluster", "database": "db", "collection": "collection"}


class Counters:
    """What serverStatus reports about the commands run since start."""

    def __init__(self) -> None:
        self.commands: dict[str, list[int]] = {}  # name -> [failed, total]
        self.opcounters = dict.fromkeys(
            ("insert", "query", "update", "delete", "getmore", "command"), 0
        )
        self.document = dict.fromkeys(("deleted", "inserted", "returned", "updated"), 0)
        self.change_streams = dict.fromkeys(
            ("largeEventsFailed", "largeEventsSplit", "showExpandedEvents"), 0
        )
        # 9.0's metrics.changeStreams.option.* (dotted names) and .scope.*.
        self.change_stream_options = dict.fromkeys(_OPTION_COUNTERS, 0)
        self.change_stream_scopes = dict.fromkeys(("cluster", "collection", "db"), 0)
        self.opids = itertools.count(1)
        self.in_progress: dict[int, tuple[ConnectionState, str, Mapping[str, Any], float]] = {}
        # The logical sessions commands used here ($listLocalSessions): id bytes -> record.
        self.sessions: dict[bytes, dict[str, Any]] = {}


def counters(server: ServerState) -> Counters:
    return server.part(Counters)


def op_started(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], db: str
) -> int:
    """Note a command in progress (for currentOp); returns its opid."""
    table = counters(server)
    opid = next(table.opids)
    table.in_progress[opid] = (conn, db, cmd, time.monotonic())
    lsid = cmd.get("lsid")
    if isinstance(lsid, Mapping) and isinstance(lsid.get("id"), bytes):
        _note_session(table, conn, lsid["id"])
        idle_ops.note_started(server, conn, cmd)  # a transaction's start (currentOp)
    return opid


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# The last millisecond asked for, and its date (one pair: read and replaced together).
_last_ms: list[tuple[int, datetime.datetime]] = [(0, _EPOCH)]


def _now_ms() -> datetime.datetime:
    """Now, to the millisecond (what a BSON date holds); one object per millisecond, since a
    driver's session is used on every getMore (datetime.now + replace: ~3 us each)."""
    ms = time.time_ns() // 1_000_000
    last = _last_ms[0]
    if ms != last[0]:
        last = _last_ms[0] = (ms, _EPOCH + datetime.timedelta(milliseconds=ms))
    return last[1]


_SESSIONS_MAX = 100_000
_SESSION_IDLE = datetime.timedelta(minutes=30)  # localLogicalSessionTimeoutMinutes


def _user_name(conn: ConnectionState) -> str | None:
    users = conn.auth.users if conn.auth is not None else None
    return users[0].full_name if users else None


def _note_session(table: Counters, conn: ConnectionState, session_id: bytes) -> None:
    """Keep the session's record as mongod's logical session cache does: its id, the digest of
    the user who uses it (SHA-256 of "user@db", of nothing without authentication), last use."""
    name = _user_name(conn)
    record = table.sessions.pop(session_id, None)  # re-inserted: the dict stays in use order
    if record is None:
        digest = hashlib.sha256((name or "").encode()).digest()
        record = {"_id": {"id": Binary(session_id, 4), "uid": Binary(digest, 0)}}
        if name is not None:
            record["user"] = {"name": name}
    record["lastUse"] = _now_ms()
    table.sessions[session_id] = record
    while len(table.sessions) > _SESSIONS_MAX:
        table.sessions.pop(next(iter(table.sessions)))


def list_local_sessions_stage(
    server: ServerState, conn: ConnectionState, spec: Any, target: Any
) -> list[dict[str, Any]]:
    """`$listLocalSessions` (`{aggregate: 1}`): the sessions this server has seen used, the
    connection's user's only unless `allUsers` (or `users`) says otherwise."""
    if target != 1:
        raise MongoError(73, "$listLocalSessions must be run against the database with "
                         "{aggregate: 1}, not a collection")
    if not isinstance(spec, Mapping):
        raise MongoError(_FAILED_TO_PARSE, "$listLocalSessions options must be specified in "
                         "an object, but found: " + type_name(spec))
    for key in spec:
        if key not in ("allUsers", "users", "$_internalPredicate"):
            raise MongoError(40415, f"BSON field '$listLocalSessions.{key}' is an unknown "
                             "field.")
    return _listed_sessions(server, conn, spec, "$listLocalSessions")


def _listed_sessions(
    server: ServerState, conn: ConnectionState, spec: Mapping[str, Any], stage: str
) -> list[dict[str, Any]]:
    """listSessionsParseSpec and the sessions it selects: every user's with `allUsers`, those
    of `users`, the connection's user's when neither is given (or `users` is empty). Listing
    others' needs listSessions (cdcserver/auth.py checks it before the command runs)."""
    all_users = spec.get("allUsers", False)
    if not isinstance(all_users, bool):
        raise MongoError(14, f"BSON field '{stage}.allUsers' is the wrong type "
                         f"'{type_name(all_users)}', expected type 'bool'")
    users = spec.get("users")
    if users is not None and not isinstance(users, list):
        raise MongoError(14, f"BSON field '{stage}.users' is the wrong type "
                         f"'{type_name(users)}', expected type 'array'")
    if all_users and users:
        raise MongoError(115, f"{stage} may not specify {{allUsers:true}} and {{users:[...]}} "
                         "at the same time")
    table = counters(server)
    cutoff = _now() - _SESSION_IDLE
    for key in [k for k, r in table.sessions.items() if r["lastUse"] < cutoff]:
        del table.sessions[key]
    records = [dict(r) for r in table.sessions.values()]
    if all_users:
        return records
    if users:
        names = {f"{u.get('user')}@{u.get('db')}" for u in users if isinstance(u, Mapping)}
        # getLogicalSessionUserDigestFor: "" for the empty user (no authentication)
        digests = {hashlib.sha256(("" if n == "@" else n).encode()).digest() for n in names}
    else:  # an implicit request for oneself
        digests = {hashlib.sha256((_user_name(conn) or "").encode()).digest()}
    return [r for r in records if bytes(r["_id"]["uid"]) in digests]


def list_sessions_stage(
    server: ServerState, conn: ConnectionState, spec: Any, db: str, target: Any
) -> list[dict[str, Any]]:
    """`$listSessions` on config.system.sessions: the sessions this server knows, as if its
    session cache had just been refreshed into that collection ({_id, lastUse})."""
    if not isinstance(spec, Mapping):
        raise MongoError(14, "$listSessions options must be specified in an object, but "
                         "found: " + type_name(spec))
    for key in spec:
        if key not in ("allUsers", "users", "$_internalPredicate"):
            raise MongoError(40415, f"BSON field '$listSessions.{key}' is an unknown field.")
    records = _listed_sessions(server, conn, spec, "$listSessions")
    if db != "config" or target != "system.sessions":
        raise MongoError(73, "$listSessions must be run against the 'system.sessions' "
                         "collection in the 'config' database.")
    return [{"_id": r["_id"], "lastUse": r["lastUse"]} for r in records]


def op_finished(
    server: ServerState,
    opid: int,
    name: str,
    cmd: Mapping[str, Any],
    reply: Mapping[str, Any] | None,
    error: MongoError | None,
    change_stream: bool,
) -> None:
    """Count a finished command as mongod's opcounters and metrics do (and profile it)."""
    table = counters(server)
    running = table.in_progress.pop(opid, None)
    if running is not None:
        conn, db, _, started = running
        if server.profile_levels:
            profiler.record(server, conn, db, name, cmd, reply, error,
                            time.monotonic() - started)
        # the cursor it opened or moved, its transaction's time (currentOp's idle ones)
        noted = reply if error is None and not isinstance(reply, RawBSONDocument) else None
        idle_ops.note_finished(server, conn, name, cmd, noted, started)
    # mongod counts the commands it does not know under one name.
    # The names the server's table knows (run_command has set it).
    counts = table.commands.setdefault(
        name if name in server.commands.known else "<UNKNOWN>", [0, 0])
    counts[1] += 1
    if error is not None:
        counts[0] += 1
        if change_stream and error.code == 10334:
            table.change_streams["largeEventsFailed"] += 1
    op = table.opcounters
    if name == "insert":
        docs = cmd.get("documents")
        op["insert"] += len(docs) if isinstance(docs, list) else 0
    elif name in ("update", "delete"):
        stmts = cmd.get(name + "s")
        op[name] += len(stmts) if isinstance(stmts, list) else 0
    elif name == "find":
        op["query"] += 1
    elif name == "getMore":
        op["getmore"] += 1
    else:
        op["command"] += 1
    if reply is None or isinstance(reply, RawBSONDocument):
        return
    doc = table.document
    if name == "insert":
        doc["inserted"] += _int(reply.get("n"))
    elif name == "update":
        doc["updated"] += _int(reply.get("nModified"))
    elif name == "delete":
        doc["deleted"] += _int(reply.get("n"))
    cursor = reply.get("cursor")
    if isinstance(cursor, Mapping):
        batch = cursor.get("firstBatch", cursor.get("nextBatch"))
        if isinstance(batch, list):
            doc["returned"] += len(batch)
            if change_stream:
                _count_change_stream(server, table, name, cmd, cursor, batch)


def _count_change_stream(
    server: ServerState, table: Counters, name: str, cmd: Mapping[str, Any],
    cursor: Mapping[str, Any], batch: list[Any],
) -> None:
    cursor_id = cursor.get("id")  # the cursor table is keyed by int (an Int64 is one)
    live = server.cursors.cursors.get(cursor_id) if isinstance(cursor_id, int) else None
    # A front's merged stream has a pipeline per shard, none of its own: not counted here.
    pipeline = live.pipeline if isinstance(live, ChangeStreamCursor) else None
    if name == "aggregate" and pipeline is not None:
        _count_stream_options(server, table, pipeline.spec)
    if pipeline is None or pipeline.split is None:
        return
    for event in batch:  # only streams with $changeStreamSplitLargeEvent look
        split = event.get("splitEvent") if isinstance(event, Mapping) else None
        if isinstance(split, Mapping) and split.get("fragment") == 1:
            table.change_streams["largeEventsSplit"] += 1


def _count_stream_options(server: ServerState, table: Counters, spec: ChangeStreamSpec) -> None:
    """A stream opened: 8.0 counts showExpandedEvents; 9.0 each option and the scope."""
    if not server.release.change_stream_option_metrics:
        if spec.show_expanded_events:
            table.change_streams["showExpandedEvents"] += 1
        return
    options = table.change_stream_options
    flags = {
        "ignoreRemovedShards": spec.ignore_removed_shards,
        "matchCollectionUUIDForUpdateLookup": spec.match_collection_uuid_for_update_lookup,
        "showExpandedEvents": spec.show_expanded_events,
        "showMigrationEvents": spec.show_migration_events,
        "showRawUpdateDescription": spec.show_raw_update_description,
        "showSystemEvents": spec.show_system_events,
    }
    for flag, on in flags.items():
        options[flag] += bool(on)
    for given in ("resumeAfter", "startAfter", "startAtOperationTime"):
        options[given] += given in spec.given_options
    if spec.full_document != "default":
        options["fullDocument." + spec.full_document] += 1
    if spec.full_document_before_change != "off":
        options["fullDocumentBeforeChange." + spec.full_document_before_change] += 1
    table.change_stream_scopes[_SCOPE_COUNTER[spec.scope]] += 1


def _change_streams_section(server: ServerState, table: Counters) -> dict[str, Any]:
    """serverStatus.metrics.changeStreams as the release reports it (names in order)."""
    if not server.release.change_stream_option_metrics:
        return _longs(table.change_streams)
    option: dict[str, Any] = {}
    for dotted, count in table.change_stream_options.items():
        head, _, tail = dotted.partition(".")
        if tail:
            option.setdefault(head, {})[tail] = Int64(count)
        else:
            option[head] = Int64(count)
    return {
        "largeEventsFailed": Int64(table.change_streams["largeEventsFailed"]),
        "largeEventsSplit": Int64(table.change_streams["largeEventsSplit"]),
        "option": option,
        "scope": _longs(table.change_stream_scopes),
    }


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


# -- getCmdLineOpts / getParameter ------------------------------------------------------------


def parsed_options(server: ServerState) -> dict[str, Any]:
    """The server's settings in mongod's option names (its `parsed`, keys in order)."""
    config = server.config
    parsed: dict[str, Any] = {}
    net: dict[str, Any] = {"bindIp": server.host, "port": server.port}
    if config is not None and config.tls.enabled:
        tls: dict[str, Any] = {"certificateKeyFile": config.tls.certificate_file}
        if config.tls.ca_file:
            tls["CAFile"] = config.tls.ca_file
            if not config.tls.require_client_certificate:
                tls["allowConnectionsWithoutCertificates"] = True
        tls["mode"] = "requireTLS"
        net["tls"] = tls
    if config is not None:
        # Like mongod's, only what differs from the default (mongod lists the options given).
        sv = config.server
        unix: dict[str, Any] = {}
        if not sv.unix_socket:
            unix["enabled"] = False
        if sv.unix_socket_permissions != "0700":
            unix["filePermissions"] = unix_socket_mode(sv.unix_socket_permissions)
        if sv.unix_socket_prefix != "/tmp":
            unix["pathPrefix"] = sv.unix_socket_prefix
        if unix:
            net["unixDomainSocket"] = unix
    parsed["net"] = net
    parsed["replication"] = {"replSetName": server.set_name}
    auth_on = server.auth is not None and server.auth.enabled
    if auth_on:
        parsed["security"] = {"authorization": "enabled"}
    if test_commands_enabled(server):
        parsed["setParameter"] = {"enableTestCommands": "1"}
    store = _store(server)
    if store is not None:
        if config is not None and not config.store.in_memory:
            parsed["storage"] = {"dbPath": config.store.data_dir}
        elif store.data_dir is not None:
            parsed["storage"] = {"dbPath": store.data_dir}
        else:
            parsed["storage"] = {"engine": "inMemory"}
    if config is not None:
        parsed["systemLog"] = {"verbosity": 1 if config.log.level == "debug" else 0}
    return parsed


def test_commands_enabled(server: ServerState) -> bool:
    points = server.part_if_made(FailPoints)
    return points is None or bool(points.enabled)  # made enabled on first use


@_command("getCmdLineOpts")
async def get_cmd_line_opts(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("getCmdLineOpts", db)
    argv = list(server.argv) or ["cdcserver", "serve"]
    return {"argv": argv, "parsed": parsed_options(server)}


def server_parameters(server: ServerState) -> dict[str, Any]:
    """The parameters cdcserver has, by mongod's names and types (getParameter)."""
    store = _store(server)
    auth = server.auth
    mechanisms = list(auth.registry.mechanisms) if auth is not None else [
        "SCRAM-SHA-1", "SCRAM-SHA-256"]
    params: dict[str, Any] = {
        "authenticationMechanisms": sorted(mechanisms),
        "cursorTimeoutMillis": Int64(int(server.cursors.idle_timeout_s * 1000)),
        "enableTestCommands": test_commands_enabled(server),
        "featureCompatibilityVersion": fcv_document(server),
        "localLogicalSessionTimeoutMinutes": 30,
        "logicalSessionRefreshMillis": 300000,
        "maxBSONDepth": 200,
        "requireApiVersion": False,
        "tlsMode": "requireTLS" if (
            server.config is not None and server.config.tls.enabled) else "disabled",
    }
    params.update(server.part(SetParameters).values)  # set at runtime (setParameter)
    if store is not None:
        lifetime = store.transaction_lifetime_limit_seconds
        params["transactionLifetimeLimitSeconds"] = int(lifetime) if lifetime > 0 else 2**31 - 1
        params["ttlMonitorEnabled"] = store.ttl_monitor_enabled
        params["ttlMonitorSleepSecs"] = int(store.ttl_monitor_sleep_secs)
    return dict(sorted(params.items()))  # mongod walks its parameter map in name order


_SETTABLE_AT_RUNTIME = frozenset(
    {"cursorTimeoutMillis", "transactionLifetimeLimitSeconds", "ttlMonitorEnabled",
     "ttlMonitorSleepSecs", "requireApiVersion", "tlsMode"}
)


@_command("getParameter")
async def get_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("getParameter", db)
    arg = cmd.get("getParameter")
    want_all = arg == "*"
    show_details = False
    if isinstance(arg, Mapping):
        for key in arg:
            if key not in ("allParameters", "showDetails", "setAt",
                           "forIncrementalFeatureRollout"):
                raise MongoError(40415, f"BSON field 'getParameter.{key}' is an unknown field.")
        want_all = arg.get("allParameters") is True
        show_details = arg.get("showDetails") is True
    reply: dict[str, Any] = {}
    for name, value in server_parameters(server).items():
        if not want_all and name not in cmd:
            continue
        if show_details:
            reply[name] = {"value": value, "settableAtRuntime": name in _SETTABLE_AT_RUNTIME,
                           "settableAtStartup": True}
        else:
            reply[name] = value
    if not reply:
        raise MongoError(72, "no option found to get")
    return reply


_SET_HELP = ", use help:true to see options "


def _element(name: str, value: Any) -> str:
    """A BSON element as mongod prints it (`name: value`)."""
    return f"{name}: {value_string(value)}"


def _coerced_long(name: str, value: Any, least: int) -> int:
    """An IDL long / int server parameter's new value (BSONElement::coerce, then its `gte`)."""
    if not is_number(value):
        raise MongoError(2, f"Invalid value for parameter {name}: {_element(name, value)}")
    n = safe_long(value)
    if n < least:
        raise MongoError(2, f"Invalid value for parameter {name}: {n} is not greater than or "
                         f"equal to {least}")
    return n


def _set_server_parameter(server: ServerState, name: str, value: Any) -> None:
    """Set one runtime-settable parameter (parameters.cpp CmdSet's ServerParameter::set)."""
    store = _store(server)
    if name == "cursorTimeoutMillis":
        server.cursors.idle_timeout_s = _coerced_long(name, value, 0) / 1000
    elif name == "transactionLifetimeLimitSeconds" and store is not None:
        store.transaction_lifetime_limit_seconds = _coerced_long(name, value, 1)
    elif name == "ttlMonitorSleepSecs" and store is not None:
        store.ttl_monitor_sleep_secs = _coerced_long(name, value, 1)
    elif name == "ttlMonitorEnabled" and store is not None:
        store.ttl_monitor_enabled = _truth(value)  # the monitor reads it before each pass
    elif name == "tlsMode":
        current = server_parameters(server)["tlsMode"]
        if not is_string(value):
            raise MongoError(14, "Value for parameter tlsMode must be of type 'string'")
        if value != current:
            raise MongoError(2, f"Illegal state transition for tlsMode, attempt to change from "
                             f"{current} to {value}")
    else:  # a bool (BSONElement::coerce<bool>: any value, its truth)
        server.part(SetParameters).values[name] = _truth(value)


def _truth(value: Any) -> bool:
    """BSONElement::trueValue."""
    if value is None or value is False:
        return False
    if is_number(value):
        return bool(value)
    return True


class SetParameters:
    """The parameters set at runtime that no other part of the server keeps (by name)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}


@_command("setParameter")
async def set_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """parameters.cpp CmdSet: every name checked (72 unknown, 20 not settable at runtime)
    before any is set; they are set in name order, `was` the first one's old value."""
    _admin_only("setParameter", db)
    known = server_parameters(server)
    wanted: dict[str, Any] = {}
    for name, value in itertools.islice(cmd.items(), 1, None):
        if name in GENERIC_ARGUMENTS:
            continue
        if name not in known:
            raise MongoError(72, f"attempted to set unrecognized parameter [{name}]{_SET_HELP}")
        if name not in _SETTABLE_AT_RUNTIME or (
                name in ("transactionLifetimeLimitSeconds", "ttlMonitorEnabled",
                         "ttlMonitorSleepSecs") and _store(server) is None):
            raise MongoError(20, f"not allowed to change [{name}] at runtime")
        wanted[name] = value
    reply: dict[str, Any] = {}
    for name in sorted(wanted):  # a std::map
        if not reply:
            reply["was"] = known[name]
        _set_server_parameter(server, name, wanted[name])
    if not reply:
        raise MongoError(72, f"no option found to set{_SET_HELP}")
    return reply


# -- the replica set ----------------------------------------------------------------------------


def _op_time(server: ServerState) -> tuple[dict[str, Any], datetime.datetime]:
    ts = server.oplog.cluster_time()
    when = datetime.datetime.fromtimestamp(ts.time, datetime.UTC) if ts.time else server.started
    return {"ts": ts, "t": Int64(1)}, when


def _election(server: ServerState) -> tuple[Timestamp, datetime.datetime]:
    started = server.started.replace(microsecond=0)
    return Timestamp(int(started.timestamp()), 1), started


@_command("replSetGetStatus")
async def repl_set_get_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("replSetGetStatus", db)
    now = _now()
    op_time, wall = _op_time(server)
    election_ts, election_date = _election(server)
    uptime = int((now - server.started).total_seconds())
    member = {
        "_id": 0,
        "name": server.me,
        "health": 1.0,
        "state": 1,
        "stateStr": "PRIMARY",
        "uptime": uptime,
        "optime": op_time,
        "optimeDate": wall,
        "lastAppliedWallTime": wall,
        "lastDurableWallTime": wall,
        "syncSourceHost": "",
        "syncSourceId": -1,
        "infoMessage": "",
        "electionTime": election_ts,
        "electionDate": election_date,
        "configVersion": 1,
        "configTerm": 1,
        "self": True,
        "lastHeartbeatMessage": "",
    }
    return {
        "set": server.set_name,
        "date": now,
        "myState": 1,
        "term": Int64(1),
        "syncSourceHost": "",
        "syncSourceId": -1,
        "heartbeatIntervalMillis": Int64(2000),
        "majorityVoteCount": 1,
        "writeMajorityCount": 1,
        "votingMembersCount": 1,
        "writableVotingMembersCount": 1,
        "optimes": {
            "lastCommittedOpTime": op_time,
            "lastCommittedWallTime": wall,
            "readConcernMajorityOpTime": op_time,
            "appliedOpTime": op_time,
            "durableOpTime": op_time,
            "lastAppliedWallTime": wall,
            "lastDurableWallTime": wall,
        },
        "lastStableRecoveryTimestamp": op_time["ts"],
        "electionCandidateMetrics": {
            "lastElectionReason": "electionTimeout",
            "lastElectionDate": election_date,
            "electionTerm": Int64(1),
            "lastCommittedOpTimeAtElection": {"ts": Timestamp(0, 0), "t": Int64(-1)},
            "lastSeenOpTimeAtElection": {"ts": election_ts, "t": Int64(-1)},
            "numVotesNeeded": 1,
            "priorityAtElection": 1.0,
            "electionTimeoutMillis": Int64(10000),
            "newTermStartDate": election_date,
            "wMajorityWriteAvailabilityDate": election_date,
        },
        "members": [member],
    }


@_command("replSetGetConfig")
async def repl_set_get_config(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("replSetGetConfig", db)
    return {
        "config": {
            "_id": server.set_name,
            "version": 1,
            "term": 1,
            "members": [{
                "_id": 0, "host": server.me, "arbiterOnly": False, "buildIndexes": True,
                "hidden": False, "priority": 1.0, "tags": {},
                "secondaryDelaySecs": Int64(0), "votes": 1,
            }],
            "protocolVersion": Int64(1),
            "writeConcernMajorityJournalDefault": True,
            "settings": {
                "chainingAllowed": True,
                "heartbeatIntervalMillis": 2000,
                "heartbeatTimeoutSecs": 10,
                "electionTimeoutMillis": 10000,
                "catchUpTimeoutMillis": -1,
                "catchUpTakeoverDelayMillis": 30000,
                "getLastErrorModes": {},
                "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
                "replicaSetId": _REPLICA_SET_ID,
            },
        }
    }


# -- serverStatus / hostInfo --------------------------------------------------------------------


def _longs(values: Mapping[str, int]) -> dict[str, Int64]:
    return {k: Int64(v) for k, v in values.items()}


@_command("serverStatus")
async def server_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    now = _now()
    table = counters(server)
    latest = server.oplog.latest_ts()
    lag = max(0.0, now.timestamp() - latest.time) if latest is not None else None
    uptime = (now - server.started).total_seconds()
    op_time, wall = _op_time(server)
    election_ts, _ = _election(server)
    open_cursors = server.cursors.held()  # every kind but the upstream's (forwarded)
    commands = {
        name: {"failed": Int64(counts[0]), "total": Int64(counts[1])}
        for name, counts in sorted(table.commands.items())
    }
    reply: dict[str, Any] = {
        "host": _pretty_host(server),
        "version": server.release.version,
        "process": "mongod",
        "pid": Int64(server.pid),
        "uptime": float(int(uptime)),
        "uptimeMillis": Int64(int(uptime * 1000)),
        "uptimeEstimate": Int64(int(uptime)),
        "localTime": now,
        # The sections, in name order as mongod's section registry (a sorted map) lists them.
        "asserts": _longs(dict.fromkeys(("regular", "warning", "msg", "user", "tripwire",
                                          "rollovers"), 0)),
        "cdcserver": {
            "cursors": len(server.cursors.cursors),
            "eventsDelivered": Int64(server.events_delivered),
            "oplogLatest": latest,
            "lagSeconds": lag,
            "python": sys.version.split()[0],
            **_upstream_status(server),
        },
        "connections": {
            "current": server.connections,
            "available": max(0, 10_000 - server.connections),
            "totalCreated": server.total_connections,
            "active": len({id(c) for c, *_ in table.in_progress.values()}),
        },
        "featureCompatibilityVersion": fcv_document(server),
        "metrics": {
            "changeStreams": _change_streams_section(server, table),
            "commands": commands,
            "cursor": {"open": {"noTimeout": Int64(0), "pinned": Int64(0),
                                "total": Int64(open_cursors)}},
            "document": _longs(table.document),
        },
        "opcounters": _longs(table.opcounters),
        "opcountersRepl": _longs(dict.fromkeys(
            ("insert", "query", "update", "delete", "getmore", "command"), 0)),
        "repl": {
            "topologyVersion": {"processId": server.process_id, "counter": Int64(0)},
            "hosts": [server.me],
            "setName": server.set_name,
            "setVersion": 1,
            "isWritablePrimary": True,
            "secondary": False,
            "primary": server.me,
            "me": server.me,
            "electionId": ELECTION_ID,
            "lastWrite": {"opTime": op_time, "lastWriteDate": wall,
                          "majorityOpTime": op_time, "majorityWriteDate": wall},
            "rbid": 1,
        },
        "storageEngine": {
            "name": "inMemory" if _in_memory(server) else "wiredTiger",
            "supportsCommittedReads": True,
            "oldestRequiredTimestampForCrashRecovery": election_ts,
            "supportsPendingDrops": True,
            "dropPendingIdents": Int64(0),
            "supportsSnapshotReadConcern": True,
            "readOnly": False,
            "persistent": not _in_memory(server),
            "backupCursorOpen": False,
        },
    }
    copy = server.oplog.images.copy if isinstance(server.oplog, UpstreamOplog) else None
    if copy is not None:  # a sidecar's materialized copy (cdcserver/materialize/)
        reply = insert_section(reply, "materialized", status_section(copy.status()))
    # {serverStatus: 1, repl: 0, ...}: a section given as 0 / false is left out.
    for key, value in cmd.items():
        if key in reply and key not in ("host", "version", "process", "pid", "uptime",
                                         "uptimeMillis", "uptimeEstimate", "localTime"):
            if value in (0, False) and not isinstance(value, str):
                del reply[key]
    return reply


def _pretty_host(server: ServerState) -> str:
    """mongod's prettyHostName: the host name, with the port unless it is 27017."""
    name = socket.gethostname()
    return name if server.port == 27017 else f"{name}:{server.port}"


def _upstream_status(server: ServerState) -> dict[str, Any]:
    if isinstance(server.oplog, UpstreamOplog):  # a live upstream's tail
        return {"upstream": server.oplog.status()}
    return {}


def _in_memory(server: ServerState) -> bool:
    store = _store(server)
    return store is not None and store.data_dir is None


def _meminfo_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


@_command("hostInfo")
async def host_info(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    mem = _meminfo_mb()
    cores = os.cpu_count() or 1
    uname = platform.uname()
    return {
        "system": {
            "currentTime": _now(),
            "hostname": socket.gethostname(),
            "cpuAddrSize": 64 if sys.maxsize > 2**32 else 32,
            "memSizeMB": Int64(mem),
            "memLimitMB": Int64(mem),
            "numCores": cores,
            "numCoresAvailableToProcess": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else cores,
            "numPhysicalCores": cores,
            "numCpuSockets": 1,
            "cpuArch": uname.machine,
            "numaEnabled": False,
            "numNumaNodes": 1,
        },
        "os": {"type": uname.system, "name": platform.platform(), "version": uname.release},
        "extra": {
            "versionString": f"{uname.system} version {uname.release} {uname.version}",
            "libcVersion": "-".join(platform.libc_ver()) or "",
            "kernelVersion": uname.release,
            "pageSize": Int64(os.sysconf("SC_PAGE_SIZE")) if hasattr(os, "sysconf") else 4096,
            "numPages": int(os.sysconf("SC_PHYS_PAGES")) if hasattr(os, "sysconf") else 0,
            "maxOpenFiles": int(os.sysconf("SC_OPEN_MAX")) if hasattr(os, "sysconf") else 0,
        },
    }


# -- listCommands -------------------------------------------------------------------------------

_NO_AUTH = frozenset(
    {"hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate", "logout",
     "ping", "buildInfo", "buildinfo", "connectionStatus", "listCommands", "getnonce"}
)
_ADMIN_ONLY = frozenset(
    {"getCmdLineOpts", "getParameter", "replSetGetStatus", "replSetGetConfig", "currentOp",
     "configureFailPoint", "renameCollection", "killAllSessions", "setParameter"}
)
# The commands of MongoDB's Stable API version 1 (by their canonical names).
_API_V1 = frozenset(
    {"abortTransaction", "aggregate", "authenticate", "bulkWrite", "collMod", "collStats",
     "commitTransaction", "count", "create", "createIndexes", "createRole",
     "createSearchIndexes", "createUser", "delete", "drop", "dropDatabase", "dropIndexes",
     "dropRole", "dropSearchIndex", "dropUser", "endSessions", "explain", "find",
     "findAndModify", "getMore", "grantPrivilegesToRole", "grantRolesToRole",
     "grantRolesToUser", "hello", "insert", "killCursors", "listCollections", "listDatabases",
     "listIndexes", "ping", "refreshSessions", "renameCollection", "revokePrivilegesFromRole",
     "revokeRolesFromRole", "revokeRolesFromUser", "saslContinue", "saslStart", "update",
     "updateRole", "updateSearchIndex", "updateUser"}
)
# The aggregation stages of Stable API version 1.
_API_V1_STAGES = frozenset(
    {"$addFields", "$bucket", "$bucketAuto", "$changeStream", "$collStats", "$count",
     "$densify", "$documents", "$facet", "$fill", "$geoNear", "$graphLookup", "$group",
     "$indexStats", "$limit", "$lookup", "$match", "$merge", "$out", "$project", "$redact",
     "$replaceRoot", "$replaceWith", "$sample", "$set", "$setWindowFields", "$skip", "$sort",
     "$sortByCount", "$unionWith", "$unset", "$unwind"}
)
# Alias -> the name mongod reports the command by.
_CANONICAL = {"findandmodify": "findAndModify", "ismaster": "isMaster", "buildinfo": "buildInfo",
              "deleteIndexes": "dropIndexes", "dbstats": "dbStats", "collstats": "collStats"}


def check_api_parameters(name: str, cmd: Mapping[str, Any]) -> None:
    """The Stable API parameters of a command, checked as mongod's validateAPIParameters
    does: apiStrict / apiDeprecationErrors need apiVersion, the version must be "1", and with
    apiStrict the command (and an aggregate's stages) must be in API version 1."""
    version = cmd.get("apiVersion")
    strict = cmd.get("apiStrict")
    deprecation = cmd.get("apiDeprecationErrors")
    if version is None and strict is None and deprecation is None:
        return
    for field, value, want in (("apiVersion", version, "string"), ("apiStrict", strict, "bool"),
                               ("apiDeprecationErrors", deprecation, "bool")):
        ok = isinstance(value, str) if want == "string" else isinstance(value, bool)
        if value is not None and not ok:
            raise MongoError(14, f"BSON field '{field}' is the wrong type "
                             f"'{type_name(value)}', expected type '{want}'")
    if (strict is not None or deprecation is not None) and version is None:
        raise MongoError(4886600, "Provided apiStrict and/or apiDeprecationErrors without "
                         "passing apiVersion")
    if version is not None and version != "1":
        raise MongoError(322, 'API version must be "1"')
    if strict:
        canonical = _CANONICAL.get(name, name)
        if canonical not in _API_V1:
            raise MongoError(
                323, f"Provided apiStrict:true, but the command {canonical} is not in API "
                "Version 1. Information on supported commands and migrations in API Version 1 "
                "can be found at https://dochub.mongodb.org/core/manual-versioned-api.")
        pipeline = cmd.get("pipeline") if canonical == "aggregate" else None
        for stage in pipeline if isinstance(pipeline, list) else []:
            stage_name = next(iter(stage), "") if isinstance(stage, Mapping) else ""
            if stage_name.startswith("$") and stage_name not in _API_V1_STAGES:
                raise MongoError(323, f"{stage_name} is not allowed with 'apiStrict: true' "
                                 "in API Version 1")


# initialize_api_parameters.cpp enforceRequireAPIVersion
API_VERSION_REQUIRED = 498870
_API_VERSION_REQUIRED_TEXT = (
    "The apiVersion parameter is required, please configure your MongoClient's API version"
)
_HELLO_NAMES = frozenset({"hello", "isMaster", "ismaster"})


def check_api_version_required(server: ServerState, conn: ConnectionState, name: str,
                               cmd: Mapping[str, Any]) -> None:
    """With `requireApiVersion: true`, 498870 for a command sent without apiVersion, as
    mongod's enforceRequireAPIVersion (once the API parameters and the transaction state are
    set): a getMore has its cursor's parameters and a command that continues a transaction
    the transaction's (jstests/noPassthrough/require_api_version.js); an internal client
    (the front's connection to its shard, authenticated as __system; `hello` with
    `internalClient`) is not checked."""
    params = server.part_if_made(SetParameters)
    if params is None or not params.values.get("requireApiVersion"):
        return
    if cmd.get("apiVersion") is not None or name == "getMore":
        return
    if conn.internal_client or (conn.auth is not None and SYSTEM_USER in conn.auth.users):
        return
    if cmd.get("autocommit") is False and cmd.get("startTransaction") is not True:
        return
    if name in _HELLO_NAMES and _truth(cmd.get("internalClient")):
        return
    raise MongoError(API_VERSION_REQUIRED, _API_VERSION_REQUIRED_TEXT)


@_command("listCommands")
async def list_commands(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    names = sorted(server.commands)  # the server's mode's table (cdcserver/deployments/)
    commands = {}
    for name in names:
        commands[name] = {
            "help": "",
            "requiresAuth": name not in _NO_AUTH,
            "secondaryOk": True,
            "adminOnly": name in _ADMIN_ONLY,
            "apiVersions": ["1"] if _CANONICAL.get(name, name) in _API_V1 else [],
            "deprecatedApiVersions": [],
        }
    return {"commands": commands}


_FAILED_TO_PARSE = 9

# -- currentOp / $currentOp ----------------------------------------------------------------------


def _client_metadata(conn: ConnectionState) -> dict[str, Any] | None:
    return dict(conn.client_metadata) if conn.client_metadata else None


def current_ops(
    server: ServerState, conn: ConnectionState, for_agg: bool, all_users: bool = True
) -> list[dict[str, Any]]:
    """The commands in progress, one document each, as mongod's currentOp shows an op; without
    `all_users` (and with authentication on) only those of clients authenticated as the
    connection's user (isCoauthorizedWithClient)."""
    table = counters(server)
    now = time.monotonic()
    wall = _now()
    host = _pretty_host(server)
    mine = None if all_users or not idle_ops.auth_on(server) else (_user_name(conn) or "")
    ops = []
    for opid, (op_conn, db, cmd, started) in list(table.in_progress.items()):
        if mine is not None and _user_name(op_conn) != mine:
            continue
        name = next(iter(cmd), "")
        running = max(0.0, now - started)
        doc: dict[str, Any] = {"type": "op", "host": host, "desc": f"conn{op_conn.id}",
                               "connectionId": op_conn.id, "client": op_conn.peer}
        metadata = _client_metadata(op_conn)
        if metadata is not None:
            doc["clientMetadata"] = metadata
        doc["active"] = True
        doc["currentOpTime"] = wall.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        users = op_conn.auth.users if op_conn.auth is not None else []
        doc["effectiveUsers"] = [{"user": u.name, "db": u.db} for u in users]
        doc["threaded"] = True
        doc["opid"] = opid
        if isinstance(cmd.get("lsid"), Mapping):
            doc["lsid"] = dict(cmd["lsid"])
        doc["secs_running"] = Int64(int(running))
        doc["microsecs_running"] = Int64(int(running * 1_000_000))
        doc["op"] = _op_kind(name)
        target = cmd.get(name)
        doc["ns"] = f"{db}.{target}" if isinstance(target, str) else f"{db}.$cmd"
        doc["redacted"] = False
        doc["command"] = {k: v for k, v in cmd.items()}
        doc["numYields"] = 0
        doc["locks"] = {}
        doc["waitingForLock"] = False
        doc["lockStats"] = {}
        doc["waitingForFlowControl"] = False
        doc["flowControlStats"] = {}
        ops.append(doc)
    return ops


def _op_kind(name: str) -> str:
    return {"find": "query", "getMore": "getmore", "insert": "insert", "update": "update",
            "delete": "remove"}.get(name, "command")


# Fields of a currentOp command that are options, not filters on the ops.
_CURRENT_OP_OPTIONS = frozenset({"currentOp", "$all", "$ownOps", "$db", "lsid", "$clusterTime",
                                 "$readPreference", "comment", "apiVersion", "apiStrict",
                                 "apiDeprecationErrors", "maxTimeMS"})


@_command("currentOp")
async def current_op(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    _admin_only("currentOp", db)
    filters = {k: v for k, v in cmd.items() if k not in _CURRENT_OP_OPTIONS}
    # the command's $currentOp: allUsers unless $ownOps, idleSessions on, idleCursors off
    all_users = not true_value(cmd.get("$ownOps"))
    ops = current_ops(server, conn, for_agg=False, all_users=all_users)
    ops.extend(_idle_sessions(server, conn, all_users=all_users))
    if filters:
        ops = [op for op in ops if engine.matches(filters, op)]
    return {"inprog": ops}


def current_op_stage(server: ServerState, conn: ConnectionState, spec: Any, db: str,
                     target: Any) -> list[dict[str, Any]]:
    """The documents `$currentOp` (first stage of `{aggregate: 1}` on admin) produces.

    Checked in mongod's order: its lite parse (14 TypeMismatch for a spec that is no object
    and for a non-bool allUsers / localOps, before the namespace), then createFromBson (73 for
    the namespace, 9 FailedToParse for the other options)."""
    if not isinstance(spec, Mapping):
        raise MongoError(14, "$currentOp options must be specified in an object, but found: "
                         + type_name(spec))
    for key in ("allUsers", "localOps"):
        if key in spec and not isinstance(spec[key], bool):
            raise MongoError(14, f"The '{key}' parameter of the $currentOp stage must be a "
                             f"boolean value, but found: {type_name(spec[key])}")
    if db != "admin" or target != 1:
        raise MongoError(73, "$currentOp must be run against the 'admin' database with "
                         "{aggregate: 1}")
    for key, value in spec.items():
        if key not in ("allUsers", "idleConnections", "idleCursors", "idleSessions",
                       "localOps", "backtrace", "truncateOps", "targetAllNodes"):
            raise MongoError(_FAILED_TO_PARSE,
                             f"Unrecognized option '{key}' in $currentOp stage.")
        if not isinstance(value, bool):
            raise MongoError(_FAILED_TO_PARSE,
                             f"The '{key}' parameter of the $currentOp stage must be a boolean "
                             f"value, but found: {type_name(value)}")
    all_users = spec.get("allUsers") is True
    ops = current_ops(server, conn, for_agg=True, all_users=all_users)
    # mongod's order: the clients' operations, the idle cursors, then the idle sessions
    if spec.get("idleCursors") is True:
        ops.extend(idle_ops.idle_cursors(server, _pretty_host(server), conn, all_users))
    if spec.get("idleSessions", True) is True:
        ops.extend(_idle_sessions(server, conn, all_users))
    return ops


def _idle_sessions(
    server: ServerState, conn: ConnectionState, all_users: bool
) -> list[dict[str, Any]]:
    running = [
        bytes(cmd["lsid"]["id"]) for _, _, cmd, _ in list(counters(server).in_progress.values())
        if isinstance(cmd.get("lsid"), Mapping) and isinstance(cmd["lsid"].get("id"), bytes)
    ]
    return idle_ops.idle_sessions(server, _pretty_host(server), conn, all_users, running)


# -- usersInfo ------------------------------------------------------------------------------------


def _user_doc(user: User, mechanisms: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": f"{user.db}.{user.name}",
        "userId": Binary(_user_uuid(user), 4),
        "user": user.name,
        "db": user.db,
        "roles": [{"role": r, "db": d} for r, d in user.roles],
    }
    if mechanisms:
        doc["mechanisms"] = sorted(user.credentials)
    return doc


def _user_uuid(user: User) -> bytes:
    return hashlib.md5(f"{user.db}.{user.name}".encode()).digest()  # stable per user


@_command("usersInfo")
async def users_info(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    arg = cmd.get("usersInfo")
    users = list(server.auth.registry.users.values()) if server.auth is not None else []
    wanted: list[tuple[str, str]] | None
    if isinstance(arg, Mapping) and arg.get("forAllDBs") is True:
        wanted = None
    elif isinstance(arg, (int, float)) and not isinstance(arg, bool) and arg == 1:
        users = [u for u in users if u.db == db]
        wanted = None
    else:
        items = arg if isinstance(arg, list) else [arg]
        wanted = []
        for item in items:
            if isinstance(item, str):
                wanted.append((item, db))
            elif isinstance(item, Mapping) and isinstance(item.get("user"), str) and \
                    isinstance(item.get("db"), str):
                wanted.append((item["user"], item["db"]))
            else:
                raise MongoError(2, "User name must be either a string or an object with "
                                 "'user' and 'db' fields")
    if wanted is not None:
        by_key = {(u.name, u.db): u for u in users}
        users = [by_key[k] for k in wanted if k in by_key]
    else:
        users.sort(key=lambda u: (u.db, u.name))
    return {"users": [_user_doc(u, True) for u in users]}


# -- profile -------------------------------------------------------------------------------------


@_command("profile")
async def profile(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The profiling level of a database and the slow-operation threshold. The threshold is
    the server's (it is what "Slow query" log lines use, as mongod's slowms); levels 1 and 2
    write `system.profile` documents (profiler.py)."""
    levels, sample = server.profile_levels, server.profile_sample_rates
    level = cmd.get("profile")
    if isinstance(level, bool) or not isinstance(level, (int, float)):
        raise MongoError(14, f"BSON field 'profile.profile' is the wrong type "
                         f"'{type_name(level)}', expected types '[long, int, decimal, double]'")
    previous = {"was": levels.get(db, 0), "slowms": int(server.slow_s * 1000),
                "sampleRate": sample.get(db, 1.0)}
    level = int(level)
    if level not in (-1, 0, 1, 2):
        raise MongoError(2, f"Profiling level must be in the range [-1, 2]. Got {level}")
    slowms = cmd.get("slowms")
    if slowms is not None:
        if isinstance(slowms, bool) or not isinstance(slowms, (int, float)):
            raise MongoError(14, "BSON field 'profile.slowms' is the wrong type "
                             f"'{type_name(slowms)}', expected types '[long, int, decimal, "
                             "double]'")
        server.slow_s = int(slowms) / 1000
    rate = cmd.get("sampleRate")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise MongoError(2, "'sampleRate' must be between 0.0 and 1.0 inclusive")
        sample[db] = float(rate)
    if level != -1:
        levels[db] = level
    return previous


# -- storage statistics: dbStats, collStats, $collStats, validate ------------------------------


def _scale(cmd: Mapping[str, Any], field: str = "scale") -> int:
    scale = cmd.get(field, 1)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise MongoError(14, f"BSON field '{field}' is the wrong type '{type_name(scale)}'")
    if scale < 1:
        raise MongoError(2, "scale has to be >= 1")
    return int(scale)


def _coll_sizes(store: Store, c: Collection) -> tuple[int, int]:
    docs = store.documents(c)
    size = sum(len(bson_bytes.encode(d)) for d in docs.values())
    return len(docs), size


def _index_sizes(c: Collection, count: int) -> dict[str, int]:
    # No B-tree: an estimate a B-tree of `count` keys would take (4 KiB minimum, as WiredTiger).
    return {ix["name"]: 4096 + 32 * count for ix in c.indexes}


@_command("dbStats", "dbstats")
async def db_stats(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    scale = _scale(cmd)
    store = _store(server)
    # Each collection with its document count and size (system.views is not one).
    sized = [(c, *_coll_sizes(store, c)) for c in store.collections_of(db)
             if c.name != "system.views"] if store is not None else []
    views = len(store.views_of(db)) if store is not None else 0
    objects = data = indexes = index_size = 0
    storage = 0
    for c, n, size in sized:
        objects += n
        data += size
        storage += max(4096, size)
        indexes += len(c.indexes)
        index_size += sum(_index_sizes(c, n).values())
    return {
        "db": db,
        "collections": Int64(len(sized)),
        "views": Int64(views),
        "objects": Int64(objects),
        "avgObjSize": (data / objects) if objects else 0.0,
        "dataSize": float(data / scale),
        "storageSize": float(storage / scale),
        "indexes": Int64(indexes),
        "indexSize": float(index_size / scale),
        "totalSize": float((storage + index_size) / scale),
        "scaleFactor": Int64(scale),
        "fsUsedSize": float(_fs(store)[0] / scale),
        "fsTotalSize": float(_fs(store)[1] / scale),
    }


def _fs(store: Store | None) -> tuple[int, int]:
    path = (store.data_dir if store is not None else None) or "."
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    total = st.f_blocks * st.f_frsize
    return total - st.f_bfree * st.f_frsize, total


def _oplog_storage_stats(server: ServerState, scale: int) -> dict[str, Any]:
    """`local.oplog.rs` (mongosh's rs.printReplicationInfo reads its size and maxSize): a
    capped collection without indexes, whatever the source (embedded, recorded, upstream)."""
    store = server.store
    entries = store if store is not None else server.oplog
    count = size = 0  # a front's entries are its shards'
    if isinstance(entries, EntryList):
        count, size = entries.entry_count(), entries.byte_size()
    max_size = (store.oplog_size_bytes if store is not None else 0) or size
    return {
        "size": size // scale, "count": count, "avgObjSize": size // count if count else 0,
        "numOrphanDocs": 0, "storageSize": max(4096, size) // scale, "freeStorageSize": 0,
        "capped": True, "max": 0, "maxSize": max_size // scale, "nindexes": 0,
        "indexDetails": {}, "indexBuilds": [], "totalIndexSize": 0,
        "totalSize": max(4096, size) // scale, "indexSizes": {}, "scaleFactor": scale,
    }


def storage_stats(store: Store | None, db: str, coll: str, scale: int) -> dict[str, Any]:
    c = store.get(db, coll) if store is not None else None
    if store is None or c is None:
        return {"size": 0, "count": 0, "storageSize": 0, "totalSize": 0, "nindexes": 0,
                "totalIndexSize": 0, "indexSizes": {}, "scaleFactor": scale}
    n, size = _coll_sizes(store, c)
    index_sizes = _index_sizes(c, n)
    storage = max(4096, size)
    total_index = sum(index_sizes.values())
    stats: dict[str, Any] = {
        "size": size // scale,
        "count": n,
        "avgObjSize": size // n if n else 0,
        "numOrphanDocs": 0,
        "storageSize": storage // scale,
        "freeStorageSize": 0,
        "capped": bool(c.options.get("capped")),
    }
    if c.options.get("capped"):
        stats["max"] = int(c.options.get("max", 0) or 0)
        stats["maxSize"] = int(c.options.get("size", 0) or 0) // scale
    stats.update({
        "nindexes": len(c.indexes),
        "indexDetails": {name: {} for name in index_sizes},
        "indexBuilds": [],
        "totalIndexSize": total_index // scale,
        "totalSize": (storage + total_index) // scale,
        "indexSizes": {k: v // scale for k, v in index_sizes.items()},
        "scaleFactor": scale,
    })
    return stats


@_command("collStats", "collstats")  # mongod's CollectionStats, with its alias
async def coll_stats(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    coll = cmd.get(next(iter(cmd)))
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"collection name has invalid type {type_name(coll)}")
    scale = _scale(cmd)
    if oplog_find.is_oplog(db, coll):
        return {"ns": f"{db}.{coll}", **_oplog_storage_stats(server, scale)}
    return {"ns": f"{db}.{coll}", **storage_stats(_store(server), db, coll, scale)}


def coll_stats_stage(
    server: ServerState, spec: Any, db: str, coll: str
) -> list[dict[str, Any]]:
    """The one document `$collStats` produces (a replica set has one "shard": none named)."""
    if not isinstance(spec, Mapping):
        raise MongoError(5447000, "$collStats must take a nested object but found: "
                         f"$collStats: {type_name(spec)}")
    doc: dict[str, Any] = {"ns": f"{db}.{coll}", "host": _pretty_host(server),
                           "localTime": _now()}
    for key, value in spec.items():
        if key not in ("latencyStats", "storageStats", "count", "queryExecStats"):
            raise MongoError(40415, f"BSON field '$collStats.{key}' is an unknown field.")
        if not isinstance(value, Mapping):
            raise MongoError(14, f"BSON field '$collStats.{key}' is the wrong type "
                             f"'{type_name(value)}', expected type 'object'")
    store = _store(server)
    if "latencyStats" in spec:
        zero = {"latency": Int64(0), "ops": Int64(0)}
        doc["latencyStats"] = {"reads": dict(zero), "writes": dict(zero),
                               "commands": dict(zero), "transactions": dict(zero)}
    oplog = oplog_find.is_oplog(db, coll)
    if "storageStats" in spec:
        scale = _scale(spec["storageStats"])
        doc["storageStats"] = (_oplog_storage_stats(server, scale) if oplog
                               else storage_stats(store, db, coll, scale))
    if "count" in spec and oplog:
        doc["count"] = _oplog_storage_stats(server, 1)["count"]
    elif "count" in spec:
        c = store.get(db, coll) if store is not None else None
        if store is None or c is None:
            raise MongoError(26, f"Unable to retrieve count in $collStats stage :: caused by "
                             f":: Collection [{db}.{coll}] not found.")
        doc["count"] = len(store.documents(c))
    if "queryExecStats" in spec:
        doc["queryExecStats"] = {"collectionScans": {"total": Int64(0),
                                                     "nonTailable": Int64(0)}}
    return [doc]


@_command("validate")
async def validate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    coll = cmd.get("validate")
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"collection name has invalid type {type_name(coll)}")
    store = _store(server)
    c = store.get(db, coll) if store is not None else None
    if store is None or c is None:
        if store is not None and store.view(db, coll) is not None:
            raise MongoError(166, "Cannot validate a view")
        raise MongoError(26, f"Collection '{db}.{coll}' does not exist to validate.")
    docs = store.documents(c)
    invalid = 0
    for doc in docs.values():  # the validator, checked as `validate` does (counted, not fatal)
        try:
            c.check_valid(doc)
        except MongoError:
            invalid += 1
        except Exception:  # noqa: BLE001 - a validator this store cannot evaluate
            invalid += 1
    n = len(docs)
    warnings = []
    if invalid:
        warnings.append(f"Detected {invalid} document(s) that do not comply with the "
                        "collection's validator.")
    return {
        "ns": c.ns,
        "uuid": c.ui,
        "nInvalidDocuments": 0,
        "nNonCompliantDocuments": invalid,
        "nrecords": n,
        "nIndexes": len(c.indexes),
        "keysPerIndex": {ix["name"]: n for ix in c.indexes},
        "indexDetails": {ix["name"]: {"valid": True} for ix in c.indexes},
        "valid": True,
        "repaired": False,
        "readTimestamp": server.oplog.cluster_time(),
        "warnings": warnings,
        "errors": [],
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
    }


# -- explain ------------------------------------------------------------------------------------

_EXPLAINABLE = ("find", "aggregate", "count", "distinct", "update", "delete", "findAndModify",
                "findandmodify")
_VERBOSITIES = ("queryPlanner", "executionStats", "allPlansExecution")


def _server_info(server: ServerState) -> dict[str, Any]:
    return {"host": socket.gethostname(), "port": server.port, "version": server.release.version,
            "gitVersion": GIT_VERSION}


_SERVER_PARAMETERS = {
    "internalQueryFacetBufferSizeBytes": 104857600,
    "internalQueryFacetMaxOutputDocSizeBytes": 104857600,
    "internalLookupStageIntermediateDocumentMaxSizeBytes": 104857600,
    "internalDocumentSourceGroupMaxMemoryBytes": 104857600,
    "internalQueryMaxBlockingSortMemoryUsageBytes": 104857600,
    "internalQueryProhibitBlockingMergeOnMongoS": 0,
    "internalQueryMaxAddToSetBytes": 104857600,
    "internalDocumentSourceSetWindowFieldsMaxMemoryBytes": 104857600,
    "internalQueryFrameworkControl": "trySbeRestricted",
    "internalQueryPlannerIgnoreIndexWithCollationForRegex": 1,
}


def _conjuncts(filter_doc: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(path, operator, value) of each predicate ANDed at the top of a filter ($and flattened;
    `{path: value}` is `$eq`); other top-level operators are left out."""
    out: list[tuple[str, str, Any]] = []
    for key, value in filter_doc.items():
        if key == "$and" and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    out.extend(_conjuncts(clause))
        elif key.startswith("$"):
            continue
        elif isinstance(value, Mapping) and value and next(iter(value)).startswith("$"):
            out.extend((key, op, arg) for op, arg in value.items())
        else:
            out.append((key, "$eq", value))
    return out


def _ordered(a: Any, b: Any) -> bool:
    """Whether a and b compare by value as the planner's bounds do (numbers or strings)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float, Int64)) and not isinstance(v, bool)
    return (number(a) and number(b)) or (isinstance(a, str) and isinstance(b, str))


def _implies(query: tuple[str, str, Any], wanted: tuple[str, str, Any]) -> bool:
    """Whether the query's predicate implies the partial filter's (the subset check of
    expression::isSubsetOf, for equality, ranges and $exists)."""
    (path, op, v), (wpath, wop, wv) = query, wanted
    if path != wpath:
        return False
    if (op, v) == (wop, wv) and type(v) is type(wv):
        return True
    if wop == "$exists":
        return wv is True and (op in ("$gt", "$gte", "$lt", "$lte") or (op == "$eq"
                                                                         and v is not None))
    if wop not in ("$lt", "$lte", "$gt", "$gte") or not _ordered(v, wv):
        return False
    if wop in ("$lt", "$lte"):
        if op in ("$eq", "$lte"):
            return v < wv or (wop == "$lte" and v == wv)
        return op == "$lt" and v <= wv
    if op in ("$eq", "$gte"):
        return v > wv or (wop == "$gte" and v == wv)
    return op == "$gt" and v >= wv


def _bound(v: Any) -> str:
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf.0" if v > 0 else "-inf.0"
    return json.dumps(v) if isinstance(v, str) else str(v)


def _index_bounds(field: str, preds: list[tuple[str, str, Any]]) -> list[str]:
    """The first key field's interval from its equality or range predicates (other shapes:
    all values)."""
    low, high, low_open, high_open = "MinKey", "MaxKey", False, False
    for path, op, v in preds:
        if path != field or not _ordered(v, v):
            continue
        if op == "$eq":
            return [f"[{_bound(v)}, {_bound(v)}]"]
        number = not isinstance(v, str)
        if op in ("$gt", "$gte"):
            low, low_open = _bound(v), op == "$gt"
            high = "inf.0" if number and high == "MaxKey" else high
        elif op in ("$lt", "$lte"):
            high, high_open = _bound(v), op == "$lt"
            low = "-inf.0" if number and low == "MinKey" else low
    return [f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"]


def _partial_index_leaf(server: ServerState, db: str, coll: str,
                        filter_doc: Any) -> dict[str, Any] | None:
    """FETCH over an IXSCAN of a partial index the query can use: one whose first key field
    the filter names and whose partialFilterExpression the filter implies (mongod plans no
    partial index otherwise, since it would miss documents)."""
    store = _store(server)
    c = store.get(db, coll) if store is not None else None
    if c is None or not isinstance(filter_doc, Mapping):
        return None
    preds = _conjuncts(filter_doc)
    for ix in c.indexes:
        pfe, key = ix.get("partialFilterExpression"), ix.get("key", {})
        if not isinstance(pfe, Mapping) or ix.get("hidden") or any(
                isinstance(v, str) for v in key.values()):
            continue
        first = next(iter(key), None)
        if not any(p[0] == first for p in preds) or not all(
                any(_implies(q, w) for q in preds) for w in _conjuncts(pfe)):
            continue
        scan = {"stage": "IXSCAN", "keyPattern": dict(key), "indexName": ix["name"],
                "isMultiKey": False, "multiKeyPaths": {k: [] for k in key},
                "isUnique": bool(ix.get("unique")), "isSparse": bool(ix.get("sparse")),
                "isPartial": True, "indexVersion": 2, "direction": "forward",
                "indexBounds": {k: _index_bounds(k, preds) if k == first
                                else ["[MinKey, MaxKey]"] for k in key}}
        rest = {k: v for k, v in filter_doc.items() if k != first}
        fetch: dict[str, Any] = {"stage": "FETCH"}
        if rest:
            fetch["filter"] = rest
        fetch["inputStage"] = scan
        return fetch
    return None


def _plan(filter_doc: Any, sort: Any, limit: int, skip: int,
          leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """The winning plan of a query: a COLLSCAN when no index serves it (else `leaf`), with
    the SORT / SKIP / LIMIT stages above it that mongod's classic planner adds."""
    plan: dict[str, Any]
    if leaf is not None:
        plan = leaf
    else:
        plan = {"stage": "COLLSCAN"}
        if filter_doc:
            plan["filter"] = dict(filter_doc)
        plan["direction"] = "forward"
    if skip:
        plan = {"stage": "SKIP", "skipAmount": skip, "inputStage": plan}
    if isinstance(sort, Mapping) and sort:
        plan = {"stage": "SORT", "sortPattern": dict(sort), "memLimit": 104857600,
                "type": "simple", "inputStage": plan}
        if limit:
            plan["limitAmount"] = limit
    elif limit:
        plan = {"stage": "LIMIT", "limitAmount": limit, "inputStage": plan}
    return plan


def _query_planner(ns: str, filter_doc: Any, plan: dict[str, Any]) -> dict[str, Any]:
    return {
        "namespace": ns,
        "parsedQuery": dict(filter_doc) if isinstance(filter_doc, Mapping) else {},
        "indexFilterSet": False,
        "optimizationTimeMillis": 0,
        "maxIndexedOrSolutionsReached": False,
        "maxIndexedAndSolutionsReached": False,
        "maxScansToExplodeReached": False,
        "prunedSimilarIndexes": False,
        "winningPlan": {"isCached": False, **plan},
        "rejectedPlans": [],
    }


def _execution_stages(plan: dict[str, Any], returned: int, examined: int) -> dict[str, Any]:
    stages = {k: v for k, v in plan.items() if k != "inputStage"}
    stages.update({"nReturned": returned, "executionTimeMillisEstimate": 0,
                   "works": examined + 1, "advanced": returned,
                   "needTime": max(0, examined - returned), "needYield": 0, "saveState": 0,
                   "restoreState": 0, "isEOF": 1})
    if plan["stage"] == "COLLSCAN":
        stages["docsExamined"] = examined
    if "inputStage" in plan:
        stages["inputStage"] = _execution_stages(plan["inputStage"], examined, examined)
    return stages


def _find_index_plan(server: ServerState, db: str, coll: str, inner: Mapping[str, Any],
                     filter_doc: Any) -> index_table.IndexPlan | None:
    """The index scan the find reads (commands/queries.py _find_scan plans it the same way):
    none with a hint, min / max, a collation (the command's or the collection's), `$text`."""
    store = _store(server)
    c = store.get(db, coll) if store is not None else None
    if store is None or c is None or not isinstance(filter_doc, Mapping) or "$text" in filter_doc:
        return None
    if any(inner.get(k) is not None for k in ("hint", "min", "max")):
        return None
    try:
        if query.collation_of(inner.get("collation"), c.options.get("collation")) is not None:
            return None
    except MongoError:  # the find itself refuses it
        return None
    records = store.documents(c)
    if records is not c.records:
        return None
    return index_table.plan(c, records, engine.normalize(dict(filter_doc)))


def _index_scan_stats(stages: dict[str, Any], index_plan: index_table.IndexPlan) -> None:
    """The FETCH over IXSCAN of executionStages with what the scan examined."""
    while stages.get("stage") != "FETCH" and "inputStage" in stages:
        stages = stages["inputStage"]
    scan = stages.get("inputStage")
    if stages.get("stage") != "FETCH" or not isinstance(scan, dict):
        return
    docs, keys = len(index_plan.doc_keys), index_plan.keys_examined
    stages["docsExamined"] = docs
    stages["alreadyHasObj"] = 0
    scan.update({"nReturned": docs, "works": keys + 1, "advanced": docs,
                 "needTime": max(0, keys - docs), "keysExamined": keys,
                 "seeks": len(index_plan.intervals),
                 "dupsTested": keys if index_plan.multikey else 0,
                 "dupsDropped": keys - docs if index_plan.multikey else 0})


def _doc_count(server: ServerState, db: str, coll: str) -> int:
    store = _store(server)
    c = store.get(db, coll) if store is not None else None
    return len(store.documents(c)) if store is not None and c is not None else 0


async def _run(server: ServerState, conn: ConnectionState, name: str, cmd: dict[str, Any],
               db: str) -> dict[str, Any]:
    """Run `cmd` with the server's own handler of `name`; a per-request entry (`Route`) picks
    its handler for `cmd`, as run_command does."""
    entry = server.commands[name]
    handler = entry.choose(server, cmd) if isinstance(entry, Route) else entry
    return await handler(server, conn, cmd, db)


async def _returned(server: ServerState, conn: ConnectionState, inner: dict[str, Any],
                    db: str) -> int:
    """Run a read and count its results (explain's executionStats)."""
    name = next(iter(inner))
    if name not in server.commands:
        return 0
    if name == "find":
        reply = await _run(server, conn, "find", {**inner, "singleBatch": True,
                                                  "batchSize": 2**31 - 1, "$db": db}, db)
        return len(reply["cursor"]["firstBatch"])
    if name == "count":
        reply = await _run(server, conn, name, {**inner, "$db": db}, db)
        return int(reply.get("n", 0))
    if name == "distinct":
        reply = await _run(server, conn, name, {**inner, "$db": db}, db)
        return len(reply.get("values", []))
    if name in ("update", "delete"):  # what the statements would match; nothing is written
        stmts = inner.get(name + "s") or [{}]
        q = stmts[0].get("q", {}) if isinstance(stmts[0], Mapping) else {}
        reply = await _run(server, conn, "find", {"find": inner[name], "filter": q,
                                                  "singleBatch": True,
                                                  "batchSize": 2**31 - 1, "$db": db}, db)
        return len(reply["cursor"]["firstBatch"])
    return 0


@_command("explain")
async def explain(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    inner = cmd.get("explain")
    if not isinstance(inner, Mapping) or not inner:
        raise MongoError(2, "explain command requires a nested object")
    verbosity = cmd.get("verbosity", "allPlansExecution")
    if verbosity not in _VERBOSITIES:
        raise MongoError(2, f"verbosity string must be one of {{'queryPlanner', "
                         f"'executionStats', 'allPlansExecution'}}, got: {verbosity}")
    inner = dict(inner)
    name = next(iter(inner))
    if name not in _EXPLAINABLE and name not in server.commands:
        raise MongoError(59, f"Explain failed due to unknown command: {name}")
    if name not in _EXPLAINABLE:
        raise MongoError(20, f"Cannot explain cmd: {name}")
    if "$db" in inner and inner["$db"] != db:
        raise MongoError(2, "Mismatched $db in explain command. Expected " + db
                         + " but got " + str(inner["$db"]))
    if name == "aggregate":
        return await explain_aggregate(server, conn, {**inner, "explain": True}, db,
                                       verbosity)
    target = inner.get(name)
    if not isinstance(target, str):
        raise MongoError(73, f"collection name has invalid type {type_name(target)}")
    ns = f"{db}.{target}"
    filter_doc: Any
    sort: Any = None
    limit = skip = 0
    if name == "find":
        filter_doc, sort = inner.get("filter") or {}, inner.get("sort")
        limit, skip = _int(inner.get("limit")), _int(inner.get("skip"))
    elif name in ("count", "distinct"):
        filter_doc = inner.get("query") or {}
    elif name in ("update", "delete"):
        stmts = inner.get(name + "s")
        first = stmts[0] if isinstance(stmts, list) and stmts else {}
        filter_doc = first.get("q", {}) if isinstance(first, Mapping) else {}
    else:
        filter_doc, sort = inner.get("query") or {}, inner.get("sort")
    leaf = _partial_index_leaf(server, db, target, filter_doc)
    index_plan = _find_index_plan(server, db, target, inner, filter_doc) if (
        leaf is None and name == "find") else None
    if index_plan is not None:
        leaf = index_plan.winning_plan()
    plan = _plan(filter_doc, sort, abs(limit), skip, leaf)
    if name == "count":
        plan = {"stage": "COUNT", "inputStage": plan}
    elif name in ("update", "delete", "findAndModify", "findandmodify"):
        kind = "DELETE" if name == "delete" or inner.get("remove") else "UPDATE"
        plan = {"stage": kind, "inputStage": plan}
    reply: dict[str, Any] = {"explainVersion": "1",
                             "queryPlanner": _query_planner(ns, filter_doc, plan)}
    if verbosity != "queryPlanner":
        examined = (_doc_count(server, db, target) if index_plan is None
                    else len(index_plan.doc_keys))
        returned = await _returned(server, conn, inner, db) if name != "findAndModify" else 0
        stages = _execution_stages(plan, returned, examined)
        if index_plan is not None:
            _index_scan_stats(stages, index_plan)
        stats = {
            "executionSuccess": True,
            "nReturned": returned,
            "executionTimeMillis": 0,
            "totalKeysExamined": 0 if index_plan is None else index_plan.keys_examined,
            "totalDocsExamined": examined,
            "executionStages": stages,
        }
        if verbosity == "allPlansExecution":
            stats["allPlansExecution"] = []
        reply["executionStats"] = stats
    reply["command"] = {**inner, "$db": db}
    reply["serverInfo"] = _server_info(server)
    reply["serverParameters"] = dict(_SERVER_PARAMETERS)
    return reply


async def explain_aggregate(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any], db: str,
    verbosity: str = "queryPlanner",
) -> dict[str, Any]:
    """`aggregate` with `explain: true` (or under `explain`): the pipeline's stages over the
    collection scan that feeds them (mongod's `$cursor` stage)."""
    crud_common.check_explain_write_concern(cmd)  # 9, as under `explain: true`
    target = cmd.get("aggregate")
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, f"BSON field 'aggregate.pipeline' is the wrong type "
                         f"'{type_name(pipeline)}', expected type 'array'")
    search.check_search_stages(pipeline)  # 31082 when the pipeline is parsed
    stages = [dict(s) for s in pipeline if isinstance(s, Mapping)]
    ns = f"{db}.{target}" if isinstance(target, str) else f"{db}.$cmd.aggregate"
    filter_doc: dict[str, Any] = {}
    rest = list(stages)
    if rest and list(rest[0]) == ["$match"] and isinstance(rest[0]["$match"], Mapping):
        filter_doc = dict(rest.pop(0)["$match"])
    plan = _plan(filter_doc, None, 0, 0)
    planner = _query_planner(ns, filter_doc, plan)
    reply: dict[str, Any] = {"explainVersion": "1"}
    if not rest:
        reply["queryPlanner"] = planner
    else:
        reply["stages"] = [{"$cursor": {"queryPlanner": planner}}, *rest]
    reply["command"] = {k: v for k, v in cmd.items() if k != "explain"}
    reply["serverInfo"] = _server_info(server)
    reply["serverParameters"] = dict(_SERVER_PARAMETERS)
    return reply


def aggregate_source(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any], db: str
) -> tuple[str, list[Any], int | None] | None:
    """A pipeline that starts with `$currentOp` or `$collStats` (stages that make their own
    documents): its namespace, results and cursor batch size, else None."""
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list) or not pipeline or not isinstance(pipeline[0], Mapping):
        return None
    name = next(iter(pipeline[0]), "")
    target = cmd.get("aggregate")
    if name == "$currentOp":
        docs = current_op_stage(server, conn, pipeline[0][name], db, target)
        ns = f"{db}.$cmd.aggregate"
    elif name == "$listLocalSessions":
        docs = list_local_sessions_stage(server, conn, pipeline[0][name], target)
        ns = f"{db}.$cmd.aggregate"
    elif name == "$listSessions":
        docs = list_sessions_stage(server, conn, pipeline[0][name], db, target)
        ns = f"{db}.{target}"
    elif name == "$collStats":
        if not isinstance(target, str):
            raise MongoError(73, "$collStats must be run against a collection namespace")
        docs = coll_stats_stage(server, pipeline[0][name], db, target)
        ns = f"{db}.{target}"
    else:
        return None
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, Mapping):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    batch_size = cursor_doc.get("batchSize")
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, (int, float))):
        raise MongoError(14, "BSON field 'aggregate.cursor.batchSize' is the wrong type "
                         f"'{type_name(batch_size)}', expected types '[long, int, decimal, "
                         "double]'")
    rest = [engine.normalize(dict(s)) if isinstance(s, Mapping) else s for s in pipeline[1:]]
    if rest:
        store = _store(server)
        database = store.query_database(db) if store is not None else engine.query_database(db)
        docs = engine.run_pipeline(docs, database, rest)
    return ns, docs, None if batch_size is None else int(batch_size)
