"""`cdcserver spark-replay` on `local[1]` and `local[2]` against single-process `cdcserver replay`.

The same generated mongod-8.0 oplog (the test workload: CRUD on three collections, multi-entry
and prepared transactions, retryable writes, batched applyOps), a cluster stream, JSON lines
out (the one output both commands write). Prints events/s of each and the ratios: local[2] to
local[1] (how Spark scales with cores) and each to the single process. Each Spark run follows a
warm-up run in the same session (the JVM's first job pays for class loading and JIT).

    .venv/bin/python bench/spark_replay.py -n 200000
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the generated workload of the tests

from test_spark_replay import Workload  # noqa: E402

from cdcserver.cli import main as cli  # noqa: E402


def single(path: pathlib.Path, out: pathlib.Path) -> float:
    t0 = time.perf_counter()
    assert cli(["replay", "--oplog", str(path), "--cluster", "--out", str(out)]) == 0
    return time.perf_counter() - t0


def spark_run(master: str, path: pathlib.Path, out: pathlib.Path, split_size: int) -> tuple:
    from cdcserver.spark.replay import SparkReplay, session

    spark = session(master, **{"spark.ui.enabled": "false", "spark.driver.memory": "4g",
                               "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": True}}]}
    try:
        SparkReplay([[str(path)]], cmd, "admin", str(out), fmt="jsonl",
                    split_size=max(1, path.stat().st_size // 16), mode="overwrite").run(spark)
        t0 = time.perf_counter()
        summary = SparkReplay([[str(path)]], cmd, "admin", str(out), fmt="jsonl",
                              split_size=split_size, mode="overwrite").run(spark)
        return time.perf_counter() - t0, summary
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200_000, help="oplog entries")
    ap.add_argument("--splits", type=int, default=8, help="ranges the file is cut into")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    work = pathlib.Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        path = Workload(seed=1).write(work / "oplog.bson", args.n)
        size = path.stat().st_size
        split_size = -(-size // args.splits)
        t_single = single(path, work / "single.jsonl")
        reference = (work / "single.jsonl").read_bytes()
        events = reference.count(b"\n")
        rows = [("cdcserver replay", t_single)]
        for master in ("local[1]", "local[2]"):
            out = work / master
            seconds, summary = spark_run(master, path, out, split_size)
            produced = b"".join(p.read_bytes() for p in sorted(out.glob("part-*")))
            assert produced == reference, f"{master}: output differs from cdcserver replay"
            assert summary.events == events
            rows.append((f"spark-replay {master}", seconds))
        print(f"{args.n} entries ({size / 1e6:.0f} MB, {args.splits} ranges), {events} events, "
              f"{os.cpu_count()} cores")
        print(f"{'run':<24} {'seconds':>8} {'events/s':>10} {'vs replay':>10}")
        for name, seconds in rows:
            print(f"{name:<24} {seconds:>8.1f} {events / seconds:>10,.0f} "
                  f"{t_single / seconds:>10.2f}")
        print(f"scaling local[2] / local[1]: {rows[1][1] / rows[2][1]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
