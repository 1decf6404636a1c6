"""1000 concurrent change streams on one server process.

The server runs as a subprocess (`cdcserver serve --follow`), so its memory is its own:
RSS is read from /proc/<pid>/status before the streams open and after every event was
delivered. The bound is generous: it catches per-cursor buffering gone wrong (copies of the
oplog per cursor, unbounded queues), not a few hundred bytes of drift.
"""

from __future__ import annotations

import asyncio

import pytest
from pymongo import AsyncMongoClient

from cdcserver.testing import SubprocessServer
from tests.support.server_support import ITEMS, THINGS, World

N_STREAMS = 1000
# (scope, how many streams); the events each scope must see are counted below.
SCOPES = [("collection", 500), ("database", 300), ("cluster", 200)]
ITEM_EVENTS = 24
THING_EVENTS = 12
RSS_GROWTH_BOUND_KIB = 256 * 1024  # for 1000 cursors + connections: generous (measured ~12)
AWAIT_MS = 300
HANG_GUARD_S = 120


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = World.record(tmp_path_factory.mktemp("scale") / "oplog.bson")
    with SubprocessServer([world.path], follow=True) as server:
        world.server = server
        yield world


async def _read(stream, want: int) -> list:
    """Everything the stream delivers until `want` events, then one more poll (must be empty)."""
    events = []
    while len(events) < want:
        event = await stream.try_next()
        if event is not None:
            events.append(event)
    extra = await stream.try_next()
    assert extra is None, extra
    return events


async def test_thousand_concurrent_streams(world):
    server = world.server
    async with AsyncMongoClient(
        server.uri, maxPoolSize=N_STREAMS + 50, maxConnecting=16, serverSelectionTimeoutMS=20_000
    ) as client:
        await client.admin.command("ping")
        rss_before = server.rss_kib()

        targets = {"collection": client.shop.items, "database": client.shop, "cluster": client}
        streams = []
        for scope, count in SCOPES:
            for _ in range(count):
                streams.append(
                    (scope, await targets[scope].watch(max_await_time_ms=AWAIT_MS))
                )
        assert len(streams) == N_STREAMS
        status = await client.admin.command("serverStatus")
        assert status["cdcserver"]["cursors"] == N_STREAMS
        assert status["connections"]["current"] >= 2

        want = {
            "collection": ITEM_EVENTS,
            "database": ITEM_EVENTS,
            "cluster": ITEM_EVENTS + THING_EVENTS,
        }
        readers = [asyncio.ensure_future(_read(s, want[scope])) for scope, s in streams]

        # Write while the readers wait: several appends, interleaved with entries no stream
        # matches, so cursors wake up for batches of varying sizes.
        for chunk in range(4):
            for i in range(ITEM_EVENTS // 4):
                key = chunk * 100 + i
                world.oplog.insert(ITEMS, {"_id": key, "chunk": chunk})
                if i % 2 == 0:
                    world.oplog.insert(THINGS, {"_id": key})
                world.oplog.noop()
            world.flush()
            await asyncio.sleep(0.05)

        results = await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD_S)
        rss_after = server.rss_kib()

        item_keys = [c * 100 + i for c in range(4) for i in range(ITEM_EVENTS // 4)]
        thing_keys = [k for k in item_keys if (k % 100) % 2 == 0]
        for (scope, _), events in zip(streams, results):
            keys = [(e["ns"]["coll"], e["documentKey"]["_id"]) for e in events]
            expected = [("items", k) for k in item_keys]
            if scope == "cluster":
                expected = [
                    pair
                    for k in item_keys
                    for pair in [("items", k)] + ([("things", k)] if k in thing_keys else [])
                ]
            assert keys == expected, scope  # every matching event, once, in oplog order

        # One reply per event per stream went out; every token is distinct within a stream.
        assert all(len({e["_id"]["_data"] for e in r}) == len(r) for r in results)

        for _, stream in streams:
            await stream.close()
        status = await client.admin.command("serverStatus")
        assert status["cdcserver"]["cursors"] == 0  # every close reached the server

    growth = rss_after - rss_before
    print(
        f"server RSS {rss_before / 1024:.1f} MiB -> {rss_after / 1024:.1f} MiB "
        f"with {N_STREAMS} streams (+{growth / 1024:.1f} MiB)"
    )
    assert growth < RSS_GROWTH_BOUND_KIB
