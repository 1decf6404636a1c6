"""The streaming source started the way a streaming job starts: before anything is written.

An empty range (`readBetweenOffsets(start, start)`, what Spark asks for a batch with no new
events) gives no rows, from a "now" token and from a `startAtOperationTime` offset; and the
README's snippet, a query started on an idle server with writes coming 10 s later, writes
exactly those events to its sink.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from bson import json_util
from pymongo import MongoClient

from tests.spark.test_spark_replay import spark  # noqa: F401
from tests.spark.test_spark_source import DRIVER, _batches

pytestmark = pytest.mark.spark
WRITES = 25
QUIET_S = 10.0  # the query runs on an idle server this long before the first write
GUARD_S = 240.0  # a guard against hanging, never a performance expectation


def test_empty_range_reads_no_rows(cdcserver_embedded):
    pytest.importorskip("pyspark")
    from cdcserver.spark.source import ChangeStreamReader

    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    client.app.c.insert_one({"_id": 0})
    reader = ChangeStreamReader({"uri": cdcserver_embedded.uri, "db": "app"})
    now = reader.initialOffset()
    assert list(reader.readBetweenOffsets(now, now)) == []
    it, end = reader.read(now)
    assert list(it) == [] and end == now
    reader.stop()

    op_time = client.admin.command("ping")["operationTime"]
    options = json_util.dumps({"startAtOperationTime": op_time})
    reader = ChangeStreamReader({"uri": cdcserver_embedded.uri, "db": "app", "options": options})
    start = reader.initialOffset()
    assert "ts" in start
    assert list(reader.readBetweenOffsets(start, start)) == []
    client.app.c.insert_one({"_id": 1})
    it, end = reader.read(start)
    rows = list(it)
    # startAtOperationTime is inclusive: the first insert's time, so both inserts
    assert [r[5] for r in rows] == ['{"_id": {"$numberInt": "0"}}', '{"_id": {"$numberInt": "1"}}']
    assert end != start
    assert [r[6] for r in reader.readBetweenOffsets(start, end)] == [r[6] for r in rows]
    reader.stop()
    client.close()


def test_readme_snippet_started_before_any_write(spark, cdcserver_embedded, tmp_path):  # noqa: F811
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON",
                                                          "PYSPARK_DRIVER_PYTHON")}
    log = tmp_path / "driver.log"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), cdcserver_embedded.uri, str(out),
         str(checkpoint), "{}", "forever"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    try:
        deadline = time.monotonic() + GUARD_S
        while not (checkpoint / "offsets").is_dir():  # the query has planned its first batch
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(QUIET_S)
        assert proc.poll() is None, log.read_text()[-3000:]
        client.shop.orders.insert_many([{"_id": i} for i in range(WRITES)])
        expected = [e["_id"]["_data"] for e in _events(client)]
        assert len(expected) >= WRITES
        rows: list = []
        while len(rows) < len(expected):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
            if _batches(checkpoint / "commits") and out.is_dir() and any(out.glob("*.parquet")):
                rows = spark.read.parquet(str(out)).orderBy("_id").collect()
        assert [r["_id"] for r in rows] == expected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        client.close()


def _events(client: MongoClient) -> list:
    """The events the writes made: a cluster stream from the server's first entry."""
    first = client.local["oplog.rs"].find_one(sort=[("$natural", 1)])["ts"]
    events = []
    with client.watch(start_at_operation_time=first, max_await_time_ms=200) as stream:
        while True:
            event = stream.try_next()
            if event is None:
                break
            events.append(event)
    return events
