"""The embedded store's write path: acknowledged inserts/s through pymongo, against a
`cdcserver serve --data-dir` process (durable: SQLite WAL, `synchronous = full` by default),
with the default write concern (w:1) and with `j: true`, each as a ratio to raw SQLite
inserts of the same BSON documents measured in the same run (one row and one commit per
document, the same WAL mode and `synchronous` setting: the least an acknowledged durable
insert can cost on this machine and disk).

An acknowledged insert does more than the raw one: the wire round trip, command parsing,
the mongomock working set, the unique `_id` check, the oplog entry (a second row in the same
SQLite transaction) and the reply. A ratio of 1.0 would mean all of that costs nothing.

Prints only; not a test. `python bench/embedded.py [--docs N] [--synchronous full|normal]`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sqlite3
import sys
import tempfile
import time

import bson
from pymongo import MongoClient, WriteConcern
from workload import document  # bench/ is the script's directory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from cdcserver.testing import SubprocessServer  # noqa: E402


def raw_sqlite(directory: str, docs: list[bytes], synchronous: str) -> float:
    """Inserts/s of the same BSON into SQLite: one row, one commit each."""
    db = sqlite3.connect(os.path.join(directory, "raw.sqlite3"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    db.execute("CREATE TABLE documents (uuid BLOB, id BLOB, doc BLOB, PRIMARY KEY (uuid, id))")
    uuid = os.urandom(16)
    start = time.perf_counter()
    for i, raw in enumerate(docs):
        db.execute("BEGIN")
        db.execute("INSERT INTO documents VALUES (?, ?, ?)", (uuid, i.to_bytes(8, "big"), raw))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return len(docs) / elapsed


def through_pymongo(uri: str, docs: list[dict], journal: bool) -> float:
    """Acknowledged inserts/s, one insert_one per document (the driver waits for each)."""
    with MongoClient(uri) as client:
        wc = WriteConcern(w=1, j=True) if journal else WriteConcern()
        coll = client.bench.get_collection("j" if journal else "w1", write_concern=wc)
        coll.insert_one({"_id": "warm-up"})  # creates the collection: not timed
        start = time.perf_counter()
        for doc in docs:
            coll.insert_one(doc)
        elapsed = time.perf_counter() - start
        assert coll.count_documents({}) == len(docs) + 1
    return len(docs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000, help="inserts per measurement")
    parser.add_argument("--synchronous", default="full", choices=["normal", "full"])
    parser.add_argument("--rounds", type=int, default=3, help="best of N for each figure")
    args = parser.parse_args()

    docs = [document(i) for i in range(args.docs)]
    raws = [bson.encode(d) for d in docs]
    size = sum(len(r) for r in raws) / len(raws)
    print(f"{args.docs} documents of ~{size:.0f} bytes, SQLite synchronous={args.synchronous}")

    with tempfile.TemporaryDirectory(prefix="cdcserver-bench-") as tmp:
        config = pathlib.Path(tmp, "bench.toml")
        config.write_text(
            f'[store]\nsynchronous = "{args.synchronous}"\nnoop_interval_s = 0\n'
        )
        results: dict[str, float] = {"raw": 0.0, "w1": 0.0, "j": 0.0}
        for r in range(args.rounds):
            raw_dir = tempfile.mkdtemp(dir=tmp)
            results["raw"] = max(results["raw"], raw_sqlite(raw_dir, raws, args.synchronous))
            server = SubprocessServer(
                data_dir=pathlib.Path(tmp, f"data{r}"), extra_args=["--config", str(config)]
            )
            try:
                results["w1"] = max(results["w1"], through_pymongo(server.uri, docs, False))
                results["j"] = max(results["j"], through_pymongo(server.uri, docs, True))
            finally:
                server.stop()

    raw = results["raw"]
    print(f"raw SQLite inserts (same BSON, one commit each): {raw:10.0f} /s")
    for name, label in (("w1", "w:1 (default)"), ("j", "j:true")):
        rate = results[name]
        print(f"pymongo insert_one, {label:14s}:           {rate:10.0f} /s   "
              f"ratio to raw SQLite {rate / raw:.2f}")


if __name__ == "__main__":
    main()
