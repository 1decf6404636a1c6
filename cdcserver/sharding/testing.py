"""An embedded sharded cluster in this process, for tests: `ShardedServer(shards=2)`.

The front's `uri` is a mongos (pymongo sees a sharded topology); `shard_uris` are the shards'
own replica sets. Everything listens on free loopback ports; `stop()` closes all of it.
"""

from __future__ import annotations

import pathlib
from typing import Any

from cdcserver.config import Config
from cdcserver.testing import ThreadServer


class ShardedServer(ThreadServer):
    def __init__(self, shards: int = 2, data_dir: str | pathlib.Path | None = None,
                 config: Config | None = None, **state_options: Any) -> None:
        """`config`: its [auth] and [tls] guard the front and every shard alike; its
        [server] compatibility is the front's and every shard's release."""
        from cdcserver.deployments.cluster import ClusterDeployment
        from cdcserver.sharding.cluster import ShardedCluster
        from cdcserver.tls import server_context
        from pipeline_stages.release import DEFAULT_RELEASE, RELEASES

        self.cluster = ShardedCluster(
            shards, None if data_dir is None else str(data_dir),
            auth=None if config is None else config.auth,
            ssl_context=None if config is None else server_context(config.tls),
            release=DEFAULT_RELEASE if config is None else RELEASES[config.server.compatibility],
        )
        self.cluster_deployment = ClusterDeployment(self.cluster)
        super().__init__(make_deployment=lambda: self.cluster_deployment, config=config,
                         **state_options)

    def restart_shard(self, index: int, while_down: Any = None) -> None:
        """Close shard `index`'s listener (every connection to it drops), run `while_down()`,
        then listen again on the same port (its store, like a durable one, keeps its data)."""
        from cdcserver.server import Server

        shard = self.cluster.shards[index]
        self.run(shard.server.close())
        if while_down is not None:
            while_down()

        async def start() -> None:
            server = Server(shard.state, ssl_context=self.cluster.ssl_context)
            await server.start(shard.host, shard.port)
            shard.server = server

        self.run(start())

    @property
    def shard_uris(self) -> list[str]:
        return [f"mongodb://{s.host}:{s.port}/?directConnection=true"
                for s in self.cluster.shards]

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            super().stop()  # the front, then the shards' listeners
        finally:
            self.cluster_deployment.close()


class ShardedSidecar(ThreadServer):
    """`serve --upstream <mongos>` in this process: a sidecar of a sharded cluster (e.g. a
    `ShardedServer`), itself a mongos to its clients."""

    def __init__(self, mongos_uri: str, **options: Any) -> None:
        from cdcserver.deployments.sidecar import SidecarDeployment
        from cdcserver.sharding.sidecar import ShardedUpstream, mongos_shards
        from cdcserver.sources.mongo import UpstreamOptions

        shards = mongos_shards(mongos_uri)
        if shards is None:
            raise ValueError(f"{mongos_uri} is not a mongos")
        self.upstream = ShardedUpstream(UpstreamOptions(uri=mongos_uri, **options), shards)
        self.upstream.prime()
        self.sidecar_deployment = SidecarDeployment(self.upstream)
        super().__init__(make_deployment=lambda: self.sidecar_deployment)

    async def _start(self) -> Any:
        server = await super()._start()
        await self.upstream.wait_ready(10.0)
        return server
