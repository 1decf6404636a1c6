"""`cdcserver spark-replay`'s command line (cdcserver/spark/cli.py).

Checks before Spark starts, each run as a user runs it (a `cdcserver` process): one line on
stderr, `cdcserver spark-replay: ...`, exit status 2, nothing written: a missing or unreadable
`--oplog`, an `--out` that exists without `--mode overwrite`, no pyspark, no Java or an old one,
malformed `--conf`/memory/stream options. Then on Spark (marked `spark`): `file://` inputs and
output (read through pyarrow's filesystems, the code path of hdfs/s3/gs/abfs), a job whose
JVM runs out of memory (reported as that, naming --driver-memory, its partial output removed),
and the root cause of a real py4j failure.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from bson import json_util

from tests.spark.test_spark_replay import (  # noqa: F401
    CANONICAL,
    Workload,
    command,
    parts,
    reference,
    restore_logging,
    spark,
)

PROG = "cdcserver spark-replay: "


def cli(args: list[str], *, env: dict[str, str] | None = None, pre: str = ""):
    """`cdcserver spark-replay ARGS` in a new process (`pre`: Python run first)."""
    code = f"{pre}\nimport sys\nfrom cdcserver.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "spark-replay", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )


def one_line_error(done: subprocess.CompletedProcess, status: int = 2) -> str:
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(PROG)
    return lines[0][len(PROG) :]


@pytest.fixture(scope="module")
def oplog(tmp_path_factory) -> pathlib.Path:
    return Workload(seed=31).write(tmp_path_factory.mktemp("cli") / "oplog.bson", 300)


def base_args(oplog: pathlib.Path, out: pathlib.Path) -> list[str]:
    return ["--oplog", str(oplog), "--out", str(out), "--cluster", "--master", "local[1]"]


def test_a_missing_oplog_file_is_refused_before_spark(oplog, tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "nowhere.bson"
    args = ["--oplog", str(oplog), "--oplog", str(missing), "--out", str(out), "--cluster"]
    assert one_line_error(cli(args)) == f"{missing}: No such file or directory"
    assert not out.exists()
    assert one_line_error(cli(["--oplog", str(tmp_path), "--out", str(out), "--ns", "a.b"])) == (
        f"{tmp_path}: Is a directory"
    )
    uri = f"file://{missing}"
    assert one_line_error(cli(["--oplog", uri, "--out", str(out), "--db", "a"])) == (
        f"{uri}: No such file or directory"
    )
    assert not out.exists()


def test_an_existing_output_is_refused_without_mode_overwrite(oplog, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    assert one_line_error(cli(base_args(oplog, out))) == (
        f"--out {out} exists: give --mode overwrite to replace it"
    )
    assert one_line_error(cli([*base_args(oplog, out), "--mode", "errorifexists"])) == (
        f"--out {out} exists: give --mode overwrite to replace it"
    )
    assert [p.name for p in out.iterdir()] == ["keep"]
    assert (out / "keep").read_text() == "mine"


def test_without_pyspark(oplog, tmp_path):
    out = tmp_path / "out"
    done = cli(base_args(oplog, out), pre="import sys; sys.modules['pyspark'] = None")
    assert one_line_error(done) == (
        "pyspark is not installed: pip install 'cdcserver[spark]' (it needs Java 17 too)"
    )
    assert not out.exists()


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_without_java(oplog, tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "bin"
    empty.mkdir()
    done = cli(base_args(oplog, out), env=_env(JAVA_HOME=None, PATH=str(empty)))
    assert one_line_error(done) == (
        "Spark needs Java 17 or later: no java on PATH (install a JDK 17+ and set JAVA_HOME)"
    )
    done = cli(base_args(oplog, out), env=_env(JAVA_HOME=str(tmp_path / "jdk")))
    assert one_line_error(done) == (
        "Spark needs Java 17 or later: no $JAVA_HOME/bin/java (install a JDK 17+ and set "
        "JAVA_HOME)"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "banner, major",
    [('openjdk version "11.0.22" 2024-01-16', 11), ('java version "1.8.0_392"', 8)],
)
def test_an_old_java(oplog, tmp_path, banner, major):
    """A JDK that says it is older than 17 (a stand-in `java` that prints the banner of one)."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
    java.chmod(0o755)
    out = tmp_path / "out"
    done = cli(base_args(oplog, out), env=_env(JAVA_HOME=str(home)))
    assert one_line_error(done) == (
        f"Spark needs Java 17 or later: {java} is Java {major} (set JAVA_HOME to a JDK 17+)"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--conf", "spark.executor.cores"], "--conf takes KEY=VALUE, not 'spark.executor.cores'"),
        (["--conf", "=4"], "--conf takes KEY=VALUE, not '=4'"),
        (["--driver-memory", "lots"],
         "--driver-memory takes a size such as 512m or 4g, not 'lots'"),
        (["--executor-memory", "4 g"],
         "--executor-memory takes a size such as 512m or 4g, not '4 g'"),
        (["--options", "[1]"], "--options takes a JSON object and --pipeline a JSON array"),
    ],
)
def test_malformed_options(oplog, tmp_path, extra, message):
    out = tmp_path / "out"
    assert one_line_error(cli([*base_args(oplog, out), *extra])) == message
    assert not out.exists()


def test_bad_ns(oplog, tmp_path):
    out = tmp_path / "out"
    done = cli(["--oplog", str(oplog), "--out", str(out), "--ns", "nodot"])
    assert one_line_error(done) == "--ns takes DB.COLL"


def test_spark_does_not_import_the_cli():
    """cdcserver.cli calls cdcserver.spark.cli; nothing under cdcserver/spark imports it back."""
    root = pathlib.Path(__file__).resolve().parents[2] / "cdcserver" / "spark"
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "cdcserver.cli" not in text.replace("`cdcserver.cli`", ""), path.name


# -- on Spark -----------------------------------------------------------------------------------


@pytest.mark.spark
def test_file_uris_in_and_out(spark, oplog, tmp_path, restore_logging):  # noqa: F811
    """`file://` inputs (read through pyarrow's filesystem layer, as hdfs:// or s3:// would be)
    and a `file://` output: the lines `cdcserver replay` writes."""
    from cdcserver.cli import main

    out = tmp_path / "out"
    ref = tmp_path / "ref.jsonl"
    assert main(["replay", "--oplog", str(oplog), "--ns", "shop.orders", "--out", str(ref)]) == 0
    args = ["spark-replay", "--oplog", f"file://{oplog}", "--out", f"file://{out}",
            "--format", "jsonl", "--ns", "shop.orders", "--split-size", "20000"]
    assert main(args) == 0
    assert b"".join(p.read_bytes() for p in parts(out, ".txt")) == ref.read_bytes()
    assert main(args) == 2  # it exists now
    assert main([*args, "--mode", "overwrite"]) == 0
    assert b"".join(p.read_bytes() for p in parts(out, ".txt")) == ref.read_bytes()


@pytest.mark.spark
def test_the_root_cause_of_a_py4j_failure(spark):  # noqa: F811
    """A real OutOfMemoryError raised in the JVM through py4j: the message says so and names
    the setting to raise, not the py4j call."""
    from py4j.protocol import Py4JJavaError

    from cdcserver.spark.cli import root_cause

    with pytest.raises(Py4JJavaError) as caught:
        spark._jvm.java.util.ArrayList(2**31 - 16)  # an array of 8+ GiB in a 3 GiB heap
    assert "An error occurred while calling" in str(caught.value)
    message = root_cause(caught.value, {"spark.driver.memory": "3g"})
    assert message.startswith("the JVM ran out of memory (java.lang.OutOfMemoryError")
    assert "raise --driver-memory (now 3g)" in message
    assert "\n" not in message
    with pytest.raises(Py4JJavaError) as caught:
        spark._jvm.java.util.ArrayList().get(5)
    assert root_cause(caught.value) == (
        "java.lang.IndexOutOfBoundsException: Index 5 out of bounds for length 0"
    )


@pytest.mark.spark
def test_a_job_out_of_memory_says_so(tmp_path):
    """A job whose JVM runs out of memory (in local mode Spark then ends the JVM, status 52):
    one line naming --driver-memory, no output left. The events never pass through the JVM,
    so what does not fit its 128 MiB heap is the buffer of each Python task's stream
    (`spark.buffer.size`, 256 MiB here)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    path = Workload(seed=4).write(tmp_path / "oplog.bson", 300)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "spark-replay", "--oplog", str(path),
         "--out", str(out), "--cluster", "--master", "local[2]", "--driver-memory", "128m",
         "--conf", "spark.testing.reservedMemory=33554432", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.buffer.size={256 << 20}"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith(PROG)]
    assert ours == [(
        PROG + "the Spark JVM ran out of memory (java.lang.OutOfMemoryError): raise "
        "--driver-memory (now 128m), and --executor-memory on a cluster, or lower --split-size"
    )], done.stderr[-3000:]
    assert not out.exists()


@pytest.mark.spark
def test_documents_near_the_limit_in_a_small_heap(tmp_path):
    """15 MiB documents replay with a 128 MiB heap on local[2] (they once ran it out of
    memory: the rows went through the JVM to its writer); the lines are `cdcserver replay`'s."""
    import bson

    from tests.support.oplog_builders import Oplog

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    log = Oplog()
    for i in range(6):
        log.insert("shop.orders", {"_id": i, "blob": bson.Binary(bytes([i]) * (15 << 20))})
    path = tmp_path / "big.bson"
    path.write_bytes(b"".join(bson.encode(e) if isinstance(e, dict) else e.raw
                              for e in log.entries))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "spark-replay", "--oplog", str(path),
         "--out", str(out), "--cluster", "--master", "local[2]", "--driver-memory", "128m",
         "--conf", "spark.testing.reservedMemory=33554432", "--conf", "spark.ui.enabled=false",
         "--format", "jsonl", "--split-size", str(40 << 20)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = reference([path], *command("cluster"))
    assert len(expected) == 6  # the inserts
    got = b"".join(p.read_bytes() for p in parts(out, ".txt"))
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(b"".join(
        json_util.dumps(e, json_options=CANONICAL).encode() + b"\n" for e in expected
    )).hexdigest()
    assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()


@pytest.mark.spark
def test_a_heap_too_small_for_spark(oplog, tmp_path):
    """Spark refuses a heap under 450 MiB when it starts: that line, with the flag to raise."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "spark-replay", *base_args(oplog, out),
         "--driver-memory", "200m"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith(PROG)]
    assert len(ours) == 1, done.stderr[-3000:]
    assert ours[0].startswith(PROG + "Spark did not start: ")
    assert "Insufficient driver memory" in ours[0]
    assert ours[0].endswith("(raise --driver-memory: Spark needs at least 450m)")
    assert not out.exists()
