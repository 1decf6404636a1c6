"""The sharded front's cluster parameters (mongos's setClusterParameter/getClusterParameter).

mongos hands `setClusterParameter` to the config server, which checks it, chooses its
`clusterParameterTime` and sends `_shardsvrSetClusterParameter` (the parameter and that time)
to every shard; each shard writes it into its own `config.clusterParameters`. The front does
the config server's part: the same checks as a replica set's (so the same errors), one time
for all, every shard in turn. `getClusterParameter` is answered from one shard (all hold the
same value).
"""

from __future__ import annotations

from typing import Any

from cdcserver.commands import cluster_parameters
from cdcserver.context import ConnectionState, ServerState
from cdcserver.sharding.router.routing import cluster_of, forward
from pipeline_stages.errors import MongoError


async def set_cluster_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if db != "admin":
        raise MongoError(13, "setClusterParameter may only be run against the admin database.")
    param, value = cluster_parameters.parameter_to_set(cmd)
    when = cluster_parameters.cluster_time_now(server)
    cluster_parameters.parameter_document(param, value, when)  # refused before any shard
    cluster = cluster_of(server)
    for shard in cluster.shards:
        await forward(cluster, shard, {
            "_shardsvrSetClusterParameter": {param: value},
            "clusterParameterTime": when,
        }, "admin")
    return {}


async def get_cluster_parameter(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    return await forward(cluster, cluster.shards[0], cmd, db)
