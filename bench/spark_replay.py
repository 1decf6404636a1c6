"""`cdcserver spark-replay` on `local[1]` and `local[2]` against single-process `cdcserver replay`.

The same generated mongod-8.0 oplog (the test workload: CRUD on three collections, multi-entry
and prepared transactions, retryable writes, batched applyOps), by default a multi-GB archive
of large documents (2 GB in two shards, 16 KiB documents: gigabytes stay ~10^5 entries, so a
run takes a few minutes), generated to a temporary directory and removed after; a cluster
stream, JSON lines out (the one output both commands write; checked equal by SHA-256). Each
command runs as a user runs it, in a process of its own; printed for each: seconds, events/s,
the ratio to `cdcserver replay`, and the peak resident memory (VmHWM) of the driver's Python,
the JVM (driver and, in local mode, executors) and the largest Python worker. Spark's seconds
are the job's own (its summary line), without the JVM's start-up.

`local[1]` and `local[2]` run alternately (`--rounds`, in the order 1 2 2 1 1 2 ...: a load
that drifts weighs on both alike); the ratio is of the best runs and of the medians. The
machine may be shared: the 1-minute load is printed with every run, and the CPU seconds of each
run's processes (JVM, Python workers; `cores` = CPU / wall). The tasks' own CPU (spark-replay's
`task CPU` line: their Python's process time, which other processes do not inflate) gives what
the tasks would take on idle cores, one at a time for local[1], two for local[2] (per phase the
larger of CPU / cores and the longest task): the CPU-based scaling, beside the wall one.

    .venv/bin/python bench/spark_replay.py            # 2 GB, 2 shards, 2 rounds
    .venv/bin/python bench/spark_replay.py --quick    # 0.3 GB, 1 round: a quick check
    .venv/bin/python bench/spark_replay.py --gb 4 --shards 4 --rounds 3

Goal (issue 20): local[2] >= 1.8x local[1].
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the generated workload of the tests (tests/spark/)

from bson.timestamp import Timestamp  # noqa: E402

from tests.spark.test_spark_replay import BigWorkload, Workload  # noqa: E402

_SUMMARY = re.compile(rb"events written in ([0-9.]+)s")
# spark-replay's last line: each phase's task CPU, in all and the longest task's.
_PHASE = re.compile(rb"(\w+) \d+ tasks ([0-9.]+)s \(longest ([0-9.]+)s\)")


def task_seconds(err: bytes, cores: int) -> tuple[float, float]:
    """(CPU seconds of the job's Python tasks, the least time they take on `cores` idle cores:
    per phase, the larger of their CPU over the cores and the longest task)."""
    line = next((ln for ln in err.splitlines() if b"task CPU:" in ln), b"")
    total = least = 0.0
    for _phase, cpu, longest in _PHASE.findall(line):
        total += float(cpu)
        least += max(float(cpu) / cores, float(longest))
    return total, least


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _hwm(pid: int) -> tuple[str, int, float]:
    """(command, peak RSS in bytes, CPU seconds so far: user + system) of a live process."""
    try:
        cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return cmd, int(line.split()[1]) * 1024, cpu
    except (OSError, IndexError, ValueError):
        pass
    return "", 0, 0.0


def run(args: list[str]) -> tuple[float, bytes, dict[str, int], dict[str, float]]:
    """(wall seconds, stderr, peak RSS by kind: driver / jvm / worker, CPU seconds by kind) of
    a command. CPU is sampled every 0.1 s per process (what a process spends after its last
    sample is missed: Spark's Python workers live as long as the job, so little is)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[int, tuple[str, int, float]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            tree, todo = _children(), [proc.pid]
            while todo:
                pid = todo.pop()
                cmd, rss, cpu = _hwm(pid)
                if rss:
                    peaks[pid] = (cmd, rss, cpu)
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
    cpu = {"driver": 0.0, "jvm": 0.0, "worker": 0.0}
    for pid, (cmd, rss, used) in peaks.items():
        kind = "driver" if pid == proc.pid else "jvm" if cmd.endswith("java") else "worker"
        kinds[kind] = max(kinds[kind], rss)
        cpu[kind] += used
    return seconds, err, kinds, cpu


def digest(paths: list[pathlib.Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _phase_line(err: bytes) -> str:
    line = next((ln for ln in err.splitlines() if b"phases:" in ln), b"")
    return line.split(b"phases:", 1)[-1].decode().strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0, help="archive size in GB (default 2)")
    ap.add_argument("-n", type=int,
                    help="instead of --gb: this many entries of small documents")
    ap.add_argument("--doc-bytes", type=int, default=16384, help="average document size")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--splits", type=int, default=8, help="ranges per shard")
    ap.add_argument("--rounds", type=int, default=2, help="runs of local[1] and of local[2]")
    ap.add_argument("--quick", action="store_true",
                    help="0.3 GB and one round (fixed costs weigh more: a smaller ratio)")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument(
        "--archive", metavar="DIR",
        help="keep the generated archive in DIR and reuse it when it is there (while iterating)",
    )
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark property for the spark-replay runs (repeatable)")
    args = ap.parse_args()
    if args.quick:
        args.gb, args.rounds = 0.3, 1
    work = pathlib.Path(tempfile.mkdtemp(prefix="spark-bench-"))
    where = pathlib.Path(args.archive) if args.archive else work
    where.mkdir(parents=True, exist_ok=True)
    try:
        base = Timestamp(1_720_000_000, 1)
        shards = []
        for s in range(args.shards):
            path = where / f"shard{s}.bson"
            if args.archive and path.exists():
                shards.append(path)
                continue
            if args.n:
                Workload(seed=1 + s, shard=s, start=base).write(path, args.n // args.shards)
            else:
                target = int(args.gb * 1e9 / args.shards)
                BigWorkload(1 + s, s, base, args.doc_bytes).write_bytes(path, target)
            shards.append(path)
        size = sum(p.stat().st_size for p in shards)
        oplogs = [a for p in shards for a in ("--oplog", str(p))]
        cli = [sys.executable, "-m", "cdcserver.cli"]

        load = os.getloadavg()[0]
        single = work / "single.jsonl"
        t_single, _, rss_single, cpu_single = run(
            [*cli, "replay", *oplogs, "--cluster", "--out", str(single)]
        )
        reference = digest([single])
        with open(single, "rb") as f:
            events = sum(1 for _ in f)
        single.unlink()
        print(f"{args.shards} shard(s), {size / 1e9:.2f} GB, {events} events, "
              f"driver memory {args.driver_memory}, {os.cpu_count()} cores", flush=True)
        print(f"{'run':<22} {'seconds':>8} {'(wall)':>8} {'events/s':>10} {'vs replay':>9} "
              f"{'driver MB':>9} {'JVM MB':>7} {'worker MB':>9} {'CPU s':>7} "
              f"{'(JVM/workers)':>13} {'cores':>5} {'load':>5}")

        def show(name: str, seconds: float, wall: float, rss: dict[str, int],
                 cpu: dict[str, float], load: float) -> None:
            total = sum(cpu.values())
            print(f"{name:<22} {seconds:>8.1f} {wall:>8.1f} {events / seconds:>10,.0f} "
                  f"{t_single / seconds:>9.2f} {rss['driver'] / 1e6:>9.0f} "
                  f"{rss['jvm'] / 1e6:>7.0f} {rss['worker'] / 1e6:>9.0f} {total:>7.1f} "
                  f"{cpu['jvm']:>6.1f}/{cpu['worker']:<6.1f} {total / wall:>5.2f} {load:>5.2f}",
                  flush=True)

        show("cdcserver replay", t_single, t_single, rss_single, cpu_single, load)
        split_size = max(1, max(p.stat().st_size for p in shards) // args.splits)
        conf = [a for c in args.conf for a in ("--conf", c)]
        # (job seconds, wall, CPU of all processes, task CPU, least on idle cores), by master
        runs: dict[str, list[tuple[float, float, float, float, float]]] = {
            "local[1]": [], "local[2]": []
        }
        order = [m for r in range(args.rounds)
                 for m in (("local[1]", "local[2]") if r % 2 == 0 else ("local[2]", "local[1]"))]
        for master in order:
            out = work / master
            load = os.getloadavg()[0]
            wall, err, rss, cpu = run([
                *cli, "spark-replay", *oplogs, "--cluster", "--format", "jsonl", "--out",
                str(out), "--master", master, "--driver-memory", args.driver_memory,
                "--split-size", str(split_size), "--progress", "0",
                "--conf", "spark.ui.enabled=false", *conf,
            ])
            found = _SUMMARY.search(err)
            job = float(found.group(1)) if found else wall
            task_cpu, least = task_seconds(err, int(master[6:-1]))
            got = digest(sorted(out.glob("part-*")))
            assert got == reference, f"{master}: output differs from cdcserver replay"
            shutil.rmtree(out)
            show(f"spark-replay {master}", job, wall, rss, cpu, load)
            print(f"{'':<22} phases: {_phase_line(err)}", flush=True)
            runs[master].append((job, wall, sum(cpu.values()), task_cpu, least))
        one, two = runs["local[1]"], runs["local[2]"]
        best = min(r[0] for r in one) / min(r[0] for r in two)
        median = statistics.median(r[0] for r in one) / statistics.median(r[0] for r in two)
        walls = statistics.median(r[1] for r in one) / statistics.median(r[1] for r in two)
        least = statistics.median(r[4] for r in one) / statistics.median(r[4] for r in two)
        print(f"scaling local[2] / local[1] ({args.rounds} round(s), job seconds): best "
              f"{best:.2f}, median {median:.2f} (goal >= 1.8); whole processes (JVM start "
              f"included) {walls:.2f}; CPU-based {least:.2f}; 1-min load now "
              f"{os.getloadavg()[0]:.2f}")
        # Under load the wall ratio says little. The tasks' own CPU (their Python's process
        # time, which other processes do not inflate) says what the job's work would take on
        # idle cores: local[1] runs its tasks one after the other, local[2] two at a time.
        for master, rows in runs.items():
            print(f"{master}: task CPU {statistics.median(r[3] for r in rows):.1f} s, at "
                  f"least {statistics.median(r[4] for r in rows):.1f} s on idle cores; CPU of "
                  f"all processes {statistics.median(r[2] for r in rows):.1f} s, busy cores "
                  f"{statistics.median(r[2] / r[1] for r in rows):.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
