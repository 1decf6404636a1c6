"""`cdcserver replay` reads its oplog files once, in bounded memory (`OplogStream`), and gives
what reading them whole (`FileOplog`) gives: the same events, the same errors."""

from __future__ import annotations

import functools
import pathlib
import tracemalloc

import bson
import pytest
from bson import json_util
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver import cli
from cdcserver.sources import file as file_source
from cdcserver.sources.file import FileOplog, OplogFileError, OplogStream
from tests.spark.test_spark_replay import CANONICAL, Workload

CLUSTER = {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": True}}]}


def _inserts(path: pathlib.Path, n: int, pad: int = 1000) -> int:
    uuid = bson.Binary(bytes(16), 4)
    with open(path, "wb") as f:
        for i in range(n):
            f.write(bson.encode({
                "op": "i", "ns": "db.c", "ui": uuid, "o": {"_id": i, "pad": "x" * pad},
                "o2": {"_id": i}, "ts": Timestamp(1_800_000_000, i + 1), "t": Int64(1),
                "v": Int64(2),
            }))
    return path.stat().st_size


def _replay_peak(path: pathlib.Path) -> tuple[int, int]:
    """(events, peak bytes allocated by Python while replaying the file)."""
    tracemalloc.start()
    try:
        events = sum(len(batch) for batch, _ in cli.replay_events([str(path)], CLUSTER, "admin"))
        return events, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_replay_memory_does_not_grow_with_the_archive(tmp_path):
    """Four times the entries, the same peak: what is held is one batch, not the file (which
    read whole would be held at least once: 18 MB here)."""
    small, large = tmp_path / "small.bson", tmp_path / "large.bson"
    _inserts(small, 4000)
    size = _inserts(large, 16000)
    _replay_peak(small)  # the modules the replay imports on first use are not the replay's
    events_small, peak_small = _replay_peak(small)
    events_large, peak_large = _replay_peak(large)
    assert (events_small, events_large) == (4000, 16000)
    assert peak_large < peak_small + 2 * 1024 * 1024, (peak_small, peak_large)
    assert peak_large < size / 2, (peak_large, size)


def _events(paths: list[str], cmd=CLUSTER, db="admin") -> list[bytes]:
    return [e.raw for batch, _ in cli.replay_events(paths, cmd, db) for e in batch]


@pytest.mark.parametrize("suffix", [".bson", ".jsonl"])
def test_transaction_entries_read_again_from_the_file(tmp_path, monkeypatch, suffix):
    """With no room to hold transaction entries, each one a chain names is read again from
    its file (BSON and JSON lines): the same events as with every one held."""
    path = Workload(seed=5).write(tmp_path / f"oplog{suffix}", 3000)
    expected = _events([str(path)])
    assert expected
    stream = OplogStream([str(path)], link_budget=1, index_every=4096)
    whole = FileOplog([str(path)])
    read = stream.read_from(Timestamp(0, 0), 10**9)
    assert [e["ts"] for e in read] == whole._ts
    assert len(stream._links) == 1  # all but the last were dropped
    for ts in whole._ts[::7]:
        assert stream.entry_at(ts) == whole.entry_at(ts)
    assert stream.entry_at(Timestamp(whole._ts[-1].time + 1, 0)) is None
    # cli imports it when replay runs (lazy imports keep --version fast): patched at its home.
    monkeypatch.setattr(
        file_source, "OplogStream",
        functools.partial(OplogStream, link_budget=1, index_every=4096),
    )
    assert _events([str(path)]) == expected


def test_several_files_and_a_resume_point(tmp_path):
    """Files that continue each other, read as one; a start after the first entry."""
    work = Workload(seed=6)
    first = work.write(tmp_path / "a.bson", 500)
    second = work.write(tmp_path / "b.bson", 500)
    whole = FileOplog([str(first), str(second)])
    stream = OplogStream([str(first), str(second)], batch_bytes=4096)
    assert stream.oldest_entry() == whole.oldest_entry()
    start = whole._ts[700]
    got = []
    position = start
    while batch := stream.read_from(position, 1000):
        got += batch
        last = batch[-1]["ts"]
        position = Timestamp(last.time, last.inc + 1)
    assert [e["ts"] for e in got] == whole._ts[700:]
    cmd = {"aggregate": 1, "pipeline": [
        {"$changeStream": {"allChangesForCluster": True, "startAtOperationTime": start}}
    ]}
    events = _events([str(first), str(second)], cmd)
    assert events and all(bson.decode(e)["clusterTime"] >= start for e in events)


def _corruptions(path: pathlib.Path) -> dict[str, bytes]:
    data = path.read_bytes()
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += int.from_bytes(data[pos : pos + 4], "little")
    at = starts[40]
    second = bson.decode(data[starts[41] : starts[42]])
    second["ts"] = Timestamp(1, 1)
    return {
        "bad length": data[:at] + b"\xff\xff\xff\x7f" + data[at + 4 :],
        "truncated": data[: len(data) - 3],
        "a few bytes": data + b"\x01\x02",
        "no terminator": data[: starts[41] - 1] + b"\x01" + data[starts[41] :],
        "out of order": data[: starts[41]] + bson.encode(second) + data[starts[42] :],
        "not an entry": data[:at] + bson.encode({"x": 1}) + data[at:],
    }


@pytest.mark.parametrize(
    "case",
    ["bad length", "truncated", "a few bytes", "no terminator", "out of order", "not an entry"],
)
def test_a_bad_file_gives_the_whole_read_error(tmp_path, case):
    path = Workload(seed=7).write(tmp_path / "oplog.bson", 200)
    bad = tmp_path / "bad.bson"
    bad.write_bytes(_corruptions(path)[case])
    with pytest.raises(OplogFileError) as whole:
        FileOplog([str(bad)])
    with pytest.raises(OplogFileError) as streamed:
        OplogStream([str(bad)]).read_to_end()
    assert str(streamed.value) == str(whole.value)
    with pytest.raises(OplogFileError) as replayed:
        _events([str(bad)])
    assert str(replayed.value) == str(whole.value)


def test_a_bad_json_line_gives_the_whole_read_error(tmp_path):
    path = Workload(seed=8).write(tmp_path / "oplog.jsonl", 100)
    lines = path.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines[:30]) + b"\n{not json\n" + b"".join(lines[30:]))
    with pytest.raises(OplogFileError) as whole:
        FileOplog([str(bad)])
    with pytest.raises(OplogFileError) as streamed:
        _events([str(bad)])
    assert str(streamed.value) == str(whole.value)
    assert ":32: invalid JSON" in str(whole.value)
    # The last line without its newline is read.
    doc = json_util.loads(lines[-1], json_options=CANONICAL)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines).rstrip(b"\n"))
    assert OplogStream([str(cut)]).read_from(Timestamp(0, 0), 10**9)[-1]["ts"] == doc["ts"]
