"""A shard of the embedded sharded cluster (a `--shardsvr` mongod on its own port): the
embedded replica set's commands, plus `appendOplogNote`, with its reads waiting for their
`afterClusterTime` as a shard server's do (`sharding/shard_commands.py`)."""

from __future__ import annotations

from cdcserver.commands import cluster_parameters
from cdcserver.context import CommandTable
from cdcserver.deployments.embedded import EMBEDDED, EmbeddedDeployment
from cdcserver.sharding import shard_commands

SHARD = CommandTable("shard", {
    **EMBEDDED,
    **{name: shard_commands.waiting_for_read_concern(EMBEDDED[name])
       for name in shard_commands.READS if name in EMBEDDED},
    "appendOplogNote": shard_commands.append_oplog_note,
    **cluster_parameters.SHARD_TABLE,  # only the front sets them (_shardsvrSetClusterParameter)
})


class ShardDeployment(EmbeddedDeployment):
    """A shard's store and oplog; the cluster (`sharding/cluster.py`) starts its listener."""

    commands: CommandTable = SHARD
