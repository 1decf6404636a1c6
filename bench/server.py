"""The server end to end: a real `cdcserver serve` process and real pymongo clients.

1. Throughput: events/s delivered to one pymongo client replaying a recorded oplog of
   inserts (~300-byte documents), as a ratio to pymongo *decoding the same reply bytes*: the
   OP_MSG payloads the client received are captured during the timed run, then decoded again
   (a) with `bson.decode_all` and (b) the way pymongo's change streams do (reply with
   RawBSONDocument events, then each event to a dict). The ratio says how close the server
   gets to "as fast as the client can read". A client reads a batch before it asks for the
   next, so its own work (pymongo's ChangeStream.next costs more than the decode alone) adds
   to the server's: the last line prints the ceiling a server costing nothing would reach.
2. Latency: p50/p99 from appending an entry to a followed oplog file to the event arriving
   at the client, with 1, 100 and 1000 open change streams (AsyncMongoClient) on the server.
   Appends are spaced so each one's fan-out finishes before the next: this is the latency of
   one write seen by N streams, not a saturation test. The client is one Python process, so
   with many streams its own CPU (printed) is part of what is measured.

Prints only; not a test. `python bench/server.py [--events N] [--cursors 1,100,1000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import tempfile
import time

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, MongoClient, message
from workload import document, p50_p99  # bench/ is the script's directory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests.support

from cdcserver.testing import SubprocessServer, write_oplog  # noqa: E402
from tests.support.oplog_builders import Oplog  # noqa: E402

NS = "bench.items"


class Capture:
    """Keeps the OP_MSG payload of every reply pymongo receives (aggregate/getMore only)."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self._orig = message._UNPACK_REPLY[2013]

    def __enter__(self) -> Capture:
        def unpack(msg):
            reply = self._orig(msg)
            payload = bytes(reply.payload_document)
            if b"firstBatch" in payload[:64] or b"nextBatch" in payload[:64]:
                self.payloads.append(payload)
            return reply

        message._UNPACK_REPLY[2013] = unpack
        return self

    def __exit__(self, *exc: object) -> None:
        message._UNPACK_REPLY[2013] = self._orig


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def pipeline_us_per_event(path: pathlib.Path, first: object) -> float:
    """The server's per-event share without sockets or commands: the same recorded oplog read,
    run through one stream's pipeline in steps of 100 entries (as the server prefetches) and
    drained in batches of 101, in this process with the server's GC settings. What the server
    spends beyond this per event is its getMore/reply path."""
    import gc

    from bson.timestamp import Timestamp

    from cdcserver.hub import Hub
    from cdcserver.sources.file import FileOplog
    from pipeline_stages.pipeline import ChangeStreamPipeline
    from pipeline_stages.spec import parse_aggregate

    assert isinstance(first, Timestamp)
    log = FileOplog([str(path)])
    spec = parse_aggregate(
        {"aggregate": "items", "cursor": {},
         "pipeline": [{"$changeStream": {"startAtOperationTime": first}}]}, "bench",
    )
    thresholds = gc.get_threshold()
    gc.set_threshold(10_000, 10, 10)  # as `serve` runs
    try:
        best = float("inf")
        for _ in range(2):
            group, pipeline = Hub().group_for(
                spec, first, log, lambda: ChangeStreamPipeline(spec, first, history=log)
            )
            events = 0
            start = time.process_time()
            while True:
                while pipeline.pending_count < 101 and group.step(None, 100) is True:  # type: ignore[arg-type]
                    pass
                got = len(pipeline.next_batch(101).events)
                if not got:
                    break
                events += got
            best = min(best, (time.process_time() - start) / max(events, 1))
    finally:
        gc.set_threshold(*thresholds)
    return best * 1e6


def throughput(tmp: pathlib.Path, n: int, batch_size: int | None) -> None:
    oplog = Oplog()
    first = oplog.create(NS)["ts"]
    for i in range(n):
        oplog.insert(NS, document(i))
    path = write_oplog(tmp / "throughput.bson", oplog.entries)
    with SubprocessServer([path], follow=False) as server, MongoClient(server.uri) as client:
        coll = client.bench.items
        client.admin.command("ping")
        with Capture() as capture:
            server_cpu = cpu_seconds(server.pid)
            client_cpu = time.process_time()
            start = time.perf_counter()
            with coll.watch(start_at_operation_time=first, batch_size=batch_size) as stream:
                for _ in range(n):
                    stream.next()
            elapsed = time.perf_counter() - start
            client_cpu = time.process_time() - client_cpu
            server_cpu = cpu_seconds(server.pid) - server_cpu
    payloads = capture.payloads
    events = sum(
        len(d["cursor"].get("firstBatch", d["cursor"].get("nextBatch", [])))
        for d in map(bson.decode, payloads)
    )
    assert events >= n, (events, n)
    reply_bytes = sum(map(len, payloads))

    def decode_all() -> None:
        for p in payloads:
            bson.decode_all(p)

    raw_options = CodecOptions(document_class=RawBSONDocument)
    user_fields = {"cursor": {"firstBatch": 1, "nextBatch": 1}}
    dict_options = CodecOptions()

    def driver_decode() -> None:
        for p in payloads:
            reply = message._OpMsg(0, p).unpack_response(
                codec_options=raw_options, user_fields=user_fields
            )[0]
            cursor = reply["cursor"]
            for event in cursor.get("firstBatch") or cursor.get("nextBatch") or []:
                bson.decode(event.raw, dict_options)

    t_all = _best(decode_all)
    t_driver = _best(driver_decode)
    rate = n / elapsed
    label = "default" if batch_size is None else str(batch_size)
    print(
        f"throughput (batch_size={label}): {n} events in {elapsed:.2f}s = {rate:,.0f} events/s; "
        f"{len(payloads)} replies, {reply_bytes / len(payloads) / 1024:.0f} KiB each; "
        f"server CPU {server_cpu / n * 1e6:.1f} us/event (steadier than the rate on a busy box)"
    )
    print(
        f"  of which the pipeline (in process, no sockets): "
        f"{pipeline_us_per_event(path, first):.1f} us/event; the client decodes an event in "
        f"{t_driver / events * 1e6:.1f} us"
    )
    print(
        f"  vs bson.decode_all of the same replies: {events / t_all:,.0f} events/s "
        f"-> ratio {rate / (events / t_all):.3f}"
    )
    print(
        f"  vs pymongo's change-stream decode (raw reply + dict per event): "
        f"{events / t_driver:,.0f} events/s -> ratio {rate / (events / t_driver):.3f}"
    )
    # The client asks for a batch only once it has read the last one, so the server's work and
    # the client's own are one after the other: the rate is at most n / (client CPU), whatever
    # the server costs, and each ratio above at most its decode time over the client's CPU.
    print(
        f"  the client's own CPU: {client_cpu / n * 1e6:.1f} us/event (ChangeStream.next: reply "
        f"decode, per-event dict, token bookkeeping); with a server costing nothing the ratios "
        f"could reach at most {t_all / client_cpu:.2f} (decode_all) and "
        f"{t_driver / client_cpu:.2f} (change-stream decode)"
    )


async def _latency(
    server: SubprocessServer, oplog: Oplog, cursors: int, events: int, await_ms: int
) -> list:
    samples: list[float] = []
    async with AsyncMongoClient(
        server.uri, maxPoolSize=cursors + 10, maxConnecting=16
    ) as client:
        coll = client.bench.items
        streams = [await coll.watch(max_await_time_ms=await_ms) for _ in range(cursors)]

        async def read(stream) -> None:
            for _ in range(events):
                event = await stream.next()
                samples.append(time.time() - event["fullDocument"]["sent"])

        readers = [asyncio.ensure_future(read(s)) for s in streams]
        await asyncio.sleep(0.5)  # let every stream reach its awaitData getMore
        sent = 0
        for i in range(events):
            oplog.insert(NS, {"_id": f"lat-{cursors}-{i}", "sent": time.time()})
            server.append(oplog.entries[-1:])
            sent += 1
            # Spaced so one append's fan-out is done before the next (latency, not saturation),
            # and not in phase with the file poll.
            await asyncio.sleep(0.02 + cursors * 0.001 + (i % 7) * 0.003)
        await asyncio.wait_for(asyncio.gather(*readers), 300)
        for stream in streams:
            await stream.close()
    return samples


def latency(tmp: pathlib.Path, cursor_counts: list[int], events: int, await_ms: int) -> None:
    oplog = Oplog()
    oplog.create(NS)
    path = write_oplog(tmp / "latency.bson", oplog.entries)
    with SubprocessServer([path], follow=True) as server:
        for cursors in cursor_counts:
            per_stream = max(20, events // max(1, cursors // 10))
            rss_before = server.rss_kib()
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            samples = asyncio.run(_latency(server, oplog, cursors, per_stream, await_ms))
            server_cpu = cpu_seconds(server.pid) - server_cpu
            client_cpu = time.process_time() - client_cpu
            samples.sort()
            p50, p99 = p50_p99(samples)
            print(
                f"latency, {cursors:>4} cursors (maxAwaitTimeMS {await_ms}): "
                f"p50 {p50 * 1000:6.1f} ms, p99 {p99 * 1000:6.1f} ms"
                f" ({per_stream} appends, {len(samples)} deliveries; CPU s: server "
                f"{server_cpu:.1f}, client {client_cpu:.1f}; server RSS "
                f"{rss_before / 1024:.0f} -> {server.rss_kib() / 1024:.0f} MiB)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--cursors", default="1,100,1000")
    parser.add_argument("--latency-events", type=int, default=100)
    parser.add_argument(
        "--await-ms", type=int, default=1000,
        help="maxAwaitTimeMS of the latency streams (idle streams poll at this period)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdcserver-bench-") as tmp:
        tmp_path = pathlib.Path(tmp)
        throughput(tmp_path, args.events, args.batch_size)
        counts = [int(c) for c in args.cursors.split(",") if c]
        latency(tmp_path, counts, args.latency_events, args.await_ms)


if __name__ == "__main__":
    main()
