"""The embedded store (`serve`, `--in-memory`, `--data-dir`): a replica set of one whose oplog
is the store's own; drivers write to it and watch their own writes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from cdcserver.commands import ddl
from cdcserver.commands.tables import OWN
from cdcserver.config import Config
from cdcserver.context import CommandTable
from cdcserver.deployment import Standalone
from cdcserver.embedded.store import Store
from cdcserver.sources.embedded import EmbeddedOplog
from pipeline_stages.image_source import ImageSource

EMBEDDED = CommandTable("embedded", {
    **OWN,
    "aggregate": ddl.aggregate_refusing_views,  # then queries.aggregate
    "listCollections": ddl.list_collections,  # the store's collections and views
    "listDatabases": ddl.list_databases,
})


class EmbeddedDeployment(Standalone):
    """The store and its oplog; `follow` runs the oplog's periodic no-op writer."""

    commands: CommandTable = EMBEDDED

    def __init__(self, store: Store, oplog: EmbeddedOplog | None = None, *,
                 follow: bool = False) -> None:
        self.store = store
        self.oplog = oplog if oplog is not None else EmbeddedOplog(store, noop_interval_s=0)
        self.follow = follow

    @property
    def images(self) -> ImageSource:
        return self.store.images

    @property
    def tailer(self) -> Callable[[], Awaitable[None]]:
        return self.oplog.follow

    def close(self) -> None:
        self.store.close()  # commits what is pending and closes the SQLite file


def store_options(config: Config) -> dict[str, Any]:
    """The `[store]` options a Store takes (a sharded cluster's shards take them too)."""
    sc = config.store
    return {
        "synchronous": sc.synchronous,
        "oplog_size_bytes": sc.oplog_size_mb * 1024 * 1024,
        "txn_oplog_entry_bytes": sc.txn_oplog_entry_bytes,
        "txn_oplog_entry_ops": sc.txn_oplog_entry_ops,
        "ttl_monitor_sleep_secs": sc.ttl_monitor_sleep_secs,
        "transaction_lifetime_limit_seconds": sc.transaction_lifetime_limit_seconds,
        "oplog_min_retention_hours": sc.oplog_min_retention_hours,
    }


def open_embedded(config: Config) -> EmbeddedDeployment:
    """The embedded store of `config.store` (durable in `store.data_dir`, or in memory)."""
    sc = config.store
    store = Store(None if sc.in_memory else sc.data_dir, **store_options(config))
    oplog = EmbeddedOplog(store, noop_interval_s=sc.noop_interval_s)
    return EmbeddedDeployment(store, oplog, follow=sc.noop_interval_s > 0)
