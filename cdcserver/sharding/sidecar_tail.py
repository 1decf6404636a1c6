"""One shard's tail in the sharded sidecar (`sidecar.py`): the shard's replica set tailed as
`--upstream` tails one (`sources/mongo.py`: majority-committed entries only, reconnects without
gap or duplicate), and what the sidecar's merged streams need of it beyond that.

- Every delivery wakes the merged streams; every entry read (before its commit point) tells
  the sidecar, which nudges the idle shards at once (`sidecar_nudge.py`).
- A promise read's answer (`take_promise`): its entries delivered, its `operationTime` taken
  as the commit point, and the time it covers promised even where the oplog has no entry.
  The no-ops such reads make the shard write are left out of the tail's own query.
- A shard that moves to other hosts (`move_to`): the clients of the old hosts are closed,
  which fails at once what waits on them, and the next attempt goes to the new hosts without
  the backoff, resuming at the last delivered entry (the same oplog: nothing skipped, nothing
  twice). A tail that fails tells the sidecar, which reads the shard list at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.context import ServerState
from cdcserver.sharding.shard_commands import AFTER_CLUSTER_TIME_NOOP
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from cdcserver.sources.mongo_common import CLOSE_TIMEOUT_S

# How long a tail whose entries wait for the commit point waits for the reply of the promise
# read in flight (majority: its operationTime is a commit point) before it asks `hello`.
NUDGE_REPLY_WAIT_S = 1.0


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def heard_cluster_time(clients: Iterable[Any]) -> Mapping[str, Any] | None:
    """The latest `$clusterTime` any of these pymongo clients has heard (signed by the
    cluster): sent with a read at `afterClusterTime`, which must not be past the server's
    clock (mongos gossips the same way)."""
    best: Mapping[str, Any] | None = None
    for client in clients:
        # pymongo keeps the $clusterTime it heard in its topology, which has no public
        # accessor; a client not opened yet has none.
        topology = getattr(client, "_topology", None)
        heard = topology.max_cluster_time() if topology is not None else None
        if heard and (best is None or heard["clusterTime"] > best["clusterTime"]):
            best = heard
    return best


class ShardTail(UpstreamOplog):
    """One shard's tail; every delivery also wakes the sidecar's merged streams, and every
    entry read (before it is majority-committed) lets the sidecar nudge the idle shards at
    once."""

    def __init__(self, options: UpstreamOptions, on_change: Callable[[], None],
                 on_receive: Callable[[Timestamp], None] | None = None,
                 on_lost: Callable[[], None] | None = None) -> None:
        super().__init__(options)
        self._on_change = on_change
        self._on_receive = on_receive
        self._on_lost = on_lost  # the tail failed: the sidecar reads the shard list again
        self._moved = asyncio.Event()  # set by move_to: the tail's next attempt goes at once
        self.moves = 0  # hosts this tail was moved to (status, tests)
        self._closing: set[asyncio.Task[Any]] = set()  # clients of hosts left, closing
        # Resolved when this shard's promise read in flight has answered (None: none).
        self.nudge_reply: asyncio.Future[None] | None = None
        self.hellos_spared = 0  # commit points learnt from a nudge's reply (status, tests)
        # Everything the shard has up to this time is delivered (a promise read said so),
        # though its oplog may have no entry there.
        self.promised: Timestamp | None = None
        self.promise_read_refused = False  # the shard refused a promise read (see _nudge)

    def _tail_filter(self, start: Timestamp) -> dict[str, Any]:
        """The no-ops a promise read makes the shard write come in its reply: the tail leaves
        them out (an idle shard's tail is not woken for each), but for the entry it resumes
        at, which it must find again."""
        return {"ts": {"$gte": start},
                "$or": [{"ts": start}, {"o": {"$ne": AFTER_CLUSTER_TIME_NOOP}}]}

    def promise_ts(self) -> Timestamp | None:
        """Everything the shard has up to this time is delivered."""
        latest = self.latest_ts()
        promised = self.promised
        if promised is not None and (latest is None or promised > latest):
            return promised
        return latest

    def take_promise(self, batch: list[Any], target: Timestamp, op_time: Any,
                     complete: bool) -> None:
        """A promise read answered: `batch`, every entry after the last one delivered when it
        was sent up to a majority-committed snapshot at or after `target` (`complete`: not cut
        by its limit); `op_time`, its operationTime, the shard's commit point."""
        if batch:
            self._receive(batch)  # those read already are skipped: never twice
        if isinstance(op_time, Timestamp):
            self.note_majority(op_time)
        pending = self._pending
        if (complete and isinstance(op_time, Timestamp) and op_time >= target
                and not (pending and pending[0][0] <= target)
                and (self.promised is None or target > self.promised)):
            self.promised = target
            self.notify()

    def notify(self) -> None:
        super().notify()
        self._on_change()

    # -- a shard that moves (its hosts in the shard list change) -------------------------------

    def move_to(self, uri: str) -> None:
        """The shard list gives this shard other hosts: the tail and every request to the
        shard go to `uri` from now on. The tail resumes at its last delivered entry (the
        same replica set, the same oplog: its continuity check finds that entry again, so
        nothing is skipped or read twice). The clients of the hosts left are closed, which
        fails at once what waits on them (a server selection of a host that is gone)."""
        if uri == self.options.uri:
            return
        self.options = dataclasses.replace(self.options, uri=uri)
        self.moves += 1
        old = [c for c in (self._client, self._sync_client) if c is not None]
        self._client = self._sync_client = None  # made again, for `uri`, on next use
        self._moved.set()
        loop = asyncio.get_running_loop()
        for client in old:
            task = loop.create_task(self._close_client(client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_client(client: Any) -> None:
        import pymongo

        # Bounded: its endSessions would wait serverSelectionTimeoutMS for a host gone.
        with contextlib.suppress(Exception), pymongo.timeout(CLOSE_TIMEOUT_S):
            if isinstance(client, pymongo.AsyncMongoClient):
                await client.close()
            else:
                await asyncio.to_thread(client.close)

    async def _reconnect_pause(self, delay: float) -> None:
        """The tail's backoff, cut short when the shard has moved: the next attempt is at
        its new host, at once."""
        if not self._moved.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), delay)
        self._moved.clear()

    def _tail_failed(self, exc: Exception | None) -> None:
        super()._tail_failed(exc)
        if self._on_lost is not None:
            self._on_lost()  # the shard may have moved: the list says where to

    async def aclose(self) -> None:
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task
        await super().aclose()

    def _receive(self, batch: list[Any]) -> None:
        super()._receive(batch)
        if batch and self._on_receive is not None:
            # Only entries that can be events: no-ops (nudges', periodic ones) would make
            # the shards nudge each other without end.
            for doc in reversed(batch):
                if doc.get("op") != "n":
                    ts = doc.get("ts")
                    if isinstance(ts, Timestamp):
                        self._on_receive(ts)
                    break

    async def _before_majority_poll(self) -> None:
        """A nudge in flight is `w: majority`: its reply is the commit point past its no-op,
        which the tail often reads first; wait for it rather than ask `hello` too."""
        reply = self.nudge_reply
        if reply is not None and not reply.done():
            await asyncio.wait({reply}, timeout=NUDGE_REPLY_WAIT_S)
            pending = self._pending
            majority = self._majority
            if not pending or (majority is not None and pending[-1][0] <= majority):
                self.hellos_spared += 1

    def note_majority(self, ts: Timestamp) -> None:
        """The shard answered a `w: majority` write at `ts`: its commit point is there at least
        (no `hello` needed to deliver what it read up to it)."""
        majority = self._majority
        if majority is None or ts > majority:
            self._majority = ts
            self._deliver_committed()


@dataclass(eq=False)
class SidecarShard:
    name: str
    log: ShardTail
    state: ServerState
    host: str = ""  # as the shard list last gave it ("rs/h1:p1,h2:p2")
