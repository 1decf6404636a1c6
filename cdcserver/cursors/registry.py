"""The one registry of a server's cursors, whatever their kind (cursors/cursor.py): ids,
namespaces, the getMore checkout (43, 143, 13, written once), idle reaping, kill."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from cdcserver.cursors.cursor import CHANGE_STREAM, FORWARDED, ChangeStream, Cursor
from cdcserver.hub import Hub
from pipeline_stages.errors import MongoError


class CursorManager:
    """Every open cursor by id, whatever its kind; reaps cursors idle longer than the timeout
    (mongod: 10 min). `cursors` indexes the change streams among them (the hub's readers:
    metrics, shutdown and the change-stream getMore look there)."""

    def __init__(self, idle_timeout_s: float = 600.0) -> None:
        self.open: dict[int, Cursor] = {}  # every kind
        self.cursors: dict[int, ChangeStream] = {}  # the change streams among them
        self.hub = Hub()
        self.idle_timeout_s = idle_timeout_s
        # A mode whose cursors may be held where it forgot them (a live upstream's, reaped
        # here but still open there): the cursor standing for an id it does not hold.
        self.elsewhere: Callable[[int, str], Cursor | None] | None = None

    def new_id(self) -> int:
        while True:
            cid = secrets.randbits(62) + 1  # positive int64, never 0
            if cid not in self.open:
                return cid

    def add(self, cursor: Cursor) -> None:
        self.open[cursor.id] = cursor
        if cursor.kind == CHANGE_STREAM:
            self.cursors[cursor.id] = cast(ChangeStream, cursor)

    def find(self, cursor_id: Any) -> Cursor | None:
        """The cursor with this id, of any kind, or None."""
        if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
            return None
        return self.open.get(cursor_id)

    def get(self, cursor_id: int, ns: str) -> Cursor:
        """The cursor a getMore names: 43 when there is none, 13 when it is another
        namespace's."""
        cursor = self.open.get(cursor_id)
        if cursor is None:
            raise MongoError(43, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise MongoError(
                13,
                f"Requested getMore on namespace '{ns}', but cursor belongs to a different "
                f"namespace {cursor.ns}",
            )
        return cursor

    def check_out(self, cursor_id: int, ns: str,
                  pin_check: Callable[[Cursor], None] | None = None) -> Cursor:
        """The cursor a getMore names, checked out for it (mongod's CursorManager::pinCursor):
        43 when there is none, 143 when another getMore has it, then the caller's
        `pin_check` (the session checks), 13 when it is another namespace's; a failed check
        leaves the cursor as it was."""
        if cursor_id not in self.open and self.elsewhere is not None:
            held = self.elsewhere(cursor_id, ns)  # not registered: its holder says 43 or not
            if held is not None:
                held.busy = True
                return held
        cursor = self.open.get(cursor_id)
        if cursor is None:
            raise MongoError(43, f"cursor id {cursor_id} not found")
        if cursor.busy:
            raise MongoError(143, f"cursor id {cursor.id} is already in use")
        if pin_check is not None:
            pin_check(cursor)
        self.get(cursor_id, ns)  # 13
        cursor.busy = True
        return cursor

    def check_in(self, cursor: Cursor) -> None:
        """The getMore is over: the cursor is free, and its idle time starts now."""
        cursor.busy = False
        cursor.last_used = time.monotonic()

    async def kill_requested(self, cursor_id: int, cmd: Mapping[str, Any], db: str) -> bool:
        """killCursors on `cursor_id`: out of the registry, then killed (a cursor held
        elsewhere by its holder); whether it was killed."""
        cursor = self.open.pop(cursor_id, None)
        if cursor is None:
            coll = cmd.get("killCursors")
            held = (self.elsewhere(cursor_id, f"{db}.{coll}")
                    if self.elsewhere is not None else None)
            return held is not None and await held.kill(cmd, db)
        stream = self.cursors.pop(cursor_id, None) is not None
        try:
            return await cursor.kill(cmd, db)
        finally:
            if stream:
                self.hub.forget_empty()

    def held(self) -> int:
        """The cursors whose results this server holds (all but forwarded ones)."""
        return sum(1 for c in self.open.values() if c.kind != FORWARDED)

    def is_change_stream(self, cursor_id: Any) -> bool:
        return isinstance(cursor_id, int) and cursor_id in self.cursors

    def kill(self, cursor_id: int) -> bool:
        """Close the cursor here (reaped, failed, exhausted): whether there was one."""
        cursor = self.open.pop(cursor_id, None)
        if cursor is None:
            return False
        stream = self.cursors.pop(cursor_id, None) is not None
        cursor.close()
        if stream:
            self.hub.forget_empty()
        return True

    def reap(self) -> int:
        now = time.monotonic()
        stale = [
            c.id for c in self.open.values()
            if not c.busy and now - c.last_used > self.idle_timeout_s
        ]
        for cid in stale:
            self.kill(cid)
        return len(stale)

    async def reap_forever(self, interval: float = 60.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reap()
