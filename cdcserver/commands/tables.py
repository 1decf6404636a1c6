"""What the serving modes' command tables are made of: the command families, and the helpers
that put them together.

Each command family lists its own handlers in its `TABLE` (handshake, auth, admin, cursors,
writes, queries, ddl, transactions, bulk_write, cluster_parameters); `OWN` is their union for a
mode that answers its own commands. Each mode's table is built next to the mode it serves,
from these, in `cdcserver/deployments/` (`recorded.RECORDED`, `embedded.EMBEDDED`,
`upstream.UPSTREAM`, `shard.SHARD`, `cluster.CLUSTER`, `sidecar.SIDECAR`,
`recorded_shards.RECORDED_SHARDS`): where two families answer the same name, the mode says
which one it uses.
`tests/data/command_tables.json` lists every mode's table (name -> handler) and
`tests/server/test_command_tables.py` checks it, so a change of registration shows up as a diff.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdcserver.commands import (
    admin,
    auth,
    bulk_write,
    cluster_parameters,
    cursors,
    ddl,
    failpoints,
    fcv,
    handshake,
    queries,
    search,
    transactions,
    user_management,
    writes,
)
from cdcserver.context import CommandTable, Handler, Route, qualified_name


def merge(*families: Mapping[str, Handler]) -> dict[str, Handler]:
    """The union of families that must not overlap: a name two families answer is decided
    explicitly by the mode, never by the order of a merge."""
    out: dict[str, Handler] = {}
    for fam in families:
        for name, handler in fam.items():
            if name in out and out[name] is not handler:
                raise ValueError(f"{name!r} is answered by two families: choose in the mode")
            out[name] = handler
    return out


def without(family: Mapping[str, Handler], *names: str) -> dict[str, Handler]:
    return {k: v for k, v in family.items() if k not in names}


# Names more than one family answers; each mode's table says whose it takes.
CHOSEN = ("aggregate", "listCollections", "listDatabases")

# What a mode that answers its own commands serves, whatever its source.
OWN = merge(
    without(handshake.TABLE, *CHOSEN),  # hello, ping, buildInfo, whatsmyuri, ...
    auth.TABLE,  # saslStart, saslContinue, authenticate, logout, getnonce
    admin.TABLE,  # serverStatus, currentOp, explain, listCommands, getParameter, ...
    failpoints.TABLE,  # configureFailPoint, testVersion2 (test commands)
    without(cursors.TABLE, *CHOSEN),  # getMore, killCursors (every kind of cursor)
    writes.TABLE,  # insert, update, delete, findAndModify
    without(queries.TABLE, *CHOSEN),  # find, count, distinct
    bulk_write.TABLE,  # bulkWrite
    without(ddl.TABLE, *CHOSEN),  # create, drop, createIndexes, collMod, ...
    transactions.TABLE,  # commitTransaction, abortTransaction, endSessions, killSessions...
    user_management.TABLE,  # createUser, updateUser, dropUser, dropAllUsersFromDatabase
    cluster_parameters.TABLE,  # setClusterParameter, getClusterParameter (the store's; else 115)
    search.TABLE,  # createSearchIndexes, ... (31082: no search service)
    fcv.TABLE,  # setFeatureCompatibilityVersion
)

# The embedded store's commands whose handlers need the store before anything else: with a
# recorded oplog, each answers 115 (transactions.needs_store), as its handler would.
STORE_ONLY = (
    "abortTransaction", "collMod", "commitTransaction", "create", "createIndexes",
    "deleteIndexes", "distinct", "drop", "dropDatabase", "dropIndexes", "insert", "listIndexes",
    "renameCollection",
)


def describe(table: CommandTable) -> dict[str, str]:
    """A table as name -> the handler's qualified name (`Route(...)` for a per-request entry,
    `"*"` for the default entry), sorted by name: what tests/data/command_tables.json holds."""
    out = {
        name: repr(entry) if isinstance(entry, Route) else qualified_name(entry)
        for name, entry in sorted(table.items())
    }
    if table.default is not None:
        out["*"] = qualified_name(table.default)
    return out
