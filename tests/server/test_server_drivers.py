"""Real drivers against a real server: pymongo, pymongo's AsyncMongoClient and motor.

One in-process server per module replays a recorded history (tests/support/server_support.py) from
a BSON oplog file; tests that need live events write more entries and append them.
"""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import OperationFailure

import cdcserver.wire as wire
from cdcserver.testing import ThreadServer
from tests.support.server_support import (
    CLUSTER_EVENTS,
    DOOMED,
    DOOMED_EVENTS,
    ITEMS,
    ORDERS,
    ORDERS_EVENTS,
    SHOP_EVENTS,
    THINGS,
    World,
    adrain,
    describe,
    drain,
    token_order,
    token_time,
)

AWAIT_MS = 100


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = World.record(tmp_path_factory.mktemp("drivers") / "oplog.bson")
    with ThreadServer([world.path]) as server:
        world.server = server
        yield world


@pytest.fixture(scope="module")
def client(world):
    with MongoClient(world.server.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


def _watch_all(target, world, n, **kwargs):
    with target.watch(
        start_at_operation_time=world.first_ts, max_await_time_ms=AWAIT_MS, **kwargs
    ) as stream:
        return drain(stream, n)


# -- pymongo (synchronous) ------------------------------------------------------------------------


def test_collection_database_and_cluster_streams(client, world):
    assert [describe(e) for e in _watch_all(client.shop.orders, world, 8)] == ORDERS_EVENTS
    assert [describe(e) for e in _watch_all(client.shop, world, 13)] == SHOP_EVENTS
    assert [describe(e) for e in _watch_all(client, world, 14)] == CLUSTER_EVENTS


def test_event_contents(client, world):
    events = _watch_all(client.shop.orders, world, 8)
    insert, update, replace, delete = events[0], events[4], events[5], events[6]
    assert list(insert) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
    ]
    assert insert["fullDocument"] == {"_id": 1, "item": "item-1", "qty": 2, "status": "new"}
    assert update["updateDescription"] == {
        "updatedFields": {"status": "paid"}, "removedFields": [], "truncatedArrays": [],
    }
    assert replace["fullDocument"]["status"] == "replaced"
    assert delete["documentKey"] == {"_id": 3}
    txn_insert = events[7]
    assert txn_insert["txnNumber"] == 1 and "lsid" in txn_insert
    # Tokens and cluster times ascend.
    keys = [token_order(e["_id"]) for e in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_pipeline_stages_apply(client, world):
    pipeline = [{"$match": {"operationType": "insert"}}, {"$project": {"fullDocument": 1}}]
    with client.shop.orders.watch(
        pipeline, start_at_operation_time=world.first_ts, max_await_time_ms=AWAIT_MS
    ) as stream:
        events = drain(stream, 5)
    assert [e["fullDocument"]["_id"] for e in events] == [1, 2, 3, 4, 10]
    assert all(set(e) == {"_id", "fullDocument"} for e in events)


def test_resume_after_and_start_at_operation_time(client, world):
    events = _watch_all(client.shop, world, 13)
    middle = events[5]
    with client.shop.watch(resume_after=middle["_id"], max_await_time_ms=AWAIT_MS) as stream:
        assert drain(stream, 7) == events[6:]
    with client.shop.watch(start_after=middle["_id"], max_await_time_ms=AWAIT_MS) as stream:
        assert drain(stream, 7) == events[6:]
    with client.shop.watch(
        start_at_operation_time=middle["clusterTime"], max_await_time_ms=AWAIT_MS
    ) as stream:
        assert drain(stream, 8) == events[5:]


def test_invalidate_then_start_after(client, world):
    with client.shop.doomed.watch(
        start_at_operation_time=world.first_ts, max_await_time_ms=AWAIT_MS
    ) as stream:
        events = drain(stream, 3)
        assert [describe(e) for e in events] == DOOMED_EVENTS
        assert not stream.alive  # the server closed the cursor with the invalidate
    invalidate = events[-1]["_id"]
    # resumeAfter an invalidate is refused (260); startAfter starts the next incarnation.
    with pytest.raises(OperationFailure) as err:
        client.shop.doomed.watch(resume_after=invalidate)
    assert err.value.code == 260
    with client.shop.doomed.watch(start_after=invalidate, max_await_time_ms=AWAIT_MS) as stream:
        assert [describe(e) for e in drain(stream, 1)] == [("insert", "shop", "doomed", 2)]
        # Resuming the new stream from its own event token works too.
        token = stream.resume_token
    world.oplog.insert(DOOMED, {"_id": 3})
    world.flush()
    with client.shop.doomed.watch(resume_after=token, max_await_time_ms=AWAIT_MS) as stream:
        assert [describe(e) for e in drain(stream, 1)] == [("insert", "shop", "doomed", 3)]


def test_live_events_and_try_next(client, world):
    with client.shop.items.watch(max_await_time_ms=AWAIT_MS) as stream:
        assert stream.try_next() is None
        world.oplog.insert(ITEMS, {"_id": 100, "name": "knife"})
        world.oplog.insert(ORDERS, {"_id": 100})  # another collection: not in this stream
        world.oplog.insert(ITEMS, {"_id": 101, "name": "plate"})
        world.flush()
        events = drain(stream, 2)
        assert [e["documentKey"]["_id"] for e in events] == [100, 101]
        assert stream.resume_token == events[-1]["_id"]
        assert stream.try_next() is None


def test_resume_token_advances_while_batches_are_empty(client, world):
    with client.shop.items.watch(max_await_time_ms=AWAIT_MS) as stream:
        assert stream.try_next() is None
        before = stream.resume_token
        assert before is not None
        for _ in range(3):
            world.oplog.noop()
            world.oplog.insert(THINGS, {"_id": world.oplog.peek_ts().inc})
            world.flush()
            assert stream.try_next() is None
            after = stream.resume_token
            assert token_order(after) > token_order(before)
            assert token_time(after) == world.oplog.last_ts  # a high-water mark at the scan
            before = after
        # A stream resumed from that high-water mark sees only what follows it.
        world.oplog.insert(ITEMS, {"_id": 200})
        world.flush()
    with client.shop.items.watch(resume_after=before, max_await_time_ms=AWAIT_MS) as stream:
        assert [describe(e) for e in drain(stream, 1)] == [("insert", "shop", "items", 200)]


def test_close_kills_the_cursor(client, world):
    server = world.server
    before = server.cursor_ids()
    stream = client.shop.orders.watch(max_await_time_ms=AWAIT_MS)
    stream.try_next()
    opened = server.cursor_ids() - before
    assert len(opened) == 1
    stream.close()
    assert not (server.cursor_ids() & opened)


def test_batch_size(client, world):
    db = client.shop
    start = {"$changeStream": {"startAtOperationTime": world.first_ts}}
    reply = db.command("aggregate", "orders", pipeline=[start], cursor={"batchSize": 2})
    cursor = reply["cursor"]
    assert len(cursor["firstBatch"]) == 2 and cursor["ns"] == ORDERS
    reply = db.command("getMore", cursor["id"], collection="orders", batchSize=3)
    assert len(reply["cursor"]["nextBatch"]) == 3
    db.command("killCursors", "orders", cursors=[cursor["id"]])
    # batchSize 0: an empty first batch that still carries a resume token.
    reply = db.command("aggregate", "orders", pipeline=[start], cursor={"batchSize": 0})
    cursor = reply["cursor"]
    assert cursor["firstBatch"] == [] and "postBatchResumeToken" in cursor
    assert cursor["id"] != 0
    reply = db.command("getMore", cursor["id"], collection="orders", maxTimeMS=AWAIT_MS)
    assert [describe(e) for e in reply["cursor"]["nextBatch"]][:8] == ORDERS_EVENTS
    killed = db.command("killCursors", "orders", cursors=[cursor["id"]])
    assert killed["cursorsKilled"] == [cursor["id"]]
    # The driver's batch_size goes through too.
    assert [describe(e) for e in _watch_all(db.orders, world, 8, batch_size=2)] == ORDERS_EVENTS


def test_get_more_errors(client, world):
    db = client.shop
    with pytest.raises(OperationFailure) as err:
        db.command("getMore", Int64(1234567), collection="orders")
    assert err.value.code == 43 and err.value.details["codeName"] == "CursorNotFound"
    reply = db.command("aggregate", "orders", pipeline=[{"$changeStream": {}}], cursor={})
    cursor_id = reply["cursor"]["id"]
    with pytest.raises(OperationFailure) as err:
        db.command("getMore", cursor_id, collection="items")
    assert err.value.code == 13
    assert err.value.details["errmsg"] == (
        "Requested getMore on namespace 'shop.items', but cursor belongs to a different "
        "namespace shop.orders"
    )
    db.command("killCursors", "orders", cursors=[cursor_id])


@pytest.mark.parametrize(
    ("open_stream", "code"),
    [
        (lambda c: c.shop.orders.watch([{"$bogus": {}}]), 40324),
        (lambda c: c.shop.orders.watch([{"$out": "elsewhere"}]), 20),
        (lambda c: c.shop.orders.watch([{"$group": {"_id": None}}]), 20),
        (lambda c: c.shop.orders.watch(full_document="sometimes"), 2),
        (
            lambda c: c.shop.command(
                "aggregate", "orders", pipeline=[{"$changeStream": {"bogus": 1}}], cursor={}
            ),
            40415,
        ),
        (
            lambda c: c.shop.command(
                "aggregate", "orders", pipeline=[{"$changeStream": {"fullDocument": 1}}],
                cursor={},
            ),
            14,
        ),
        (lambda c: c.admin.watch(), 73),
        (lambda c: c.shop.orders.watch(resume_after={"_data": "zz"}), 9),
    ],
    ids=[
        "unknown-stage", "out", "group", "bad-fullDocument", "unknown-option", "wrong-type",
        "admin-db", "bad-token",
    ],
)
def test_invalid_options(client, open_stream, code):
    with pytest.raises(OperationFailure) as err:
        open_stream(client)
    assert err.value.code == code


def test_conflicting_resume_options(client, world):
    token = _watch_all(client.shop.orders, world, 1)[0]["_id"]
    for options, code in [
        ({"resumeAfter": token, "startAtOperationTime": world.first_ts}, 40674),
        ({"resumeAfter": token, "startAfter": token}, 50865),
    ]:
        with pytest.raises(OperationFailure) as err:
            client.shop.command(
                "aggregate", "orders", pipeline=[{"$changeStream": options}], cursor={}
            )
        assert err.value.code == code


# -- topology and compression ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "topology"),
    [
        ("", "ReplicaSetWithPrimary"),
        ("?replicaSet=cdcserver", "ReplicaSetWithPrimary"),
        ("?directConnection=true", "Single"),
    ],
)
def test_connection_strings(world, query, topology):
    uri = world.server.uri + query
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        assert client.admin.command("ping")["ok"] == 1.0
        assert client.topology_description.topology_type_name == topology
        if topology != "Single":
            assert client.primary == ("127.0.0.1", world.server.port)
        assert [describe(e) for e in _watch_all(client.shop.orders, world, 8)] == ORDERS_EVENTS


@pytest.mark.parametrize("compressor", ["zlib", "zstd", "snappy"])
def test_compressed_connection(world, monkeypatch, compressor):
    seen: list[tuple[str, int | None]] = []
    decode = wire.decode_request

    def spy(frame, **kwargs):
        request = decode(frame, **kwargs)
        body = request.body if isinstance(request, wire.OpMsg) else request.query
        seen.append((next(iter(body)), request.compressor_id))
        return request

    monkeypatch.setattr(wire, "decode_request", spy)
    uri = world.server.uri + f"?compressors={compressor}"
    with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        assert [describe(e) for e in _watch_all(client.shop.orders, world, 8)] == ORDERS_EVENTS
    want = wire.COMPRESSOR_IDS[compressor]
    assert ("aggregate", want) in seen
    assert all(cid == want for name, cid in seen if name in ("aggregate", "getMore"))


# -- AsyncMongoClient and motor -------------------------------------------------------------------


class _Pymongo:
    name = "AsyncMongoClient"

    def __init__(self, uri):
        self.client = AsyncMongoClient(uri, serverSelectionTimeoutMS=10_000)

    async def watch(self, target, *args, **kwargs):
        return await target.watch(*args, **kwargs)

    async def close(self):
        await self.client.close()


class _Motor:
    name = "motor"

    def __init__(self, uri):
        # motor is optional: without it these cases skip (the module still collects and its
        # pymongo tests run).
        motor_asyncio = pytest.importorskip("motor.motor_asyncio")
        self.client = motor_asyncio.AsyncIOMotorClient(uri, serverSelectionTimeoutMS=10_000)

    async def watch(self, target, *args, **kwargs):
        return target.watch(*args, **kwargs)  # opened by the first try_next

    async def close(self):
        self.client.close()


@pytest.fixture(params=[_Pymongo, _Motor], ids=["async-pymongo", "motor"])
async def aclient(request, world):
    flavor = request.param(world.server.uri)
    yield flavor
    await flavor.close()


async def test_async_scopes_match_pymongo(aclient, client, world):
    c = aclient.client
    for target, sync_target, n in [
        (c.shop.orders, client.shop.orders, 8),
        (c.shop, client.shop, 13),
        (c, client, 14),
    ]:
        stream = await aclient.watch(
            target, start_at_operation_time=world.first_ts, max_await_time_ms=AWAIT_MS
        )
        events = await adrain(stream, n)
        await stream.close()
        assert events == _watch_all(sync_target, world, n)


async def test_async_live_resume_and_close(aclient, world):
    c = aclient.client
    server = world.server
    before = server.cursor_ids()
    stream = await aclient.watch(c.shop.items, max_await_time_ms=AWAIT_MS)
    assert await stream.try_next() is None
    opened = server.cursor_ids() - before
    assert len(opened) == 1
    hwm = stream.resume_token
    # (a new stream starts at the next tick, so the first entry read does not move the mark)
    world.oplog.noop()
    world.oplog.noop()
    world.flush()
    assert await stream.try_next() is None
    assert token_order(stream.resume_token) > token_order(hwm)
    world.oplog.insert(ITEMS, {"_id": 300, "name": aclient.name})
    world.oplog.insert(ITEMS, {"_id": 301, "name": aclient.name})
    world.flush()
    events = await adrain(stream, 2)
    assert [e["fullDocument"]["_id"] for e in events] == [300, 301]
    await stream.close()
    assert not (server.cursor_ids() & opened)
    resumed = await aclient.watch(
        c.shop.items, resume_after=events[0]["_id"], max_await_time_ms=AWAIT_MS
    )
    assert [e["_id"] for e in await adrain(resumed, 1)] == [events[1]["_id"]]
    await resumed.close()


async def test_async_errors(aclient):
    c = aclient.client
    with pytest.raises(OperationFailure) as err:
        stream = await aclient.watch(c.shop.orders, [{"$bogus": 1}])
        await stream.try_next()
    assert err.value.code == 40324
    with pytest.raises(OperationFailure) as err:
        await c.shop.command("getMore", Int64(99), collection="orders")
    assert err.value.code == 43
