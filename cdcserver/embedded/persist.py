"""SQLite persistence of the embedded store: catalog, documents, oplog and pre-images.

One database file (`<data dir>/cdcserver.sqlite3`, WAL). Every command's writes go in one
SQLite transaction committed before the reply is sent, so an acknowledged write (and its oplog
entry) survives a crash of the process. The working set lives in memory (mongomock); this file
is read once, at start.

Like mongod's `mongod.lock`, `<data dir>/cdcserver.lock` is locked (an OS lock, which the
kernel releases when the process ends, even by SIGKILL) for as long as a server uses the
directory, and holds its PID: a second server on the same directory is refused at start. The
database file is checked (`PRAGMA quick_check`) before anything is read from it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: no lock
    fcntl = None  # type: ignore[assignment]

from bson.codec_options import CodecOptions
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    db TEXT NOT NULL, coll TEXT NOT NULL, uuid BLOB NOT NULL, meta BLOB NOT NULL,
    PRIMARY KEY (db, coll)
);
CREATE TABLE IF NOT EXISTS documents (
    uuid BLOB NOT NULL, id BLOB NOT NULL, doc BLOB NOT NULL,
    PRIMARY KEY (uuid, id)
);
CREATE TABLE IF NOT EXISTS oplog (ts INTEGER PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS preimages (key BLOB PRIMARY KEY, ts INTEGER NOT NULL, doc BLOB NOT NULL);
-- config.image_collection: a retryable findAndModify's image, one per session ({id, uid})
CREATE TABLE IF NOT EXISTS retry_images (lsid BLOB PRIMARY KEY, doc BLOB NOT NULL);
-- config.transactions: each session's ({id, uid}) txnNumber, last write and committed outcome
CREATE TABLE IF NOT EXISTS transactions (lsid BLOB PRIMARY KEY, doc BLOB NOT NULL);
"""

SYNCHRONOUS = ("off", "normal", "full", "extra")
# The queued document statements (Persistence._queue), compared by identity in runs.
_PUT_DOCUMENT = ("INSERT INTO documents (uuid, id, doc) VALUES (?, ?, ?) "
                 "ON CONFLICT (uuid, id) DO UPDATE SET doc = excluded.doc")
_DELETE_DOCUMENT = "DELETE FROM documents WHERE uuid = ? AND id = ?"
_APPEND_OPLOG = "INSERT INTO oplog (ts, entry) VALUES (?, ?)"
# How stored rows (documents, catalog, sessions) are decoded: naive datetimes, as written.
_DECODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(tz_aware=False)


def ts_int(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def int_ts(value: int) -> Timestamp:
    return Timestamp(value >> 32, value & 0xFFFFFFFF)


class DataDirError(Exception):
    """The data directory cannot be served: held by another server, or corrupt. The message is
    one line for the operator (the CLI prints it as `cdcserver: <message>` and exits)."""


LOCK_FILE = "cdcserver.lock"


def lock_data_dir(data_dir: str) -> IO[str] | None:
    """Lock `<data_dir>/cdcserver.lock` and write this process's PID in it; the open file holds
    the lock until it is closed or the process ends. DataDirError (mongod's DBPathInUse) if
    another process holds it."""
    if fcntl is None:  # pragma: no cover
        return None
    path = os.path.join(data_dir, LOCK_FILE)
    try:
        lock = open(path, "a+")  # noqa: SIM115 - held open: the lock lives as long as the file
    except OSError as exc:
        raise DataDirError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        lock.seek(0)
        pid = lock.read().strip() or "unknown"
        lock.close()
        raise DataDirError(
            f"DBPathInUse: Unable to lock the lock file: {path} ({exc.strerror or exc}). "
            f"Another cdcserver instance (pid {pid}) is already running on the data "
            f"directory, {data_dir}"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def corrupt(path: str, detail: object) -> DataDirError:
    return DataDirError(
        f"the data directory's database {path} is corrupt ({detail}): restore the data "
        "directory from a backup, or move it aside to start with an empty one"
    )


def open_database(
    data_dir: str,
    file_name: str,
    schema: str,
    synchronous: str,
    *,
    lock: bool = True,
    load: Callable[[sqlite3.Connection], None] | None = None,
    unusable: Callable[[str, sqlite3.OperationalError], DataDirError] | None = None,
) -> tuple[sqlite3.Connection, IO[str] | None]:
    """Open `<data_dir>/<file_name>` as every durable file of cdcserver is opened: the data
    directory locked first (`lock_data_dir`), `PRAGMA quick_check` before anything is read (a
    damaged file is refused before the server reads half of it), WAL, `synchronous`, the schema,
    then `load` (reading what must be checked at start). Returns the connection and the held
    lock. A damaged file is `corrupt`; `unusable` names an OperationalError (read-only, disk
    full) when the caller has a better message than "corrupt"."""
    path = os.path.join(data_dir, file_name)
    held = lock_data_dir(data_dir) if lock else None
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            rows = [r[0] for r in db.execute("PRAGMA quick_check")]
            if rows != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(map(str, rows[:3])))
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            db.executescript(schema)
            if load is not None:
                load(db)
        except BaseException:
            db.close()
            raise
    except sqlite3.OperationalError as exc:
        if held is not None:
            held.close()
        raise (unusable(path, exc) if unusable is not None else corrupt(path, exc)) from None
    except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed"...
        if held is not None:
            held.close()
        raise corrupt(path, exc) from None
    except BaseException:
        if held is not None:
            held.close()
        raise
    return db, held


@dataclass
class Journal:
    """What the open SQLite transaction changed, by key: after a failed commit (a full disk,
    a read-only file) the store puts exactly these back as SQLite still has them
    (`rollback.py`), so the working set never holds a write that is not durable."""

    documents: set[tuple[bytes, bytes]] = field(default_factory=set)  # (uuid, key)
    emptied: set[bytes] = field(default_factory=set)  # uuids whose documents were all deleted
    namespaces: set[tuple[str, str]] = field(default_factory=set)  # catalog entries
    pre_images: set[bytes] = field(default_factory=set)
    retry_images: set[bytes] = field(default_factory=set)


class CommitFailed(Exception):
    """SQLite refused the batch (at a write or at COMMIT); its transaction is rolled back.
    `journal` says what it had changed; `error` is SQLite's."""

    def __init__(self, error: sqlite3.Error, journal: Journal) -> None:
        super().__init__(str(error))
        self.error = error
        self.journal = journal

    @property
    def disk_full(self) -> bool:
        return getattr(self.error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


# WAL bytes written (rows, roughly) after which the checkpointer thread is woken: about
# SQLite's own wal_autocheckpoint (1000 pages of 4 KiB); past the second, the writer
# checkpoints itself, as SQLite would have (a checkpointer that cannot keep up)
CHECKPOINT_BYTES = 4 << 20
CHECKPOINT_INLINE_BYTES = 64 << 20


class _Checkpointer:
    """Checkpoints the WAL of `path` on a thread and a connection of its own, with the writer's
    `synchronous` (so the WAL and the database are synced as SQLite's automatic checkpoint
    syncs them). SQLite's automatic checkpoint runs inside the COMMIT that crosses its
    threshold, copying some 4 MB and syncing twice while the command's reply waits (a third
    of the SQLite time of a run of inserts); PASSIVE, it runs beside the writer and never
    blocks it. `done` is the writer's byte count up to which the WAL was wholly copied."""

    def __init__(self, path: str, synchronous: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self.done = 0
        self._asked = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="cdcserver-checkpoint",
                                        daemon=True)
        self._thread.start()

    def ask(self, written: int) -> None:
        self._asked = written
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            upto = self._asked
            try:
                _, frames, copied = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error:
                continue  # (a full disk): the WAL keeps the frames; a later one copies them
            if frames == copied:
                self.done = upto

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()
        self._db.close()


class Persistence:
    """The SQLite side of the store. Writes are buffered into the open transaction; `commit()`
    makes them durable (`synchronous` = SQLite's PRAGMA synchronous). The per-document rows
    are queued, before any other statement and at `commit()`: document rows in order,
    consecutive rows of one statement by one `executemany`, then the oplog rows by one more
    (a table of their own, so their order against the documents' changes nothing, while
    interleaved with them they would make runs of one): a command's thousand inserts cost two
    calls into SQLite, not two thousand. A write SQLite refuses poisons the
    transaction: later writes of the batch are not sent (SQLite may already have rolled it
    back, and would then autocommit them one by one) and `commit()` rolls it back and raises
    CommitFailed."""

    FILE_NAME = "cdcserver.sqlite3"

    def __init__(self, data_dir: str, synchronous: str = "full") -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, self.FILE_NAME)
        self.db, self._lock = open_database(data_dir, self.FILE_NAME, SCHEMA, synchronous)
        self._in_tx = False
        self.journal = Journal()
        self._failed: sqlite3.Error | None = None  # the error that poisoned the transaction
        self._queued: list[tuple[str, tuple[Any, ...]]] = []  # document rows not yet sent
        self.db.execute("PRAGMA wal_autocheckpoint=0")  # _Checkpointer's, off the writes' path
        self._checkpointer: _Checkpointer | None = _Checkpointer(self.path, synchronous)
        self._written = 0  # bytes of rows committed (what the WAL grew by, roughly)
        self._oplog_rows: list[tuple[int, bytes]] = []  # oplog rows not yet sent, in ts order

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the lock (the PID stays: only a hint)
            self._lock = None

    # -- transactions ---------------------------------------------------------------------------

    def begin(self) -> None:
        if self._failed is not None:
            raise CommitFailed(self._failed, self.journal)
        if not self._in_tx:
            self._run("BEGIN")
            self._in_tx = True

    def _run(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._send()
        try:
            self.db.execute(sql, params)
        except sqlite3.Error as exc:
            self._failed = exc
            raise CommitFailed(exc, self.journal) from None

    def _queue(self, sql: str, params: tuple[Any, ...]) -> None:
        """A row for the open transaction (begun), sent by the next `_send`."""
        self._queued.append((sql, params))

    def _send(self) -> None:
        """Send the queued rows: the documents' in order, a run of one statement by one
        executemany, then the oplog's by one executemany."""
        queued, oplog_rows = self._queued, self._oplog_rows
        if not queued and not oplog_rows:
            return
        self._queued = []
        self._oplog_rows = []
        if self._failed is not None:
            raise CommitFailed(self._failed, self.journal)
        i = 0
        try:
            while i < len(queued):
                sql = queued[i][0]
                j = i + 1
                while j < len(queued) and queued[j][0] is sql:  # the same constant
                    j += 1
                if j == i + 1:
                    self.db.execute(sql, queued[i][1])
                else:
                    self.db.executemany(sql, [params for _, params in queued[i:j]])
                i = j
            if oplog_rows:
                self.db.executemany(_APPEND_OPLOG, oplog_rows)
        except sqlite3.Error as exc:
            self._failed = exc
            raise CommitFailed(exc, self.journal) from None

    def commit(self) -> None:
        """Make the transaction durable; on SQLite's refusal (now or at an earlier write of
        it) roll it back and raise CommitFailed with what it had changed."""
        if not self._in_tx and self._failed is None:
            return
        try:
            self._send()
        except CommitFailed:
            pass  # _failed: rolled back below
        self._queued = []
        self._oplog_rows = []
        self._in_tx = False
        journal, self.journal = self.journal, Journal()
        error, self._failed = self._failed, None
        if error is None:
            try:
                self.db.execute("COMMIT")
            except sqlite3.Error as exc:
                error = exc
            else:
                self._checkpoint()
                return
        if self.db.in_transaction:  # SQLite rolls some failures back itself
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise CommitFailed(error, journal)

    def _checkpoint(self) -> None:
        """After a commit: wake the checkpointer when the WAL has grown enough since it last
        copied it all, or checkpoint here when it lags too far behind."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        lag = self._written - checkpointer.done
        if lag < CHECKPOINT_BYTES:
            return
        if lag < CHECKPOINT_INLINE_BYTES:
            checkpointer.ask(self._written)
            return
        try:
            _, frames, copied = self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:
            return  # as a failed automatic checkpoint: the commit stands
        if frames == copied:
            checkpointer.done = self._written

    def close(self) -> None:
        try:
            try:
                self.commit()
            except CommitFailed:
                pass  # what was not committed is not durable: nothing was acknowledged
            if self._checkpointer is not None:
                # first: the last connection closed checkpoints the WAL and removes it
                self._checkpointer.close()
                self._checkpointer = None
            self.db.close()
        finally:
            self._unlock()

    # -- writes (inside begin/commit) -----------------------------------------------------------

    def put_collection(self, db: str, coll: str, uuid: bytes, meta: bytes) -> None:
        self.begin()
        self.journal.namespaces.add((db, coll))
        self._run(
            "INSERT INTO collections (db, coll, uuid, meta) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (db, coll) DO UPDATE SET uuid = excluded.uuid, meta = excluded.meta",
            (db, coll, uuid, meta),
        )

    def delete_collection(self, db: str, coll: str, uuid: bytes) -> None:
        self.begin()
        self.journal.namespaces.add((db, coll))
        self.journal.emptied.add(uuid)
        self._run("DELETE FROM collections WHERE db = ? AND coll = ?", (db, coll))
        self._run("DELETE FROM documents WHERE uuid = ?", (uuid,))

    def rename_collection(self, db: str, coll: str, to_db: str, to_coll: str) -> None:
        self.begin()
        self.journal.namespaces.update(((db, coll), (to_db, to_coll)))
        self._run(
            "UPDATE collections SET db = ?, coll = ? WHERE db = ? AND coll = ?",
            (to_db, to_coll, db, coll),
        )

    def put_document(self, uuid: bytes, key: bytes, doc: bytes) -> None:
        self.begin()
        self.journal.documents.add((uuid, key))
        self._written += len(doc)
        # An upsert that keeps the row id, so natural order survives updates and restarts.
        self._queue(_PUT_DOCUMENT, (uuid, key, doc))

    def delete_document(self, uuid: bytes, key: bytes) -> None:
        self.begin()
        self.journal.documents.add((uuid, key))
        self._queue(_DELETE_DOCUMENT, (uuid, key))

    def append_oplog(self, ts: Timestamp, entry: bytes) -> None:
        self.begin()
        self._written += len(entry)
        self._oplog_rows.append(((ts.time << 32) | ts.inc, entry))

    def truncate_oplog(self, before: Timestamp) -> None:
        self.begin()
        self._run("DELETE FROM oplog WHERE ts < ?", (ts_int(before),))
        self._run("DELETE FROM preimages WHERE ts < ?", (ts_int(before),))

    def put_pre_image(self, key: bytes, ts: Timestamp, doc: bytes) -> None:
        self.begin()
        self.journal.pre_images.add(key)
        self._run(
            "INSERT OR REPLACE INTO preimages (key, ts, doc) VALUES (?, ?, ?)",
            (key, ts_int(ts), doc),
        )

    def delete_pre_images(self, keys: Sequence[bytes]) -> None:
        self.begin()
        self.journal.pre_images.update(keys)
        for k in keys:
            self._run("DELETE FROM preimages WHERE key = ?", (k,))

    def put_retry_image(self, session_key: bytes, doc: bytes) -> None:
        self.begin()
        self.journal.retry_images.add(session_key)
        self._run(
            "INSERT OR REPLACE INTO retry_images (lsid, doc) VALUES (?, ?)", (session_key, doc)
        )

    def put_transaction(self, session_key: bytes, doc: bytes) -> None:
        self.begin()
        self._run(
            "INSERT OR REPLACE INTO transactions (lsid, doc) VALUES (?, ?)", (session_key, doc)
        )

    # -- loading --------------------------------------------------------------------------------

    def collections(self) -> list[tuple[str, str, bytes, bytes]]:
        return list(self.db.execute("SELECT db, coll, uuid, meta FROM collections"))

    def collection(self, db: str, coll: str) -> tuple[bytes, bytes] | None:
        """(uuid, meta) of the committed catalog entry `db.coll`, if any."""
        row = self.db.execute(
            "SELECT uuid, meta FROM collections WHERE db = ? AND coll = ?", (db, coll)
        ).fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def document(self, uuid: bytes, key: bytes) -> bytes | None:
        row = self.db.execute(
            "SELECT doc FROM documents WHERE uuid = ? AND id = ?", (uuid, key)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def document_keys(self, uuid: bytes) -> list[bytes]:
        """The collection's committed document keys in natural (row) order."""
        return [bytes(r[0]) for r in self.db.execute(
            "SELECT id FROM documents WHERE uuid = ? ORDER BY rowid", (uuid,)
        )]

    def pre_image(self, key: bytes) -> tuple[int, bytes] | None:
        row = self.db.execute("SELECT ts, doc FROM preimages WHERE key = ?", (key,)).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def retry_image(self, session_key: bytes) -> bytes | None:
        row = self.db.execute(
            "SELECT doc FROM retry_images WHERE lsid = ?", (session_key,)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def documents(self, uuid: bytes) -> Iterator[tuple[bytes, bytes]]:
        yield from self.db.execute(
            "SELECT id, doc FROM documents WHERE uuid = ? ORDER BY rowid", (uuid,)
        )

    def oplog(self) -> Iterator[tuple[int, bytes]]:
        yield from self.db.execute("SELECT ts, entry FROM oplog ORDER BY ts")

    def pre_images(self) -> Iterator[tuple[bytes, int, bytes]]:
        yield from self.db.execute("SELECT key, ts, doc FROM preimages")

    def retry_images(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self.db.execute("SELECT lsid, doc FROM retry_images")

    def transactions(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self.db.execute("SELECT lsid, doc FROM transactions")
