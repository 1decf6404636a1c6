"""Sharded: write -> event latency through the embedded sharded front with idle shards.

One cluster of `--shards` shards (default 3) in this process (`ShardedServer`), a database
whose primary is shard0 (the busy shard) and the other shards idle; beside it, a single
embedded replica set (`EmbeddedServer`). A pymongo client watches the collection (a change
stream through the front, merged from every shard) and writes one document at a time; each
sample is the time from just before `insert_one` to the event's arrival in the stream. Then
the same through a sidecar of that cluster (`serve --upstream <the front>`): it tails each
shard's oplog (majority-committed entries) and reads each idle shard's oplog at
`afterClusterTime` of the busy shard's entry (the shard writes a no-op first, as a shard
mongod does), beside a sidecar of the single replica set (`--upstream` of it).

mongos waits for an idle shard's periodic no-op (up to 10 s by default, SERVER-80427) before
it can return an event of a busy shard; the front's idle shards promise the cluster's time at
once, so the ratio sharded / replica set printed last should stay near 1 (goal <= 1.2).

The sidecars are measured against upstreams in a process of their own (`cdcserver serve
--in-memory [--shards N]`), as a sidecar runs beside mongod: in one process the upstream's
work and the sidecar's share one interpreter lock. The sidecar of a cluster does more
requests per event (its tail's getMore and `hello` of the busy shard, a `find` on each idle
shard's oplog, one of `config.shards`: five with two idle shards) than a sidecar of a replica
set (its tail's getMore and a `hello`), each a few tenths of a millisecond of CPU on both
sides, which is what the sidecars' ratio measures. The requests each sidecar sent per event
are printed (a command monitor on its clients).

Measured here: see docs/sharding.md; the load of the machine is printed first.

Prints only; not a test. `python bench/sharded.py [--events N] [--shards N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import pymongo
from pymongo import monitoring

from cdcserver.sharding.testing import ShardedServer, ShardedSidecar
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from cdcserver.testing import EmbeddedServer, ThreadServer, die_with_parent, serving_port


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


def _sidecar_lags(front_uri: str, sidecar_uri: str, events: int) -> list[float]:
    with pymongo.MongoClient(front_uri) as client, pymongo.MongoClient(sidecar_uri) as side:
        coll = client.bench.c
        out = []
        with side.bench.c.watch(max_await_time_ms=1000) as stream:
            for i in range(events):
                started = time.perf_counter()
                coll.insert_one({"j": i})
                event = stream.next()
                out.append(time.perf_counter() - started)
                assert event["fullDocument"]["j"] == i
        return out


@contextlib.contextmanager
def _upstream(*args: str) -> Iterator[str]:
    """`cdcserver serve --in-memory ARGS` in a process of its own; yields its URI."""
    proc = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "cdcserver"), "serve", "--in-memory",
         "--port", "0", "--metrics-port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=die_with_parent,
    )
    try:
        port = serving_port(proc.stdout)  # type: ignore[arg-type]
        uri = f"mongodb://127.0.0.1:{port}/"
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            client.admin.command("ping")
        yield uri
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _writes(shard_host: str) -> int:
    """The bench's writes in a shard's oplog (an idle shard has only no-ops)."""
    name, _, hosts = shard_host.partition("/")
    with pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet={name}") as client:
        return client.local["oplog.rs"].count_documents({"ns": "bench.c", "op": "i"})


class _Requests(monitoring.CommandListener):
    """Counts the commands the sidecar's clients send upstream, by name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.counts[event.command_name] = self.counts.get(event.command_name, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()

    load = os.getloadavg()
    with EmbeddedServer() as single:
        rs = _lags(single.uri, args.events)

    def pin(client: pymongo.MongoClient) -> None:
        client.admin.command("enableSharding", "bench", primaryShard="shard0")

    with ShardedServer(args.shards) as cluster:
        sharded = _lags(cluster.uri, args.events, pin)
        idle = [cluster.call(s.log.latest_ts) for s in cluster.cluster.shards[1:]]
        busy = cluster.call(cluster.cluster.shards[0].log.latest_ts)
        assert all(ts < busy for ts in idle), "the other shards were not idle"

    # The sidecars, of a replica set and of a cluster, each upstream in its own process.
    with _upstream() as single_uri:
        rs_requests = _Requests()
        options = UpstreamOptions(uri=single_uri, majority_poll_ms=1.0,
                                  client_options={"event_listeners": [rs_requests]})
        with ThreadServer(make_log=lambda: UpstreamOplog(options), follow=True) as rs_side:
            assert rs_side.run(rs_side.state.oplog.wait_ready(10.0), timeout=15)
            rs_requests.counts.clear()  # start-up's aside
            rs_through = _sidecar_lags(single_uri, rs_side.uri, args.events)
            rs_per_event = sum(rs_requests.counts.values()) / args.events
    with _upstream("--shards", str(args.shards)) as front_uri:
        with pymongo.MongoClient(front_uri) as client:
            pin(client)
            hosts = [s["host"] for s in client.admin.command("listShards")["shards"]]
        # Writes to the cluster's front, events from the sidecar (which tails every shard and
        # nudges the idle ones).
        requests = _Requests()
        with ShardedSidecar(front_uri, majority_poll_ms=1.0,
                            client_options={"event_listeners": [requests]}) as side:
            requests.counts.clear()  # start-up's aside
            through = _sidecar_lags(front_uri, side.uri, args.events)
            nudges = side.upstream.nudges
            per_event = {k: v / args.events for k, v in sorted(requests.counts.items())}
            total_per_event = sum(requests.counts.values()) / args.events
        writes = [_writes(h) for h in hosts]
        assert writes[0] > 0 and not any(writes[1:]), "the other shards were not idle"
    load_after = os.getloadavg()

    print(f"load average before/after: {load[0]:.2f} / {load_after[0]:.2f} "
          f"({os.cpu_count()} cores)")
    print(f"write -> event, {args.events} events, one busy and {args.shards - 1} idle shards")
    print(f"  single replica set: p50 {_pct(rs, 0.5):6.2f} ms  p99 {_pct(rs, 0.99):6.2f} ms")
    print(f"  sidecar of a replica set (another process): p50 "
          f"{_pct(rs_through, 0.5):6.2f} ms  p99 {_pct(rs_through, 0.99):6.2f} ms  "
          f"({rs_per_event:.2f} upstream requests per event)")
    print(f"  sharded front     : p50 {_pct(sharded, 0.5):6.2f} ms  "
          f"p99 {_pct(sharded, 0.99):6.2f} ms")
    print(f"  sidecar of a cluster (another process): p50 {_pct(through, 0.5):6.2f} ms  "
          f"p99 {_pct(through, 0.99):6.2f} ms  ({nudges} reads of idle shards' oplogs)")
    print(f"    its upstream requests per event: {total_per_event:.2f} ("
          + ", ".join(f"{k} {v:.2f}" for k, v in per_event.items()) + ")")
    ratio = statistics.median(sharded) / statistics.median(rs)
    print(f"  ratio idle-shard cluster / single replica set (p50): {ratio:.2f} (goal <= 1.2)")
    ratio = statistics.median(through) / statistics.median(rs_through)
    print(f"  ratio sidecars, idle-shard cluster / single replica set (p50): {ratio:.2f}")


if __name__ == "__main__":
    main()
