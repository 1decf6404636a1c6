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

Offsets are resume tokens: `{"_data": ...}` (or `{"ts": [t, i]}` for a `startAtOperationTime`
start). A micro-batch `(start, end]` is the events after `start` up to and including the event
whose token is `end`: `read()` opens `watch(start_after=start)` and stops at `end`, so it gives
the same events however often Spark runs it, and a query restarted from its checkpoint goes on
exactly where it stopped (with a file sink: no loss, no duplicate). `latestOffset()` finds `end`
by reading ahead from `start` on the driver, tokens only (the stream plus `{$project: {_id: 1}}`),
up to `maxEventsPerTrigger` events or until the server has nothing more right now.
A collection or database stream goes on past an invalidate, as a stream opened with
`startAfter` the invalidate's token does (the next events are those of a re-created
collection); the invalidate event itself is a row like any other.

Options: `uri` (required); one of `ns` (`db.coll`), `db`, `cluster` (`true`); `pipeline` (a
JSON array of stages after `$changeStream`); `options` (a JSON object of `$changeStream`
options, Extended JSON: `fullDocument`, `fullDocumentBeforeChange`, `showExpandedEvents`, and
where a new query starts: `resumeAfter`/`startAfter` a token or `startAtOperationTime`; else it
starts at the time it is first run); `maxEventsPerTrigger`; `maxAwaitTimeMS` (how long the
read-ahead waits for events, default 200); `readTimeoutSeconds` (how long a task waits for the
events of its batch, default 300).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from bson import json_util
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from cdcserver.spark.rows import SCHEMA_DDL, event_row

try:  # Spark >= 4.2: admission control
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]

__all__ = ["CdcServerDataSource", "ChangeStreamReader", "register"]


def register(spark: Any) -> None:
    """Make `format("cdcserver")` known to this session."""
    spark.dataSource.register(CdcServerDataSource)


class CdcServerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdcserver"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> ChangeStreamReader:
        return ChangeStreamReader(dict(self.options))


class TokenRange(InputPartition):
    """The events after `start` up to and including the one whose token is `end`."""

    def __init__(self, start: dict[str, Any], end: dict[str, Any]) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


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
        self.max_events = int(max_events) if max_events is not None else None
        self.max_await_ms = int(opts.get("maxawaittimems", 200))
        self.read_timeout_s = float(opts.get("readtimeoutseconds", 300))

    def client(self) -> Any:
        from pymongo import MongoClient

        return MongoClient(self.uri, document_class=RawBSONDocument, tz_aware=True)

    def watch(self, client: Any, start: Mapping[str, Any] | None, *, ids_only: bool = False):
        """`watch()` from an offset (None: from what the options say, else from now)."""
        if self.cluster:
            target = client
        elif self.db:
            target = client[self.db]
        else:
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


class ChangeStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.spec = StreamSpec(options)
        self._client: Any = None
        self._last: dict[str, Any] | None = None

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

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.spec.max_events is not None:
            return ReadMaxRows(self.spec.max_events)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None):
        """The token of the last event now available after `start` (at most the limit's)."""
        if start is None:  # Spark < 4.2 does not say where the next batch starts
            start = self._last or self.initialOffset()
        max_rows = self.spec.max_events
        if limit is not None:
            max_rows = getattr(limit, "max_rows", None)
        end = None
        count = 0
        position = start
        while max_rows is None or count < max_rows:
            ended = False
            with self.spec.watch(self._driver_client(), position, ids_only=True) as stream:
                while max_rows is None or count < max_rows:
                    event = stream.try_next() if stream.alive else None
                    if event is None:
                        ended = not stream.alive
                        break
                    end = event["_id"]
                    count += 1
            if not ended or end is None or _offset_of(end) == position:
                break
            position = _offset_of(end)  # an invalidate closed the stream: go on after it
        self._last = _offset_of(end) if end is not None else start
        return self._last

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[TokenRange]:
        if start == end:
            return []
        return [TokenRange(start, end)]

    def read(self, partition: TokenRange) -> Iterator[tuple]:
        return read_range(self.spec, partition.start, partition.end)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def read_range(
    spec: StreamSpec, start: Mapping[str, Any], end: Mapping[str, Any]
) -> Iterator[tuple]:
    """The rows of the events after `start` up to and including the one whose token is `end`."""
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
