"""Running a command: the mode's table says which handler answers it; the reply/error shape
every command shares.

A handler is `async def h(server, conn, cmd, db) -> dict` returning the reply's own fields;
`run_command` adds `ok`, `$clusterTime` and `operationTime`, and turns a MongoError into
mongod's error reply with the error labels mongod would attach.

Which handler answers which command, in each server mode, is that mode's `CommandTable`
(built next to the mode, in `cdcserver/deployments/`), kept on the server state
(`ServerState.commands`). No handler calls another through a table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from cdcserver.commands import (
    admin,
    arguments,
    cluster_time,
    cursor_sessions,
    failpoints,
    transactions,
    txn_rules,
    write_concern,
)
from cdcserver.context import CommandTable, ConnectionState, Handler, Route, ServerState
from pipeline_stages.errors import MongoError

log = logging.getLogger(__name__)

__all__ = ["CommandTable", "Handler", "int_arg", "run_command"]

# error_codes.yml categories RetriableError, NetworkError and NeedRetargettingError, plus the
# codes error_labels.cpp adds: resumable for a change stream (reference §6.3). (63 left the
# NeedRetargetting category in 6.1: OBSOLETE_StaleShardVersion.)
RESUMABLE_CODES = failpoints.RESUMABLE_CHANGE_STREAM_CODES
NON_RESUMABLE_CODES = failpoints.NON_RESUMABLE_CHANGE_STREAM_ERROR
_ZERO_SIGNATURE = {"hash": Binary(bytes(20), 0), "keyId": Int64(0)}


def int_arg(cmd: Any, name: str, where: str, default: Any = None) -> Any:
    """A numeric command argument (IDL `safeInt64`) as int (`default` when absent or null), or
    mongod's 14; NaN and infinities convert as mongod's safeNumberLong does."""
    return arguments.safe_int_arg(cmd, name, where, default)


def cluster_time_fields(server: ServerState) -> dict[str, Any]:
    ts = server.oplog.cluster_time()
    return {
        "$clusterTime": {"clusterTime": ts, "signature": _ZERO_SIGNATURE},
        "operationTime": ts,
    }


def is_change_stream_command(name: str, cmd: dict[str, Any], server: ServerState) -> bool:
    if name == "aggregate":
        pipeline = cmd.get("pipeline")
        return (
            isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[0], dict)
            and "$changeStream" in pipeline[0]
        )
    if name == "getMore":
        return server.cursors.is_change_stream(cmd.get("getMore"))
    return False


def error_reply(
    server: ServerState, err: MongoError, change_stream: bool
) -> dict[str, Any]:
    reply = err.to_reply()
    labels = list(err.labels)
    if isinstance(err, failpoints.FailPointError):
        change_stream = False  # a fail point's labels are final
    if change_stream:
        if err.code in RESUMABLE_CODES and "ResumableChangeStreamError" not in labels:
            labels.append("ResumableChangeStreamError")
        if err.code in NON_RESUMABLE_CODES and "NonResumableChangeStreamError" not in labels:
            labels.append("NonResumableChangeStreamError")
    if labels:
        reply["errorLabels"] = labels
    reply.update(cluster_time_fields(server))
    if server.metrics is not None:
        server.metrics.command_error(err.code, err.code_name)
    return reply


# mongod's answer to hello while it shuts down (quiesce mode), which drivers take as "this
# server is going away": they mark it unknown and resume/retry elsewhere.
SHUTDOWN_MESSAGE = "The server is in quiesce mode and will shut down"


def shutdown_error(name: str, cmd: dict[str, Any], change_stream: bool) -> MongoError:
    """91 ShutdownInProgress with the labels mongod gives it (resumable for a change stream,
    RetryableWriteError for a retryable write)."""
    labels = failpoints.error_labels(name, cmd, 91, change_stream=change_stream)
    return failpoints.FailPointError(91, SHUTDOWN_MESSAGE, labels)  # labels already final


def live_cursor_ids(server: ServerState) -> set[int]:
    """Every open cursor, of every kind (the registry's)."""
    return set(server.cursors.open)


# The commands that serve readConcern level "snapshot" outside a transaction (snapshot reads,
# 5.0+): the others refuse it before running (ServiceEntryPointCommon, supportsReadConcern).
_SNAPSHOT_READ_COMMANDS = frozenset({"find", "aggregate", "distinct"})


def check_snapshot_read_concern(name: str, cmd: Mapping[str, Any]) -> None:
    """72 InvalidOptions for readConcern level "snapshot" outside a transaction on a command
    that cannot read at a snapshot (writes, listCollections, count...), and for "linearizable"
    on an aggregate that writes ($out, $merge)."""
    rc = cmd.get("readConcern")
    if not isinstance(rc, Mapping):
        return
    level = rc.get("level")
    if level == "linearizable" and name == "aggregate" and write_concern.left_to_dispatch(
        name, cmd
    ):  # DocumentSourceOut / DocumentSourceMerge: supportsReadConcern
        stage = next(iter(cmd["pipeline"][-1]))
        reason = f"{stage} cannot be used with a 'linearizable' read concern level"
    elif level != "snapshot":
        return
    # getMore takes any read concern: its cursor's (allSupportedAndDefaultPermitted)
    elif txn_rules.in_transaction(cmd) or name in _SNAPSHOT_READ_COMMANDS or name == "getMore":
        return
    else:
        reason = "read concern snapshot not supported" if name == "count" else (
            "read concern not supported")
    shown = ", ".join(f'{k}: "{v}"' if isinstance(v, str) else f"{k}: {v}" for k, v in rc.items())
    raise MongoError(72, f"Command {name} does not support {{ readConcern: {{ {shown} }} }} :: "
                     f"caused by :: {reason}")


def _open_snapshot_read(server: ServerState, name: str, cmd: dict[str, Any]) -> Any:
    """A snapshot read outside transactions on the embedded store: the time it reads at
    (transactions.open_snapshot_read), else None."""
    rc = cmd.get("readConcern")
    store = server.store
    if (store is None or name not in _SNAPSHOT_READ_COMMANDS or not isinstance(rc, Mapping)
            or rc.get("level") != "snapshot" or txn_rules.in_transaction(cmd)):
        return None
    return transactions.open_snapshot_read(store, cmd, server.oplog.cluster_time())


def _answer_snapshot_time(reply: Any, at: Any) -> None:
    """mongod answers the time a snapshot read read at: in the cursor (find, aggregate),
    beside the values (distinct)."""
    if not isinstance(reply, dict):
        return
    cursor = reply.get("cursor")
    if isinstance(cursor, dict):
        cursor["atClusterTime"] = at
    else:
        reply["atClusterTime"] = at


async def run_command(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any]
) -> Mapping[str, Any]:
    """Run `cmd` with the handler the server's table gives its name. The upstream's
    forwarding is the upstream table's default entry, and its `forwarding` handlers skip our
    own checks. The reply is a dict, or a forwarded command's upstream reply as it came (a
    RawBSONDocument)."""
    commands: CommandTable = server.commands
    name = next(iter(cmd), "")
    db = cmd.get("$db", "admin")
    # CommandTable.handler, inlined: this runs for every command.
    handler = commands.get(name) if name else None
    if handler is None:
        handler = commands.default if name else None
    if isinstance(handler, Route):
        handler = handler.choose(server, cmd)
    forwarded = bool(commands.forwarding) and handler in commands.forwarding
    # Decided before running: a failed change-stream getMore closes its cursor.
    change_stream = is_change_stream_command(name, cmd, server)
    checked_out = False  # past the checks mongod makes before checking out the session
    wc_here, wc = False, None
    try:
        if server.shutting_down:
            raise shutdown_error(name, cmd, change_stream)
        if handler is not None:  # parsed with the command's generic arguments: before auth
            cluster_time.check_gossiped_cluster_time(server, conn, name, cmd)
        if server.auth is not None and handler is not None:
            server.auth.check(conn, name, cmd, db)  # 13 Unauthorized (cdcserver/auth.py)
        opid = admin.op_started(server, conn, name, cmd, db)  # currentOp shows it meanwhile
        try:
            # Fail points (configureFailPoint) first: block, close the connection, or fail.
            pending = failpoints.before_command(server, conn, name, cmd, db, commands)
            if pending is not None:
                await pending
            if handler is None:
                raise MongoError(59, f"no such command: '{name}'")
            if not forwarded:
                admin.check_api_parameters(name, cmd)  # apiVersion / apiStrict (322, 323)
            arguments.check_session_arguments(cmd)  # lsid, txnNumber...: typed for every one
            if not forwarded:
                arguments.check_read_concern(cmd)  # 9, 14, 2 (an unknown level)
                txn_rules.check_allowed(name, cmd)  # 263, before the session is checked out
                check_snapshot_read_concern(name, cmd)  # 72 outside a transaction
                admin.check_api_version_required(server, conn, name, cmd)  # requireApiVersion
                checked_out = True
            at = _open_snapshot_read(server, name, cmd) if not forwarded else None
            # A DDL command or an aggregate with $out / $merge: its write concern, parsed
            # before it runs (9 FailedToParse), reported after (100 / 79 writeConcernError).
            wc_here = not forwarded and write_concern.left_to_dispatch(name, cmd)
            wc = write_concern.parse(cmd) if wc_here else None
            reply = await handler(server, conn, cmd, db)
            cursor_sessions.note_opened(server, cmd, reply)  # getMore's session checks
            if wc_here and not isinstance(reply, RawBSONDocument):
                reply = write_concern.add_if_unreported(reply, wc)
            if at is not None:
                _answer_snapshot_time(reply, at)
        except MongoError as err:
            admin.op_finished(server, opid, name, cmd, None, err, change_stream)
            raise
        except BaseException:
            admin.op_finished(server, opid, name, cmd, None, None, change_stream)
            raise
        admin.op_finished(server, opid, name, cmd, reply, None, change_stream)
        if server.auth is not None:
            reply = server.auth.after_command(
                conn, name, cmd, reply, lambda: live_cursor_ids(server)
            )
        if isinstance(reply, RawBSONDocument):
            return reply  # forwarded: the upstream's reply as it came (its ok, its times)
    except MongoError as err:
        if checked_out:
            txn_rules.failed_in_transaction(server, name, cmd)
        failpoints.close_if_requested(conn)  # onPrimaryTransactionalWrite ended the connection
        reply = error_reply(server, err, change_stream)
        # mongod waits for the write concern of a failed command too, and says it could not
        return write_concern.add_to_error_reply(reply, wc) if wc_here else reply
    except failpoints.CloseConnection:
        raise  # the listener drops the connection without a reply
    except Exception as exc:
        # A bug or an input no handler anticipated: that request fails; the connection and
        # everyone else go on.
        log.exception("command %r failed", name)
        error = MongoError(1, f"{name} failed: {type(exc).__name__}: {exc}")
        return error_reply(server, error, change_stream)
    # a copy: a handler may answer a retried statement with the very reply it kept from the
    # first run (findAndModify), which a fail point's writeConcernError must not change
    reply = dict(reply)
    failpoints.after_command(server, conn, name, cmd, db, commands, reply)
    reply["ok"] = 1.0
    reply.update(cluster_time_fields(server))
    return reply
