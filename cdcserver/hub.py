"""Shared work between change-stream cursors.

The source is read once for everyone (`sources/base.py` keeps a window of decoded entries).
On top of that, cursors with the same spec opened at the same position form a `StreamGroup`:
one producer pipeline filters, transforms and encodes each entry once, and every member
queues the result (references to the same encoded events). Each member keeps its own
batches, post-batch token and position, so members can consume at different speeds.

A member that falls too far behind the others is detached: it gets a pipeline of its own,
resumed from the last token it returned, and reads the oplog at its own pace, so a slow
consumer never makes the server hold an unbounded queue for it.

Every read goes through `StreamGroup.read`: when the capped oplog has dropped the group's place
(the last entry it saw, and perhaps entries it has not read), the read fails with
CappedPositionLost, as mongod's tailable oplog scan does, instead of going on after a gap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from bson.timestamp import Timestamp

from cdcserver.sources.base import CappedPositionLost
from pipeline_stages import resume_token
from pipeline_stages.filter_index import FilterGroup, group_key, ready_to_join
from pipeline_stages.lookups import LookupAnswers, NeedsLookup, looks_up_images
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import ChangeStreamSpec

if TYPE_CHECKING:
    from cdcserver.sources.base import OplogLog
    from pipeline_stages.oplog_entry import Entry


class GroupMember(Protocol):
    """What the hub needs of a cursor it reads for (`cursors.ChangeStreamCursor` is one): its
    pipeline and its group, which the hub replaces when it detaches or rejoins the member."""

    pipeline: ChangeStreamPipeline
    group: StreamGroup
    closed: bool
    draining: bool  # the server shuts down: its waiting getMore answers now

# Events a member may have queued and not yet returned before it is detached.
MAX_MEMBER_LAG = 10_000
READ_CHUNK = 1000
# How long a group's reader waits on the source before looking at its waiters again.
READER_IDLE_S = 1.0


def wants_more(pipeline: ChangeStreamPipeline, want: int | None) -> bool:
    """Whether a batch of `want` events (None: as many as fill a reply, a getMore without
    batchSize) needs more than `pipeline` has queued."""
    if want is None:
        return not pipeline.pending_fills()
    return pipeline.pending_count < want


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def prev_ts(ts: Timestamp) -> Timestamp:
    if ts.inc:
        return Timestamp(ts.time, ts.inc - 1)
    return Timestamp(ts.time - 1, 0xFFFFFFFF) if ts.time else ts


def shareable_key(spec: ChangeStreamSpec) -> bytes | None:
    """What must be equal for two streams to share a producer; None for streams that start from
    a token or an operation time (their first events depend on where they start)."""
    if (
        spec.resume_after is not None
        or spec.start_after is not None
        or spec.start_at_operation_time is not None
    ):
        return None
    # Streams that differ only in their user stages share a filter group (filter_index.py).
    return group_key(spec)


class _Members:
    """A group's cursors, by their pipelines (a member reached by an entry is found without
    looking at the others); joining or leaving also joins or leaves the filter group."""

    def __init__(self, group: StreamGroup) -> None:
        self._group = group
        self.by_pipeline: dict[ChangeStreamPipeline, GroupMember] = {}

    def append(self, cursor: GroupMember) -> None:
        self.by_pipeline[cursor.pipeline] = cursor
        fanout = self._group.fanout
        if fanout is not None:
            fanout.add(cursor.pipeline)

    def remove(self, cursor: GroupMember) -> None:
        pipeline = cursor.pipeline
        if self.by_pipeline.get(pipeline) is cursor:
            del self.by_pipeline[pipeline]
            fanout = self._group.fanout
            if fanout is not None:
                fanout.remove(pipeline)

    def __contains__(self, cursor: object) -> bool:
        pipeline = getattr(cursor, "pipeline", None)
        return pipeline is not None and self.by_pipeline.get(pipeline) is cursor

    def __iter__(self) -> Any:
        return iter(list(self.by_pipeline.values()))

    def __len__(self) -> int:
        return len(self.by_pipeline)

    def __bool__(self) -> bool:
        return bool(self.by_pipeline)


class StreamGroup:
    def __init__(
        self,
        key: bytes | None,
        producer: ChangeStreamPipeline,
        log: OplogLog,
        start: Timestamp,
        last_seen: Timestamp | None = None,
        fanout: FilterGroup | None = None,
    ) -> None:
        self.key = key
        # With a filter group: its producer, shared by every member; else the one member's own
        # pipeline (a stream with a resume point, until it has read past it).
        self.fanout = fanout
        self.producer = producer if fanout is None else fanout.producer
        self.hub: Hub | None = None
        # awaitData getMores waiting for this group's members, and the one task that waits on
        # the source for them (filter groups only).
        self._waiters: dict[GroupMember, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._expiries: AwaitExpiries | None = None  # their maxTimeMS, one timer for all
        self.log = log
        self.next_ts = start  # the first ts the producer has not read
        # The last entry read (mongod's "last seen record"); before the first read, the place
        # just before the start.
        self.last_seen = prev_ts(start) if last_seen is None else last_seen
        self.members = _Members(self)

    def read(self, chunk: int) -> list[Entry]:
        """Up to `chunk` entries from the group's position. CappedPositionLost when the capped
        oplog dropped the group's place: reading on would silently skip what was dropped."""
        if self.log.position_lost(self.next_ts):
            raise CappedPositionLost(self.last_seen)
        return self.log.read_from(self.next_ts, chunk)

    def check_failed(self) -> None:
        """At the end of what the source holds: SourceFailed if it will never hold more (the
        entries before the failure have all been read by then)."""
        failure = self.log.failure()
        if failure is not None:
            raise failure

    def pull(self, want: int | None, member: GroupMember) -> NeedsLookup | None:
        """Read the oplog until `member` has `want` events queued (None: a reply's 16 MiB of
        them) or the oplog is exhausted; every member gets what the producer made. Stops at a
        chunk that needs lookups and returns what they are (nothing of that chunk ran:
        `step_answering` pushes it)."""
        while (
            wants_more(member.pipeline, want)
            and not self.producer.invalidated
            and member.pipeline.error is None
        ):
            stepped = self.step(member, READ_CHUNK)
            if isinstance(stepped, NeedsLookup):
                return stepped
            if not stepped:
                self.caught_up(member)
                break
        return None

    def caught_up(self, member: GroupMember) -> None:
        """`member` read all there is: reading by itself, it may share a group from here on."""
        if self.fanout is None and self.hub is not None:
            self.hub.rejoin(member)

    def step(
        self,
        member: GroupMember,
        chunk: int,
        entries: list[Entry] | None = None,
        answers: LookupAnswers | None = None,
    ) -> bool | NeedsLookup:
        """Read up to `chunk` entries for every member (`member` is the one reading); False
        when there was nothing to read. `entries`: the ones at `next_ts`, already read, pushed
        with `answers` (what was looked up for them: `step_answering`). A NeedsLookup: the
        push needs lookups first; nothing moved."""
        producer = self.producer
        if entries is None:
            latest = self.log.latest_ts()
            if latest is None or latest < self.next_ts:
                self.check_failed()
                return False  # nothing new: an idle getMore's common case, without a search
            entries = self.read(chunk)
        if not entries:
            return False
        last = entries[-1]["ts"]
        fanout = self.fanout
        if fanout is not None:
            # Only members that got something.
            pushed = fanout.push(entries, scanned_to=last, answers=answers)
            if isinstance(pushed, NeedsLookup):
                return pushed
            reached = pushed
        else:
            needs = producer.push(entries, scanned_to=last, answers=answers)
            if needs is not None:
                return needs
            reached = [producer]
        self.next_ts = next_ts(last)
        self.last_seen = last
        self._reached(reached, member)
        return True

    def _reached(
        self, pipelines: list[ChangeStreamPipeline], reader: GroupMember | None
    ) -> None:
        """Wake the getMores of members that got something; detach those too far behind."""
        by_pipeline = self.members.by_pipeline
        waiters = self._waiters
        for pipeline in pipelines:
            cursor = by_pipeline.get(pipeline)
            if cursor is None:
                continue
            if cursor is not reader and pipeline.pending_count > MAX_MEMBER_LAG:
                detach(cursor)
            future = waiters.pop(cursor, None)
            if future is not None and not future.done():
                future.set_result(None)

    def remove(self, member: GroupMember) -> None:
        if member in self.members:
            self.members.remove(member)
        future = self._waiters.pop(member, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, cursor: GroupMember, timeout: float) -> None:
        """Return once the group has read something for `cursor` (an event, the invalidate, an
        error), the server drains, or after `timeout` seconds. In a filter group one task
        waits on the source for all members and wakes only those an entry reached, so a write
        does not wake the getMores of streams it does not reach."""
        producer = self.producer
        if self.fanout is None or looks_up_images(producer):
            # By itself, or its reads await lookups (a live upstream): the getMore reads for
            # itself when the source grows, bounded by its own lookups' timeouts.
            await self.log.wait_for_entries(self.next_ts, timeout)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters[cursor] = future
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._read_for_waiters())
        expiries = self._expiries
        if expiries is None or expiries.loop is not loop:
            expiries = self._expiries = AwaitExpiries(loop)
        expiries.add(future, timeout)
        try:
            await future  # raises what the reader met on this group's read (a failed lookup)
        finally:
            if self._waiters.get(cursor) is future:
                del self._waiters[cursor]
            reader = self._reader
            if not self._waiters and reader is not None and not reader.done():
                reader.cancel()  # nobody waits: no task left behind
                self._reader = None

    async def _read_for_waiters(self) -> None:
        """Read the source as it grows, for as long as some member's getMore waits."""
        waiters = self._waiters
        while waiters:
            await self.log.wait_for_entries(self.next_ts, READER_IDLE_S)
            if waiters and next(iter(waiters)).draining:  # shutdown: everyone answers now
                self._wake_all()
                return
            try:
                read = False
                while waiters and await self._step_for_waiters():
                    read = True
                    await asyncio.sleep(0)  # let woken getMores (and everyone else) run
            except CappedPositionLost:
                self._wake_all()  # each getMore reads again and reports it in its own words
                return
            except Exception as exc:  # noqa: BLE001 - every waiting member met it
                self._wake_all(exc)
                return
            if not read:
                await asyncio.sleep(0.001)  # the source said ready but had nothing: no spin

    async def _step_for_waiters(self) -> bool:
        return await step_answering(self, None, READ_CHUNK)

    def _wake_all(self, error: BaseException | None = None) -> None:
        for future in self._waiters.values():
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        self._waiters.clear()


async def step_answering(
    group: StreamGroup,
    member: GroupMember | None,
    chunk: int,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """`StreamGroup.step` for a chunk whose push may need lookups (lookups.py): each time it
    says what it needs, that is fetched from the source (awaited: every other stream and
    connection is served meanwhile) and the chunk is pushed again with the answers. False
    when there was nothing to read (or `stop()` says to stop); True when something moved
    (the group read on, here or, while this one awaited, by another reader)."""
    producer = group.producer
    start = group.next_ts
    latest = group.log.latest_ts()
    if latest is None or latest < start:
        group.check_failed()
        return False
    entries = group.read(chunk)
    if not entries:
        return False
    answers: LookupAnswers | None = None
    while True:
        stepped = group.step(member, chunk, entries, answers)  # type: ignore[arg-type]
        if not isinstance(stepped, NeedsLookup):
            return stepped
        if answers is None:
            answers = LookupAnswers()
        await group.log.fetch_lookups(stepped, answers)
        if answers.missing(stepped):
            raise RuntimeError(f"the source left lookups unanswered: {stepped!r}")
        if (member is not None and (member.closed or member.group is not group)) or (
            stop is not None and stop()
        ):
            return False
        if group.producer is not producer or group.next_ts != start:
            return True  # another reader pushed these meanwhile: look again from where it is


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# A group's awaitData deadlines are kept in ticks of this many seconds: a getMore with nothing
# to return answers within a tick after its maxTimeMS, and one loop timer serves every getMore
# ending in the same tick (not a timer each, set and cancelled on every getMore).
EXPIRY_TICK_S = 0.01
# Expired getMores answered per loop turn. Between two slices the loop reads its sockets, so a
# write arriving while thousands of idle streams expire together (they poll in phase) reaches
# its stream's getMore after one slice, not after all of them.
EXPIRY_SLICE = 64


class AwaitExpiries:
    """The maxTimeMS deadlines of one group's waiting getMores, bucketed by tick, on one timer.

    A getMore answered before its deadline (an event reached it) leaves its resolved future in
    its bucket until the tick comes; the tick skips it. So an idle stream costs one list slot
    per getMore and nothing on the loop's timer heap.
    """

    __slots__ = ("_due", "_resolving", "_ticks", "_timer", "_timer_tick", "buckets", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buckets: dict[int, list[asyncio.Future[None]]] = {}
        self._ticks: list[int] = []  # heap of the buckets' ticks
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick: int | None = None
        self._due: deque[asyncio.Future[None]] = deque()
        self._resolving = False

    def add(self, future: asyncio.Future[None], timeout: float) -> None:
        """Resolve `future` (if nothing else has) once `timeout` seconds have passed."""
        tick = math.ceil((self.loop.time() + max(timeout, 0.0)) / EXPIRY_TICK_S)
        bucket = self.buckets.get(tick)
        if bucket is None:
            bucket = self.buckets[tick] = []
            heapq.heappush(self._ticks, tick)
            if self._timer_tick is None or tick < self._timer_tick:
                self._arm(tick)
        bucket.append(future)

    def pending(self) -> int:
        """Futures still waiting for their tick (tests, metrics)."""
        return sum(1 for b in self.buckets.values() for f in b if not f.done())

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_tick = tick
        self._timer = self.loop.call_at(tick * EXPIRY_TICK_S, self._fire)

    def _fire(self) -> None:
        fired = self._timer_tick
        self._timer = self._timer_tick = None
        # The loop may run a timer up to its clock resolution early: the armed tick is due.
        now_tick = max(fired or 0, math.floor(self.loop.time() / EXPIRY_TICK_S))
        ticks, buckets, due = self._ticks, self.buckets, self._due
        while ticks and ticks[0] <= now_tick:
            for future in buckets.pop(heapq.heappop(ticks), ()):
                if not future.done():
                    due.append(future)
        if ticks:
            self._arm(ticks[0])
        if due and not self._resolving:
            self._resolving = True
            self._resolve_slice()

    def _resolve_slice(self) -> None:
        due = self._due
        for _ in range(min(EXPIRY_SLICE, len(due))):
            future = due.popleft()
            if not future.done():
                future.set_result(None)
        if due:
            self.loop.call_soon(self._resolve_slice)
        else:
            self._resolving = False


def detach(member: GroupMember) -> None:
    """Give `member` its own pipeline, resumed after the last event it returned."""
    group = member.group
    group.remove(member)
    token = member.pipeline.post_batch_resume_token
    data = resume_token.decode(token)
    spec = dataclasses.replace(
        member.pipeline.spec,
        resume_after=dict(token),
        start_after=None,
        start_at_operation_time=None,
        resume_token=data,
    )
    old = member.pipeline
    pipeline = ChangeStreamPipeline(
        spec, data.cluster_time, history=old.history, images=old.images
    )
    member.pipeline = pipeline
    # It reads on from its token (the events queued after it are dropped and read again): if
    # the oplog no longer has the token's entry, its first read fails (CappedPositionLost).
    member.group = StreamGroup(
        None, pipeline, group.log, data.cluster_time, last_seen=data.cluster_time
    )
    member.group.hub = group.hub  # to rejoin a filter group once it has caught up
    member.group.members.append(member)


# A group this many chunks behind a new stream's start is not caught up for it (the command
# would hold the loop); the stream starts a group of its own.
MAX_CATCH_UP_CHUNKS = 4


def _catch_up(group: StreamGroup, start: Timestamp) -> None:
    """Read `group` on up to `start` if that is a few chunks and needs no awaited lookups."""
    producer = group.producer
    if looks_up_images(producer):
        return
    try:
        for _ in range(MAX_CATCH_UP_CHUNKS):
            # (a chunk needing lookups, of transaction history, is left to the members)
            if group.next_ts >= start or group.step(None, READ_CHUNK) is not True:  # type: ignore[arg-type]
                return
    except Exception:  # noqa: BLE001 - its members' getMores read the same entries and say so
        return


class Hub:
    """Groups of streams that differ only in their filters, per source."""

    def __init__(self) -> None:
        self.groups: dict[bytes, list[StreamGroup]] = {}

    def group_for(
        self,
        spec: ChangeStreamSpec,
        start: Timestamp,
        log: OplogLog,
        make_pipeline: Any,
        variant: bytes = b"",
    ) -> tuple[StreamGroup, ChangeStreamPipeline]:
        """The group a new stream joins (or a new one) and the stream's own pipeline.

        A new stream joins a group with the same spec whose producer has read exactly up to
        the stream's start: everything the producer makes from then on is what the new
        stream's own pipeline would have made. Streams of another `variant` (a front's part
        of a merged stream, whose lookups go through the router) never share with these.
        """
        key = shareable_key(spec)
        if key is not None and variant:
            key = variant + b"\x00" + key
        if key is not None:
            for group in self.groups.get(key, []):
                if self._joinable(group, log, start):
                    return group, make_pipeline()
        pipeline = make_pipeline()
        if key is None:
            # Nothing to share yet: the stream's own pipeline is the producer, until it has
            # read past its resume point (`rejoin`).
            group = StreamGroup(key, pipeline, log, start)
            group.hub = self
            return group, pipeline
        return self._new_group(key, spec, start, log, pipeline), pipeline

    @staticmethod
    def _joinable(group: StreamGroup, log: OplogLog, start: Timestamp) -> bool:
        """Whether a stream starting at `start` can join `group`: same source, members left,
        and (after catching it up, reads it would read anyway) a live producer exactly at
        `start`. The invalidated check comes after the catch-up: the entries read to catch up
        may invalidate the producer (a drop its idle members never read), and a producer that
        is invalidated ignores every later entry, so a stream joining it would never get one."""
        if group.log is not log or group.producer.invalidated or not group.members:
            return False
        if group.next_ts < start:
            _catch_up(group, start)
        return group.next_ts == start and not group.producer.invalidated

    def _new_group(
        self,
        key: bytes,
        spec: ChangeStreamSpec,
        start: Timestamp,
        log: OplogLog,
        like: ChangeStreamPipeline,
    ) -> StreamGroup:
        fanout = FilterGroup(spec, start, history=like.history, images=like.images)
        group = StreamGroup(key, fanout.producer, log, start, fanout=fanout)
        group.hub = self
        self.groups.setdefault(key, []).append(group)
        return group

    def rejoin(self, cursor: GroupMember) -> None:
        """A stream reading by itself (resumed, or detached) that has caught up with the source
        and read past its resume point joins a filter group at its position (a new one if
        none is there): from then on its events cost nothing when a write does not reach it."""
        group = cursor.group
        pipeline = cursor.pipeline
        if group.fanout is not None or group.next_ts != next_ts(group.last_seen):
            return
        if not ready_to_join(pipeline, group.last_seen):
            return
        key = group_key(pipeline.spec)
        target = None
        for candidate in self.groups.get(key, []):
            if self._joinable(candidate, group.log, group.next_ts):
                target = candidate
                break
        if target is None:
            target = self._new_group(key, pipeline.spec, group.next_ts, group.log, pipeline)
        group.remove(cursor)
        cursor.group = target
        target.members.append(cursor)

    def forget_empty(self) -> None:
        for key, groups in list(self.groups.items()):
            kept = [g for g in groups if g.members]
            if kept:
                self.groups[key] = kept
            else:
                del self.groups[key]
