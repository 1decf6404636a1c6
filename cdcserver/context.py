"""State shared by the command handlers: the server (one per process) and each connection;
what a handler is, and a serving mode's table of them.

The three belong together: a handler takes the server's state, and the state holds its mode's
table of handlers (`CommandTable`). Which mode a server is in, and so which table, store and
images it has, is its `cdcserver.deployment.Deployment`'s to say (`deployment.server_state`).
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from bson.objectid import ObjectId

from cdcserver.auth import ConnectionAuth, ServerAuth
from cdcserver.config import Config
from cdcserver.cursors import CursorManager
from cdcserver.embedded.store import Store
from cdcserver.sources.base import OplogLog
from pipeline_stages.image_source import ImageSource
from pipeline_stages.lookups import ExternalImages
from pipeline_stages.release import DEFAULT_RELEASE, Release

T = TypeVar("T")

# `async def h(server, conn, cmd, db) -> dict`: the reply's own fields (registry.run_command
# adds ok, $clusterTime and operationTime).
Handler = Callable[
    ["ServerState", "ConnectionState", dict[str, Any], str], Awaitable[dict[str, Any]]
]
Choose = Callable[["ServerState", Mapping[str, Any]], Handler]


class Route:
    """A table entry that picks its handler per request (the upstream mode's aggregate: a
    change stream is answered here, any other aggregate forwarded)."""

    def __init__(self, choose: Choose) -> None:
        self.choose = choose

    def __repr__(self) -> str:
        return f"Route({qualified_name(self.choose)})"


class CommandTable(dict[str, "Handler | Route"]):
    """Command name -> handler (or `Route`) of one server mode.

    `default` answers every other (non-empty) name; `forwarding` are the handlers that hand
    the command on as it is (to an upstream), for which cdcserver makes none of its own
    argument checks; `known` the names counted by name in serverStatus (others: <UNKNOWN>).
    """

    def __init__(
        self, mode: str, handlers: Mapping[str, Handler | Route], *,
        default: Handler | None = None, forwarding: Iterable[Handler] = (),
        known: Iterable[str] | None = None,
    ) -> None:
        super().__init__(handlers)
        self.mode = mode
        self.default = default
        self.forwarding = frozenset(forwarding)
        self.known = frozenset(self if known is None else known)

    def handler(self, server: ServerState, name: str, cmd: Mapping[str, Any]) -> Handler | None:
        """Who answers `cmd` (None: no such command); registry.run_command inlines it."""
        if not name:
            return None
        entry = self.get(name, self.default)
        if isinstance(entry, Route):
            return entry.choose(server, cmd)
        return entry


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class ServerMetrics(Protocol):
    """What the command path records (`cdcserver.metrics.Metrics` is it: it reads the state,
    so the state names only this)."""

    @property
    def get_more_seconds(self) -> Observer: ...

    def command_error(self, code: Any, code_name: Any) -> None: ...


def qualified_name(handler: Any) -> str:
    """module.qualname of a handler (through a wrapper's `__wrapped__`: a front's
    clock-gossip wrapper, a shard's read-concern wait)."""
    while hasattr(handler, "__wrapped__"):  # wrappers may wrap wrappers
        handler = handler.__wrapped__
    return f"{handler.__module__}.{handler.__qualname__}"


@dataclass
class ServerState:
    oplog: OplogLog  # its time, and the oplog its change streams and oplog finds read
    commands: CommandTable  # the mode's table (its Deployment's)
    store: Store | None = None  # the embedded store, when the mode has one
    # Pre-images and current documents, when there are any (a live upstream's: looked up there).
    images: ImageSource | ExternalImages | None = None
    host: str = "127.0.0.1"
    port: int = 27017
    set_name: str = "cdcserver"
    # The MongoDB release answered as ([server] compatibility); a sidecar answers as its
    # upstream (`release`).
    configured_release: Release = DEFAULT_RELEASE
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
    # The source's tail loop, run by the listener while `follow` (None: nothing to tail).
    tailer: Callable[[], Awaitable[None]] | None = None
    auth: ServerAuth | None = None  # when [auth] has users or is enabled
    max_message_bytes: int = 48_000_000  # hello's maxMessageSizeBytes; larger frames close
    metrics: ServerMetrics | None = None  # when the metrics endpoint is on
    shutting_down: bool = False  # SIGTERM: new commands get 91 ShutdownInProgress
    # Set with shutting_down: wakes awaitable hellos, which then fail with 91 as mongod's do in
    # quiesce mode (a driver's monitor marks the server Unknown at once).
    quiescing: asyncio.Event = field(default_factory=asyncio.Event)
    # What the server was started with (getCmdLineOpts): the Config and the command line.
    config: Config | None = None
    argv: list[str] = field(default_factory=list)
    # The database profiler's `profile` settings: db -> level, db -> sampleRate.
    profile_levels: dict[str, int] = field(default_factory=dict)
    profile_sample_rates: dict[str, float] = field(default_factory=dict)
    # State a command family keeps per server (its fail points, serverStatus's counters), by
    # its class: `part(FailPoints)`. The family owns the type; the state need not import it.
    _parts: dict[type, object] = field(default_factory=dict, repr=False)

    def part(self, kind: type[T]) -> T:
        """This server's `kind()`, made on first use."""
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind()
        return cast(T, found)

    def part_if_made(self, kind: type[T]) -> T | None:
        """This server's `kind()` if something made it (a command's fast path: none yet)."""
        return cast("T | None", self._parts.get(kind))

    @property
    def release(self) -> Release:
        """The release answered as: the upstream's when the oplog is another server's (it
        follows an upgrade), else the configured one."""
        return self.oplog.upstream_release() or self.configured_release

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
    client_metadata: dict[str, Any] | None = None
    auth: ConnectionAuth | None = None  # once it authenticates
    command: str | None = None  # the command being run (graceful shutdown waits for it)
    awaited_s: float = 0.0  # time the command spent waiting for events (not its own work)
    # A fail point (`closeConnection` after the command) asked for the connection to end.
    close_after_command: bool = False
    # It said hello with `internalClient` (another server of the cluster): some fail points
    # (failCommand) leave it alone unless told otherwise.
    internal_client: bool = False
