"""`aggregate` with `$changeStream`, and the one `getMore` / `killCursors` of every cursor,
in every mode.

getMore checks a cursor of any kind out of the server's registry (cdcserver/cursors/: 43, 13,
143) and asks it for its reply (`Cursor.get_more_reply`: a change stream's batch, a query
result's, an oplog find's, or the holder's reply for a cursor held elsewhere); the cursor is
closed when that fails or when it is done. killCursors takes each cursor out of the registry
and kills it (`Cursor.kill`: a cursor held elsewhere asks its holder).
"""

from __future__ import annotations

from typing import Any, cast

from bson.int64 import Int64

from cdcserver.commands import cursor_sessions, search
from cdcserver.commands.arguments import is_string, wrong_type
from cdcserver.commands.base import Handler, family, int_arg
from cdcserver.context import ConnectionState, ServerState
from cdcserver.cursors import (
    CHANGE_STREAM,
    FORWARDED,
    ChangeStreamCursor,
    Cursor,
    GetMore,
    cursor_reply,
)
from cdcserver.cursors.change_stream import prefetch_after
from pipeline_stages.errors import MongoError
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import (
    check_requires_change_stream,
    is_change_stream_aggregate,
    parse_aggregate,
)

TABLE: dict[str, Handler] = {}
command = family(TABLE)


@command("aggregate")
async def aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """aggregate with a `$changeStream` first stage (queries.aggregate answers the others)."""
    if not is_change_stream_aggregate(cmd):
        search.check_search_stages(cmd.get("pipeline"))  # 31082, as the pipeline is parsed
        check_requires_change_stream(cmd.get("pipeline"))
        raise MongoError(
            40324 if cmd.get("pipeline") else 2,
            "cdcserver only answers aggregate with a $changeStream first stage",
        )
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, dict):
        raise MongoError(
            9,
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    batch_size = int_arg(cursor_doc, "batchSize", "aggregate.cursor")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, "BSON field 'batchSize' value must be >= 0, actual value "
                         f"'{batch_size}'")
    spec = parse_aggregate(cmd, db, server.release)
    log = server.oplog
    start = spec.requested_start()
    if start is None:
        start = log.start_for_new_stream()
    group, pipeline = server.cursors.hub.group_for(
        spec,
        start,
        log,
        lambda: ChangeStreamPipeline(spec, start, history=log, images=server.images),
    )
    pipeline.check_history(log.oldest_entry())
    if spec.scope == "collection":
        ns = f"{db}.{spec.coll}"
    else:
        ns = f"{db}.$cmd.aggregate"
    cursor = ChangeStreamCursor(server.cursors.new_id(), ns, pipeline, group)
    group.members.append(cursor)
    try:
        batch = await cursor.first_batch(batch_size)
    except MongoError:
        cursor.close()
        raise
    if batch.invalidated:
        cursor.close()
    else:
        server.cursors.add(cursor)
        prefetch_after(cursor, batch_size, len(batch.events), lambda: server.shutting_down)
    server.events_delivered += len(batch.events)
    return {"cursor": cursor_reply(cursor.id, ns, batch, first=True)}


def awaits_data(cursor: Cursor) -> bool | None:
    """Whether a getMore on `cursor` may wait for results (mongod's ClientCursor::isAwaitData):
    a change stream's always, a tailable awaitData find's (a capped collection's, the
    oplog's); None for a cursor held elsewhere, whose holder decides."""
    if cursor.kind == CHANGE_STREAM:
        return True
    if cursor.kind == FORWARDED:
        return None
    return getattr(cursor, "await_data", False) is True


# getmore_cmd.cpp validateMaxTimeMS (a pin check: the cursor stays open); mongos's
# cluster_find.cpp answers with its own text, and its failed pin kills the cursor.
MAX_TIME_NOT_AWAIT_DATA = "cannot set maxTimeMS on getMore command for a non-awaitData cursor"
ROUTER_MAX_TIME_NOT_AWAIT_DATA = (
    "maxTimeMS can only be used with getMore for tailable, awaitData cursors"
)


@command("getMore")
async def get_more(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongod's getMore, for a cursor of any kind."""
    return await _get_more(server, conn, cmd, db, router=False)


async def router_get_more(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongos's getMore (the sharded front's): as mongod's, but `maxTimeMS` on a cursor that
    is not awaitData is refused with mongos's text, and the cursor is gone after it."""
    return await _get_more(server, conn, cmd, db, router=True)


async def _get_more(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str, router: bool
) -> dict[str, Any]:
    cursor_id = cmd.get("getMore")
    if not isinstance(cursor_id, int) or isinstance(cursor_id, bool):
        from pipeline_stages.value_string import type_name

        raise MongoError(
            14,
            f"BSON field 'getMore.getMore' is the wrong type '{type_name(cursor_id)}', "
            "expected type 'long'",
        )
    coll = cmd.get("collection")
    if coll is None:
        raise MongoError(40414, "BSON field 'getMore.collection' is missing but a required field")
    if not is_string(coll):
        raise wrong_type("getMore.collection", coll, "string")
    more = GetMore(int_arg(cmd, "batchSize", "getMore"), int_arg(cmd, "maxTimeMS", "getMore"),
                   cmd, db, lambda: server.shutting_down)
    cursor = server.cursors.check_out(  # 43, 143, the session's 50736-50741, 13
        int(cursor_id), f"{db}.{coll}",
        lambda c: None if c.kind == FORWARDED and not router else cursor_sessions.check(
            c, cmd, router))
    if more.max_time_ms is not None and awaits_data(cursor) is False:
        server.cursors.check_in(cursor)
        if router:
            server.cursors.kill(cursor.id)
            raise MongoError(2, ROUTER_MAX_TIME_NOT_AWAIT_DATA)
        raise MongoError(2, MAX_TIME_NOT_AWAIT_DATA)
    try:
        reply = await cursor.get_more_reply(more)
    except MongoError as e:
        if router and cursor.kind == FORWARDED:
            # mongos's failed pin kills its cursor and, through it, the shard's (killCursors):
            # the shard may have kept its own (a pin check, a fail point before the command)
            await _kill_where_held(server, cursor.id, coll, db)
        else:
            server.cursors.kill(cursor.id)  # getMore's cursorDeleter: a failed cursor closes
        if router and e.code == 2 and e.errmsg == MAX_TIME_NOT_AWAIT_DATA:
            # a shard's cursor read through the front: mongos checks its own cursor
            raise MongoError(2, ROUTER_MAX_TIME_NOT_AWAIT_DATA) from None
        raise
    finally:
        server.cursors.check_in(cursor)
        conn.awaited_s = cursor.awaited_s  # not the getMore's own work (slow log, latency)
    if cursor.done:
        server.cursors.kill(cursor.id)
    if cursor.kind == CHANGE_STREAM:
        server.events_delivered += len(reply["cursor"]["nextBatch"])
    # A cursor held elsewhere gives its holder's reply as it came (a RawBSONDocument, which
    # run_command passes on untouched): a Mapping that `Handler`'s dict does not describe.
    return cast("dict[str, Any]", reply)


async def _kill_where_held(server: ServerState, cursor_id: int, coll: str, db: str) -> None:
    """Kill a cursor here and where it is held, as killCursors does (its holder's error, if
    any, does not replace the getMore's)."""
    try:
        await server.cursors.kill_requested(
            cursor_id, {"killCursors": coll, "cursors": [Int64(cursor_id)]}, db)
    except MongoError:
        pass


@command("killCursors")
async def kill_cursors(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    ids = cmd.get("cursors")
    if not isinstance(ids, list):
        raise MongoError(40414, "BSON field 'killCursors.cursors' is missing but a required field")
    for i, cid in enumerate(ids):
        if not isinstance(cid, int) or isinstance(cid, bool):
            from pipeline_stages.value_string import type_name

            raise MongoError(
                14,
                f"BSON field 'killCursors.cursors.{i}' is the wrong type '{type_name(cid)}', "
                "expected type 'long'",
            )
    killed: list[Int64] = []
    not_found: list[Int64] = []
    for cid in ids:  # every kind of cursor is in the one registry
        found = await server.cursors.kill_requested(int(cid), cmd, db)
        (killed if found else not_found).append(Int64(int(cid)))
    return {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
    }
