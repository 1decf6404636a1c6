"""Idle streams of a filter group: their awaitData getMores end on the group's expiry ticks
(hub.py `AwaitExpiries`: one timer per tick, answered in slices), not on a timer each.

An idle getMore must still answer once its maxTimeMS has passed, with an empty batch and a
post-batch token that has moved up to what the server scanned; a stream idle for many of those
rounds then reached by a write gets that event exactly once. Run through the command handlers
against an in-memory oplog (no sockets, no clocks asserted on: only what comes back).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bson.int64 import Int64

from cdcserver.commands import cursors as _cursors  # noqa: F401  (registers the commands)
from cdcserver.commands.registry import run_command
from cdcserver.context import ConnectionState, ServerState
from cdcserver.deployment import server_state
from cdcserver.deployments import for_oplog
from cdcserver.hub import EXPIRY_SLICE, AwaitExpiries
from pipeline_stages import resume_token
from tests.server.test_fanout_server import MemoryLog

K = EXPIRY_SLICE * 2 + 5  # more idle getMores than one slice answers in a loop turn


async def _open(state: ServerState, conn: ConnectionState, k: int) -> list[int]:
    ids = []
    for i in range(k):
        reply = await run_command(state, conn, {
            "aggregate": "c", "cursor": {}, "$db": "db",
            "pipeline": [{"$changeStream": {}}, {"$match": {"fullDocument.u": i}}],
        })
        ids.append(int(reply["cursor"]["id"]))
    return ids


def _get_more(state: ServerState, conn: ConnectionState, cid: int, max_time_ms: int) -> Any:
    return run_command(state, conn, {
        "getMore": Int64(cid), "collection": "c", "maxTimeMS": max_time_ms, "$db": "db",
    })


def _token_ts(token: dict[str, Any]) -> Any:
    return resume_token.decode(token).cluster_time


async def test_idle_getmores_answer_after_max_time_with_the_scanned_token() -> None:
    log = MemoryLog()
    log.insert({"_id": 0})
    state, conn = server_state(for_oplog(log)), ConnectionState(1, "test")
    ids = await _open(state, conn, K)
    log.insert({"_id": 1, "u": -1})  # reaches no stream: every token moves past it anyway
    scanned = log.latest_ts()
    replies = await asyncio.gather(*(_get_more(state, conn, cid, 30) for cid in ids))
    for reply in replies:
        cursor = reply["cursor"]
        assert cursor["nextBatch"] == [] and int(cursor["id"]) != 0
        assert _token_ts(cursor["postBatchResumeToken"]) == scanned
    group = state.cursors.cursors[ids[0]].group
    assert len({state.cursors.cursors[c].group for c in ids}) == 1  # one group, one wheel
    expiries = group._expiries
    assert isinstance(expiries, AwaitExpiries)
    assert expiries.pending() == 0 and not group._waiters
    for cid in ids:
        state.cursors.kill(cid)


async def test_a_stream_reached_after_a_long_idle_gets_the_event_once() -> None:
    log = MemoryLog()
    log.insert({"_id": 0})
    state, conn = server_state(for_oplog(log)), ConnectionState(1, "test")
    ids = await _open(state, conn, K)
    target = 7
    for round_ in range(3):  # idle rounds: each getMore ends on its tick with nothing
        log.insert({"_id": f"other{round_}", "u": -1})
        replies = await asyncio.gather(*(_get_more(state, conn, cid, 20) for cid in ids))
        assert all(r["cursor"]["nextBatch"] == [] for r in replies)
    # Now every stream waits (long maxTimeMS); one write reaches the target only.
    tasks = [asyncio.ensure_future(_get_more(state, conn, cid, 600_000)) for cid in ids]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not any(t.done() for t in tasks)
    log.insert({"_id": "hit", "u": target})
    for _ in range(1000):  # loop turns, not time
        await asyncio.sleep(0)
        if tasks[target].done():
            break
    batch = tasks[target].result()["cursor"]["nextBatch"]
    assert [e["documentKey"]["_id"] for e in batch] == ["hit"]
    assert [i for i, t in enumerate(tasks) if t.done()] == [target]
    for t in tasks:
        t.cancel()  # the clients hang up
    await asyncio.gather(*tasks, return_exceptions=True)
    # Its next getMore has nothing more: the event came once.
    again = await _get_more(state, conn, ids[target], 20)
    assert again["cursor"]["nextBatch"] == []
    assert _token_ts(again["cursor"]["postBatchResumeToken"]) == log.latest_ts()
    for cid in ids:
        state.cursors.kill(cid)


async def test_expiries_are_answered_in_slices_and_skip_answered_getmores() -> None:
    loop = asyncio.get_running_loop()
    wheel = AwaitExpiries(loop)
    futures = [loop.create_future() for _ in range(K)]
    for f in futures:
        wheel.add(f, 0.0)
    futures[3].set_result(None)  # answered by an event before its tick
    futures[4].cancel()  # its client hung up
    give_up = loop.time() + 60  # a guard against a hang, not a timing
    while not any(f.done() for f in futures[5:]) and loop.time() < give_up:
        await asyncio.sleep(0)  # single loop turns until the tick has come
    # The tick answered one slice in its own loop turn, the rest in later turns.
    assert sum(f.done() for f in futures) < K
    for _ in range(10):
        await asyncio.sleep(0)
    assert all(f.done() for f in futures)
    assert futures[4].cancelled() and wheel.pending() == 0 and not wheel.buckets
