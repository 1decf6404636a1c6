"""A sidecar for a sharded cluster: `cdcserver serve --upstream mongodb://<mongos>`.

At start the upstream is asked `hello`; a mongos (`msg: "isdbgrid"`) is asked `listShards`,
and each shard's replica set is tailed as `--upstream` tails one (`sources/mongo.py`:
majority-committed entries only, reconnects without gap or duplicate). The sidecar is a mongos
to its clients: change streams are served from the shards' tails, merged as mongos merges them
(`streams.py`, `pipeline_stages/merge.py`); every other command is forwarded to the mongos
and its reply returned unchanged.

Idle shards: a shard whose tail has delivered everything promises only its last entry (it
cannot know that nothing will be written before the other shards' times), so when events of a
busy shard wait for an idle one, the sidecar reads the idle shard's oplog after its last
delivered entry with `readConcern: {level: "majority", afterClusterTime: T}`, T the latest
time seen on any shard, and `$clusterTime` gossip of it (that time must not be past the
shard's clock). A shard mongod whose oplog is behind T then writes a no-op
(`makeNoopWriteIfNeeded`: "noop write for afterClusterTime read concern"), waits until its
commit point passes T and reads at that snapshot: the reply is every entry up to T at least,
its `operationTime` (a majority read's) the commit point, so the shard has promised T in one
request, instead of at its periodic no-op up to 10 s later. The shard tails leave those no-ops
out of their queries (an idle shard's tail is not woken for each). The reads of all the shards
a merge waits for go at once, while the entry that made them wait is still waiting for its own
commit point, never to a shard that has promised that time already; a shard has one read in
flight, and a later target asked meanwhile follows its reply at once (one per tailing round,
not one per event). Per event of a busy shard the upstream is asked: the busy shard's getMore
and `hello`, one `find` per idle shard, at most one read of the shard list.

Added and removed shards: the sidecar reads the shard list through the mongos every
`TOPOLOGY_POLL_S` and whenever events wait for it (mongos reads the config server's oplog for
`kNewShardDetected`; the sidecar knows only the mongos). The list is a participant of every
merge: no event later than the `operationTime` of the last answer leaves, so a shard added at
its `topologyTime` joins every stream at that time, before any later event of the others. While
streams wait, the list is `config.shards` read at `readConcern: {level: "majority",
afterClusterTime: T}`, T the latest entry read: the config server writes a no-op past T if it
is behind (an idle config server's last write can be 10 s old, and `listShards` answers for
that), so one answer covers T; otherwise, or from a mongos that refuses that read, `listShards`.
(Not the reply's `$clusterTime`: mongos's clock can be ahead of the config server's snapshot
the list was read at, which `operationTime` is; one request in flight, the next asked for the
latest entry read, so one answer covers every event read while it was asked.) A
shard gone from the list is still tailed: streams read it up to the time it was seen gone (read
at `afterClusterTime` past that), then its part of them ends.

Moved shards: a shard the list gives other hosts (its replica set restarted on other ports)
has its tail moved there (`ShardTail.move_to`): the clients of the old hosts are closed, which
fails at once what waits on them, and the tail's next attempt goes to the new hosts without its
backoff, resuming at its last delivered entry (the same oplog: nothing skipped, nothing twice).
A tail that fails has the list read at once, not at the next poll. Streams see no error unless
the shard stays unreachable for `DOWN_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from bson.timestamp import Timestamp

from cdcserver.context import ConnectionState, ServerState
from cdcserver.deployment import server_state
from cdcserver.deployments.upstream import UpstreamDeployment
from cdcserver.sharding.shard_commands import AFTER_CLUSTER_TIME_NOOP
from cdcserver.sources.merged import MergedOplog
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from cdcserver.sources.mongo_common import CLOSE_TIMEOUT_S, RAW
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate

log = logging.getLogger(__name__)

# How long a shard's tail may be lost before the merged streams fail (a failover's election
# stays under it; a shard that is gone does not hold streams silently).
DOWN_GRACE_S = 5.0
# Entries read on one shard nudge the others at once for this long after a merged stream
# last waited for idle shards (no streams waiting: no no-ops written).
NUDGE_AHEAD_S = 5.0
TOPOLOGY_POLL_S = 1.0  # how often listShards is asked when nothing else asks it
# How long a tail whose entries wait for the commit point waits for the reply of the promise
# read in flight (majority: its operationTime is a commit point) before it asks `hello`.
NUDGE_REPLY_WAIT_S = 1.0
# Entries a promise read returns at most (more: it promises only what it returned).
PROMISE_READ_LIMIT = 1000
# A shard's answers to a promise read that mean it will not serve one (not a failover's):
# InvalidOptions, Unauthorized, BadValue, FailedToParse, IllegalOperation, CommandNotSupported,
# ReadConcernMajorityNotEnabled, NotImplemented. It is then asked appendOplogNote instead.
PROMISE_READ_REFUSALS = frozenset({72, 13, 2, 9, 20, 115, 148, 238})
NUDGE_NOTE = {"msg": "cdcserver: merged change streams wait for this shard"}


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def shard_uri(host: str, template: str) -> str:
    """A shard's replica-set URI from its `listShards` host ("rs/h1:p1,h2:p2"), with the
    options (credentials, TLS...) of the mongos URI."""
    name, _, hosts = host.partition("/")
    if not hosts:
        name, hosts = "", host
    scheme, _, rest = template.partition("://")
    creds, _, after = rest.rpartition("@") if "@" in rest else ("", "", rest)
    _, _, query = after.partition("?")
    options = [o for o in query.split("&") if o and not o.lower().startswith(
        ("replicaset=", "directconnection=", "loadbalanced="))]
    if name:
        options.append(f"replicaSet={name}")
    auth = f"{creds}@" if creds else ""
    return f"mongodb://{auth}{hosts}/?{'&'.join(options)}"


def shard_seeds(host: str) -> tuple[str, frozenset[str]]:
    """A `listShards` host ("rs/h1:p1,h2:p2") as its replica set's name and seed hosts (their
    order does not matter)."""
    name, _, hosts = host.partition("/")
    if not hosts:
        name, hosts = "", host
    return name, frozenset(h.strip().lower() for h in hosts.split(",") if h.strip())


def mongos_shards(uri: str, timeout_s: float = 10.0) -> list[dict[str, Any]] | None:
    """The shards of the cluster `uri` names, when it is a mongos (None otherwise)."""
    import pymongo

    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=int(timeout_s * 1000))
    with client:
        hello = client.admin.command("hello")
        if hello.get("msg") != "isdbgrid":
            return None
        return list(client.admin.command("listShards")["shards"])


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


class ShardedUpstream(MergedOplog):
    """The sidecar's front: its shards' tails as one oplog (`MergedOplog`), its time, and the
    cluster a merged stream reads (`streams.MergedCluster`, with `streams.LiveShards`)."""

    def __init__(self, options: UpstreamOptions, shards: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(lambda: [s.log for s in self.shards])
        self.options = options
        # Its clients forward the other commands (it tails nothing: no retained log of its own).
        self.mongos = UpstreamOplog(dataclasses.replace(options, retain_dir=None))
        self.shards: list[SidecarShard] = []
        self.retired: list[SidecarShard] = []  # gone from listShards, still tailed
        self._joined: dict[str, Timestamp] = {}
        self._removed: dict[str, Timestamp] = {}
        self._by_name: dict[str, SidecarShard] = {}
        for entry in shards:
            self.shards.append(self._make_shard(entry))
        self.topology_ts: Timestamp | None = None  # the shard list is known up to this time
        self._topology_task: asyncio.Task[Any] | None = None
        self.topology_poll_s = TOPOLOGY_POLL_S
        self._topology_down_since: float | None = None  # listShards failing since
        self._tasks: list[asyncio.Task[Any]] = []
        self._nudging: set[str] = set()
        # A later target asked while a shard's nudge is in flight: sent as soon as it answers.
        self._nudge_wanted: dict[str, Timestamp] = {}
        self._topology_wanted: Timestamp | None = None  # likewise for listShards
        self._list_shards_refused = False  # the mongos refused config.shards at a time
        self._streams_waited = -1e9  # when a merged stream last waited for idle shards
        self.nudges = 0  # promise reads sent (for tests and status)
        self.gossiped: Timestamp | None = None  # the latest $clusterTime clients sent
        self.down_grace_s = DOWN_GRACE_S

    def _make_shard(self, entry: Mapping[str, Any]) -> SidecarShard:
        options = self.options
        name = str(entry["_id"])
        values = dataclasses.replace(
            options, uri=shard_uri(str(entry["host"]), options.uri),
            retain_dir=f"{options.retain_dir}/{name}" if options.retain_dir else None,
        )
        tail = ShardTail(values, self.notify, lambda ts: self._received(name, ts),
                         self._shard_lost)
        shard = SidecarShard(name, tail, server_state(UpstreamDeployment(tail, follow=False)),
                             str(entry["host"]))
        joined = entry.get("topologyTime")
        if isinstance(joined, Timestamp):
            self._joined[name] = joined
        self._by_name[name] = shard
        return shard

    # -- the shard list --------------------------------------------------------------------------

    def topology_promise(self) -> Timestamp | None:
        return self.topology_ts

    def joined_at(self, name: str) -> Timestamp | None:
        return self._joined.get(name)

    def removed_at(self, name: str) -> Timestamp | None:
        return self._removed.get(name)

    def refresh_topology(self, until: Timestamp | None = None, *, periodic: bool = False
                         ) -> None:
        """Ask the mongos for its shards now, to know the list past `until` (one request at
        a time: one asked while another is in flight follows its reply at once, unless that
        reply is for a time past `until`; so one answer covers every event read meanwhile).
        `periodic`: the poll's, which reads at a time only while streams wait (else no
        no-op is written for it)."""
        if not periodic and until is None:
            self._streams_waited = time.monotonic()  # a merged stream waits for the list
        if self._topology_task is None or self._topology_task.done():
            if periodic and time.monotonic() - self._streams_waited > NUDGE_AHEAD_S:
                coro = self._read_topology(None, at_time=False)
            else:
                coro = self._read_topology(until)
            task = asyncio.get_running_loop().create_task(coro)
            task.add_done_callback(self._topology_answered)
            self._topology_task = task
            return
        if until is None:  # past every entry delivered (the events a merge can hold back)
            until = self.latest_ts()
        if until is not None and (self._topology_wanted is None
                                  or until > self._topology_wanted):
            self._topology_wanted = until

    def _topology_answered(self, task: asyncio.Task[Any]) -> None:
        wanted, self._topology_wanted = self._topology_wanted, None
        if task.cancelled() or wanted is None or self._topology_down_since is not None:
            return  # a mongos that does not answer is asked again by the poll
        known = self.topology_ts
        if known is None or known < wanted:
            self.refresh_topology(wanted)

    async def _topology_loop(self) -> None:
        while True:
            self.refresh_topology(periodic=True)
            task = self._topology_task
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
            await asyncio.sleep(self.topology_poll_s)

    async def _read_topology(self, until: Timestamp | None = None, *, at_time: bool = True
                             ) -> None:
        target = self.latest_ts() if at_time else None
        if until is not None and (target is None or until > target):
            target = until
        try:
            reply = await self._list_shards(target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the mongos is away: the list stays as known
            log.debug("listShards: %s", exc)
            if self._topology_down_since is None:
                self._topology_down_since = time.monotonic()
            return
        self._topology_down_since = None
        known = reply.get("operationTime")
        if not isinstance(known, Timestamp):
            cluster_time = reply.get("$clusterTime") or {}
            known = cluster_time.get("clusterTime")
        if not isinstance(known, Timestamp):
            return  # a list of no known time promises nothing
        await self._apply_shards(list(reply.get("shards", [])), known)
        if isinstance(known, Timestamp) and (self.topology_ts is None
                                             or known > self.topology_ts):
            self.topology_ts = known
            self.notify()

    async def _list_shards(self, target: Timestamp | None) -> Mapping[str, Any]:
        """The shard list, read for a time at or after `target`: `config.shards` through the
        mongos at `readConcern: {level: "majority", afterClusterTime: target}` (the config
        server writes a no-op past it if its oplog is behind it, as a shard does, so the
        answer's `operationTime` is not the last time the config server happened to write,
        up to its periodic no-op 10 s ago); a mongos that refuses that read is asked
        `listShards`. Both answer `{shards: [...]}` and the `operationTime` of the read."""
        import pymongo

        client = self.mongos.async_client()
        if target is not None and not self._list_shards_refused:
            session = client.start_session(causal_consistency=False)
            try:
                gossip = self._gossip()
                if gossip is not None:
                    session.advance_cluster_time(gossip)
                reply = await client.config.command(
                    {"find": "shards", "batchSize": 100_000,
                     "readConcern": {"level": "majority", "afterClusterTime": target}},
                    session=session,
                )
                cursor = reply["cursor"]
                if not cursor["id"]:
                    return {"shards": cursor["firstBatch"],
                            "operationTime": reply.get("operationTime")}
                await client.config.command({"killCursors": "shards",
                                             "cursors": [cursor["id"]]})
            except pymongo.errors.OperationFailure as exc:  # the mongos answered: no
                log.info("find on config.shards at afterClusterTime refused (%s): asking "
                         "listShards from now on", exc)
                self._list_shards_refused = True
            finally:
                await session.end_session()
        listed: Mapping[str, Any] = await client.admin.command("listShards")
        return listed

    async def _apply_shards(self, entries: list[Mapping[str, Any]], known: Timestamp) -> None:
        names = {str(e["_id"]) for e in entries}
        for entry in entries:
            name = str(entry["_id"])
            if name in self._by_name and name not in self._removed:
                self._follow_host(self._by_name[name], str(entry["host"]))
                continue
            if name in self._removed:  # a removed shard's name again: not followed
                log.warning("shard %s is back in listShards: not tailed again", name)
                continue
            shard = self._make_shard(entry)
            self._tasks.append(asyncio.get_running_loop().create_task(shard.log.follow()))
            # Published (and the list's time advanced) once its tail knows where it is, or
            # after the grace a lost shard gets: until then events after it wait.
            await shard.log.wait_ready(self.down_grace_s)
            self.shards.append(shard)
            log.info("shard %s added (topologyTime %s): tailed from now on", name,
                     self._joined.get(name))
        for shard in list(self.shards):
            if shard.name not in names:
                # Gone: everything it wrote is before the time this answer is for.
                self._removed[shard.name] = known
                self.shards.remove(shard)
                self.retired.append(shard)
                log.info("shard %s removed: its streams end after its last events", shard.name)

    def _follow_host(self, shard: SidecarShard, host: str) -> None:
        """A shard the list gives other hosts (its replica set restarted on other ports, or
        moved): its tail goes there, resuming after its last delivered entry."""
        if shard_seeds(host) == shard_seeds(shard.host):
            return
        log.info("shard %s moved from %s to %s: its tail reconnects there", shard.name,
                 shard.host, host)
        shard.host = host
        shard.log.move_to(shard_uri(host, self.options.uri))

    def _shard_lost(self) -> None:
        """A shard's tail failed: read the shard list now (not at the next poll), in case
        the shard has moved."""
        with contextlib.suppress(RuntimeError):  # no running loop: the poll asks
            self.refresh_topology(periodic=True)

    # -- the cluster, as streams.py uses it ----------------------------------------------------

    def shard(self, name: str) -> SidecarShard:
        return self._by_name[name]

    def idle_promise(self, name: str) -> Timestamp:
        latest = self.shard(name).log.promise_ts()
        return next_ts(latest) if latest is not None else Timestamp(0, 1)

    def start_for_new_stream(self) -> Timestamp:
        """After what every shard has delivered and after the time clients gossiped (a client
        that wrote through the mongos, then opens a stream here, does not see its write)."""
        start = max(s.log.start_for_new_stream() for s in self.shards)
        if self.gossiped is not None and next_ts(self.gossiped) > start:
            start = next_ts(self.gossiped)
        return start

    def hear(self, cmd: Mapping[str, Any]) -> None:
        """The `$clusterTime` a client gossips."""
        gossip = cmd.get("$clusterTime")
        if isinstance(gossip, Mapping) and isinstance(gossip.get("clusterTime"), Timestamp):
            ts = gossip["clusterTime"]
            if self.gossiped is None or ts > self.gossiped:
                self.gossiped = ts

    def _received(self, name: str, ts: Timestamp) -> None:
        """Shard `name` read an entry at `ts`: while merged streams wait on idle shards, nudge
        them now, while that entry waits for its majority commit, instead of after."""
        if time.monotonic() - self._streams_waited > NUDGE_AHEAD_S:
            return
        known = self.topology_ts
        if known is None or known < ts:
            self.refresh_topology(ts)  # the shard list must be known past it too
        for shard in self.shards:
            if shard.name != name:
                self.nudge(shard.name, ts, waited=False)

    def nudge(self, name: str, until: Timestamp | None = None, *, waited: bool = True) -> None:
        """Have shard `name` promise the latest time seen on any shard (or `until`): one read
        of its oplog at `afterClusterTime` that time (a shard writes a no-op first when its
        oplog is behind it) answers every entry up to it."""
        if waited:
            self._streams_waited = time.monotonic()
        target = max((t for t in (s.log.latest_ts() for s in self.shards) if t is not None),
                     default=None)
        if until is not None and (target is None or until > target):
            target = until
        shard = self._by_name[name]
        have = shard.log.promise_ts()
        if target is None or (have is not None and have >= target):
            return  # promised already: no request
        if name in self._nudging:
            # One read at a time per shard; a later entry read meanwhile goes as soon as it
            # answers (if that answer does not cover it): one per tailing round, not per
            # event. (A waiting stream asks again when that reply wakes it.)
            if waited:
                return
            wanted = self._nudge_wanted.get(name)
            if wanted is None or target > wanted:
                self._nudge_wanted[name] = target
            return
        self._start_nudge(shard, target)

    def _start_nudge(self, shard: SidecarShard, target: Timestamp) -> None:
        loop = asyncio.get_running_loop()
        self._nudging.add(shard.name)
        shard.log.nudge_reply = loop.create_future()
        task = loop.create_task(self._nudge(shard, target))
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    def _gossip(self) -> Mapping[str, Any] | None:
        """The latest `$clusterTime` any of the sidecar's clients has heard (signed by the
        cluster): sent with a promise read, whose `afterClusterTime` must not be past the
        shard's clock (mongos gossips the same way)."""
        best: Mapping[str, Any] | None = None
        clients = [s.log._client for s in self.shards + self.retired]
        for client in [*clients, self.mongos._client]:
            # pymongo keeps the $clusterTime it heard in its topology, which has no public
            # accessor; a client not opened yet has none.
            topology = getattr(client, "_topology", None)
            heard = topology.max_cluster_time() if topology is not None else None
            if heard and (best is None or heard["clusterTime"] > best["clusterTime"]):
                best = heard
        return best

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

    async def _nudge(self, shard: SidecarShard, target: Timestamp) -> None:
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
            wanted = self._nudge_wanted.pop(shard.name, None)
            have = tail.promise_ts()
            if (answered and wanted is not None and (have is None or have < wanted)
                    and shard in self.shards + self.retired):
                self._start_nudge(shard, wanted)  # a shard that failed waits for the next ask

    def check_shards(self, names: Iterable[str] | None = None) -> None:
        """A shard whose tail has been lost for `down_grace_s` fails the merged streams with a
        resumable error (6 HostUnreachable): they cannot go on without its events, and a
        driver resumes from its last token once the shard is back. `names`: the shards a
        stream still reads (a removed one included until its part has ended); else the
        cluster's."""
        now = time.monotonic()
        since = self._topology_down_since
        if since is not None and now - since >= self.down_grace_s:
            # Without the shard list no event can leave (a shard may have been added).
            raise MongoError(
                6, f"Unable to reach the mongos: the cluster's shards cannot be listed "
                f"({now - since:.1f}s)",
            )
        shards = self.shards if names is None else [
            self._by_name[n] for n in names if n in self._by_name]
        for shard in shards:
            since = shard.log.down_since
            if since is not None and now - since >= self.down_grace_s:
                raise MongoError(
                    6, f"Unable to reach shard {shard.name}: its oplog cannot be read "
                    f"({now - since:.1f}s)",
                )

    # -- OplogLog (beyond MergedOplog's) -----------------------------------------------------------

    def cluster_time(self) -> Timestamp:
        times = [s.log.cluster_time() for s in self.shards]
        if self.gossiped is not None:
            times.append(self.gossiped)
        return max(times, default=Timestamp(0, 0))

    # -- started and stopped by its deployment (deployments/sidecar.py) ---------------------------

    def prime(self) -> None:
        for shard in self.shards:
            shard.log.prime()

    async def start_cluster(self, host: str) -> None:
        loop = asyncio.get_running_loop()
        for shard in self.shards:
            self._tasks.append(loop.create_task(shard.log.follow()))
        self._tasks.append(loop.create_task(self._topology_loop()))

    async def wait_ready(self, timeout: float) -> bool:
        results = await asyncio.gather(*(s.log.wait_ready(timeout) for s in self.shards))
        return all(results)

    async def stop_cluster(self) -> None:
        if self._topology_task is not None:
            self._tasks.append(self._topology_task)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for shard in self.shards + self.retired:
            with contextlib.suppress(Exception):
                await shard.log.aclose()
        with contextlib.suppress(Exception):
            await self.mongos.aclose()


# -- the sidecar's commands ---------------------------------------------------------------------



async def _ping(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return {}


async def _forward(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    from cdcserver.commands.proxy import forward

    reply = await forward(_upstream(server).mongos, cmd, db, server.cursors)  # the registry
    # The mongos's RawBSONDocument, which registry.run_command passes on as it came (as
    # proxy.forward_command's): the shared Handler type says dict.
    return cast("dict[str, Any]", reply)


async def _aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if not is_change_stream_aggregate(cmd):
        return await _forward(server, conn, cmd, db)
    from cdcserver.sharding.router.change_streams import open_change_stream

    upstream = _upstream(server)
    upstream.hear(cmd)
    upstream.check_shards()
    if any(not s.log.connected and s.log.latest_ts() is None for s in upstream.shards):
        # A shard whose tail has never read: its stream could not start where it must.
        raise MongoError(6, "a shard of the cluster cannot be reached yet")
    return await open_change_stream(server, upstream, cmd, db)


def _upstream(server: ServerState) -> ShardedUpstream:
    oplog = server.oplog
    if not isinstance(oplog, ShardedUpstream):  # the table of another mode: a bug
        raise TypeError(f"the sidecar's command on {type(oplog).__name__}")
    return oplog
