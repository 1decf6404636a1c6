"""The WAL is checkpointed beside the writes (persist._Checkpointer), not in the COMMIT that
crosses SQLite's threshold: the database file receives what was committed, the writer
checkpoints itself when the thread lags too far, and a closed store leaves no WAL."""

from __future__ import annotations

import os
import pathlib
import time

import pytest
from bson.timestamp import Timestamp

from cdcserver.embedded import persist
from cdcserver.embedded.persist import Persistence

ROW = 8192


def _write(p: Persistence, first: int, n: int) -> None:
    for i in range(first, first + n):
        p.append_oplog(Timestamp(1, i + 1), bytes([i % 251]) * ROW)
        if i % 16 == 15:
            p.commit()
    p.commit()


def _main_file_size(p: Persistence) -> int:
    return os.path.getsize(p.path)


def test_checkpointer_copies_the_wal_into_the_database(tmp_path: pathlib.Path) -> None:
    p = Persistence(str(tmp_path), "normal")
    try:
        before = _main_file_size(p)
        _write(p, 0, (persist.CHECKPOINT_BYTES // ROW) + 64)
        deadline = time.monotonic() + 60  # a condition awaited, not a duration asserted
        while _main_file_size(p) < persist.CHECKPOINT_BYTES and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _main_file_size(p) >= persist.CHECKPOINT_BYTES > before
        assert p._written >= persist.CHECKPOINT_BYTES
    finally:
        p.close()


def test_writer_checkpoints_when_the_thread_lags(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(persist, "CHECKPOINT_BYTES", 256 * 1024)
    monkeypatch.setattr(persist, "CHECKPOINT_INLINE_BYTES", 1 << 20)
    p = Persistence(str(tmp_path), "normal")
    try:
        assert p._checkpointer is not None
        p._checkpointer.close()  # a thread that never gets to run: the writer's own remains
        before = _main_file_size(p)
        _write(p, 0, (2 << 20) // ROW)
        assert _main_file_size(p) >= (1 << 20) > before
    finally:
        p._checkpointer = None
        p.close()


def test_closed_store_has_every_row_and_no_wal(tmp_path: pathlib.Path) -> None:
    p = Persistence(str(tmp_path), "full")
    _write(p, 0, 700)
    p.close()
    assert not os.path.exists(p.path + "-wal")
    again = Persistence(str(tmp_path), "full")
    try:
        rows = list(again.oplog())
        assert len(rows) == 700
        assert [bytes(e)[:1] for _, e in rows[:3]] == [b"\x00", b"\x01", b"\x02"]
    finally:
        again.close()
