"""A client that forgot `tls=true` on `cdcserver serve` with `[tls] enabled` (issue 29, item
7): the server logs it once per connection as mongod does (id 22988, INFO: "Error receiving
request from client. Ending connection from remote", SSLHandshakeFailed "The server is
configured to only allow SSL connections") and closes it; TLS clients are served as before.
Run as a user runs it: `cdcserver serve --config` in a subprocess, pymongo and a raw hello."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import bson
import pymongo
import pytest
import trustme
from pymongo.errors import ServerSelectionTimeoutError

from tests.support.server_support import wait_for_log

GUARD_S = 60.0  # hang guards only
REFUSED = ("Error receiving request from client. Ending connection from remote: "
           "SSLHandshakeFailed: The server is configured to only allow SSL connections")


def _hello_message() -> bytes:
    """A plaintext OP_MSG hello, as any driver sends first."""
    body = (0).to_bytes(4, "little") + b"\x00" + bson.encode({"hello": 1, "$db": "admin"})
    header = (16 + len(body)).to_bytes(4, "little") + (1).to_bytes(4, "little")
    return header + (0).to_bytes(4, "little") + (2013).to_bytes(4, "little") + body


@pytest.fixture
def tls_server(tmp_path):
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "tls.toml").write_text('[tls]\nenabled = true\ncertificate_file = "server.pem"\n')
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcserver.cli", "serve", "--in-memory", "--config",
             "tls.toml", "--port", "0", "--metrics-port", "0",
             "--unixSocketPrefix", str(tmp_path)],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port = int(wait_for_log(r"INFO serving .* on mongodb://127\.0\.0\.1:(\d+)/", log_path,
                             proc).group(1))
        yield port, tmp_path, log_path, proc
    finally:
        proc.terminate()
        assert proc.wait(GUARD_S) == 0, log_path.read_text()


def test_a_plaintext_client_is_logged_once_per_connection(tls_server):
    port, tmp_path, log_path, proc = tls_server
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD_S) as sock:
        here = sock.getsockname()
        sock.sendall(_hello_message())
        assert sock.recv(1024) == b""  # closed, nothing answered
    line = wait_for_log(rf"INFO connection (\d+) from 127\.0\.0\.1:{here[1]}: (.*)", log_path, proc)
    assert line.group(2) == REFUSED, line.group(0)

    # The Unix domain socket beside it is guarded alike.
    with socket.socket(socket.AF_UNIX) as unix:
        unix.settimeout(GUARD_S)
        unix.connect(str(tmp_path / f"mongodb-{port}.sock"))
        unix.sendall(_hello_message())
        assert unix.recv(1024) == b""
    wait_for_log(rf"INFO connection \d+ from anonymous unix socket:{port}: {re.escape(REFUSED)}",
              log_path, proc)

    # A driver without tls=true: each of its connection attempts, one line each.
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True,
                             serverSelectionTimeoutMS=2000) as plain:
        with pytest.raises(ServerSelectionTimeoutError):
            plain.admin.command("ping")
    with pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", directConnection=True, tls=True,
                             tlsCAFile=str(tmp_path / "ca.pem"),
                             serverSelectionTimeoutMS=20_000) as client:
        assert client.admin.command("ping")["ok"] == 1.0  # TLS still served
    pattern = rf"INFO connection (\d+) from (.+?): {re.escape(REFUSED)}"
    deadline = time.monotonic() + GUARD_S
    while len(refused := re.findall(pattern, text := log_path.read_text())) < 3:
        assert time.monotonic() < deadline, text  # the driver's attempts: logged as they end
        time.sleep(0.02)
    assert len({conn for conn, _peer in refused}) == len(refused), text  # once per connection
    assert re.search(r"INFO connection \d+ accepted from 127\.0\.0\.1:", text), text
