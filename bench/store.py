"""The embedded store's writes and scans, each as a ratio to its floor measured in the same run.

Writes: 20 000 documents of ~230 bytes, `insert_many` in batches of 100 through pymongo,
against `cdcserver serve --data-dir` (durable, `synchronous` as the floor's) and
`serve --in-memory`. Floor: raw SQLite, a document row and an oplog row per document, one
transaction per batch, WAL, `synchronous=NORMAL`, both encoded in Python with `bson.encode`.

Scans: `find({u: 5})` over those documents with no index, against the floor of
`bson.decode_all` over every document of the collection (the raw rows, in this process);
then the same find with an index on `u` (an IXSCAN reading only the 200 matches).

Median of `--rounds` runs. Prints only; not a test.
`python bench/store.py [--docs N] [--rounds R] [--only writes|scans]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo import MongoClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from cdcserver.testing import SubprocessServer  # noqa: E402

BATCH = 100


def document(i: int) -> dict[str, Any]:
    """A ~230-byte document; `u` takes 100 values (200 matches of `u: 5` in 20 000)."""
    return {
        "_id": i,
        "name": f"user{i}",
        "email": f"user{i}@example.com",
        "u": i % 100,
        "score": i * 0.5,
        "tags": ["alpha", "beta", "gamma"],
        "address": {"street": f"{i} Main St", "city": "Springfield", "zip": f"{i % 99999:05d}"},
        "pad": "x" * 7,
    }


def raw_sqlite(directory: str, docs: list[dict[str, Any]]) -> float:
    """Seconds to write each document and its oplog entry into SQLite, a transaction a batch."""
    db = sqlite3.connect(os.path.join(directory, "raw.sqlite3"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE documents (uuid BLOB, id BLOB, doc BLOB, PRIMARY KEY (uuid, id))")
    db.execute("CREATE TABLE oplog (ts INTEGER PRIMARY KEY, entry BLOB NOT NULL)")
    uuid = os.urandom(16)
    ui = bson.Binary(uuid, 4)
    start = time.perf_counter()
    n = 0
    for b in range(0, len(docs), BATCH):
        db.execute("BEGIN")
        for doc in docs[b:b + BATCH]:
            n += 1
            raw = bson.encode(doc)
            entry = bson.encode({
                "op": "i", "ns": "bench.c", "ui": ui, "o": doc, "o2": {"_id": doc["_id"]},
                "ts": Timestamp(1, n), "t": Int64(1), "v": Int64(2), "wall": None,
            })
            db.execute("INSERT INTO documents VALUES (?, ?, ?)",
                       (uuid, bson.encode({"": doc["_id"]}), raw))
            db.execute("INSERT INTO oplog VALUES (?, ?)", (n, entry))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def through_pymongo(uri: str, docs: list[dict[str, Any]]) -> float:
    with MongoClient(uri) as client:
        coll = client.bench.c
        coll.drop()
        coll.insert_one({"_id": "warm-up"})  # creates the collection: not timed
        start = time.perf_counter()
        for b in range(0, len(docs), BATCH):
            coll.insert_many(docs[b:b + BATCH])
        elapsed = time.perf_counter() - start
        assert coll.estimated_document_count() == len(docs) + 1
        coll.delete_one({"_id": "warm-up"})
    return elapsed


def scan(uri: str, raws: list[bytes]) -> tuple[float, float, int, float]:
    """(seconds of find({u: 5}), seconds of bson.decode_all over every document, matches,
    seconds of find({u: 5}) with an index on u)."""
    blob = b"".join(raws)
    # the cyclic GC, walking this process's 20 000 documents, can triple decode_all's time:
    # the floor is taken with it off (the stricter, lower floor)
    gc.disable()
    try:
        start = time.perf_counter()
        bson.decode_all(blob)
        floor = time.perf_counter() - start
    finally:
        gc.enable()
    with MongoClient(uri) as client:
        coll = client.bench.c
        list(coll.find({"u": 5}))  # warm
        start = time.perf_counter()
        found = list(coll.find({"u": 5}))
        elapsed = time.perf_counter() - start
        coll.create_index("u")
        list(coll.find({"u": 5}))  # warm: builds the index's table
        start = time.perf_counter()
        indexed = list(coll.find({"u": 5}))
        with_index = time.perf_counter() - start
        assert len(indexed) == len(found)
        coll.drop_index("u_1")
    return elapsed, floor, len(found), with_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["writes", "scans"])
    args = parser.parse_args()
    docs = [document(i) for i in range(args.docs)]
    raws = [bson.encode(d) for d in docs]
    print(f"{len(docs)} documents of ~{sum(map(len, raws)) / len(raws):.0f} bytes, "
          f"insert_many batches of {BATCH}, median of {args.rounds}")
    times: dict[str, list[float]] = {"raw": [], "durable": [], "memory": [],
                                     "find": [], "decode": [], "indexed": []}
    with tempfile.TemporaryDirectory(prefix="cdcserver-bench-") as tmp:
        config = pathlib.Path(tmp, "bench.toml")
        config.write_text('[store]\nsynchronous = "normal"\nnoop_interval_s = 0\n')
        for r in range(args.rounds):
            if args.only != "scans":
                times["raw"].append(raw_sqlite(tempfile.mkdtemp(dir=tmp), docs))
                durable = SubprocessServer(data_dir=pathlib.Path(tmp, f"data{r}"),
                                           extra_args=["--config", str(config)])
                try:
                    times["durable"].append(through_pymongo(durable.uri, docs))
                finally:
                    durable.stop()
            memory = SubprocessServer(extra_args=["--config", str(config)])
            try:
                t = through_pymongo(memory.uri, docs)
                if args.only != "scans":
                    times["memory"].append(t)
                if args.only != "writes":
                    found, floor, n, indexed = scan(memory.uri, raws)
                    assert n == sum(1 for d in docs if d["u"] == 5), n
                    times["find"].append(found)
                    times["decode"].append(floor)
                    times["indexed"].append(indexed)
            finally:
                memory.stop()
    med = {k: statistics.median(v) for k, v in times.items() if v}
    if "raw" in med:
        raw = med["raw"]
        print(f"raw SQLite floor (doc + oplog row, WAL, NORMAL): {raw:7.3f} s")
        for name in ("durable", "memory"):
            print(f"insert_many, {name:8s} store:                {med[name]:7.3f} s   "
                  f"{len(docs) / med[name]:8.0f} docs/s   ratio {med[name] / raw:.2f}")
    if "find" in med:
        print(f"bson.decode_all of every document, GC off (floor): {med['decode'] * 1e3:5.1f} ms")
        print(f"find({{u: 5}}), no index:                         {med['find'] * 1e3:7.1f} ms"
              f"   ratio {med['find'] / med['decode']:.2f}")
        print(f"find({{u: 5}}), index on u:                       {med['indexed'] * 1e3:7.1f} ms"
              f"   ratio {med['indexed'] / med['decode']:.2f}")


if __name__ == "__main__":
    main()
