"""Many change streams in ONE client process: does every event arrive, and how late?

A real `cdcserver serve --in-memory`; one client process opens the streams (issue 30):

- async-distinct: N streams in one `AsyncMongoClient`, stream i `$match {fullDocument.u: i}`;
- sync-distinct: the same N streams in one sync `MongoClient`, a thread per stream;
- async-identical: M streams in one `AsyncMongoClient`, all with the same filter (every write
  reaches every stream).

A writer (another process) inserts at `--rate` writes/s for `--seconds`; write n has
`u = n % N`, so every distinct stream gets events. Each event's latency is its arrival at its
stream minus the insert's wall time (same machine). Prints p50/p99, events delivered of
expected, and p99 / the 250 ms limit (< 1 passes).

`--pool` lists the client's maxPoolSize values to run with (pymongo's default is 100; 0 is
no limit): with 100 and N awaitData getMores outstanding, the driver's pool, not the server,
is where a getMore waits (a getMore holds its connection for up to maxAwaitTimeMS).

    python bench/many_streams.py [--streams 1000] [--identical 200] [--seconds 20]
        [--rate 50] [--await-ms 500] [--pool 100,0] [--modes async-distinct,...]

Prints only; not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pathlib
import sys
import tempfile
import threading
import time
from typing import Any

from pymongo import AsyncMongoClient, MongoClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from cdcserver.testing import SubprocessServer  # noqa: E402

LIMIT_S = 0.250
DRAIN_S = 30.0  # after the last write, how long the streams may take to deliver the rest


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pipeline_for(identical: bool, i: int) -> list[dict[str, Any]]:
    if identical:
        return [{"$match": {"operationType": "insert", "fullDocument.u": {"$gte": 0}}}]
    return [{"$match": {"fullDocument.u": i}}]


def async_client(uri: str, n: int, identical: bool, await_ms: int, pool: int | None,
                 ready: Any, stop: Any, out: Any) -> None:
    async def main() -> None:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, maxPoolSize=pool)
        coll = client.bench.c
        latencies: list[float] = []
        streams = []
        for k in range(0, n, 100):
            streams += await asyncio.gather(*(
                coll.watch(pipeline_for(identical, i), max_await_time_ms=await_ms)
                for i in range(k, min(n, k + 100))
            ))

        async def read(stream: Any) -> None:
            while True:
                event = await stream.try_next()
                if event is not None:
                    latencies.append(time.time() - event["fullDocument"]["t"])

        tasks = [asyncio.create_task(read(s)) for s in streams]
        await asyncio.sleep(1.0)  # every stream's first getMore is out
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        out.put(latencies)
        await client.close()

    asyncio.run(main())


def sync_client(uri: str, n: int, identical: bool, await_ms: int, pool: int | None,
                ready: Any, stop: Any, out: Any) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(uri, maxPoolSize=pool)
    coll = client.bench.c
    latencies: list[float] = []
    lock = threading.Lock()
    streams = [coll.watch(pipeline_for(identical, i), max_await_time_ms=await_ms)
               for i in range(n)]
    halt = threading.Event()

    def read(stream: Any) -> None:
        while not halt.is_set():
            event = stream.try_next()
            if event is not None:
                lat = time.time() - event["fullDocument"]["t"]
                with lock:
                    latencies.append(lat)

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=read, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    time.sleep(1.0)
    ready.set()
    stop.wait()
    halt.set()
    with lock:
        out.put(list(latencies))
    out.close()
    out.join_thread()  # the queue's feeder thread sends it before the process goes
    os._exit(0)  # the threads sit in getMores of up to maxAwaitTimeMS: do not wait for them


def p50_p99(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    values = sorted(values)
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


def run(uri: str, pid: int, mode: str, n: int, seconds: float, rate: float, await_ms: int,
        pool: int | None) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    identical = mode.endswith("identical")
    target = sync_client if mode.startswith("sync") else async_client
    proc = ctx.Process(target=target, args=(uri, n, identical, await_ms, pool, ready, stop, out))
    proc.start()
    if not ready.wait(600):
        raise RuntimeError("the client never opened its streams")
    writes = int(seconds * rate)
    with MongoClient(uri) as writer:
        coll = writer.bench.c
        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        for w in range(writes):
            coll.insert_one({"u": w % n, "t": time.time()})
            delay = t0 + (w + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
    expected = writes * (n if identical else 1)
    time.sleep(min(DRAIN_S, max(2.0, 4 * await_ms / 1000)))
    stop.set()
    latencies: list[float] = out.get(timeout=120)
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
    p50, p99 = p50_p99(latencies)
    if len(latencies) < expected:
        p99 = float("inf")  # an event that never came is later than any limit
    return {"p50": p50, "p99": p99, "events": len(latencies), "expected": expected,
            "rate": writes / elapsed, "server_cpu": cpu / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--identical", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--await-ms", type=int, default=500)
    parser.add_argument("--pool", default="100,0", help="maxPoolSize values (0: no limit)")
    parser.add_argument("--modes", default="async-distinct,sync-distinct,async-identical")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = pathlib.Path(tmp) / "many.toml"
        config.write_text("[server]\nmax_connections = 30000\n")
        for pool_s in args.pool.split(","):
            pool = int(pool_s) or None
            for mode in args.modes.split(","):
                n = args.identical if mode.endswith("identical") else args.streams
                with SubprocessServer(extra_args=["--config", str(config)]) as server:
                    MongoClient(server.uri).bench.create_collection("c")
                    r = run(server.uri, server.pid, mode, n, args.seconds, args.rate,
                            args.await_ms, pool)
                print(
                    f"{mode:16s} N={n:<5d} maxPoolSize={pool_s:<4s} "
                    f"p50/p99 {1000 * r['p50']:8.1f}/{1000 * r['p99']:8.1f} ms  "
                    f"p99/250ms {r['p99'] / LIMIT_S:6.2f}  "
                    f"events {r['events']}/{r['expected']}  "
                    f"{r['rate']:.0f} writes/s  server CPU {r['server_cpu']:.2f} core",
                    flush=True,
                )


if __name__ == "__main__":
    main()
