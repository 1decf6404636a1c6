"""`spark.readStream.format("cdcserver")` against a real cdcserver started in-process.

The reader on its own (no query): micro-batches cut by `latestOffset` and read by `read()` give
the events `cdcserver replay` gives, each once, and `read()` of a range gives the same rows every
time. Then a checkpointed query to a Parquet sink, stopped mid-stream and restarted after more
writes: the union of what it wrote is every event exactly once.
"""

from __future__ import annotations

import pathlib
import time

import bson
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from test_spark_replay import Workload, command, ddl_story, reference, spark  # noqa: F401

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


def test_reader_batches_are_the_replay_events(cdcserver_factory, tmp_path):
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from cdcserver.spark.source import ChangeStreamReader, TokenRange

    path = Workload(seed=5).write(tmp_path / "oplog.bson", 600, extra=ddl_story)
    server = cdcserver_factory([path])
    for scope, key in (("cluster", "cluster"), ("shop", "db"), ("shop.orders", "ns")):
        expected = _continued(path, scope)
        reader = ChangeStreamReader(
            {"uri": server.uri, key: "true" if key == "cluster" else scope,
             **_options(options={"startAtOperationTime": _first_ts(path)})}
        )
        start = reader.initialOffset()
        rows, ranges = [], []
        while True:
            end = reader.latestOffset(start, ReadMaxRows(97))
            if end == start:
                break
            ranges.append(TokenRange(start, end))
            rows += list(reader.read(ranges[-1]))
            start = end
        assert [r[6] for r in rows] == [e.raw for e in expected], scope
        assert reader.partitions(start, start) == []
        # Deterministic: any range read again gives the same rows.
        for r in ranges[:: max(1, len(ranges) // 3)]:
            assert list(reader.read(r)) == rows[
                sum(len(list(reader.read(x))) for x in ranges[: ranges.index(r)]) :
            ][: len(list(reader.read(r)))]
        # All available at once: the same end.
        assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable()) == start
        reader.stop()
    # A stream started "now" sees only what comes after it.
    reader = ChangeStreamReader({"uri": server.uri, "db": "app"})
    now = reader.initialOffset()
    assert reader.latestOffset(now, ReadAllAvailable()) == now
    work = Workload(seed=6, start=bson.timestamp.Timestamp(1_800_000_000, 1))
    more = _split_file(work.write(tmp_path / "more.bson", 50))
    server.append(more)
    end = reader.latestOffset(now, ReadAllAvailable())
    rows = list(reader.read(TokenRange(now, end)))
    assert rows and all(r[3] == "app" for r in rows)
    reader.stop()


def test_query_stopped_and_restarted_writes_every_event_once(spark, cdcserver_factory, tmp_path):  # noqa: F811
    from cdcserver.spark.source import register

    register(spark)
    work = Workload(seed=8)
    path = work.write(tmp_path / "oplog.bson", 500)
    server = cdcserver_factory([path])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = _options(options={"startAtOperationTime": _first_ts(path)})

    def start():
        events = (
            spark.readStream.format("cdcserver")
            .option("uri", server.uri)
            .option("cluster", "true")
            .options(**options)
            .option("maxEventsPerTrigger", 120)
            .load()
        )
        return (
            events.writeStream.format("parquet")
            .option("checkpointLocation", str(checkpoint))
            .option("path", str(out))
            .start()
        )

    query = start()
    try:
        deadline = time.monotonic() + 120
        while sum(1 for p in query.recentProgress if p["numInputRows"]) < 2:
            assert query.exception() is None
            assert time.monotonic() < deadline, query.recentProgress
            time.sleep(0.2)
    finally:
        query.stop()  # mid-stream: more events are waiting, a batch may be half done
    first_run = spark.read.parquet(str(out)).count()
    total = len(reference([path], *command("cluster")))
    assert 0 < first_run < total

    more = _split_file(work.write(tmp_path / "more.bson", 200))
    server.append(more)  # to the file the server follows (and the reference reads)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None

    expected = reference([path], *command("cluster"))
    rows = spark.read.parquet(str(out)).orderBy("_id").collect()
    assert len(rows) == len(expected)
    assert [bytes(r["event"]) for r in rows] == [e.raw for e in expected]
    assert [r["_id"] for r in rows] == [e["_id"]["_data"] for e in expected]
