"""Forwarding to the live upstream (`cdcserver serve --upstream URI`).

An application can send all its traffic to the sidecar: change streams are served by
cdcserver, everything else goes to the upstream replica set and its reply comes back
unchanged (the upstream's `ok`, errors, `$clusterTime`, `operationTime`, cursors).

Answered by cdcserver itself (never forwarded):

* change streams: `aggregate` whose first stage is `$changeStream`, and `getMore` /
  `killCursors` on cdcserver's own change-stream cursors;
* `hello` / `isMaster` (cdcserver describes itself: drivers see one replica-set primary, the
  sidecar), `ping`, `buildInfo`, `connectionStatus`, `whatsmyuri`, `serverStatus`;
* authentication (`saslStart`, `saslContinue`, `authenticate`, `logout`, `getnonce`):
  cdcserver authenticates to the upstream itself, with the credentials of the upstream URI;
  every forwarded command runs as that user;
* `configureFailPoint` (cdcserver's own fail points, when enabled).

Everything else is forwarded: CRUD, `find` / `aggregate` / their `getMore` and
`killCursors`, DDL, transactions (`lsid`, `txnNumber`, `autocommit`, `startTransaction`
pass through untouched), `listDatabases`, `listCollections`, sessions commands... A command
runs on the upstream's primary, or on the member its `$readPreference` selects; the
`getMore` / `killCursors` of a forwarded cursor go to the member that opened it. The client's
`$clusterTime` is not forwarded (its signature is cdcserver's; the upstream's own gossip
applies). Exhaust cursors (`moreToCome`) are not supported.

When the upstream cannot be reached the command fails with HostUnreachable (6) or
NetworkTimeout (89), labelled as mongos labels a network error reaching a shard:
`RetryableWriteError` for a retryable write and a transaction's commit or abort,
`TransientTransactionError` for the other statements of a transaction, so drivers retry.

The registry routes a command here when `COMMANDS["$proxy"].forwards(server, name, cmd)`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from cdcserver.commands.registry import COMMANDS, command
from cdcserver.sources.mongo import (
    NOT_PRIMARY_CODES,
    RAW,
    UpstreamError,
    UpstreamOplog,
    upstream_unavailable,
)
from pipeline_stages.spec import is_change_stream_aggregate

# Answered by cdcserver itself.
LOCAL_COMMANDS = frozenset(
    {
        "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "connectionStatus",
        "whatsmyuri", "serverStatus", "configureFailPoint",
        "saslStart", "saslContinue", "authenticate", "logout", "getnonce",
    }
)
# Fields of a client's command that are not forwarded.
_DROPPED_FIELDS = frozenset({"$db", "$clusterTime"})
_CURSOR_ADDRESSES_MAX = 100_000


def upstream_of(server: Any) -> UpstreamOplog | None:
    log = getattr(server, "log", None)
    return log if isinstance(log, UpstreamOplog) else None


def _own_cursor(server: Any, cursor_id: Any) -> bool:
    return isinstance(cursor_id, int) and cursor_id in server.cursors.cursors


def forwards(server: Any, name: str, cmd: Mapping[str, Any]) -> bool:
    """Whether `cmd` goes to the upstream (only when the source is a live upstream)."""
    if upstream_of(server) is None or not name or name in LOCAL_COMMANDS:
        return False
    if name == "aggregate":
        return not is_change_stream_aggregate(cmd)
    if name == "getMore":
        return not _own_cursor(server, cmd.get("getMore"))
    if name == "killCursors":
        ids = cmd.get("cursors")
        return not (isinstance(ids, list) and ids and all(_own_cursor(server, i) for i in ids))
    return True


class _CursorAddresses:
    """Which upstream member holds each forwarded cursor (its getMore must go there)."""

    def __init__(self) -> None:
        self.table: OrderedDict[int, Any] = OrderedDict()

    def note(self, reply: RawBSONDocument, address: Any) -> None:
        cursor = reply.get("cursor") if "cursor" in reply else None
        if not isinstance(cursor, Mapping):
            return
        cid = cursor.get("id")
        if isinstance(cid, int) and cid:
            self.table[int(cid)] = address
            self.table.move_to_end(int(cid))
            while len(self.table) > _CURSOR_ADDRESSES_MAX:
                self.table.popitem(last=False)

    def get(self, cursor_id: Any) -> Any:
        return self.table.get(cursor_id) if isinstance(cursor_id, int) else None

    def forget(self, cursor_id: Any) -> None:
        if isinstance(cursor_id, int):
            self.table.pop(cursor_id, None)


def _addresses_of(source: UpstreamOplog) -> _CursorAddresses:
    table = getattr(source, "_proxy_cursors", None)
    if table is None:
        table = _CursorAddresses()
        source._proxy_cursors = table  # type: ignore[attr-defined]
    return table


def _selector(cmd: Mapping[str, Any]) -> Any:
    """The upstream member a command runs on: its `$readPreference`, else the primary."""
    from pymongo.read_preferences import make_read_preference, read_pref_mode_from_name
    from pymongo.server_selectors import writable_server_selector

    pref = cmd.get("$readPreference")
    if not isinstance(pref, Mapping) or pref.get("mode") in (None, "primary"):
        return writable_server_selector
    try:
        mode = read_pref_mode_from_name(pref["mode"])
        return make_read_preference(
            mode, pref.get("tags"), pref.get("maxStalenessSeconds", -1)
        )
    except (KeyError, ValueError, TypeError):
        return writable_server_selector


def _error_labels(cmd: Mapping[str, Any]) -> list[str]:
    """The labels mongos gives a network error reaching a shard (error_labels.cpp): the
    commit or abort of a transaction and a retryable write may be retried; any other
    statement of a transaction retries the whole transaction."""
    name = next(iter(cmd), "")
    if name in ("commitTransaction", "abortTransaction"):
        return ["RetryableWriteError"]
    if cmd.get("autocommit") is False:
        return ["TransientTransactionError"]
    if "txnNumber" in cmd:
        return ["RetryableWriteError"]
    return []


async def forward(
    source: UpstreamOplog, cmd: Mapping[str, Any], db: str
) -> RawBSONDocument:
    """Run `cmd` on the upstream; its reply as the upstream's bytes."""
    from pymongo.errors import NotPrimaryError, PyMongoError

    name = next(iter(cmd))
    spec = {k: v for k, v in cmd.items() if k not in _DROPPED_FIELDS}
    client = source.async_client()
    addresses = _addresses_of(source)
    address = None
    if name in ("getMore", "killCursors"):
        target = cmd.get(name) if name == "getMore" else next(iter(cmd.get("cursors") or []), None)
        address = addresses.get(target)
    try:
        server = await client._select_server(  # noqa: SLF001
            _selector(cmd), None, name, address=address
        )
        checkout = client._checkout(server, None)  # noqa: SLF001
        async with checkout as conn:
            reply = await conn.command(
                db, spec, codec_options=RAW, check=False, session=None, client=None
            )
            code = reply.get("code") if reply.get("ok") != 1 else None
            if code in NOT_PRIMARY_CODES:
                # Tell the topology, as a driver does, so the next command finds the primary.
                await checkout.handle(
                    NotPrimaryError, NotPrimaryError(str(reply.get("errmsg")), dict(reply))
                )
    except PyMongoError as exc:
        err = upstream_unavailable(f"forwarding {name}", exc)
        err.labels.extend(_error_labels(cmd))
        raise err from None
    if name == "getMore":
        cursor = reply.get("cursor")
        if not isinstance(cursor, Mapping) or not cursor.get("id"):
            addresses.forget(cmd.get("getMore"))
    elif name == "killCursors":
        for cid in cmd.get("cursors") or []:
            addresses.forget(cid)
    else:
        addresses.note(reply, server.description.address)
    return reply


@command("$proxy")
async def proxy_command(server, conn, cmd, db):
    source = upstream_of(server)
    if source is None:
        raise UpstreamError(59, f"no such command: '{next(iter(cmd), '')}'")
    name = next(iter(cmd))
    if name == "killCursors":
        ids = cmd.get("cursors")
        if isinstance(ids, list) and any(_own_cursor(server, i) for i in ids):
            return await _kill_mixed(server, conn, cmd, db, source, ids)
    return await forward(source, cmd, db)


async def _kill_mixed(server, conn, cmd, db, source, ids):
    """killCursors naming both cdcserver's change-stream cursors and forwarded ones."""
    own = [i for i in ids if _own_cursor(server, i)]
    other = [i for i in ids if not _own_cursor(server, i)]
    local = await COMMANDS["killCursors"](server, conn, {**cmd, "cursors": own}, db)
    remote = await forward(source, {**cmd, "cursors": other}, db)
    if remote.get("ok") != 1:
        return remote
    merged = dict(local)
    for key in ("cursorsKilled", "cursorsNotFound", "cursorsAlive", "cursorsUnknown"):
        merged[key] = [*local.get(key, []), *(Int64(i) for i in remote.get(key, []))]
    return merged


proxy_command.forwards = forwards  # type: ignore[attr-defined]


async def run_command_with_proxy(server, conn, cmd):
    """`registry.run_command` with the routing the registry hook adds (for tests run before
    the hook is in the registry): a forwarded command's reply is returned unchanged."""
    from cdcserver.commands.registry import run_command

    name = next(iter(cmd), "")
    if forwards(server, name, cmd):
        from cdcserver.commands.registry import cluster_time_fields, error_reply
        from pipeline_stages.errors import MongoError

        try:
            reply = await proxy_command(server, conn, cmd, cmd.get("$db", "admin"))
        except MongoError as err:
            return error_reply(server, err, False)
        if not isinstance(reply, RawBSONDocument):  # cdcserver's own (mixed killCursors)
            reply["ok"] = 1.0
            reply.update(cluster_time_fields(server))
        return reply
    return await run_command(server, conn, cmd)
