"""Change-stream pipeline throughput on a CRUD mix of 1 KiB documents, collection scope.

Prints events/s of `ChangeStreamPipeline` (oplog bytes in -> encoded events out) with no user
stages and with a `$match` that keeps ~5% of the events, each as a ratio to the limit measured in
the same run: `bson.decode_all` of the oplog bytes plus `bson.encode` of the resulting events
(the bare C cost of reading the input and writing the output). Target: >= 0.5 with no stages.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import random
import time

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages.oplog_entry import iter_entries
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate


def make_oplog(n: int, seed: int = 1) -> bytes:
    """inserts 40%, $v:2 updates 40%, replaces 10%, deletes 10%, as mongod 8.0 writes them."""
    rng = random.Random(seed)
    uuid = bson.Binary(os.urandom(16), 4)
    wall = datetime.datetime(2026, 11, 21, 12, 0, 0)
    out = []
    live: list[int] = []
    next_id = 0
    for i in range(n):
        ts = Timestamp(1_800_000_000 + i // 1000, i % 1000 + 1)
        roll = rng.random()
        base = {"ts": ts, "t": Int64(1), "v": Int64(2)}
        if roll < 0.4 or len(live) < 10:
            doc = {"_id": next_id, "name": f"user{next_id}", "n": next_id % 100,
                   "tags": ["a", "b", "c"], "pad": "x" * 900}
            live.append(next_id)
            next_id += 1
            e = {**base, "op": "i", "ns": "bench.items", "ui": uuid, "o": doc,
                 "o2": {"_id": doc["_id"]}, "wall": wall}
        elif roll < 0.8:
            k = rng.choice(live)
            e = {**base, "op": "u", "ns": "bench.items", "ui": uuid,
                 "o": {"$v": 2, "diff": {"u": {"n": rng.randrange(100)}, "i": {"seen": True}}},
                 "o2": {"_id": k}, "wall": wall}
        elif roll < 0.9:
            k = rng.choice(live)
            e = {**base, "op": "u", "ns": "bench.items", "ui": uuid,
                 "o": {"_id": k, "name": f"user{k}", "n": 7, "pad": "y" * 950},
                 "o2": {"_id": k}, "wall": wall}
        else:
            k = live.pop(rng.randrange(len(live)))
            e = {**base, "op": "d", "ns": "bench.items", "ui": uuid, "o": {"_id": k},
                 "wall": wall}
        out.append(bson.encode(e))
    return b"".join(out)


def run_pipeline(oplog: bytes, stages: list[dict]) -> list:
    spec = parse_aggregate(
        {"aggregate": "items", "pipeline": [{"$changeStream": {}}, *stages]}, "bench"
    )
    p = ChangeStreamPipeline(spec, Timestamp(0, 0))
    return p.process(iter_entries(oplog)).events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    oplog = make_oplog(args.n)
    # As `serve` runs (cdcserver/server.py): at the default 700 the young collections rescan
    # the batch's live entries and events over and over, which is this process's cost, not
    # the pipeline's.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    match_5 = [{"$match": {"operationType": "insert", "fullDocument.n": {"$lt": 12}}}]
    events = run_pipeline(oplog, [])
    dicts = [bson.decode(e.raw) for e in events]  # what a C encoder would be handed

    def limit() -> None:
        bson.decode_all(oplog)
        for d in dicts:
            bson.encode(d)

    cases = {"limit": limit, "no stages": lambda: run_pipeline(oplog, []),
             "$match ~5%": lambda: run_pipeline(oplog, match_5)}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.repeat):  # interleaved so machine load hits all alike
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    kept = len(run_pipeline(oplog, match_5))
    limit_rate = args.n / best["limit"]
    print(f"{args.n} oplog entries of ~1 KiB, {len(events)} events; $match keeps {kept}")
    print(f"{'case':<12} {'entries/s':>12} {'ratio to limit':>15}")
    for name in cases:
        rate = args.n / best[name]
        print(f"{name:<12} {rate:>12,.0f} {rate / limit_rate:>15.2f}")


if __name__ == "__main__":
    main()
