"""The materialized copy: SQLite in `<retain_dir>/materialized.sqlite3` (WAL, next to the
retained log, whose directory lock covers it).

* `collections`: one row per collection UUID ever materialized (a rename keeps the row, a drop
  stamps `dropped`); `names`: the names each had, from when to when (snapshot reads at T
  resolve `db.coll` to the collection that had that name at T).
* `versions`: one row per document version, `(coll, key, ts, ord)` with `key` the `_id`'s
  equality key, `ts` the entry that made it (`ord` orders the writes of one entry), `doc` its
  BSON (NULL: deleted), `pre` the `config.system.preimages` `_id` mongod would give the write's
  pre-image (`retained.pre_image_key`: the version before this one is that pre-image).
  The clone writes each document's first version at the clone's start time with `ord` -1.
  `rec` is the document's record id as mongod would have it: numbered in the order the
  documents came into the collection (the clone's in the order the upstream's `find` gave
  them, then each insert of a document that was not there), kept by its updates; a snapshot
  read returns documents in its order, mongod's natural order.
* `collections.collation`: the collection's default collation (BSON; NULL: simple), from
  `listCollections` for a cloned collection, from its `create` entry otherwise.
* `meta`: the sync state (`state` empty | cloning | ready, the clone's start `t0`, the
  consistent point `consistent`, the last applied entry `applied`, where reading resumes
  `resume`, the patterns it was made for).

A batch of applied entries is one SQLite transaction together with `applied`/`resume`, so a
restart (also after SIGKILL) continues exactly after the last applied entry.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.embedded.persist import int_ts, open_database, ts_int

log = logging.getLogger(__name__)

FILE_NAME = "materialized.sqlite3"
SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id INTEGER PRIMARY KEY, uuid BLOB UNIQUE NOT NULL, db TEXT NOT NULL, name TEXT NOT NULL,
    created INTEGER NOT NULL, dropped INTEGER, collation BLOB);
CREATE TABLE IF NOT EXISTS names (
    coll INTEGER NOT NULL, db TEXT NOT NULL, name TEXT NOT NULL, since INTEGER NOT NULL,
    until INTEGER);
CREATE INDEX IF NOT EXISTS names_ns ON names (db, name);
CREATE TABLE IF NOT EXISTS versions (
    coll INTEGER NOT NULL, key BLOB NOT NULL, ts INTEGER NOT NULL, ord INTEGER NOT NULL,
    doc BLOB, pre BLOB, rec INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (coll, key, ts, ord))
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS versions_pre ON versions (pre) WHERE pre IS NOT NULL;
CREATE INDEX IF NOT EXISTS versions_ts ON versions (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
"""

# Sentinel meaning "the version before this write is unknown" (the write was applied before the
# consistent point, or pruned).
UNKNOWN = object()
# `rec` of a deletion made by a chunk migration (the donor's range deletion, the recipient's
# cleanup of an aborted one): the document left this shard, it was not deleted.
MIGRATED_AWAY = -1


class CopyStore:
    def __init__(self, data_dir: str, *, synchronous: str = "normal") -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, FILE_NAME)
        self.db, _ = open_database(data_dir, FILE_NAME, SCHEMA, synchronous, lock=False)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(versions)")}
        if "rec" not in columns:
            # A copy from before record ids: a copy can always be made again, so it is
            # (the state left empty: the next run syncs it).
            log.warning("materialize: %s has an older layout: it is synced again", self.path)
            for table in ("collections", "names", "versions", "meta"):
                self.db.execute(f"DROP TABLE IF EXISTS {table}")
            self.db.executescript(SCHEMA)
        self._by_uuid: dict[bytes, int] = {}
        self._load_catalog()
        row = self.db.execute("SELECT max(rec) FROM versions").fetchone()
        self._next_rec = int(row[0] or 0) + 1

    def close(self) -> None:
        self.db.close()

    def _load_catalog(self) -> None:
        self._by_uuid = {
            bytes(uuid): int(cid) for cid, uuid in self.db.execute(
                "SELECT id, uuid FROM collections")
        }

    # -- meta -----------------------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def meta_ts(self, key: str) -> Timestamp | None:
        value = self.meta(key)
        return None if value is None else int_ts(int(value))

    def set_meta(self, key: str, value: Any) -> None:
        if isinstance(value, Timestamp):
            value = ts_int(value)
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def patterns(self) -> list[str] | None:
        value = self.meta("patterns")
        return None if value is None else list(json.loads(value))

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def wipe(self, patterns: Sequence[str]) -> None:
        """Empty the copy for a new initial sync (one transaction)."""
        self.begin()
        for table in ("collections", "names", "versions", "meta"):
            self.db.execute(f"DELETE FROM {table}")
        self.set_meta("state", "empty")
        self.set_meta("patterns", json.dumps(list(patterns)))
        self.commit()
        self._by_uuid.clear()
        self._next_rec = 1

    # -- catalog --------------------------------------------------------------------------------

    def coll_id(self, uuid: bytes | None) -> int | None:
        return None if uuid is None else self._by_uuid.get(bytes(uuid))

    def uuids(self) -> set[bytes]:
        return set(self._by_uuid)

    def alive(self, uuid: bytes) -> bool:
        cid = self.coll_id(uuid)
        if cid is None:
            return False
        row = self.db.execute("SELECT dropped FROM collections WHERE id = ?", (cid,)).fetchone()
        return row is not None and row[0] is None

    def create(self, uuid: bytes, db: str, name: str, ts: Timestamp,
               collation: bytes | None = None) -> int:
        cur = self.db.execute(
            "INSERT INTO collections (uuid, db, name, created, collation) VALUES (?, ?, ?, ?, ?)",
            (bytes(uuid), db, name, ts_int(ts), collation))
        cid = int(cur.lastrowid or 0)
        self.db.execute("INSERT INTO names (coll, db, name, since) VALUES (?, ?, ?, ?)",
                        (cid, db, name, ts_int(ts)))
        self._by_uuid[bytes(uuid)] = cid
        return cid

    def drop(self, uuid: bytes, ts: Timestamp) -> None:
        cid = self.coll_id(uuid)
        if cid is None:
            return
        self.db.execute("UPDATE collections SET dropped = ? WHERE id = ? AND dropped IS NULL",
                        (ts_int(ts), cid))
        self.db.execute("UPDATE names SET until = ? WHERE coll = ? AND until IS NULL",
                        (ts_int(ts), cid))

    def rename(self, uuid: bytes, db: str, name: str, ts: Timestamp) -> None:
        cid = self.coll_id(uuid)
        if cid is None:
            return
        self.db.execute("UPDATE names SET until = ? WHERE coll = ? AND until IS NULL",
                        (ts_int(ts), cid))
        self.db.execute("UPDATE collections SET db = ?, name = ? WHERE id = ?", (db, name, cid))
        self.db.execute("INSERT INTO names (coll, db, name, since) VALUES (?, ?, ?, ?)",
                        (cid, db, name, ts_int(ts)))

    def alive_in(self, db: str) -> list[bytes]:
        return [bytes(u) for (u,) in self.db.execute(
            "SELECT uuid FROM collections WHERE db = ? AND dropped IS NULL", (db,))]

    def uuid_named(self, db: str, name: str) -> bytes | None:
        """The alive collection now named db.name."""
        row = self.db.execute(
            "SELECT uuid FROM collections WHERE db = ? AND name = ? AND dropped IS NULL",
            (db, name)).fetchone()
        return None if row is None else bytes(row[0])

    def collection_at(self, db: str, name: str, ts: Timestamp) -> int | None:
        """The collection named db.name at `ts` (None: none was)."""
        t = ts_int(ts)
        row = self.db.execute(
            "SELECT coll FROM names WHERE db = ? AND name = ? AND since <= ? "
            "AND (until IS NULL OR until > ?) ORDER BY since DESC LIMIT 1",
            (db, name, t, t)).fetchone()
        return None if row is None else int(row[0])

    def collation(self, cid: int) -> bytes | None:
        """The collection's default collation (BSON), None for the simple one."""
        row = self.db.execute("SELECT collation FROM collections WHERE id = ?", (cid,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def names_at(self, db: str, ts: Timestamp) -> list[str]:
        t = ts_int(ts)
        return sorted(n for (n,) in self.db.execute(
            "SELECT name FROM names WHERE db = ? AND since <= ? AND (until IS NULL OR until > ?)",
            (db, t, t)))

    # -- versions -------------------------------------------------------------------------------

    def current(self, cid: int, key: bytes) -> bytes | None:
        row = self.db.execute(
            "SELECT doc FROM versions WHERE coll = ? AND key = ? ORDER BY ts DESC, ord DESC "
            "LIMIT 1", (cid, key)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def current_record(self, cid: int, key: bytes) -> tuple[bytes | None, int | None]:
        """The document now (None: none) and its record id (None: it has no live record)."""
        row = self.db.execute(
            "SELECT doc, rec FROM versions WHERE coll = ? AND key = ? ORDER BY ts DESC, ord DESC "
            "LIMIT 1", (cid, key)).fetchone()
        if row is None or row[0] is None:
            return None, None
        return bytes(row[0]), int(row[1])

    def new_record(self) -> int:
        """A record id for a document coming into a collection (after every earlier one)."""
        rec = self._next_rec
        self._next_rec += 1
        return rec

    def put_versions(
        self,
        rows: Iterable[tuple[int, bytes, Timestamp, int, bytes | None, bytes | None, int]],
    ) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO versions (coll, key, ts, ord, doc, pre, rec) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((c, k, ts_int(ts), o, d, p, r) for c, k, ts, o, d, p, r in rows))

    def before_write(self, pre_key: bytes, not_before: Timestamp) -> Any:
        """The document as it was just before the write whose pre-image key is `pre_key`: its
        BSON, None (there was none: an insert-then-... cannot have one, a deleted one), or
        UNKNOWN when the copy cannot say (no such write, or it is older than `not_before`,
        the consistent point)."""
        row = self.db.execute(
            "SELECT coll, key, ts, ord FROM versions WHERE pre = ?", (pre_key,)).fetchone()
        if row is None:
            return UNKNOWN
        cid, key, ts, ord_ = row
        if ts <= ts_int(not_before):
            return UNKNOWN
        prev = self.db.execute(
            "SELECT doc FROM versions WHERE coll = ? AND key = ? AND (ts < ? OR (ts = ? AND "
            "ord < ?)) ORDER BY ts DESC, ord DESC LIMIT 1", (cid, key, ts, ts, ord_)).fetchone()
        if prev is None:
            return UNKNOWN  # pruned: no version before it is kept
        return None if prev[0] is None else bytes(prev[0])

    def documents_at(self, cid: int, ts: Timestamp) -> Iterator[bytes]:
        """Every document of the collection as of `ts`, in `_id` order (its equality key)."""
        last_key: bytes | None = None
        last_doc: bytes | None = None
        for key, doc in self.db.execute(
            "SELECT key, doc FROM versions WHERE coll = ? AND ts <= ? ORDER BY key, ts, ord",
            (cid, ts_int(ts))):
            key = bytes(key)
            if key != last_key:
                if last_doc is not None:
                    yield last_doc
                last_key = key
            last_doc = None if doc is None else bytes(doc)
        if last_doc is not None:
            yield last_doc

    def newest_at(self, cid: int, ts: Timestamp) -> list[tuple[bytes, int, int, int, bytes | None]]:
        """Each document's newest version at `ts`, deletions included: `(key, ts, ord, rec,
        doc or None)` in key order (a sharded sidecar's copies are merged from these)."""
        found: list[tuple[bytes, int, int, int, bytes | None]] = []
        last: tuple[bytes, int, int, int, bytes | None] | None = None
        for key, vts, ord_, rec, doc in self.db.execute(
            "SELECT key, ts, ord, rec, doc FROM versions WHERE coll = ? AND ts <= ? "
            "ORDER BY key, ts, ord", (cid, ts_int(ts))):
            key = bytes(key)
            if last is not None and key != last[0]:
                found.append(last)
            last = (key, int(vts), int(ord_), int(rec), None if doc is None else bytes(doc))
        if last is not None:
            found.append(last)
        return found

    def records_at(self, cid: int, ts: Timestamp) -> list[bytes]:
        """Every document of the collection as of `ts` in record order (mongod's natural
        order: `rec`), where `documents_at` gives `_id` order."""
        live = [(rec, doc) for _, _, _, rec, doc in self.newest_at(cid, ts) if doc is not None]
        live.sort(key=lambda item: item[0])
        return [doc for _, doc in live]

    def prune(self, before: Timestamp, limit: int = 5_000) -> int:
        """Drop versions no read at or after `before` can need: each document's versions
        older than its newest one at or before `before`, and that one too when it is a
        deletion with nothing after it. Only documents written since the last prune are
        looked at (`pruned` in meta; the versions index by ts), at most `limit` of them per
        call (the rest at the next). Returns how many rows went."""
        t = ts_int(before)
        since = int(self.meta("pruned") or 0)
        if t <= since:
            return 0
        # Clone versions (ord -1) are never looked at: one goes only when a write made a newer
        # one, and that write is in the range.
        rows = self.db.execute(
            "SELECT coll, key, ts FROM versions WHERE ts >= ? AND ts <= ? AND ord >= 0 "
            "ORDER BY ts LIMIT ?", (since, t, limit)).fetchall()
        upto = t
        if len(rows) >= limit:
            upto = rows[-1][2]  # the rest from there at the next call
            if upto == since:  # one entry wrote more than `limit` documents: all of it now
                rows = self.db.execute(
                    "SELECT coll, key, ts FROM versions WHERE ts = ? AND ord >= 0",
                    (since,)).fetchall()
                upto = since + 1
        done = list(dict.fromkeys((cid, bytes(key)) for cid, key, _ in rows))
        removed = 0
        for cid, key in done:
            newest = self.db.execute(
                "SELECT ts, ord, doc IS NULL FROM versions WHERE coll = ? AND key = ? AND ts <= ? "
                "ORDER BY ts DESC, ord DESC LIMIT 1", (cid, key, t)).fetchone()
            if newest is None:
                continue
            ts, ord_, deleted = newest
            removed += self.db.execute(
                "DELETE FROM versions WHERE coll = ? AND key = ? AND (ts < ? OR (ts = ? AND "
                "ord < ?))", (cid, key, ts, ts, ord_)).rowcount
            if deleted and ts < t:
                later = self.db.execute(
                    "SELECT 1 FROM versions WHERE coll = ? AND key = ? AND ts > ? LIMIT 1",
                    (cid, key, ts)).fetchone()
                if later is None:
                    removed += self.db.execute(
                        "DELETE FROM versions WHERE coll = ? AND key = ? AND ts = ? AND ord = ?",
                        (cid, key, ts, ord_)).rowcount
        self.set_meta("pruned", upto)
        return removed

    def stats(self) -> dict[str, int]:
        versions, size = self.db.execute(
            "SELECT count(*), coalesce(sum(length(doc)), 0) FROM versions").fetchone()
        return {"collections": len(self._by_uuid), "versions": int(versions),
                "versionBytes": int(size)}
