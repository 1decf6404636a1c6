"""`spark.readStream.format("cdcserver")`: change events as a Structured Streaming source.

    from cdcserver.spark.source import register
    register(spark)
    events = (
        spark.readStream.format("cdcserver")
        .option("uri", "mongodb://127.0.0.1:27017/")
        .option("ns", "shop.orders")                   # or .option("db", ...) / ("cluster", "true")
        .option("pipeline", '[{"$match": {"operationType": "insert"}}]')
        .option("options", '{"fullDocument": "updateLookup"}')  # $changeStream options
        .option("maxEventsPerTrigger", 10000)
        .load()
    )
    events.writeStream.format("parquet").option("checkpointLocation", ...).start(path)

It reads from a cdcserver or from MongoDB itself (any URI pymongo takes) with `watch()`. Rows
have the columns of `rows.py` (`event` is the BSON the server sent, byte for byte).

Each event is read once. The source is a `SimpleDataSourceStreamReader`: for a micro-batch,
`read(start)` takes the events after `start` from one change stream (kept open from one batch
to the next), at most `maxEventsPerTrigger` of them or what the server has right now, and
returns them with the token of the last one as the batch's end; Spark keeps those rows for the
batch. Only a batch that must be run again after a failure (a query restarted from its
checkpoint with a batch in its offset log that was not committed) is read again, by
`readBetweenOffsets(start, end)`: the events after `start` up to and including the one whose
token is `end`, the same events however often it runs. With a file sink, a query killed at
any point and restarted from its checkpoint writes every event exactly once.

Offsets are resume tokens: `{"_data": ...}` (or `{"ts": [t, i]}` for a `startAtOperationTime`
start). A collection or database stream goes on past an invalidate, as a stream opened with
`startAfter` the invalidate's token does (the next events are those of a re-created
collection); the invalidate event itself is a row like any other.

`register(spark)` on a local master makes Spark's Python workers run this interpreter (the one
that has cdcserver) unless `PYSPARK_PYTHON` or `spark.pyspark.python` says otherwise; on a
cluster, ship cdcserver to the executors (see `cdcserver/spark/__init__.py`).

Options: `uri` (required); one of `ns` (`db.coll`), `db`, `cluster` (`true`); `pipeline` (a
JSON array of stages after `$changeStream`); `options` (a JSON object of `$changeStream`
options, Extended JSON: `fullDocument`, `fullDocumentBeforeChange`, `showExpandedEvents`, and
where a new query starts: `resumeAfter`/`startAfter` a token or `startAtOperationTime`; else it
starts at the time it is first run); `maxEventsPerTrigger` (default 10000: the events of a
batch are held by the driver); `maxAwaitTimeMS` (how long a batch waits for events when there
are none, default 200); `readTimeoutSeconds` (how long a re-read waits for the events of its
batch, default 300).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from bson import json_util
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from cdcserver.spark.rows import SCHEMA_DDL, event_row

__all__ = ["CdcServerDataSource", "ChangeStreamReader", "register"]

DEFAULT_MAX_EVENTS = 10_000


def register(spark: Any) -> None:
    """Make `format("cdcserver")` known to this session. On a local master, the Python workers
    run this interpreter (it has cdcserver), unless the user chose theirs."""
    sc = spark.sparkContext
    chosen = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python")
    if sc.master.startswith("local") and not chosen:
        # Spark's default is `python3` on PATH, which need not be this one. The data source
        # is wrapped with the context's interpreter when it is registered.
        sc.pythonExec = sys.executable
    spark.dataSource.register(CdcServerDataSource)


class CdcServerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdcserver"

    def schema(self) -> str:
        return SCHEMA_DDL

    def simpleStreamReader(self, schema: Any) -> ChangeStreamReader:
        return ChangeStreamReader(dict(self.options))


class StreamSpec:
    """What to watch, from the source's options (also checked when the query starts)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        self.uri = opts.get("uri")
        if not self.uri:
            raise ValueError("the cdcserver source needs option uri")
        self.ns = opts.get("ns")
        self.db = opts.get("db")
        self.cluster = str(opts.get("cluster", "false")).lower() == "true"
        if sum(map(bool, (self.ns, self.db, self.cluster))) != 1:
            raise ValueError("give exactly one of the options ns, db, cluster")
        if self.ns and "." not in self.ns:
            raise ValueError("option ns takes db.coll")
        self.pipeline = json_util.loads(opts["pipeline"]) if opts.get("pipeline") else []
        self.options = json_util.loads(opts["options"]) if opts.get("options") else {}
        if not isinstance(self.pipeline, list) or not isinstance(self.options, dict):
            raise ValueError("option pipeline takes a JSON array and options a JSON object")
        self.start = {
            k: self.options.pop(k)
            for k in ("resumeAfter", "startAfter", "startAtOperationTime")
            if k in self.options
        }
        max_events = opts.get("maxeventspertrigger")
        self.max_events = int(max_events) if max_events is not None else DEFAULT_MAX_EVENTS
        if self.max_events < 1:
            raise ValueError("option maxEventsPerTrigger takes a positive number")
        self.max_await_ms = int(opts.get("maxawaittimems", 200))
        self.read_timeout_s = float(opts.get("readtimeoutseconds", 300))

    def client(self) -> Any:
        from pymongo import MongoClient

        return MongoClient(self.uri, document_class=RawBSONDocument, tz_aware=True)

    def watch(
        self, client: Any, start: Mapping[str, Any] | None, *, ids_only: bool = False
    ) -> Any:  # pymongo's ChangeStream
        """`watch()` from an offset (None: from what the options say, else from now)."""
        if self.cluster:
            target = client
        elif self.db:
            target = client[self.db]
        else:
            assert self.ns is not None  # one of ns, db, cluster is given (__init__)
            db, _, coll = self.ns.partition(".")
            target = client[db][coll]
        pipeline = list(self.pipeline)
        if ids_only and not (pipeline and "$changeStreamSplitLargeEvent" in pipeline[-1]):
            pipeline.append({"$project": {"_id": 1}})
        kwargs: dict[str, Any] = {
            "full_document": self.options.get("fullDocument"),
            "full_document_before_change": self.options.get("fullDocumentBeforeChange"),
            "show_expanded_events": self.options.get("showExpandedEvents"),
            "max_await_time_ms": self.max_await_ms,
        }
        if start is None:
            if "startAtOperationTime" in self.start:
                kwargs["start_at_operation_time"] = self.start["startAtOperationTime"]
            elif "startAfter" in self.start:
                kwargs["start_after"] = self.start["startAfter"]
            elif "resumeAfter" in self.start:
                kwargs["resume_after"] = self.start["resumeAfter"]
        elif "ts" in start:
            kwargs["start_at_operation_time"] = Timestamp(*start["ts"])
        else:
            # startAfter also goes on past an invalidate (a dropped collection re-created).
            kwargs["start_after"] = {"_data": start["_data"]}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return target.watch(pipeline, **kwargs)


def _offset_of(token: Mapping[str, Any]) -> dict[str, Any]:
    return {"_data": token["_data"]}


class ChangeStreamReader(SimpleDataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.spec = StreamSpec(options)
        self._client: Any = None
        # The open change stream and the offset it has read up to: the next batch goes on
        # reading it when it starts there.
        self._stream: Any = None
        self._position: dict[str, Any] | None = None

    def _driver_client(self) -> Any:
        if self._client is None:
            self._client = self.spec.client()
        return self._client

    def initialOffset(self) -> dict[str, Any]:
        start = self.spec.start
        if "startAtOperationTime" in start:
            ts = start["startAtOperationTime"]
            return {"ts": [ts.time, ts.inc]}
        for key in ("startAfter", "resumeAfter"):
            if key in start:
                return _offset_of(start[key])
        # From now: the post-batch resume token of a stream opened now.
        with self.spec.watch(self._driver_client(), None, ids_only=True) as stream:
            return _offset_of(stream.resume_token)

    def _stream_at(self, start: dict[str, Any]) -> Any:
        if self._stream is not None and self._position == start and self._stream.alive:
            return self._stream
        self._close_stream()
        self._stream = self.spec.watch(self._driver_client(), start)
        self._position = dict(start)
        return self._stream

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self._position = None

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        """The events after `start` available now (at most `maxEventsPerTrigger`), each read
        once, and the token of the last one (`start` when there is none)."""
        rows: list[tuple[Any, ...]] = []
        end = start
        limit = self.spec.max_events
        opened_at = None
        while len(rows) < limit:
            if self._stream is None or self._position != end or not self._stream.alive:
                if opened_at == end:
                    break  # a stream opened here ended at once: nothing more now
                opened_at = end
            stream = self._stream_at(end)
            event = stream.try_next() if stream.alive else None
            if event is None:
                if stream.alive:
                    break  # nothing more right now
                self._close_stream()  # an invalidate closed it: go on after it
                continue
            rows.append(event_row(event))
            end = _offset_of(event["_id"])
            self._position = end
        return iter(rows), end

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        """A batch again, after a failure: the same rows as when it was first read."""
        return read_range(self.spec, start, end)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        self._close_stream()
        if self._client is not None:
            self._client.close()
            self._client = None


def read_range(
    spec: StreamSpec, start: Mapping[str, Any], end: Mapping[str, Any]
) -> Iterator[tuple[Any, ...]]:
    """The rows of the events after `start` up to and including the one whose token is `end`
    (none when `end` is `start`: a batch that found no events, as a stream started on an idle
    server reads first)."""
    if dict(end) == dict(start):
        return
    target = end["_data"].upper()
    deadline = time.monotonic() + spec.read_timeout_s
    position = dict(start)
    with spec.client() as client:
        while True:
            with spec.watch(client, position) as stream:
                while stream.alive:
                    event = stream.try_next()
                    if event is None:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the batch's last event {target} did not come")
                        continue
                    data = event["_id"]["_data"].upper()
                    if data > target:
                        raise RuntimeError(
                            f"the change stream went past the batch's end {target} (at {data}):"
                            " its history changed"
                        )
                    yield event_row(event)
                    if data == target:
                        return
                    position = _offset_of(event["_id"])
            # An invalidate closed the stream before the batch's end: go on after it.
            if time.monotonic() > deadline:
                raise TimeoutError(f"the batch's last event {target} did not come")
