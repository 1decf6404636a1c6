"""The command line of `cdcserver spark-replay` (and of `spark-submit .../cdcserver/spark/cli.py`).

Before Spark starts, the command checks what would otherwise fail late or obscurely, each with
one line on stderr (`cdcserver spark-replay: ...`), exit status 2 and nothing written: the
options (`--conf KEY=VALUE`, memory sizes, the stream's `--options`/`--pipeline`), pyspark,
Java 17 or later, every `--oplog` file, and an `--out` that exists without `--mode overwrite`.
A job that fails reports the JVM's root cause (an `OutOfMemoryError` names the setting to
raise) rather than the last py4j call. While it runs, progress goes to stderr every few
seconds: the phase, its splits done and in all, entries and entries/s.

Nothing here imports `cdcserver.cli` (which calls `add_parser`), nor pyspark until a job runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from cdcserver import replay_command

log = logging.getLogger(__name__)

PROG = "cdcserver spark-replay"
_MEMORY = re.compile(r"^\d+([kmgt]b?)?$", re.I)
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
MIN_JAVA = 17
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
# splits.DEFAULT_SPLIT_SIZE (tests/spark keep them equal): `cdcserver --help` builds this
# parser, and the splits module (bson, the oplog decoder) is for running a job only.
DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024


class CheckError(Exception):
    """A problem found before Spark starts: the one-line message."""


# -- arguments ----------------------------------------------------------------------------------


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `spark-replay` on the `cdcserver` command's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "spark-replay", help="the same replay on Apache Spark (needs the spark extra)",
        description="the change-stream pipeline over oplog archives, on Apache Spark",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `cdcserver spark-replay`."""
    parser.add_argument(
        "--oplog", nargs="+", action="append", required=True, metavar="PATH",
        help="one oplog's files, in order (local path, file://, hdfs://, s3://, gs://, "
        "abfs://); repeat --oplog for each shard of a cluster",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--format", choices=("parquet", "jsonl"), default="parquet",
        help="parquet (all columns) or jsonl (one canonical Extended JSON event per line)",
    )
    parser.add_argument(
        "--mode", choices=("errorifexists", "overwrite"), default="errorifexists",
        help="when --out exists: fail before starting (default) or replace it",
    )
    parser.add_argument("--overwrite", action="store_true", help=argparse.SUPPRESS)
    replay_command.add_stream_arguments(parser)
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, or local[*])")
    parser.add_argument(
        "--driver-memory", metavar="SIZE",
        help="the driver JVM's heap, e.g. 2g (Spark's default 1g); in local mode the "
        "executors run in the driver",
    )
    parser.add_argument(
        "--executor-memory", metavar="SIZE", help="each executor's heap on a cluster, e.g. 4g"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark property (repeatable), e.g. --conf spark.sql.shuffle.partitions=64",
    )
    parser.add_argument(
        "--split-size", type=int, default=DEFAULT_SPLIT_SIZE, metavar="BYTES",
        help="bytes of oplog per task (default 64 MiB); a task's memory grows with it",
    )
    parser.add_argument(
        "--progress", type=float, default=5.0, metavar="SECONDS",
        help="report progress on stderr this often (0: never; default 5)",
    )


def spec_command(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(aggregate command, db) as `cdcserver replay` builds it."""
    try:
        return replay_command.spec_command(args)
    except ValueError as exc:
        raise CheckError(str(exc)) from None


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """The Spark properties the command sets: quiet console, the memory flags, then --conf."""
    conf = {"spark.ui.showConsoleProgress": "false"}
    for flag, key in (("driver_memory", "spark.driver.memory"),
                      ("executor_memory", "spark.executor.memory")):
        value = getattr(args, flag)
        if value is not None:
            if not _MEMORY.match(value):
                raise CheckError(
                    f"--{flag.replace('_', '-')} takes a size such as 512m or 4g, not {value!r}"
                )
            conf[key] = value
    for item in args.conf:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CheckError(f"--conf takes KEY=VALUE, not {item!r}")
        conf[key.strip()] = value
    # The driver's JVM only schedules the Python tasks (they read, replay and write): C2's
    # compiling of Spark's own code cost more CPU than it saved, taken from the tasks on a
    # machine with few cores (measured: the JVM's CPU halved). Unless the user gives the
    # driver's Java options; under spark-submit the JVM runs already and this does nothing.
    conf.setdefault("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
    return conf


# -- checks before Spark starts ----------------------------------------------------------------


def check_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise CheckError(
            "pyspark is not installed: pip install 'cdcserver[spark]' (it needs Java 17 too)"
        ) from None


def java_command() -> str | None:
    """The `java` Spark's launcher runs: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java")


def check_java() -> None:
    java = java_command()
    if java is None:
        where = "$JAVA_HOME/bin/java" if os.environ.get("JAVA_HOME") else "java on PATH"
        raise CheckError(
            f"Spark needs Java {MIN_JAVA} or later: no {where} (install a JDK {MIN_JAVA}+ "
            "and set JAVA_HOME)"
        )
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckError(f"Spark needs Java {MIN_JAVA} or later: {java} -version: {exc}") from None
    found = _JAVA_VERSION.search(done.stderr + done.stdout)
    if found is None:
        raise CheckError(
            f"Spark needs Java {MIN_JAVA} or later: {java} -version does not say its version"
        )
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0_392" is Java 8
        major = int(found.group(2))
    if major < MIN_JAVA:
        raise CheckError(
            f"Spark needs Java {MIN_JAVA} or later: {java} is Java {major} (set JAVA_HOME to a "
            f"JDK {MIN_JAVA}+)"
        )


def _info(path: str) -> Any:
    """pyarrow's FileInfo of a non-local path."""
    from pyarrow import fs

    filesystem, inner = fs.FileSystem.from_uri(path)
    return filesystem.get_file_info(inner)


def _exists(path: str) -> bool:
    """Whether a file or directory exists at a path or URI."""
    from cdcserver.spark import splits as sp

    if sp.is_local(path):
        return os.path.exists(path)
    from pyarrow import fs

    exists: bool = _info(path).type != fs.FileType.NotFound
    return exists


def check_inputs(shards: list[list[str]], out: str, mode: str) -> bool:
    """Check every oplog file and `--out`; whether `--out` exists."""
    from cdcserver.spark import splits as sp

    for paths in shards:
        for path in paths:
            try:
                if sp.is_local(path):
                    local = path
                    if os.path.isdir(local):
                        raise CheckError(f"{path}: Is a directory")
                    with open(local, "rb"):
                        pass
                else:
                    from pyarrow import fs

                    kind = _info(path).type
                    if kind == fs.FileType.NotFound:
                        raise CheckError(f"{path}: No such file or directory")
                    if kind == fs.FileType.Directory:
                        raise CheckError(f"{path}: Is a directory")
            except OSError as exc:
                raise CheckError(f"{path}: {exc.strerror or exc}") from None
            except CheckError:
                raise
            except Exception as exc:  # noqa: BLE001 - pyarrow's (unknown scheme, access)
                raise CheckError(f"{path}: {' '.join(str(exc).split())}") from None
    try:
        exists = _exists(out)
    except Exception:  # noqa: BLE001 - a scheme Spark writes and pyarrow cannot see: Spark checks
        exists = False
    if exists and mode != "overwrite":
        raise CheckError(f"--out {out} exists: give --mode overwrite to replace it")
    return exists


def remove_output(out: str) -> None:
    """What a failed job left of an output that did not exist before (Spark leaves its
    `_temporary` when the JVM dies)."""
    from cdcserver.spark import splits as sp

    try:
        if sp.is_local(out):
            shutil.rmtree(out, ignore_errors=True)
        else:
            from pyarrow import fs

            filesystem, inner = fs.FileSystem.from_uri(out)
            filesystem.delete_dir(inner)
    except Exception:  # noqa: BLE001 - nothing there, or nothing we may delete
        pass


# -- the JVM's root cause -----------------------------------------------------------------------


def _java_chain(exc: BaseException) -> list[str]:
    """`Class: message` of a Py4JJavaError's Java exception and its causes, outermost first."""
    out: list[str] = []
    java = getattr(exc, "java_exception", None)
    try:
        while java is not None and len(out) < 32:
            out.append(str(java.toString()))
            cause = java.getCause()
            java = None if cause is None or cause.equals(java) else cause
    except Exception:  # noqa: BLE001 - the JVM may be gone
        pass
    return out


# Spark's exit status for an OutOfMemoryError (SparkExitCode.OOM): in local mode, an executor
# thread's OOM ends the driver's JVM with it (SparkUncaughtExceptionHandler).
SPARK_EXIT_OOM = 52


def jvm_exit_status(spark: Any, wait: float = 5.0) -> int | None:
    """The exit status of the JVM this Python process launched, once it has exited."""
    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc", None)
    if proc is None:
        return None
    deadline = time.monotonic() + wait
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    status: int | None = proc.poll()
    return status


def root_cause(
    exc: BaseException, conf: dict[str, str] | None = None, exit_status: int | None = None
) -> str:
    """One line: why a Spark job failed (`exit_status`: the JVM's, when it has died)."""
    conf = conf or {}
    memory = conf.get("spark.driver.memory", "1g, Spark's default")
    raise_it = (
        f"raise --driver-memory (now {memory}), and --executor-memory on a cluster, "
        "or lower --split-size"
    )
    if exit_status is not None:
        if exit_status == SPARK_EXIT_OOM:
            return f"the Spark JVM ran out of memory (java.lang.OutOfMemoryError): {raise_it}"
        return f"the Spark JVM exited with status {exit_status} (its messages are above)"
    chain = _java_chain(exc)
    text = "\n".join([str(exc), *chain])
    oom = re.search(r"java\.lang\.OutOfMemoryError(?::[^\n]*)?", text)
    if oom is not None:
        return f"the JVM ran out of memory ({oom.group(0).strip()}): {raise_it}"
    python: list[str] = re.findall(
        r"PythonException:[\s\S]*?\n(\w[\w.]*(?:Error|Exception)[^\n]*)", text
    )
    if python:
        return python[-1].strip()
    if chain:
        line = _first_line(chain[-1])
        if "INVALID_DRIVER_MEMORY" in line or "INVALID_EXECUTOR_MEMORY" in line:
            flag = "--driver-memory" if "DRIVER" in line else "--executor-memory"
            line += f" (raise {flag}: Spark needs at least 450m)"
        return line
    caused: list[str] = re.findall(r"Caused by: ([^\n]+)", text)
    if caused:
        return caused[-1].strip()
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):  # py4j: "An error occurred while calling oN.x." then why
        if ln.startswith("An error occurred while calling") and i + 1 < len(lines):
            return _first_line(lines[i + 1].lstrip(": "))
    return _first_line(str(exc)) or type(exc).__name__


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


# -- running ------------------------------------------------------------------------------------


def _progress(phase: str, done: int, total: int, entries: int, seconds: float) -> None:
    what = "splits" if phase == "scan" else "ranges"
    log.info(
        "spark-replay: %s %d/%d %s, %d entries, %.0f entries/s",
        phase, done, total, what, entries, entries / max(seconds, 1e-3),
    )


def run_args(args: argparse.Namespace, spark: Any = None) -> int:
    """`cdcserver spark-replay` with parsed arguments; the exit status."""
    mode = "overwrite" if args.overwrite else args.mode
    try:
        cmd, db = spec_command(args)
        conf = spark_conf(args)
        if spark is None:
            check_pyspark()
            running = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))  # under spark-submit
            if not running:
                check_java()
            elif args.driver_memory:
                log.warning(
                    "spark-replay: under spark-submit, give --driver-memory to spark-submit: "
                    "its JVM is already running"
                )
        existed = check_inputs(args.oplog, args.out, mode)
    except CheckError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    from cdcserver.spark.replay import ReplayError, SparkReplay, session

    try:
        job = SparkReplay(
            args.oplog, cmd, db, args.out, fmt=args.format, split_size=args.split_size,
            mode=mode, progress=_progress if args.progress > 0 else None,
        )
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    own = False
    try:
        if spark is None:
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            own = active is None  # else: leave the caller's running
            if active is not None and (args.driver_memory or args.executor_memory):
                log.warning("spark-replay: a Spark session is running: its memory stays as is")
            spark = session(args.master, **conf)
            if own and "spark.driver.memory" in conf:
                log.info("spark-replay: driver heap %s", conf["spark.driver.memory"])
    except Exception as exc:  # noqa: BLE001 - the JVM did not start
        print(f"{PROG}: Spark did not start: {root_cause(exc, conf)}", file=sys.stderr)
        return 1
    job.progress_interval = args.progress
    try:
        summary = job.run(spark)
    except ReplayError as exc:
        if not existed:
            remove_output(args.out)
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - Spark's own (a lost executor, memory, ...)
        status = jvm_exit_status(spark) if own else None
        if not existed:
            remove_output(args.out)
        print(f"{PROG}: {root_cause(exc, conf, status)}", file=sys.stderr)
        return 1
    finally:
        if own:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001 - a JVM that died cannot be stopped
                pass
    log.info("%s", summary.line())
    log.info("%s", summary.cpu_line())
    log.info("%s", summary.phase_line())
    return 0


def run(args: argparse.Namespace) -> int:
    """The `func` of the subcommand."""
    from cdcserver.logs import setup_logging

    setup_logging("info", "text")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connections' comings and goings
    for handler in logging.getLogger().handlers:  # ... and what py4j logs on the root logger
        handler.addFilter(lambda record: "py4j" not in record.pathname)
    return run_args(args)


def main(argv: list[str] | None = None) -> int:
    """`spark-submit .../cdcserver/spark/cli.py --oplog ... --out ...`"""
    parser = argparse.ArgumentParser(
        prog="spark-replay", description="the change-stream pipeline over oplog files, on Spark"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Under spark-submit this file is __main__: run the installed module's main, so that what
    # tasks unpickle refers to cdcserver.spark.* (installed on the executors).
    from cdcserver.spark.cli import main as _main

    sys.exit(_main())
