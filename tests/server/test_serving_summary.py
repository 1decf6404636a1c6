"""The `serving` line (issue 29): a restarted sidecar's range and count are its retained
log's, not its empty live window's; `--shards N` says which port is which shard; recorded
shard oplogs are named as such, not as an embedded store."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import bson
from bson import Timestamp
from pymongo import MongoClient

from cdcserver.cli import sample_oplog_path
from cdcserver.config import Config, UpstreamConfig
from cdcserver.logs import serving_summary
from cdcserver.sources.mongo_common import UpstreamOptions
from cdcserver.sources.mongo_tail import UpstreamOplog


def test_a_restarted_sidecar_counts_its_retained_entries(tmp_path) -> None:
    uri = "mongodb://127.0.0.1:1/"
    options = UpstreamOptions(uri=uri, retain_dir=str(tmp_path))
    first = UpstreamOplog(options)
    assert first.retained is not None
    now = int(time.time())  # retain_hours keeps recent entries only
    entries = [{"ts": Timestamp(now + i, 1), "t": bson.Int64(1), "op": "n",
                "ns": "", "o": {"msg": "x"}, "v": 2, "wall": None} for i in range(3)]
    first.retained.append([(e["ts"], bson.encode(e)) for e in entries])
    first.retained.close()
    restarted = UpstreamOplog(options)  # as after a restart: nothing tailed yet
    try:
        config = Config(upstream=UpstreamConfig(uri=uri))
        line = serving_summary(config, restarted, 27017, None)
    finally:
        assert restarted.retained is not None
        restarted.retained.close()
    assert "serving the replica set at mongodb://127.0.0.1:1/;" in line, line
    assert f"; oplog 3 entries, Timestamp({now}, 1)" in line, line
    assert f"to Timestamp({now + 2}, 1)" in line, line


GUARD_S = 60.0  # hang guards only


@contextlib.contextmanager
def serving(args: list[str], cwd: pathlib.Path) -> Iterator[str]:
    """`cdcserver serve --port 0 --metrics-port 0 ARGS` running; its `serving` line."""
    log_path = cwd / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--port", "0", "--metrics-port",
             "0", *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + GUARD_S
        while (match := re.search(r"INFO (serving .*)", log_path.read_text())) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
        yield match.group(1)
    finally:
        proc.terminate()
        assert proc.wait(GUARD_S) == 0, log_path.read_text()


def test_an_embedded_cluster_says_which_port_is_which_shard(tmp_path) -> None:
    with serving(["--in-memory", "--shards", "2"], tmp_path) as line:
        assert line.startswith("serving an embedded sharded cluster of 2 shards in memory; "), line
        where = re.search(r"; on mongodb://127\.0\.0\.1:(\d+)/ \(mongos; shard0 "
                          r"(127\.0\.0\.1:\d+), shard1 (127\.0\.0\.1:\d+)\); metrics ", line)
        assert where, line
        front, shard0, shard1 = where.groups()
        with MongoClient(f"mongodb://127.0.0.1:{front}/", serverSelectionTimeoutMS=20_000) as c:
            listed = {s["_id"]: s["host"] for s in c.admin.command("listShards")["shards"]}
        # Each shard's replica set at the port the line gives it.
        assert listed == {"shard0": f"shard0/{shard0}", "shard1": f"shard1/{shard1}"}, listed
        with MongoClient(f"mongodb://{shard1}/", directConnection=True,
                         serverSelectionTimeoutMS=20_000) as c:
            assert c.admin.command("hello")["setName"] == "shard1"


def test_recorded_shards_are_named_as_shards(tmp_path) -> None:
    lines = pathlib.Path(sample_oplog_path()).read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:3]))
    (tmp_path / "b.jsonl").write_text("".join(lines[3:6]))
    with serving(["--oplog", "a.jsonl", "--oplog", "b.jsonl"], tmp_path) as line:
        assert line.startswith(f"serving the recorded oplogs of shard0 ({tmp_path / 'a.jsonl'}), "
                               f"shard1 ({tmp_path / 'b.jsonl'}); oplog 6 entries, "), line
        assert re.search(r"; on mongodb://127\.0\.0\.1:\d+/ \(mongos\); metrics ", line), line
    assert not (tmp_path / "cdcserver-data").exists()
