"""After a failed commit: the working set put back to what SQLite holds.

The SQLite commit is the point of truth. A command's writes reach the working set, the
unique indexes, the pre-image and retry-image maps and the sessions as they run, and its oplog
entries wait in `_pending` until the batch commits (`oplog_writer.py`). When SQLite refuses the
batch (a full disk, a read-only file), its transaction is rolled back and each thing the
batch changed, by key (`persist.Journal`), is read back from SQLite: a failed write is then
invisible to reads, absent from the oplog and from every change stream, and a retry of it runs
again, as on mongod, where a write whose storage transaction fails leaves nothing. The work is
proportional to what the failed batch touched (a whole collection only when it was dropped or
created by the batch).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from cdcserver.embedded.persist import _DECODE, CommitFailed, int_ts
from cdcserver.embedded.store_types import Collection
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.embedded.persist import Journal, Persistence
    from cdcserver.embedded.state import StoreState

OUT_OF_DISK_SPACE = 14031
UNKNOWN_ERROR = 8  # what mongod's wtRCToStatus answers for a storage error it has no code for


def commit_error(failure: CommitFailed, path: str) -> MongoError:
    """The command's error: OutOfDiskSpace as mongod raises it for a write the device had no
    room for (`<what failed>: <file>`), else UnknownError with SQLite's message."""
    if failure.disk_full:
        return MongoError(OUT_OF_DISK_SPACE, f"No space left on device: {path}")
    return MongoError(UNKNOWN_ERROR, f"{failure.error}: {path}")


def restore_committed(store: StoreState, journal: Journal) -> None:
    """Put back, from SQLite, everything `journal` says the rolled-back batch changed."""
    persist = store.persist
    assert persist is not None
    reloaded = _restore_catalog(store, persist, journal)
    by_uuid = {c.uuid: c for c in store.catalog.values()}
    reorder: set[bytes] = set()
    for uuid in journal.emptied - reloaded:
        c = by_uuid.get(uuid)
        if c is not None:
            _reload_documents(store, persist, c)
            reloaded.add(uuid)
    for uuid, key in journal.documents:
        c = by_uuid.get(uuid)
        if c is None or uuid in reloaded:
            continue
        raw = persist.document(uuid, key)
        committed = None if raw is None else bson_bytes.decode(raw, _DECODE)
        current = c.records.get(key)
        c.secondary.clear()  # tables rebuilt when read (index_table.py)
        store._apply_edits(store._index_edits(c, current, committed), key)
        if committed is None:
            c.records.pop(key, None)
        else:
            if current is None:
                reorder.add(uuid)  # a delete undone: its row, not the end, is its place
            c.records[key] = committed
        c.capped_sizes.pop(key, None)
    for uuid in reorder:
        c = by_uuid[uuid]
        order = persist.document_keys(uuid)
        c.records = OrderedDict((k, c.records[k]) for k in order if k in c.records)
    _restore_images(store, persist, journal)


def _restore_catalog(store: StoreState, persist: Persistence, journal: Journal) -> set[bytes]:
    """Each namespace the batch created, dropped, renamed or changed, as SQLite has it; the
    uuids of collections whose documents were reloaded whole."""
    reloaded: set[bytes] = set()
    for db, name in journal.namespaces:
        row = persist.collection(db, name)
        current = store.catalog.get((db, name))
        if row is None:
            if current is not None:
                del store.catalog[(db, name)]
            continue
        uuid, meta_raw = row
        meta = bson_bytes.decode(meta_raw, _DECODE)
        if current is not None and current.uuid == uuid:
            current.options, current.indexes = meta["options"], meta["indexes"]
            store._rebuild_unique(current)
            continue
        c = Collection(db, name, uuid, meta["options"], meta["indexes"])
        store.catalog[(db, name)] = c
        _reload_documents(store, persist, c)
        reloaded.add(uuid)
    return reloaded


def _reload_documents(store: StoreState, persist: Persistence, c: Collection) -> None:
    c.records = OrderedDict(
        (bytes(k), bson_bytes.decode(raw, _DECODE)) for k, raw in persist.documents(c.uuid)
    )
    c.capped_sizes.clear()
    store._rebuild_unique(c)


def _restore_images(store: StoreState, persist: Persistence, journal: Journal) -> None:
    for key in journal.pre_images:
        row = persist.pre_image(key)
        if row is None:
            store.images._pre_images.pop(key, None)
            store._pre_image_ts.pop(key, None)
            store._pre_image_meta.pop(key, None)
            continue
        ts_value, raw = row
        doc: dict[str, Any] = bson_bytes.decode(raw, _DECODE)
        store.images._pre_images[key] = doc["preImage"]
        store._pre_image_ts[key] = int_ts(ts_value)
        store._pre_image_meta[key] = (doc["_id"], doc["operationTime"])
    for key in journal.retry_images:
        image = persist.retry_image(key)
        if image is None:
            store.retry_images.pop(key, None)
        else:
            store.retry_images[key] = bson_bytes.decode(image, _DECODE)
