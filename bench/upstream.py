"""Live upstream: B (`cdcserver serve --upstream`) serving the change streams of A.

A is a `cdcserver serve --in-memory` process (the embedded store: no mongod here) and B a
`cdcserver serve --upstream mongodb://A` process; the clients are this process (pymongo's
AsyncMongoClient), so with many streams the client's own CPU (printed) is part of what is
measured.

1. Throughput: events/s delivered to K streams (1, 100, 1000) reading the same recorded
   inserts (startAtOperationTime before them) from B, as a ratio to the same K streams
   watching A directly (best of `--rounds`, A and B alternately). B serves them from its
   window (it tailed A while they were written). On a 2-core machine the client's decoding
   is the bottleneck with many streams (its CPU is printed), so expect ratios near 1.
2. Lag: p50/p99 from just before `insert_one` is sent to A to the event arriving at a client
   of B, with K streams open on B (every stream's receipt is a sample), next to the same
   measured watching A directly. Writes are spaced
   so one write's fan-out is done before the next: the latency of a write seen by K
   streams, not a saturation test.

3. The durable retained log (`upstream.retain_dir`, docs/sidecar.md): a third
   process R, B with the log on, measured alongside: throughput R/B and lag of R next to B
   (every entry R delivers is first appended to its SQLite log). `--no-retained` leaves it
   out. With `--window N` (B's and R's live window, entries) smaller than `--events`, the
   streams read history: B from A's oplog, R from its own log.

Measured here (2 shared cores, 10,000 events, one round each, so +-30% noise): from the live
window R/B = 0.92 (1 stream) and 1.44 (100 streams); reading history (`--window 1000`) R/B =
1.56 (1 stream: R reads its SQLite log, B re-reads A's oplog) and 1.10 (100 streams); lag
p50 5.6 ms on R vs 6.3 ms on B (1 stream), 28.6 vs 29.6 ms (100 streams). The durable log
costs nothing measurable on these paths; it is faster than re-reading the upstream.

Prints only; not a test. `python bench/upstream.py [--events N] [--streams 1,100,1000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

from pymongo import AsyncMongoClient, MongoClient
from workload import document, p50_p99  # bench/ is the script's directory

from cdcserver.testing import die_with_parent

HOST = "127.0.0.1"
NS_DB, NS_COLL = "bench", "items"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Process:
    def __init__(
        self, name: str, args: list[str], log_dir: pathlib.Path, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST,
                 "--port", str(self.port), "--metrics-port", "0", *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                preexec_fn=die_with_parent,  # a bench killed midway leaves no server behind
            )
        deadline = time.monotonic() + 30
        while b"listening on" not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{self.log_path.read_text()}")
            time.sleep(0.02)

    @property
    def uri(self) -> str:
        return f"mongodb://{HOST}:{self.port}/?directConnection=true"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_caught_up(b_uri: str, a_uri: str) -> None:
    """Until B reports A's last operation time (its cluster time follows A's oplog)."""
    with MongoClient(a_uri) as ca, MongoClient(b_uri) as cb:
        target = ca.admin.command("ping")["operationTime"]
        deadline = time.monotonic() + 120
        while cb.admin.command("ping")["operationTime"] < target:
            if time.monotonic() > deadline:
                raise RuntimeError("B did not catch up with A")
            time.sleep(0.01)


async def _read_all(uri: str, streams: int, per_stream: int, start) -> float:
    """K streams from `start`, each until `per_stream` events; returns the elapsed time."""
    async with AsyncMongoClient(uri, maxPoolSize=streams + 10, maxConnecting=16) as client:
        coll = client[NS_DB][NS_COLL]
        opened = [
            await coll.watch(start_at_operation_time=start, max_await_time_ms=200)
            for _ in range(streams)
        ]

        async def read(stream) -> None:
            for _ in range(per_stream):
                await stream.next()

        begin = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(read(s) for s in opened)), 600)
        elapsed = time.perf_counter() - begin
        for s in opened:
            await s.close()
    return elapsed


def throughput(a: Process, b: Process, n: int, counts: list[int], rounds: int,
               r: Process | None = None) -> None:
    with MongoClient(a.uri) as ca:
        start = ca.admin.command("ping")["operationTime"]
        coll = ca[NS_DB][NS_COLL]
        for i in range(0, n, 1000):
            coll.insert_many([document(j) for j in range(i, min(n, i + 1000))])
    wait_caught_up(b.uri, a.uri)
    if r is not None:
        wait_caught_up(r.uri, a.uri)
    servers = [("A", a), ("B", b)] + ([("R", r)] if r is not None else [])
    for streams in counts:
        per_stream = max(500, n // streams)
        rates: dict[str, float] = {}
        # A and B alternately, best of `rounds` each: both share this machine's cores with
        # the client, so one run alone is noisy.
        for _ in range(rounds):
            for name, server in servers:
                cpu = cpu_seconds(server.proc.pid)
                elapsed = asyncio.run(_read_all(server.uri, streams, per_stream, start))
                cpu = cpu_seconds(server.proc.pid) - cpu
                rate = streams * per_stream / elapsed
                rates[name] = max(rates.get(name, 0.0), rate)
                print(
                    f"  {name}: {streams:>4} streams x {per_stream} events in {elapsed:.2f}s "
                    f"= {rate:,.0f} events/s (server CPU {cpu:.1f}s, opening included)"
                )
        print(
            f"throughput, {streams:>4} streams: B/A = {rates['B'] / rates['A']:.2f} "
            f"(B {rates['B']:,.0f} events/s, watching A directly {rates['A']:,.0f})"
        )
        if "R" in rates:
            print(
                f"throughput, {streams:>4} streams: durable log on / in-memory window = "
                f"R/B = {rates['R'] / rates['B']:.2f} (R {rates['R']:,.0f} events/s)"
            )


async def _lag(watch_uri: str, a_uri: str, streams: int, writes: int, tag: str) -> list[float]:
    samples: list[float] = []
    async with (
        AsyncMongoClient(watch_uri, maxPoolSize=streams + 10, maxConnecting=16) as client,
        AsyncMongoClient(a_uri) as writer,
    ):
        coll = client[NS_DB][NS_COLL]
        opened = [await coll.watch(max_await_time_ms=1000) for _ in range(streams)]

        async def read(stream) -> None:
            for _ in range(writes):
                event = await stream.next()
                samples.append(time.time() - event["fullDocument"]["sent"])

        readers = [asyncio.ensure_future(read(s)) for s in opened]
        await asyncio.sleep(0.5)  # every stream in its awaitData getMore
        target = writer[NS_DB][NS_COLL]
        for i in range(writes):
            await target.insert_one({"_id": f"lag-{tag}-{streams}-{i}", "sent": time.time()})
            await asyncio.sleep(0.02 + streams * 0.001 + (i % 7) * 0.003)
        await asyncio.wait_for(asyncio.gather(*readers), 600)
        for s in opened:
            await s.close()
    return samples


def lag(a: Process, b: Process, counts: list[int], writes: int,
        r: Process | None = None) -> None:
    servers = [("A", a), ("B", b)] + ([("R", r)] if r is not None else [])
    for streams in counts:
        per = max(20, writes // max(1, streams // 10))
        for name, server in servers:
            cpu_client = time.process_time()
            cpu_server = cpu_seconds(server.proc.pid)
            samples = sorted(asyncio.run(_lag(server.uri, a.uri, streams, per, name)))
            p50, p99 = p50_p99(samples)
            print(
                f"lag, {streams:>4} streams on {name}: p50 {p50 * 1000:6.1f} ms, "
                f"p99 {p99 * 1000:6.1f} ms ({per} writes, {len(samples)} deliveries; CPU s: "
                f"{name} {cpu_seconds(server.proc.pid) - cpu_server:.1f}, "
                f"client {time.process_time() - cpu_client:.1f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--streams", default="1,100,1000")
    parser.add_argument("--lag-writes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs of A and B each")
    parser.add_argument("--window", type=int, help="B's and R's window_entries")
    parser.add_argument("--no-retained", action="store_true",
                        help="leave out R (B with the durable retained log)")
    args = parser.parse_args()
    counts = [int(c) for c in args.streams.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="cdcserver-bench-") as tmp:
        logs = pathlib.Path(tmp)
        a = Process("a", ["--in-memory"], logs)
        try:
            window = {} if args.window is None else {
                "CDCSERVER_UPSTREAM_WINDOW_ENTRIES": str(args.window)
            }
            b = Process("b", ["--upstream", a.uri], logs, env=window)
            r = None
            try:
                if not args.no_retained:
                    r = Process("r", ["--upstream", a.uri], logs, env={
                        **window, "CDCSERVER_UPSTREAM_RETAIN_DIR": str(logs / "retained")
                    })
                throughput(a, b, args.events, counts, args.rounds, r)
                lag(a, b, counts, args.lag_writes, r)
            finally:
                b.stop()
                if r is not None:
                    r.stop()
        finally:
            a.stop()


if __name__ == "__main__":
    main()
