"""What the three mongos fronts (the embedded cluster, a sidecar of a real one, recorded shard
oplogs) have in common as a server's log: no entries of their own (their streams read each
shard's oplog and merge them), the shards' namespaces and sizes."""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from cdcserver.sources.base import OplogLog
from pipeline_stages.oplog_entry import Entry


class FrontLog(OplogLog):
    """`self.cluster.shards` are the shards, each with its `log`."""

    cluster: Any

    def oldest_entry(self) -> Entry | None:
        return None

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        return []

    def entry_at(self, ts: Timestamp) -> Entry | None:
        return None

    def namespaces(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for shard in self.cluster.shards:
            out |= shard.log.namespaces()
        return out

    def __len__(self) -> int:
        return sum(len(shard.log) for shard in self.cluster.shards)
