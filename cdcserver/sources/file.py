"""Recorded oplogs: mongodump BSON (`oplog.rs.bson`, `oplog.bson`) and Extended JSON lines.

`FileOplog` (what `serve --oplog` serves) keeps the entries as their BSON bytes (a recorded
oplog is served as it was written) with a parallel list of timestamps to find a start point by
bisection. Several files are read in the order given and must continue each other's
timestamps. `follow()` tails the last file while another process appends to it.

`OplogStream` (what `cdcserver replay` reads) goes through the same files once, front to back,
in bounded memory: a buffered reader, the transaction entries later ones chain to (up to a
budget), and a sparse index of where entries are, to read back any other entry a transaction
chain names. Both read files in pieces (`_entries_in`), never whole.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.timestamp import Timestamp

from cdcserver.sources.base import EntryList, OplogLog, SourceFailed
from pipeline_stages import bson_bytes
from pipeline_stages.oplog_entry import Entry, decode_entry, with_oplog_types
from pipeline_stages.unwind_transaction import APPLY_OPS_APPLIED_SEPARATELY
from pipeline_stages.value_string import type_name

log = logging.getLogger(__name__)

_JSON_OPTIONS = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
# mongod's BSONObjMaxInternalSize: an oplog entry may exceed the 16 MiB user limit by 16 KiB.
_MAX_ENTRY_BYTES = 16 * 1024 * 1024 + 16 * 1024
_READ_BUFFER = 1024 * 1024


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


def _open(path: str) -> Any:
    try:
        return open(path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise OplogFileError(f"{path}: {exc.strerror or exc}") from None


def _is_json_file(path: str) -> bool:
    with _open(path) as f:
        return _looks_like_json(f.read(64))


def _entries_in(
    f: Any, cur: _Cursor, whole: bool
) -> Iterator[tuple[bytes, str, int, int]]:
    """(entry bytes, where it is for messages, byte offset, line number or 0) of each entry
    of an open file from `cur.offset` on, read in pieces; `cur` advances past each one given.
    `whole`: the file must end with a complete entry (else: corrupt BSON, truncated), or the
    last line be read even without its newline; not whole (a file still being written): a
    partial last entry or line is left for a later look."""
    path = cur.path
    f.seek(cur.offset)
    if cur.is_json:
        for raw_line in f:
            if not raw_line.endswith(b"\n") and not whole:
                return  # a line still being written
            offset = cur.offset
            cur.line += 1
            cur.offset += len(raw_line)
            text = raw_line.strip()
            if not text:
                continue
            where = f"{path}:{cur.line}"  # file:line, as compilers say it (editors follow it)
            try:
                doc = json_util.loads(text, json_options=_JSON_OPTIONS)
            except ValueError as exc:
                raise OplogFileError(f"{where}: invalid JSON ({exc})") from None
            yield bson_bytes.encode(with_oplog_types(doc)), where, offset, cur.line
        return
    while True:
        pos = cur.offset
        head = f.read(4)
        if len(head) < 4:
            if head and whole:
                raise OplogFileError(
                    f"{path}: corrupt BSON at byte offset {pos}: truncated document"
                )
            return
        size = int.from_bytes(head, "little")
        if size < 5 or size > _MAX_ENTRY_BYTES:
            raise OplogFileError(f"{path}: corrupt BSON at byte offset {pos}: bad length {size}")
        body = f.read(size - 4)
        if len(body) < size - 4:
            if whole:
                raise OplogFileError(
                    f"{path}: corrupt BSON at byte offset {pos}: truncated document"
                )
            return
        if body[-1] != 0:
            raise OplogFileError(f"{path}: corrupt BSON at byte offset {pos}: no terminator")
        cur.offset = pos + size
        yield head + body, f"{path}: byte offset {pos}", pos, 0


def _checked_entry(raw: bytes, where: str, prev: Timestamp | None) -> Entry:
    """The decoded entry, checked to be an oplog entry after `prev`."""
    try:
        entry = decode_entry(raw)
        ts = entry["ts"]
    except (BSONError, KeyError, ValueError) as exc:
        raise OplogFileError(f"{where}: not an oplog entry ({exc})") from None
    if not isinstance(ts, Timestamp):
        raise OplogFileError(f"{where}: not an oplog entry (ts is not a Timestamp)")
    if prev is not None and ts <= prev:
        raise OplogFileError(
            f"{where}: entries are not in timestamp order ({ts} after {prev})"
        )
    _check_field_types(entry, where)
    return entry


# The fields whose type the change-stream stages check (mongod's 40532), checked when the file
# is read so that a bad file is refused at start, not at the first watch(). Only where the
# stages check them: lsid/txnNumber/wall of a transaction's applyOps (unwind_transaction.py),
# a present `wall` elsewhere (transform.py); `t` is never read, and old tools write it as int.
_TXN_FIELD_TYPES = (("lsid", "object"), ("txnNumber", "long"))


def _check_field_types(entry: Entry, where: str) -> None:
    o = entry.get("o")
    is_apply_ops = entry.get("op") == "c" and isinstance(o, Mapping) and "applyOps" in o
    checked: list[tuple[str, str]] = []
    if is_apply_ops:
        if entry.get("multiOpType") != APPLY_OPS_APPLIED_SEPARATELY:
            checked.extend(_TXN_FIELD_TYPES)
        checked.append(("wall", "date"))
    elif entry.get("wall") is not None:
        checked.append(("wall", "date"))
    for field, expected in checked:
        if field in entry and type_name(entry[field]) != expected:
            raise OplogFileError(
                f"{where}: field {field} should be {expected}, found: "
                f"{type_name(entry[field])} (mongod writes it as {expected}; re-export the "
                "oplog as BSON with mongodump, or as canonical Extended JSON)"
            )
    if is_apply_ops and isinstance(o, Mapping) and type_name(o["applyOps"]) != "array":
        raise OplogFileError(
            f"{where}: field applyOps should be array, found: {type_name(o['applyOps'])}"
        )


class FileOplog(EntryList, OplogLog):
    """The whole recorded oplog in memory as BSON bytes, ordered by `ts`."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = list(paths)
        self._namespaces: set[tuple[str, str]] = set()
        self._tail: _Cursor | None = None
        self._failure: SourceFailed | None = None  # following met a bad entry
        for path in self.paths:
            self._tail = self._load(path, _Cursor(path, 0, 0, False), first=True)

    # -- reading --------------------------------------------------------------------------------

    def _append(self, raw: bytes, where: str) -> None:
        entry = _checked_entry(raw, where, self._ts[-1] if self._ts else None)
        self._raw.append(raw)
        self._ts.append(entry["ts"])
        ns = entry.get("ns")
        if isinstance(ns, str) and ns and entry.get("op") in ("i", "u", "d"):
            db, _, coll = ns.partition(".")
            self._namespaces.add((db, coll))

    def _load(self, path: str, cur: _Cursor, first: bool = False) -> _Cursor:
        if first:
            cur.is_json = _is_json_file(path)
        with _open(path) as f:
            for raw, where, _offset, _line in _entries_in(f, cur, whole=first):
                self._append(raw, where)
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
                # repeat or skip entries, so following stops here, and a stream that has read
                # everything before it fails saying where (else it would wait forever).
                self.fail(exc)
                return

    def fail(self, exc: OplogFileError) -> None:
        """Stop growing for good because of `exc`: logged once, streams woken to meet it."""
        log.error("stopped following %s: %s", self.paths[-1], exc,
                  extra={"path": self.paths[-1]})
        self._failure = SourceFailed(str(exc))
        self.notify()

    # -- OplogLog -------------------------------------------------------------------------------

    def failure(self) -> SourceFailed | None:
        return self._failure

    def namespaces(self) -> set[tuple[str, str]]:
        return set(self._namespaces)

    def __len__(self) -> int:
        return len(self._ts)


# -- reading once, in bounded memory ----------------------------------------------------------


def _ts_key(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def _is_link(entry: Entry) -> bool:
    """A transaction entry a later one chains to (`partialTxn` or `prepare`)."""
    if entry.get("op") != "c":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and ("partialTxn" in o or "prepare" in o)


class OplogStream:
    """Recorded oplog files read once, in order, in bounded memory (`cdcserver replay`).

    It answers what the replay asks of an oplog: `oldest_entry`, `start_for_new_stream`,
    `read_from` with positions that only move forward (each call continues where the last
    stopped; a batch also stops at about `batch_bytes` of entries), and `entry_at` for the
    transaction chains the pipeline follows back. Errors and their messages are `FileOplog`'s,
    raised when the reader gets to the bad entry (the events before it have been read).

    Memory: the read buffer (1 MiB), the last entry looked at, the transaction entries later
    ones chain to (`partialTxn`/`prepare`, the most recent up to `link_budget` bytes), and one
    index point (ts, file, offset) per `index_every` bytes read. An entry a chain names that
    is no longer held is read again from its file, from the index point before it.
    """

    def __init__(
        self,
        paths: list[str],
        *,
        link_budget: int = 64 * 1024 * 1024,
        index_every: int = 1024 * 1024,
        batch_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.paths = list(paths)
        self.batch_bytes = batch_bytes
        self.link_budget = link_budget
        self.index_every = index_every
        self._is_json = [_is_json_file(path) for path in self.paths]  # every file opens
        self._links: OrderedDict[int, bytes] = OrderedDict()
        self._link_bytes = 0
        # (ts key, file, offset, lines before): where to start reading to find an entry.
        self._index: list[tuple[int, int, int, int]] = []
        self._last: Timestamp | None = None  # the last entry read
        self._peeked: tuple[Entry, int] | None = None
        # A bad entry met while a batch had entries: raised at the next read, so the batch
        # (the events before it) is replayed first.
        self._error: OplogFileError | None = None
        self._entries = self._read()

    # -- reading --------------------------------------------------------------------------------

    def _read(self) -> Iterator[tuple[Entry, int]]:
        """(entry, its size in bytes) of each entry of the files, in order."""
        for i, path in enumerate(self.paths):
            cur = _Cursor(path, 0, 0, self._is_json[i])
            indexed = -self.index_every
            with _open(path) as f:
                for raw, where, offset, line in _entries_in(f, cur, whole=True):
                    entry = _checked_entry(raw, where, self._last)
                    ts = entry["ts"]
                    self._last = ts
                    key = _ts_key(ts)
                    if offset - indexed >= self.index_every:
                        indexed = offset
                        self._index.append((key, i, offset, max(0, line - 1)))
                    if _is_link(entry):
                        self._keep_link(key, raw)
                    yield entry, len(raw)

    def _keep_link(self, key: int, raw: bytes) -> None:
        self._links[key] = raw
        self._link_bytes += len(raw)
        while self._link_bytes > self.link_budget and len(self._links) > 1:
            _key, dropped = self._links.popitem(last=False)  # the oldest: read again if named
            self._link_bytes -= len(dropped)

    def _next(self) -> tuple[Entry, int] | None:
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
            return item
        if self._error is not None:
            raise self._error
        return next(self._entries, None)

    # -- what the replay asks -------------------------------------------------------------------

    def oldest_entry(self) -> Entry | None:
        """The first entry (read ahead once, before the first `read_from`)."""
        if self._peeked is None and self._last is None:
            self._peeked = next(self._entries, None)
        return self._peeked[0] if self._peeked is not None else None

    def start_for_new_stream(self) -> Timestamp:
        """As `OplogLog`'s, for an oplog with no entries (the only case the replay asks)."""
        last = self._last
        return Timestamp(0, 1) if last is None else Timestamp(last.time, last.inc + 1)

    def read_from(self, start: Timestamp, limit: int) -> list[Entry]:
        """The next up to `limit` entries with `ts >= start` (fewer when they pass
        `batch_bytes`), ascending. `start` only moves forward: entries before it are read past
        (and gone)."""
        out: list[Entry] = []
        size = 0
        while len(out) < limit and size < self.batch_bytes:
            try:
                item = self._next()
            except OplogFileError as exc:
                if not out:
                    raise
                self._error = exc  # this batch first: the events before the bad entry
                break
            if item is None:
                break
            entry, n = item
            if entry["ts"] >= start:
                out.append(entry)
                size += n
        return out

    def read_to_end(self) -> None:
        """Read (and check) the rest of the files: OplogFileError if one is bad."""
        while self._next() is not None:
            pass

    def entry_at(self, ts: Timestamp) -> Entry | None:
        """The entry at exactly `ts`, if it was read: held, or read again from its file."""
        key = _ts_key(ts)
        raw = self._links.get(key)
        if raw is not None:
            return decode_entry(raw)
        if self._last is None or ts > self._last:
            return None
        i = bisect.bisect_right(self._index, (key, len(self.paths), 0, 0)) - 1
        if i < 0:
            return None
        _key, file, offset, line = self._index[i]
        cur = _Cursor(self.paths[file], offset, line, self._is_json[file])
        with _open(cur.path) as f:
            for raw, _where, _offset, _line in _entries_in(f, cur, whole=True):
                entry = decode_entry(raw)
                if entry["ts"] == ts:
                    return entry
                if entry["ts"] > ts:
                    return None
        return None
