"""State shared by the command handlers: the server (one per process) and each connection."""

from __future__ import annotations

import asyncio
import datetime
import os
from dataclasses import dataclass, field
from typing import Any

from bson.objectid import ObjectId

from cdcserver.cursors import CursorManager
from cdcserver.sources.base import OplogLog
from pipeline_stages.image_source import ImageSource


@dataclass
class ServerState:
    log: OplogLog
    images: ImageSource | None = None  # pre-images and current documents, when there are any
    host: str = "127.0.0.1"
    port: int = 27017
    set_name: str = "cdcserver"
    advertised_host: str | None = None  # host:port drivers are told to use
    cursors: CursorManager = field(default_factory=CursorManager)  # every kind of cursor
    process_id: ObjectId = field(default_factory=ObjectId)
    started: datetime.datetime = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC)
    )
    pid: int = field(default_factory=os.getpid)
    compressors: tuple[str, ...] = ("zstd", "snappy", "zlib")
    follow: bool = False  # tail the source (a growing recorded oplog)
    connections: int = 0
    slow_s: float = 0.1  # "Slow query" log threshold ([log] slow_ms)
    total_connections: int = 0
    events_delivered: int = 0
    # The embedded store (`cdcserver.embedded.store.Store`) when the source is its own oplog.
    store: Any = None
    # The mode's command table (commands/tables.py `CommandTable`): set by whoever starts the
    # server, else chosen from the source on the first command (registry.run_command).
    commands: Any = None
    auth: Any = None  # cdcserver.auth.ServerAuth when [auth] has users or is enabled
    max_message_bytes: int = 48_000_000  # hello's maxMessageSizeBytes; larger frames close
    metrics: Any = None  # `cdcserver.metrics.Metrics` when the metrics endpoint is on
    shutting_down: bool = False  # SIGTERM: new commands get 91 ShutdownInProgress
    # Set with shutting_down: wakes awaitable hellos, which then fail with 91 as mongod's do in
    # quiesce mode (a driver's monitor marks the server Unknown at once).
    quiescing: asyncio.Event = field(default_factory=asyncio.Event)
    # What the server was started with (getCmdLineOpts): the Config and the command line.
    config: Any = None
    argv: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.store is None:
            self.store = getattr(self.log, "store", None)
        if self.images is None and self.store is not None:
            self.images = self.store.images
        if self.images is None:  # a live upstream looks images up there
            self.images = getattr(self.log, "images", None)

    @property
    def me(self) -> str:
        return self.advertised_host or f"{self.host}:{self.port}"

    def next_connection_id(self) -> int:
        self.total_connections += 1
        return self.total_connections


@dataclass
class ConnectionState:
    id: int
    peer: str
    compressor: str | None = None  # negotiated by hello.compression
    client_metadata: dict | None = None
    auth: Any = None  # cdcserver.auth.ConnectionAuth once it authenticates
    command: str | None = None  # the command being run (graceful shutdown waits for it)
    awaited_s: float = 0.0  # time the command spent waiting for events (not its own work)
