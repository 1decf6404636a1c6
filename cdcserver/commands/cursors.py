"""`aggregate` with `$changeStream`, and the one `getMore` / `killCursors` of every cursor.

getMore and killCursors find a cursor of any kind in the server's registry (cdcserver/cursors.py):
a change stream's batch is read here; a query result's or an oplog find's comes from its own
`get_more_reply`. Checking the cursor out (43, 13, 143), closing it when it fails or is done, and
the killCursors reply are the same for every kind.
"""

from __future__ import annotations

import asyncio
import time

from bson.int64 import Int64

from cdcserver.commands.arguments import is_string, wrong_type
from cdcserver.commands.base import Handler, family, int_arg
from cdcserver.cursors import (
    CHANGE_STREAM,
    DEFAULT_BATCH_SIZE,
    ChangeStreamCursor,
    cursor_reply,
    kind_of,
)
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
async def aggregate(server, conn, cmd, db):
    """aggregate with a `$changeStream` first stage (queries.aggregate answers the others)."""
    if not is_change_stream_aggregate(cmd):
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
    spec = parse_aggregate(cmd, db)
    log = server.log
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
        _prefetch_after(server, cursor, batch_size, len(batch.events))
    server.events_delivered += len(batch.events)
    return {"cursor": cursor_reply(cursor.id, ns, batch, first=True)}


@command("getMore")
async def get_more(server, conn, cmd, db):
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
    batch_size = int_arg(cmd, "batchSize", "getMore")
    max_time_ms = int_arg(cmd, "maxTimeMS", "getMore")
    cursor = server.cursors.get(int(cursor_id), f"{db}.{coll}")  # 43, 13
    if cursor.busy:  # mongod's CursorManager::pinCursor
        raise MongoError(143, f"cursor id {cursor.id} is already in use")
    if kind_of(cursor) != CHANGE_STREAM:  # a query result, an oplog find
        return await _get_more_other(server, conn, cursor, batch_size, max_time_ms)
    cursor.busy = True
    try:
        batch = await cursor.get_more(batch_size, max_time_ms)
    except MongoError:
        server.cursors.kill(cursor.id)  # a failed change stream cursor is closed
        raise
    finally:
        cursor.busy = False
        cursor.touch()
        conn.awaited_s = cursor.awaited_s  # not the getMore's own work (slow log, latency)
    if batch.invalidated:
        server.cursors.kill(cursor.id)
    else:
        _prefetch_after(server, cursor, batch_size, len(batch.events))
    server.events_delivered += len(batch.events)
    return {"cursor": cursor_reply(cursor.id, cursor.ns, batch, first=False)}


async def _get_more_other(server, conn, cursor, batch_size, max_time_ms) -> dict:
    """getMore on a cursor that is not a change stream: its `get_more_reply` makes the batch;
    the cursor is closed when that fails or when nothing is left."""
    cursor.busy = True
    try:
        reply = await cursor.get_more_reply(batch_size, max_time_ms)
    except MongoError:
        server.cursors.kill(cursor.id)  # getMore's cursorDeleter
        raise
    finally:
        cursor.busy = False
        cursor.last_used = time.monotonic()
        conn.awaited_s = cursor.awaited_s  # an awaitData oplog find's wait is not its work
    if cursor.done:
        server.cursors.kill(cursor.id)
    return reply


# Oplog entries read per prefetch step: small, so the reply being sent (and every other
# connection) is served between steps.
PREFETCH_STEP = 100


def _prefetch_after(server, cursor: ChangeStreamCursor, batch_size: int | None, sent: int) -> None:
    """After a full batch, prepare the next one while the client reads this one.

    The client works through a batch before it sends the next getMore; filling the cursor's
    queue meanwhile (on the event loop, between I/O) overlaps the two instead of running them
    one after the other. The getMore then finds its events queued: what it returns is what it
    would have produced itself, since the queue is filled from the same oplog in the same order.
    """
    if batch_size is None:
        # A getMore without batchSize took what there was up to 16 MiB: it was full when it
        # left events queued; the next one is prepared as large (bounded by this one's bytes).
        if not cursor.pipeline.pending_count:
            return
        size = max(sent, DEFAULT_BATCH_SIZE)
    else:
        size = DEFAULT_BATCH_SIZE if batch_size <= 0 else batch_size
    if sent < size:
        return  # the stream caught up with the oplog: nothing to get ahead of
    if cursor.prepares_images:  # its lookups are awaited: a task, not loop callbacks
        cursor.start_prefetch(size, PREFETCH_STEP, lambda: server.shutting_down)
        return
    asyncio.get_running_loop().call_soon(_prefetch_step, server, cursor, size)


def _prefetch_step(server, cursor: ChangeStreamCursor, size: int) -> None:
    if cursor.closed or cursor.busy or cursor.draining or server.shutting_down:
        return  # a getMore (which reads for itself) or the end of the cursor
    pipeline = cursor.pipeline
    if pipeline.pending_count >= size or pipeline.invalidated:
        return
    try:
        if cursor.group.step(cursor, PREFETCH_STEP) is not True:
            return  # the end of the oplog for now, or lookups to await (the getMore's)
    except Exception:  # noqa: BLE001 - the getMore reads the same entries and reports it
        return
    asyncio.get_running_loop().call_soon(_prefetch_step, server, cursor, size)


@command("killCursors")
async def kill_cursors(server, conn, cmd, db):
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
    killed, not_found = [], []
    for cid in ids:  # every kind of cursor is in the one registry
        (killed if server.cursors.kill(int(cid)) else not_found).append(Int64(int(cid)))
    return {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
    }
