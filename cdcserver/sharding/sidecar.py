"""A sidecar for a sharded cluster: `cdcserver serve --upstream mongodb://<mongos>`.

At start the upstream is asked `hello`; a mongos (`msg: "isdbgrid"`) is asked `listShards`,
and each shard's replica set is tailed as `--upstream` tails one (`sidecar_tail.ShardTail`).
The sidecar is a mongos to its clients: change streams are served from the shards' tails,
merged as mongos merges them (`streams.py`, `pipeline_stages/merge.py`); every other command
is forwarded to the mongos and its reply returned unchanged.

Its parts:
- `sidecar_tail.py`: one shard's tail (promises, moves to other hosts);
- `sidecar_nudge.py`: idle shards made to promise a time, one read of their oplogs at
  `afterClusterTime` each, while the entry that made a merge wait waits for its own commit
  point;
- `sidecar_topology.py`: the shard list read through the mongos, as a participant of every
  merge;
- here, `ShardedUpstream`: the shards as one oplog and as the cluster the merged streams read,
  what a shard list answer means for them, and the sidecar's commands.

Per event of a busy shard the upstream is asked: the busy shard's getMore and `hello`, one
`find` per idle shard, at most one read of the shard list.

Added and removed shards: a shard added at its `topologyTime` joins every stream at that
time, before any later event of the others. A shard gone from the list is still tailed:
streams read it up to the time it was seen gone (read at `afterClusterTime` past that), then
its part of them ends.

Moved shards: a shard the list gives other hosts (its replica set restarted on other ports)
has its tail moved there (`ShardTail.move_to`), resuming at its last delivered entry. A tail
that fails has the list read at once, not at the next poll. Streams see no error unless the
shard stays unreachable for `DOWN_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.commands.stream_namespace import refusal, stream_collection, upstream_kind
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.deployment import server_state
from cdcserver.deployments.upstream import UpstreamDeployment
from cdcserver.materialize import snapshot
from cdcserver.materialize.protocol import insert_section, status_section
from cdcserver.materialize.sync import Materializer
from cdcserver.sharding.sidecar_nudge import NUDGE_NOTE, Demand, PromiseReads
from cdcserver.sharding.sidecar_tail import ShardTail, SidecarShard, heard_cluster_time, next_ts
from cdcserver.sharding.sidecar_topology import (
    TOPOLOGY_POLL_S,
    ShardListReader,
    mongos_shards,
    shard_seeds,
    shard_uri,
)
from cdcserver.sources.merged import MergedOplog
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate

__all__ = [
    "DOWN_GRACE_S", "NUDGE_NOTE", "TOPOLOGY_POLL_S", "ShardTail", "ShardedUpstream",
    "SidecarShard", "mongos_shards", "next_ts", "shard_seeds", "shard_uri",
]

log = logging.getLogger(__name__)
_DECODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(
    tz_aware=True)  # dates as they came

# How long a shard's tail may be lost before the merged streams fail (a failover's election
# stays under it; a shard that is gone does not hold streams silently).
DOWN_GRACE_S = 5.0


class ShardedUpstream(MergedOplog):
    """The sidecar's front: its shards' tails as one oplog (`MergedOplog`), its time, and the
    cluster a merged stream reads (`streams.MergedCluster`, with `streams.LiveShards`)."""

    def __init__(self, options: UpstreamOptions, shards: Sequence[Mapping[str, Any]],
                 materialize: Sequence[str] = ()) -> None:
        super().__init__(lambda: [s.log for s in self.shards])
        self.options = options
        # `[upstream] materialize`: a copy per shard beside its retained log, answering the
        # images of that shard's writes (cdcserver/materialize/).
        self.materialize = list(materialize)
        self.copies: dict[str, Materializer] = {}
        # Its clients forward the other commands (it tails nothing: no retained log of its own).
        self.mongos = UpstreamOplog(dataclasses.replace(options, retain_dir=None))
        self.shards: list[SidecarShard] = []
        self.retired: list[SidecarShard] = []  # gone from listShards, still tailed
        self._joined: dict[str, Timestamp] = {}
        self._removed: dict[str, Timestamp] = {}
        self._by_name: dict[str, SidecarShard] = {}
        for entry in shards:
            self.shards.append(self._make_shard(entry))
        self._tasks: list[asyncio.Task[Any]] = []
        self._demand = Demand()  # when a merged stream last waited for idle shards
        self.promises = PromiseReads(
            lambda: self.shards, lambda: self.shards + self.retired, self.shard,
            self._gossip, self._tasks, self._demand)
        # TOPOLOGY_POLL_S as this module has it (tests set it here).
        self.topology = ShardListReader(self.mongos, self.latest_ts, self._gossip,
                                        self._apply_shards, self.notify, self._demand,
                                        TOPOLOGY_POLL_S)
        self.gossiped: Timestamp | None = None  # the latest $clusterTime clients sent
        self.down_grace_s = DOWN_GRACE_S

    @property
    def nudges(self) -> int:
        """Promise reads sent (for tests and status)."""
        return self.promises.nudges

    @property
    def topology_ts(self) -> Timestamp | None:
        """The shard list is known up to this time."""
        return self.topology.known

    @property
    def topology_poll_s(self) -> float:
        return self.topology.poll_s

    @topology_poll_s.setter
    def topology_poll_s(self, value: float) -> None:
        self.topology.poll_s = value

    @property
    def _list_shards_refused(self) -> bool:
        """The mongos refused `config.shards` at a time: `listShards` is asked instead."""
        return self.topology.refused

    def _make_shard(self, entry: Mapping[str, Any]) -> SidecarShard:
        options = self.options
        name = str(entry["_id"])
        values = dataclasses.replace(
            options, uri=shard_uri(str(entry["host"]), options.uri),
            retain_dir=f"{options.retain_dir}/{name}" if options.retain_dir else None,
        )
        tail = ShardTail(values, self.notify, lambda ts: self._received(name, ts),
                         self._shard_lost)
        if self.materialize and values.retain_dir:
            copy = self.copies[name] = Materializer(tail, self.materialize, values.retain_dir)
            tail.images.copy = copy
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
        """Ask the mongos for its shards now, to know the list past `until`
        (`ShardListReader.refresh`)."""
        self.topology.refresh(until, periodic=periodic)

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
            copy = self.copies.get(name)
            if copy is not None:
                self._tasks.append(asyncio.get_running_loop().create_task(copy.run()))
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
        if not self._demand.recent():
            return
        known = self.topology_ts
        if known is None or known < ts:
            self.refresh_topology(ts)  # the shard list must be known past it too
        for shard in self.shards:
            if shard.name != name:
                self.nudge(shard.name, ts, waited=False)

    def nudge(self, name: str, until: Timestamp | None = None, *, waited: bool = True) -> None:
        """Have shard `name` promise the latest time seen on any shard (or `until`): one read
        of its oplog at `afterClusterTime` that time (`PromiseReads.ask`)."""
        self.promises.ask(name, until, waited=waited)

    def _gossip(self) -> Mapping[str, Any] | None:
        """The latest `$clusterTime` any of the sidecar's clients has heard."""
        clients = [s.log._client for s in self.shards + self.retired]
        return heard_cluster_time([*clients, self.mongos._client])

    def check_shards(self, names: Iterable[str] | None = None, *, opening: bool = False
                     ) -> None:
        """A shard whose tail has been lost for `down_grace_s` fails the merged streams with a
        resumable error (6 HostUnreachable): they cannot go on without its events, and a
        driver resumes from its last token once the shard is back. `names`: the shards a
        stream still reads (a removed one included until its part has ended); else the
        cluster's. `opening`: a new stream's aggregate, which mongos cannot establish on the
        shard: 133 FailedToSatisfyReadPreference, as its replica set monitor answers
        (`establish_cursors.cpp` passes it on unchanged; resumable too)."""
        now = time.monotonic()
        since = self.topology.down_since
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
                if opening:
                    raise no_primary_error(shard)
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
            copy = self.copies.get(shard.name)
            if copy is not None:
                self._tasks.append(loop.create_task(copy.run()))
        self._tasks.append(loop.create_task(self.topology.poll()))

    async def wait_ready(self, timeout: float) -> bool:
        results = await asyncio.gather(*(s.log.wait_ready(timeout) for s in self.shards))
        return all(results)

    async def stop_cluster(self) -> None:
        if self.topology.task is not None:
            self._tasks.append(self.topology.task)
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


async def _server_status(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The mongos's serverStatus, with the shards' materialized copies as a `materialized`
    section (`{shards: {<name>: <the copy's status>}}`) when there are any."""
    reply = await _forward(server, conn, cmd, db)
    copies = _upstream(server).copies
    if not copies or not reply.get("ok"):
        return reply
    section = {"shards": {name: status_section(copy.status())
                          for name, copy in sorted(copies.items())}}
    decoded = bson_bytes.decode(bson_bytes.encode(reply), _DECODE)
    # Passed on whole as the forwarded reply is (its $clusterTime and operationTime included).
    return cast("dict[str, Any]", RawBSONDocument(
        bson_bytes.encode(insert_section(decoded, "materialized", section))))


def route_find(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    """A snapshot read of a materialized namespace reads the shards' copies; else the mongos."""
    return snapshot.snapshot_find if snapshot.on_the_copy(server, cmd) else _forward


def route_distinct(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    return snapshot.snapshot_distinct if snapshot.on_the_copy(server, cmd) else _forward


def route_aggregate(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
    if snapshot.reads_the_copy(server, cmd):
        return snapshot.snapshot_aggregate
    return _aggregate


async def _aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if not is_change_stream_aggregate(cmd):
        return await _forward(server, conn, cmd, db)
    from cdcserver.sharding.router.change_streams import open_change_stream

    upstream = _upstream(server)
    upstream.hear(cmd)
    upstream.check_shards(opening=True)
    for shard in upstream.shards:
        if not shard.log.connected and shard.log.latest_ts() is None:
            # A shard whose tail has never read: its stream could not start where it must.
            raise no_primary_error(shard)

    async def shards_check() -> None:
        coll = stream_collection(cmd)
        if coll is None:
            return
        # The mongos lists the primary shard's catalog (its views, its buckets collections).
        kind = await upstream_kind(upstream.mongos.async_client(), db, coll)
        error = refusal(kind, db, coll, server.release, cmd.get("rawData") is True)
        if error is not None:
            raise error

    return await open_change_stream(server, upstream, cmd, db, shards_check)


def no_primary_error(shard: SidecarShard) -> MongoError:
    """mongos's answer when no host of shard's replica set can be targeted (its replica set
    monitor's, `ReplicaSetMonitor::getHostOrRefresh`): 133 for the set's name."""
    set_name = shard_seeds(shard.host)[0] or shard.name
    return MongoError(
        133, 'Could not find host matching read preference { mode: "primary" } for set '
        f"{set_name}",
    )


def _upstream(server: ServerState) -> ShardedUpstream:
    oplog = server.oplog
    if not isinstance(oplog, ShardedUpstream):  # the table of another mode: a bug
        raise TypeError(f"the sidecar's command on {type(oplog).__name__}")
    return oplog
