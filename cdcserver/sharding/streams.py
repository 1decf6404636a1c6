"""Change streams through the front: one stream per shard, merged as mongos merges them.

Each shard runs the expanded `$changeStream` (with the user's stages) over its own oplog, as a
shard does for mongos, but without `EnsureResumeTokenPresent`: only the shard that wrote the
resumed event has it, so mongos checks the token on the merged stream (here too). The shards'
batches go into `pipeline_stages/merge.py` (`AsyncResultsMerger`'s sorted tailable merge);
an event leaves when every shard has promised past it.

A shard that has read its whole oplog promises a high-water mark at the cluster's next time
(`ClusterClock.next_ts`): its timestamps come from the cluster clock, so nothing it writes from
now on can sort before that. mongos cannot know that of a real shard before the shard's next
(periodic no-op) write, which is what makes sharded streams lag on idle shards; here an idle
shard never holds the others back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.context import ServerState
from cdcserver.cursors import (
    CHANGE_STREAM,
    DEFAULT_AWAIT_MS,
    DEFAULT_BATCH_SIZE,
    ChangeStreamCursor,
    GetMore,
    HeldHere,
    cursor_reply,
)
from cdcserver.sources.base import OplogLog
from pipeline_stages import resume_token
from pipeline_stages.ensure_resume_token_present import EnsureResumeTokenPresent
from pipeline_stages.image_source import ImageSource
from pipeline_stages.lookups import ExternalImages
from pipeline_stages.merge import ShardMerge
from pipeline_stages.pipeline import MAX_BATCH_BYTES, Batch, ChangeStreamPipeline
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.spec import ChangeStreamSpec

# Events asked of each shard per poll.
SHARD_BATCH = 1000
# The merge's participant for the cluster's shard list (a sidecar's; no events).
TOPOLOGY = "$topology"


class MergedShard(Protocol):
    """A shard as a merged stream reads it: its oplog and its server (whose hub runs its
    part of the stream)."""

    @property
    def name(self) -> str: ...

    @property
    def log(self) -> OplogLog: ...

    @property
    def state(self) -> ServerState: ...


class MergedCluster(Protocol):
    """What a merged stream needs of the cluster it merges: the embedded cluster
    (`ShardedCluster`), a sidecar's (`ShardedUpstream`), recorded shard oplogs
    (`RecordedShards`)."""

    @property
    def shards(self) -> Sequence[MergedShard]: ...

    @property
    def retired(self) -> Sequence[MergedShard]:
        """Shards removed, whose oplogs a stream from before their removal still reads."""
        ...

    def shard(self, name: str) -> MergedShard: ...

    def joined_at(self, name: str) -> Timestamp | None: ...

    def removed_at(self, name: str) -> Timestamp | None: ...

    def idle_promise(self, name: str) -> Timestamp:
        """What shard `name`, read to its end, promises: nothing before this time."""
        ...

    def start_for_new_stream(self) -> Timestamp: ...

    def changed_event(self) -> asyncio.Event:
        """Set when any shard has new entries (taken before a read: a write meanwhile wakes)."""
        ...


@runtime_checkable
class LiveShards(Protocol):
    """A cluster whose shards are elsewhere (a sidecar's `ShardedUpstream`): it can make them
    promise past a time (a read of their oplogs at `afterClusterTime`), it learns its shard
    list by asking (no event may leave past the time it is known for: mongos's config-server
    cursor, which reports kNewShardDetected), and it checks they are reachable."""

    def nudge(self, name: str, until: Timestamp | None = None) -> None: ...

    def refresh_topology(self) -> None: ...

    def topology_promise(self) -> Timestamp | None: ...

    def check_shards(self, names: Iterable[str] | None = None) -> None: ...


@runtime_checkable
class RoutesLookups(Protocol):
    """A cluster whose merged streams look current documents up through its router
    (`lookups.RoutedImages`: the embedded cluster); others look them up on the event's shard."""

    def lookup_images(self, name: str) -> ImageSource: ...


def open_shard_cursor(shard: MergedShard, spec: ChangeStreamSpec, start: Timestamp, ns: str,
                      cluster: MergedCluster) -> ChangeStreamCursor:
    """A shard's part of a merged stream (not registered with the shard's cursors: it belongs
    to the front)."""
    state = shard.state
    log = state.oplog
    images: ImageSource | ExternalImages | None = state.images
    routed = isinstance(cluster, RoutesLookups)
    if isinstance(cluster, RoutesLookups):
        images = cluster.lookup_images(shard.name)
    group, pipeline = state.cursors.hub.group_for(
        spec, start, log,
        lambda: ChangeStreamPipeline(spec, start, history=log, images=images),
        variant=b"routed" if routed else b"",
    )
    pipeline.ensure_token = None  # checked on the merged stream
    pipeline.check_history(log.oldest_entry())
    cursor = ChangeStreamCursor(state.cursors.new_id(), ns, pipeline, group)
    group.members.append(cursor)
    return cursor


class MergedChangeStream(HeldHere):
    """A change-stream cursor of the front (a `Cursor` of its registry): every shard's stream,
    merged."""

    kind = CHANGE_STREAM

    def __init__(
        self, cursor_id: int, ns: str, cluster: MergedCluster, spec: ChangeStreamSpec,
        start: Timestamp,
    ) -> None:
        self.id = cursor_id
        self.ns = ns
        self.cluster = cluster
        self.spec = spec
        self.busy = False
        self.closed = False
        self.draining = False
        self.finished = False  # its last batch was the invalidate: the getMore closes it
        self.awaited_s = 0.0
        self.last_used = time.monotonic()
        self.start = start
        self.subs: dict[str, ChangeStreamCursor] = {}
        # A shard read to its end, as it was then (its last entry, its removal): while that
        # stays, reading it again gives no event, only its promise (a wake-up for another
        # shard's delivery reads only that one).
        self._read_at: dict[str, tuple[Any, Any]] = {}
        self._promised: dict[str, Timestamp] = {}  # the idle promise last pushed per shard
        self.merge: ShardMerge[RawBSONDocument] = ShardMerge()
        try:
            # The shards of the cluster at `start`: today's, and those removed since.
            for shard in [*cluster.shards, *cluster.retired]:
                removed = cluster.removed_at(shard.name)
                if removed is not None and removed <= start:
                    continue
                joined = cluster.joined_at(shard.name)
                if joined is not None and joined > start:
                    self._join(shard, joined)  # added after `start`: it answers from then on
                else:
                    self.subs[shard.name] = open_shard_cursor(shard, spec, start, ns, cluster)
                    self.merge.add_shard(shard.name)
        except BaseException:
            self.close()
            raise
        # A sidecar learns of added shards by asking the mongos: no event may leave past the
        # time its shard list is known for (mongos's config-server cursor, which reports
        # kNewShardDetected).
        self.topology = cluster.topology_promise if isinstance(cluster, LiveShards) else None
        if self.topology is not None:
            self.merge.add_shard(TOPOLOGY)
        client = spec.resume_token
        if client is None and spec.start_at_operation_time is not None:
            client = ResumeTokenData.high_water_mark(start, resume_token.DEFAULT_TOKEN_VERSION)
        self.ensure = (
            EnsureResumeTokenPresent(client)
            if client is not None and not client.is_high_water_mark else None
        )
        self.pending: deque[RawBSONDocument] = deque()
        self.invalidated = False  # the invalidate has left the merge
        # A shard's stream invalidated by an event the user's stages filtered out: its token.
        # The merged stream ends there too (as a replica set's does: closed, its last token
        # the invalidate's) once everything before it has left the merge.
        self.silent_invalidate: dict[str, Any] | None = None
        self._written_cache: tuple[Any, Any] | None = None  # (merge mark, token reported)
        if spec.resume_token is not None:
            self.pbrt: dict[str, Any] = spec.resume_token.to_document()
        else:
            self.pbrt = ResumeTokenData.high_water_mark(start).to_document()

    def _join(self, shard: MergedShard, joined: Timestamp) -> None:
        """A shard added at `joined` (its topologyTime): its stream starts there, and until it
        answers it promises that time (`kNewShardDetected` in mongod)."""
        start = max(joined, self.start)
        self.subs[shard.name] = open_shard_cursor(shard, self.spec, start, self.ns, self.cluster)
        version = resume_token.version_for_event(start, self.spec.resume_token)
        self.merge.add_shard(
            shard.name, ResumeTokenData.high_water_mark(start, version).to_document())

    def _join_new_shards(self) -> None:
        for shard in self.cluster.shards:
            if shard.name not in self.subs:
                joined = self.cluster.joined_at(shard.name)
                self._join(shard, joined if joined is not None else self.start)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def close(self) -> None:
        self.closed = True
        for sub in self.subs.values():
            sub.close()
            with contextlib.suppress(Exception):
                sub.group.hub.forget_empty()  # type: ignore[union-attr]

    # -- reading the shards ---------------------------------------------------------------------

    async def _poll(self) -> None:
        """Ask every open shard for what it has now; an idle shard promises the cluster's next
        time."""
        merge = self.merge
        self._join_new_shards()
        if self.topology is not None:
            known = self.topology()  # taken before the shards are read
            if known is not None:
                # A shard added from now on has a topologyTime after `known`.
                after = (Timestamp(known.time, known.inc + 1) if known.inc < 0xFFFFFFFF
                         else Timestamp(known.time + 1, 0))
                merge.push(TOPOLOGY, [], ResumeTokenData.high_water_mark(
                    after, resume_token.version_for_event(after, self.spec.resume_token),
                ).to_document())
        for name, sub in list(self.subs.items()):
            if sub.closed or name not in merge.shards:
                continue
            if merge.buffered(name) >= SHARD_BATCH:
                continue
            shard = self.cluster.shard(name)
            seen = (shard.log.latest_ts(), self.cluster.removed_at(name))
            if self._read_at.get(name) == seen and sub.pipeline.pending_count == 0:
                # Read to its end and nothing delivered since: no new events, only (maybe) a
                # later promise.
                self._promise(name, sub, shard, [], None, seen[1])
                continue
            self._read_at.pop(name, None)
            batch = await sub.get_more(SHARD_BATCH, 0)
            token = batch.post_batch_resume_token
            events = batch.events
            if batch.invalidated:
                if token is not None and not any(
                    e["operationType"] == "invalidate" for e in events
                ) and (self.silent_invalidate is None or resume_token.sort_key(token)
                       < resume_token.sort_key(self.silent_invalidate)):
                    self.silent_invalidate = dict(token)
                merge.push(name, events, token)
                merge.close(name)
                sub.closed = True
                continue
            latest = shard.log.latest_ts()
            caught_up = (
                len(events) < SHARD_BATCH and sub.pipeline.pending_count == 0
                and (latest is None or sub.group.next_ts > latest)
            )
            removed = self.cluster.removed_at(name)
            if caught_up:
                self._read_at[name] = (latest, removed)
                self._promise(name, sub, shard, events, token, removed)
            else:
                merge.push(name, events, token)

    def _promise(self, name: str, sub: ChangeStreamCursor, shard: MergedShard, events: list[Any],
                 token: Any, removed: Timestamp | None) -> None:
        """A shard read to its end: its events and its promise (the cluster's idle promise,
        when later than its batch's token); a removed shard read past its removal ends."""
        merge = self.merge
        ts = self.cluster.idle_promise(name)
        if removed is not None and ts > removed:
            # A removed shard read to its end: its stream ends cleanly.
            merge.push(name, events, token)
            merge.close(name)
            sub.close()
            return
        if token is None and ts == self._promised.get(name):
            return  # nothing new
        version = resume_token.version_for_event(ts, self.spec.resume_token)
        promise = ResumeTokenData.high_water_mark(ts, version).to_document()
        if token is None or resume_token.sort_key(promise) > resume_token.sort_key(token):
            token = promise
            self._promised[name] = ts
        merge.push(name, events, token)

    def _nudge_blocker(self) -> None:
        """Events wait for shards that have promised nothing later yet: a cluster that can
        (a sidecar: a read of their oplogs at `afterClusterTime`) makes them promise past them."""
        cluster = self.cluster
        if not isinstance(cluster, LiveShards):
            return
        for name in self.merge.holding_back():  # all at once
            if name == TOPOLOGY:
                cluster.refresh_topology()
            elif isinstance(name, str) and not self.subs[name].closed:  # a shard's name
                cluster.nudge(name, cluster.removed_at(name))

    def _drain_merge(self) -> None:
        self._join_new_shards()  # a shard added during the reads holds back what follows it
        ready = self.merge.pop_ready()
        if self.ensure is not None and ready:
            ready = self.ensure.process(ready)
        silent = self.silent_invalidate
        for event in ready:
            if silent is not None and resume_token.sort_key(event["_id"]) > \
                    resume_token.sort_key(silent):
                break  # after the (filtered) invalidate: never delivered
            self.pending.append(event)
            if event["operationType"] == "invalidate":
                self.invalidated = True
                return
        if silent is not None and self._delivered_up_to(silent):
            self.invalidated = True

    def _delivered_up_to(self, token: dict[str, Any]) -> bool:
        """Whether every shard has promised nothing before `token` (all before it has left)."""
        high = self.merge.post_batch_resume_token
        return high is not None and resume_token.sort_key(high) >= resume_token.sort_key(token)

    def _batch(self, size: int | None) -> Batch:
        """Up to `size` merged events (None: what is ready) within the 16 MiB reply budget."""
        out: list[RawBSONDocument] = []
        total = 0
        pending = self.pending
        while pending and (size is None or len(out) < size):
            n = len(pending[0].raw)
            if out and total + n > MAX_BATCH_BYTES:
                break
            total += n
            out.append(pending.popleft())
        if out:
            self.pbrt = dict(out[-1]["_id"])
        if not pending and (not out or size is None or len(out) < size):
            if self.invalidated:
                if self.silent_invalidate is not None and resume_token.sort_key(
                    self.silent_invalidate) > resume_token.sort_key(self.pbrt):
                    self.pbrt = dict(self.silent_invalidate)
                return Batch(out, self.pbrt, True)
            high = self._written_high(self.merge.post_batch_resume_token)
            if high is not None and resume_token.sort_key(high) > resume_token.sort_key(
                self.pbrt
            ):
                self.pbrt = dict(high)
        return Batch(out, self.pbrt, False)

    def _written_high(self, high: Any) -> Any:
        """The merge's high-water mark as a token reports it: no later than the newest entry
        any shard's oplog holds (idle shards promise the cluster's next time, so events need
        not wait; mongod's shards report their latest entry, so a stream started after an
        invalidate keeps the invalidate's token until something is written)."""
        if high is None:
            return None
        cached = self._written_cache
        if cached is not None and cached[0] is high:
            return cached[1]  # the same mark as the last batch's (most getMores)
        latest = None
        for shard in self.cluster.shards:
            ts = shard.log.latest_ts()
            if ts is not None and (latest is None or ts > latest):
                latest = ts
        data = resume_token.decode(high)
        if latest is None or not data.is_high_water_mark or data.cluster_time <= latest:
            self._written_cache = (high, high)
            return high
        # (not cached: the newest entry may move on while the mark stays)
        return ResumeTokenData.high_water_mark(latest, data.version).to_document()

    async def first_batch(self, batch_size: int | None) -> Batch:
        """Empty, whatever `batch_size`: mongos opens each shard's stream with `batchSize: 0`
        (sharded_agg_helpers.cpp), so its first batch has no event; its token is where the
        stream starts (the resume token, or the start's high-water mark)."""
        return self._batch(0)

    @property
    def done(self) -> bool:
        return self.finished

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        batch = await self.get_more(more.batch_size, more.max_time_ms)
        self.finished = batch.invalidated
        return {"cursor": cursor_reply(self.id, self.ns, batch, first=False)}

    async def get_more(self, batch_size: int | None, max_time_ms: int | None) -> Batch:
        # Without batchSize, mongos returns what is ready up to the 16 MiB reply budget (as a
        # shard's getMore does: cursors/change_stream.py); only the aggregate defaults to 101.
        size = (
            None if batch_size is None
            else DEFAULT_BATCH_SIZE if batch_size <= 0 else batch_size
        )
        wait_s = (DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms) / 1000
        deadline = time.monotonic() + wait_s
        self.awaited_s = 0.0
        cluster = self.cluster
        while True:
            if isinstance(cluster, LiveShards):  # the shards this stream still reads reachable?
                cluster.check_shards([name for name, sub in self.subs.items() if not sub.closed])
            changed = cluster.changed_event()  # taken before reading: a write meanwhile wakes
            if not self.pending and not self.invalidated:
                await self._poll()
                self._drain_merge()
            if self.pending or self.invalidated:
                return self._batch(size)
            self._nudge_blocker()
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0 or self.draining:
                return self._batch(size)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # (no task of its own, as wait_for's)
                    await changed.wait()
            self.awaited_s += time.monotonic() - now
