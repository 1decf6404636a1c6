"""`cdcserver --version` and `--help` import nearly nothing (issue 30): none of bson,
msgspec, pymongo or the server's own modules, which `serve` and `replay` import when run."""

from __future__ import annotations

import subprocess
import sys

import pytest

_HEAVY = ("bson", "msgspec", "pymongo", "mongomock", "sqlite3", "asyncio",
          "cdcserver.config", "cdcserver.sources", "cdcserver.spark.splits", "pipeline_stages")

_PROBE = """
import sys
from cdcserver.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("MODULES", " ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["serve", "--help"],
                                  ["config", "--defaults"]])
def test_version_and_help_import_nearly_nothing(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                         text=True, check=True).stdout
    modules = set(out.rsplit("MODULES ", 1)[1].split())
    assert not sorted(m for m in modules if m.split(".")[0] in _HEAVY or m in _HEAVY)


def test_spark_default_split_size_matches_the_splits_module() -> None:
    from cdcserver.spark import cli, splits

    assert cli.DEFAULT_SPLIT_SIZE == splits.DEFAULT_SPLIT_SIZE


_SERVE_PROBE = """
import socket, struct, sys
import bson
from cdcserver.testing import EmbeddedServer
with EmbeddedServer() as server:
    body = bson.encode({"ping": 1, "$db": "admin"})
    msg = struct.pack("<IB", 0, 0) + body  # OP_MSG: flagBits, a kind-0 section
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(msg), 1, 0, 2013) + msg)
        reply = b""
        while len(reply) < 4 or len(reply) < struct.unpack("<i", reply[:4])[0]:
            reply += sock.recv(1 << 16)
    ok = bson.decode(reply[21:])["ok"]
    print("OK", ok, "MODULES", " ".join(sorted(sys.modules)))
"""


def test_a_server_answers_its_first_ping_without_the_query_engine_library() -> None:
    """mongomock and its dependencies are a tenth of the start-up: loaded on the first query
    that needs them, not before the first ping (issue 30)."""
    out = subprocess.run([sys.executable, "-c", _SERVE_PROBE], capture_output=True,
                         text=True, check=True).stdout
    ok, modules = out.split("OK ", 1)[1].split(" MODULES ", 1)
    assert float(ok) == 1.0
    loaded = set(modules.split())
    assert not sorted(m for m in loaded if m.split(".")[0] in ("mongomock", "snappy", "zoneinfo"))
