"""The snapshot-then-stream recipe for applications (docs/materialize.md), with PyMongo.

`snapshot_then_watch(collection)` reads the whole collection (or what `filter` selects) at one
time T with `readConcern {level: "snapshot"}` on a sidecar that materializes it, then opens a
change stream just after T: every change after the snapshot arrives exactly once, none that the
snapshot already holds. Pass `at_cluster_time` to take the snapshot at an earlier time the
sidecar retains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp


def after(ts: Timestamp) -> Timestamp:
    """The first time after `ts` (a change stream's startAtOperationTime is inclusive, and the
    snapshot at `ts` holds the write at `ts`)."""
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def snapshot(
    collection: Any, filter: Mapping[str, Any] | None = None,
    at_cluster_time: Timestamp | None = None, batch_size: int = 1000,
) -> tuple[list[Any], Timestamp]:
    """The documents of `collection` (a PyMongo Collection) at one time, and that time."""
    db = collection.database
    rc: dict[str, Any] = {"level": "snapshot"}
    if at_cluster_time is not None:
        rc["atClusterTime"] = at_cluster_time
    reply = db.command({"find": collection.name, "filter": dict(filter or {}),
                        "batchSize": batch_size, "readConcern": rc},
                       codec_options=collection.codec_options)
    cursor = reply["cursor"]
    at = cursor["atClusterTime"]
    docs = list(cursor["firstBatch"])
    cursor_id = cursor["id"]
    while cursor_id:
        more = db.command({"getMore": cursor_id, "collection": collection.name,
                           "batchSize": batch_size}, codec_options=collection.codec_options)
        docs.extend(more["cursor"]["nextBatch"])
        cursor_id = more["cursor"]["id"]
    return docs, at


def snapshot_then_watch(
    collection: Any, filter: Mapping[str, Any] | None = None, *,
    at_cluster_time: Timestamp | None = None, pipeline: list[Any] | None = None,
    **watch_options: Any,
) -> tuple[list[Any], Timestamp, Any]:
    """(the snapshot's documents, its time T, a change stream of everything after T)."""
    docs, at = snapshot(collection, filter, at_cluster_time)
    stream = collection.watch(pipeline or [], start_at_operation_time=after(at), **watch_options)
    return docs, at, stream
