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
