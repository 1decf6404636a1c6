"""The embedded sharded cluster: N shards (each an embedded replica set with its own store,
oplog and port) behind a mongos front (`router/`), sharing one catalog and one clock.

The front reaches the shards in-process (their command handlers, their oplogs); each shard
also listens on its own loopback port, as listed in `config.shards` / `listShards`, so that a
client or a sidecar can talk to it directly.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.auth import SYSTEM_USER, ConnectionAuth, ServerAuth
from cdcserver.config import AuthConfig
from cdcserver.context import ConnectionState, ServerState
from cdcserver.deployment import server_state
from cdcserver.deployments.embedded import EmbeddedDeployment
from cdcserver.deployments.shard import ShardDeployment
from cdcserver.sharding import migration
from cdcserver.sharding.catalog import ShardingCatalog
from cdcserver.sharding.coordinator import CoordinatorLog
from cdcserver.sharding.lookups import RoutedImages
from cdcserver.sharding.router.participants import TransactionRouters
from cdcserver.sharding.shard_store import ClusterClock, ShardStore
from cdcserver.sources.embedded import EmbeddedOplog
from cdcserver.sources.merged import MergedOplog
from pipeline_stages.release import DEFAULT_RELEASE, Release


@dataclass(eq=False)
class Shard:
    name: str
    store: ShardStore
    log: EmbeddedOplog
    state: ServerState
    conn: ConnectionState  # the front's connection to this shard (in-process)
    server: Any = None  # its listener (cdcserver.server.Server) once started
    host: str = "127.0.0.1"
    port: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def host_string(self) -> str:
        return f"{self.name}/{self.host}:{self.port}"


class ClusterLog(MergedOplog):
    """The front's oplog: its shards' oplogs as one (`MergedOplog`), its time the cluster
    clock (operationTime, $clusterTime, hello's lastWrite)."""

    def __init__(self, cluster: ShardedCluster) -> None:
        super().__init__(lambda: [s.log for s in cluster.shards + cluster.retired])
        self.cluster = cluster

    def latest_ts(self) -> Timestamp | None:
        last = self.cluster.clock.last
        return None if last == Timestamp(0, 0) else last


class ShardedCluster:
    def __init__(
        self,
        shards: int,
        data_dir: str | None = None,
        *,
        noop_interval_s: float = 0.0,
        store_options: dict[str, Any] | None = None,
        auth: AuthConfig | None = None,
        ssl_context: ssl.SSLContext | None = None,
        release: Release = DEFAULT_RELEASE,
    ) -> None:
        """`release`: the one the front answers as ([server] compatibility); every shard
        answers as it too (hello, buildInfo, serverStatus), as a cluster of one binary."""
        if shards < 1:
            raise ValueError(f"server.shards (--shards): {shards}; a cluster needs 1 or more")
        self.clock = ClusterClock()
        # Every port guarded alike: each shard's listener asks for the front's [auth] users
        # and speaks its TLS.
        self._auth = auth
        self.ssl_context = ssl_context
        self.release = release
        names = [f"shard{k}" for k in range(shards)]
        config_path = None
        if data_dir is not None:
            os.makedirs(data_dir, exist_ok=True)
            config_path = os.path.join(data_dir, "config.bson")
        self.catalog = ShardingCatalog(names, config_path)  # a saved shard list replaces names
        self.data_dir = data_dir
        self._noop_interval_s = noop_interval_s
        self._store_options = store_options or {}
        self.shards: list[Shard] = []
        # Removed shards (removeShard completed): out of the cluster, but their oplogs stay
        # readable (a stream resumed from before the removal reads them up to its end) and
        # their listeners stay up, as the replica set of a removed shard keeps running.
        self.retired: list[Shard] = []
        self._by_name: dict[str, Shard] = {}
        self._host: str | None = None  # set once the shards listen
        self.oplog = ClusterLog(self)
        for name in list(self.catalog.shard_names):
            self.shards.append(self._make_shard(name))
        for name in self.catalog.removed:
            self.retired.append(self._make_shard(name))
        # Cross-shard commits decided before a crash are finished now (mongod's coordinator
        # recovery); their participants' oplogs then hold them at their times.
        self.coordinator = CoordinatorLog(data_dir)
        if self.coordinator.pending:
            self.coordinator.recover({s.name: s.store for s in self.shards + self.retired})
        # Data moves a crash interrupted are finished or undone (sharding/migration.py).
        migration.recover(self.catalog, self.stores())
        self.placement = migration.PlacementHolds()
        # Transactions through the front: each session's, as mongos's router keeps it.
        self.txn_routers = TransactionRouters()
        self.cursor_owner: dict[int, str] = {}  # forwarded cursors: id -> shard
        self.balancer_rounds = 0
        # Results merged on the front, read by getMore: cursor id -> (ns, documents left).
        self.results: dict[int, tuple[str, Any]] = {}
        self._merger: tuple[ServerState, ConnectionState] | None = None
        self._merges = 0

    def _make_shard(self, name: str) -> Shard:
        shard_dir = None
        if self.data_dir is not None:
            shard_dir = os.path.join(self.data_dir, name)
            os.makedirs(shard_dir, exist_ok=True)
        store = ShardStore(shard_dir, clock=self.clock, catalog=self.catalog, shard_name=name,
                           **self._store_options)
        log = EmbeddedOplog(store, noop_interval_s=self._noop_interval_s)
        store.listeners.append(self.oplog.notify)
        state = server_state(ShardDeployment(store, log), set_name=name)
        state.configured_release = self.release
        if self._auth is not None and (self._auth.enabled or self._auth.users):
            state.auth = ServerAuth(self._auth)  # the front's users, asked for as it asks
        # The front's own connection to the shard (in-process): the cluster's internal user.
        front_conn = ConnectionState(-1 - len(self._by_name), "mongos")
        front_conn.auth = ConnectionAuth(users=[SYSTEM_USER])
        shard = Shard(name, store, log, state, front_conn)
        self._by_name[name] = shard
        return shard

    def joined_at(self, name: str) -> Timestamp | None:
        """The cluster time shard `name` was added at (its topologyTime)."""
        return self.catalog.topology_time.get(name)

    def removed_at(self, name: str) -> Timestamp | None:
        """The cluster time shard `name`'s removal completed at (None: a member)."""
        return self.catalog.removed.get(name)

    def find_shard(self, ident: Any) -> str | None:
        """The member shard `ident` names, as mongod's ShardRegistryData::findShard reads it:
        its name, else its connection string (`shard0/host:port`), else one of its hosts."""
        if not isinstance(ident, str) or not ident:
            return None
        if ident in self.catalog.shard_names:
            return ident
        members = [s for s in self.shards if s.name in self.catalog.shard_names]
        for shard in members:
            if shard.port and shard.host_string == ident:
                return shard.name
        for shard in members:
            if shard.port and f"{shard.host}:{shard.port}" == ident:
                return shard.name
        return None

    def shard_names_ever(self) -> set[str]:
        return set(self._by_name)

    async def add_shard(self, name: str) -> Shard:
        """addShard: a new embedded replica set joins at a fresh cluster time (its
        topologyTime); it listens on a port of its own when the cluster does."""
        shard = self._make_shard(name)
        await self._take_cluster_fcv(shard)
        if self._host is not None:
            await self._listen(shard, self._host)
        self.catalog.add_shard(name, self.clock.tick())
        self.shards.append(shard)
        self.oplog.notify()  # open streams take the new shard in
        return shard

    async def _take_cluster_fcv(self, shard: Shard) -> None:
        """A joining shard is set to the cluster's FCV (mongod's addShard sets the new
        replica set's to the config server's), when that is not its own."""
        from cdcserver.commands.fcv import feature_compatibility_version

        if not self.shards:
            return
        wanted = feature_compatibility_version(self.shards[0].state)
        if feature_compatibility_version(shard.state) == wanted:
            return
        from cdcserver.commands.registry import run_command

        reply = await run_command(shard.state, shard.conn, {
            "setFeatureCompatibilityVersion": wanted, "confirm": True, "$db": "admin"})
        if reply.get("ok") != 1:
            raise RuntimeError(f"shard {shard.name} cannot take FCV {wanted}: {reply}")

    def retire_shard(self, shard: Shard) -> None:
        """removeShard completed: the shard leaves the cluster at a fresh cluster time (after
        its last entry); streams read it to its end, then go on without it."""
        self.catalog.remove_shard(shard.name, self.clock.tick())
        self.shards.remove(shard)
        self.retired.append(shard)
        self.oplog.notify()

    async def apply_update(self, doc: Any, stmt: Any) -> Any:
        """The document an update statement makes of `doc` (run by the front's merger store),
        or None when the update fails there (the shard then reports its error)."""
        one = {k: v for k, v in stmt.items() if k in ("u", "arrayFilters", "collation", "c")}
        return await self._merged_document([doc], {"q": {"_id": doc["_id"]}, **one})

    async def upsert_document(self, stmt: Any) -> Any:
        """The document an upsert statement inserts when nothing matches (run by the front's
        merger store on an empty collection), or None when it fails there."""
        one = {k: v for k, v in stmt.items()
               if k in ("q", "u", "arrayFilters", "collation", "c")}
        return await self._merged_document([], {**one, "upsert": True})

    async def _merged_document(self, docs: list[Any], update: dict[str, Any]) -> Any:
        """The merger store runs the update statement `update` on a scratch collection holding
        `docs`: the first document left there, or None when the update fails."""
        from cdcserver.commands.registry import run_command

        state, conn = self._merger_state()
        self._merges += 1
        db = f"__merge{self._merges}"
        try:
            if docs:
                await run_command(state, conn, {"insert": "docs", "documents": docs, "$db": db})
            reply = await run_command(state, conn, {
                "update": "docs", "updates": [update], "$db": db})
            if reply.get("ok") != 1 or reply.get("writeErrors"):
                return None
            found = await run_command(state, conn, {"find": "docs", "$db": db})
            batch = found["cursor"]["firstBatch"]
            return batch[0] if batch else None
        finally:
            await run_command(state, conn, {"dropDatabase": 1, "$db": db})

    def _merger_state(self) -> tuple[ServerState, ConnectionState]:
        from cdcserver.embedded.store import Store

        if self._merger is None:
            store = Store(None, oplog_size_bytes=1024 * 1024)
            self._merger = (server_state(EmbeddedDeployment(store)),
                            ConnectionState(-1000, "mongos merger"))
        return self._merger

    def shard(self, name: str) -> Shard:
        return self._by_name[name]

    def stores(self) -> dict[str, ShardStore]:
        """The member shards' stores, by shard name (what data moves write to)."""
        return {s.name: s.store for s in self.shards}

    def changed_event(self) -> asyncio.Event:
        return self.oplog.changed_event()

    def lookup_images(self, name: str) -> RoutedImages:
        """Shard `name`'s part of a merged stream looks documents up through the router."""
        return RoutedImages(self.catalog, lambda: {s.name: s.store.images for s in self.shards},
                            name)

    def idle_promise(self, name: str) -> Timestamp:
        """What a shard that has read its whole oplog promises: the cluster's next time (its
        timestamps come from the cluster clock)."""
        return self.clock.next_ts()

    def start_for_new_stream(self) -> Timestamp:
        return self.clock.next_ts()

    async def start_shards(self, host: str = "127.0.0.1") -> None:
        self._host = host
        for shard in self.shards + self.retired:
            await self._listen(shard, host)

    async def _listen(self, shard: Shard, host: str) -> None:
        from cdcserver.server import Server

        server = Server(shard.state, ssl_context=self.ssl_context)
        shard.port = await server.start(host, 0)
        shard.host = host
        shard.server = server
        self.catalog.shard_hosts[shard.name] = shard.host_string

    async def stop_shards(self) -> None:
        self._host = None
        every = self.shards + self.retired
        for shard in every:
            if shard.server is not None:
                await shard.server.close()
                shard.server = None
        for shard in every:
            for cursor in list(shard.state.cursors.cursors.values()):
                cursor.close()

    def close_stores(self) -> None:
        for shard in self.shards + self.retired:
            shard.store.close()

