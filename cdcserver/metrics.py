"""Prometheus metrics: one registry per server, served over HTTP on its own port.

Most values are read from the server's state when Prometheus scrapes (`StateCollector`), so
the request path pays nothing for them. Only what cannot be read afterwards is counted as it
happens: getMore latency (a histogram observation per getMore) and command errors (a labelled
counter, on the error path only).

Exposed names (all `cdcserver_`):

- `connections_current`, `connections_total`
- `cursors_open{scope="collection|database|cluster"}`
- `events_delivered_total`
- `getmore_duration_seconds` (histogram; the getMore's own work: like mongod's durationMillis it
  leaves out the time an awaitData getMore waited for events)
- `command_errors_total{code, codeName}`
- `oplog_read_timestamp_seconds`, `oplog_oldest_timestamp_seconds`, `oplog_entries`,
  `oplog_lag_seconds`
- `streams_lag_entries`, `streams_lag_seconds` (the producer furthest behind the newest entry)
- `hub_window_entries`, `hub_producers`, `hub_queued_events`
- `upstream_connected`, `upstream_reconnects_total`, `upstream_history_lost_total`,
  `upstream_pending_entries`, `upstream_window_entries`, `upstream_window_bytes`,
  `upstream_history_readers` (only with `--upstream`)
- `upstream_retained_entries`, `upstream_retained_bytes`,
  `upstream_retained_oldest_timestamp_seconds`, `upstream_retained_beyond_upstream_seconds`,
  `upstream_retained_write_errors_total`, `upstream_retained_failing` (with `upstream.retain_dir`)
- `materialized_ready`, `materialized_applied_timestamp_seconds`,
  `materialized_consistent_timestamp_seconds`, `materialized_lag_seconds`,
  `materialized_versions`, `materialized_version_bytes`, `materialized_resyncs_total`,
  `materialized_failures_total`, `materialized_images_served_total` (with
  `upstream.materialize`; `{shard="<name>"}` on a sidecar of a sharded cluster)
- `source_failed` (1 once a followed file met an entry it cannot serve)
- `shutting_down`, `requests_in_flight`

and, without the prefix, prometheus_client's `process_*` and `python_info`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cdcserver.cursors.change_stream import ChangeStreamCursor
from cdcserver.sources.base import EntryList

if TYPE_CHECKING:
    from cdcserver.context import ServerState

log = logging.getLogger(__name__)

GETMORE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
SCOPES = ("collection", "database", "cluster")


class Metrics:
    """The registry of one server, and the instruments the request path feeds."""

    def __init__(
        self, state: ServerState, in_flight: Callable[[], int] | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.get_more_seconds = Histogram(
            "cdcserver_getmore_duration_seconds",
            "getMore latency: the command's own work, not the awaitData wait for events",
            buckets=GETMORE_BUCKETS,
            registry=self.registry,
        )
        self.command_errors = Counter(
            "cdcserver_command_errors",
            "Error replies, by MongoDB error code",
            ("code", "codeName"),
            registry=self.registry,
        )
        self.registry.register(StateCollector(state, in_flight))
        # process_* (CPU, memory, descriptors, start time; from /proc, Linux only) and
        # python_info: what every Prometheus client exposes by default, on this registry.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def command_error(self, code: Any, code_name: Any) -> None:
        self.command_errors.labels(str(code), str(code_name)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class StateCollector(Collector):
    """Reads connections, cursors, the hub and the source at scrape time."""

    def __init__(self, state: ServerState, in_flight: Callable[[], int] | None = None) -> None:
        self.state = state
        self.in_flight = in_flight

    def describe(self) -> list[Metric]:
        return []  # names are fixed; no collect() at registration

    def collect(self) -> Iterator[Metric]:
        state = self.state
        yield _gauge("cdcserver_connections_current", "Open client connections",
                     state.connections)
        yield _counter("cdcserver_connections", "Client connections accepted",
                       state.total_connections)
        yield _counter("cdcserver_events_delivered", "Change events returned to clients",
                       state.events_delivered)
        yield _gauge("cdcserver_shutting_down", "1 while the server shuts down",
                     1.0 if state.shutting_down else 0.0)
        if self.in_flight is not None:
            yield _gauge("cdcserver_requests_in_flight",
                         "Commands being run (awaitable hellos left out)", self.in_flight())

        # This server's change streams (a front's merged ones have no pipeline of their own).
        cursors = [c for c in state.cursors.cursors.values() if isinstance(c, ChangeStreamCursor)]
        by_scope: dict[str, int] = dict.fromkeys(SCOPES, 0)
        producers: dict[int, Any] = {}
        queued = 0
        for cursor in cursors:
            scope = cursor.pipeline.spec.scope
            by_scope[scope] = by_scope.get(scope, 0) + 1
            producers[id(cursor.group)] = cursor.group
            queued += cursor.pipeline.pending_count
        family = GaugeMetricFamily(
            "cdcserver_cursors_open", "Open change-stream cursors", labels=["scope"]
        )
        for scope_name, n in by_scope.items():
            family.add_metric([scope_name], n)
        yield family
        yield _gauge("cdcserver_hub_producers",
                     "Pipelines reading the oplog (identical streams share one)", len(producers))
        yield _gauge("cdcserver_hub_queued_events",
                     "Events made and not yet returned, over all cursors", queued)

        source = state.oplog
        store = getattr(source, "store", None)
        entries = source if store is None else store
        latest = source.latest_ts()
        if latest is not None:
            yield _gauge("cdcserver_oplog_read_timestamp_seconds",
                         "Timestamp (seconds) of the newest oplog entry read", latest.time)
            yield _gauge("cdcserver_oplog_lag_seconds",
                         "Wall clock minus the newest oplog entry's time",
                         max(0.0, time.time() - latest.time))
        if isinstance(entries, EntryList):
            oldest = entries.oldest_ts()
            if oldest is not None:
                yield _gauge("cdcserver_oplog_oldest_timestamp_seconds",
                             "Timestamp (seconds) of the oldest oplog entry held", oldest.time)
            yield _gauge("cdcserver_oplog_entries", "Oplog entries held", entries.entry_count())
            yield _gauge("cdcserver_hub_window_entries",
                         "Decoded oplog entries kept for sharing between cursors",
                         entries.decoded_count())
            lag_entries = 0
            lag_seconds = 0.0
            if latest is not None:
                for group in producers.values():
                    if group.log is not source or group.next_ts > latest:
                        continue
                    lag_entries = max(lag_entries, entries.count_from(group.next_ts))
                    lag_seconds = max(lag_seconds, float(latest.time - group.next_ts.time))
            yield _gauge("cdcserver_streams_lag_entries",
                         "Oplog entries the furthest-behind stream has not read yet", lag_entries)
            yield _gauge("cdcserver_streams_lag_seconds",
                         "Seconds of oplog the furthest-behind stream has not read yet",
                         lag_seconds)

        # As upstream_retained_failing: 1 while the source cannot go on (a followed file met an
        # entry it cannot serve; streams that read up to it fail with 280 naming the place).
        yield _gauge("cdcserver_source_failed",
                     "1 once the source stopped for good (a followed file's bad entry)",
                     0.0 if source.failure() is None else 1.0)

        status = getattr(source, "status", None)
        if callable(status) and hasattr(source, "reconnects"):  # a live upstream
            st = status()
            yield _gauge("cdcserver_upstream_connected", "1 while the upstream tail reads",
                         1.0 if st["connected"] else 0.0)
            yield _counter("cdcserver_upstream_reconnects", "Upstream tail reconnects",
                           st["reconnects"])
            yield _counter("cdcserver_upstream_history_lost",
                           "Times the tail's position was gone from the upstream oplog",
                           st["historyLostGaps"])
            yield _gauge("cdcserver_upstream_pending_entries",
                         "Entries read from the upstream, waiting for majority commit",
                         st["pendingMajority"])
            yield _gauge("cdcserver_upstream_window_entries",
                         "Upstream entries in the live window", st["windowEntries"])
            yield _gauge("cdcserver_upstream_window_bytes",
                         "Bytes of upstream entries in the live window", st["windowBytes"])
            yield _gauge("cdcserver_upstream_history_readers",
                         "Readers of older upstream history", st["historyReaders"])
            retained = st.get("retained")
            if retained is not None:  # the durable log (upstream.retain_dir)
                yield from _retained_metrics(retained, st.get("upstreamOldest"))
        yield from _materialized_metrics(source)


def _materialized_metrics(source: Any) -> Iterator[Metric]:
    """`upstream.materialize`: the copy's state (a sidecar of a sharded cluster has one per
    shard, labelled with the shard's name)."""
    copies: dict[str, Any] = dict(getattr(source, "copies", None) or {})
    sharded = bool(copies)
    if not sharded:
        copy = getattr(getattr(source, "images", None), "copy", None)
        if copy is None:
            return
        copies = {"": copy}
    labels = ["shard"] if sharded else []
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "ready": GaugeMetricFamily(
            "cdcserver_materialized_ready",
            "1 while the materialized copy is consistent and applying", labels=labels),
        "applied": GaugeMetricFamily(
            "cdcserver_materialized_applied_timestamp_seconds",
            "Time of the newest entry the copy applied (0: none)", labels=labels),
        "consistent": GaugeMetricFamily(
            "cdcserver_materialized_consistent_timestamp_seconds",
            "Time from which the copy answers images and snapshot reads (0: not yet)",
            labels=labels),
        "lag": GaugeMetricFamily(
            "cdcserver_materialized_lag_seconds",
            "Seconds between the newest retained entry and the newest the copy applied",
            labels=labels),
        "versions": GaugeMetricFamily(
            "cdcserver_materialized_versions", "Document versions the copy keeps",
            labels=labels),
        "bytes": GaugeMetricFamily(
            "cdcserver_materialized_version_bytes", "Bytes of the versions the copy keeps",
            labels=labels),
        "resyncs": CounterMetricFamily(
            "cdcserver_materialized_resyncs",
            "Times the copy was thrown away and synced again", labels=labels),
        "failures": CounterMetricFamily(
            "cdcserver_materialized_failures",
            "Initial syncs or apply passes that failed and were retried", labels=labels),
        "images": CounterMetricFamily(
            "cdcserver_materialized_images_served",
            "Pre-images answered from the copy (no upstream read)", labels=labels),
    }
    for name, copy in sorted(copies.items()):
        st = copy.status()
        at = [name] if sharded else []
        applied, consistent = st["appliedThrough"], st["consistentAt"]
        families["ready"].add_metric(at, 1.0 if st["state"] == "ready" else 0.0)
        families["applied"].add_metric(at, 0.0 if applied is None else float(applied.time))
        families["consistent"].add_metric(
            at, 0.0 if consistent is None else float(consistent.time))
        families["lag"].add_metric(at, st["lagSeconds"])
        families["versions"].add_metric(at, st["versions"])
        families["bytes"].add_metric(at, st["versionBytes"])
        families["resyncs"].add_metric(at, st["resyncs"])
        families["failures"].add_metric(at, st["failures"])
        families["images"].add_metric(at, st["imagesServed"])
    yield from families.values()


def _retained_metrics(retained: dict[str, Any], upstream_oldest: Any) -> Iterator[Metric]:
    yield _gauge("cdcserver_upstream_retained_entries",
                 "Entries in the sidecar's durable retained log", retained["entries"])
    yield _gauge("cdcserver_upstream_retained_bytes",
                 "Bytes of entries in the durable retained log", retained["bytes"])
    oldest = retained["oldest"]
    yield _gauge("cdcserver_upstream_retained_oldest_timestamp_seconds",
                 "Time of the oldest retained entry (0: none)",
                 0.0 if oldest is None else float(oldest.time))
    # How much further back than the upstream's own oplog a stream can resume.
    gap = 0.0
    if oldest is not None and upstream_oldest is not None:
        gap = max(0.0, float(upstream_oldest.time - oldest.time))
    yield _gauge("cdcserver_upstream_retained_beyond_upstream_seconds",
                 "Seconds between the oldest retained entry and the upstream's oldest oplog "
                 "entry", gap)
    yield _counter("cdcserver_upstream_retained_write_errors",
                   "Writes of the retained log the disk refused (the tail waits meanwhile)",
                   retained["writeErrors"])
    yield _gauge("cdcserver_upstream_retained_failing",
                 "1 while the retained log cannot be written", 1.0 if retained["failing"] else 0.0)


class MetricsEndpoint:
    """`GET /metrics` over HTTP/1.x on the server's event loop (one reply per connection)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, host: str, port: int | None) -> int:
        """Listen on `port`; None (no port configured): the default port, or, when something
        else holds it (another cdcserver, an exporter), any free port with a warning, so a
        server nobody asked a metrics port of starts anyway. A port that was asked for must
        be free: its OSError goes to the caller (startup fails naming metrics.port)."""
        from cdcserver.config import METRICS_PORT

        self.port = METRICS_PORT if port is None else port  # (named by a startup error)
        try:
            self._server = await asyncio.start_server(self._on_connection, host, self.port)
        except OSError as exc:
            if port is not None or exc.errno != errno.EADDRINUSE:
                raise
            self._server = await asyncio.start_server(self._on_connection, host, 0)
            self.port = self._server.sockets[0].getsockname()[1]
            log.warning(
                "metrics: %s:%d is in use; serving metrics on port %d instead "
                "(set metrics.port or --metrics-port to choose)",
                host, METRICS_PORT, self.port,
                extra={"host": host, "port": self.port, "defaultPort": METRICS_PORT},
            )
            return self.port
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            method = parts[0] if parts else ""
            path = parts[1].split("?", 1)[0] if len(parts) > 1 else ""
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path in ("/metrics", "/"):
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
                body = self.metrics.exposition()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics\n"
            header = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            writer.write(header if method == "HEAD" else header + body)
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
