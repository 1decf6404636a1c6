"""Recorded oplogs: mongodump BSON (`oplog.rs.bson`, `oplog.bson`) and Extended JSON lines.

Entries are kept as their BSON bytes (a recorded oplog is served as it was written) with a
parallel list of timestamps to find a start point by bisection. Several files are read in the
order given and must continue each other's timestamps. `follow()` tails the last file while
another process appends to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import bson
from bson import json_util
from bson.errors import BSONError
from bson.timestamp import Timestamp

from cdcserver.sources.base import EntryList, OplogLog
from pipeline_stages.oplog_entry import decode_entry

log = logging.getLogger("cdcserver")

_JSON_OPTIONS = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)


class OplogFileError(ValueError):
    """A recorded oplog that cannot be served; the message names the file and the place."""


@dataclass(slots=True)
class _Cursor:
    """Where reading a file stopped (for --follow)."""

    path: str
    offset: int  # bytes consumed
    line: int  # lines consumed (Extended JSON)
    is_json: bool


def _looks_like_json(head: bytes) -> bool:
    return head.lstrip()[:1] in (b"{", b"")


def _iter_bson(data: bytes, path: str, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(offset, document bytes) of each complete document; the tail of a partial one is left."""
    pos, n = start, len(data)
    while pos + 4 <= n:
        size = int.from_bytes(data[pos : pos + 4], "little")
        if size < 5 or size > 16 * 1024 * 1024 + 16 * 1024:
            raise OplogFileError(f"{path}: corrupt BSON at byte offset {pos}: bad length {size}")
        if pos + size > n:
            return
        doc = data[pos : pos + size]
        if doc[-1] != 0:
            raise OplogFileError(f"{path}: corrupt BSON at byte offset {pos}: no terminator")
        yield pos, doc
        pos += size


class FileOplog(EntryList, OplogLog):
    """The whole recorded oplog in memory as BSON bytes, ordered by `ts`."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = list(paths)
        self._namespaces: set[tuple[str, str]] = set()
        self._tail: _Cursor | None = None
        for path in self.paths:
            self._tail = self._load(path, _Cursor(path, 0, 0, False), first=True)

    # -- reading --------------------------------------------------------------------------------

    def _append(self, raw: bytes, where: str) -> None:
        try:
            entry = decode_entry(raw)
            ts = entry["ts"]
        except (BSONError, KeyError, ValueError) as exc:
            raise OplogFileError(f"{where}: not an oplog entry ({exc})") from None
        if not isinstance(ts, Timestamp):
            raise OplogFileError(f"{where}: not an oplog entry (ts is not a Timestamp)")
        if self._ts and ts <= self._ts[-1]:
            raise OplogFileError(
                f"{where}: entries are not in timestamp order "
                f"({ts} after {self._ts[-1]})"
            )
        self._raw.append(raw)
        self._ts.append(ts)
        ns = entry.get("ns")
        if isinstance(ns, str) and ns and entry.get("op") in ("i", "u", "d"):
            db, _, coll = ns.partition(".")
            self._namespaces.add((db, coll))

    def _load(self, path: str, cur: _Cursor, first: bool = False) -> _Cursor:
        try:
            with open(path, "rb") as f:
                f.seek(cur.offset)
                data = f.read()
        except OSError as exc:
            raise OplogFileError(f"{path}: {exc.strerror or exc}") from None
        if first:
            cur.is_json = _looks_like_json(data[:64])
        if cur.is_json:
            consumed = 0
            for raw_line in data.splitlines(keepends=True):
                if not raw_line.endswith(b"\n") and first is False:
                    break  # a line still being written
                cur.line += 1
                consumed += len(raw_line)
                text = raw_line.strip()
                if not text:
                    continue
                try:
                    doc = json_util.loads(text, json_options=_JSON_OPTIONS)
                except ValueError as exc:
                    raise OplogFileError(f"{path}: line {cur.line}: invalid JSON ({exc})") from None
                self._append(bson.encode(doc), f"{path}: line {cur.line}")
            cur.offset += consumed
            return cur
        end = 0
        for offset, raw in _iter_bson(data, path):
            self._append(raw, f"{path}: byte offset {cur.offset + offset}")
            end = offset + len(raw)
        if first and end != len(data):
            raise OplogFileError(
                f"{path}: corrupt BSON at byte offset {cur.offset + end}: truncated document"
            )
        cur.offset += end
        return cur

    def refresh(self) -> int:
        """Read what was appended to the last file since the last look and wake the waiting
        getMores. Returns how many entries were added. Call it on the event loop's thread."""
        cur = self._tail
        if cur is None:
            return 0
        before = len(self._ts)
        self._load(cur.path, cur)
        added = len(self._ts) - before
        if added:
            self.notify()
        return added

    async def follow(self, interval: float = 0.01) -> None:
        """Tail the last file: new complete entries are appended and waiters woken."""
        cur = self._tail
        if cur is None:
            return
        size = -1  # entries may have been appended since the load: look at once
        while True:
            await asyncio.sleep(interval)
            try:
                new_size = os.path.getsize(cur.path)
            except OSError:
                continue
            if new_size == size:
                continue
            size = new_size
            try:
                self.refresh()
            except OplogFileError as exc:
                # What was read before the bad entry stays served; reading further could only
                # repeat or skip entries, so following stops here.
                log.error("stopped following %s: %s", cur.path, exc)
                return

    # -- OplogLog -------------------------------------------------------------------------------

    def namespaces(self) -> set[tuple[str, str]]:
        return set(self._namespaces)

    def __len__(self) -> int:
        return len(self._ts)
