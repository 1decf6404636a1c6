"""An embedded sharded cluster in this process, for tests: `ShardedServer(shards=2)`.

The front's `uri` is a mongos (pymongo sees a sharded topology); `shard_uris` are the shards'
own replica sets. Everything listens on free loopback ports; `stop()` closes all of it.
"""

from __future__ import annotations

import pathlib
from typing import Any

from cdcserver.testing import HOST, ThreadServer


class ShardedServer(ThreadServer):
    def __init__(self, shards: int = 2, data_dir: str | pathlib.Path | None = None,
                 **state_options: Any) -> None:
        from cdcserver.sharding.cluster import ShardedCluster

        self.cluster = ShardedCluster(shards, None if data_dir is None else str(data_dir))
        super().__init__(make_log=lambda: self.cluster.front_log, follow=False, **state_options)

    async def _start(self) -> Any:
        from cdcserver.context import ServerState
        from cdcserver.server import Server

        log = self.cluster.front_log
        await log.start_cluster(HOST)
        state = ServerState(log=log, **self._state_options)
        server = Server(state, self._max_connections, commands=log.command_table)
        await server.start(HOST, 0)
        return server

    def restart_shard(self, index: int, while_down: Any = None) -> None:
        """Close shard `index`'s listener (every connection to it drops), run `while_down()`,
        then listen again on the same port (its store, like a durable one, keeps its data)."""
        from cdcserver.server import Server
        from cdcserver.sharding.shard_commands import SHARD_COMMANDS

        shard = self.cluster.shards[index]
        self.run(shard.server.close())
        if while_down is not None:
            while_down()

        async def start() -> None:
            server = Server(shard.state, commands=SHARD_COMMANDS)
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
            self.run(self.cluster.front_log.stop_cluster())
        finally:
            try:
                super().stop()
            finally:
                self.cluster.close_stores()


class ShardedSidecar(ThreadServer):
    """`serve --upstream <mongos>` in this process: a sidecar of a sharded cluster (e.g. a
    `ShardedServer`), itself a mongos to its clients."""

    def __init__(self, mongos_uri: str, **options: Any) -> None:
        from cdcserver.sharding.sidecar import ShardedUpstream, mongos_shards
        from cdcserver.sources.mongo import UpstreamOptions

        shards = mongos_shards(mongos_uri)
        if shards is None:
            raise ValueError(f"{mongos_uri} is not a mongos")
        self.upstream = ShardedUpstream(UpstreamOptions(uri=mongos_uri, **options), shards)
        self.upstream.prime()
        super().__init__(make_log=lambda: self.upstream, follow=False)

    async def _start(self) -> Any:
        from cdcserver.context import ServerState
        from cdcserver.server import Server

        log = self.upstream
        await log.start_cluster(HOST)
        await log.wait_ready(10.0)
        state = ServerState(log=log)
        server = Server(state, self._max_connections, commands=log.command_table)
        await server.start(HOST, 0)
        return server

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            self.run(self.upstream.stop_cluster())
        finally:
            super().stop()
