"""Cursors: the one `Cursor` protocol every kind implements (`cursor.py`), the one registry of
a server's cursors (`registry.py`), and the change-stream cursor (`change_stream.py`).

One `getMore` and one `killCursors` (commands/cursors.py) serve every kind in every mode: they
check the cursor out of the registry and ask it for its reply.
"""

from __future__ import annotations

from cdcserver.cursors.change_stream import ChangeStreamCursor, cursor_reply
from cdcserver.cursors.cursor import (
    CHANGE_STREAM,
    DEFAULT_AWAIT_MS,
    DEFAULT_BATCH_SIZE,
    FORWARDED,
    OPLOG_FIND,
    QUERY_RESULT,
    ChangeStream,
    Cursor,
    GetMore,
    HeldHere,
    kind_of,
)
from cdcserver.cursors.registry import CursorManager

__all__ = [
    "CHANGE_STREAM",
    "DEFAULT_AWAIT_MS",
    "DEFAULT_BATCH_SIZE",
    "FORWARDED",
    "OPLOG_FIND",
    "QUERY_RESULT",
    "ChangeStream",
    "ChangeStreamCursor",
    "Cursor",
    "CursorManager",
    "GetMore",
    "HeldHere",
    "cursor_reply",
    "kind_of",
]
