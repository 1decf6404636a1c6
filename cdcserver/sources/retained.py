"""The sidecar's durable log of what it tailed (`--upstream` with a data directory).

Every majority-committed entry the tail delivers is first written here (SQLite, WAL, in
`<data dir>/upstream-oplog.sqlite3`), so history outlives the upstream's capped oplog: a
stream whose token the upstream has dropped resumes from this log, and a restarted sidecar
continues from its last retained entry instead of re-reading the upstream.

The log holds one contiguous run of the upstream's oplog, `covered_from .. last`: every
upstream entry in that range is here (an entry is appended only after all those before it).
Retention (`retain_mb`, `retain_hours`) drops the oldest entries first; when the tail finds
that the upstream lost entries the log never got (its oplog rolled over while the sidecar was
cut off), the log is emptied, since no reader could cross that gap without loss.

Pre-images the upstream had for retained update/delete entries (`config.system.preimages`) are
kept too, keyed as mongod keys them (`nsUUID`, `ts`, `applyOpsIndex`), and dropped with their
entry.

A write that fails (disk full, read-only directory) raises `RetainedWriteError`: the tail then
delivers nothing further (entries are never served past what is retained) and retries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.embedded.persist import DataDirError, int_ts, open_database, ts_int
from pipeline_stages.oplog_entry import Entry, decode_entry

log = logging.getLogger(__name__)

FILE_NAME = "upstream-oplog.sqlite3"
SCHEMA = """
CREATE TABLE IF NOT EXISTS oplog (ts INTEGER PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS preimages (key BLOB PRIMARY KEY, ts INTEGER NOT NULL, doc BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS preimages_ts ON preimages (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# Trim a little below the size limit (a tenth, at most 16 MiB), so trimming is amortised over
# many appends; at most TRIM_MAX_ROWS per call, so one trim never holds the event loop long
# (the rest goes at the next append or housekeeping pass).
TRIM_SLACK = 0.9
TRIM_SLACK_MAX_BYTES = 16 * 1024 * 1024
TRIM_MAX_ROWS = 20_000
# An append commits a chunk at a time: bounded transactions, so a disk with room for part of a
# backlog retains that part (and a refusal costs one chunk's work, not the backlog's).
APPEND_CHUNK_ROWS = 256
APPEND_CHUNK_BYTES = 256 * 1024


class RetainedWriteError(Exception):
    """The retained log could not be written (the tail stops delivering until it can)."""


def write_error_cause(exc: sqlite3.Error) -> str:
    """What a refused write means, for the one log line an operator reads: disk full,
    read-only, corrupt, or SQLite's own name for it."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    text = str(exc).lower()
    if name == "SQLITE_FULL" or "disk is full" in text:
        return "disk full"
    if name.startswith("SQLITE_READONLY") or "readonly" in text or "read-only" in text:
        return "read-only"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text:
        return "corrupt"
    if name.startswith("SQLITE_IOERR") or "disk i/o error" in text:
        return "I/O error"
    return name or type(exc).__name__


def pre_image_key(ns_uuid: bytes, ts: Timestamp, apply_ops_index: int) -> bytes:
    return bytes(ns_uuid) + ts_int(ts).to_bytes(8, "big") + int(apply_ops_index).to_bytes(4, "big")


def pre_image_ids(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """The `config.system.preimages` `_id`s update/delete entries may have (applyOps inner
    operations by their index), for fetching while the upstream still has them."""
    ids = []
    for entry in entries:
        op = entry.get("op")
        if op in ("u", "d") and "ui" in entry:
            ids.append({"nsUUID": entry["ui"], "ts": entry["ts"], "applyOpsIndex": 0})
        elif op == "c":
            ops = entry.get("o", {}).get("applyOps") if hasattr(entry.get("o"), "get") else None
            if isinstance(ops, list):
                for index, inner in enumerate(ops):
                    if inner.get("op") in ("u", "d") and "ui" in inner:
                        ids.append(
                            {"nsUUID": inner["ui"], "ts": entry["ts"], "applyOpsIndex": index}
                        )
    return ids


def _uuid_bytes(value: Any) -> bytes:
    return bytes(value.bytes if hasattr(value, "bytes") else value)


def _unusable(path: str, exc: sqlite3.OperationalError) -> DataDirError:
    return DataDirError(
        f"cannot use the retained log {path}: {exc} (is its directory writable, with free "
        "space?)"
    )


class RetainedLog:
    """The durable log (one per data directory, locked like the embedded store's)."""

    def __init__(
        self,
        data_dir: str,
        retain_mb: float = 1024,
        retain_hours: float = 168.0,
        *,
        synchronous: str = "normal",
        clock: Callable[[], float] = time.time,
        lock: bool = True,
    ) -> None:
        self.retain_bytes = int(retain_mb * 1024 * 1024)
        self.retain_hours = retain_hours
        self.clock = clock
        try:
            os.makedirs(data_dir, exist_ok=True)
        except OSError as exc:
            raise DataDirError(
                f"cannot create the data directory {data_dir}: {exc.strerror or exc}"
            ) from None
        if not os.access(data_dir, os.W_OK | os.X_OK):
            raise DataDirError(f"the data directory {data_dir} is not writable")
        self.path = os.path.join(data_dir, FILE_NAME)
        self.db, self._lock = open_database(
            data_dir, FILE_NAME, SCHEMA, synchronous, lock=lock, load=self._load,
            unusable=_unusable,
        )
        self.write_errors = 0  # refused writes (a metric)
        self.failing: str | None = None  # the cause and last error, while writes fail
        self._failing_since_errors = 0  # write_errors when the failing began (its log line)
        self._append_failed = False  # the last append was refused (its backlog waits)
        self.dropped_entries = 0  # dropped by retention
        self.rolled_back = 0  # dropped because the upstream no longer had them

    def _load(self, db: sqlite3.Connection) -> None:
        """Read the log's extent, checking that every entry decodes (a corrupt log is named at
        start, not met by a stream later)."""
        self.db = db
        count, size = self.db.execute("SELECT count(*), coalesce(sum(length(entry)), 0) "
                                      "FROM oplog").fetchone()
        self.count, self.bytes = int(count), int(size)
        self._first: Timestamp | None = None
        self._last: tuple[Timestamp, bytes] | None = None
        self._oldest_entry: Entry | None = None
        for ts, raw in self.db.execute("SELECT ts, entry FROM oplog ORDER BY ts LIMIT 1"):
            self._first = int_ts(ts)
            self._oldest_entry = self._decode(ts, raw)
        for ts, raw in self.db.execute("SELECT ts, entry FROM oplog ORDER BY ts DESC LIMIT 1"):
            self._decode(ts, raw)
            self._last = (int_ts(ts), bytes(raw))
        row = self.db.execute("SELECT value FROM meta WHERE key = 'covered_from'").fetchone()
        self.covered_from: Timestamp | None = None
        if self._first is not None:
            self.covered_from = int_ts(row[0]) if row is not None else self._first

    def _decode(self, ts: int, raw: bytes) -> Entry:
        try:
            entry = decode_entry(bytes(raw))
        except Exception as exc:  # noqa: BLE001 - any undecodable row
            raise sqlite3.DatabaseError(
                f"undecodable oplog entry at ts {int_ts(ts)}: {exc}"
            ) from None
        if entry.get("ts") != int_ts(ts):
            raise sqlite3.DatabaseError(f"the entry stored at ts {int_ts(ts)} has another ts")
        return entry

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def close(self) -> None:
        try:
            self.db.close()
        finally:
            self._unlock()

    # -- extent ---------------------------------------------------------------------------------

    def last(self) -> tuple[Timestamp, bytes] | None:
        return self._last

    def last_ts(self) -> Timestamp | None:
        return None if self._last is None else self._last[0]

    def oldest_entry(self) -> Entry | None:
        return self._oldest_entry

    def oldest_ts(self) -> Timestamp | None:
        return self._first

    def covers(self, start: Timestamp) -> bool:
        """Whether every entry with `ts >= start` is here (or will be appended)."""
        return self.covered_from is not None and start >= self.covered_from

    # -- reads ----------------------------------------------------------------------------------

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        rows = self.db.execute(
            "SELECT entry FROM oplog WHERE ts >= ? ORDER BY ts LIMIT ?", (ts_int(start), limit)
        )
        return [decode_entry(bytes(r[0])) for r in rows]

    def raw_from(self, start: Timestamp, batch: int = 1000) -> Iterator[tuple[Timestamp, bytes]]:
        """Every entry with `ts >= start`, as bytes, read a batch at a time (export)."""
        at = ts_int(start)
        while True:
            rows = self.db.execute(
                "SELECT ts, entry FROM oplog WHERE ts >= ? ORDER BY ts LIMIT ?", (at, batch)
            ).fetchall()
            for ts, raw in rows:
                yield int_ts(ts), bytes(raw)
            if len(rows) < batch:
                return
            at = rows[-1][0] + 1

    def entry_at(self, ts: Timestamp) -> Entry | None:
        row = self.db.execute("SELECT entry FROM oplog WHERE ts = ?", (ts_int(ts),)).fetchone()
        return None if row is None else decode_entry(bytes(row[0]))

    def newest(self, before: Timestamp | None, n: int) -> list[tuple[Timestamp, bytes]]:
        """Up to `n` entries older than `before` (all: None), newest first."""
        if before is None:
            rows = self.db.execute(
                "SELECT ts, entry FROM oplog ORDER BY ts DESC LIMIT ?", (n,)
            )
        else:
            rows = self.db.execute(
                "SELECT ts, entry FROM oplog WHERE ts < ? ORDER BY ts DESC LIMIT ?",
                (ts_int(before), n),
            )
        return [(int_ts(ts), bytes(raw)) for ts, raw in rows]

    def pre_images(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        for i in range(0, len(keys), 500):
            chunk = list(keys[i : i + 500])
            marks = ",".join("?" * len(chunk))
            for key, doc in self.db.execute(
                f"SELECT key, doc FROM preimages WHERE key IN ({marks})", chunk
            ):
                found[bytes(key)] = bytes(doc)
        return found

    # -- writes ---------------------------------------------------------------------------------

    def _write(self, what: str, fn: Callable[[], object], *, recovers: bool = True) -> None:
        """Run `fn` in one transaction. A refusal raises RetainedWriteError (logged once, when
        the log starts failing); `recovers`: a success ends the failing state (an append's
        chunks do not: only the whole append does, so partial room logs no flapping)."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                fn()
                self.db.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (SQLITE_FULL at COMMIT): a
                # ROLLBACK then fails and would hide the cause.
                if self.db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self.write_errors += 1
            cause = write_error_cause(exc)
            if self.failing is None:
                log.error(
                    "cannot write the retained log %s: %s (%s, in %s): the upstream tail "
                    "stops delivering and retries until it can (nothing is skipped)",
                    self.path, cause, exc, what, extra={"retainedLog": self.path},
                )
                self._failing_since_errors = self.write_errors
            self.failing = f"{cause}: {exc}"
            raise RetainedWriteError(f"{self.path}: {cause}: {exc}") from None
        if recovers:
            self._recovered()

    def _recovered(self) -> None:
        if self.failing is not None:
            log.warning(
                "the retained log %s is writable again (after %d refused writes): the tail "
                "catches up", self.path, self.write_errors - self._failing_since_errors + 1,
                extra={"retainedLog": self.path},
            )
            self.failing = None

    def append(self, items: Sequence[tuple[Timestamp, bytes]]) -> None:
        """Append entries newer than the last one (ascending), a chunk per transaction (so
        partial free space still lets the log advance), applying retention after each.
        Raises RetainedWriteError when the disk refuses a chunk: the chunks before it are
        retained (`last_ts()` says up to where), nothing after it is."""
        if not items:
            return
        last = self.last_ts()
        rows = [(ts_int(ts), raw) for ts, raw in items if last is None or ts > last]
        start = 0
        while start < len(rows):
            end, size = start, 0
            while end < len(rows) and (end == start or (
                end - start < APPEND_CHUNK_ROWS and size < APPEND_CHUNK_BYTES
            )):
                size += len(rows[end][1])
                end += 1
            self._append_chunk(rows[start:end], size)
            start = end
            # Retention between chunks frees pages for the next one; its refusal is not the
            # append's (it is retried with the next append).
            with contextlib.suppress(RetainedWriteError):
                self.trim(recovers=False)
        self._append_failed = False
        self._recovered()

    def _append_chunk(self, rows: list[tuple[int, bytes]], size: int) -> None:
        def write() -> None:
            self.db.executemany("INSERT INTO oplog (ts, entry) VALUES (?, ?)", rows)
            if self.covered_from is None:
                self.db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('covered_from', ?)",
                    (rows[0][0],),
                )

        try:
            self._write("append", write, recovers=False)
        except RetainedWriteError:
            self._append_failed = True
            raise
        if self.covered_from is None:
            first_new = int_ts(rows[0][0])
            self.covered_from = first_new
            self._first = first_new
            self._oldest_entry = decode_entry(bytes(rows[0][1]))
        self.count += len(rows)
        self.bytes += size
        self._last = (int_ts(rows[-1][0]), bytes(rows[-1][1]))

    def put_pre_images(self, docs: Iterable[tuple[dict[str, Any], bytes]]) -> int:
        """Keep pre-images (`(_id, preImage bytes)`) of entries still retained."""
        cf = self.covered_from
        rows = []
        for id_doc, image in docs:
            ts = id_doc["ts"]
            if cf is None or ts < cf:
                continue
            key = pre_image_key(_uuid_bytes(id_doc["nsUUID"]), ts, id_doc["applyOpsIndex"])
            rows.append((key, ts_int(ts), image))
        if rows:
            # While appends fail, a pre-image that fits is no recovery (the backlog waits).
            self._write("pre-images", lambda: self.db.executemany(
                "INSERT OR REPLACE INTO preimages (key, ts, doc) VALUES (?, ?, ?)", rows
            ), recovers=not self._append_failed)
        return len(rows)

    def trim(self, *, recovers: bool = True) -> int:
        """Drop the oldest entries beyond `retain_mb` or older than `retain_hours` (never the
        newest one: it is where a restart continues). Returns how many were dropped."""
        over_size = self.retain_bytes > 0 and self.bytes > self.retain_bytes
        cutoff = None
        if self.retain_hours > 0:
            cutoff = self.clock() - self.retain_hours * 3600
        over_age = (
            cutoff is not None and self._first is not None and self._first.time < cutoff
        )
        if not (over_size or over_age) or self.count <= 1:
            return 0
        target = self.bytes
        if over_size:
            target = max(int(self.retain_bytes * TRIM_SLACK),
                         self.retain_bytes - TRIM_SLACK_MAX_BYTES)
        drop_n, freed, until = 0, 0, None
        cursor = self.db.execute(
            "SELECT ts, length(entry) FROM oplog ORDER BY ts LIMIT ?",
            (min(self.count - 1, TRIM_MAX_ROWS),),
        )
        for ts, length in cursor:
            young = cutoff is None or int_ts(ts).time >= cutoff
            if self.bytes - freed <= target and young:
                break
            drop_n += 1
            freed += length
            until = ts
        cursor.close()
        if until is None:
            return 0
        new_from = until + 1

        def write() -> None:
            self.db.execute("DELETE FROM oplog WHERE ts <= ?", (until,))
            self.db.execute("DELETE FROM preimages WHERE ts <= ?", (until,))
            self.db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('covered_from', ?)", (new_from,)
            )

        self._write("retention", write, recovers=recovers and not self._append_failed)
        self.count -= drop_n
        self.bytes -= freed
        self.dropped_entries += drop_n
        self.covered_from = int_ts(new_from)
        row = self.db.execute("SELECT ts, entry FROM oplog ORDER BY ts LIMIT 1").fetchone()
        self._first = int_ts(row[0])
        self._oldest_entry = decode_entry(bytes(row[1]))
        return drop_n

    def drop_after(self, ts: Timestamp) -> int:
        """Drop the entries after `ts` (the upstream rolled them back)."""
        at = ts_int(ts)
        n, size = self.db.execute(
            "SELECT count(*), coalesce(sum(length(entry)), 0) FROM oplog WHERE ts > ?", (at,)
        ).fetchone()
        if not n:
            return 0

        def write() -> None:
            self.db.execute("DELETE FROM oplog WHERE ts > ?", (at,))
            self.db.execute("DELETE FROM preimages WHERE ts > ?", (at,))

        self._write("rollback", write)
        self.count -= n
        self.bytes -= size
        self.rolled_back += n
        row = self.db.execute("SELECT ts, entry FROM oplog ORDER BY ts DESC LIMIT 1").fetchone()
        self._last = (int_ts(row[0]), bytes(row[1]))
        return int(n)

    def reset(self) -> int:
        """Empty the log (a gap in the upstream's history: nothing here can be read across
        it). Returns how many entries were dropped."""
        n = self.count

        def write() -> None:
            self.db.execute("DELETE FROM oplog")
            self.db.execute("DELETE FROM preimages")
            self.db.execute("DELETE FROM meta WHERE key = 'covered_from'")

        self._write("reset", write)
        self.count = self.bytes = 0
        self._first = self._last = None
        self._oldest_entry = None
        self.covered_from = None
        return n

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "entries": self.count,
            "bytes": self.bytes,
            "oldest": self._first,
            "newest": self.last_ts(),
            "writeErrors": self.write_errors,
            "failing": self.failing,
            "droppedByRetention": self.dropped_entries,
        }


def open_read_only(data_dir: str) -> RetainedLog:
    """The retained log of `data_dir` for reading beside a running sidecar (no lock taken;
    SQLite's WAL lets a reader see a consistent snapshot)."""
    path = os.path.join(data_dir, FILE_NAME)
    if not os.path.exists(path):
        raise DataDirError(f"no retained log in {data_dir} (expected {path})")
    return RetainedLog(data_dir, 0, 0, lock=False)


def export_oplog(
    data_dir: str, since: Timestamp, out_dir: str, *, file_name: str = "oplog.bson"
) -> tuple[str, int]:
    """Write the retained entries with `ts >= since` to `<out_dir>/oplog.bson` (concatenated
    BSON, as mongodump --oplog writes it). Returns (path, entries written)."""
    retained = open_read_only(data_dir)
    try:
        oldest = retained.oldest_entry()
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, file_name)
        n = 0
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            for _, raw in retained.raw_from(since):
                f.write(raw)
                n += 1
        os.replace(tmp, path)
        if oldest is not None and oldest["ts"] > since:
            log.warning("the retained log starts at %s, after --since %s", oldest["ts"], since)
        return path, n
    finally:
        retained.close()


def parse_since(value: str) -> Timestamp:
    """`--since`: a resume token (`{"_data": "..."}` or its hex), `T:I` (a Timestamp), seconds
    since the epoch, or an ISO-8601 time."""
    import datetime

    from bson import json_util

    from pipeline_stages import resume_token

    text = value.strip()
    if text.startswith("{"):
        doc = json_util.loads(text)
        return resume_token.decode(doc).cluster_time
    if ":" in text and all(p.isdigit() for p in text.split(":", 1)):
        t, i = text.split(":", 1)
        return Timestamp(int(t), int(i))
    if text.isdigit() and len(text) < 12:
        return Timestamp(int(text), 0)
    if all(c in "0123456789abcdefABCDEF" for c in text) and len(text) > 16:
        return resume_token.decode({"_data": text}).cluster_time
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return Timestamp(int(stamp.timestamp()), 0)


# -- `cdcserver archive export` (registered by cli.py) ----------------------------------------


ARCHIVE_EXPORT = "cdcserver archive export"


def archive_retain_dir(args: Any) -> str | None:
    """`--retain-dir`, or the config's upstream.retain_dir; None (and one line on stderr) when
    neither names one."""
    import sys

    if args.retain_dir:
        return str(args.retain_dir)
    from cdcserver.config import ConfigError, load_config

    try:
        retain_dir = load_config(args.config).upstream.retain_dir
    except ConfigError as exc:
        print(f"{ARCHIVE_EXPORT}: {exc}", file=sys.stderr)
        return None
    if not retain_dir:
        print(f"{ARCHIVE_EXPORT}: give --retain-dir, or a config (or "
              "CDCSERVER_UPSTREAM_RETAIN_DIR) with upstream.retain_dir", file=sys.stderr)
        return None
    return retain_dir


def run_archive_export(
    args: Any, flag: str, export: Callable[[str, Timestamp | None], str]
) -> int:
    """An `archive export` action: the retained log's directory and `flag`'s time (None for
    "latest") to `export(retain_dir, time)`, which writes under `--out` and returns the line to
    print; errors as one line (2: the input, 1: writing)."""
    import sys

    retain_dir = archive_retain_dir(args)
    if retain_dir is None:
        return 2
    value = getattr(args, flag.removeprefix("--"))
    try:
        at = None if value == "latest" else parse_since(value)
    except Exception as exc:  # noqa: BLE001 - any unparsable value: one line
        print(f"{ARCHIVE_EXPORT}: {flag} {value!r} is neither a resume token nor a time ({exc})",
              file=sys.stderr)
        return 2
    try:
        line = export(retain_dir, at)
    except DataDirError as exc:
        print(f"{ARCHIVE_EXPORT}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{ARCHIVE_EXPORT}: cannot write --out {args.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    print(line, file=sys.stderr)
    return 0


def cmd_archive_export(args: Any) -> int:
    def export(retain_dir: str, since: Timestamp | None) -> str:
        assert since is not None  # --since has no "latest"
        path, n = export_oplog(retain_dir, since, args.out)
        return f"{path}: {n} entries from {since}"

    return run_archive_export(args, "--since", export)


__all__ = [
    "RetainedLog", "RetainedWriteError", "export_oplog", "open_read_only", "parse_since",
    "pre_image_ids", "pre_image_key", "cmd_archive_export", "archive_retain_dir",
    "run_archive_export",
]
