"""The command table of each server mode, assembled here and nowhere else.

A mode's table maps a command name to its handler. Each command family lists its own handlers
in its `TABLE` (handshake, auth, admin, cursors, writes, queries, ddl, transactions,
bulk_write); a mode takes the families it serves and, where two families answer the same name,
says here which one it uses. `tests/data/command_tables.json` lists every mode's table
(name -> handler) and `tests/test_command_tables.py` checks it, so a change of registration
shows up as a diff.

- `RECORDED` (a recorded oplog file, `serve --oplog`): listCollections / listDatabases from the
  oplog's namespaces (handshake.py); aggregate is queries.aggregate (a change stream, the oplog,
  `$currentOp`); the commands that need the store first thing answer 115 (`needs_store`).
- `EMBEDDED` (the embedded store, `serve`): listCollections / listDatabases / aggregate of the
  store (ddl.py: a change stream on a view is refused).
- `UPSTREAM` (a live replica set, `serve --upstream`): only `proxy.LOCAL_COMMANDS` are answered
  here; aggregate, getMore and killCursors are routed per request (`proxy.ROUTES`); every other
  command is forwarded (the default entry, `"*"` in the listing).
- the sharded front (`serve --shards N`): `cdcserver/sharding/front.py` `FRONT_COMMANDS`,
  mongos's own commands, and every other name of `EMBEDDED` forwarded to a shard (front.py
  imports the registry, which imports this module: its table is built there, from `EMBEDDED`).

A shard of the embedded cluster runs `EMBEDDED` plus `appendOplogNote`
(`cdcserver/sharding/shard_commands.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cdcserver.commands import (
    admin,
    auth,
    bulk_write,
    cursors,
    ddl,
    failpoints,
    handshake,
    proxy,
    queries,
    transactions,
    user_management,
    writes,
)
from cdcserver.commands.base import Handler
from cdcserver.context import ServerState

Choose = Callable[[ServerState, Mapping[str, Any]], Handler]


class Route:
    """A table entry that picks its handler per request (the upstream mode's aggregate: a
    change stream is answered here, any other aggregate forwarded)."""

    def __init__(self, choose: Choose) -> None:
        self.choose = choose

    def __repr__(self) -> str:
        return f"Route({_qualified(self.choose)})"


class CommandTable(dict[str, Any]):
    """Command name -> handler (or `Route`) of one server mode.

    `default` answers every other (non-empty) name; `forwarding` are the handlers that hand
    the command on as it is (to an upstream), for which cdcserver makes none of its own
    argument checks; `known` the names counted by name in serverStatus (others: <UNKNOWN>).
    """

    def __init__(
        self, mode: str, handlers: Mapping[str, Any], *, default: Handler | None = None,
        forwarding: Iterable[Handler] = (), known: Iterable[str] | None = None,
    ) -> None:
        super().__init__(handlers)
        self.mode = mode
        self.default = default
        self.forwarding = frozenset(forwarding)
        self.known = frozenset(self if known is None else known)

    def handler(self, server: ServerState, name: str, cmd: Mapping[str, Any]) -> Handler | None:
        """Who answers `cmd` (None: no such command); registry.run_command inlines it."""
        if not name:
            return None
        entry = self.get(name, self.default)
        if isinstance(entry, Route):
            return entry.choose(server, cmd)
        return entry

    @classmethod
    def of(cls, table: Mapping[str, Any]) -> CommandTable:
        """A mode's table given as a plain dict (a sharded cluster's: every name its own)."""
        if isinstance(table, CommandTable):
            return table
        cached = _PLAIN.get(id(table))
        if cached is not None and cached[0] is table:
            return cached[1]
        out = cls("custom", table)
        _PLAIN[id(table)] = (table, out)
        return out


# Plain dicts already made tables (kept alive with their table: the ids stay theirs).
_PLAIN: dict[int, tuple[Mapping[str, Any], CommandTable]] = {}


def _merge(*families: Mapping[str, Handler]) -> dict[str, Handler]:
    """The union of families that must not overlap: a name two families answer is decided
    explicitly by the mode, never by the order of a merge."""
    out: dict[str, Handler] = {}
    for fam in families:
        for name, handler in fam.items():
            if name in out and out[name] is not handler:
                raise ValueError(f"{name!r} is answered by two families: choose in the mode")
            out[name] = handler
    return out


def _without(family: Mapping[str, Handler], *names: str) -> dict[str, Handler]:
    return {k: v for k, v in family.items() if k not in names}


# Names more than one family answers; each mode below says whose it takes.
_CHOSEN = ("aggregate", "listCollections", "listDatabases")

# What a mode that answers its own commands serves, whatever its source.
_OWN = _merge(
    _without(handshake.TABLE, *_CHOSEN),  # hello, ping, buildInfo, whatsmyuri, ...
    auth.TABLE,  # saslStart, saslContinue, authenticate, logout, getnonce
    admin.TABLE,  # serverStatus, currentOp, explain, listCommands, getParameter, ...
    failpoints.TABLE,  # configureFailPoint, testVersion2 (test commands)
    _without(cursors.TABLE, *_CHOSEN),  # getMore, killCursors (every kind of cursor)
    writes.TABLE,  # insert, update, delete, findAndModify
    _without(queries.TABLE, *_CHOSEN),  # find, count, distinct
    bulk_write.TABLE,  # bulkWrite
    _without(ddl.TABLE, *_CHOSEN),  # create, drop, createIndexes, collMod, ...
    transactions.TABLE,  # commitTransaction, abortTransaction, endSessions, killSessions...
    user_management.TABLE,  # createUser, updateUser, dropUser, dropAllUsersFromDatabase
)

# The embedded store's commands whose handlers need the store before anything else: with a
# recorded oplog, each answers 115 (transactions.needs_store), as its handler would.
_STORE_ONLY = (
    "abortTransaction", "collMod", "commitTransaction", "create", "createIndexes",
    "deleteIndexes", "distinct", "drop", "dropDatabase", "dropIndexes", "insert", "listIndexes",
    "renameCollection",
)

RECORDED = CommandTable("recorded", {
    **_OWN,
    **dict.fromkeys(_STORE_ONLY, transactions.needs_store),
    "aggregate": queries.aggregate,  # a change stream, the oplog, $currentOp / $collStats
    "listCollections": handshake.list_collections,  # the oplog's namespaces
    "listDatabases": handshake.list_databases,
})

EMBEDDED = CommandTable("embedded", {
    **_OWN,
    "aggregate": ddl.aggregate_refusing_views,  # then queries.aggregate
    "listCollections": ddl.list_collections,  # the store's collections and views
    "listDatabases": ddl.list_databases,
})

UPSTREAM = CommandTable(
    "upstream",
    {
        **{name: EMBEDDED[name] for name in sorted(proxy.LOCAL_COMMANDS)},
        **{name: Route(choose) for name, choose in proxy.ROUTES.items()},
    },
    default=proxy.forward_command,  # everything else runs on the upstream
    forwarding=proxy.FORWARDING,
    known=EMBEDDED,
)

MODES: dict[str, CommandTable] = {t.mode: t for t in (RECORDED, EMBEDDED, UPSTREAM)}


def for_state(state: ServerState) -> CommandTable:
    """The table of the mode a server state is in (its source decides)."""
    if state.store is not None:
        return EMBEDDED
    if proxy.upstream_of(state) is not None:
        return UPSTREAM
    return RECORDED


def _qualified(handler: Any) -> str:
    handler = getattr(handler, "__wrapped__", handler)  # a front's clock-gossip wrapper
    return f"{handler.__module__}.{handler.__qualname__}"


def describe(table: Mapping[str, Any]) -> dict[str, str]:
    """A table as name -> the handler's qualified name (`Route(...)` for a per-request entry,
    `"*"` for the default entry), sorted by name: what tests/data/command_tables.json holds."""
    table = CommandTable.of(table)
    out = {
        name: repr(entry) if isinstance(entry, Route) else _qualified(entry)
        for name, entry in sorted(table.items())
    }
    if table.default is not None:
        out["*"] = _qualified(table.default)
    return out
