"""A live replica set as the source: tail its `local.oplog.rs` once, serve every change stream.

cdcserver runs as a sidecar next to a replica set. One tailable cursor reads the upstream's
oplog; every change stream opened on cdcserver reads from that one scan (mongod scans the
oplog once per change stream). Everything asked of the upstream is what mongod 8.0 offers
any client with read access to `local` and `config`:

* `hello`: `lastWrite.majorityOpTime`, the majority commit point. Entries are read as they
  are written and held back until the commit point reaches them, so nothing that a failover
  can roll back ever reaches a consumer.
* `find` / `getMore` on `local.oplog.rs`, `{ts: {$gte: T}}`, tailable + awaitData: the tail,
  from the last delivered entry. On reconnect (connection loss, failover: the driver finds
  the new primary) the tail starts again at the last delivered `ts`; its first entry must be
  that entry (it is then skipped: no duplicate). If the oplog no longer has it and its oldest
  entry is newer (the oplog rolled over while cdcserver was away), the streams positioned
  before the gap fail with ChangeStreamHistoryLost (286); new streams go on.
* `find` on `local.oplog.rs` sorted by `$natural` with `limit: 1`: the oldest entry (what a
  requested start is checked against) and, at start-up, nothing else.
* History: a stream that starts before the live window (`startAtOperationTime`, an old
  resume token, or a consumer slower than the window) reads the upstream's oplog from its
  position in a *segment*: a non-tailable `find {ts: {$gte: T}}` fetched a batch at a time,
  on demand, shared by every stream reading near that position. A segment whose start is
  older than the upstream's oldest entry fails its streams with 286.
* Images (`UpstreamImages`): `find {_id: {$in: [...]}}` on the event's collection for
  `updateLookup` (one query per namespace per batch, with the collection UUID checked by
  `listCollections`), and `find` on `config.system.preimages` for pre-images and
  `whenAvailable` / `required` post-images; fetched with AsyncMongoClient before the batch is
  pushed (`prepare`), so a lookup never holds the event loop.

The live window of recent entries is bounded (entries and bytes); entries are kept as their
BSON bytes (`EntryList`) and decoded once, when they arrive, for every cursor.

With `retain_dir`, every entry is written to a durable log (`retained.py`) before it is
delivered; history is read from the window, then that log, then the upstream, so a token the
upstream's oplog has lost still resumes, and a restart continues after the log's newest entry
the upstream still has (`_resume_retained`). Pre-images of retained entries are fetched into
it from `config.system.preimages` and answered from it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson.binary import Binary
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.sources.base import DECODED_WINDOW, EntryList, OplogLog
from cdcserver.sources.retained import (
    RetainedLog,
    RetainedWriteError,
    pre_image_ids,
    pre_image_key,
)
from pipeline_stages.check_resumability import HISTORY_LOST_MESSAGE
from pipeline_stages.error_codes import CATEGORIES
from pipeline_stages.error_labels import NOT_PRIMARY_ERROR, SHUTDOWN_ERROR
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import Document, equality_key, matches_document_key
from pipeline_stages.oplog_entry import Entry, decode_entry
from pipeline_stages.value_string import document_string

log = logging.getLogger("cdcserver")

RAW = CodecOptions(document_class=RawBSONDocument)
MAX_TS = Timestamp(0xFFFFFFFF, 0xFFFFFFFF)
# Codes of the upstream's errors that say "this oplog position is gone".
CAPPED_POSITION_LOST = 136
# error_codes.yml's NotPrimaryError and ShutdownError categories, less internal-only codes (the
# proxy tells its client's topology, as a driver does, so the next command finds the primary).
NOT_PRIMARY_CODES = NOT_PRIMARY_ERROR | (SHUTDOWN_ERROR - CATEGORIES["InternalOnly"])
# What closing may spend talking to the upstream (killCursors, endSessions), all steps
# together: with the upstream dead or stalled pymongo would wait serverSelectionTimeoutMS for
# each, and a shutdown must end within its grace whatever the upstream's state.
CLOSE_TIMEOUT_S = 1.0
# Pre-image ids waiting to be fetched into the retained log (bounded: memory).
PRE_IMAGE_QUEUE = 100_000
PRE_IMAGE_REQUEUE = 10_000  # newest retained entries whose pre-images a restart asks again


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


@dataclass
class UpstreamOptions:
    """How the upstream is read (`[upstream]` in the config file)."""

    uri: str
    batch_size: int = 1000  # batchSize of the tail's find/getMore
    max_await_ms: int = 1000  # awaitData wait of the tail's getMores
    window_entries: int = 100_000  # live window: entries kept for cursors near the head
    window_bytes: int = 256 * 1024 * 1024
    history_batch: int = 1000  # batchSize of history reads
    history_keep: int = 20_000  # entries a history segment keeps (readers behind re-read)
    history_segments: int = 16  # history readers open at once
    history_idle_s: float = 60.0  # a history reader nobody read from for this long closes
    majority_poll_ms: float = 2.0  # hello interval while entries wait for the commit point
    backoff_initial_ms: float = 50.0  # reconnect backoff (doubles, with jitter)
    backoff_max_ms: float = 5000.0
    oldest_refresh_s: float = 5.0  # how often the upstream's oldest entry is re-read
    lookup_timeout_ms: float = 2000.0  # updateLookup / pre-image / oplog entry lookups
    uuid_cache_s: float = 1.0  # collection UUIDs (updateLookup's UUID check) are re-read after
    # The durable log of what was tailed (sources/retained.py): its data directory (None: no
    # log, history is the window and the upstream's oplog), and its retention (either limit
    # exceeded drops the oldest entries; 0: no limit of that kind).
    retain_dir: str | None = None
    retain_mb: float = 1024
    retain_hours: float = 168.0
    # Options for both clients (AsyncMongoClient for the tail and image lookups, MongoClient
    # for the few synchronous reads),
    # beyond what the URI says (its auth and TLS options apply as given).
    client_options: dict[str, Any] = field(default_factory=dict)


class UpstreamError(MongoError):
    """The upstream cannot be reached (6, 89: resumable for a change stream, the driver
    resumes from its last token) or answered an error (its code and codeName)."""

    def __init__(
        self, code: int, errmsg: str, labels: Sequence[str] = (), code_name: str | None = None
    ) -> None:
        super().__init__(code, errmsg, labels)
        self._code_name = code_name

    @property
    def code_name(self) -> str:
        return self._code_name or super().code_name


def upstream_unavailable(what: str, exc: BaseException) -> UpstreamError:
    """A pymongo error from the upstream as the error of the command it happened in: a
    timeout is NetworkTimeout (89), a lost or refused connection HostUnreachable (6), both
    resumable; an error the upstream answered (e.g. Unauthorized) keeps its code."""
    from pymongo.errors import ConnectionFailure, ExecutionTimeout, NetworkTimeout, OperationFailure

    if isinstance(exc, (NetworkTimeout, ExecutionTimeout)):
        return UpstreamError(89, f"{what}: the upstream did not answer in time: {exc}")
    if isinstance(exc, OperationFailure) and not isinstance(exc, ConnectionFailure):
        details = exc.details or {}
        errmsg = details.get("errmsg", str(exc))
        return UpstreamError(
            exc.code or 1, f"{what}: the upstream answered: {errmsg}",
            code_name=details.get("codeName"),
        )
    return UpstreamError(6, f"{what}: the upstream is unreachable: {exc}")


def history_lost() -> MongoError:
    return MongoError(286, HISTORY_LOST_MESSAGE)


def _is_initiating_set(entry: Mapping[str, Any] | None) -> bool:
    if entry is None or entry.get("op") != "n":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and o.get("msg") == "initiating set"


def _majority_ts(hello: Mapping[str, Any]) -> Timestamp | None:
    last_write = hello.get("lastWrite")
    if not isinstance(last_write, Mapping):
        return None
    op_time = last_write.get("majorityOpTime")
    if isinstance(op_time, Mapping) and isinstance(op_time.get("ts"), Timestamp):
        return op_time["ts"]
    return None


async def _next_batch(cursor: Any) -> list[RawBSONDocument]:
    """One batch: what the cursor holds, else one find/getMore (an awaitData getMore waits up
    to its maxAwaitTimeMS). Empty when that getMore found nothing or the cursor is dead."""
    batch: list[RawBSONDocument] = []
    await cursor._next_batch(batch)  # noqa: SLF001  (pymongo >= 4.9; public API reads per doc)
    return batch


class _Segment(EntryList):
    """Entries of the upstream's oplog read from `start` on (a history reader): every entry
    with `base <= ts <= covered_to` is held."""

    def __init__(self, start: Timestamp) -> None:
        super().__init__()
        self.start = start
        self.base = start
        self.covered_to: Timestamp | None = None
        self.error: MongoError | None = None
        self.want = asyncio.Event()
        self.last_used = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    @property
    def reach(self) -> Timestamp:
        """The last start this segment can serve (its next entry, when it comes)."""
        return self.start if self.covered_to is None else next_ts(self.covered_to)

    def serves(self, start: Timestamp) -> bool:
        return self.base <= start <= self.reach

    def append(self, items: list[tuple[Timestamp, bytes, Entry]], keep: int) -> None:
        for ts, raw, entry in items:
            self._raw.append(raw)
            self._ts.append(ts)
            self._decoded[raw] = entry
            if len(self._decoded) > DECODED_WINDOW:
                del self._decoded[next(iter(self._decoded))]
        if items:
            self.covered_to = items[-1][0]
        excess = len(self._ts) - keep
        if excess > 0:
            self.base = next_ts(self._ts[excess - 1])
            del self._raw[:excess]
            del self._ts[:excess]


class UpstreamOplog(EntryList, OplogLog):
    """The upstream replica set's oplog: a live window near the head, history on demand."""

    def __init__(self, options: UpstreamOptions | str) -> None:
        super().__init__()
        if isinstance(options, str):
            options = UpstreamOptions(uri=options)
        self.options = options
        self.images = UpstreamImages(self)
        self._client: Any = None  # AsyncMongoClient, made on the serving loop
        self._sync_client: Any = None  # MongoClient for the synchronous lookups
        self._bytes = 0
        # Every upstream entry with covered_from <= ts <= the newest delivered one is in the
        # window (None: nothing delivered since start-up or since a gap).
        self._covered_from: Timestamp | None = None
        self._cluster_time = Timestamp(0, 0)
        # Read from the upstream, not yet majority-committed: (ts, bytes, decoded).
        self._pending: list[tuple[Timestamp, bytes, Entry]] = []
        self._majority: Timestamp | None = None  # the upstream's majority commit point
        self._resume_ts: Timestamp | None = None  # where the tail (re)starts
        self._skip_resume_entry = False  # the entry at _resume_ts was delivered
        self._oldest: Entry | None = None  # the upstream's oldest entry, as last read
        self._namespaces: set[tuple[str, str]] = set()
        self._segments: list[_Segment] = []
        self._majority_wanted = asyncio.Event()
        self._ready = asyncio.Event()  # the majority commit point is known
        self.connected = False  # the tail is reading (for serverStatus and tests)
        self.reconnects = 0
        self._close_by: float | None = None  # closing's deadline, set by its first step
        self._down_since: float | None = None  # when the tail was lost (None: it reads)
        self._attempts = 0  # reconnect attempts in this outage
        self.gaps = 0  # times the tail found its position gone from the upstream
        self._tasks: list[asyncio.Task[Any]] = []
        self._ddl_generation = 0  # bumped by every command entry (UUID cache)
        # When the tail last heard from the upstream, and when a lookup last failed: lookups
        # fail fast while it is silent (rather than each getMore waiting lookup_timeout_ms).
        self._last_heard = time.monotonic()
        self._lookup_failed_at: float | None = None
        # The durable log (opened here: an unusable data directory fails at start).
        self.retained: RetainedLog | None = None
        self._retain_pre_images: list[dict[str, Any]] = []  # ids to fetch from the upstream
        self._retain_pre_images_wanted = asyncio.Event()
        self._new_stream_floor: Timestamp | None = None  # the commit point read at start
        self._pre_image_errors: set[int] = set()  # codes the upstream answered (logged once)
        if options.retain_dir:
            self.retained = RetainedLog(
                options.retain_dir, options.retain_mb, options.retain_hours
            )
            last = self.retained.last_ts()
            if last is not None:
                self._cluster_time = last

    # -- clients --------------------------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        # socketTimeoutMS: a stalled upstream must not hold the tail's getMore forever.
        opts: dict[str, Any] = {
            "socketTimeoutMS": int(self.options.max_await_ms) + 10_000,
            "serverSelectionTimeoutMS": 10_000,
            "appname": "cdcserver",
        }
        opts.update(self.options.client_options)
        return opts

    def async_client(self) -> Any:
        """The AsyncMongoClient to the upstream (made on first use, on the running loop)."""
        if self._client is None:
            from pymongo import AsyncMongoClient

            self._client = AsyncMongoClient(self.options.uri, **self._client_options())
        return self._client

    def sync_client(self) -> Any:
        """A MongoClient for the lookups made synchronously (entries of a transaction's chain
        outside the window; an image lookup no `prepare` covered)."""
        if self._sync_client is None:
            from pymongo import MongoClient

            self._sync_client = MongoClient(self.options.uri, **self._client_options())
        return self._sync_client

    def _oplog_collection(self, client: Any) -> Any:
        return client.local.get_collection("oplog.rs", codec_options=RAW)

    def _close_budget(self) -> float:
        """Seconds left to talk to the upstream while closing: CLOSE_TIMEOUT_S from the first
        step for all of them (the tail's and history readers' cursors, then the clients)."""
        now = time.monotonic()
        if self._close_by is None:
            self._close_by = now + CLOSE_TIMEOUT_S
        return max(0.0, self._close_by - now)

    async def _close_own_cursor(self, cursor: Any) -> None:
        """A task's cursor: within the close budget when the task is being cancelled (the
        source closes), within CLOSE_TIMEOUT_S otherwise (a reconnect)."""
        task = asyncio.current_task()
        closing = task is not None and task.cancelling() > 0
        await _close_cursor(cursor, self._close_budget() if closing else CLOSE_TIMEOUT_S)

    async def aclose(self) -> None:
        """Stop the tail's tasks and close the clients, talking to the upstream for at most
        CLOSE_TIMEOUT_S in all (`_close_budget`)."""
        import pymongo

        for task in [*self._tasks, *(s.task for s in self._segments if s.task)]:
            task.cancel()
        for task in [*self._tasks, *(s.task for s in self._segments if s.task)]:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        self._segments.clear()
        # Both clients at once. pymongo.timeout bounds endSessions' server selection
        # (to_thread carries it into the thread); asyncio.timeout backs it up.
        closing = []
        if self._client is not None:
            client, self._client = self._client, None
            closing.append(client.close())
        if self._sync_client is not None:
            client, self._sync_client = self._sync_client, None
            closing.append(asyncio.to_thread(client.close))
        if closing:
            budget = self._close_budget()
            with contextlib.suppress(Exception), pymongo.timeout(max(budget, 0.001)):
                async with asyncio.timeout(budget + 0.1):
                    await asyncio.gather(*closing, return_exceptions=True)
        if self.retained is not None:  # its data directory's lock is released
            retained, self.retained = self.retained, None
            retained.close()

    # -- OplogLog -------------------------------------------------------------------------------

    def cluster_time(self) -> Timestamp:
        return self._cluster_time

    def latest_ts(self) -> Timestamp | None:
        if self._ts:
            return self._ts[-1]
        return None if self.retained is None else self.retained.last_ts()

    def start_for_new_stream(self) -> Timestamp:
        latest = self.latest_ts()
        if latest is None:
            raise UpstreamError(
                6, "cdcserver has not reached its upstream's oplog yet (it is connecting)"
            )
        floor = self._new_stream_floor  # a restarted sidecar catching up: start at "now"
        if floor is not None and floor > latest:
            return next_ts(floor)
        return next_ts(latest)

    def oldest_entry(self) -> Entry | None:
        """The oldest entry a stream can start from: the retained log's when it reaches
        further back than the upstream's oplog, else the upstream's oldest as last read (it
        only moves forward: a stale one lets a stream open, and its first read from the
        upstream then fails it with 286)."""
        retained = self.retained
        if retained is not None:
            mine = retained.oldest_entry()
            if mine is not None and (self._oldest is None or mine["ts"] < self._oldest["ts"]):
                return mine
        return self._oldest

    def namespaces(self) -> set[tuple[str, str]]:
        return set(self._namespaces)

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        cf = self._covered_from
        if cf is not None and start >= cf:
            return EntryList.read_from(self, start, limit)
        retained = self.retained
        if retained is not None and retained.covers(start):
            return retained.read_from(start, limit)  # before asking the upstream
        return self._history_read(start, limit)

    def entry_at(self, ts: Timestamp) -> Entry | None:
        entry = EntryList.entry_at(self, ts)
        if entry is not None:
            return entry
        for seg in self._segments:
            entry = seg.entry_at(ts)
            if entry is not None:
                return entry
        if self.retained is not None and self.retained.covers(ts):
            entry = self.retained.entry_at(ts)
            if entry is not None:
                return entry
        return self._lookup_entry(ts)

    async def wait_for_entries(self, start: Timestamp, timeout: float) -> None:
        event = self._changed  # taken before the check, so a notify in between is not lost
        if self._readable(start):
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def _readable(self, start: Timestamp) -> bool:
        cf = self._covered_from
        if cf is not None and start >= cf:
            latest = self.latest_ts()
            return latest is not None and latest >= start
        retained = self.retained
        if retained is not None and retained.covers(start):
            last = retained.last_ts()
            return last is not None and last >= start
        seg = self._segment_for(start)
        if seg is None:
            return True  # the next read opens a history reader
        return seg.error is not None or (bool(seg._ts) and seg._ts[-1] >= start)

    def __len__(self) -> int:
        return len(self._ts)

    def status(self) -> dict[str, Any]:
        """For serverStatus: how the tail is doing."""
        return {
            "connected": self.connected,
            "reconnects": self.reconnects,
            "historyLostGaps": self.gaps,
            "windowEntries": len(self._ts),
            "windowBytes": self._bytes,
            "windowOldest": self._covered_from,
            "pendingMajority": len(self._pending),
            "majorityCommitPoint": self._majority,
            "historyReaders": len(self._segments),
            "upstreamOldest": None if self._oldest is None else self._oldest["ts"],
            "retained": None if self.retained is None else self.retained.status(),
        }

    # -- the tail -------------------------------------------------------------------------------

    async def wait_ready(self, timeout: float) -> bool:
        """Wait until the tail has delivered its first entry (for tests and the CLI)."""
        deadline = time.monotonic() + timeout
        while self.latest_ts() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def prime(self, timeout_s: float = 10.0) -> bool:
        """Before serving (synchronously, e.g. from the CLI): read the upstream's majority
        commit point and its entry, so the first change streams can start at once. False
        (logged) when the upstream cannot be reached: the tail keeps trying, and new streams
        get a resumable error until it does."""
        import pymongo

        try:
            with pymongo.timeout(timeout_s):
                client = self.sync_client()
                majority = _majority_ts(client.admin.command("hello"))
                oplog = self._oplog_collection(client)
                if majority is None:
                    doc = oplog.find_one({}, sort=[("$natural", -1)])
                else:
                    doc = oplog.find_one({"ts": majority})
        except pymongo.errors.PyMongoError as exc:
            log.warning("upstream not reached yet (%s); cdcserver keeps trying", exc)
            return False
        if doc is None:
            return False
        entry = decode_entry(doc.raw)
        self._majority = MAX_TS if majority is None else majority
        self._ready.set()
        if self.retained is not None and self.retained.last_ts() is not None:
            # A restart: the tail continues from the last retained entry (checked against
            # the upstream first); new streams start at the upstream's present meanwhile.
            self._new_stream_floor = entry["ts"]
            return True
        self._deliver([(entry["ts"], doc.raw, entry)])
        return True

    async def follow(self) -> None:
        """The background task: tail the upstream, follow its commit point, reconnect with
        backoff. Cancelling it closes the clients."""
        self._tasks = [
            asyncio.create_task(self._majority_loop()),
            asyncio.create_task(self._housekeeping_loop()),
        ]
        if self.retained is not None:
            self._tasks.append(asyncio.create_task(self._retain_pre_images_loop()))
        initial = self.options.backoff_initial_ms / 1000
        backoff = initial
        try:
            while True:
                progressed = False
                try:
                    progressed = await self._tail_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                    progressed = self.connected
                    self._tail_failed(exc)
                else:
                    self._tail_failed(None)
                self.connected = False
                self._pending.clear()  # re-read from the last delivered entry
                self.reconnects += 1
                backoff = initial if progressed else min(
                    backoff * 2, self.options.backoff_max_ms / 1000
                )
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
        finally:
            await self.aclose()

    def _tail_failed(self, exc: Exception | None) -> None:
        """Log the tail's end: the first failure of an outage as a warning (the following
        attempts at debug level, with the backoff), so a dead upstream does not fill the log;
        `_tail_connected` logs the reconnect."""
        what = "its cursor ended" if exc is None else f"{type(exc).__name__}: {exc}"
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._attempts = 0
            log.warning("upstream tail lost (%s): reconnecting", what,
                        extra={"reconnects": self.reconnects})
        else:
            log.debug("upstream tail: still unreachable (%s)", what)
        self._attempts += 1

    def _tail_connected(self, address: Any) -> None:
        """The tail reads again: log the reconnect (once per outage)."""
        where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "the upstream"
        if self._down_since is None:
            log.info("upstream tail reading from %s at %s", where, self._resume_ts)
            return
        down = time.monotonic() - self._down_since
        log.info(
            "upstream tail reconnected to %s after %.1fs (%d attempt(s)); resuming at %s",
            where, down, self._attempts, self._resume_ts,
            extra={"reconnects": self.reconnects, "downSeconds": round(down, 3)},
        )
        self._down_since = None

    async def _initial_position(self, client: Any) -> None:
        """Start at the upstream's majority commit point (its current time for a stream)."""
        hello = await client.admin.command("hello")
        majority = _majority_ts(hello)
        if majority is None:
            log.warning(
                "the upstream's hello has no lastWrite.majorityOpTime: every entry read is "
                "delivered at once (nothing can be held back until majority-committed)"
            )
            self._majority = MAX_TS
            newest = await self._oplog_collection(client).find(
                {}, sort=[("$natural", -1)], limit=1
            ).to_list()
            if not newest:
                raise UpstreamError(6, "the upstream's oplog is empty")
            start = newest[0]["ts"]
        else:
            self._majority = majority
            start = majority
        self._ready.set()
        self._resume_ts = start
        self._skip_resume_entry = False

    async def _resume_retained(self, client: Any) -> bool:
        """A restart with a retained log: continue the tail after its newest entry that the
        upstream still has, byte for byte, at or before its majority commit point (entries
        retained after it were rolled back: dropped). False when nothing retained can be
        continued (empty log; or the upstream's oplog rolled over past it while the sidecar
        was down: the log is emptied, as no reader could cross that gap)."""
        retained = self.retained
        if retained is None or retained.last_ts() is None:
            return False
        majority = _majority_ts(await client.admin.command("hello")) or MAX_TS
        oplog = self._oplog_collection(client)
        before: Timestamp | None = None
        n = 1  # the newest entry first (a plain restart), then further back in larger steps
        while True:
            chunk = retained.newest(before, n)
            if not chunk:
                break
            lo, hi = chunk[-1][0], chunk[0][0]
            docs = await oplog.find({"ts": {"$gte": lo, "$lte": hi}}).to_list()
            upstream = {d["ts"]: d.raw for d in docs}
            for ts, raw in chunk:
                if ts <= majority and upstream.get(ts) == raw:
                    dropped = retained.drop_after(ts)
                    if dropped:
                        log.error(
                            "the upstream no longer has the %d retained entries after %s (a "
                            "rollback): dropped them", dropped, ts,
                        )
                        self._cluster_time = ts  # the dropped times are no longer history
                    self._majority = majority
                    self._ready.set()
                    self._resume_ts = ts
                    self._skip_resume_entry = True
                    self._requeue_pre_images()
                    if ts > self._cluster_time:
                        self._cluster_time = ts
                    return True
            oldest = await self._refresh_oldest(client)
            if oldest is None or oldest["ts"] > lo:
                break  # the upstream has nothing this far back: a gap, not a rollback
            before, n = lo, min(n * 16, 4096)
        self.gaps += 1
        dropped = retained.reset()
        log.error(
            "the upstream's oplog no longer reaches the sidecar's last retained entry (it "
            "rolled over while the sidecar was away): the %d retained entries end at a gap "
            "and were dropped; streams resuming from before it fail with "
            "ChangeStreamHistoryLost", dropped,
        )
        return False

    def _requeue_pre_images(self) -> None:
        """After a restart: the newest retained entries' pre-images not fetched before the
        process ended (the queue was in memory) are asked for again, while the upstream may
        still have them."""
        retained = self.retained
        assert retained is not None
        entries = [decode_entry(raw) for _, raw in retained.newest(None, PRE_IMAGE_REQUEUE)]
        ids = pre_image_ids(entries)
        if not ids:
            return
        keys = [
            pre_image_key(_pre_image_key(i)[0], i["ts"], int(i["applyOpsIndex"])) for i in ids
        ]
        have = retained.pre_images(keys)
        self._retain_pre_images.extend(i for i, k in zip(ids, keys) if k not in have)
        if self._retain_pre_images:
            self._retain_pre_images_wanted.set()

    async def _retain_pre_images_loop(self) -> None:
        """Fetch the pre-images of retained update/delete entries from the upstream's
        config.system.preimages while it has them (it drops them with its oplog)."""
        retained = self.retained
        assert retained is not None
        backoff = self.options.backoff_initial_ms / 1000
        while True:
            await self._retain_pre_images_wanted.wait()
            queue = self._retain_pre_images
            if not queue:
                self._retain_pre_images_wanted.clear()
                continue
            ids = queue[:1000]
            try:
                coll = self.async_client().config.get_collection(
                    "system.preimages", codec_options=RAW
                )
                docs = await coll.find(
                    {"_id": {"$in": [_pre_image_query_id(i) for i in ids]}}
                ).to_list()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                err = upstream_unavailable("fetching pre-images for the retained log", exc)
                if err.code not in (6, 89):
                    # An answer (e.g. Unauthorized: no find on config.system.preimages): asking
                    # again would get it again. Logged once per code; these ids are skipped
                    # (their streams ask the upstream, as without a log).
                    if err.code not in self._pre_image_errors:
                        self._pre_image_errors.add(err.code)
                        log.warning("retained log: %s", err.errmsg)
                    del queue[: len(ids)]
                    continue
                log.debug("retained log: fetching pre-images: %s", exc)
                await asyncio.sleep(backoff)  # the upstream is away: try again
                backoff = min(backoff * 2, self.options.backoff_max_ms / 1000)
                continue
            backoff = self.options.backoff_initial_ms / 1000
            found = [
                (doc["_id"], doc["preImage"].raw)
                for doc in docs
                if isinstance(doc.get("preImage"), RawBSONDocument)
            ]
            self._pre_image_errors.discard(0)
            try:
                retained.put_pre_images(found)
            except RetainedWriteError:
                await asyncio.sleep(1.0)  # logged by the log; the ids stay queued
                continue
            del queue[: len(ids)]

    async def _tail_once(self) -> bool:
        """One tailable cursor from the resume point until it fails or dies. True when it
        delivered something (the reconnect backoff starts over)."""
        client = self.async_client()
        if self._resume_ts is None and not await self._resume_retained(client):
            await self._initial_position(client)
        if self._oldest is None:
            await self._refresh_oldest(client)
        from pymongo import CursorType

        start = self._resume_ts
        assert start is not None
        cursor = self._oplog_collection(client).find(
            {"ts": {"$gte": start}},
            cursor_type=CursorType.TAILABLE_AWAIT,
            batch_size=self.options.batch_size,
        ).max_await_time_ms(int(self.options.max_await_ms))
        progressed = False
        try:
            checked = False
            while True:
                batch = await _next_batch(cursor)
                self._last_heard = time.monotonic()
                if not checked:
                    if not batch:
                        if cursor.alive:
                            continue
                        # Nothing at or after the resume point.
                        await self._check_gap(client, start, None)
                        return progressed
                    batch = await self._check_continuity(client, start, batch)
                    checked = True
                    self.connected = True
                    self._tail_connected(cursor.address)
                    progressed = True
                if batch:
                    self._receive(batch)
                if not cursor.alive:
                    return progressed
                # Bounded memory: while the commit point stalls (a majority of the upstream's
                # members down), stop reading rather than hold ever more entries back.
                while len(self._pending) >= self.options.window_entries:
                    await asyncio.sleep(self.options.majority_poll_ms / 1000 or 0.01)
                    if self.retained is not None and self.retained.failing is not None:
                        await asyncio.sleep(1.0)  # the disk refused: try again, slowly
                        self._deliver_committed()
        finally:
            await self._close_own_cursor(cursor)

    async def _check_continuity(
        self, client: Any, start: Timestamp, batch: list[RawBSONDocument]
    ) -> list[RawBSONDocument]:
        first_ts = batch[0]["ts"]
        if first_ts == start:
            return batch[1:] if self._skip_resume_entry else batch
        await self._check_gap(client, start, first_ts)
        return batch

    async def _check_gap(self, client: Any, start: Timestamp, first: Timestamp | None) -> None:
        """The entry at `start` is not in the upstream's oplog."""
        oldest = await self._refresh_oldest(client)
        if not self._skip_resume_entry:
            return  # start-up: nothing was delivered from before
        if oldest is not None and oldest["ts"] > start:
            # The oplog rolled over past the last delivered entry: what came between is lost
            # for every stream positioned before it (they get 286 from the history check).
            self.gaps += 1
            log.error(
                "upstream oplog rolled over past cdcserver's position %s (its oldest entry is "
                "%s): streams positioned before it fail with ChangeStreamHistoryLost",
                start, oldest["ts"],
            )
            self._drop_window()
            if self.retained is not None:  # nothing retained can be read across the gap
                dropped = self.retained.reset()
                log.error("the retained log's %d entries end at the gap: dropped", dropped)
            if first is None:
                self._resume_ts = oldest["ts"]
                self._skip_resume_entry = False
        else:
            # Older entries are there but not this one: it was rolled back, which a
            # majority-committed entry cannot be. Go on after it.
            log.error("upstream oplog no longer has the delivered entry at %s", start)

    def _drop_window(self) -> None:
        self._raw.clear()
        self._ts.clear()
        self._decoded.clear()
        self._bytes = 0
        self._covered_from = None

    def _receive(self, batch: list[RawBSONDocument]) -> None:
        pending = self._pending
        last = pending[-1][0] if pending else (self._ts[-1] if self._ts else None)
        for doc in batch:
            raw = doc.raw
            entry = decode_entry(raw)
            ts = entry["ts"]
            if last is not None and ts <= last:
                continue  # never twice, never backwards
            pending.append((ts, raw, entry))
            last = ts
        self._deliver_committed()

    def _deliver_committed(self) -> None:
        pending = self._pending
        if not pending:
            return
        majority = self._majority
        k = 0
        if majority is not None:
            n = len(pending)
            while k < n and pending[k][0] <= majority:
                k += 1
        if k:
            if not self._deliver(pending[:k]):
                return  # not retained (the disk refuses): kept pending, delivered later
            del pending[:k]
        if pending:
            self._majority_wanted.set()

    def _deliver(self, items: list[tuple[Timestamp, bytes, Entry]]) -> bool:
        """Make `items` (majority-committed, ascending) readable; with the durable log, only
        once they are retained (False: the log cannot be written, nothing is delivered)."""
        retained = self.retained
        if retained is not None:
            try:
                retained.append([(ts, raw) for ts, raw, _ in items])
            except RetainedWriteError:
                return False
            ids = pre_image_ids(entry for _, _, entry in items)
            if ids:
                queue = self._retain_pre_images
                queue.extend(ids)
                if len(queue) > PRE_IMAGE_QUEUE:  # the upstream unreachable for long
                    if not self._pre_image_errors:  # warned once (until it answers again)
                        log.warning("retained log: pre-images of older entries are not "
                                    "fetched (the upstream does not answer)")
                        self._pre_image_errors.add(0)
                    del queue[: len(queue) - PRE_IMAGE_QUEUE]
                self._retain_pre_images_wanted.set()
        raw_list, ts_list, cache = self._raw, self._ts, self._decoded
        size = 0
        for ts, raw, entry in items:
            raw_list.append(raw)
            ts_list.append(ts)
            size += len(raw)
            cache[raw] = entry
            if len(cache) > DECODED_WINDOW:
                del cache[next(iter(cache))]
            op = entry.get("op")
            if op in ("i", "u", "d"):
                db, _, coll = entry["ns"].partition(".")
                self._namespaces.add((db, coll))
            elif op == "c":
                self._ddl_generation += 1
        self._bytes += size
        if self._covered_from is None:
            self._covered_from = items[0][0]
        last = items[-1][0]
        self._resume_ts = last
        self._skip_resume_entry = True
        if last > self._cluster_time:
            self._cluster_time = last
        self._trim()
        self.notify()
        return True

    def _trim(self) -> None:
        max_n, max_b = self.options.window_entries, self.options.window_bytes
        n_total = len(self._ts)
        if n_total <= max_n and self._bytes <= max_b:
            return
        # Drop a tenth more than needed, so trimming (a list shift) is amortised.
        keep_n, keep_b = max_n - max_n // 10, max_b - max_b // 10
        n, freed = 0, 0
        while n < n_total - 1 and (n_total - n > keep_n or self._bytes - freed > keep_b):
            freed += len(self._raw[n])
            n += 1
        if not n:
            return
        self._covered_from = next_ts(self._ts[n - 1])
        del self._raw[:n]
        del self._ts[:n]
        self._bytes -= freed

    async def _majority_loop(self) -> None:
        """While entries wait for the commit point: ask `hello` where it is."""
        from pymongo import ReadPreference

        base = self.options.majority_poll_ms / 1000
        interval = base
        backoff = self.options.backoff_initial_ms / 1000
        while True:
            await self._majority_wanted.wait()
            try:
                hello = await self.async_client().admin.command(
                    "hello", read_preference=ReadPreference.PRIMARY_PREFERRED
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the tail reconnects; try again
                log.debug("upstream hello: %s", exc)
                await asyncio.sleep(backoff)
                continue
            majority = _majority_ts(hello)
            if majority is None:
                majority = MAX_TS
            if self._majority is None or majority > self._majority:
                self._majority = majority
                self._ready.set()
                self._deliver_committed()
                interval = base
            else:
                # The commit point did not move: ask less often (up to 20 times a second).
                interval = min(max(interval * 2, base), 0.05)
            pending = self._pending
            if pending and pending[-1][0] > self._majority:
                await asyncio.sleep(interval)
            else:
                self._majority_wanted.clear()

    async def _housekeeping_loop(self) -> None:
        period = max(0.05, min(self.options.oldest_refresh_s, self.options.history_idle_s / 4))
        last_oldest = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for seg in list(self._segments):
                if now - seg.last_used > self.options.history_idle_s:
                    self._close_segment(seg)
            if self.retained is not None:
                if self.retained.failing is not None and self._pending:
                    self._deliver_committed()  # retry what the disk refused
                else:
                    with contextlib.suppress(RetainedWriteError):
                        self.retained.trim()  # age retention while no entries arrive
            if self.connected and now - last_oldest >= self.options.oldest_refresh_s:
                last_oldest = now
                try:
                    await self._refresh_oldest(self.async_client())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    log.debug("upstream oldest entry: %s", exc)

    async def _refresh_oldest(self, client: Any) -> Entry | None:
        docs = await self._oplog_collection(client).find(
            {}, sort=[("$natural", 1)], limit=1
        ).to_list()
        if docs:
            oldest = decode_entry(docs[0].raw)
            if self._oldest is None or oldest["ts"] >= self._oldest["ts"]:
                self._oldest = oldest
        return self._oldest

    # -- history --------------------------------------------------------------------------------

    def _segment_for(self, start: Timestamp) -> _Segment | None:
        best = None
        for seg in self._segments:
            if seg.serves(start) and (best is None or seg.base > best.base):
                best = seg
        return best

    def _history_read(self, start: Timestamp, limit: int) -> list[Entry]:
        seg = self._segment_for(start)
        if seg is None:
            self._open_segment(start)
            return []
        seg.last_used = time.monotonic()
        if seg.error is not None:
            raise seg.error
        out = seg.read_from(start, limit)
        if not out or (seg._ts and out[-1]["ts"] == seg._ts[-1]):
            seg.want.set()  # the reader is at the end of what was fetched: fetch ahead
        return out

    def _open_segment(self, start: Timestamp) -> _Segment:
        while len(self._segments) >= self.options.history_segments:
            self._close_segment(min(self._segments, key=lambda s: s.last_used))
        seg = _Segment(start)
        seg.want.set()
        self._segments.append(seg)
        seg.task = asyncio.get_running_loop().create_task(self._run_segment(seg))
        return seg

    def _close_segment(self, seg: _Segment) -> None:
        if seg in self._segments:
            self._segments.remove(seg)
        if seg.task is not None:
            seg.task.cancel()

    async def _run_segment(self, seg: _Segment) -> None:
        """Fetch the segment's next batch each time a reader reaches its end."""
        initial = self.options.backoff_initial_ms / 1000
        backoff = initial
        cursor = None
        try:
            while True:
                await seg.want.wait()
                await self._ready.wait()
                try:
                    if cursor is None:
                        frm = seg.start if seg.covered_to is None else seg.covered_to
                        cursor = self._oplog_collection(self.async_client()).find(
                            {"ts": {"$gte": frm}}, batch_size=self.options.history_batch
                        )
                        batch = await _next_batch(cursor)
                        batch = await self._segment_continuity(seg, frm, batch)
                    else:
                        batch = await _next_batch(cursor)
                    backoff = initial
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    cursor = await _close_cursor(cursor)
                    if getattr(exc, "code", None) == CAPPED_POSITION_LOST:
                        seg.error = history_lost()
                    elif isinstance(exc, MongoError):
                        seg.error = exc
                    if seg.error is not None:
                        self.notify()
                        return
                    log.debug("upstream history read: %s", exc)
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, self.options.backoff_max_ms / 1000)
                    continue
                limit = self._majority or Timestamp(0, 0)
                items = []
                at_head = not cursor.alive
                for doc in batch:
                    entry = decode_entry(doc.raw)
                    ts = entry["ts"]
                    if ts > limit:
                        at_head = True  # not majority-committed yet: the window brings it
                        break
                    if seg.covered_to is not None and ts <= seg.covered_to:
                        continue
                    items.append((ts, doc.raw, entry))
                seg.append(items, self.options.history_keep)
                if at_head:
                    cursor = await _close_cursor(cursor)
                seg.want.clear()
                self.notify()
                if at_head and not items:
                    # The reader is at the upstream's head: the tail will deliver what comes.
                    await asyncio.sleep(max(0.01, self.options.majority_poll_ms / 1000))
        finally:
            await self._close_own_cursor(cursor)

    async def _segment_continuity(
        self, seg: _Segment, frm: Timestamp, batch: list[RawBSONDocument]
    ) -> list[RawBSONDocument]:
        """Check that the upstream still has everything from `frm` on: the first entry is at
        `frm`, or the oldest entry is not newer than `frm` (read after the find, so a
        truncation before the find is seen). Raises 286 otherwise."""
        continuing = seg.covered_to is not None
        if batch and batch[0]["ts"] == frm:
            return batch[1:] if continuing else batch
        oldest = await self._refresh_oldest(self.async_client())
        if oldest is not None and oldest["ts"] > frm and not (
            not continuing and _is_initiating_set(oldest)
        ):
            raise history_lost()
        return batch

    def lookup_allowed(self, what: str) -> None:
        """Before a lookup: fail fast, with a resumable error, while the upstream is silent —
        its tail has not heard from it for a while, or the last lookup failed and the tail has
        not heard from it since (the stream's driver resumes rather than each getMore waiting
        for a lookup that times out)."""
        silent_s = time.monotonic() - self._last_heard
        if silent_s > 2 * self.options.max_await_ms / 1000 + 2 or (
            self._lookup_failed_at is not None and self._last_heard <= self._lookup_failed_at
        ):
            raise UpstreamError(
                89, f"{what}: the upstream has not answered for {silent_s:.1f}s"
            )

    def lookup_error(self, what: str, exc: BaseException) -> UpstreamError:
        """The error a failed lookup raises; a network failure or timeout also makes the next
        lookups fail fast until the tail hears from the upstream again."""
        err = upstream_unavailable(what, exc)
        if err.code in (6, 89):
            self._lookup_failed_at = time.monotonic()
        return err

    def _lookup_entry(self, ts: Timestamp) -> Entry | None:
        """An oplog entry outside the window and the history readers (the earlier entries of
        a transaction's prevOpTime chain): read from the upstream, synchronously."""
        import pymongo

        what = "reading a transaction's oplog entry"
        self.lookup_allowed(what)
        try:
            with pymongo.timeout(self.options.lookup_timeout_ms / 1000):
                doc = self._oplog_collection(self.sync_client()).find_one({"ts": ts})
        except pymongo.errors.PyMongoError as exc:
            raise self.lookup_error(what, exc) from None
        return None if doc is None else decode_entry(doc.raw)


async def _close_cursor(cursor: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close a cursor on the upstream (killCursors) within `timeout_s`: a dead upstream must
    not hold a reconnect or a shutdown for a server selection timeout."""
    import pymongo

    if cursor is not None and timeout_s > 0:
        with contextlib.suppress(Exception), pymongo.timeout(timeout_s):
            async with asyncio.timeout(timeout_s + 0.1):
                await cursor.close()
    return None


# ---------------------------------------------------------------------------------------------
# Images


def _pre_image_key(id_doc: Mapping[str, Any]) -> tuple[bytes, Timestamp, int]:
    return (bytes(id_doc["nsUUID"]), id_doc["ts"], int(id_doc["applyOpsIndex"]))


def _pre_image_query_id(id_doc: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-image `_id` as config.system.preimages stores it (nsUUID as UUID binary)."""
    uuid = id_doc["nsUUID"]
    return {
        "nsUUID": uuid if isinstance(uuid, Binary) else Binary(bytes(uuid), 4),
        "ts": id_doc["ts"],
        "applyOpsIndex": id_doc["applyOpsIndex"],
    }


def _uuid_of(infos: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The collection UUID in a listCollections answer (None: no such collection)."""
    if not infos:
        return None
    value = (infos[0].get("info") or {}).get("uuid")
    if value is None:
        return None
    return bytes(value.bytes if hasattr(value, "bytes") else value)


def _one_match(key: Document, candidates: Sequence[Document]) -> Document | None:
    """The document among `candidates` matching the whole documentKey; 280 for two."""
    found = [d for d in candidates if matches_document_key(d, key)]
    if len(found) > 1:
        raise MongoError(
            280,
            f"found more than one document with document key "
            f"{document_string(key)} [{document_string(found[0])}, "
            f"{document_string(found[1])}]",
        )
    return found[0] if found else None


class _PreparedDocuments:
    """updateLookup answers fetched for one (db, coll, UUID) before a push."""

    __slots__ = ("error", "gone", "ids", "by_id", "by_key")

    def __init__(self) -> None:
        self.error: Exception | None = None  # raised when the stage asks, as the sync path
        self.gone = False  # the collection's UUID is not the event's: every answer is null
        self.ids: set[bytes] = set()  # the `_id`s asked for (equality keys)
        self.by_id: dict[bytes, list[Document]] = {}
        self.by_key: dict[bytes, list[Document]] = {}  # documentKeys without `_id`

    def answer(self, keys: Sequence[Document]) -> list[Document | None] | None:
        """The answers for `keys`, or None when one of them was not fetched."""
        if self.error is not None:
            raise self.error
        if self.gone:
            return [None] * len(keys)
        candidates: list[list[Document]] = []
        for key in keys:
            if "_id" in key:
                k = equality_key(key["_id"])
                if k not in self.ids:
                    return None
                candidates.append(self.by_id.get(k, []))
            else:
                found = self.by_key.get(equality_key(key))
                if found is None:
                    return None
                candidates.append(found)
        return [_one_match(key, c) for key, c in zip(keys, candidates)]


class PreparedImages:
    """What `UpstreamImages.prepare` fetched for one batch. A lookup it covers is answered from
    here (absent here: absent upstream at lookup time); its errors are raised only when the
    stage asks for what failed, so a stream meets exactly the errors of a synchronous lookup."""

    __slots__ = ("pre_error", "pre_asked", "pre_images", "documents")

    def __init__(self) -> None:
        self.pre_error: Exception | None = None
        self.pre_asked: set[tuple[bytes, Timestamp, int]] = set()
        self.pre_images: dict[tuple[bytes, Timestamp, int], Document] = {}
        self.documents: dict[tuple[str, str, bytes | None], _PreparedDocuments] = {}


class UpstreamImages:
    """`ImageSource` reading the upstream, each lookup bounded by `lookup_timeout_ms`; a failure
    is a resumable error for the stream.

    The pipeline asks synchronously, so before a batch is pushed into a pipeline with an image
    stage, the caller awaits `prepare(image_lookups(pipeline, entries))` (AsyncMongoClient:
    one `find {_id: {$in}}` per namespace and one on config.system.preimages, concurrently)
    and pushes inside `answering(prepared)`: the stages are answered from what was fetched and
    the event loop is never held by a lookup. A lookup `prepare` did not cover (nothing
    prepared it) falls back to a synchronous query, as before."""

    def __init__(self, source: UpstreamOplog) -> None:
        self.source = source
        # (db, coll) -> (uuid bytes or None, read at (monotonic), DDL generation)
        self._uuids: dict[tuple[str, str], tuple[bytes | None, float, int]] = {}
        self._prepared: PreparedImages | None = None
        self.queries = 0  # round trips made (tests check batching)
        self.sync_lookups = 0  # calls answered by a synchronous query (held the loop)

    def _timeout(self) -> Any:
        import pymongo

        return pymongo.timeout(self.source.options.lookup_timeout_ms / 1000)

    # -- prepared, asynchronous -----------------------------------------------------------------

    @contextlib.contextmanager
    def answering(self, prepared: PreparedImages | None) -> Any:
        """Answer from `prepared` during a (synchronous) push."""
        previous, self._prepared = self._prepared, prepared
        try:
            yield
        finally:
            self._prepared = previous

    async def prepare(self, lookups: Any) -> PreparedImages | None:
        """Fetch what `lookups` (pipeline_stages.image_lookups.ImageLookups) names."""
        if not lookups:
            return None
        prepared = PreparedImages()
        jobs = []
        if lookups.pre_images:
            jobs.append(self._fetch_pre_images(prepared, lookups.pre_images))
        for ns, keys in lookups.documents.items():
            group = prepared.documents[ns] = _PreparedDocuments()
            jobs.append(self._fetch_documents(group, ns, keys))
        await asyncio.gather(*jobs)
        return prepared

    async def _fetch_pre_images(
        self, prepared: PreparedImages, ids: Sequence[Document]
    ) -> None:
        import pymongo

        what = "reading pre-images"
        prepared.pre_asked.update(_pre_image_key(i) for i in ids)
        ids = self._retained_pre_images(ids, prepared.pre_images)
        if not ids:
            return
        try:
            self.source.lookup_allowed(what)
            coll = self.source.async_client().config.get_collection(
                "system.preimages", codec_options=RAW
            )
            with self._timeout():
                self.queries += 1
                docs = await coll.find(
                    {"_id": {"$in": [_pre_image_query_id(i) for i in ids]}}
                ).to_list()
        except pymongo.errors.PyMongoError as exc:
            prepared.pre_error = self.source.lookup_error(what, exc)
            return
        except Exception as exc:  # noqa: BLE001 - lookup_allowed's, or what the sync path raises
            prepared.pre_error = exc
            return
        for doc in docs:
            image = doc.get("preImage")
            if isinstance(image, Mapping):
                prepared.pre_images[_pre_image_key(doc["_id"])] = image

    async def _fetch_documents(
        self,
        group: _PreparedDocuments,
        ns: tuple[str, str, bytes | None],
        keys: Sequence[Document],
    ) -> None:
        import pymongo

        db, coll, uuid = ns
        what = "looking up the current documents"
        try:
            self.source.lookup_allowed(what)
            with self._timeout():
                if uuid is not None and await self._collection_uuid_async(db, coll) != uuid:
                    group.gone = True
                    return
                collection = self.source.async_client()[db].get_collection(
                    coll, codec_options=RAW
                )
                ids = []
                for key in keys:
                    if "_id" in key:
                        k = equality_key(key["_id"])
                        if k not in group.ids:
                            group.ids.add(k)
                            ids.append(key["_id"])
                if ids:
                    self.queries += 1
                    docs = await collection.find({"_id": {"$in": ids}}).to_list()
                    for doc in docs:
                        group.by_id.setdefault(equality_key(doc["_id"]), []).append(doc)
                for key in keys:
                    if "_id" not in key:  # a documentKey without _id: its own query
                        self.queries += 1
                        found = await collection.find(dict(key), limit=2).to_list()
                        group.by_key[equality_key(key)] = found
        except pymongo.errors.PyMongoError as exc:
            group.error = self.source.lookup_error(what, exc)
        except Exception as exc:  # noqa: BLE001 - lookup_allowed's, or what the sync path raises
            group.error = exc

    def _cached_uuid(self, db: str, coll: str) -> tuple[bool, bytes | None]:
        cached = self._uuids.get((db, coll))
        if (
            cached is not None
            and cached[2] == self.source._ddl_generation
            and time.monotonic() - cached[1] < self.source.options.uuid_cache_s
        ):
            return True, cached[0]
        return False, None

    def _cache_uuid(self, db: str, coll: str, uuid: bytes | None, read_at: float,
                    generation: int) -> None:
        if len(self._uuids) > 10_000:
            self._uuids.clear()
        self._uuids[(db, coll)] = (uuid, read_at, generation)

    async def _collection_uuid_async(self, db: str, coll: str) -> bytes | None:
        hit, uuid = self._cached_uuid(db, coll)
        if hit:
            return uuid
        read_at, generation = time.monotonic(), self.source._ddl_generation
        self.queries += 1
        cursor = await self.source.async_client()[db].list_collections(filter={"name": coll})
        uuid = _uuid_of(await cursor.to_list())
        self._cache_uuid(db, coll, uuid, read_at, generation)
        return uuid

    # -- ImageSource (synchronous) --------------------------------------------------------------

    def pre_images(self, ids: Sequence[Document]) -> list[Document | None]:
        if not ids:
            return []
        prepared = self._prepared
        if prepared is not None:
            try:
                keys = [_pre_image_key(i) for i in ids]
            except (KeyError, TypeError, ValueError):
                keys = None  # not a pre-image id prepare could have fetched
            if keys is not None and all(k in prepared.pre_asked for k in keys):
                if prepared.pre_error is not None:
                    raise prepared.pre_error
                return [prepared.pre_images.get(k) for k in keys]
        return self._pre_images_now(ids)

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        if not keys:
            return []
        prepared = self._prepared
        if prepared is not None:
            group = prepared.documents.get((db, coll, None if uuid is None else bytes(uuid)))
            if group is not None:
                answer = group.answer(keys)
                if answer is not None:
                    return answer
        return self._current_documents_now(db, coll, uuid, keys)

    # -- synchronous fallback (holds the event loop) ----------------------------------------

    def _pre_images_now(self, ids: Sequence[Document]) -> list[Document | None]:
        import pymongo

        self.sync_lookups += 1
        retained: dict[tuple[bytes, Timestamp, int], Document] = {}
        missing = self._retained_pre_images(ids, retained)
        if not missing:
            return [retained.get(_pre_image_key(i)) for i in ids]
        wanted = [_pre_image_query_id(i) for i in missing]
        self.source.lookup_allowed("reading pre-images")
        coll = self.source.sync_client().config.get_collection(
            "system.preimages", codec_options=RAW
        )
        try:
            with self._timeout():
                self.queries += 1
                docs = list(coll.find({"_id": {"$in": wanted}}))
        except pymongo.errors.PyMongoError as exc:
            raise self.source.lookup_error("reading pre-images", exc) from None
        table = retained
        for doc in docs:
            image = doc.get("preImage")
            if isinstance(image, Mapping):
                table[_pre_image_key(doc["_id"])] = image
        return [table.get(_pre_image_key(i)) for i in ids]

    def _retained_pre_images(
        self, ids: Sequence[Document], table: dict[tuple[bytes, Timestamp, int], Document]
    ) -> list[Document]:
        """Answer from the retained log what it kept (into `table`); the ids left to ask the
        upstream for (it may still have what the log has not fetched yet)."""
        retained = self.source.retained
        if retained is None or not ids:
            return list(ids)
        keys = [_pre_image_key(i) for i in ids]
        found = retained.pre_images([pre_image_key(k[0], k[1], k[2]) for k in keys])
        if not found:
            return list(ids)
        missing = []
        for id_doc, key in zip(ids, keys):
            image = found.get(pre_image_key(key[0], key[1], key[2]))
            if image is None:
                missing.append(id_doc)
            else:
                table[key] = RawBSONDocument(image, codec_options=RAW)
        return missing

    def _collection_uuid(self, db: str, coll: str) -> bytes | None:
        hit, uuid = self._cached_uuid(db, coll)
        if hit:
            return uuid
        read_at, generation = time.monotonic(), self.source._ddl_generation
        self.queries += 1
        infos = list(self.source.sync_client()[db].list_collections(filter={"name": coll}))
        uuid = _uuid_of(infos)
        self._cache_uuid(db, coll, uuid, read_at, generation)
        return uuid

    def _current_documents_now(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        import pymongo

        self.sync_lookups += 1
        self.source.lookup_allowed("looking up the current documents")
        try:
            with self._timeout():
                if uuid is not None and self._collection_uuid(db, coll) != bytes(uuid):
                    return [None] * len(keys)
                collection = self.source.sync_client()[db].get_collection(
                    coll, codec_options=RAW
                )
                with_id = [k for k in keys if "_id" in k]
                docs: list[RawBSONDocument] = []
                if with_id:
                    ids, seen = [], set()
                    for key in with_id:
                        k = equality_key(key["_id"])
                        if k not in seen:
                            seen.add(k)
                            ids.append(key["_id"])
                    self.queries += 1
                    docs = list(collection.find({"_id": {"$in": ids}}))
                by_id: dict[bytes, list[Document]] = {}
                for doc in docs:
                    by_id.setdefault(equality_key(doc["_id"]), []).append(doc)
                out: list[Document | None] = []
                for key in keys:
                    if "_id" in key:
                        candidates = by_id.get(equality_key(key["_id"]), [])
                    else:  # a documentKey without _id: its own query
                        self.queries += 1
                        candidates = list(collection.find(dict(key), limit=2))
                    out.append(_one_match(key, candidates))
                return out
        except pymongo.errors.PyMongoError as exc:
            raise self.source.lookup_error("looking up the current documents", exc) from None
