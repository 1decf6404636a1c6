"""The command line as a user meets it: one-line errors with a non-zero status and no
traceback (a missing --out directory, a directory given as --oplog, conflicting sources),
`replay | head -1` and Ctrl-C ending quietly as Unix tools do, --version, the top-level help,
and the one line `serve` logs about what it serves (paths from a config file resolved against
the file's directory).
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import bson
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.cli import sample_oplog_path

CLI = [sys.executable, "-m", "cdcserver.cli"]
GUARD_S = 60.0  # hang guards only
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(*args: str, cwd: pathlib.Path | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=GUARD_S,
                          cwd=cwd, env={**ENV, **env})


def assert_one_line_error(result: subprocess.CompletedProcess, *expected: str) -> str:
    assert result.returncode not in (0, None), result
    err = result.stderr.strip()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture(scope="module")
def big_oplog(tmp_path_factory) -> pathlib.Path:
    """Enough events (~2 MB of Extended JSON) to fill any pipe buffer many times over."""
    path = tmp_path_factory.mktemp("oplog") / "oplog.bson"
    uuid = bson.Binary(bytes(16), 4)
    path.write_bytes(b"".join(
        bson.encode({"op": "i", "ns": "db.c", "ui": uuid, "o": {"_id": i, "pad": "x" * 100},
                     "o2": {"_id": i}, "ts": Timestamp(1_800_000_000, i + 1), "t": Int64(1),
                     "v": Int64(2), "wall": bson.datetime.datetime(2027, 1, 15)})
        for i in range(5000)
    ))
    return path


# --- replay ---------------------------------------------------------------------------------


def test_replay_into_head_exits_quietly(big_oplog):
    """`cdcserver replay ... | head -1`: head takes its line and exits; replay's next write
    fails (EPIPE) and it ends as a Unix tool killed by SIGPIPE would: status 141, nothing
    on stderr."""
    command = " ".join([*CLI, "replay", "--oplog", str(big_oplog), "--cluster"])
    script = f"{command} 2>replay.err | head -1; echo \"status=${{PIPESTATUS[0]}}\""
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                            timeout=GUARD_S, cwd=big_oplog.parent, env=ENV)
    first, status = result.stdout.splitlines()
    assert bson.json_util.loads(first)["documentKey"] == {"_id": 0}
    assert status == "status=141"
    assert (big_oplog.parent / "replay.err").read_text() == ""


def test_replay_ctrl_c_exits_130_quietly(big_oplog):
    proc = subprocess.Popen(
        [*CLI, "replay", "--oplog", str(big_oplog), "--cluster"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
        # As at a terminal: a shell's background job (CI's, say) starts with SIGINT ignored,
        # which the child would inherit (and Python then never raises KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # it runs; unread, its output soon fills the pipe and it waits
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 130, err
    assert err.decode() == ""


def test_replay_out_into_a_missing_directory(tmp_path):
    result = run("replay", "--oplog", sample_oplog_path(), "--cluster",
                 "--out", str(tmp_path / "missing" / "events.jsonl"))
    assert_one_line_error(result, "cdcserver replay: cannot write --out",
                          "No such file or directory")
    assert result.returncode == 2
    assert not (tmp_path / "missing").exists()


def test_replay_out_writes_every_event(tmp_path):
    out = tmp_path / "events.jsonl"
    result = run("replay", "--oplog", sample_oplog_path(), "--cluster", "--out", str(out))
    assert result.returncode == 0, result.stderr
    events = [bson.json_util.loads(line) for line in out.read_text().splitlines()]
    assert [e["operationType"] for e in events] == [
        "insert", "insert", "insert", "insert", "insert", "update", "update", "replace",
        "delete",
    ]


def test_directory_as_oplog(tmp_path):
    dump = tmp_path / "dump"
    (dump / "local").mkdir(parents=True)
    plain = tmp_path / "empty-dir"
    plain.mkdir()
    err = assert_one_line_error(run("replay", "--oplog", str(plain), "--cluster"),
                                "is a directory, not an oplog file")
    assert "no such file" not in err
    # A mongodump output directory: the error names the oplog file inside it.
    (dump / "local" / "oplog.rs.bson").write_bytes(b"")
    assert_one_line_error(run("replay", "--oplog", str(dump), "--cluster"),
                          f"is a directory (the oplog in it: {dump / 'local' / 'oplog.rs.bson'})")
    serve = run("serve", "--oplog", str(plain), "--port", "0", "--metrics-port", "0")
    assert_one_line_error(serve, "source.oplog[0]", "is a directory")
    assert serve.returncode == 2


# --- serve: one source -----------------------------------------------------------------------


@pytest.mark.parametrize("flags", [
    ["--oplog", "a.bson", "--upstream", "mongodb://127.0.0.1:1/"],
    ["--sample", "--oplog", "a.bson"],
    ["--sample", "--upstream", "mongodb://127.0.0.1:1/"],
    ["--in-memory", "--data-dir", "d"],
    ["--in-memory", "--oplog", "a.bson"],
    ["--data-dir", "d", "--upstream", "mongodb://127.0.0.1:1/"],
])
def test_conflicting_source_flags_are_refused(flags, tmp_path):
    result = run("serve", *flags, "--port", "0", cwd=tmp_path)
    assert_one_line_error(result, "not allowed with argument", "(see cdcserver serve --help)")
    assert result.returncode == 2
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing created


def test_sources_from_config_and_flags_conflict(tmp_path):
    oplog = tmp_path / "a.jsonl"
    oplog.write_text(pathlib.Path(sample_oplog_path()).read_text())
    result = run("serve", "--oplog", str(oplog), "--port", "0",
                 CDCSERVER_UPSTREAM_URI="mongodb://127.0.0.1:1/")
    assert_one_line_error(result, "source.oplog (from command line): cannot be used with "
                                  "upstream.uri")
    result = run("serve", "--sample", "--port", "0", CDCSERVER_SOURCE_OPLOG=f'["{oplog}"]')
    assert_one_line_error(result, "--sample cannot be used with source.oplog")
    result = run("serve", "--follow", "--port", "0", cwd=tmp_path)
    assert_one_line_error(result, "--follow needs an oplog file")


def test_a_data_dir_that_cannot_be_made_is_one_clear_line(tmp_path):
    """Not a raw "[Errno 2] No such file or directory: 'x/data'": the option, the directory,
    what is in the way, what to do; status 2 as other config errors."""
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "a-file").write_text("")
    for given, cause, fix in [
        ("dangling/data", f"{tmp_path / 'dangling'} is a symbolic link to {tmp_path / 'gone'}, "
         "which does not exist", f"create {tmp_path / 'gone'}"),
        ("a-file/data", f"{tmp_path / 'a-file'} is not a directory",
         f"move {tmp_path / 'a-file'} away"),
    ]:
        result = run("serve", "--data-dir", given, "--port", "0", "--metrics-port", "0",
                     cwd=tmp_path)
        err = assert_one_line_error(
            result, f"cdcserver: store.data_dir (--data-dir): cannot create the data directory "
            f"{tmp_path / given}: {cause}; {fix}, or give another directory")
        assert "Errno" not in err and result.returncode == 2
    (tmp_path / "r.toml").write_text('[upstream]\nuri = "mongodb://127.0.0.1:1/"\n'
                                     'retain_dir = "a-file/retained"\n')
    result = run("serve", "--config", "r.toml", "--port", "0", "--metrics-port", "0",
                 cwd=tmp_path)
    assert_one_line_error(result, "cdcserver: upstream.retain_dir: cannot create the data "
                          f"directory {tmp_path / 'a-file' / 'retained'}: ")
    assert result.returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "dangling", "r.toml"]


def test_mongods_dbpath_and_bind_ip(tmp_path):
    """`mongod --dbpath D --bind_ip H` spelled the same for cdcserver serve."""
    line = _serving_line(["--dbpath", "db", "--bind_ip", "127.0.0.1"], tmp_path)
    assert f"serving the embedded store in {tmp_path / 'db'};" in line, line
    assert re.search(r"; on mongodb://127\.0\.0\.1:\d+/; ", line), line
    assert (tmp_path / "db" / "cdcserver.sqlite3").exists()
    # mongod takes a list; cdcserver listens on one address, and says so.
    result = run("serve", "--bind_ip", "127.0.0.1,::1", "--port", "0", cwd=tmp_path)
    assert_one_line_error(result, "--bind_ip/--host 127.0.0.1,::1: cdcserver listens on one "
                          "address")
    assert result.returncode == 2


# --- version, help ---------------------------------------------------------------------------


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"cdcserver {importlib.metadata.version('cdcserver')}"


def test_top_level_help_describes_every_command():
    result = run("--help")
    assert result.returncode == 0
    text = result.stdout
    assert "MongoDB change-stream server" in text and "--version" in text
    for command in ("serve", "replay", "spark-replay", "config", "check-config", "ping",
                    "hash-password"):
        assert re.search(rf"^\s+{command}\b", text, re.M), command
    assert "`cdcserver serve | replay`" not in text  # the old one-line description


# --- serve's one line ------------------------------------------------------------------------


def _serving_line(args: list[str], cwd: pathlib.Path) -> str:
    """Start `serve` with `args`, return its `serving` line, stop it (SIGTERM: status 0)."""
    log_path = cwd / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CLI, "serve", "--port", "0", "--metrics-port", "0", *args],
                                cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    try:
        deadline = time.monotonic() + GUARD_S
        while (match := re.search(r"INFO (serving .*)", log_path.read_text())) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
    finally:
        proc.terminate()
        assert proc.wait(GUARD_S) == 0, log_path.read_text()
    assert len(re.findall(r"INFO serving ", log_path.read_text())) == 1
    return match.group(1)


def test_serve_logs_what_it_serves(tmp_path):
    line = _serving_line(["--sample"], tmp_path)
    assert f"serving the recorded oplog {sample_oplog_path()};" in line
    assert ("oplog 11 entries, Timestamp(1763700001, 1) (2025-11-21T04:40:01Z) to "
            "Timestamp(1763700011, 1) (2025-11-21T04:40:11Z)") in line
    port = re.search(r"on mongodb://127\.0\.0\.1:(\d+)/; metrics http://127\.0\.0\.1:(\d+)/",
                     line)
    assert port and int(port.group(1)) > 0 and int(port.group(2)) > 0, line
    line = _serving_line(["--in-memory"], tmp_path)
    assert line.startswith("serving the embedded store in memory; oplog 1 entry, "), line


def test_config_paths_are_relative_to_the_config_file(tmp_path):
    """data_dir = "data" in conf/c.toml is conf/data, whatever the working directory; the
    same path in a variable or a flag is relative to the working directory."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "c.toml").write_text('[store]\ndata_dir = "data"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    line = _serving_line(["--config", str(conf / "c.toml")], elsewhere)
    assert f"serving the embedded store in {conf / 'data'};" in line
    assert (conf / "data").is_dir() and not (elsewhere / "data").exists()
    line = _serving_line(["--config", str(conf / "c.toml"), "--data-dir", "flagged"], elsewhere)
    assert f"serving the embedded store in {elsewhere / 'flagged'};" in line
