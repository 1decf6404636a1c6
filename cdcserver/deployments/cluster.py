"""The embedded sharded cluster (`serve --shards N`): N shards, each an embedded replica set
on its own port (`deployments/shard.py`), behind a mongos front on the server's port
(`sharding/front.py`), sharing one catalog and one clock (`sharding/cluster.py`)."""

from __future__ import annotations

from cdcserver.commands import cursors, failpoints
from cdcserver.config import Config
from cdcserver.context import CommandTable, Handler
from cdcserver.deployment import Standalone
from cdcserver.deployments.embedded import EMBEDDED, store_options
from cdcserver.embedded.store import Store
from cdcserver.sharding import front
from cdcserver.sharding.cluster import ClusterLog, ShardedCluster
from pipeline_stages.image_source import ImageSource


def _front_table() -> dict[str, Handler]:
    """mongos's own commands (`front.TABLE`), fail points, and every other command a shard
    knows forwarded to the primary shard of its database; each advances the cluster clock to
    the `$clusterTime` the client gossips."""
    table: dict[str, Handler] = {
        **front.TABLE,
        "configureFailPoint": failpoints.configure_fail_point,
        # Every cursor's, whatever holds it: a merged stream, merged results, a shard's.
        "getMore": cursors.get_more,
        "killCursors": cursors.kill_cursors,
    }
    for name in EMBEDDED:
        if not name.startswith("$"):
            table.setdefault(name, front.forward_default)
    return {name: front.gossiping(handler) for name, handler in table.items()}


CLUSTER = CommandTable("sharded front", _front_table())


class ClusterDeployment(Standalone):
    """The front's view: the cluster clock is its time; the shards listen before it and stop
    after it; their stores close last."""

    commands: CommandTable = CLUSTER
    store: Store | None = None  # the front's commands reach the shards' stores
    images: ImageSource | None = None  # its streams look images up on each shard
    tailer = None
    follow = False

    def __init__(self, cluster: ShardedCluster) -> None:
        self.cluster = cluster

    @property
    def oplog(self) -> ClusterLog:
        return self.cluster.front_log

    async def start(self, host: str) -> None:
        await self.cluster.start_shards(host)

    async def stop(self) -> None:
        await self.cluster.stop_shards()

    def close(self) -> None:
        self.cluster.close_stores()


def open_cluster(config: Config, shards: int) -> ClusterDeployment:
    """`serve --shards N`: the cluster of `config.store` (in memory or in store.data_dir)."""
    sc = config.store
    cluster = ShardedCluster(
        shards, None if sc.in_memory else sc.data_dir, noop_interval_s=0.0,
        store_options=store_options(config),
    )
    return ClusterDeployment(cluster)
