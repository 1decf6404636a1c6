"""Cutting one recorded oplog file into byte ranges that tasks read on their own.

A file of `size` bytes is cut into ranges `[start, end)` of `split_size` bytes. A range owns the
entries that *start* inside it; the last one it owns may run past `end`. No task reads a whole
file, and no task needs to know where another range's entries are:

* Extended JSON lines: as Hadoop's line reader, a range that does not start the file skips to
  the first byte after a newline at or after `start - 1`.
* mongodump BSON has no sync marks, so a range that does not start the file looks for the first
  offset `p >= start` (and `< end`) where an oplog entry starts, by this heuristic:

  1. the 4-byte little-endian length `L` at `p` is 16 .. 16 MiB + 16 KiB (mongod's limit for
     an oplog document), `p + L` is within the file and the byte at `p + L - 1` is 0 (the
     document terminator);
  2. the byte at `p + 4` is a BSON element type;
  3. the `L` bytes decode as BSON (every nested document validated) into a document whose
     `ts` is a Timestamp and whose `op` is a string;
  4. the next two documents (at `p + L`, and after it) pass 1–3 as well, or the file ends.

  Bytes inside a document rarely pass 1–3 by chance, and an embedded oplog entry (one stored
  as a field value) is followed by its parent's next element or terminator, not by another
  entry, so it fails 4.

The heuristic is then verified, not trusted: each range reports the offset of its first entry
and the offset just past its last one, and the driver checks that every range starts exactly
where the previous one stopped (`replay.py`); a file where that fails (corrupt data, or a
pathological coincidence) is read again as one range, sequentially from offset 0, so the
result never depends on the guess.

Paths: local files (read with `os.pread`), and URIs that pyarrow's filesystems open: `file://`,
`hdfs://`, `s3://`, `gs://`, `abfs://` ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes
from pipeline_stages.oplog_entry import Entry, decode_entry, with_oplog_types

# mongod's BSONObjMaxInternalSize: an oplog entry may exceed the 16 MiB user limit by 16 KiB.
MAX_ENTRY_BYTES = 16 * 1024 * 1024 + 16 * 1024
# The smallest plausible oplog entry: {ts: Timestamp, op: ""} is 23 bytes.
MIN_ENTRY_BYTES = 16
DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
_CHUNK = 1024 * 1024
_BSON_TYPES = frozenset([*range(0x01, 0x14), 0x7F, 0xFF])
_CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
# Where a JSON-lines error message gets its line number (known on the driver only).
LINE_MARK = "\x00LINE\x00"


class SplitError(ValueError):
    """A recorded oplog that cannot be read. `message` is what `cdcserver replay` says, except
    that in a JSON-lines file the line number is `LINE_MARK` plus `line`, the line's number
    within its range (the driver knows the lines of the ranges before)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True, slots=True)
class Split:
    """One task's share of one file of one shard."""

    shard: int
    file: int  # position of the file among its shard's files
    index: int  # position of the range in its file
    path: str
    start: int
    end: int
    size: int  # the file's size
    is_json: bool

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.shard, self.file, self.index)


# -- files -------------------------------------------------------------------------------------


def is_local(path: str) -> bool:
    """A plain path, read with `os.pread`. Any URI, `file://` included, goes through pyarrow's
    filesystems (so `file://` exercises the code path of `hdfs://`, `s3://`, ...)."""
    return "://" not in path


class Input:
    """Random access to one file: `read(offset, n)` and `size`."""

    def __init__(self, path: str) -> None:
        self.path = path
        if is_local(path):
            self._fd: int | None = os.open(path, os.O_RDONLY)
            self._file: Any = None  # a pyarrow input file (pyarrow is untyped)
            self.size = os.fstat(self._fd).st_size
        else:
            from pyarrow import fs

            filesystem, inner = fs.FileSystem.from_uri(path)
            self._fd = None
            self._file = filesystem.open_input_file(inner)
            self.size = self._file.size()

    def read(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        if self._fd is not None:
            return os.pread(self._fd, n, offset)
        data = self._file.read_at(n, offset)  # bytes, or a Buffer in older pyarrow
        return data if isinstance(data, bytes) else data.to_pybytes()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Input:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Window:
    """A forward-moving buffer over an `Input` (reads in chunks of at least 1 MiB)."""

    __slots__ = ("src", "base", "buf")

    def __init__(self, src: Input) -> None:
        self.src = src
        self.base = 0
        self.buf = b""

    def get(self, pos: int, n: int) -> bytes:
        """`n` bytes at `pos` (fewer at the end of the file)."""
        off = pos - self.base
        if off < 0 or off + n > len(self.buf):
            self.buf = self.src.read(pos, max(n, _CHUNK))
            self.base, off = pos, 0
        return self.buf[off : off + n]


def plan_splits(
    shard: int, file: int, path: str, size: int, is_json: bool, split_size: int
) -> list[Split]:
    """The ranges of one file (an empty file is one empty range)."""
    split_size = max(1, split_size)
    bounds = list(range(0, size, split_size)) or [0]
    return [
        Split(shard, file, i, path, start, min(start + split_size, size), size, is_json)
        for i, start in enumerate(bounds)
    ]


def looks_like_json(head: bytes) -> bool:
    """As `cdcserver replay` decides (`sources/file.py`): blank or `{` first."""
    return head.lstrip()[:1] in (b"{", b"")


# -- BSON ---------------------------------------------------------------------------------------


def _entry_length(win: _Window, p: int, size: int) -> int | None:
    """Heuristic 1-3: the length of the oplog entry starting at `p`, or None."""
    head = win.get(p, 5)
    if len(head) < 5:
        return None
    length = int.from_bytes(head[:4], "little")
    if length < MIN_ENTRY_BYTES or length > MAX_ENTRY_BYTES or p + length > size:
        return None
    if head[4] not in _BSON_TYPES:
        return None
    raw = win.get(p, length)
    if raw[-1] != 0:
        return None
    try:
        doc = bson_bytes.decode(raw)
    except Exception:  # noqa: BLE001 - any failure to decode means "not here"
        return None
    if not isinstance(doc.get("ts"), Timestamp) or not isinstance(doc.get("op"), str):
        return None
    return length


# Offsets where heuristic 1-2 may hold, found by the regex engine rather than byte by byte:
# a length below 16 MiB (top byte 0) or up to 16 MiB + 16 KiB, then an element type.
_CANDIDATE = re.compile(
    rb"(?=(?:[\x00-\xff]{3}\x00|[\x00-\xff][\x00-\x40]\x00\x01)[\x01-\x13\x7f\xff])", re.S
)


def find_bson_start(src: Input, start: int, end: int, follow: int = 2) -> int | None:
    """The first offset in `[start, end)` where an oplog entry starts (heuristic 1-4)."""
    if start == 0:
        return 0
    win = _Window(src)
    size = src.size
    stop = min(end, size)
    pos = start
    while pos < stop:
        span = min(_CHUNK, stop - pos)
        chunk = src.read(pos, span + 4)
        for match in _CANDIDATE.finditer(chunk):
            if match.start() >= span:
                break
            p = pos + match.start()
            length = _entry_length(win, p, size)
            if length is None:
                continue
            q, ok = p + length, True
            for _ in range(follow):
                if q == size:
                    break
                step = _entry_length(win, q, size)
                if step is None:
                    ok = False
                    break
                q += step
            if ok:
                return p
        pos += span
    return None


def iter_bson(src: Input, path: str, first: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of the documents starting in `[first, end)`, read from `first` (a
    document start); the errors and messages of `cdcserver replay` (sources/file.py)."""
    win = _Window(src)
    size = src.size
    pos = first
    while pos < end:
        if pos + 4 > size:
            raise SplitError(f"{path}: corrupt BSON at byte offset {pos}: truncated document")
        length = int.from_bytes(win.get(pos, 4), "little")
        if length < 5 or length > MAX_ENTRY_BYTES:
            raise SplitError(f"{path}: corrupt BSON at byte offset {pos}: bad length {length}")
        if pos + length > size:
            raise SplitError(f"{path}: corrupt BSON at byte offset {pos}: truncated document")
        doc = win.get(pos, length)
        if doc[-1] != 0:
            raise SplitError(f"{path}: corrupt BSON at byte offset {pos}: no terminator")
        yield pos, doc
        pos += length


# -- Extended JSON lines ------------------------------------------------------------------------


def find_json_start(src: Input, start: int, end: int) -> int | None:
    """The first line start in `[start, end)`."""
    if start == 0:
        return 0
    pos = start - 1
    while pos < min(end, src.size):
        chunk = src.read(pos, _CHUNK)
        i = chunk.find(b"\n")
        if i >= 0:
            first = pos + i + 1
            return first if first < end else None
        pos += len(chunk)
    return None


def iter_lines(src: Input, first: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of the lines starting in `[first, end)`, newline included."""
    size = src.size
    pos = first
    buf, base = b"", first
    while pos < end and pos < size:
        off = pos - base
        nl = buf.find(b"\n", off)
        while nl < 0 and base + len(buf) < size:
            more = src.read(base + len(buf), max(_CHUNK, len(buf)))
            buf = buf[off:] + more
            base, off = pos, 0
            nl = buf.find(b"\n", off)
        stop = nl + 1 if nl >= 0 else len(buf)
        yield pos, buf[off:stop]
        pos = base + stop


# -- entries ------------------------------------------------------------------------------------


def entry_of(raw: bytes, where: str, line: int | None = None) -> Entry:
    """The decoded entry, checked as `cdcserver replay` checks it."""
    try:
        entry = decode_entry(raw)
        ts = entry["ts"]
    except (BSONError, KeyError, ValueError) as exc:
        raise SplitError(f"{where}: not an oplog entry ({exc})", line) from None
    if not isinstance(ts, Timestamp):
        raise SplitError(f"{where}: not an oplog entry (ts is not a Timestamp)", line)
    return entry


def iter_split(
    src: Input,
    split: Split,
    first: int,
    stop: int | None = None,
    stats: dict[str, int] | None = None,
) -> Iterator[tuple[int, int, bytes, Entry]]:
    """(byte offset, line number within the range or 0, bytes, entry) of each entry a range
    owns, starting at `first` (its first entry); `stop`: an offset to stop before. Entries are
    checked to be oplog entries in ascending `ts` order (within the range). `stats["lines"]`:
    the lines read so far (JSON lines), `stats["stop"]`: the offset after the last entry."""
    if stats is None:
        stats = {}
    stats["lines"] = 0
    stats["stop"] = first
    end = split.end if stop is None else min(split.end, stop)
    prev: Timestamp | None = None
    path = split.path
    if split.is_json:
        line = 0
        for offset, raw_line in iter_lines(src, first, end):
            line += 1
            stats["lines"] = line
            stats["stop"] = offset + len(raw_line)
            text = raw_line.strip()
            if not text:
                continue
            where = f"{path}:{LINE_MARK}"  # file:line, as the single-machine reader says it
            try:
                doc = json_util.loads(text, json_options=_CANONICAL)
            except ValueError as exc:
                raise SplitError(f"{where}: invalid JSON ({exc})", line) from None
            raw = bson_bytes.encode(with_oplog_types(doc))
            entry = entry_of(raw, where, line)
            ts = entry["ts"]
            if prev is not None and ts <= prev:
                raise SplitError(
                    f"{where}: entries are not in timestamp order ({ts} after {prev})", line
                )
            prev = ts
            yield offset, line, raw, entry
        return
    for offset, raw in iter_bson(src, path, first, end):
        where = f"{path}: byte offset {offset}"
        entry = entry_of(raw, where)
        ts = entry["ts"]
        if prev is not None and ts <= prev:
            raise SplitError(f"{where}: entries are not in timestamp order ({ts} after {prev})")
        prev = ts
        stats["stop"] = offset + len(raw)
        yield offset, 0, raw, entry


def count_lines(src: Input, first: int, end: int) -> int:
    """Lines starting in `[first, end)` (blank ones included)."""
    return sum(1 for _ in iter_lines(src, first, end))
