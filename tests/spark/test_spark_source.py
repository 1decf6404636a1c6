"""`spark.readStream.format("cdcserver")` against a real cdcserver started in-process.

* The reader on its own (no query): micro-batches of at most `maxEventsPerTrigger` give the
  events `cdcserver replay` gives, each once, and each event crosses the wire once (counted
  with pymongo's command monitoring: the change-stream batches the server sent); a batch read
  again (`readBetweenOffsets`, what a restarted query does) gives the same rows.
* The documented snippet in a driver process of its own, with no PYSPARK_PYTHON (the `python3`
  on PATH has no cdcserver): a checkpointed query to a Parquet sink, the driver killed
  (SIGKILL, JVM and all) while batches are running, more writes, the query restarted from its
  checkpoint: every event exactly once, in token order.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import bson
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring

from tests.spark.test_spark_replay import Workload, command, ddl_story, reference, spark  # noqa: F401

pytestmark = pytest.mark.spark


def _first_ts(path: pathlib.Path):
    data = path.read_bytes()
    return bson.decode(data[: int.from_bytes(data[:4], "little")])["ts"]


def _split_file(path: pathlib.Path) -> list[RawBSONDocument]:
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "little")
        out.append(RawBSONDocument(data[pos : pos + n]))
        pos += n
    return out


def _options(**extra):
    return {k: (v if isinstance(v, str) else json_util.dumps(v)) for k, v in extra.items()}


def _continued(path: pathlib.Path, scope: str) -> list[RawBSONDocument]:
    """The replay's events; after an invalidate, those of a stream started after it (what the
    source does: it goes on past a dropped collection, as `startAfter` does)."""
    events = reference([path], *command(scope))
    while events and events[-1]["operationType"] == "invalidate":
        more = reference([path], *command(scope, {"startAfter": events[-1]["_id"]}))
        if not more:
            break
        events += more
    return events


class EventsSent(monitoring.CommandListener):
    """Counts the change events in the server's aggregate/getMore replies (in this process)."""

    def __init__(self) -> None:
        self.events = 0
        self.on = False

    def started(self, event) -> None:
        pass

    def succeeded(self, event) -> None:
        if self.on and event.command_name in ("aggregate", "getMore"):
            cursor = event.reply.get("cursor") or {}
            self.events += len(cursor.get("firstBatch", cursor.get("nextBatch", [])))

    def failed(self, event) -> None:
        pass


SENT = EventsSent()
monitoring.register(SENT)  # applies to clients created after this, in this process


def test_reader_batches_are_the_replay_events_each_read_once(cdcserver_factory, tmp_path):
    pytest.importorskip("pyspark")
    from cdcserver.spark.source import ChangeStreamReader

    path = Workload(seed=5).write(tmp_path / "oplog.bson", 600, extra=ddl_story)
    server = cdcserver_factory([path])
    for scope, key in (("cluster", "cluster"), ("shop", "db"), ("shop.orders", "ns")):
        expected = _continued(path, scope)
        reader = ChangeStreamReader(
            {"uri": server.uri, key: "true" if key == "cluster" else scope,
             "maxEventsPerTrigger": "97",
             **_options(options={"startAtOperationTime": _first_ts(path)})}
        )
        start = reader.initialOffset()
        batches = []
        SENT.on, SENT.events = True, 0
        while True:
            it, end = reader.read(start)
            rows = list(it)
            if end == start:
                assert rows == []
                break
            assert 0 < len(rows) <= 97
            batches.append((start, end, rows))
            start = end
        SENT.on = False
        rows = [r for _, _, batch in batches for r in batch]
        assert [r[6] for r in rows] == [e.raw for e in expected], scope
        assert SENT.events == len(rows), scope  # one read per event
        # A batch read again after a failure: the same rows.
        for s, e, batch in batches[:: max(1, len(batches) // 3)]:
            assert list(reader.readBetweenOffsets(s, e)) == batch
        reader.stop()
    # A stream started "now" sees only what comes after it.
    reader = ChangeStreamReader({"uri": server.uri, "db": "app"})
    now = reader.initialOffset()
    assert reader.read(now)[1] == now
    work = Workload(seed=6, start=bson.timestamp.Timestamp(1_800_000_000, 1))
    server.append(_split_file(work.write(tmp_path / "more.bson", 50)))
    it, end = reader.read(now)
    rows = list(it)
    assert rows and all(r[3] == "app" for r in rows) and end != now
    reader.stop()


DRIVER = """
import sys
from pyspark.sql import SparkSession

from cdcserver.spark.source import register

uri, out, checkpoint, options, mode = sys.argv[1:]
spark = (
    SparkSession.builder.master("local[1]").appName("cdcserver source")
    .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    .getOrCreate()
)
register(spark)
events = (
    spark.readStream.format("cdcserver")
    .option("uri", uri)
    .option("cluster", "true")
    .option("options", options)
    .option("maxEventsPerTrigger", 40)
    .load()
)
query = (
    events.writeStream.format("parquet")
    .option("checkpointLocation", checkpoint)
    .start(out)
)
if mode == "forever":
    query.awaitTermination()
else:
    query.processAllAvailable()
    query.stop()
    spark.stop()
"""


def _batches(directory: pathlib.Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def test_query_killed_and_restarted_writes_every_event_once(spark, cdcserver_factory, tmp_path):  # noqa: F811
    work = Workload(seed=8)
    path = work.write(tmp_path / "oplog.bson", 500)
    server = cdcserver_factory([path])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = json_util.dumps({"startAtOperationTime": _first_ts(path)})
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON",
                                                          "PYSPARK_DRIVER_PYTHON")}

    def driver(mode: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(tmp_path / "driver.py"), server.uri, str(out),
             str(checkpoint), options, mode],
            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{mode}.log", "wb"),  # noqa: SIM115
            start_new_session=True,  # its own process group: the JVM and its workers with it
        )

    proc = driver("forever")
    mid_batch = False
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "forever.log").read_text()[-3000:]
            commits = _batches(checkpoint / "commits")
            planned = _batches(checkpoint / "offsets")
            if len(commits) >= 2 and planned - commits:
                mid_batch = True  # a batch is planned and not committed
                break
            if len(commits) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _batches(checkpoint / "commits"), (tmp_path / "forever.log").read_text()[-3000:]
    total = len(reference([path], *command("cluster")))
    server.append(_split_file(work.write(tmp_path / "more.bson", 200)))  # while it is down

    again = driver("drain")
    assert again.wait(timeout=300) == 0, (tmp_path / "drain.log").read_text()[-3000:]

    expected = reference([path], *command("cluster"))
    assert len(expected) > total
    rows = spark.read.parquet(str(out)).orderBy("_id").collect()
    assert [r["_id"] for r in rows] == [e["_id"]["_data"] for e in expected]
    assert [bytes(r["event"]) for r in rows] == [e.raw for e in expected]
    print(json.dumps({"killed_mid_batch": mid_batch}))
