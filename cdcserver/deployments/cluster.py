"""The embedded sharded cluster (`serve --shards N`): N shards, each an embedded replica set
on its own port (`deployments/shard.py`), behind a mongos front on the server's port
(`sharding/router/`), sharing one catalog and one clock (`sharding/cluster.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdcserver.commands import auth, cursors, failpoints
from cdcserver.config import Config
from cdcserver.context import CommandTable, ConnectionState, Handler, ServerState
from cdcserver.deployment import Standalone
from cdcserver.deployments.embedded import EMBEDDED, store_options
from cdcserver.embedded.store import Store
from cdcserver.sharding import cluster_parameters
from cdcserver.sharding.cluster import ClusterLog, ShardedCluster
from cdcserver.sharding.router import commands as router
from cdcserver.sharding.router.routing import cluster_of, forward_default
from cdcserver.sharding.router.transactions import in_session
from pipeline_stages.image_source import ImageSource
from pipeline_stages.release import RELEASES


def routed_namespace(cmd: Mapping[str, Any], db: str) -> str | None:
    """The collection a command names, whose routing it depends on (None: a database's or
    the cluster's command)."""
    if db in ("admin", "config", "local") or not cmd:
        return None
    target = cmd[next(iter(cmd))]
    return f"{db}.{target}" if isinstance(target, str) and target else None


def holding_placement(handler: Handler) -> Handler:
    """`handler`, run while its collection's placement holds still: a chunk migration,
    movePrimary or resharding of it waits for the command to end, and the command waits for
    one under way (`migration.PlacementHolds`), so every shard it reaches answers for one
    routing table."""

    async def run(
        server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
    ) -> dict[str, Any]:
        ns = routed_namespace(cmd, db)
        if ns is None:
            return await handler(server, conn, cmd, db)
        async with cluster_of(server).placement.routing(ns):
            return await handler(server, conn, cmd, db)

    run.__name__ = getattr(handler, "__name__", "run")
    run.__dict__["__wrapped__"] = handler  # tables.describe names it
    return run


def _front_table() -> dict[str, Handler]:
    """mongos's own commands (`router.TABLE`), fail points, and every other command a shard
    knows forwarded to the primary shard of its database; each advances the cluster clock to
    the `$clusterTime` the client gossips."""
    table: dict[str, Handler] = {
        **router.TABLE,
        # mongos authenticates its clients itself, against the cluster's users (the shards'
        # users are the same; the front reaches them as the internal user).
        **auth.TABLE,
        "configureFailPoint": failpoints.configure_fail_point,
        # Every cursor's, whatever holds it: a merged stream, merged results, a shard's.
        "getMore": cursors.router_get_more,  # mongos's maxTimeMS check
        "killCursors": cursors.kill_cursors,
        # Set on every shard at one time, as the config server does; read from one.
        "setClusterParameter": cluster_parameters.set_cluster_parameter,
        "getClusterParameter": cluster_parameters.get_cluster_parameter,
    }
    for name in EMBEDDED:
        if not name.startswith("$"):
            table.setdefault(name, forward_default)
    return {name: router.gossiping(in_session(holding_placement(handler)))
            for name, handler in table.items()}


CLUSTER = CommandTable("sharded front", _front_table())


class ClusterDeployment(Standalone):
    """The front's view: the cluster clock is its time; the shards listen before it and stop
    after it; their stores close last."""

    commands: CommandTable = CLUSTER
    store: Store | None = None  # the front's commands reach the shards' stores
    images: ImageSource | None = None  # its streams look images up on each shard
    tailer = None
    follow = False

    def __init__(self, cluster: ShardedCluster, shards_host: str = "127.0.0.1") -> None:
        self.cluster = cluster
        self.shards_host = shards_host

    @property
    def oplog(self) -> ClusterLog:
        return self.cluster.oplog

    async def start(self, host: str) -> None:
        # The shards' ports: on `server.shards_host` (loopback unless set), not the front's.
        await self.cluster.start_shards(self.shards_host)

    async def stop(self) -> None:
        await self.cluster.stop_shards()

    def close(self) -> None:
        self.cluster.close_stores()


def open_cluster(config: Config, shards: int) -> ClusterDeployment:
    """`serve --shards N`: the cluster of `config.store` (in memory or in store.data_dir)."""
    from cdcserver.tls import server_context

    sc = config.store
    cluster = ShardedCluster(
        shards, None if sc.in_memory else sc.data_dir, noop_interval_s=0.0,
        store_options=store_options(config), auth=config.auth,
        ssl_context=server_context(config.tls),
        release=RELEASES[config.server.compatibility],
    )
    return ClusterDeployment(cluster, config.server.shards_host or "127.0.0.1")
