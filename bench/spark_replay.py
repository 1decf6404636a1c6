"""`cdcserver spark-replay` on `local[1]` and `local[2]` against single-process `cdcserver replay`.

The same generated mongod-8.0 oplog (the test workload: CRUD on three collections, multi-entry
and prepared transactions, retryable writes, batched applyOps; `--doc-bytes` makes its
documents large, so that gigabytes stay a manageable number of entries), one or several shards,
a cluster stream, JSON lines out (the one output both commands write; checked equal by
SHA-256). Each command runs as a user runs it, in a process of its own; printed for each:
seconds, events/s, the ratio to `cdcserver replay`, and the peak resident memory (VmHWM) of
the driver's Python, the JVM (driver and, in local mode, executors) and the largest Python
worker. Spark's seconds are the job's own (its summary line), without the JVM's start-up.

    .venv/bin/python bench/spark_replay.py                          # 200k entries, ~60 MB
    .venv/bin/python bench/spark_replay.py --gb 4 --doc-bytes 16384 --shards 4   # multi-GB

Goal (issue 20): local[2] >= 1.8x local[1].
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the generated workload of the tests

from bson.timestamp import Timestamp  # noqa: E402
from test_spark_replay import BigWorkload, Workload  # noqa: E402

_SUMMARY = re.compile(rb"events written in ([0-9.]+)s")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return out


def _hwm(pid: int) -> tuple[str, int]:
    try:
        cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return cmd, int(line.split()[1]) * 1024
    except OSError:
        pass
    return "", 0


def run(args: list[str]) -> tuple[float, bytes, dict[str, int]]:
    """(wall seconds, stderr, peak RSS by kind: driver / jvm / worker) of a command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[int, tuple[str, int]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            tree, todo = _children(), [proc.pid]
            while todo:
                pid = todo.pop()
                cmd, rss = _hwm(pid)
                if rss:
                    peaks[pid] = (cmd, rss)
                todo += tree.get(pid, [])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    thread.join()
    if proc.returncode != 0:
        sys.exit(f"{args[:4]} failed:\n{err.decode()[-3000:]}")
    kinds = {"driver": 0, "jvm": 0, "worker": 0}
    for pid, (cmd, rss) in peaks.items():
        kind = "driver" if pid == proc.pid else "jvm" if cmd.endswith("java") else "worker"
        kinds[kind] = max(kinds[kind], rss)
    return seconds, err, kinds


def digest(paths: list[pathlib.Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200_000, help="oplog entries in all (without --gb)")
    ap.add_argument("--gb", type=float, help="archive size in GB instead of -n")
    ap.add_argument("--doc-bytes", type=int, default=0, help="average document size (large)")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--splits", type=int, default=8, help="ranges per shard")
    ap.add_argument("--driver-memory", default="1g")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        base = Timestamp(1_720_000_000, 1)
        shards = []
        for s in range(args.shards):
            path = work / f"shard{s}.bson"
            if args.doc_bytes or args.gb:
                target = int((args.gb or 0.1) * 1e9 / args.shards)
                BigWorkload(1 + s, s, base, args.doc_bytes or 1024).write_bytes(path, target)
            else:
                Workload(seed=1 + s, shard=s, start=base).write(path, args.n // args.shards)
            shards.append(path)
        size = sum(p.stat().st_size for p in shards)
        oplogs = [a for p in shards for a in ("--oplog", str(p))]
        cli = [sys.executable, "-m", "cdcserver.cli"]

        single = work / "single.jsonl"
        t_single, _, rss_single = run([*cli, "replay", *oplogs, "--cluster", "--out", str(single)])
        reference = digest([single])
        with open(single, "rb") as f:
            events = sum(1 for _ in f)
        single.unlink()
        rows = [("cdcserver replay", t_single, t_single, rss_single)]
        split_size = max(1, max(p.stat().st_size for p in shards) // args.splits)
        for master in ("local[1]", "local[2]"):
            out = work / master
            wall, err, rss = run([
                *cli, "spark-replay", *oplogs, "--cluster", "--format", "jsonl", "--out",
                str(out), "--master", master, "--driver-memory", args.driver_memory,
                "--split-size", str(split_size), "--progress", "0",
                "--conf", "spark.ui.enabled=false",
            ])
            found = _SUMMARY.search(err)
            job = float(found.group(1)) if found else wall
            got = digest(sorted(out.glob("part-*")))
            assert got == reference, f"{master}: output differs from cdcserver replay"
            shutil.rmtree(out)
            rows.append((f"spark-replay {master}", job, wall, rss))
        print(f"{args.shards} shard(s), {size / 1e9:.2f} GB, {events} events, "
              f"split {split_size / 1e6:.0f} MB, driver memory {args.driver_memory}, "
              f"{os.cpu_count()} cores")
        print(f"{'run':<22} {'seconds':>8} {'(wall)':>8} {'events/s':>10} {'vs replay':>9} "
              f"{'driver MB':>9} {'JVM MB':>7} {'worker MB':>9}")
        for name, seconds, wall, rss in rows:
            print(f"{name:<22} {seconds:>8.1f} {wall:>8.1f} {events / seconds:>10,.0f} "
                  f"{t_single / seconds:>9.2f} {rss['driver'] / 1e6:>9.0f} "
                  f"{rss['jvm'] / 1e6:>7.0f} {rss['worker'] / 1e6:>9.0f}")
        print(f"scaling local[2] / local[1]: {rows[1][1] / rows[2][1]:.2f} (goal >= 1.8)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
