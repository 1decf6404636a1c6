"""Many change streams with their own filters, through pymongo against the embedded server.

Every stream must get exactly the events (byte for byte) its own pipeline gives over the
server's oplog from the stream's start, whatever the other streams' filters, while streams
open and close between writes; and streams that differ only in their filter share one group.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.commands import cursors as _cursors  # noqa: F401  (registers the commands)
from cdcserver.commands.registry import run_command
from cdcserver.context import ConnectionState
from cdcserver.deployment import server_state
from cdcserver.deployments import for_oplog
from cdcserver.sources.base import EntryList, OplogLog
from cdcserver.testing import EmbeddedServer
from pipeline_stages import resume_token
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate

K = 40


def filters() -> list[list[dict[str, Any]]]:
    """Stream i's user pipeline: mostly a distinct indexed equality, plus the other kinds."""
    out: list[list[dict[str, Any]]] = [[{"$match": {"fullDocument.u": i}}] for i in range(K)]
    out[1] = [{"$match": {"fullDocument.u": {"$in": [1, "one"]}, "operationType": "insert"}}]
    out[2] = [{"$match": {"$or": [{"fullDocument.u": 2}, {"documentKey._id": "d2"}]}}]
    out[3] = [{"$match": {"fullDocument.u": {"$gt": 36}}}]  # not indexed: runs on every event
    out[4] = [{"$match": {"fullDocument.u": None}}]  # null matches missing: not indexed
    out[5] = [{"$match": {"fullDocument.u": 5}}, {"$project": {"fullDocument.u": 1}}]
    out[6] = [{"$match": {"updateDescription.updatedFields.u": {"$exists": True}}}]
    out[7] = [{"$match": {"fullDocument.tags": "t7"}}]  # arrays
    out[8] = [{"$match": {"fullDocument.u": 9}}]  # the same filter as stream 9
    out[10] = []  # everything
    return out


def workload(round_: int) -> list[tuple[str, dict[str, Any]]]:
    """Writes whose values are of mixed numeric types, arrays and missing fields."""
    ops: list[tuple[str, dict[str, Any]]] = []
    for i in range(K):
        value: Any = [i, 5.0 * i, Int64(i), Decimal128(str(i))][(i + round_) % 4]
        doc: dict[str, Any] = {"_id": f"r{round_}-{i}", "u": value}
        if i % 7 == 0:
            doc["tags"] = ["x", f"t{i % 10}"]
        if i % 11 == 0:
            del doc["u"]
        ops.append(("insert", doc))
    ops.append(("insert", {"_id": "d2", "u": "one"} if round_ == 0 else {"_id": f"n{round_}"}))
    ops.append(("update", {"_id": f"r{round_}-5", "u": 9}))
    ops.append(("delete", {"_id": f"r{round_}-9"}))
    return ops


class Stream:
    def __init__(self, client: Any, stages: list[dict[str, Any]], start: Timestamp) -> None:
        self.stages = stages
        self.start = start
        self.change_stream = client.fan.c.watch(stages, max_await_time_ms=50)
        self.events: list[bytes] = []
        self.closed = False

    def read_until(self, ts: Timestamp) -> None:
        """Read until the stream's post-batch token is at or past `ts`."""
        for _ in range(10_000):  # a guard against a hang, not a timing
            event = self.change_stream.try_next()
            if event is not None:
                self.events.append(event.raw)
                continue
            token = self.change_stream.resume_token
            if token is not None and resume_token.decode(token).cluster_time >= ts:
                return
        raise AssertionError("the stream did not reach the last write")


def expected(raw_entries: list[bytes], stages: list[dict[str, Any]], start: Timestamp,
             end: Timestamp) -> list[bytes]:
    """The stream's own pipeline over the server's oplog from its start."""
    spec = parse_aggregate(
        {"aggregate": "c", "pipeline": [{"$changeStream": {}}, *stages], "cursor": {}}, "fan"
    )
    entries = [decode_entry(r) for r in raw_entries]
    pipeline = ChangeStreamPipeline(spec, start, history=None)
    batch = pipeline.process([e for e in entries if start <= e["ts"] <= end])
    return [e.raw for e in batch.events]


@pytest.fixture
def server():
    s = EmbeddedServer()
    yield s
    s.stop()


def test_each_stream_gets_exactly_its_events(server: EmbeddedServer) -> None:
    client = server.client(document_class=RawBSONDocument)
    writer = server.client()
    writer.fan.create_collection("c")
    pipelines = filters()

    def latest() -> Timestamp:
        return server.call(lambda: server.oplog.latest_ts())

    def next_start() -> Timestamp:
        ts = latest()
        return Timestamp(ts.time, ts.inc + 1)

    streams: list[Stream] = []
    start = next_start()
    for stages in pipelines[: K // 2]:  # half now, half after the first round
        streams.append(Stream(client, stages, start))
    for round_ in range(3):
        if round_ == 1:
            start = next_start()
            streams += [Stream(client, stages, start) for stages in pipelines[K // 2 :]]
        if round_ == 2:
            for s in streams[::5]:  # some leave mid-flight
                s.change_stream.close()
                s.closed = True
        for kind, doc in workload(round_):
            if kind == "insert":
                writer.fan.c.insert_one(doc)
            elif kind == "update":
                writer.fan.c.update_one({"_id": doc["_id"]}, {"$set": {"u": doc["u"]}})
            else:
                writer.fan.c.delete_one(doc)
        end = latest()
        # Several client threads, as real subscribers would read.
        threads = [
            threading.Thread(target=s.read_until, args=(end,)) for s in streams if not s.closed
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    raw = server.call(server.store.oplog_entries)
    for i, s in enumerate(streams):
        if s.closed:
            continue
        want = expected(raw, s.stages, s.start, end)
        assert s.events == want, (i, s.stages)
    assert sum(len(s.events) for s in streams) > K  # the workload reached the streams

    # Streams that differ only in their filter share one group (its index picks who gets what).
    groups = server.call(lambda: list(server.state.cursors.hub.groups.values()))
    assert len(groups) == 1 and len(groups[0]) == 1
    open_streams = sum(1 for s in streams if not s.closed)
    assert len(groups[0][0].fanout) == open_streams
    for s in streams:
        if not s.closed:
            s.change_stream.close()
    client.close()
    writer.close()


# -- in process, through the command handlers ---------------------------------------------------


class MemoryLog(EntryList, OplogLog):
    n = 0

    def append(self, entry: dict[str, Any]) -> None:
        self.n += 1
        ts = Timestamp(1_800_000_000, self.n)
        entry = {**entry, "ts": ts, "t": Int64(1), "v": Int64(2),
                 "wall": datetime.datetime(2027, 1, 1)}
        self._raw.append(bson.encode(entry))
        self._ts.append(ts)
        self.notify()

    def insert(self, doc: dict[str, Any]) -> None:
        self.append({"op": "i", "ns": "db.c", "ui": Binary(bytes(16), 4), "o": doc,
                     "o2": {"_id": doc["_id"]}})


async def test_a_write_wakes_only_the_getmores_it_reaches() -> None:
    """K getMores wait; an insert matching one stream's filter completes that getMore only (the
    others wait on: their maxTimeMS is far away), and it carries the event."""
    log = MemoryLog()
    log.insert({"_id": 0})
    state, conn = server_state(for_oplog(log)), ConnectionState(1, "test")
    ids = []
    for i in range(50):
        reply = await run_command(state, conn, {
            "aggregate": "c", "cursor": {}, "$db": "db",
            "pipeline": [{"$changeStream": {}}, {"$match": {"fullDocument.u": i}}],
        })
        ids.append(int(reply["cursor"]["id"]))

    async def get_more(cid: int) -> Any:
        return await run_command(state, conn, {
            "getMore": Int64(cid), "collection": "c", "maxTimeMS": 600_000, "$db": "db",
        })

    tasks = [asyncio.ensure_future(get_more(cid)) for cid in ids]
    for _ in range(20):
        await asyncio.sleep(0)  # every getMore is waiting now
    assert not any(t.done() for t in tasks)
    log.insert({"_id": 1, "u": 17.0})
    for _ in range(1000):  # loop turns, not time: until the reached getMore has answered
        await asyncio.sleep(0)
        if tasks[17].done():
            break
    assert [i for i, t in enumerate(tasks) if t.done()] == [17]
    # The other 49 were never woken: they are still parked on their own futures.
    group = state.cursors.cursors[ids[0]].group
    parked = group._waiters
    assert len(parked) == 49 and not any(f.done() for f in parked.values())
    assert state.cursors.cursors[ids[17]] not in parked
    batch = tasks[17].result()["cursor"]["nextBatch"]
    assert [e["documentKey"]["_id"] for e in batch] == [1]
    for t in tasks:
        t.cancel()  # the clients hang up
    await asyncio.gather(*tasks, return_exceptions=True)
    for cid in ids:
        state.cursors.kill(cid)


async def test_a_resumed_stream_joins_the_group_and_all_see_the_invalidate() -> None:
    """A stream resumed from a token reads by itself, then shares the group once past its
    token, getting the same events as a stream opened before; a drop invalidates both."""
    log = MemoryLog()
    log.insert({"_id": 0})
    state, conn = server_state(for_oplog(log)), ConnectionState(1, "test")

    async def command(cmd: dict[str, Any]) -> Any:
        reply = await run_command(state, conn, {**cmd, "$db": "db"})
        assert reply["ok"] == 1.0, reply
        return reply["cursor"]

    def aggregate(stages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        return {"aggregate": "c", "cursor": {}, "pipeline": [{"$changeStream": options}, *stages]}

    def get_more(cid: int) -> dict[str, Any]:
        return {"getMore": Int64(cid), "collection": "c", "maxTimeMS": 1}

    a = int((await command(aggregate([{"$match": {"fullDocument.u": 1}}])))["id"])
    for i in range(1, 4):
        log.insert({"_id": i, "u": 1})
    first = (await command(get_more(a)))["nextBatch"]
    assert [e["documentKey"]["_id"] for e in first] == [1, 2, 3]
    b_cursor = await command(aggregate([{"$match": {"fullDocument.u": {"$in": [1, 2]}}}],
                                       resumeAfter=first[0]["_id"]))
    b = int(b_cursor["id"])
    assert [e["documentKey"]["_id"] for e in b_cursor["firstBatch"]] == [2, 3]
    cursors = state.cursors.cursors
    assert cursors[b].group is cursors[a].group  # caught up: shares the group
    log.insert({"_id": 4, "u": 2})
    log.insert({"_id": 5, "u": 1})
    assert [e["documentKey"]["_id"] for e in (await command(get_more(a)))["nextBatch"]] == [5]
    assert [e["documentKey"]["_id"] for e in (await command(get_more(b)))["nextBatch"]] == [4, 5]
    log.append({"op": "c", "ns": "db.$cmd", "ui": Binary(bytes(16), 4), "o": {"drop": "c"},
                "o2": {"numRecords": 5}})
    for cid in (a, b):
        reply = await command(get_more(cid))
        # Their $match rejects the drop and the invalidate (as mongod's would); the cursor ends,
        # its post-batch token is the invalidate's.
        assert reply["nextBatch"] == [] and reply["id"] == 0
        assert resume_token.decode(reply["postBatchResumeToken"]).cluster_time == log._ts[-1]
    await asyncio.sleep(0)
