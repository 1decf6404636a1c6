"""Live upstream: server B (`--upstream`) tails server A's `local.oplog.rs` and serves its
change streams; B forwards everything else to A.

A is cdcserver's embedded store (no mongod here), which serves its oplog tailable as mongod
does. For the same operations, the events B serves must equal A's own, byte for byte
(tokens included), for every scope and the main options, whether B reads them from its live
window or from A's history.

The helpers at the top are shared with tests/server/test_upstream_faults.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import DeleteOne, InsertOne, MongoClient, errors

from cdcserver.deployments.upstream import UpstreamDeployment
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from cdcserver.testing import ThreadServer
from pipeline_stages import resume_token as rt
from pipeline_stages.image_source import pre_image_id
from tests.support.embedded_support import EmbeddedServer

GUARD_S = 20.0  # hang guards, never performance expectations

# Options that make B notice a dead or stalled A quickly.
FAST_CLIENT = {
    "serverSelectionTimeoutMS": 2000,
    "connectTimeoutMS": 1000,
    "heartbeatFrequencyMS": 500,
}


# ---------------------------------------------------------------------------------------------
# Shared helpers


class UpstreamServer(ThreadServer):
    """Server B: cdcserver on its own loop thread, its source the upstream at `uri`."""

    def __init__(self, uri: str, **options: Any) -> None:
        self._options = UpstreamOptions(uri=uri, **options)
        super().__init__(
            make_deployment=lambda: UpstreamDeployment(UpstreamOplog(self._options)))

    @property
    def source(self) -> UpstreamOplog:
        return self.state.oplog  # type: ignore[return-value]

    def wait_ready(self) -> None:
        assert self.run(self.source.wait_ready(GUARD_S), timeout=GUARD_S + 5)

    def wait_caught_up(self, ts: Timestamp) -> None:
        """Until B has delivered everything up to `ts`."""
        deadline = time.monotonic() + GUARD_S
        while True:
            latest = self.call(self.source.latest_ts)
            if latest is not None and latest >= ts:
                return
            assert time.monotonic() < deadline, f"B stuck at {latest}, A at {ts}"
            time.sleep(0.01)

    def client(self, **kwargs: Any) -> MongoClient:
        return MongoClient(self.direct_uri, serverSelectionTimeoutMS=5000, **kwargs)


def raw_client(uri: str, **kwargs: Any) -> MongoClient:
    return MongoClient(
        uri, document_class=RawBSONDocument, serverSelectionTimeoutMS=5000, **kwargs
    )


def watch(client: MongoClient, scope: str, options: dict[str, Any], pipeline=()) -> Any:
    """`scope`: "cluster", "db" or "db.coll"."""
    kwargs = {"max_await_time_ms": 50, **options}
    if scope == "cluster":
        return client.watch(list(pipeline), **kwargs)
    db, _, coll = scope.partition(".")
    target = client[db][coll] if coll else client[db]
    return target.watch(list(pipeline), **kwargs)


def drain_until(stream: Any, end: Timestamp, guard_s: float = GUARD_S) -> list[Any]:
    """Every event until the stream has scanned past `end` (its resume token's time) or it
    closed (invalidate)."""
    events = []
    deadline = time.monotonic() + guard_s
    while stream.alive:
        event = stream.try_next()
        if event is not None:
            events.append(event)
            continue
        token = stream.resume_token
        if token is not None and rt.decode(token).cluster_time >= end:
            break
        assert time.monotonic() < deadline, f"stream stuck at {token}, waiting for {end}"
    return events


def raws(events: list[Any]) -> list[bytes]:
    return [e.raw for e in events]


def noop(a: EmbeddedServer) -> None:
    """A periodic no-op on A (written on A's loop thread, which its waiters belong to)."""

    async def write() -> None:
        a.store.noop()

    asyncio.run_coroutine_threadsafe(write(), a.loop).result(GUARD_S)


def latest_ts(a: EmbeddedServer) -> Timestamp:
    ts = a.store.latest_ts()
    assert ts is not None
    return ts


# ---------------------------------------------------------------------------------------------
# The recorded workload (on A)


def workload_part1(ca: MongoClient) -> None:
    shop = ca.shop
    shop.create_collection("orders")
    shop.create_collection("audited", changeStreamPreAndPostImages={"enabled": True})
    orders = shop.orders
    orders.insert_many([{"_id": i, "qty": i, "tags": ["a"]} for i in range(5)])
    orders.update_one({"_id": 1}, {"$set": {"qty": 10}, "$push": {"tags": "b"}})
    orders.replace_one({"_id": 2}, {"qty": 20, "note": "replaced"})
    orders.delete_one({"_id": 3})
    shop.audited.insert_one({"_id": 1, "v": 1})
    shop.audited.update_one({"_id": 1}, {"$inc": {"v": 1}})
    shop.audited.replace_one({"_id": 1}, {"v": 100})
    ca.other.things.insert_one({"_id": "x", "nested": {"a": 1}})
    ca.other.things.update_one({"_id": "x"}, {"$unset": {"nested.a": ""}})


def workload_part2(ca: MongoClient) -> None:
    shop = ca.shop
    orders = shop.orders
    with ca.start_session() as session:
        session.with_transaction(
            lambda s: (
                orders.insert_one({"_id": 100, "qty": 1}, session=s),
                ca.other.things.update_one({"_id": "x"}, {"$set": {"t": 1}}, session=s),
                orders.delete_one({"_id": 4}, session=s),
            )
        )
    orders.update_many({}, {"$inc": {"qty": 1}})
    orders.create_index("qty")
    shop.audited.delete_one({"_id": 1})
    shop.doomed.insert_one({"_id": 1})
    shop.doomed.drop()
    shop.temp.insert_one({"_id": 1})
    shop.temp.rename("renamed")
    ca.gone.stuff.insert_one({"_id": 1})
    ca.drop_database("gone")
    orders.insert_one({"_id": "big", "pad": "x" * 5000})
    orders.find_one_and_update({"_id": 0}, {"$set": {"last": True}})


def a_serves_pre_images(ca: MongoClient) -> bool:
    return ca.config["system.preimages"].find_one() is not None


def mirror_pre_images(a: EmbeddedServer, ca: MongoClient) -> int:
    """Stand-in until the embedded store serves its pre-images as `config.system.preimages`
    (as mongod does): copy them into a collection of that name on A, `_id` as mongod's
    (`{nsUUID, ts, applyOpsIndex}`). B only ever reads them with `find`, as from mongod."""
    ids = []
    for entry in a.entries():
        ops = [(entry, 0)]
        if entry["op"] == "c" and "applyOps" in entry["o"]:
            ops = [(op, i) for i, op in enumerate(entry["o"]["applyOps"])]
        for op, index in ops:
            if op["op"] in ("u", "d") and "ui" in op:
                ids.append(pre_image_id(op["ui"], entry["ts"], index))
    images = a.store.images.pre_images(ids)
    docs = [{"_id": i, "preImage": image} for i, image in zip(ids, images) if image is not None]
    if docs:
        ca.config["system.preimages"].insert_many(docs)
    return len(docs)


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    """A with the workload; two B's started halfway (so the first half is history for
    them): one with default settings, one with a tiny window and tiny history readers."""
    a = EmbeddedServer()
    started: list[UpstreamServer] = []
    try:
        ca = raw_client(a.uri)
        t0 = latest_ts(a)
        workload_part1(ca)
        b = UpstreamServer(a.uri, max_await_ms=200)
        started.append(b)
        tiny = UpstreamServer(
            a.uri, max_await_ms=200, window_entries=3, history_keep=4, history_batch=2,
            batch_size=2,
        )
        started.append(tiny)
        b.wait_ready()
        tiny.wait_ready()
        workload_part2(ca)
        ca.sentinel.s.insert_one({"_id": "end"})
        end = latest_ts(a)
        pre_images = a_serves_pre_images(ca) or mirror_pre_images(a, ca) > 0
        b.wait_caught_up(end)
        tiny.wait_caught_up(end)
        yield {
            "a": a, "ca": ca, "b": b, "tiny": tiny, "t0": t0, "end": end,
            "pre_images": pre_images,
        }
        ca.close()
    finally:
        for server in started:
            server.stop()
        a.stop()


SPECS = [
    ("shop.orders", {}, []),
    ("shop.orders", {"full_document": "updateLookup"}, []),
    ("shop", {}, []),
    ("shop", {"full_document": "updateLookup", "show_expanded_events": True}, []),
    ("cluster", {}, []),
    ("cluster", {"show_expanded_events": True}, []),
    (
        "shop",
        {},
        [
            {"$match": {"operationType": {"$in": ["insert", "update", "drop"]}}},
            {"$project": {"documentKey": 1, "operationType": 1, "ns": 1}},
        ],
    ),
    ("shop.doomed", {}, []),  # invalidated by the drop
    ("gone", {}, []),  # invalidated by dropDatabase
    ("shop.temp", {"show_expanded_events": True}, []),  # rename: invalidate
    ("other.things", {"full_document": "updateLookup"}, []),
    ("shop.audited", {"full_document_before_change": "whenAvailable"}, []),
    ("shop.audited", {"full_document": "whenAvailable"}, []),
    (
        "shop.audited",
        {"full_document": "required", "full_document_before_change": "required"},
        [],
    ),
]


def _spec_id(spec: tuple) -> str:
    scope, options, pipeline = spec
    parts = [scope, *(f"{k}={v}" for k, v in options.items())]
    if pipeline:
        parts.append("pipeline")
    return ",".join(parts)


def _needs_pre_images(options: dict[str, Any]) -> bool:
    return options.get("full_document_before_change", "off") != "off" or options.get(
        "full_document"
    ) in ("whenAvailable", "required")


@pytest.mark.parametrize("which", ["b", "tiny"])
@pytest.mark.parametrize("spec", SPECS, ids=_spec_id)
def test_events_from_b_equal_events_from_a(world, spec, which):
    scope, options, pipeline = spec
    if _needs_pre_images(options) and not world["pre_images"]:
        pytest.skip("the embedded store does not serve config.system.preimages (yet)")
    b = world[which]
    start = {"start_at_operation_time": world["t0"]}
    with raw_client(world["a"].uri) as ca, raw_client(b.direct_uri) as cb:
        with watch(ca, scope, {**options, **start}, pipeline) as sa:
            events_a = drain_until(sa, world["end"])
        with watch(cb, scope, {**options, **start}, pipeline) as sb:
            events_b = drain_until(sb, world["end"])
    assert events_a, "the workload gives every spec events"
    if _needs_pre_images(options):
        assert any(
            e.get("fullDocumentBeforeChange") is not None
            or (e["operationType"] == "update" and e.get("fullDocument") is not None)
            for e in events_a
        ), "the images were found"
    assert raws(events_b) == raws(events_a)


@pytest.mark.parametrize("which", ["b", "tiny"])
@pytest.mark.parametrize("how", ["resume_after", "start_after"])
def test_resume_on_b_with_tokens_from_a(world, which, how):
    """A token from A's stream resumes on B at the same place (history or window)."""
    b = world[which]
    start = {"start_at_operation_time": world["t0"]}
    with raw_client(world["a"].uri) as ca, raw_client(b.direct_uri) as cb:
        with watch(ca, "cluster", start) as sa:
            all_events = drain_until(sa, world["end"])
        for k in (0, 5, len(all_events) // 2, len(all_events) - 2):
            token = all_events[k]["_id"]
            with watch(ca, "cluster", {how: token}) as sa:
                expected = drain_until(sa, world["end"])
            with watch(cb, "cluster", {how: token}) as sb:
                got = drain_until(sb, world["end"])
            assert raws(got) == raws(expected) == raws(all_events[k + 1 :])


def test_batch_sizes_do_not_change_the_events(world):
    b = world["tiny"]
    start = {"start_at_operation_time": world["t0"]}
    with raw_client(world["a"].uri) as ca, raw_client(b.direct_uri) as cb:
        with watch(ca, "cluster", start) as sa:
            expected = drain_until(sa, world["end"])
        for batch_size in (1, 2, 7):
            with watch(cb, "cluster", {**start, "batch_size": batch_size}) as sb:
                assert raws(drain_until(sb, world["end"])) == raws(expected)


def test_many_streams_share_history_readers(world):
    """Streams starting at the same old time read A's history once, together."""
    b = world["b"]
    start = {"start_at_operation_time": world["t0"]}
    with raw_client(world["a"].uri) as ca:
        with watch(ca, "shop", start) as sa:
            expected = raws(drain_until(sa, world["end"]))
    with raw_client(b.direct_uri, maxPoolSize=20) as cb:
        streams = [watch(cb, "shop", start) for _ in range(5)]
        try:
            results = [raws(drain_until(s, world["end"])) for s in streams]
        finally:
            for s in streams:
                s.close()
    assert all(r == expected for r in results)
    assert len(b.call(lambda: list(b.source._segments))) <= 2


def test_update_lookup_is_one_query_per_namespace_per_batch(world):
    a, b = world["a"], world["b"]
    ca = world["ca"]
    start = latest_ts(a)
    ca.lookup.many.insert_many([{"_id": i, "v": 0} for i in range(50)])
    ca.lookup.many.update_many({}, {"$set": {"v": 1}})
    ca.lookup.other.insert_one({"_id": 1})
    ca.lookup.other.update_one({"_id": 1}, {"$set": {"v": 1}})
    end = latest_ts(a)
    b.wait_caught_up(end)
    options = {"start_at_operation_time": start, "full_document": "updateLookup"}
    with raw_client(a.uri) as ca2, watch(ca2, "lookup", options) as sa:
        expected = drain_until(sa, end)
    before = b.call(lambda: b.source.images.queries)
    with raw_client(b.direct_uri) as cb, watch(cb, "lookup", options) as sb:
        got = drain_until(sb, end)
    queries = b.call(lambda: b.source.images.queries) - before
    assert raws(got) == raws(expected)
    assert sum(e["operationType"] == "update" for e in got) == 51
    # One batch (101 events at most in the first batch, the rest in one getMore): per batch
    # and namespace a listCollections (UUID check) and one find.
    assert queries <= 2 * 2 * 2


def test_new_streams_start_at_the_upstreams_current_time(world):
    a, b = world["a"], world["b"]
    ca = world["ca"]
    b.wait_caught_up(latest_ts(a))
    with raw_client(a.uri) as ca2, raw_client(b.direct_uri) as cb:
        with watch(ca2, "shop.fresh", {}) as sa, watch(cb, "shop.fresh", {}) as sb:
            ca.shop.fresh.insert_one({"_id": 1})
            ca.shop.fresh.update_one({"_id": 1}, {"$set": {"a": 1}})
            ca.sentinel.s.insert_one({"_id": "fresh"})
            end = latest_ts(a)
            events_a = drain_until(sa, end)
            events_b = drain_until(sb, end)
    assert [e["operationType"] for e in events_a] == ["insert", "update"]
    assert raws(events_b) == raws(events_a)


def test_idle_streams_advance_with_upstream_noops(world):
    """A periodic no-op on A moves an idle stream's post-batch token on B."""
    a, b = world["a"], world["b"]
    with raw_client(b.direct_uri) as cb, watch(cb, "shop.quiet", {}) as sb:
        assert sb.try_next() is None
        before = rt.decode(sb.resume_token).cluster_time
        noop(a)
        noop_ts = latest_ts(a)
        assert noop_ts >= before
        assert drain_until(sb, noop_ts) == []
        assert rt.decode(sb.resume_token).cluster_time >= noop_ts


def test_operation_time_follows_the_upstream(world):
    a, b = world["a"], world["b"]
    world["ca"].sentinel.s.insert_one({"_id": "optime"})
    end = latest_ts(a)
    b.wait_caught_up(end)
    with b.client() as cb:
        reply = cb.admin.command("ping")
    assert reply["operationTime"] == end
    assert reply["$clusterTime"]["clusterTime"] == end


def test_start_before_an_untruncated_oplog_is_whole_history(world):
    """A start older than A's oldest entry while that entry is the replica set's first
    ("initiating set"): nothing was lost, so B serves all of it (a truncated oplog gives
    286: tests/server/test_upstream_faults.py)."""
    b = world["b"]
    with raw_client(world["a"].uri) as ca, raw_client(b.direct_uri) as cb:
        with watch(ca, "shop.orders", {"start_at_operation_time": Timestamp(1, 1)}) as sa:
            expected = drain_until(sa, world["end"])
        with watch(cb, "shop.orders", {"start_at_operation_time": Timestamp(1, 1)}) as sb:
            assert raws(drain_until(sb, world["end"])) == raws(expected)


def test_only_majority_committed_entries_reach_consumers(monkeypatch):
    """While A's majority commit point stays behind a write (its hello says so), B holds the
    write back; when the commit point reaches it, the event is delivered."""
    from cdcserver.commands import handshake

    a = EmbeddedServer()
    frozen: list[Timestamp] = []
    original = handshake.hello_reply

    def hello_reply(server, conn, cmd, legacy):
        reply = original(server, conn, cmd, legacy)
        if server is a.state and frozen:
            reply["lastWrite"]["majorityOpTime"] = {"ts": frozen[0], "t": 1}
        return reply

    monkeypatch.setattr(handshake, "hello_reply", hello_reply)
    b = UpstreamServer(a.uri, max_await_ms=100)
    try:
        b.wait_ready()
        with a.client() as ca, raw_client(b.direct_uri) as cb:
            ca.shop.maj.insert_one({"_id": 0})
            b.wait_caught_up(latest_ts(a))
            with watch(cb, "shop.maj", {}) as stream:
                frozen.append(latest_ts(a))
                ca.shop.maj.insert_one({"_id": 1})
                written = latest_ts(a)
                deadline = time.monotonic() + GUARD_S
                while not b.call(lambda: len(b.source._pending)):
                    assert time.monotonic() < deadline, "B did not read the write"
                    time.sleep(0.01)
                for _ in range(5):
                    assert stream.try_next() is None  # held back
                assert rt.decode(stream.resume_token).cluster_time <= written  # its start
                assert b.call(b.source.latest_ts) < written
                frozen.clear()
                event = None
                while event is None:
                    assert time.monotonic() < deadline, "never delivered"
                    event = stream.try_next()
                assert dict(event["documentKey"]) == {"_id": 1}
    finally:
        b.stop()
        a.stop()


# ---------------------------------------------------------------------------------------------
# Proxy: everything but change streams goes to A


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedServer, UpstreamServer]]:
    a = EmbeddedServer()
    try:
        b = UpstreamServer(a.uri, max_await_ms=200)
        try:
            b.wait_ready()
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def test_proxy_crud_lands_on_a(pair):
    a, b = pair
    with b.client() as cb, a.client() as ca:
        coll = cb.proxied.crud
        coll.insert_one({"_id": 1, "x": 1})
        coll.insert_many([{"_id": i, "x": i} for i in range(2, 12)])
        coll.update_one({"_id": 1}, {"$set": {"y": 2}})
        coll.update_many({"x": {"$gte": 10}}, {"$inc": {"x": 100}})
        coll.replace_one({"_id": 2}, {"z": 3})
        coll.delete_one({"_id": 3})
        coll.delete_many({"x": {"$gt": 100}})
        assert coll.find_one_and_update({"_id": 4}, {"$set": {"f": 1}})["_id"] == 4
        coll.bulk_write([InsertOne({"_id": 50}), DeleteOne({"_id": 5})])
        expected = list(ca.proxied.crud.find().sort("_id"))
        assert expected == list(coll.find().sort("_id"))
        assert {d["_id"] for d in expected} == {1, 2, 4, 6, 7, 8, 9, 50}
        assert ca.proxied.crud.find_one({"_id": 1}) == {"_id": 1, "x": 1, "y": 2}
        assert coll.count_documents({}) == 8
        assert sorted(coll.distinct("_id")) == [1, 2, 4, 6, 7, 8, 9, 50]
        assert list(coll.aggregate([{"$match": {"_id": 1}}, {"$project": {"y": 1}}])) == [
            {"_id": 1, "y": 2}
        ]


def test_proxy_cursors_get_more_and_kill(pair):
    a, b = pair
    with b.client() as cb:
        coll = cb.proxied.many
        coll.insert_many([{"_id": i} for i in range(25)])
        assert [d["_id"] for d in coll.find().sort("_id").batch_size(4)] == list(range(25))
        cursor = coll.find().batch_size(3)
        next(cursor)
        cursor.close()  # killCursors of a forwarded cursor goes to A
        assert a.client().proxied.many.count_documents({}) == 25


def test_proxy_kill_cursors_of_both_kinds(pair):
    """One killCursors naming a change-stream cursor of B and a find cursor of A."""
    a, b = pair
    with b.client() as cb:
        coll = cb.proxied.kill
        coll.insert_many([{"_id": i} for i in range(10)])
        found = cb.proxied.command({"find": "kill", "batchSize": 2})["cursor"]["id"]
        stream = cb.proxied.command(
            {"aggregate": "kill", "pipeline": [{"$changeStream": {}}], "cursor": {}}
        )["cursor"]["id"]
        assert found and stream
        reply = cb.proxied.command({"killCursors": "kill", "cursors": [found, stream]})
        assert sorted(reply["cursorsKilled"]) == sorted([found, stream])
        assert reply["cursorsNotFound"] == []
        assert stream not in b.cursor_ids()
        with pytest.raises(errors.OperationFailure) as gone:
            cb.proxied.command({"getMore": found, "collection": "kill"})
        assert gone.value.code == 43


def test_proxy_routing_decisions(pair):
    """What the upstream table hands on as it is (its forwarding handlers), per request."""
    a, b = pair
    state = b.state

    def forwards(server, name, cmd):
        handler = server.commands.handler(server, name, cmd)
        return handler is not None and handler in server.commands.forwarding

    assert forwards(state, "insert", {"insert": "c"})
    assert forwards(state, "aggregate", {"aggregate": "c", "pipeline": [{"$match": {}}]})
    assert not forwards(
        state, "aggregate", {"aggregate": "c", "pipeline": [{"$changeStream": {}}]}
    )
    # getMore is cdcserver's for every cursor: a forwarded one's goes to the member holding it
    # (test_forwarded_cursors_are_in_the_registry_reaped_and_killed), an unknown id is 43.
    assert not forwards(state, "getMore", {"getMore": 12345, "collection": "c"})
    for local in ("hello", "isMaster", "ping", "buildInfo", "serverStatus", "saslStart"):
        assert not forwards(state, local, {local: 1})
    assert not forwards(a.state, "insert", {"insert": "c"})  # A is not a sidecar
    with b.client() as cb, pytest.raises(errors.OperationFailure) as unknown:
        cb.proxied.command({"getMore": Int64(12345), "collection": "c"})
    assert unknown.value.code == 43


def test_proxy_ddl_and_listings(pair):
    a, b = pair
    with b.client() as cb, a.client() as ca:
        cb.proxied_ddl.create_collection("c1")
        cb.proxied_ddl.c1.create_index("k", unique=True)
        assert "proxied_ddl" in cb.list_database_names()
        assert "c1" in cb.proxied_ddl.list_collection_names()
        assert "k_1" in ca.proxied_ddl.c1.index_information()
        cb.proxied_ddl.c1.drop()
        assert "c1" not in ca.proxied_ddl.list_collection_names()


def test_proxy_errors_come_back_unchanged(pair):
    a, b = pair
    with b.client(retryWrites=False) as cb, a.client(retryWrites=False) as ca:
        ca.proxied.dups.insert_one({"_id": 1})
        with pytest.raises(errors.DuplicateKeyError) as via_b:
            cb.proxied.dups.insert_one({"_id": 1})
        with pytest.raises(errors.DuplicateKeyError) as via_a:
            ca.proxied.dups.insert_one({"_id": 1})
        assert via_b.value.details == via_a.value.details
        with pytest.raises(errors.OperationFailure) as bad:
            cb.proxied.command({"noSuchCommand": 1})
        assert bad.value.code == 59


def test_proxy_transactions_land_on_a(pair):
    a, b = pair
    with b.client() as cb, a.client() as ca:
        coll = cb.proxied.txn
        coll.insert_one({"_id": 0})
        with cb.start_session() as session:
            session.with_transaction(
                lambda s: (
                    coll.insert_one({"_id": 1}, session=s),
                    coll.update_one({"_id": 0}, {"$set": {"t": 1}}, session=s),
                )
            )
        assert list(ca.proxied.txn.find().sort("_id")) == [{"_id": 0, "t": 1}, {"_id": 1}]
        with cb.start_session() as session:
            session.start_transaction()
            coll.insert_one({"_id": 2}, session=session)
            session.abort_transaction()
        assert ca.proxied.txn.count_documents({}) == 2


def test_hello_describes_cdcserver_itself(pair):
    a, b = pair
    with b.client() as cb:
        hello = cb.admin.command("hello")
    assert hello["me"] == b.address
    assert hello["isWritablePrimary"] is True


def test_writes_through_b_are_watched_on_b(pair):
    """All of an application's traffic to the sidecar: write through B, watch B."""
    a, b = pair
    with b.client() as cb:
        coll = cb.proxied.watched
        with coll.watch(max_await_time_ms=50) as stream:
            coll.insert_one({"_id": 1})
            coll.update_one({"_id": 1}, {"$set": {"a": 1}})
            deadline = time.monotonic() + GUARD_S
            events = []
            while len(events) < 2 and time.monotonic() < deadline:
                event = stream.try_next()
                if event is not None:
                    events.append(event)
    assert [e["operationType"] for e in events] == ["insert", "update"]


def test_async_clients_on_b(pair):
    """pymongo's AsyncMongoClient against B: change streams and forwarded CRUD."""
    from pymongo import AsyncMongoClient

    a, b = pair

    async def run() -> list[str]:
        client = AsyncMongoClient(b.direct_uri, serverSelectionTimeoutMS=5000)
        try:
            coll = client.proxied.async_coll
            async with await coll.watch(max_await_time_ms=50) as stream:
                await coll.insert_one({"_id": 1})
                await coll.delete_one({"_id": 1})
                seen = []
                deadline = time.monotonic() + GUARD_S
                while len(seen) < 2 and time.monotonic() < deadline:
                    event = await stream.try_next()
                    if event is not None:
                        seen.append(event["operationType"])
                return seen
        finally:
            await client.close()

    assert asyncio.run(run()) == ["insert", "delete"]


# ---------------------------------------------------------------------------------------------
# Unit checks of the source's bookkeeping (no servers)


def test_window_trim_keeps_coverage_contiguous():
    source = UpstreamOplog(UpstreamOptions(uri="mongodb://unused", window_entries=10))
    import bson

    from pipeline_stages.oplog_entry import decode_entry

    items = []
    for i in range(1, 30):
        raw = bson.encode({"op": "n", "ns": "", "o": {"msg": i}, "ts": Timestamp(100, i)})
        items.append((Timestamp(100, i), raw, decode_entry(raw)))
    source._majority = Timestamp(100, 20)
    source._pending = list(items)
    source._deliver_committed()
    assert source.latest_ts() == Timestamp(100, 20)
    assert len(source) <= 10
    covered = source._covered_from
    assert covered is not None and covered <= source._ts[0]
    got = source.read_from(covered, 100)
    assert [e["ts"] for e in got] == [t for t, _, _ in items if covered <= t <= Timestamp(100, 20)]
    assert source._majority_wanted.is_set()  # 9 entries wait for the commit point
    assert len(source._pending) == 9

