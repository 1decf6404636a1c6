"""Fail points, as mongod offers them with test commands enabled: `configureFailPoint` (admin)
for `failCommand`, `failGetMoreAfterCursorCheckout`, `onPrimaryTransactionalWrite` and
`maxTimeAlwaysTimeOut` (their semantics: at each one's evaluation below), and cdcserver's own
`crashAfterFirstParticipantCommit` (evaluated by the sharded front's cross-shard commit,
`sharding/router/transactions.py`: it ends the process between the participants' commits).

Users test their consumers' resume logic with them: a network error (`closeConnection`), a
`ResumableChangeStreamError` (`failGetMoreAfterCursorCheckout`), `CursorNotFound`, a slow server
(`blockConnection`)... The drivers' specification tests use them the same way.

Every fail point starts `off`. `[server] enable_fail_points = false` removes the command (it then
answers CommandNotFound, as a mongod without `enableTestCommands` does). cdcserver has no
authentication, so there is no privilege to check.

mongod's semantics, reproduced here (src/mongo/db/commands.cpp, error_labels.cpp,
getmore_cmd.cpp, util/fail_point.cpp):

- `mode`: `"alwaysOn"`, `"off"`, `{times: n}` (n activations, then off), `{skip: n}` (let n
  matching commands through, then always on), `{activationProbability: p}`.
- `failCommand` applies to a command named (or aliased) in `data.failCommands` (or every command
  with `failAllCommands`), never to `configureFailPoint`, and only when `appName`, `threadName`
  ("conn<id>") and `namespace` match when given, and not to internal clients (a hello with
  `internalClient`) unless `failInternalCommands`. It is evaluated before the command runs,
  and activates only with `closeConnection`, `blockConnection` or `errorCode`: it blocks
  `blockTimeMS` first, then closes the connection without a reply, or fails with `errorCode`
  ("Failing command via 'failCommand' failpoint"). A `writeConcernError` (without those) is
  appended to the successful reply of a command that takes a write concern.
- `errorLabels`, when given, replace the labels mongod would add (`[]`: none). Otherwise the
  labels are mongod's (ErrorLabelBuilder): TransientTransactionError, RetryableWriteError,
  ResumableChangeStreamError for the aggregate that opens a change stream (not for a getMore:
  `failCommand` fires before the cursor is checked out, so mongod cannot tell it serves a change
  stream), NonResumableChangeStreamError for 280/286.
- `failGetMoreAfterCursorCheckout` fails a getMore after its cursor is checked out (same
  `appName`/`namespace`/internal-client filters, on the cursor's namespace) with `errorCode`
  (default InternalError) "Hit the 'failGetMoreAfterCursorCheckout' failpoint"; the cursor is
  deleted, and a change-stream cursor's error carries ResumableChangeStreamError.
- NotPrimary-category errors carry the server's `topologyVersion`, as a replica-set member's do.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64

from cdcserver.commands import write_concern
from cdcserver.commands.transactions import lsid_str
from cdcserver.context import ConnectionState, Handler, Route, ServerState
from cdcserver.cursors import FORWARDED, kind_of
from cdcserver.embedded.sessions import OpSession
from pipeline_stages.error_labels import (
    NEED_RETARGETTING_ERROR,
    NETWORK_ERROR,
    NON_RESUMABLE_CHANGE_STREAM_ERROR,
    NOT_PRIMARY_ERROR,
    RESUMABLE_CHANGE_STREAM_CODES,
    RETRIABLE_ERROR,
    SNAPSHOT_ERROR,
    error_labels,
)
from pipeline_stages.errors import MongoError, code_name

log = logging.getLogger(__name__)

# Exported with the fail points: the label policy (pipeline_stages.error_labels), which the
# command path (registry.py) reads from here.
__all__ = [
    "CRASH_AFTER_FIRST_PARTICIPANT_COMMIT", "FAIL_COMMAND", "FAIL_COMMAND_MESSAGE",
    "FAIL_GET_MORE", "FAIL_GET_MORE_MESSAGE", "FAIL_POINT_NAMES", "MAX_TIME_ALWAYS_TIME_OUT",
    "NEED_RETARGETTING_ERROR", "NETWORK_ERROR", "NON_RESUMABLE_CHANGE_STREAM_ERROR",
    "NOT_PRIMARY_ERROR", "ON_PRIMARY_TRANSACTIONAL_WRITE", "RESUMABLE_CHANGE_STREAM_CODES",
    "RETRIABLE_ERROR", "SNAPSHOT_ERROR", "TABLE", "CloseConnection", "FailPoint", "FailPointError",
    "FailPoints", "NamedError", "after_command", "before_command", "close_if_requested",
    "command_namespace", "configure_fail_point", "error_labels", "fail_points", "set_enabled",
    "test_version_2",
]

# A serving mode's table of commands, as the fail points consult it.
_Commands = Mapping[str, "Handler | Route"]

FAIL_COMMAND = "failCommand"
FAIL_GET_MORE = "failGetMoreAfterCursorCheckout"
ON_PRIMARY_TRANSACTIONAL_WRITE = "onPrimaryTransactionalWrite"
MAX_TIME_ALWAYS_TIME_OUT = "maxTimeAlwaysTimeOut"
# cdcserver's own (tests of the sharded cluster's coordinator recovery): the front's two-phase
# commit ends the process (exit status 9) after the first participant committed.
CRASH_AFTER_FIRST_PARTICIPANT_COMMIT = "crashAfterFirstParticipantCommit"
FAIL_POINT_NAMES = (
    FAIL_COMMAND, FAIL_GET_MORE, ON_PRIMARY_TRANSACTIONAL_WRITE, MAX_TIME_ALWAYS_TIME_OUT,
    CRASH_AFTER_FIRST_PARTICIPANT_COMMIT,
)
FAIL_COMMAND_MESSAGE = "Failing command via 'failCommand' failpoint"
FAIL_GET_MORE_MESSAGE = "Hit the 'failGetMoreAfterCursorCheckout' failpoint"

_HELLO = frozenset({"hello", "isMaster", "ismaster"})
# Commands that take a write concern (a failCommand `writeConcernError` applies to them).
_WRITE_CONCERN_COMMANDS = frozenset(
    {"insert", "update", "delete", "findAndModify", "findandmodify", "create", "drop",
     "dropDatabase", "renameCollection", "createIndexes", "dropIndexes", "deleteIndexes",
     "collMod", "commitTransaction", "abortTransaction", "bulkWrite"}
)


# The connection whose command is running (each connection is one task): the fail points a
# write meets deep in the store act on it.
_CONNECTION: contextvars.ContextVar[ConnectionState | None] = contextvars.ContextVar(
    "failpoint_connection", default=None
)


class CloseConnection(ConnectionResetError):
    """`closeConnection`: the server drops the connection without answering (the listener
    treats it as the peer going away)."""


class NamedError(MongoError):
    """A MongoError named from mongod's whole code table (pipeline_stages.errors.code_name)."""

    @property
    def code_name(self) -> str:
        return code_name(self.code)


class FailPointError(NamedError):
    """An error injected by a fail point: its labels are final (no others are added)."""

    def __init__(
        self, code: int, errmsg: str, labels: list[str], extra: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(code, errmsg, labels)
        self.extra = dict(extra or {})

    def to_reply(self) -> dict[str, object]:
        reply = super().to_reply()
        labels = reply.pop("errorLabels", None)
        reply.update(self.extra)
        if labels:
            reply["errorLabels"] = labels
        return reply


# -- mode -----------------------------------------------------------------------------------------


def _whole(mode: Mapping[str, Any], key: str) -> int:
    value = mode[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        from pipeline_stages.value_string import type_name

        raise MongoError(
            14, f'Expected field "{key}" to have numeric type, but found {type_name(value)}'
        )
    if isinstance(value, float) and not value.is_integer():
        raise MongoError(
            2, f'Expected field "{key}" to have a value exactly representable as a 64-bit '
            f"integer, but found {key}: {value}"
        )
    number = int(value)
    if number < 0:
        raise MongoError(2, f"'{key}' option to 'mode' must be positive")
    if number > 2**31 - 1:
        raise MongoError(2, f"'{key}' option to 'mode' is too large")
    return number


@dataclass
class FailPoint:
    name: str
    mode: str = "off"  # off | alwaysOn | times | skip | random
    value: float = 0  # times left, skips left, or the activation probability
    data: dict[str, Any] = field(default_factory=dict)
    times_entered: int = 0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def configure(self, cmd: Mapping[str, Any]) -> None:
        """FailPoint::parseBSON, then set (the count of activations is kept, as mongod's)."""
        if "mode" not in cmd:
            raise MongoError(20, "When setting a failpoint, you must supply a 'mode'")
        mode = cmd["mode"]
        value: float = 0
        if isinstance(mode, str):
            if mode not in ("off", "alwaysOn"):
                raise MongoError(2, f"unknown mode: {mode}")
        elif isinstance(mode, Mapping):
            if "times" in mode:
                value, mode = _whole(mode, "times"), "times"
            elif "skip" in mode:
                value, mode = _whole(mode, "skip"), "skip"
            elif "activationProbability" in mode:
                p = mode["activationProbability"]
                if isinstance(p, bool) or not isinstance(p, (int, float)):
                    raise MongoError(
                        14, "'activationProbability' option to 'mode' must be a double"
                    )
                if not 0 <= p <= 1:
                    raise MongoError(
                        2, "'activationProbability' option to 'mode' must be between 0 and 1"
                    )
                value, mode = float(p), "random"
            else:
                raise MongoError(
                    2, "mode must be 'alwaysOn', 'off', or a document with 'times', 'skip', "
                    "or 'activationProbability'"
                )
        else:
            raise MongoError(14, "'mode' must be a string or JSON object")
        data = cmd.get("data", {})
        if not isinstance(data, Mapping):
            raise MongoError(14, "the 'data' field must be a BSON object")
        self.mode, self.value, self.data = mode, value, dict(data)
        if mode == "times" and value == 0:
            self.mode = "off"

    def fire(self) -> bool:
        """One evaluation by a command that matches the fail point's filters."""
        if self.mode == "off":
            return False
        if self.mode == "skip":
            if self.value > 0:
                self.value -= 1
                return False
        elif self.mode == "random":
            if random.random() >= self.value:
                return False
        elif self.mode == "times":
            self.value -= 1
            if self.value <= 0:
                self.mode = "off"
        self.times_entered += 1
        return True

    def describe(self) -> dict[str, Any]:
        mode: Any = self.mode
        if mode == "times":
            mode = {"times": int(self.value)}
        elif mode == "skip":
            mode = {"skip": int(self.value)}
        elif mode == "random":
            mode = {"activationProbability": self.value}
        return {"mode": mode, "data": self.data, "timesEntered": Int64(self.times_entered)}


class FailPoints:
    """The fail points of one server."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.points = {name: FailPoint(name) for name in FAIL_POINT_NAMES}

    @property
    def active(self) -> bool:
        return any(p.on for p in self.points.values())

    def reset(self) -> None:
        for point in self.points.values():
            point.mode, point.value, point.data = "off", 0, {}


def fail_points(server: ServerState) -> FailPoints:
    """The server's fail points (kept on the ServerState, made on first use)."""
    return server.part(FailPoints)


def set_enabled(server: ServerState, enabled: bool) -> None:
    """Config `[server] enable_fail_points`: false removes configureFailPoint."""
    points = fail_points(server)
    points.enabled = enabled
    if not enabled:
        points.reset()


# -- the command ----------------------------------------------------------------------------------


async def configure_fail_point(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    points = fail_points(server)
    if not points.enabled:
        raise MongoError(59, "no such command: 'configureFailPoint'")
    if db != "admin":
        raise MongoError(13, "configureFailPoint may only be run against the admin database.")
    name = cmd.get("configureFailPoint")
    point = points.points.get(name) if isinstance(name, str) else None
    if point is None:
        raise NamedError(266, f"{name} not found")
    entered = point.times_entered
    point.configure(cmd)
    if name == ON_PRIMARY_TRANSACTIONAL_WRITE:
        _install_transactional_write_hook(server, point)
    log.info("fail point %s set to %s", name, point.describe())
    return {"count": entered}


async def test_version_2(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongod's test command `testVersion2` (test commands enabled): a command of API version 2
    only, which drivers' versioned-API tests call to see apiStrict refuse it (323, before it
    runs: admin.check_api_parameters); otherwise it does nothing."""
    if not fail_points(server).enabled:
        raise MongoError(59, "no such command: 'testVersion2'")
    return {}


# The test commands this family answers (cdcserver/deployments/ serve them).
TABLE: dict[str, Handler] = {
    "configureFailPoint": configure_fail_point,
    "testVersion2": test_version_2,
}


# -- what a command meets -------------------------------------------------------------------------


def command_namespace(name: str, cmd: Mapping[str, Any], db: str) -> str:
    """The namespace mongod's invocation reports (`data.namespace` is compared to it)."""
    if name == "getMore":
        coll = cmd.get("collection")
        return f"{db}.{coll}" if isinstance(coll, str) else f"{db}.$cmd"
    first = cmd.get(name)
    if isinstance(first, str) and first:
        return f"{db}.{first}"
    return f"{db}.$cmd"


def _same_command(wanted: Any, name: str, commands: _Commands) -> bool:
    if not isinstance(wanted, str):
        return False
    if wanted == name:
        return True
    handler = commands.get(wanted)
    return handler is not None and handler is commands.get(name)


def _filters_pass(data: Mapping[str, Any], conn: ConnectionState, ns: str) -> bool:
    """shouldActivateFailCommandFailPoint, without the command-name test."""
    if "threadName" in data and data.get("threadName") != f"conn{conn.id}":
        return False
    if "appName" in data:
        metadata = conn.client_metadata or {}
        application = metadata.get("application") if isinstance(metadata, Mapping) else None
        app = application.get("name", "") if isinstance(application, Mapping) else ""
        if data.get("appName") != app:
            return False
    if "namespace" in data and data.get("namespace") != ns:
        return False
    internal = conn.internal_client
    return not (internal and data.get("failInternalCommands") is not True)


def _fail_command_matches(
    data: Mapping[str, Any], conn: ConnectionState, name: str, ns: str, commands: _Commands
) -> bool:
    # An unknown command is CommandNotFound before any fail point; configureFailPoint is never
    # failed.
    if name not in commands or name == "configureFailPoint":
        return False
    if not _filters_pass(data, conn, ns):
        return False
    if "failAllCommands" in data:
        return True
    wanted = data.get("failCommands")
    if not isinstance(wanted, list):
        return False
    return any(_same_command(w, name, commands) for w in wanted)


def _int_field(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _is_change_stream_aggregate(name: str, cmd: Mapping[str, Any]) -> bool:
    if name != "aggregate":
        return False
    pipeline = cmd.get("pipeline")
    return (
        isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[0], Mapping)
        and "$changeStream" in pipeline[0]
    )


def _topology_version(server: ServerState, code: int | None) -> dict[str, Any]:
    if code in NOT_PRIMARY_ERROR:
        return {"topologyVersion": {"processId": server.process_id, "counter": Int64(0)}}
    return {}


def _injected_error(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], code: int,
    message: str, data: Mapping[str, Any], change_stream: bool,
) -> FailPointError:
    override = data.get("errorLabels")
    if isinstance(override, list):
        labels = [str(label) for label in override]
    else:
        labels = error_labels(
            name, cmd, code, change_stream=change_stream,
            internal_client=conn.internal_client,
        )
    extra = dict(_topology_version(server, code))
    info = data.get("errorExtraInfo")
    if isinstance(info, Mapping):
        extra.update(info)
    return FailPointError(code, message, labels, extra)


def before_command(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], db: str,
    commands: _Commands,
) -> Awaitable[None] | None:
    """Consult the fail points before a command runs: close the connection
    (`CloseConnection`) or fail (`FailPointError`) now, or return what to await first (a
    `blockConnection`, then maybe one of those). None (no fail point on): run the command."""
    if name in _HELLO:
        if isinstance(cmd.get("internalClient"), Mapping):
            conn.internal_client = True
        # mongod takes the first hello's client metadata before it evaluates failCommand
        # (ExecCommandDatabase::_initiateCommand): an `appName` filter applies to the
        # handshake itself (drivers' pool tests time a handshake out this way).
        client = cmd.get("client")
        if conn.client_metadata is None and isinstance(client, dict):
            conn.client_metadata = client
    _CONNECTION.set(conn)
    points = server.part_if_made(FailPoints)
    if points is None or not points.enabled:
        return None
    fail_command = points.points[FAIL_COMMAND]
    if fail_command.on:
        pending = _evaluate_fail_command(server, conn, name, cmd, db, commands, fail_command)
        if pending is not None:
            return pending
    fail_get_more = points.points[FAIL_GET_MORE]
    if fail_get_more.on and name == "getMore":
        _evaluate_fail_get_more(server, conn, name, cmd, db, fail_get_more)
    max_time = points.points[MAX_TIME_ALWAYS_TIME_OUT]
    if max_time.on and name in commands:
        _evaluate_max_time_always_time_out(server, name, cmd, max_time)
    return None


def _evaluate_max_time_always_time_out(
    server: ServerState, name: str, cmd: Mapping[str, Any], point: FailPoint
) -> None:
    """`maxTimeAlwaysTimeOut`: an operation with a deadline (a positive maxTimeMS) is killed at
    its first interrupt check, 50 MaxTimeMSExpired. A getMore's maxTimeMS is its await time,
    not a deadline: its deadline is the query's maxTimeMS, kept with a query's cursor (the
    cursor dies with the getMore that failed)."""
    max_ms = cmd.get("maxTimeMS")
    if name == "getMore":
        cursor_id = cmd.get("getMore")
        if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
            return
        cursor = server.cursors.find(int(cursor_id))
        # Only a query's result cursor keeps the query's maxTimeMS (commands/queries.py
        # ResultCursor, which imports this module): any other kind has no deadline.
        if not getattr(cursor, "max_time_ms", None) or not point.fire():
            return
        server.cursors.kill(int(cursor_id))
        raise MongoError(50, "operation exceeded time limit")
    if name == "configureFailPoint" or isinstance(max_ms, bool):
        return
    if not isinstance(max_ms, (int, float)) or max_ms <= 0 or not point.fire():
        return
    raise MongoError(50, "operation exceeded time limit")


def _evaluate_fail_command(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], db: str,
    commands: _Commands, point: FailPoint,
) -> Awaitable[None] | None:
    data = point.data
    close = data.get("closeConnection") is True
    block = data.get("blockConnection") is True
    code = _int_field(data, "errorCode")
    if not (close or block or code is not None):
        return None
    ns = command_namespace(name, cmd, db)
    if not _fail_command_matches(data, conn, name, ns, commands) or not point.fire():
        return None
    if block:
        return _block_then_fail(server, conn, name, cmd, data, close, code)
    _fail(server, conn, name, cmd, data, close, code)
    return None


async def _sleep_at_least(seconds: float) -> None:
    # The loop's timers run on a clock cached per iteration (libuv: milliseconds), so one sleep
    # can end a little before `seconds` of real time; the block's promise is "at least".
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(left)


async def _block_then_fail(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any],
    data: Mapping[str, Any], close: bool, code: int | None,
) -> None:
    block_ms = _int_field(data, "blockTimeMS")
    if block_ms is None:
        raise MongoError(72, "must specify 'blockTimeMS' when 'blockConnection' is true")
    if block_ms < 0:
        raise MongoError(72, "'blockTimeMS' must be non-negative")
    log.info("blocking %s for %d ms via 'failCommand' failpoint", name, block_ms)
    max_time_ms = _int_field(cmd, "maxTimeMS") if name != "getMore" else None
    if max_time_ms and max_time_ms < block_ms:  # opCtx->sleepFor honours maxTimeMS
        await _sleep_at_least(max_time_ms / 1000)
        raise MongoError(50, "operation exceeded time limit")
    await _sleep_at_least(block_ms / 1000)
    _fail(server, conn, name, cmd, data, close, code)


def _fail(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any],
    data: Mapping[str, Any], close: bool, code: int | None,
) -> None:
    if close:
        log.info("failing %s via 'failCommand' failpoint: closing connection %d", name, conn.id)
        raise CloseConnection(FAIL_COMMAND_MESSAGE)
    if code is not None:
        log.info("failing %s via 'failCommand' failpoint: returning %d", name, code)
        raise _injected_error(
            server, conn, name, cmd, code, FAIL_COMMAND_MESSAGE, data,
            change_stream=_is_change_stream_aggregate(name, cmd),
        )


def _evaluate_fail_get_more(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], db: str,
    point: FailPoint,
) -> None:
    cursor_id = cmd.get("getMore")
    coll = cmd.get("collection")
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int) or not isinstance(coll, str):
        return
    ns = f"{db}.{coll}"
    cursor = server.cursors.find(int(cursor_id))  # the one registry: any kind
    if cursor is not None and kind_of(cursor) == FORWARDED:
        cursor = None  # held by the upstream: not checked out here
    change_stream = server.cursors.is_change_stream(int(cursor_id))
    # Checked out: it exists, belongs to this namespace and is not in use.
    if cursor is None or getattr(cursor, "ns", ns) != ns or getattr(cursor, "busy", False):
        return
    if not _filters_pass(point.data, conn, ns) or not point.fire():
        return
    # getMore's cursorDeleter: a getMore failing after checkout deletes its cursor.
    server.cursors.kill(int(cursor_id))
    code = _int_field(point.data, "errorCode")
    code = 1 if code is None else code
    log.info("failing getMore of cursor %d via 'failGetMoreAfterCursorCheckout'", cursor_id)
    labels = error_labels(
        name, cmd, code, change_stream=change_stream,
        internal_client=conn.internal_client,
    )
    extra = _topology_version(server, code)
    raise FailPointError(code, FAIL_GET_MORE_MESSAGE, labels, extra)


def after_command(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any], db: str,
    commands: _Commands, reply: dict[str, Any],
) -> None:
    """A `writeConcernError` fail point on a successful command that takes a write concern:
    mongod appends it (and the fail point's non-empty `errorLabels`, or its own) to the reply."""
    close_if_requested(conn)
    points = server.part_if_made(FailPoints)
    if points is None or not points.enabled or not (
        name in _WRITE_CONCERN_COMMANDS or write_concern.left_to_dispatch(name, cmd)
    ):
        return
    point = points.points[FAIL_COMMAND]
    if not point.on or "writeConcernError" not in point.data:
        return
    data = point.data
    ns = command_namespace(name, cmd, db)
    if not _fail_command_matches(data, conn, name, ns, commands) or not point.fire():
        return
    wce = data["writeConcernError"]
    reply["writeConcernError"] = wce
    override = data.get("errorLabels")
    if isinstance(override, list):
        labels = [str(label) for label in override]
    else:
        wc_code = _int_field(wce, "code") if isinstance(wce, Mapping) else None
        labels = error_labels(
            name, cmd, None, wc_code, internal_client=conn.internal_client
        )
    if labels:
        reply["errorLabels"] = labels


# -- onPrimaryTransactionalWrite --------------------------------------------------------------
# mongod's TransactionParticipant evaluates it as each retryable write statement is written
# (one evaluation per statement: `{skip: n}` counts documents): `closeConnection` (default
# true) ends the client's connection (the statement and the rest of the command still run, the
# reply is never sent), `failBeforeCommitExceptionCode` fails the statement with that code
# before it is written ("The write must not be reflected").


def _install_transactional_write_hook(server: ServerState, point: FailPoint) -> None:
    store = server.store
    if store is None:
        return

    def before_retryable_write(session: OpSession) -> None:
        if not point.on or not point.fire():
            return
        data = point.data
        conn = _CONNECTION.get()
        if conn is not None and data.get("closeConnection", True) is not False:
            conn.close_after_command = True
        code = data.get("failBeforeCommitExceptionCode")
        if isinstance(code, (int, float)) and not isinstance(code, bool):
            raise NamedError(
                int(code), f"Failing write for {lsid_str(session.lsid)}:{session.txn_number} "
                "due to failpoint. The write must not be reflected.",
            )

    store.before_retryable_write = before_retryable_write if point.on else None


def close_if_requested(conn: ConnectionState) -> None:
    """A fail point ended this connection while its command ran: no reply is sent."""
    if conn.close_after_command:
        conn.close_after_command = False
        log.info("closing connection %d via 'onPrimaryTransactionalWrite' failpoint", conn.id)
        raise CloseConnection("onPrimaryTransactionalWrite")
