"""The sharded sidecar's shard list (`sidecar.py`), read through the mongos.

The sidecar reads the shard list through the mongos every `TOPOLOGY_POLL_S` and whenever
events wait for it (mongos reads the config server's oplog for `kNewShardDetected`; the sidecar
knows only the mongos). The list is a participant of every merge: no event later than the
`operationTime` of the last answer leaves, so a shard added at its `topologyTime` joins every
stream at that time, before any later event of the others. While streams wait, the list is
`config.shards` read at `readConcern: {level: "majority", afterClusterTime: T}`, T the latest
entry read: the config server writes a no-op past T if it is behind (an idle config server's
last write can be 10 s old, and `listShards` answers for that), so one answer covers T;
otherwise, or from a mongos that refuses that read, `listShards`. (Not the reply's
`$clusterTime`: mongos's clock can be ahead of the config server's snapshot the list was read
at, which `operationTime` is; one request in flight, the next asked for the latest entry read,
so one answer covers every event read while it was asked.) What an answer means for the
shards (added, removed, moved) is the sidecar's (`ShardedUpstream._apply_shards`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.sharding.sidecar_nudge import Demand
from cdcserver.sources.mongo import UpstreamOplog

log = logging.getLogger(__name__)

TOPOLOGY_POLL_S = 1.0  # how often listShards is asked when nothing else asks it


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


class ShardListReader:
    """The shard list as last read, and its reads: one in flight at a time.

    `mongos`: its client asks; `latest`: the latest entry read on any shard (what an answer
    must cover); `gossip`: the latest `$clusterTime` heard; `apply`: the sidecar takes an
    answer's shards, known up to its time; `notify`: wakes the merged streams once the list
    is known further."""

    def __init__(self, mongos: UpstreamOplog, latest: Callable[[], Timestamp | None],
                 gossip: Callable[[], Mapping[str, Any] | None],
                 apply: Callable[[list[Mapping[str, Any]], Timestamp], Awaitable[None]],
                 notify: Callable[[], None], demand: Demand, poll_s: float) -> None:
        self._mongos, self._latest, self._gossip = mongos, latest, gossip
        self._apply, self._notify, self._demand = apply, notify, demand
        self.poll_s = poll_s
        self.known: Timestamp | None = None  # the shard list is known up to this time
        self.task: asyncio.Task[Any] | None = None
        self.down_since: float | None = None  # listShards failing since
        self._wanted: Timestamp | None = None  # asked while a read is in flight
        self.refused = False  # the mongos refused config.shards at a time

    def refresh(self, until: Timestamp | None = None, *, periodic: bool = False) -> None:
        """Ask the mongos for its shards now, to know the list past `until` (one request at
        a time: one asked while another is in flight follows its reply at once, unless that
        reply is for a time past `until`; so one answer covers every event read meanwhile).
        `periodic`: the poll's, which reads at a time only while streams wait (else no
        no-op is written for it)."""
        if not periodic and until is None:
            self._demand.waited()  # a merged stream waits for the list
        if self.task is None or self.task.done():
            if periodic and not self._demand.recent():
                coro = self._read(None, at_time=False)
            else:
                coro = self._read(until)
            task = asyncio.get_running_loop().create_task(coro)
            task.add_done_callback(self._answered)
            self.task = task
            return
        if until is None:  # past every entry delivered (the events a merge can hold back)
            until = self._latest()
        if until is not None and (self._wanted is None or until > self._wanted):
            self._wanted = until

    def _answered(self, task: asyncio.Task[Any]) -> None:
        wanted, self._wanted = self._wanted, None
        if task.cancelled() or wanted is None or self.down_since is not None:
            return  # a mongos that does not answer is asked again by the poll
        known = self.known
        if known is None or known < wanted:
            self.refresh(wanted)

    async def poll(self) -> None:
        while True:
            self.refresh(periodic=True)
            task = self.task
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
            await asyncio.sleep(self.poll_s)

    async def _read(self, until: Timestamp | None = None, *, at_time: bool = True) -> None:
        target = self._latest() if at_time else None
        if until is not None and (target is None or until > target):
            target = until
        try:
            reply = await self._list_shards(target)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the mongos is away: the list stays as known
            log.debug("listShards: %s", exc)
            if self.down_since is None:
                self.down_since = time.monotonic()
            return
        self.down_since = None
        known = reply.get("operationTime")
        if not isinstance(known, Timestamp):
            cluster_time = reply.get("$clusterTime") or {}
            known = cluster_time.get("clusterTime")
        if not isinstance(known, Timestamp):
            return  # a list of no known time promises nothing
        await self._apply(list(reply.get("shards", [])), known)
        if self.known is None or known > self.known:
            self.known = known
            self._notify()

    async def _list_shards(self, target: Timestamp | None) -> Mapping[str, Any]:
        """The shard list, read for a time at or after `target`: `config.shards` through the
        mongos at `readConcern: {level: "majority", afterClusterTime: target}` (the config
        server writes a no-op past it if its oplog is behind it, as a shard does, so the
        answer's `operationTime` is not the last time the config server happened to write,
        up to its periodic no-op 10 s ago); a mongos that refuses that read is asked
        `listShards`. Both answer `{shards: [...]}` and the `operationTime` of the read."""
        import pymongo

        client = self._mongos.async_client()
        if target is not None and not self.refused:
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
                self.refused = True
            finally:
                await session.end_session()
        listed: Mapping[str, Any] = await client.admin.command("listShards")
        return listed
