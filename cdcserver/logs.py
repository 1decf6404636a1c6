"""Logging: human-readable text by default, JSON lines with `[log] format = "json"`.

A JSON line is one object: `ts` (ISO-8601 UTC, milliseconds), `level`, `logger`, `msg`, then the
structured fields the server passes with `extra=` (`conn`, `peer`, `command`, `ns`,
`durationMillis`, `errCode`, ...), then `exc` when there is a traceback.

Slow operations are logged like mongod's "Slow query" (`slowms`, 100 ms by default): commands
whose own work took longer, not counting the time an awaitData getMore waited for events.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

# Logged by the listener for commands slower than [log] slow_ms (mongod's COMMAND component;
# its operationProfiling.slowOpThresholdMs, 100 by default).
slow_log = logging.getLogger("cdcserver.command")

# The attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None)).keys()
) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        doc: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        # default=str: a field that is not JSON (a Timestamp, an ObjectId) is still logged.
        return json.dumps(doc, default=str, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger for the process (stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif fmt == "text":
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    else:
        raise ValueError(f"log.format: expected 'text' or 'json', got {fmt!r}")
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def log_slow_command(
    duration_s: float,
    conn_id: int,
    name: str,
    db: str,
    reply: Any,
) -> None:
    """mongod's "Slow query" line for a command that took `duration_s` of its own work."""
    millis = int(duration_s * 1000)
    fields: dict[str, Any] = {
        "conn": conn_id,
        "command": name,
        "ns": db,
        "durationMillis": millis,
    }
    ok = reply.get("ok", 1) if hasattr(reply, "get") else 1
    if not ok:
        fields["errCode"] = reply.get("code")
        fields["errName"] = reply.get("codeName")
    cursor = reply.get("cursor") if hasattr(reply, "get") else None
    if isinstance(cursor, dict):
        batch = cursor.get("firstBatch", cursor.get("nextBatch"))
        if isinstance(batch, list):
            fields["nreturned"] = len(batch)
    slow_log.info(
        "Slow query: conn %d %s on %s took %d ms", conn_id, name, db, millis, extra=fields
    )


def _when(ts: Any) -> str:
    stamp = datetime.datetime.fromtimestamp(ts.time, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"Timestamp({ts.time}, {ts.inc}) ({stamp})"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serving_summary(config: Any, oplog: Any, port: int, metrics_port: int | None) -> str:
    """The one line `serve` logs once it listens: what it serves (the source, its data
    directory or files, the oplog's range) and where (wire and metrics ports)."""
    import os

    paths = getattr(oplog, "paths", None)
    cluster = getattr(oplog, "cluster", None)  # --shards N: the embedded cluster's log
    shards = getattr(oplog, "shards", None)
    front = ""  # a mongos front: which port is which shard
    if config.upstream.uri:
        # A mongos's sidecar tails every shard (ShardedUpstream has them): not a replica set.
        kind = "the sharded cluster" if shards is not None else "the replica set"
        source = f"{kind} at " + config.upstream.uri.split("@")[-1]  # no credentials
    elif cluster is not None:
        store = ("in memory" if config.store.in_memory
                 else f"in {os.path.abspath(config.store.data_dir)}")
        n_shards = len(cluster.shards)
        source = (f"an embedded sharded cluster of {n_shards} "
                  f"shard{'' if n_shards == 1 else 's'} {store}")
        front = " (mongos; " + ", ".join(
            f"{s.name} {_host(s.host)}:{s.port}" for s in cluster.shards) + ")"
    elif shards is not None:  # --oplog A... --oplog B...: one recording per shard
        source = "the recorded oplogs of " + ", ".join(
            f"{s.name} ({', '.join(os.path.abspath(p) for p in s.log.paths)})" for s in shards)
        front = " (mongos)"
    elif paths:
        shown = ", ".join(os.path.abspath(p) for p in paths[:3])
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        follow = " (following the last)" if config.source.follow else ""
        source = f"the recorded oplog {shown}{more}{follow}"
    elif config.store.in_memory:
        source = "the embedded store in memory"
    else:
        source = f"the embedded store in {os.path.abspath(config.store.data_dir)}"
    try:
        oldest, latest, span = oplog.oldest_entry(), oplog.latest_ts(), "oplog empty"
    except (AttributeError, NotImplementedError):  # a source that does not say (a front)
        oldest = latest = None
        span = "oplog range not known"
    if latest is not None and oldest is None:  # an upstream's oldest: read once it tails
        span = f"oplog up to {_when(latest)}"
    elif latest is not None and oldest is not None:
        n = len(oplog) if hasattr(oplog, "__len__") else None
        # A restarted sidecar's live window is empty at first: its range is the retained
        # log's, and so is its count.
        retained = getattr(oplog, "retained", None)
        if retained is not None and n is not None:
            n = max(n, int(retained.count))
        count = "" if n is None else f"{n} entr{'y' if n == 1 else 'ies'}, "
        span = f"oplog {count}{_when(oldest['ts'])} to {_when(latest)}"
    where = f"mongodb://{_host(config.server.host)}:{port}/{front}"
    metrics = (f"metrics http://{config.metrics.host}:{metrics_port}/metrics"
               if metrics_port is not None else "metrics off")
    return f"serving {source}; {span}; on {where}; {metrics}"
