"""Materialized namespaces (`upstream.materialize`, docs/materialize.md): what the copy costs.

A is a `cdcserver serve --in-memory` process (the embedded store: no mongod here), B a
`cdcserver serve --upstream mongodb://A` process with `retain_dir` and `materialize`.

1. Initial sync: B's clone of a collection of `--docs` documents (its log's "cloned N
   documents in S s"), in documents/s, beside A's own `find` of the same collection read to
   the end by this process (RawBSONDocument, no decoding) in the same run: the clone reads the
   same documents and also writes each to SQLite.
2. Apply lag at `--rate` writes/s (inserts and `$set` updates, paced) for `--seconds`: for
   each write, from just before it is sent to A until B's copy has applied its entry (the
   copy's `applied` read from its SQLite file every millisecond), p50/p99; beside it, the
   floor in the same run: the same for B's retained log (its newest entry), which the copy
   applies from and so can never be ahead of.
3. Disk: the bytes the copy's file grew by per version those writes added, beside the BSON
   size of a document.

Measured here (2 shared cores, one run): initial sync 57,737 docs/s beside A's find at
146,097 docs/s (0.40); apply lag at 925 writes/s p50 4.4 ms, p99 32.1 ms, floor p50 3.8 ms,
p99 26.6 ms; 746 B of disk per version of a 333 B document.

Prints only; not a test. `python bench/materialize.py [--docs N] [--rate R] [--seconds S]`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import sqlite3
import sys
import tempfile
import threading
import time

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from upstream import Process  # bench/ is the script's directory
from workload import document, p50_p99

NS_DB, NS_COLL = "bench", "items"
RAW = CodecOptions(document_class=RawBSONDocument)


def newest(path: pathlib.Path, sql: str) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute(sql).fetchone()
        return int(row[0]) if row and row[0] is not None else 0
    finally:
        db.close()


class Watcher(threading.Thread):
    """Polls B's copy (`applied`) and retained log (newest `ts`) and notes, for each write's
    ts, when each first reached it."""

    def __init__(self, retain_dir: pathlib.Path) -> None:
        super().__init__(daemon=True)
        self.copy = retain_dir / "materialized.sqlite3"
        self.log = retain_dir / "upstream-oplog.sqlite3"
        self.wanted: list[tuple[int, float]] = []  # (ts int, sent at)
        self.copy_lag: list[float] = []
        self.log_lag: list[float] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.deadline = 0.0  # set by finish

    def run(self) -> None:
        copy_db = sqlite3.connect(f"file:{self.copy}?mode=ro", uri=True, timeout=30)
        log_db = sqlite3.connect(f"file:{self.log}?mode=ro", uri=True, timeout=30)
        next_copy = next_log = 0  # index of the first write not yet seen
        while not self.stop.is_set() or next_copy < len(self.wanted):
            now = time.perf_counter()
            applied = copy_db.execute("SELECT value FROM meta WHERE key = 'applied'").fetchone()
            retained = log_db.execute("SELECT max(ts) FROM oplog").fetchone()
            with self.lock:
                wanted = list(self.wanted)
            while next_log < len(wanted) and retained[0] is not None and (
                    retained[0] >= wanted[next_log][0]):
                self.log_lag.append(now - wanted[next_log][1])
                next_log += 1
            while next_copy < len(wanted) and applied is not None and (
                    int(applied[0]) >= wanted[next_copy][0]):
                self.copy_lag.append(now - wanted[next_copy][1])
                next_copy += 1
            if self.stop.is_set() and time.perf_counter() > self.deadline:
                break
            time.sleep(0.001)
        copy_db.close()
        log_db.close()

    def finish(self, timeout: float = 60) -> None:
        self.deadline = time.perf_counter() + timeout
        self.stop.set()
        self.join(timeout + 5)


def file_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="cdcserver-bench-materialize-"))
    a = Process("a", ["--in-memory"], work)
    b = None
    try:
        ca = MongoClient(a.uri)
        coll = ca[NS_DB][NS_COLL]
        docs = [document(i) for i in range(args.docs)]
        for k in range(0, len(docs), 5000):
            coll.insert_many(docs[k:k + 5000])
        doc_size = len(bson.encode(docs[0]))
        begin = time.perf_counter()
        n = sum(1 for _ in coll.with_options(codec_options=RAW).find({}, batch_size=1000))
        find_s = time.perf_counter() - begin
        retain_dir = work / "b"
        b = Process("b", ["--upstream", a.uri], work, {
            "CDCSERVER_UPSTREAM_RETAIN_DIR": str(retain_dir),
            "CDCSERVER_UPSTREAM_MATERIALIZE": f'["{NS_DB}.*"]',
        })
        deadline = time.monotonic() + 600
        while not (m := re.search(r"cloned (\d+) documents in ([\d.]+)s", b.log_path.read_text())):
            if time.monotonic() > deadline:
                raise RuntimeError("B's initial sync did not end")
            time.sleep(0.05)
        cloned, clone_s = int(m.group(1)), float(m.group(2))
        print(f"initial sync: {cloned} documents ({doc_size} B each) in {clone_s:.2f}s = "
              f"{cloned / clone_s:,.0f} docs/s; A's own find of them: {n / find_s:,.0f} docs/s "
              f"(sync/find = {find_s / clone_s * n / cloned:.2f})")

        copy_file = retain_dir / "materialized.sqlite3"
        versions_before = newest(copy_file, "SELECT count(*) FROM versions")
        bytes_before = file_bytes(copy_file)
        watcher = Watcher(retain_dir)
        watcher.start()
        interval = 1 / args.rate
        total = int(args.rate * args.seconds)
        start = time.perf_counter()
        with ca.start_session(causal_consistency=False) as session:
            for i in range(total):
                due = start + i * interval
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                sent = time.perf_counter()
                if i % 2:
                    coll.update_one({"_id": i % args.docs}, {"$set": {"n": i}}, session=session)
                else:
                    coll.insert_one({**document(i), "_id": f"new{i}"}, session=session)
                ts = session.operation_time
                with watcher.lock:
                    watcher.wanted.append(((ts.time << 32) | ts.inc, sent))
        achieved = total / (time.perf_counter() - start)
        watcher.finish()
        c50, c99 = p50_p99(watcher.copy_lag)
        l50, l99 = p50_p99(watcher.log_lag)
        print(f"apply lag at {achieved:,.0f} writes/s ({total} writes): copy p50 "
              f"{c50 * 1000:.1f} ms p99 {c99 * 1000:.1f} ms; retained log (floor) p50 "
              f"{l50 * 1000:.1f} ms p99 {l99 * 1000:.1f} ms; samples {len(watcher.copy_lag)}/"
              f"{len(watcher.log_lag)}")
        versions = newest(copy_file, "SELECT count(*) FROM versions") - versions_before
        grew = file_bytes(copy_file) - bytes_before
        print(f"disk: {grew / max(versions, 1):,.0f} B per version ({versions} versions, file "
              f"+{grew / 1e6:.1f} MB incl. WAL); a document is {doc_size} B of BSON")
    finally:
        if b is not None:
            b.stop()
        a.stop()
        print(f"(logs in {work})", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
