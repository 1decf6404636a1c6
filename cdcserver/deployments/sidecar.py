"""A sidecar of a real sharded cluster (`serve --upstream <mongos>`): every shard's oplog
tailed (`sharding/sidecar.py`), change streams merged as mongos merges them, every other
command forwarded to the mongos (the table's default entry)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pymongo

from cdcserver.commands import cursors, failpoints
from cdcserver.commands.proxy import ForwardedCursor
from cdcserver.config import Config
from cdcserver.context import CommandTable, Route
from cdcserver.cursors import CursorManager
from cdcserver.deployment import Standalone
from cdcserver.deployments.upstream import upstream_options
from cdcserver.embedded.store import Store
from cdcserver.sharding import sidecar
from cdcserver.sharding.router import handshake
from cdcserver.sharding.sidecar import ShardedUpstream, mongos_shards
from pipeline_stages.image_source import ImageSource

log = logging.getLogger(__name__)

SIDECAR = CommandTable(
    "sharded sidecar",
    {
        "hello": handshake.hello,
        "isMaster": handshake.is_master,
        "ismaster": handshake.is_master,
        "ping": sidecar._ping,
        "configureFailPoint": failpoints.configure_fail_point,
        # Snapshot reads of materialized namespaces: the shards' copies (materialize/
        # snapshot.py), merged; every other find / distinct / aggregate as before.
        "aggregate": Route(sidecar.route_aggregate),
        "find": Route(sidecar.route_find),
        "distinct": Route(sidecar.route_distinct),
        "serverStatus": sidecar._server_status,  # the mongos's, with the shards' copies
        # Every cursor's: a merged stream here, the mongos's forwarded to it.
        "getMore": cursors.get_more,
        "killCursors": cursors.kill_cursors,
    },
    default=sidecar._forward,
    forwarding=(sidecar._forward,),
)


class SidecarDeployment(Standalone):
    """The shards' tails start before the listener and stop after it."""

    commands: CommandTable = SIDECAR
    store: Store | None = None
    images: ImageSource | None = None  # its streams look images up on each shard
    tailer = None  # each shard's tail runs from start()
    follow = False

    def __init__(self, upstream: ShardedUpstream) -> None:
        self.oplog = upstream

    async def start(self, host: str) -> None:
        await self.oplog.start_cluster(host)

    async def stop(self) -> None:
        await self.oplog.stop_cluster()

    def cursor_elsewhere(
        self, registry: CursorManager
    ) -> Callable[[int, str], ForwardedCursor]:
        """A cursor id not held here may be the mongos's (reaped here, not there)."""
        return lambda cursor_id, ns: ForwardedCursor(
            cursor_id, ns, None, self.oplog.mongos, registry)


def open_sidecar(config: Config) -> SidecarDeployment | None:
    """`serve --upstream URI`: a sidecar of the sharded cluster when URI is a mongos (None
    for a replica set, or when the upstream cannot be asked now: the replica-set path then
    reports it)."""
    try:
        shards = mongos_shards(config.upstream.uri, timeout_s=2.0)
    except pymongo.errors.PyMongoError:
        return None
    if shards is None:
        return None
    if config.upstream.materialize:
        log.warning("upstream.materialize of a sharded cluster: each shard's copy answers the "
                    "images of its writes; snapshot reads merge the shards' copies")
    upstream = ShardedUpstream(upstream_options(config), shards, config.upstream.materialize)
    upstream.prime()
    log.info("upstream is a mongos: tailing %d shards (%s)", len(shards),
             ", ".join(s.name for s in upstream.shards))
    return SidecarDeployment(upstream)
