"""Sharded: write -> event latency through the embedded sharded front with idle shards.

One cluster of `--shards` shards (default 3) in this process (`ShardedServer`), a database
whose primary is shard0 (the busy shard) and the other shards idle; beside it, a single
embedded replica set (`EmbeddedServer`). A pymongo client watches the collection (a change
stream through the front, merged from every shard) and writes one document at a time; each
sample is the time from just before `insert_one` to the event's arrival in the stream.

mongos waits for an idle shard's periodic no-op (up to 10 s by default, SERVER-80427) before
it can return an event of a busy shard; the front's idle shards promise the cluster's time at
once, so the ratio sharded / replica set printed last should stay near 1 (goal <= 1.2).

Prints only; not a test. `python bench/sharded.py [--events N] [--shards N]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pymongo

from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import EmbeddedServer


def _lags(uri: str, events: int, prepare=None) -> list[float]:
    with pymongo.MongoClient(uri) as client:
        if prepare is not None:
            prepare(client)
        coll = client.bench.c
        coll.insert_one({"warm": True})
        out = []
        with coll.watch(max_await_time_ms=1000) as stream:
            for i in range(events):
                started = time.perf_counter()
                coll.insert_one({"i": i})
                event = stream.next()
                out.append(time.perf_counter() - started)
                assert event["fullDocument"]["i"] == i
        return out


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()

    with EmbeddedServer() as single:
        rs = _lags(single.uri, args.events)

    def pin(client: pymongo.MongoClient) -> None:
        client.admin.command("enableSharding", "bench", primaryShard="shard0")

    with ShardedServer(args.shards) as cluster:
        sharded = _lags(cluster.uri, args.events, pin)
        idle = [cluster.call(s.log.latest_ts) for s in cluster.cluster.shards[1:]]
        busy = cluster.call(cluster.cluster.shards[0].log.latest_ts)
    assert all(ts < busy for ts in idle), "the other shards were not idle"

    print(f"write -> event, {args.events} events, one busy and {args.shards - 1} idle shards")
    print(f"  single replica set: p50 {_pct(rs, 0.5):6.2f} ms  p99 {_pct(rs, 0.99):6.2f} ms")
    print(f"  sharded front     : p50 {_pct(sharded, 0.5):6.2f} ms  "
          f"p99 {_pct(sharded, 0.99):6.2f} ms")
    ratio = statistics.median(sharded) / statistics.median(rs)
    print(f"  ratio idle-shard cluster / single replica set (p50): {ratio:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
