"""Recorded oplogs of a sharded cluster (`serve --oplog A... --oplog B...`): a mongos to its
clients, its change streams each shard's recording merged as mongos merges them
(`sharding/recorded.py`); every other command as a recorded oplog answers it."""

from __future__ import annotations

from cdcserver.commands import cursors
from cdcserver.context import CommandTable, Handler, Route
from cdcserver.deployment import Standalone
from cdcserver.deployments.recorded import RECORDED
from cdcserver.embedded.store import Store
from cdcserver.sharding import recorded
from cdcserver.sharding.recorded import RecordedShards
from cdcserver.sharding.router import handshake
from pipeline_stages.image_source import ImageSource

_OWN: dict[str, Handler] = {
    "hello": handshake.hello,
    "isMaster": handshake.is_master,
    "ismaster": handshake.is_master,
    "aggregate": recorded._aggregate,  # a change stream merged from every shard's recording
    "getMore": cursors.router_get_more,  # mongos's maxTimeMS check
}
_RECORDED: dict[str, Handler | Route] = {
    k: v for k, v in RECORDED.items() if not k.startswith("$")
}
RECORDED_SHARDS = CommandTable("recorded sharded front", {**_RECORDED, **_OWN})


class RecordedShardsDeployment(Standalone):
    commands: CommandTable = RECORDED_SHARDS
    store: Store | None = None
    images: ImageSource | None = None  # a recording has no images
    tailer = None
    follow = False

    def __init__(self, shards: RecordedShards) -> None:
        self.oplog = shards


def open_recorded_shards(shards: list[list[str]]) -> RecordedShardsDeployment:
    """One recording per shard, each its files in order (raises OplogFileError)."""
    return RecordedShardsDeployment(RecordedShards(shards))
