"""The data directory: one server at a time, and a damaged one is refused at start.

Like mongod's `mongod.lock`, a `serve --data-dir D` holds an OS lock on `D/cdcserver.lock`
(released by the kernel when the process ends, SIGKILL included): a second server on D exits
at once, non-zero, with one line naming D and the PID holding it, and never touches the
database (before, it started, its writes failed with raw SQLite errors, and an acknowledged
write could be lost). A database file that is not what was written (overwritten, truncated, a
row of garbage) is refused at start with one line naming the file and what to do, instead of a
traceback or a server that serves half of it.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import subprocess
import sys

import pytest
from pymongo import MongoClient

from cdcserver.testing import HOST, SubprocessServer

DB_FILE = "cdcserver.sqlite3"
REFUSAL_GUARD_S = 60.0  # against a second server that starts and serves: never a timing claim


def serve_refused(data_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`cdcserver serve --data-dir` expected to exit by itself."""
    args = [sys.executable, "-m", "cdcserver.cli", "serve", "--host", HOST, "--port", "0",
            "--metrics-port", "0", "--data-dir", str(data_dir)]
    return subprocess.run(args, capture_output=True, text=True, timeout=REFUSAL_GUARD_S,
                          stdin=subprocess.DEVNULL)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("cdcserver: "), lines
    return lines[0]


def client(server: SubprocessServer) -> MongoClient:
    return MongoClient(server.direct_uri, serverSelectionTimeoutMS=10_000)


def test_second_server_on_a_data_dir_is_refused(tmp_path):
    data = tmp_path / "data"
    first = SubprocessServer(data_dir=data)
    try:
        with client(first) as c:
            c.d.c.insert_one({"_id": 1})
            result = serve_refused(data)
            line = one_line_error(result)
            assert str(data) in line and f"pid {first.pid}" in line, line
            assert "DBPathInUse" in line and "Another cdcserver instance" in line, line
            # The first server is untouched and goes on.
            c.d.c.insert_one({"_id": 2})
            assert sorted(d["_id"] for d in c.d.c.find()) == [1, 2]
    finally:
        first.stop()
    again = SubprocessServer(data_dir=data)  # the lock went with the first server
    try:
        with client(again) as c:
            assert sorted(d["_id"] for d in c.d.c.find()) == [1, 2]
            assert [e["o"]["_id"] for e in c.local.oplog.rs.find({"op": "i", "ns": "d.c"})] \
                == [1, 2]
    finally:
        again.stop()


def test_lock_of_a_killed_server_is_released(tmp_path):
    data = tmp_path / "data"
    first = SubprocessServer(data_dir=data)
    try:
        with client(first) as c:
            c.d.c.insert_one({"_id": "before"})
        first.kill()  # SIGKILL: no cleanup; the kernel drops the lock
    finally:
        first.stop()
    second = SubprocessServer(data_dir=data)
    try:
        with client(second) as c:
            assert c.d.c.find_one() == {"_id": "before"}
            lock = (data / "cdcserver.lock").read_text().strip()
            assert lock == str(second.pid)  # the holder's PID, for the next refusal's message
    finally:
        second.stop()


def _filled(tmp_path: pathlib.Path) -> pathlib.Path:
    data = tmp_path / "data"
    server = SubprocessServer(data_dir=data)
    try:
        with client(server) as c:
            c.d.c.insert_many([{"_id": i, "pad": "x" * 500} for i in range(200)])
    finally:
        server.stop()
    return data


def _drop_wal(data: pathlib.Path) -> None:
    for suffix in ("-wal", "-shm"):
        path = data / (DB_FILE + suffix)
        if path.exists():
            path.unlink()


def _overwrite(data: pathlib.Path) -> None:
    (data / DB_FILE).write_bytes(os.urandom(64 * 1024))
    _drop_wal(data)


def _truncate(data: pathlib.Path) -> None:
    path = data / DB_FILE
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    _drop_wal(data)


def _garbage_row(data: pathlib.Path) -> None:
    # A well-formed SQLite file whose stored document is not BSON any more.
    db = sqlite3.connect(data / DB_FILE)
    with db:
        db.execute("UPDATE documents SET doc = ? WHERE rowid = (SELECT MIN(rowid) FROM "
                   "documents)", (b"\x10\x00\x00\x00garbage!",))
    db.close()


@pytest.mark.parametrize("damage", [_overwrite, _truncate, _garbage_row],
                         ids=["overwritten", "truncated", "garbage row"])
def test_corrupt_data_dir_is_refused_at_start(tmp_path, damage):
    data = _filled(tmp_path)
    damage(data)
    line = one_line_error(serve_refused(data))
    assert str(data / DB_FILE) in line and "corrupt" in line, line
    assert "backup" in line, line  # says what to do
    # Refused whole: the lock was released too, so the operator's next attempt is not
    # "in use" but the same diagnosis.
    assert "corrupt" in one_line_error(serve_refused(data))
