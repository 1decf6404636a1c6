"""A materialized snapshot at T, exported in mongodump's layout, with the oplog after it: what a
Spark job (or `mongorestore --oplogReplay`) starts from — the collections as they were at T, then
every change after T, none twice.

`export_snapshot(retain_dir, out_dir, at)` writes, from a sidecar's data directory (beside the
running sidecar: SQLite's WAL gives the reader a consistent view):

* `<out>/<db>/<coll>.bson`: the documents of each materialized collection that existed at T
  (concatenated BSON, in `_id` order), and `<coll>.metadata.json` (its UUID and the `_id` index:
  the copy does not keep the others);
* `<out>/oplog.bson`: the retained entries after T (as `archive export` writes them).

T defaults to the copy's last applied entry; it must be within the copy's range (its
consistent point, or the retained log's oldest entry if later, up to the last applied one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.embedded.persist import DataDirError
from cdcserver.materialize.store import FILE_NAME, CopyStore
from cdcserver.sources.mongo_common import next_ts
from cdcserver.sources.retained import open_read_only, run_archive_export


def _write(path: str, chunks: Iterable[bytes]) -> int:
    n = 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for raw in chunks:
            f.write(raw)
            n += 1
    os.replace(tmp, path)
    return n


def export_snapshot(
    retain_dir: str, out_dir: str, at: Timestamp | None = None
) -> tuple[Timestamp, dict[str, int], int]:
    """Write the snapshot at `at` and the oplog after it. Returns (T, documents per
    namespace, oplog entries written)."""
    if not os.path.exists(os.path.join(retain_dir, FILE_NAME)):
        raise DataDirError(f"no materialized copy in {retain_dir} (upstream.materialize)")
    store = CopyStore(retain_dir)
    retained = open_read_only(retain_dir)
    try:
        consistent, applied = store.meta_ts("consistent"), store.meta_ts("applied")
        if store.meta("state") != "ready" or consistent is None or applied is None:
            raise DataDirError(f"the copy in {retain_dir} is not ready (initial sync)")
        low = max(consistent, retained.oldest_ts() or consistent)
        at = applied if at is None else at
        if not low <= at <= applied:
            raise DataDirError(f"{at} is outside the copy's range {low} .. {applied}")
        counts: dict[str, int] = {}
        rows = store.db.execute("SELECT id, uuid FROM collections ORDER BY id").fetchall()
        for cid, uuid in rows:
            row = store.db.execute(
                "SELECT db, name FROM names WHERE coll = ? AND since <= ? AND "
                "(until IS NULL OR until > ?)", (cid, _int(at), _int(at))).fetchone()
            if row is None:
                continue  # not there at T (created later, or dropped or renamed away)
            db, name = row
            os.makedirs(os.path.join(out_dir, db), exist_ok=True)
            base = os.path.join(out_dir, db, name)
            counts[f"{db}.{name}"] = _write(base + ".bson", store.documents_at(int(cid), at))
            with open(base + ".metadata.json", "w") as f:
                json.dump({"options": {}, "indexes": [{"v": 2, "key": {"_id": 1},
                                                       "name": "_id_"}],
                           "uuid": bytes(uuid).hex(), "collectionName": name,
                           "type": "collection"}, f)
        os.makedirs(out_dir, exist_ok=True)
        entries = _write(os.path.join(out_dir, "oplog.bson"),
                         (raw for _, raw in retained.raw_from(next_ts(at))))
        return at, counts, entries
    finally:
        retained.close()
        store.close()


def _int(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def cmd_snapshot_export(args: Any) -> int:
    """`cdcserver archive export --snapshot [TIME] --out DIR`: export_snapshot, one line."""

    def export(retain_dir: str, at: Timestamp | None) -> str:
        t, counts, n = export_snapshot(retain_dir, args.out, at)
        return (f"{args.out}: the copy at {t}: {sum(counts.values())} documents in "
                f"{len(counts)} collections, then {n} oplog entries after it")

    return run_archive_export(args, "--snapshot", export)
