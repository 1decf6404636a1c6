"""Oplog sources: decoded entries are shared by the cursors reading them, within a bound."""

from __future__ import annotations

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.sources import base
from cdcserver.sources.file import FileOplog


def _write(tmp_path, n: int):
    path = tmp_path / "oplog.bson"
    path.write_bytes(b"".join(
        bson.encode({"ts": Timestamp(1000 + i, 1), "t": Int64(1), "v": Int64(2), "op": "n",
                     "ns": "", "o": {"msg": "periodic noop"}})
        for i in range(n)
    ))
    return FileOplog([str(path)])


def test_readers_at_the_same_position_share_decoded_entries(tmp_path):
    oplog = _write(tmp_path, 10)
    first = oplog.read_from(Timestamp(1003, 1), 5)
    second = oplog.read_from(Timestamp(1003, 1), 5)
    assert [e["ts"] for e in first] == [Timestamp(1003 + i, 1) for i in range(5)]
    assert all(a is b for a, b in zip(first, second, strict=True))


def test_the_decoded_window_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "DECODED_WINDOW", 8)
    oplog = _write(tmp_path, 50)
    entries = oplog.read_from(Timestamp(0, 0), 100)
    assert len(entries) == 50
    assert len(oplog._decoded) == 8
    # Entries that fell out of the window decode again, to equal values.
    again = oplog.read_from(Timestamp(1000, 1), 1)[0]
    assert again is not entries[0] and again == entries[0]
