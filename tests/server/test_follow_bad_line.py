"""`serve --oplog F.jsonl --follow` when a bad line is appended (issue 29, item 6): what came
before stays served, and instead of waiting forever a stream that has read it all fails with
280 naming the file and line: one that was waiting, one opened afterwards, one that starts
earlier (after its events). One ERROR line in the log, `cdcserver_source_failed 1.0` in the
metrics, and the server still answers. Run as a user runs it: `cdcserver serve` in a
subprocess."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from cdcserver.testing import append_oplog, write_oplog
from tests.support.oplog_builders import Oplog
from tests.support.server_support import wait_for_log

CLI = [sys.executable, "-m", "cdcserver.cli"]
GUARD_S = 60.0  # hang guards only
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _ids_until_error(
    stream: Any, ids: list[int] | None = None
) -> tuple[list[int], OperationFailure | None]:
    """The events' _ids (into `ids` as they come) and the error that ended the stream."""
    ids = [] if ids is None else ids
    try:
        for event in stream:
            ids.append(event["documentKey"]["_id"])
    except OperationFailure as exc:
        return ids, exc
    return ids, None


def test_a_bad_appended_line_fails_the_streams_that_reach_it(tmp_path):
    oplog = Oplog()
    first = oplog.insert("a.b", {"_id": 1})["ts"]
    path = write_oplog(tmp_path / "oplog.jsonl", oplog.entries)
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*CLI, "serve", "--oplog", str(path), "--follow", "--port", "0",
             "--metrics-port", "0"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    waiting = None
    try:
        serving = wait_for_log(r"on mongodb://127\.0\.0\.1:(\d+)/; metrics http://127\.0\.0\.1:"
                            r"(\d+)/metrics", log_path, proc)
        port, metrics_port = int(serving.group(1)), int(serving.group(2))
        with MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=10_000) as c:
            waiting = c.a.b.watch(max_await_time_ms=100)  # from now: waits for what comes
            seen: list[int] = []
            result = pool.submit(_ids_until_error, waiting, seen)
            oplog.insert("a.b", {"_id": 2})
            append_oplog(path, oplog.entries[-1:])  # a good line 2 ...
            deadline = time.monotonic() + GUARD_S
            while not seen:
                assert time.monotonic() < deadline and not result.done()
                time.sleep(0.01)
            time.sleep(0.2)  # ... read and returned: its getMore waits again, on nothing
            with open(path, "ab") as f:
                f.write(b"{not json\n")  # ... then a bad line 3

            ids, error = result.result(GUARD_S)
            assert ids == [2]
            assert error is not None and error.code == 280, error
            assert str(error).startswith(f"{path}:3: invalid JSON"), error

            with pytest.raises(OperationFailure) as opened_after:
                c.a.b.watch()
            assert opened_after.value.code == 280
            assert str(opened_after.value).startswith(f"{path}:3: invalid JSON")

            with c.a.b.watch(start_at_operation_time=first, max_await_time_ms=100) as earlier:
                ids, error = _ids_until_error(earlier)
            assert ids == [1, 2]  # the events before the bad line first
            assert error is not None and error.code == 280

            assert c.admin.command("ping")["ok"] == 1.0  # still serving
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=GUARD_S) as reply:
            metrics = reply.read().decode()
        assert "\ncdcserver_source_failed 1.0\n" in metrics, metrics
    finally:
        proc.terminate()
        proc.wait(GUARD_S)
        if waiting is not None:
            waiting.close()
        pool.shutdown()
    text = log_path.read_text()
    # The follow loop kept polling after the error (every 10 ms, above): it said so once.
    assert len(re.findall(r"ERROR.*stopped following", text)) == 1, text
    assert f"stopped following {path}: {path}:3: invalid JSON" in text, text
