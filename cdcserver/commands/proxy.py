"""Forwarding to the live upstream (`cdcserver serve --upstream URI`).

An application can send all its traffic to the sidecar: change streams are served by
cdcserver, everything else goes to the upstream replica set and its reply comes back
unchanged (the upstream's `ok`, errors, `$clusterTime`, `operationTime`, cursors).

Answered by cdcserver itself (never forwarded):

* change streams: `aggregate` whose first stage is `$changeStream`;
* `getMore` / `killCursors`: cdcserver's one handler of each checks the cursor out of its
  registry; a forwarded cursor's (`ForwardedCursor`) then goes to the member that opened it;
* `hello` / `isMaster` (cdcserver describes itself: drivers see one replica-set primary, the
  sidecar), `ping`, `buildInfo`, `connectionStatus`, `whatsmyuri`, `serverStatus`;
* authentication (`saslStart`, `saslContinue`, `authenticate`, `logout`, `getnonce`):
  cdcserver authenticates to the upstream itself, with the credentials of the upstream URI;
  every forwarded command runs as that user;
* `configureFailPoint` (cdcserver's own fail points, when enabled).

Everything else is forwarded: CRUD, `find` / `aggregate`, DDL, transactions (`lsid`,
`txnNumber`, `autocommit`, `startTransaction` pass through untouched), `listDatabases`,
`listCollections`, sessions commands... A command
runs on the upstream's primary, or on the member its `$readPreference` selects. The client's
`$clusterTime` is not forwarded (its signature is cdcserver's; the upstream's own gossip
applies). Exhaust cursors (`moreToCome`) are not supported.

When the upstream cannot be reached the command fails with HostUnreachable (6) or
NetworkTimeout (89), labelled as mongos labels a network error reaching a shard:
`RetryableWriteError` for a retryable write and a transaction's commit or abort,
`TransientTransactionError` for the other statements of a transaction, so drivers retry.

The upstream mode's table (deployments/upstream.py) lists what cdcserver answers; its default
entry, `forward_command`, forwards every other command, and `route_aggregate` picks per
request between cdcserver's own change-stream handler and forwarding. A forwarded cursor is a
`ForwardedCursor` of the server's cursor registry (cdcserver/cursors/): its owner is the
member that holds it, reaped when idle.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from cdcserver.commands import cursors as change_streams
from cdcserver.commands.base import Handler
from cdcserver.commands.stream_namespace import refusal, stream_collection, upstream_kind
from cdcserver.context import ConnectionState, ServerState
from cdcserver.cursors import FORWARDED, CursorManager, GetMore
from cdcserver.sources.mongo import (
    NOT_PRIMARY_CODES,
    RAW,
    UpstreamError,
    UpstreamOplog,
    upstream_unavailable,
)
from pipeline_stages import bson_bytes
from pipeline_stages.spec import is_change_stream_aggregate

# Answered by cdcserver itself (the upstream mode's table: deployments/upstream.py).
LOCAL_COMMANDS = frozenset(
    {
        "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "connectionStatus",
        "whatsmyuri", "serverStatus", "configureFailPoint",
        "saslStart", "saslContinue", "authenticate", "logout", "getnonce",
    }
)
# Fields of a client's command that are not forwarded.
_DROPPED_FIELDS = frozenset({"$db", "$clusterTime"})


def upstream_of(server: ServerState) -> UpstreamOplog | None:
    oplog = server.oplog
    return oplog if isinstance(oplog, UpstreamOplog) else None


@dataclass(eq=False)
class ForwardedCursor:
    """A cursor the upstream holds (a forwarded find / aggregate...): its getMore and
    killCursors go to `owner`, the member that opened it."""

    id: int
    ns: str
    owner: Any  # the upstream member's address
    source: UpstreamOplog  # whose client reaches it
    registry: CursorManager  # the server's (forward notes the cursors a reply opens)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    awaited_s: float = 0.0
    finished: bool = False  # the member said it is exhausted (or failed its getMore)
    kind = FORWARDED

    @property
    def done(self) -> bool:
        return self.finished

    async def get_more_reply(self, more: GetMore) -> RawBSONDocument:
        """The member's reply as it came (its ok, its times)."""
        reply = await forward(self.source, more.cmd, more.db, self.registry, self.owner)
        cursor = reply.get("cursor") if reply.get("ok") == 1 else None
        self.finished = not isinstance(cursor, Mapping) or not cursor.get("id")
        return reply

    async def kill(self, cmd: Mapping[str, Any], db: str) -> bool:
        reply = await forward(self.source, {**cmd, "cursors": [Int64(self.id)]}, db,
                              self.registry, self.owner)
        return reply.get("ok") == 1 and self.id in (reply.get("cursorsKilled") or [])

    def close(self) -> None:
        pass  # the upstream reaps its own cursor; this is only where it lives


class _RegistryAddresses:
    """Which upstream member holds each forwarded cursor (its getMore must go there): the
    server's registry's forwarded cursors."""

    def __init__(self, cursors: CursorManager, source: UpstreamOplog) -> None:
        self.cursors = cursors
        self.source = source

    def note(self, reply: RawBSONDocument, address: Any) -> None:
        cursor = reply.get("cursor") if "cursor" in reply else None
        if not isinstance(cursor, Mapping):
            return
        cid = cursor.get("id")
        if isinstance(cid, int) and cid:
            ns = cursor.get("ns")
            self.cursors.add(ForwardedCursor(int(cid), ns if isinstance(ns, str) else "",
                                             address, self.source, self.cursors))

    def get(self, cursor_id: Any) -> Any:
        cursor = self.cursors.find(cursor_id)
        if not isinstance(cursor, ForwardedCursor):  # the registry's other kinds, or None
            return None
        cursor.last_used = time.monotonic()
        return cursor.owner

    def forget(self, cursor_id: Any) -> None:
        cursor = self.cursors.find(cursor_id)
        if cursor is not None and cursor.kind == FORWARDED:
            self.cursors.kill(cursor_id)


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
    source: UpstreamOplog, cmd: Mapping[str, Any], db: str,
    cursors: CursorManager, address: Any = None,
) -> RawBSONDocument:
    """Run `cmd` on the upstream (on the member at `address`, when given: a forwarded
    cursor's); its reply as the upstream's bytes. A cursor it opens is noted in `cursors`
    (the server's registry) as a forwarded cursor."""
    from pymongo.errors import PyMongoError

    name = next(iter(cmd))
    spec = {k: v for k, v in cmd.items() if k not in _DROPPED_FIELDS}
    client = source.async_client()
    addresses = _RegistryAddresses(cursors, source)
    if address is None and name in ("getMore", "killCursors"):
        target = cmd.get(name) if name == "getMore" else next(iter(cmd.get("cursors") or []), None)
        address = addresses.get(target)
    try:
        try:
            reply, server = await _run_on_upstream(client, cmd, spec, db, address)
        except UnicodeEncodeError:
            # A string that is not UTF-8 (PyMongo's encoder refuses it, before anything is
            # sent, and drops that connection): again, its sub-documents sent as their bytes.
            reply, server = await _run_on_upstream(
                client, cmd, bson_bytes.raw_subdocuments(spec), db, address)
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


async def _run_on_upstream(
    client: Any, cmd: Mapping[str, Any], spec: Mapping[str, Any], db: str, address: Any
) -> tuple[RawBSONDocument, Any]:
    from pymongo.errors import NotPrimaryError

    name = next(iter(cmd))
    server = await client._select_server(  # noqa: SLF001
        _selector(cmd), None, name, address=address
    )
    checkout = client._checkout(server, None)  # noqa: SLF001
    async with checkout as conn:
        # RAW codec options: the reply is the upstream's bytes
        reply: RawBSONDocument = await conn.command(
            db, spec, codec_options=RAW, check=False, session=None, client=None
        )
        code = reply.get("code") if reply.get("ok") != 1 else None
        if code in NOT_PRIMARY_CODES:
            # Tell the topology, as a driver does, so the next command finds the primary.
            await checkout.handle(
                NotPrimaryError, NotPrimaryError(str(reply.get("errmsg")), dict(reply))
            )
    return reply, server


async def forward_command(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The upstream mode's default entry: the command runs on the upstream, whose reply comes
    back as it is."""
    reply = await forward(_upstream(server), cmd, db, server.cursors)
    # Not a dict: the upstream's RawBSONDocument, which registry.run_command passes on as it
    # came (it tests for RawBSONDocument). The shared Handler type says dict; saying Mapping
    # there would retype every handler wrapper.
    return cast("dict[str, Any]", reply)


def _upstream(server: ServerState) -> UpstreamOplog:
    source = upstream_of(server)
    if source is None:  # a table mix-up, never a client's doing
        raise UpstreamError(59, "this cdcserver has no upstream to forward to")
    return source


# -- routes: which handler answers, per request -----------------------------------------------


def route_aggregate(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    """A change stream is cdcserver's; any other aggregate is the upstream's."""
    return upstream_change_stream if is_change_stream_aggregate(cmd) else forward_command


async def upstream_change_stream(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A change stream served by cdcserver, refused first as the upstream refuses one on its
    views and (without rawData) its viewless time-series collections (stream_namespace.py):
    the upstream's catalog is read when a collection stream opens, as mongod reads its own."""
    coll = stream_collection(cmd)
    if coll is not None:
        kind = await upstream_kind(_upstream(server).async_client(), db, coll)
        error = refusal(kind, db, coll, server.release, cmd.get("rawData") is True)
        if error is not None:
            raise error
    return await change_streams.aggregate(server, conn, cmd, db)


# Handlers that hand the command to the upstream as it is: cdcserver's own argument checks
# (API parameters, transaction rules) are the upstream's to make.
FORWARDING: frozenset[Handler] = frozenset({forward_command})
# The upstream mode's per-request entries (deployments/upstream.py puts them in its table).
ROUTES = {
    "aggregate": route_aggregate,
}
