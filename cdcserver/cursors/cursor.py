"""What every cursor is: the `Cursor` protocol, which one `getMore` and one `killCursors`
(commands/cursors.py) serve, whatever the kind and the mode.

The kinds: change streams (`change_stream.ChangeStreamCursor`; a front's merged stream,
`sharding/streams.py`), query results (commands/queries.py `ResultCursor`, capped tailable
finds, a front's merged results), oplog finds (commands/oplog_find.py `OplogCursor`) and
cursors held elsewhere (commands/proxy.py `ForwardedCursor`, an upstream member's; a front's
`ShardCursor`, a shard's): those answer a getMore and a killCursors by asking their holder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_BATCH_SIZE = 101
DEFAULT_AWAIT_MS = 1000
# Cursor kinds (each cursor class's `kind`).
CHANGE_STREAM = "changeStream"
QUERY_RESULT = "queryResult"
OPLOG_FIND = "oplogFind"
FORWARDED = "forwarded"


@dataclass(frozen=True)
class GetMore:
    """One getMore, as its cursor needs it: the parsed arguments, and the command as sent
    (a cursor held elsewhere forwards it)."""

    batch_size: int | None
    max_time_ms: int | None
    cmd: Mapping[str, Any]
    db: str
    stopping: Callable[[], bool]  # the server shuts down (a prefetch stops)


class Cursor(Protocol):
    """A cursor of the registry (cursors/registry.py `CursorManager`).

    `busy` is set while a getMore has it checked out (a second one is 143), `last_used` when
    it is checked in (the reaper closes those idle too long), `awaited_s` the last getMore's
    time spent waiting for results (not counted as its work). `done` says the last getMore
    answered its last batch: the getMore then closes it."""

    id: int
    ns: str
    busy: bool
    last_used: float
    awaited_s: float

    @property
    def kind(self) -> str: ...

    @property
    def done(self) -> bool: ...

    async def get_more_reply(self, more: GetMore) -> Mapping[str, Any]:
        """The getMore's reply (a `cursor` document with its `nextBatch`), or the holder's
        reply as it came (a forwarded cursor)."""
        ...

    async def kill(self, cmd: Mapping[str, Any], db: str) -> bool:
        """killCursors on this cursor (it has left the registry): whether it was killed
        (a cursor held elsewhere asks its holder, whose answer this is)."""
        ...

    def close(self) -> None:
        """Release what it holds here (reaped, killed, or the server stops)."""
        ...



class ChangeStream(Cursor, Protocol):
    """A change-stream cursor (this server's, or a front's merged one): the registry indexes
    them apart (metrics, shutdown), and shutdown has their waiting getMores answer now."""

    draining: bool


def kind_of(cursor: Cursor) -> str:
    return cursor.kind


class HeldHere:
    """The killCursors of a cursor whose results this server holds: it is closed, and was
    killed."""

    def close(self) -> None:
        raise NotImplementedError

    async def kill(self, cmd: Mapping[str, Any], db: str) -> bool:
        self.close()
        return True
