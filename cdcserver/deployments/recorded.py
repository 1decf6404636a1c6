"""A recorded oplog (`serve --oplog F...`, `--sample`): a replica set's history, read from its
files (`--follow`: the last one as another process appends to it). No store: the commands
that need one first thing answer 115 (`transactions.needs_store`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cdcserver.commands import handshake, queries, transactions
from cdcserver.commands.tables import OWN, STORE_ONLY
from cdcserver.context import CommandTable
from cdcserver.deployment import Standalone
from cdcserver.embedded.store import Store
from cdcserver.sources.base import OplogLog
from cdcserver.sources.file import FileOplog
from pipeline_stages.image_source import ImageSource

RECORDED = CommandTable("recorded", {
    **OWN,
    **dict.fromkeys(STORE_ONLY, transactions.needs_store),
    "aggregate": queries.aggregate,  # a change stream, the oplog, $currentOp / $collStats
    "listCollections": handshake.list_collections,  # the oplog's namespaces
    "listDatabases": handshake.list_databases,
})


class RecordedDeployment(Standalone):
    commands = RECORDED
    store: Store | None = None
    images: ImageSource | None = None  # a recording has no images

    def __init__(self, oplog: OplogLog, *, follow: bool = False) -> None:
        self.oplog = oplog
        self.follow = follow

    @property
    def tailer(self) -> Callable[[], Awaitable[None]] | None:
        return self.oplog.follow if isinstance(self.oplog, FileOplog) else None


def open_recorded(paths: list[str], *, follow: bool) -> RecordedDeployment:
    """`serve --oplog F...` (raises OplogFileError for a file that cannot be read)."""
    return RecordedDeployment(FileOplog(paths), follow=follow)
