"""The sharded sidecar's promise reads (`sidecar.py`): making an idle shard promise a time.

A shard whose tail has delivered everything promises only its last entry (it cannot know that
nothing will be written before the other shards' times), so when events of a busy shard wait
for an idle one, the idle shard's oplog is read after its last delivered entry with
`readConcern: {level: "majority", afterClusterTime: T}`, T the latest time seen on any shard,
and `$clusterTime` gossip of it (that time must not be past the shard's clock). A shard mongod
whose oplog is behind T then writes a no-op (`makeNoopWriteIfNeeded`: "noop write for
afterClusterTime read concern"), waits until its commit point passes T and reads at that
snapshot: the reply is every entry up to T at least, its `operationTime` (a majority read's)
the commit point, so the shard has promised T in one request, instead of at its periodic no-op
up to 10 s later. The shard tails leave those no-ops out of their queries (an idle shard's tail
is not woken for each). The reads of all the shards a merge waits for go at once, while the
entry that made them wait is still waiting for its own commit point, never to a shard that has
promised that time already; a shard has one read in flight, and a later target asked meanwhile
follows its reply at once (one per tailing round, not one per event). A shard that refuses
such reads is asked `appendOplogNote` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.sharding.sidecar_tail import ShardTail, SidecarShard
from cdcserver.sources.mongo_common import RAW

log = logging.getLogger(__name__)

# Entries read on one shard nudge the others at once for this long after a merged stream
# last waited for idle shards (no streams waiting: no no-ops written).
NUDGE_AHEAD_S = 5.0
# Entries a promise read returns at most (more: it promises only what it returned).
PROMISE_READ_LIMIT = 1000
# A shard's answers to a promise read that mean it will not serve one (not a failover's):
# InvalidOptions, Unauthorized, BadValue, FailedToParse, IllegalOperation, CommandNotSupported,
# ReadConcernMajorityNotEnabled, NotImplemented. It is then asked appendOplogNote instead.
PROMISE_READ_REFUSALS = frozenset({72, 13, 2, 9, 20, 115, 148, 238})
NUDGE_NOTE = {"msg": "cdcserver: merged change streams wait for this shard"}


class Demand:
    """When a merged stream last waited for idle shards or for the shard list: while that is
    recent (`NUDGE_AHEAD_S`), entries read nudge the others at once and the list is read at
    a time (no streams waiting: no no-ops written)."""

    def __init__(self) -> None:
        self.waited_at = -1e9

    def waited(self) -> None:
        self.waited_at = time.monotonic()

    def recent(self) -> bool:
        return time.monotonic() - self.waited_at <= NUDGE_AHEAD_S


class PromiseReads:
    """The promise reads of a sidecar's shards: one in flight per shard at most.

    `live`: the shards of the list (their latest entries make the target); `followed`: those
    and the ones gone from it but still tailed; `lookup`: a shard by name; `gossip`: the
    latest `$clusterTime` heard; `tasks`: where the reads' tasks are kept (cancelled by the
    sidecar's stop)."""

    def __init__(self, live: Callable[[], Sequence[SidecarShard]],
                 followed: Callable[[], Sequence[SidecarShard]],
                 lookup: Callable[[str], SidecarShard],
                 gossip: Callable[[], Mapping[str, Any] | None],
                 tasks: list[asyncio.Task[Any]], demand: Demand) -> None:
        self._live, self._followed, self._lookup = live, followed, lookup
        self._gossip, self._tasks, self._demand = gossip, tasks, demand
        self._nudging: set[str] = set()
        # A later target asked while a shard's read is in flight: sent as soon as it answers.
        self._wanted: dict[str, Timestamp] = {}
        self.nudges = 0  # promise reads sent (for tests and status)

    def ask(self, name: str, until: Timestamp | None = None, *, waited: bool = True) -> None:
        """Have shard `name` promise the latest time seen on any shard (or `until`): one read
        of its oplog at `afterClusterTime` that time (a shard writes a no-op first when its
        oplog is behind it) answers every entry up to it."""
        if waited:
            self._demand.waited()
        target = max((t for t in (s.log.latest_ts() for s in self._live()) if t is not None),
                     default=None)
        if until is not None and (target is None or until > target):
            target = until
        shard = self._lookup(name)
        have = shard.log.promise_ts()
        if target is None or (have is not None and have >= target):
            return  # promised already: no request
        if name in self._nudging:
            # One read at a time per shard; a later entry read meanwhile goes as soon as it
            # answers (if that answer does not cover it): one per tailing round, not per
            # event. (A waiting stream asks again when that reply wakes it.)
            if waited:
                return
            wanted = self._wanted.get(name)
            if wanted is None or target > wanted:
                self._wanted[name] = target
            return
        self._start(shard, target)

    def _start(self, shard: SidecarShard, target: Timestamp) -> None:
        loop = asyncio.get_running_loop()
        self._nudging.add(shard.name)
        shard.log.nudge_reply = loop.create_future()
        task = loop.create_task(self._read(shard, target))
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _append_note(self, tail: ShardTail, client: Any, target: Timestamp) -> None:
        """A shard that will not read its oplog at afterClusterTime: `appendOplogNote` past
        `target` instead (`w: majority`: its reply's operationTime is the commit point past
        the no-op), which its tail reads; one more request, the tail's getMore of it."""
        session = client.start_session(causal_consistency=False)
        try:
            gossip = self._gossip()  # the no-op's time is after `target` once its clock is
            if gossip is not None:
                session.advance_cluster_time(gossip)
            reply = await client.admin.command(
                {"appendOplogNote": 1, "data": NUDGE_NOTE, "maxClusterTime": target,
                 "writeConcern": {"w": "majority"}}, session=session)
        finally:
            await session.end_session()
        op_time = reply.get("operationTime")
        if isinstance(op_time, Timestamp):
            tail.note_majority(op_time)

    async def _read(self, shard: SidecarShard, target: Timestamp) -> None:
        import pymongo

        tail = shard.log
        answered = False
        try:
            since = tail.latest_ts()
            if since is None:
                return  # its tail has not started: the stream asks again later
            client = tail.async_client()
            self.nudges += 1
            if tail.promise_read_refused:
                await self._append_note(tail, client, target)
                answered = True
                return
            session = client.start_session(causal_consistency=False)
            try:
                gossip = self._gossip()
                if gossip is not None:
                    session.advance_cluster_time(gossip)
                # majority + afterClusterTime: the shard writes a no-op past `target` if its
                # oplog is behind it (makeNoopWriteIfNeeded), waits until its commit point
                # passes it, and reads at that snapshot: the reply is every entry after
                # `since` up to a time at or after `target`, and its operationTime (a
                # majority read's) the commit point, so no `hello` and no tail round.
                try:
                    reply = await client.local.command(
                        {"find": "oplog.rs", "filter": {"ts": {"$gt": since}},
                         "limit": PROMISE_READ_LIMIT, "batchSize": PROMISE_READ_LIMIT,
                         "readConcern": {"level": "majority", "afterClusterTime": target}},
                        codec_options=RAW, session=session,
                    )
                except pymongo.errors.OperationFailure as exc:
                    if exc.code not in PROMISE_READ_REFUSALS:
                        raise
                    log.info("shard %s refuses reads of its oplog at afterClusterTime (%s): "
                             "asking it appendOplogNote from now on", shard.name, exc)
                    tail.promise_read_refused = True
                    await self._append_note(tail, client, target)
                    answered = True
                    return
            finally:
                await session.end_session()
            answered = True
            cursor = reply["cursor"]
            batch = list(cursor["firstBatch"])
            complete = not cursor["id"] and len(batch) < PROMISE_READ_LIMIT
            tail.take_promise(batch, target, reply.get("operationTime"), complete)
            if cursor["id"]:  # cut at 16 MiB (a tail far behind): the rest comes by the tail
                await client.local.command({"killCursors": "oplog.rs",
                                            "cursors": [cursor["id"]]})
        except Exception as exc:  # noqa: BLE001 - unreachable, a failover...: asked again
            log.debug("promise read on %s: %s", shard.name, exc)
        finally:
            self._nudging.discard(shard.name)
            reply_future = tail.nudge_reply
            if reply_future is not None and not reply_future.done():
                reply_future.set_result(None)
            wanted = self._wanted.pop(shard.name, None)
            have = tail.promise_ts()
            if (answered and wanted is not None and (have is None or have < wanted)
                    and shard in self._followed()):
                self._start(shard, wanted)  # a shard that failed waits for the next ask
