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
* History behind the live window, and transaction entries: `mongo_history.py`.
* Images (pre-images, updateLookup documents): `mongo_images.py`. Neither is ever read in the
  middle of a push: the push says what it needs (pipeline_stages/lookups.py) and the server
  awaits `fetch_lookups` before pushing again, so a lookup never holds the event loop.

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
from collections.abc import Mapping
from typing import Any, cast

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.sources.base import DECODED_WINDOW, EntryList, OplogLog
from cdcserver.sources.mongo_common import (
    CLOSE_TIMEOUT_S,
    MAX_TS,
    RAW,
    UpstreamError,
    UpstreamOptions,
    close_cursor,
    next_batch,
    next_ts,
    upstream_unavailable,
)
from cdcserver.sources.mongo_history import UpstreamHistory
from cdcserver.sources.mongo_images import UpstreamImages, pre_image_query_id, pre_image_tuple
from cdcserver.sources.retained import (
    RetainedLog,
    RetainedWriteError,
    pre_image_ids,
    pre_image_key,
)
from cdcserver.sources.upstream_version import UpstreamVersion
from pipeline_stages.lookups import LookupAnswers, NeedsLookup
from pipeline_stages.oplog_entry import Entry, decode_entry
from pipeline_stages.release import Release, release_for_upstream

log = logging.getLogger(__name__)

# Pre-image ids waiting to be fetched into the retained log (bounded: memory).
PRE_IMAGE_QUEUE = 100_000
PRE_IMAGE_REQUEUE = 10_000  # newest retained entries whose pre-images a restart asks again
# The longest wait between retries of an append the retained log refused: a refused write is
# cheap, and freed space should be used within about a second.
RETAIN_RETRY_MAX_S = 1.0


def _majority_ts(hello: Mapping[str, Any]) -> Timestamp | None:
    last_write = hello.get("lastWrite")
    if not isinstance(last_write, Mapping):
        return None
    op_time = last_write.get("majorityOpTime")
    ts = op_time.get("ts") if isinstance(op_time, Mapping) else None
    return ts if isinstance(ts, Timestamp) else None


class UpstreamOplog(EntryList, OplogLog):
    """The upstream replica set's oplog: a live window near the head, history on demand."""

    def __init__(self, options: UpstreamOptions | str) -> None:
        super().__init__()
        if isinstance(options, str):
            options = UpstreamOptions(uri=options)
        self.options = options
        self.images = UpstreamImages(self)
        self._client: Any = None  # AsyncMongoClient, made on the serving loop
        self._sync_client: Any = None  # MongoClient for `prime` (before serving)
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
        self.history = UpstreamHistory(self)  # history readers, transaction entries
        self._majority_wanted = asyncio.Event()
        self._ready = asyncio.Event()  # the majority commit point is known
        self.connected = False  # the tail is reading (for serverStatus and tests)
        self.reconnects = 0
        self._close_by: float | None = None  # closing's deadline, set by its first step
        self._down_since: float | None = None  # when the tail was lost (None: it reads)
        self._attempts = 0  # reconnect attempts in this outage
        self.gaps = 0  # times the tail found its position gone from the upstream
        # The upstream's release, from its hello (None until one answered): the sidecar
        # answers as that release and follows a binary upgrade seen on a later hello.
        self._release: Release | None = None
        # Its FCV and the entries of releases the sidecar does not know (upstream_version.py).
        self.version = UpstreamVersion()
        self._tasks: list[asyncio.Task[Any]] = []
        self.ddl_generation = 0  # bumped by every command entry (UUID cache)
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
        # Retrying appends the log refused (a full disk): when, and the next backoff.
        self._retain_retry_at = 0.0
        self._retain_backoff = options.backoff_initial_ms / 1000
        self._retain_retry_wanted = asyncio.Event()
        if options.retain_dir:
            self.retained = RetainedLog(
                options.retain_dir, options.retain_mb, options.retain_hours
            )
            last = self.retained.last_ts()
            if last is not None:
                self._cluster_time = last

    @property
    def down_since(self) -> float | None:
        """When the tail was lost (time.monotonic()), None while it reads."""
        return self._down_since

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
        """A MongoClient for `prime`, which runs before serving (nothing on the serving loop
        uses it: lookups are awaited, with the async client)."""
        if self._sync_client is None:
            from pymongo import MongoClient

            self._sync_client = MongoClient(self.options.uri, **self._client_options())
        return self._sync_client

    def oplog_collection(self, client: Any) -> Any:
        return client.local.get_collection("oplog.rs", codec_options=RAW)

    def _close_budget(self) -> float:
        """Seconds left to talk to the upstream while closing: CLOSE_TIMEOUT_S from the first
        step for all of them (the tail's and history readers' cursors, then the clients)."""
        now = time.monotonic()
        if self._close_by is None:
            self._close_by = now + CLOSE_TIMEOUT_S
        return max(0.0, self._close_by - now)

    async def close_own_cursor(self, cursor: Any) -> None:
        """A task's cursor: within the close budget when the task is being cancelled (the
        source closes), within CLOSE_TIMEOUT_S otherwise (a reconnect)."""
        task = asyncio.current_task()
        closing = task is not None and task.cancelling() > 0
        await close_cursor(cursor, self._close_budget() if closing else CLOSE_TIMEOUT_S)

    async def aclose(self) -> None:
        """Stop the tail's tasks and close the clients, talking to the upstream for at most
        CLOSE_TIMEOUT_S in all (`_close_budget`)."""
        import pymongo

        tasks = [*self._tasks, *self.history.tasks()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        self.history.segments.clear()
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
        return self.history.read(start, limit)

    def entry_at(self, ts: Timestamp) -> Entry | None:
        entry = EntryList.entry_at(self, ts)
        if entry is not None:
            return entry
        entry = self.history.entry_at(ts)
        if entry is not None:
            return entry
        if self.retained is not None and self.retained.covers(ts):
            entry = self.retained.entry_at(ts)
            if entry is not None:
                return entry
        # Not in memory: the push says it needs it (fetch_lookups reads it), never read here.
        raise self.history.missing_entry(ts)

    async def fetch_lookups(self, needs: NeedsLookup, answers: LookupAnswers) -> None:
        """Read what a push said it needs (images, transaction entries) into `answers`,
        concurrently; a lookup's failure is recorded as its answer."""
        await asyncio.gather(
            self.images.fetch(needs, answers),
            self.history.fetch_oplog_entries(needs.oplog_entries, answers),
        )

    @property
    def _segments(self) -> list[Any]:
        """The open history readers (status, tests)."""
        return self.history.segments

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
        return self.history.readable(start)

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
            "historyReaders": len(self.history.segments),
            "upstreamOldest": None if self._oldest is None else self._oldest["ts"],
            "retained": None if self.retained is None else self.retained.status(),
        }

    # -- the tail -------------------------------------------------------------------------------

    @property
    def majority_commit_point(self) -> Timestamp | None:
        """The upstream's majority commit point, as last read (None: not yet known)."""
        return self._majority

    async def until_ready(self) -> None:
        """Return once the majority commit point is known (history readers wait for it)."""
        await self._ready.wait()

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
                oplog = self.oplog_collection(client)
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
            self._tasks.append(asyncio.create_task(self._retain_retry_loop()))
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
                await self._reconnect_pause(backoff * random.uniform(0.5, 1.0))
        finally:
            await self.aclose()

    async def _reconnect_pause(self, delay: float) -> None:
        """The backoff before the tail's next attempt (the sharded sidecar's shard tail cuts
        it short when the shard list gives its shard another host)."""
        await asyncio.sleep(delay)

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

    def upstream_release(self) -> Release | None:
        return self._release

    def upstream_fcv(self) -> dict[str, Any] | None:
        return self.version.fcv

    def _note_release(self, hello: Mapping[str, Any]) -> None:
        """Take the release an upstream's hello shows (its maxWireVersion)."""
        wire = hello.get("maxWireVersion")
        release = release_for_upstream(None, wire if isinstance(wire, int) else None)
        if release is not self._release:
            if self._release is not None:
                log.warning("the upstream now answers as MongoDB %s (maxWireVersion %s); "
                            "the sidecar answers as %s from now on", release.name, wire,
                            release.name)
            self._release = release

    async def _initial_position(self, client: Any) -> None:
        """Start at the upstream's majority commit point (its current time for a stream)."""
        hello = await client.admin.command("hello")
        self._note_release(hello)
        await self.version.refresh(client)
        majority = _majority_ts(hello)
        if majority is None:
            log.warning(
                "the upstream's hello has no lastWrite.majorityOpTime: every entry read is "
                "delivered at once (nothing can be held back until majority-committed)"
            )
            self._majority = MAX_TS
            newest = await self.oplog_collection(client).find(
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
        await self.version.refresh(client)
        oplog = self.oplog_collection(client)
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
            oldest = await self.refresh_oldest(client)
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
            pre_image_key(pre_image_tuple(i)[0], i["ts"], int(i["applyOpsIndex"])) for i in ids
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
                    {"_id": {"$in": [pre_image_query_id(i) for i in ids]}}
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
            await self.refresh_oldest(client)
        from pymongo import CursorType

        start = self._resume_ts
        assert start is not None
        cursor = self.oplog_collection(client).find(
            self._tail_filter(start),
            cursor_type=CursorType.TAILABLE_AWAIT,
            batch_size=self.options.batch_size,
        ).max_await_time_ms(int(self.options.max_await_ms))
        progressed = False
        try:
            checked = False
            while True:
                batch = await next_batch(cursor)
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
                        await asyncio.sleep(0.05)  # the retry task writes when it can
        finally:
            await self.close_own_cursor(cursor)

    def _tail_filter(self, start: Timestamp) -> dict[str, Any]:
        """The tail's query: every entry from the resume point (the sharded sidecar's shard
        tails leave out the no-ops its own reads make the shards write)."""
        return {"ts": {"$gte": start}}

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
        oldest = await self.refresh_oldest(client)
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
            raw = cast(bytes, doc.raw)  # pymongo: bytes | memoryview (mongo_common.RAW)
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
            done = self._deliver(pending[:k])
            del pending[:done]
            if done < k:
                return  # the rest not retained (the disk refuses): kept, retried later
        if pending:
            self._majority_wanted.set()

    def _deliver(self, items: list[tuple[Timestamp, bytes, Entry]]) -> int:
        """Make `items` (majority-committed, ascending) readable; with the durable log, only
        once they are retained. Returns how many were (a prefix: the log refused the rest)."""
        retained = self.retained
        if retained is not None:
            if retained.failing is not None and time.monotonic() < self._retain_retry_at:
                return 0  # refused a moment ago: the retry task tries again (backoff)
            try:
                retained.append([(ts, raw) for ts, raw, _ in items])
            except RetainedWriteError:
                self._retain_refused()
                last = retained.last_ts()
                n = 0
                while n < len(items) and last is not None and items[n][0] <= last:
                    n += 1
                if n:
                    self._deliver_retained(items[:n])
                return n
            self._retain_backoff = self.options.backoff_initial_ms / 1000
        self._deliver_retained(items)
        return len(items)

    def _retain_refused(self) -> None:
        """The log refused an append: the retry task tries again after a backoff (doubling,
        up to RETAIN_RETRY_MAX_S), so a full disk is probed, not hammered."""
        self._retain_retry_at = time.monotonic() + self._retain_backoff
        self._retain_backoff = min(self._retain_backoff * 2, RETAIN_RETRY_MAX_S)
        self._retain_retry_wanted.set()

    async def _retain_retry_loop(self) -> None:
        """While the log refuses appends: retry the pending entries at the backoff's pace.
        Once a retry succeeds, `_deliver_committed` writes the whole backlog (every chunk the
        disk takes), and the tail reads on at full speed."""
        retained = self.retained
        assert retained is not None
        while True:
            await self._retain_retry_wanted.wait()
            await asyncio.sleep(max(0.0, self._retain_retry_at - time.monotonic()))
            if retained.failing is None or not self._pending:
                self._retain_retry_wanted.clear()
                continue
            self._retain_retry_wanted.clear()
            self._deliver_committed()  # a refusal sets the event again

    def _deliver_retained(self, items: list[tuple[Timestamp, bytes, Entry]]) -> None:
        retained = self.retained
        if retained is not None:
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
                if coll == "system.version" and db == "admin":
                    self.version.note_version_write(entry)
            elif op == "c":
                self.ddl_generation += 1
                self.version.note_command(entry, self._release)
            elif op != "n":
                self.version.note_unknown_op(entry, self._release)
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

    async def _before_majority_poll(self) -> None:
        """Before a `hello` for the commit point: a subclass may learn it another way first
        (the sharded sidecar: the reply of its own `w: majority` no-op)."""

    async def _majority_loop(self) -> None:
        """While entries wait for the commit point: ask `hello` where it is."""
        from pymongo import ReadPreference

        base = self.options.majority_poll_ms / 1000
        interval = base
        backoff = self.options.backoff_initial_ms / 1000
        while True:
            await self._majority_wanted.wait()
            await self._before_majority_poll()
            pending = self._pending
            if not pending or (self._majority is not None and pending[-1][0] <= self._majority):
                self._majority_wanted.clear()  # the commit point was learnt otherwise
                continue
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
            self._note_release(hello)
            if self.version.stale:  # a delta of the FCV document passed (or never read)
                await self.version.refresh(self.async_client())
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
            self.history.close_idle(now)
            if self.retained is not None:
                if self.retained.failing is not None and self._pending:
                    self._deliver_committed()  # retry what the disk refused
                else:
                    with contextlib.suppress(RetainedWriteError):
                        self.retained.trim()  # age retention while no entries arrive
            if self.connected and now - last_oldest >= self.options.oldest_refresh_s:
                last_oldest = now
                try:
                    await self.refresh_oldest(self.async_client())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    log.debug("upstream oldest entry: %s", exc)

    async def refresh_oldest(self, client: Any) -> Entry | None:
        docs = await self.oplog_collection(client).find(
            {}, sort=[("$natural", 1)], limit=1
        ).to_list()
        if docs:
            oldest = decode_entry(docs[0].raw)
            if self._oldest is None or oldest["ts"] >= self._oldest["ts"]:
                self._oldest = oldest
        return self._oldest

    # -- lookups (mongo_history.py, mongo_images.py) -----------------------------------------

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
