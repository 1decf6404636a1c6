"""The collections a collection change stream may not be opened on, as mongod's
`OplogAggCatalogState::validate` (aggregation_execution_state.cpp) refuses them, for every
mode: the embedded store (its catalog), a sidecar (its upstream's listCollections), a front
(each shard's catalog: a shard's refusal is the stream's, as mongos passes it on).

- a viewless time-series collection (9.0), unless the aggregate asks `rawData`: 115
  CommandNotSupported, "Cannot run aggregation on timeseries with namespace <ns>" (the
  collection is a time-series one: `isTimeseries()`; with rawData the stream reads it as
  the collection of buckets it is);
- a view, rawData or not: 166 CommandNotSupportedOnView, "Namespace <ns> is a view, not a
  collection"; a time-series collection's view under 8.0 says "Cannot run aggregation on
  timeseries with namespace <ns>" (`Release.timeseries_view_stream_message`).

A database or cluster stream is never refused here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from cdcserver.embedded import timeseries
from cdcserver.embedded.store import Store
from pipeline_stages.errors import MongoError
from pipeline_stages.release import Release

log = logging.getLogger(__name__)


class Kind(Enum):
    VIEW = "view"
    TIMESERIES_VIEW = "timeseries view"  # a viewful time-series collection's view
    VIEWLESS = "viewless timeseries"


def refusal(kind: Kind | None, db: str, coll: str, release: Release,
            raw_data: bool) -> MongoError | None:
    """The error mongod gives a collection stream on `db.coll` of this kind, or None."""
    ns = f"{db}.{coll}"
    if kind is Kind.VIEWLESS:
        if raw_data:
            return None
        return MongoError(115, f"Cannot run aggregation on timeseries with namespace {ns}")
    if kind is Kind.TIMESERIES_VIEW and release.timeseries_view_stream_message:
        return MongoError(166, f"Cannot run aggregation on timeseries with namespace {ns}")
    if kind is not None:
        return MongoError(166, f"Namespace {ns} is a view, not a collection")
    return None


def stream_collection(cmd: Mapping[str, Any]) -> str | None:
    """The collection of a collection change stream's aggregate, else None (db, cluster)."""
    target = cmd.get("aggregate")
    return target if isinstance(target, str) else None


def store_kind(store: Store, db: str, coll: str) -> Kind | None:
    """What `db.coll` is in an embedded store's catalog."""
    view = store.view(db, coll)
    if view is not None:
        return Kind.TIMESERIES_VIEW if timeseries.is_timeseries_view(view) else Kind.VIEW
    c = store.get(db, coll)
    if c is not None and timeseries.is_viewless(c):
        return Kind.VIEWLESS
    return None


def listing_kind(coll: str, entries: Iterable[Mapping[str, Any]]) -> Kind | None:
    """What `coll` is from a listCollections of `coll` and its buckets collection: a view;
    a time-series collection with its buckets beside it (its view) or without (viewless)."""
    by_name = {e.get("name"): e for e in entries}
    entry = by_name.get(coll)
    kind = entry.get("type") if entry is not None else None
    if kind == "view":
        return Kind.VIEW
    if kind == "timeseries":
        if timeseries.buckets_name(coll) in by_name:
            return Kind.TIMESERIES_VIEW
        return Kind.VIEWLESS
    return None


async def upstream_kind(client: Any, db: str, coll: str) -> Kind | None:
    """What `db.coll` is on a live upstream (a replica set, or a mongos: its primary shard's
    catalog), read with listCollections when the stream opens, as mongod reads its catalog
    then. An upstream that cannot answer refuses nothing: the stream is served from what the
    sidecar has (logged), rather than failed for a check."""
    names = [coll, timeseries.buckets_name(coll)]
    try:
        reply = await client[db].command(
            "listCollections", filter={"name": {"$in": names}}, nameOnly=False,
            authorizedCollections=True)
    except Exception as exc:  # noqa: BLE001 - unreachable or restricted: serve the stream
        log.info("listCollections of %s.%s for a change stream: %s (not checked)",
                 db, coll, exc)
        return None
    cursor = reply.get("cursor") or {}
    return listing_kind(coll, cursor.get("firstBatch") or [])
