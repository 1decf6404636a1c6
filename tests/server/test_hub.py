"""Identical change streams share one producer; a slow member is detached and still gets
every event exactly once. Driven through the real command handlers."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver import hub
from cdcserver.commands.registry import run_command
from cdcserver.context import ConnectionState
from cdcserver.cursors import change_stream
from cdcserver.deployment import server_state
from cdcserver.deployments import for_oplog
from cdcserver.sources.base import EntryList, OplogLog

UI = Binary(bytes(range(16)), 4)


class MemoryLog(EntryList, OplogLog):
    def __init__(self) -> None:
        super().__init__()
        self._n = 0

    def insert(self, ns: str, _id: int) -> None:
        self._n += 1
        ts = Timestamp(1_800_000_000, self._n)
        entry = {"op": "i", "ns": ns, "ui": UI, "o": {"_id": _id}, "o2": {"_id": _id},
                 "ts": ts, "t": Int64(1), "v": Int64(2),
                 "wall": datetime.datetime(2027, 1, 1)}
        self._raw.append(bson.encode(entry))
        self._ts.append(ts)
        self.notify()


@pytest.fixture
def world():
    log = MemoryLog()
    log.insert("db.c", 0)  # history before the streams open
    return server_state(for_oplog(log)), ConnectionState(1, "test")


async def open_stream(world, coll: str = "c", **options) -> int:
    state, conn = world
    reply = await run_command(state, conn, {
        "aggregate": coll, "pipeline": [{"$changeStream": options}], "cursor": {}, "$db": "db",
    })
    assert reply["ok"] == 1.0, reply
    return int(reply["cursor"]["id"])


async def get_more(world, cursor_id: int, coll: str = "c", batch_size: int = 1000) -> list[dict]:
    state, conn = world
    reply = await run_command(state, conn, {
        "getMore": Int64(cursor_id), "collection": coll, "batchSize": batch_size,
        "maxTimeMS": 1, "$db": "db",
    })
    assert reply["ok"] == 1.0, reply
    return reply["cursor"]["nextBatch"]


async def test_identical_streams_share_one_producer(world):
    state, _ = world
    a, b = await open_stream(world), await open_stream(world)
    other = await open_stream(world, fullDocument="updateLookup")
    cursors = state.cursors.cursors
    assert cursors[a].group is cursors[b].group
    assert cursors[other].group is not cursors[a].group
    state.oplog.insert("db.c", 1)
    state.oplog.insert("db.c", 2)
    got_a, got_b = await get_more(world, a), await get_more(world, b)
    assert [e["documentKey"]["_id"] for e in got_a] == [1, 2]
    # The same encoded events, not copies made by a second run of the stages.
    assert all(x is y for x, y in zip(got_a, got_b, strict=True))
    assert [e["documentKey"]["_id"] for e in await get_more(world, other)] == [1, 2]


async def test_a_stream_opened_later_joins_only_at_its_own_start(world):
    state, _ = world
    first = await open_stream(world)
    state.oplog.insert("db.c", 1)
    assert len(await get_more(world, first)) == 1
    late = await open_stream(world)  # starts after _id 1
    assert state.cursors.cursors[late].group is state.cursors.cursors[first].group
    state.oplog.insert("db.c", 2)
    assert [e["documentKey"]["_id"] for e in await get_more(world, late)] == [2]
    assert [e["documentKey"]["_id"] for e in await get_more(world, first)] == [2]


async def test_a_slow_member_is_detached_and_misses_nothing(world, monkeypatch):
    monkeypatch.setattr(hub, "MAX_MEMBER_LAG", 5)
    state, _ = world
    fast, slow = await open_stream(world), await open_stream(world)
    seen_fast: list[int] = []
    for i in range(1, 21):
        state.oplog.insert("db.c", i)
        seen_fast += [e["documentKey"]["_id"] for e in await get_more(world, fast, batch_size=2)]
    seen_fast += [e["documentKey"]["_id"] for e in await get_more(world, fast)]
    cursors = state.cursors.cursors
    assert cursors[slow].group is not cursors[fast].group  # it fell behind: detached
    assert cursors[slow].pipeline.pending_count <= hub.MAX_MEMBER_LAG + hub.READ_CHUNK
    seen_slow: list[int] = []
    while batch := await get_more(world, slow, batch_size=3):
        seen_slow += [e["documentKey"]["_id"] for e in batch]
    assert seen_fast == seen_slow == list(range(1, 21))


async def test_closing_the_last_member_forgets_the_group(world):
    state, conn = world
    a = await open_stream(world)
    key = hub.shareable_key(state.cursors.cursors[a].pipeline.spec)
    assert key in state.cursors.hub.groups
    reply = await run_command(state, conn, {"killCursors": "c", "cursors": [Int64(a)],
                                            "$db": "db"})
    assert reply["cursorsKilled"] == [a]
    assert key not in state.cursors.hub.groups


async def _replies(prefetch: bool, monkeypatch) -> list[bytes]:
    """Every reply of a stream read in batches of 3, as encoded bytes; with `prefetch` the loop
    runs between getMores, so the next batch is filled before it is asked for."""
    import asyncio
    import itertools

    monkeypatch.setattr(change_stream, "PREFETCH_STEP", 2)  # several steps per batch
    log = MemoryLog()
    log.insert("db.c", 0)
    state, conn = server_state(for_oplog(log)), ConnectionState(1, "test")
    ids = itertools.count(7)
    state.cursors.new_id = lambda: next(ids)  # type: ignore[method-assign]
    start = log.latest_ts()
    for i in range(1, 12):
        log.insert("db.c" if i % 4 else "db.other", i)
    out = []
    reply = await run_command(state, conn, {
        "aggregate": "c", "pipeline": [{"$changeStream": {"startAtOperationTime": start}}],
        "cursor": {"batchSize": 3}, "$db": "db",
    })
    out.append(bson.encode(reply))
    steps = 0
    while reply["cursor"]["id"]:
        while prefetch and asyncio.get_running_loop()._ready:  # type: ignore[attr-defined]
            await asyncio.sleep(0)
            steps += 1
        reply = await run_command(state, conn, {
            "getMore": Int64(reply["cursor"]["id"]), "collection": "c", "batchSize": 3,
            "maxTimeMS": 1, "$db": "db",
        })
        out.append(bson.encode(reply))
        if not reply["cursor"]["nextBatch"]:
            break
    assert (steps > 0) == prefetch
    return out


async def test_prefetched_batches_are_the_batches_a_getmore_makes(monkeypatch):
    with_prefetch = await _replies(True, monkeypatch)
    assert with_prefetch == await _replies(False, monkeypatch)
    assert len(with_prefetch) == 5  # 3 + 3 + 3 events (2 of 11 are elsewhere), then none
