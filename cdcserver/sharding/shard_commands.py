"""The command table of a shard of the embedded cluster (a `--shardsvr` mongod): every command
of the embedded replica set, plus `appendOplogNote`, which a sidecar of the cluster uses to
move an idle shard's oplog past a time (instead of waiting for its periodic no-op)."""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from cdcserver import server as _server  # noqa: F401  (every replica-set command is registered)
from cdcserver.commands.tables import EMBEDDED
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

CODE_STALE_CLUSTER_TIME = 209


async def append_oplog_note(server, conn, cmd, db):
    """mongod's AppendOplogNoteCmd: a no-op entry `{op: "n", ns: "", o: data}`; with
    `maxClusterTime`, only when it is after the last applied time (else 209)."""
    if db != "admin":
        raise MongoError(13, "appendOplogNote may only be run against the admin database.")
    data = cmd.get("data")
    if data is None:
        raise MongoError(4, "Missing expected field \"data\"")  # NoSuchKey
    if not isinstance(data, dict):
        raise MongoError(
            14, f"\"data\" had the wrong type. Expected object, found {type_name(data)}"
        )
    store = server.store
    limit = cmd.get("maxClusterTime")
    if limit is not None:
        if not isinstance(limit, Timestamp):
            raise MongoError(
                14, "\"maxClusterTime\" had the wrong type. Expected timestamp, found "
                f"{type_name(limit)}",
            )
        last = store.latest_ts() or Timestamp(0, 0)
        if not limit > last:
            raise MongoError(
                CODE_STALE_CLUSTER_TIME,
                f"Requested maxClusterTime {{ ts: Timestamp({limit.time}, {limit.inc}) }} is "
                f"less or equal to the last primary OpTime: {{ ts: Timestamp({last.time}, "
                f"{last.inc}) }}",
            )
    with store.batch():
        store.log("n", "", data)
    return {}


SHARD_COMMANDS: dict[str, Any] = {**EMBEDDED, "appendOplogNote": append_oplog_note}
