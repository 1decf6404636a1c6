"""Updates and deletes of a time-series collection's measurements, as mongod 8.0 / 9.0 run
them on the collection's name (viewful: through its view; viewless, 9.0: the collection
itself), without `rawData` (which writes the buckets as they are).

As mongod's time-series write path (timeseries_write_util.cpp, `performAtomicWrites`):
every bucket holding a measurement the filter matches is unpacked; a delete removes the
matched measurements, an update removes them and inserts each one as updated through the
bucket catalog (a measurement is never changed in place: it may land in another bucket); a
bucket left empty is deleted, another one rewritten whole with the measurements it keeps
(one replacement). `limit: 1` / `multi: false` take the first match in bucket order. The
counts are of measurements. An upsert inserts its document as a measurement.

The buckets are this store's version 1 layout (timeseries.py); the replacement's bucket keeps
its `_id` and is repacked (indices from 0, control min / max of what is left).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdcserver.embedded import query, timeseries
from cdcserver.embedded.sessions import OpSession
from cdcserver.embedded.store import Store
from cdcserver.embedded.store_types import Collection


@dataclass
class Target:
    """A time-series collection a write addresses by its name."""

    db: str
    coll: str
    buckets: Collection  # the collection of buckets (the viewless collection itself)

    @property
    def options(self) -> Mapping[str, Any]:
        return self.buckets.options["timeseries"]  # type: ignore[no-any-return]


def target(store: Store, db: str, coll: str, raw_data: bool) -> Target | None:
    """The time-series collection `db.coll` when a write on it writes measurements (no
    `rawData`), else None (any other collection: the usual write path)."""
    if raw_data:
        return None
    c = store.get(db, coll)
    if c is not None:
        return Target(db, coll, c) if timeseries.is_viewless(c) else None
    if not timeseries.is_timeseries_view(store.view(db, coll)):
        return None
    buckets = store.get(db, timeseries.buckets_name(coll))
    if buckets is None or "timeseries" not in buckets.options:
        return None
    return Target(db, coll, buckets)


# (bucket _id key, the measurement's index in the bucket, the measurement)
Match = tuple[bytes, str, dict[str, Any]]


def _matches(store: Store, t: Target, q: Mapping[str, Any], collation: query.Collation | None,
             first_only: bool) -> list[Match]:
    options = t.options
    spec = {"timeField": options["timeField"], "metaField": options.get("metaField")}
    match = query.matcher(q, collation)
    found: list[Match] = []
    docs = store.documents(t.buckets)
    for key in sorted(docs):  # clustered: buckets in _id order, as the collection scan reads
        bucket = docs[key]
        times = (bucket.get("data") or {}).get(options["timeField"])
        if not isinstance(times, Mapping):
            continue
        for index, measurement in zip(times, timeseries.unpack(bucket, spec), strict=False):
            if match(measurement):
                found.append((key, str(index), measurement))
                if first_only:
                    return found
    return found


def _remove(store: Store, t: Target, removed: Mapping[bytes, set[str]],
            session: OpSession | None, stmt_id: int | None) -> None:
    """Each bucket without the measurements at the given indices: deleted when none is left,
    else replaced by the repacked rest."""
    options = t.options
    spec = {"timeField": options["timeField"], "metaField": options.get("metaField")}
    meta_field = options.get("metaField")
    docs = store.documents(t.buckets)
    for key, indices in removed.items():
        pre = docs.get(key)
        if pre is None:
            continue
        times = pre["data"][options["timeField"]]
        kept = [m for index, m in zip(times, timeseries.unpack(pre, spec), strict=False)
                if str(index) not in indices]
        if not kept:
            store.delete_document(t.buckets, pre, session, stmt_id)
            continue
        post = timeseries.new_bucket(kept[0], options)
        post["_id"] = pre["_id"]
        for i, m in enumerate(kept[1:], start=1):
            post, _ = timeseries.add_measurement(post, m, options, i)
        if meta_field is not None and "meta" in pre:
            post["meta"] = pre["meta"]  # the series' own value, as stored
        post = {"_id": post.pop("_id"), **post}
        store.update_document(t.buckets, pre, post, kind="replacement", update=post,
                              session=session, stmt_id=stmt_id)


def delete(store: Store, t: Target, q: Mapping[str, Any], collation: query.Collation | None,
           multi: bool, session: OpSession | None, stmt_id: int | None) -> int:
    """The number of measurements one delete statement removes."""
    found = _matches(store, t, q, collation, first_only=not multi)
    removed: dict[bytes, set[str]] = {}
    for key, index, _ in found:
        removed.setdefault(key, set()).add(index)
    _remove(store, t, removed, session, stmt_id)
    return len(found)


def update(
    store: Store, t: Target, q: Mapping[str, Any], collation: query.Collation | None,
    multi: bool, apply: Callable[[dict[str, Any]], dict[str, Any]],
    session: OpSession | None, stmt_id: int | None,
) -> tuple[int, int]:
    """(n, nModified) of one update statement: each changed measurement out of its bucket
    and in again, as updated, through the bucket catalog."""
    found = _matches(store, t, q, collation, first_only=not multi)
    removed: dict[bytes, set[str]] = {}
    updated: list[dict[str, Any]] = []
    for key, index, measurement in found:
        post = apply(measurement)
        if post == measurement:
            continue  # matched, not modified: its bucket stays as it is
        timeseries.measurement_time(post, t.options["timeField"])  # 2 BadValue before writing
        removed.setdefault(key, set()).add(index)
        updated.append(post)
    _remove(store, t, removed, session, stmt_id)
    view = store.ensure_collection(t.db, t.coll)  # inserts there go into the buckets
    for post in updated:
        store.insert_document(view, post, session, stmt_id)
    return len(found), len(updated)


def upsert(store: Store, t: Target, doc: dict[str, Any], session: OpSession | None,
           stmt_id: int | None) -> None:
    """An upsert's document, inserted as a measurement."""
    timeseries.measurement_time(doc, t.options["timeField"])
    store.insert_document(store.ensure_collection(t.db, t.coll), doc, session, stmt_id)




def first(store: Store, t: Target, q: Mapping[str, Any], collation: query.Collation | None,
          sort: list[tuple[str, int]] | None) -> Match | None:
    """The measurement a findAndModify takes: the first match in bucket order, or the first
    by `sort`."""
    if not sort:
        found = _matches(store, t, q, collation, first_only=True)
        return found[0] if found else None
    every = _matches(store, t, q, collation, first_only=False)
    out: list[Any] = []
    query.run_sync(query.find([m for _, _, m in every], None, sort, 0, 1, out,
                              collation=collation))
    for match in every:  # the sort's pick is one of these measurements itself
        if out and match[2] is out[0]:
            return match
    return None


def remove_one(store: Store, t: Target, match: Match) -> None:
    _remove(store, t, {match[0]: {match[1]}}, None, None)


def replace_one(store: Store, t: Target, match: Match, post: dict[str, Any]) -> bool:
    """`match`'s measurement out of its bucket and `post` in, through the bucket catalog;
    False (nothing written) when the update changed nothing."""
    if post == match[2]:
        return False
    timeseries.measurement_time(post, t.options["timeField"])
    _remove(store, t, {match[0]: {match[1]}}, None, None)
    store.insert_document(store.ensure_collection(t.db, t.coll), post)
    return True
