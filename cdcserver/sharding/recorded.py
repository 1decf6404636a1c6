"""Recorded oplogs of a sharded cluster: `cdcserver serve --oplog A... --oplog B...`.

Each `--oplog` is one shard's recording (its files in order). The server is a mongos to its
clients: a change stream runs on every shard's recording and the streams are merged as mongos
merges them (`streams.py`, `pipeline_stages/merge.py`), so the events, their order and their
tokens are those of `cdcserver replay` with the same `--oplog`s. A recording has nothing more
to come, so a shard that has been read to its end promises the end of every recording: no
shard holds the others back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.commands import queries
from cdcserver.context import ConnectionState, ServerState
from cdcserver.deployment import server_state
from cdcserver.deployments.recorded import RecordedDeployment
from cdcserver.sharding.router.change_streams import open_change_stream
from cdcserver.sources.file import FileOplog
from cdcserver.sources.merged import MergedOplog
from pipeline_stages.spec import is_change_stream_aggregate


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


@dataclass(eq=False)
class RecordedShard:
    name: str
    log: FileOplog
    state: ServerState


class RecordedShards(MergedOplog):
    """The recordings as one oplog (`MergedOplog`), and as the cluster a merged stream reads
    (`streams.MergedCluster`): a recording's shard list is fixed."""

    def __init__(self, shards: list[list[str]]) -> None:
        super().__init__(lambda: [s.log for s in self.shards])
        self.shards: list[RecordedShard] = []
        for k, paths in enumerate(shards):
            log = FileOplog(list(paths))
            self.shards.append(
                RecordedShard(f"shard{k}", log, server_state(RecordedDeployment(log))))
        self._by_name = {s.name: s for s in self.shards}
        self.retired: list[RecordedShard] = []

    # -- the cluster, as streams.py reads it -----------------------------------------------------

    def joined_at(self, name: str) -> Timestamp | None:
        return None

    def removed_at(self, name: str) -> Timestamp | None:
        return None

    def shard(self, name: str) -> RecordedShard:
        return self._by_name[name]

    def idle_promise(self, name: str) -> Timestamp:
        end = self.latest_ts()
        return next_ts(end) if end is not None else Timestamp(0, 1)

    def start_for_new_stream(self) -> Timestamp:
        end = self.latest_ts()
        return next_ts(end) if end is not None else Timestamp(0, 1)


def _recorded(server: ServerState) -> RecordedShards:
    oplog = server.oplog
    if not isinstance(oplog, RecordedShards):  # the table of another mode: a bug
        raise TypeError(f"the recorded front's command on {type(oplog).__name__}")
    return oplog




async def _aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if not is_change_stream_aggregate(cmd):
        return await queries.aggregate(server, conn, cmd, db)
    return await open_change_stream(server, _recorded(server), cmd, db)

