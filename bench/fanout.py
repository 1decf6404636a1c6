"""Many change streams, each with its own filter, on one server: what a write costs.

A real `cdcserver serve --in-memory` process; K change streams on one collection opened by
client processes (AsyncMongoClient, one connection per stream) so the client side is not the
bottleneck; a writer inserts documents spaced `--interval-ms` apart. Runs:

- distinct: stream i has `[{"$match": {"fullDocument.u": i}}]`; each insert has a random `u`,
  so it reaches exactly one stream (indexed: the server looks at one stream per write);
- shared: every stream has the same filter and every insert matches it (reaches all K);
- unindexable: stream i has `{"$expr": {"$eq": ["$fullDocument.u", i]}}` (evaluated per stream
  per write, as without the index).

Prints per run: server CPU per write (from /proc, during the writes, minus the idle streams'
own CPU measured over an equal quiet period) and its ratio to K=1; p50/p99 from the insert to
the event arriving at its client; the server's RSS per idle stream.

Prints only; not a test. `python bench/fanout.py [--ks 1,100,1000,10000] [--writes 200]
[--interval-ms 20] [--procs 4] [--await-ms 1000] [--modes distinct,shared,unindexable]`.
With many streams on a small machine the clients' own polling (a getMore per stream per
`--await-ms`) can saturate the client processes: raise `--await-ms` or `--procs` then.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pathlib
import random
import sys
import tempfile
import time
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from cdcserver.testing import SubprocessServer  # noqa: E402

AWAIT_MS = 1000  # the drivers' default maxAwaitTimeMS for a tailing getMore (--await-ms)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pipeline_for(mode: str, i: int) -> list[dict[str, Any]]:
    if mode == "distinct":
        return [{"$match": {"fullDocument.u": i}}]
    if mode == "shared":
        return [{"$match": {"fullDocument.u": {"$gte": 0}, "operationType": "insert"}}]
    return [{"$match": {"$expr": {"$eq": ["$fullDocument.u", i]}}}]


def client_process(
    uri: str, mode: str, ids: list[int], await_ms: int, ready: Any, stop: Any, out: Any,
    count: Any,
) -> None:
    """Open a stream per id, report readiness, then record write->event latencies."""

    async def main() -> None:
        client: AsyncMongoClient = AsyncMongoClient(uri, maxPoolSize=None, maxConnecting=64)
        coll = client.bench.c
        latencies: list[float] = []
        streams = []
        for k in range(0, len(ids), 200):  # opened in waves: a real fleet does not all at once
            streams += await asyncio.gather(*(
                coll.watch(pipeline_for(mode, i), max_await_time_ms=await_ms)
                for i in ids[k : k + 200]
            ))
        ready.put(len(streams))

        async def read(stream: Any) -> None:
            while True:
                event = await stream.try_next()
                if event is not None:
                    latencies.append(time.time() - event["fullDocument"]["t"])
                    with count.get_lock():
                        count.value += 1

        tasks = [asyncio.create_task(read(s)) for s in streams]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        out.put(latencies)
        await client.close()

    asyncio.run(main())


def p50_p99(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    values = sorted(values)
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


def run(uri: str, pid: int, mode: str, k: int, writes: int, interval_s: float,
        procs: int, await_ms: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    count = ctx.Value("q", 0)
    ids = list(range(k))
    shares = [ids[p::procs] for p in range(min(procs, k))]
    rss_before = rss_kib(pid)
    workers = [
        ctx.Process(
            target=client_process, args=(uri, mode, share, await_ms, ready, stop, out, count)
        )
        for share in shares
    ]
    for w in workers:
        w.start()
    opened = sum(ready.get(timeout=600) for _ in workers)
    assert opened == k
    time.sleep(1.0)  # every stream's first getMore is waiting
    rss_per_stream = (rss_kib(pid) - rss_before) / k
    # Idle: the streams' own polling (a getMore per stream per maxAwaitTimeMS).
    quiet_s = writes * interval_s
    cpu0 = cpu_seconds(pid)
    time.sleep(quiet_s)
    idle_cpu = cpu_seconds(pid) - cpu0
    with MongoClient(uri) as writer:
        coll = writer.bench.c
        rng = random.Random(k)
        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        for n in range(writes):
            u = rng.randrange(k) if mode != "shared" else n
            coll.insert_one({"u": u, "t": time.time(), "pad": "x" * 100})
            next_at = t0 + (n + 1) * interval_s
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        write_cpu = cpu_seconds(pid) - cpu0
        elapsed = time.monotonic() - t0
    expected = writes * k if mode == "shared" else writes
    deadline = time.monotonic() + 60
    while count.value < expected and time.monotonic() < deadline:
        time.sleep(0.05)  # the last events in flight (their latency counts, not their CPU)
    stop.set()
    latencies: list[float] = []
    for _ in workers:
        latencies += out.get(timeout=120)
    for w in workers:
        w.join(timeout=30)
    net = max(write_cpu - idle_cpu * elapsed / quiet_s, 0.0)
    p50, p99 = p50_p99(latencies)
    return {
        "cpu_per_write_ms": 1000 * net / writes,
        "gross_cpu_per_write_ms": 1000 * write_cpu / writes,
        "idle_cpu_per_s_ms": 1000 * idle_cpu / quiet_s,
        "p50_ms": 1000 * p50,
        "p99_ms": 1000 * p99,
        "events": len(latencies),
        "rss_kib_per_stream": rss_per_stream,
        "writes_per_s": writes / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ks", default="1,100,1000,10000")
    parser.add_argument("--modes", default="distinct,shared,unindexable")
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--await-ms", type=int, default=AWAIT_MS)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        config = pathlib.Path(tmp) / "fanout.toml"
        config.write_text("[server]\nmax_connections = 30000\n\n[store]\nnoop_interval_s = 0\n")
        for mode in args.modes.split(","):
            base = None
            for k in ks:
                with SubprocessServer(extra_args=["--config", str(config)]) as server:
                    MongoClient(server.uri).bench.create_collection("c")
                    r = run(server.uri, server.pid, mode, k, args.writes,
                            args.interval_ms / 1000, args.procs, args.await_ms)
                if base is None:
                    base = r["cpu_per_write_ms"] or 1e-9
                print(
                    f"{mode:12s} K={k:<6d} CPU/write {r['cpu_per_write_ms']:7.2f} ms "
                    f"(x{r['cpu_per_write_ms'] / base:5.1f} of K={ks[0]}; gross "
                    f"{r['gross_cpu_per_write_ms']:.2f}, idle {r['idle_cpu_per_s_ms']:.0f} ms/s"
                    f" = {r['idle_cpu_per_s_ms'] * args.await_ms / k:.0f} us per idle getMore)"
                    f"  p50/p99 {r['p50_ms']:6.1f}/{r['p99_ms']:6.1f} ms"
                    f"  events {r['events']:<7d} {r['writes_per_s']:.0f} writes/s"
                    f" (await {args.await_ms} ms)"
                    f"  RSS/stream {r['rss_kib_per_stream']:.1f} KiB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
