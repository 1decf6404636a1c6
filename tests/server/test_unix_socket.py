"""The Unix domain socket mongod 8.0 listens on beside its TCP port (net.unixDomainSocket,
src/mongo/transport/asio/asio_transport_layer.cpp): `<prefix>/mongodb-<port>.sock`, prefix
/tmp and permissions 0700 by default, a stale file replaced at startup, the file removed at a
clean stop; `--nounixsocket`, `--unixSocketPrefix`, `--filePermissions`, and getCmdLineOpts's
`parsed` naming what differs from the defaults.

Every server here is a real `cdcserver serve` process on a free port; pymongo connects through
the socket file.
"""

from __future__ import annotations

import os
import pathlib
import socket
import stat
import subprocess
import sys
import urllib.parse

import pytest
from pymongo import MongoClient

from cdcserver.config import check_config
from cdcserver.testing import HOST, SubprocessServer

pytestmark = pytest.mark.skipif(not hasattr(os, "fchmod"), reason="no Unix domain sockets")


def _client(path: str, **options: object) -> MongoClient:
    uri = "mongodb://" + urllib.parse.quote(path, safe="")
    return MongoClient(uri, serverSelectionTimeoutMS=10_000, **options)


def test_default_socket_serves_commands_and_change_streams() -> None:
    with SubprocessServer() as server:
        path = f"/tmp/mongodb-{server.port}.sock"
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        # directConnection: every request goes through the socket (a replica-set client
        # would move to the host hello names, as with mongod).
        with _client(path, directConnection=True) as client:
            assert client.admin.command("whatsmyuri")["you"] == (
                f"anonymous unix socket:{server.port}"
            )
            coll = client.shop.orders
            with coll.watch() as stream:
                coll.insert_one({"_id": 1, "item": "pen"})
                event = stream.next()
            assert event["operationType"] == "insert"
            assert event["fullDocument"] == {"_id": 1, "item": "pen"}
            assert "shop" in client.list_database_names()
            parsed = client.admin.command("getCmdLineOpts")["parsed"]
            assert "unixDomainSocket" not in parsed["net"]  # all defaults, none given
        # PyMongo's own test_unix_socket: the URI as it writes it, a replica-set client.
        uri = "mongodb://%2Ftmp%2F" + f"mongodb-{server.port}.sock"
        with MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            assert client.shop.orders.find_one({"_id": 1}) == {"_id": 1, "item": "pen"}
            assert path in repr(client)
    assert not os.path.exists(path)  # removed at the clean stop


def test_nounixsocket_creates_none(tmp_path: pathlib.Path) -> None:
    with SubprocessServer(extra_args=["--nounixsocket", "--unixSocketPrefix", str(tmp_path)]) as s:
        assert list(tmp_path.iterdir()) == []
        with MongoClient(HOST, s.port, directConnection=True) as client:
            parsed = client.admin.command("getCmdLineOpts")["parsed"]
    assert parsed["net"]["unixDomainSocket"] == {"enabled": False, "pathPrefix": str(tmp_path)}
    assert not os.path.exists(f"/tmp/mongodb-{s.port}.sock")


def test_prefix_and_permissions(tmp_path: pathlib.Path) -> None:
    args = ["--unixSocketPrefix", str(tmp_path), "--filePermissions", "0660"]
    with SubprocessServer(extra_args=args) as server:
        path = tmp_path / f"mongodb-{server.port}.sock"
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        assert not os.path.exists(f"/tmp/mongodb-{server.port}.sock")
        with _client(str(path), directConnection=True) as client:
            client.t.c.insert_one({"_id": 1})
            assert client.t.c.count_documents({}) == 1
            parsed = client.admin.command("getCmdLineOpts")["parsed"]
        # mongod's filePermissions is an int (0660 read as octal); pathPrefix as given.
        assert parsed["net"]["unixDomainSocket"] == {
            "filePermissions": 0o660, "pathPrefix": str(tmp_path)}
    assert list(tmp_path.iterdir()) == []


def test_stale_socket_file_is_replaced(tmp_path: pathlib.Path) -> None:
    args = ["--unixSocketPrefix", str(tmp_path)]
    crashed = SubprocessServer(extra_args=args)
    port = crashed.port
    path = tmp_path / f"mongodb-{port}.sock"
    try:
        assert path.exists()
        crashed.kill()  # SIGKILL: no cleanup, the socket file stays, nobody listening on it
    finally:
        crashed.stop()
    assert stat.S_ISSOCK(path.stat().st_mode)
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(path))  # stale: a socket file nobody listens on
    with SubprocessServer(extra_args=[*args, "--port", str(port)]) as server:
        assert server.port == port
        with _client(str(path), directConnection=True) as client:
            assert client.admin.command("ping")["ok"] == 1.0
    assert not path.exists()


def test_file_in_the_way_is_replaced(tmp_path: pathlib.Path) -> None:
    # mongod unlinks whatever is at the path before binding (ENOENT alone is ignored).
    first = SubprocessServer(extra_args=["--unixSocketPrefix", str(tmp_path)])
    port = first.port
    first.stop()
    path = tmp_path / f"mongodb-{port}.sock"
    assert not path.exists()
    path.write_text("left over")
    with SubprocessServer(extra_args=["--unixSocketPrefix", str(tmp_path), "--port", str(port)]):
        assert stat.S_ISSOCK(path.stat().st_mode)
        with _client(str(path), directConnection=True) as client:
            assert client.admin.command("ping")["ok"] == 1.0
    assert not path.exists()


def test_socket_failure_fails_startup(tmp_path: pathlib.Path) -> None:
    # mongod fails startup when it cannot listen on the socket (setup returns the bind error).
    missing = tmp_path / "no-such-dir"
    done = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "serve", "--in-memory", "--host", HOST,
         "--port", "0", "--metrics-port", "0", "--unixSocketPrefix", str(missing)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 48, done.stderr
    assert "server.unix_socket: cannot listen on" in done.stderr
    assert str(missing) in done.stderr
    assert "listening on" not in done.stderr


def test_config_keys_are_checked() -> None:
    config, errors = check_config(None, env={
        "CDCSERVER_SERVER_UNIX_SOCKET_PERMISSIONS": "0800",
        "CDCSERVER_SERVER_UNIX_SOCKET_PREFIX": "",
    })
    assert config is not None
    assert any(e.startswith("server.unix_socket_permissions (from CDCSERVER_SERVER_UNIX_SOCKET_"
                            "PERMISSIONS): must be an octal file mode") for e in errors), errors
    assert any(e.startswith("server.unix_socket_prefix") for e in errors), errors
    config, errors = check_config(None, env={"CDCSERVER_SERVER_UNIX_SOCKET": "false",
                                             "CDCSERVER_SERVER_UNIX_SOCKET_PERMISSIONS": "0644"})
    assert errors == [] and config is not None
    assert config.server.unix_socket is False
    assert config.server.unix_socket_permissions == "0644"
