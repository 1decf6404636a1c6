"""What this server is: a `Deployment` per serving mode.

cdcserver serves one of seven modes, each a module of `cdcserver/deployments/`:

- `recorded`: a recorded oplog (`serve --oplog F`, `--sample`); table `RECORDED`, no store;
- `embedded`: the embedded store and its own oplog (`serve`); `EMBEDDED`;
- `upstream`: a live replica set, its oplog tailed (`serve --upstream URI`); `UPSTREAM`;
- `cluster`: the embedded sharded cluster's mongos front (`serve --shards N`); `CLUSTER`;
- `shard`: one shard of that cluster, on its own port; `SHARD`;
- `sidecar`: a sidecar of a real mongos, every shard tailed (`serve --upstream <mongos>`);
  `SIDECAR`;
- `recorded_shards`: one recorded oplog per shard (`serve --oplog A --oplog B`);
  `RECORDED_SHARDS`.

A deployment holds what the server needs of its mode: the oplog source replies take their
time from (`oplog`), the store (or None), the image source, the command table, the source's
tail loop, and its lifecycle (`start` before the listener, `stop` after it, `close` once the
loop is gone). The server is given a deployment (`server.run_server(config, deployment)`) and
never asks a source what it can do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from cdcserver.context import CommandTable, ServerState
from cdcserver.cursors import Cursor, CursorManager
from cdcserver.embedded.store import Store
from cdcserver.sources.base import OplogLog
from pipeline_stages.image_source import ImageSource
from pipeline_stages.lookups import ExternalImages


class Deployment(Protocol):
    """One serving mode: its parts and its lifecycle."""

    @property
    def oplog(self) -> OplogLog:
        """The source of the server's time (operationTime, $clusterTime, hello's lastWrite),
        the oplog its change streams and oplog reads read, and the one that wakes waiting
        getMores."""
        ...

    @property
    def store(self) -> Store | None:
        """The embedded store the mode's commands read and write (None: it has none)."""
        ...

    @property
    def images(self) -> ImageSource | ExternalImages | None:
        """Pre-images and current documents for change streams (None: none to look up;
        `ExternalImages`: looked up elsewhere, asynchronously)."""
        ...

    @property
    def commands(self) -> CommandTable:
        """Which handler answers which command in this mode."""
        ...

    @property
    def tailer(self) -> Callable[[], Awaitable[None]] | None:
        """The loop that reads the source as it grows, run by the listener while the server
        follows its source (None: nothing to tail)."""
        ...

    @property
    def follow(self) -> bool:
        """Whether the listener runs `tailer`."""
        ...

    async def start(self, host: str) -> None:
        """Before the listener: what the mode runs beside it (a cluster's shards listen on
        `host`, a sidecar's shard tails start)."""
        ...

    async def stop(self) -> None:
        """After the listener has closed: stop what `start` started."""
        ...

    def close(self) -> None:
        """Once the event loop is gone: commit and close the mode's files (its stores)."""
        ...

    def cursor_elsewhere(self, registry: CursorManager) -> Callable[[int, str], Cursor] | None:
        """For a mode whose cursors may be held elsewhere (a live upstream's): the cursor
        standing for an id `registry` does not hold (getMore and killCursors go there)."""
        ...


class Standalone:
    """The lifecycle of a mode with nothing beside its listener: nothing to start or stop,
    nothing to close, every cursor in its registry (a mode overrides what it has)."""

    async def start(self, host: str) -> None:
        pass

    async def stop(self) -> None:
        pass

    def close(self) -> None:
        pass

    def cursor_elsewhere(self, registry: CursorManager) -> Callable[[int, str], Cursor] | None:
        return None


def server_state(deployment: Deployment, **options: Any) -> ServerState:
    """A server's state for `deployment` (`options`: ServerState's other fields)."""
    options.setdefault("follow", deployment.follow)
    state = ServerState(
        oplog=deployment.oplog,
        commands=deployment.commands,
        store=deployment.store,
        images=deployment.images,
        tailer=deployment.tailer,
        **options,
    )
    state.cursors.elsewhere = deployment.cursor_elsewhere(state.cursors)
    return state
