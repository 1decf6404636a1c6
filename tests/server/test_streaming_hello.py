"""The streaming (awaitable, exhaust) hello, over a raw socket: what every Node.js client's
monitor (mongosh, Compass, Mongoose) and PyMongo's rely on.

mongod (replication_info.cpp, shouldParkHelloAwaitingTopologyChange; the SDAM spec's
server-monitoring "Streaming protocol"): `hello {topologyVersion, maxAwaitTimeMS}` answers at
once when the topologyVersion is another process's (or older), else after maxAwaitTimeMS (or a
topology change). Sent with OP_MSG's exhaustAllowed, the reply has moreToCome and the server
keeps answering on its own on that connection, each reply a response to the one before, until
the client closes it. mongos (cluster_hello_cmd.cpp) does the same with its own version.

Times here are hang guards only (socket timeouts); what is asserted is which reply comes, in
which order, with which flags.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.testing import HOST, ThreadServer, write_oplog

MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
HANG_GUARD_S = 20.0  # a socket timeout against a hang, never a performance expectation
# A stale version must be answered at once: a wait this long would trip the hang guard.
LONG_WAIT_MS = 60_000
SHORT_WAIT_MS = 50  # the wait of the replies that do wait (kept short: the suite's time)


def op_msg(request_id: int, body: dict[str, Any], flags: int = 0) -> bytes:
    payload = struct.pack("<I", flags) + b"\x00" + bson.encode(body)
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, 2013) + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def read_reply(sock: socket.socket) -> tuple[int, int, int, dict[str, Any]]:
    """(requestID, responseTo, flagBits, body) of the next OP_MSG."""
    length, request_id, response_to, op_code = struct.unpack("<iiii", _recv_exact(sock, 16))
    assert op_code == 2013
    rest = _recv_exact(sock, length - 16)
    flags = struct.unpack("<I", rest[:4])[0]
    return request_id, response_to, flags, bson.decode(rest[5:])


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=HANG_GUARD_S)
    sock.settimeout(HANG_GUARD_S)
    return sock


def hello(sock: socket.socket, request_id: int = 1, **fields: Any) -> dict[str, Any]:
    sock.sendall(op_msg(request_id, {"hello": 1, **fields, "$db": "admin"}))
    _, response_to, flags, body = read_reply(sock)
    assert response_to == request_id and not flags & MORE_TO_COME, (flags, body)
    return body


def current_version(port: int) -> dict[str, Any]:
    with connect(port) as sock:
        version = hello(sock)["topologyVersion"]
    assert isinstance(version["processId"], ObjectId) and version["counter"] == 0
    return version


# -- the modes --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from cdcserver.sharding.testing import ShardedServer

    server = ShardedServer(shards=2)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    path = write_oplog(tmp_path_factory.mktemp("streaming_hello") / "oplog.bson", [])
    with ThreadServer([path], follow=False) as server:
        yield server


def _upstream_sidecar(uri: str) -> ThreadServer:
    from cdcserver.deployments.upstream import UpstreamDeployment
    from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions

    options = UpstreamOptions(uri=uri)
    return ThreadServer(make_deployment=lambda: UpstreamDeployment(UpstreamOplog(options)))


MODES = ["embedded", "recorded", "upstream", "front", "shard", "sharded-sidecar"]


@pytest.fixture(scope="module", params=MODES)
def mode_port(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """(mode, port) of a server in each mode cdcserver serves."""
    mode = request.param
    if mode == "embedded":
        yield mode, request.getfixturevalue("server").port
    elif mode == "recorded":
        yield mode, request.getfixturevalue("recorded").port
    elif mode == "upstream":
        sidecar = _upstream_sidecar(request.getfixturevalue("server").direct_uri)
        try:
            yield mode, sidecar.port
        finally:
            sidecar.stop()
    elif mode == "front":
        yield mode, request.getfixturevalue("cluster").port
    elif mode == "shard":
        yield mode, request.getfixturevalue("cluster").cluster.shards[0].port
    else:
        from cdcserver.sharding.testing import ShardedSidecar

        sidecar = ShardedSidecar(request.getfixturevalue("cluster").uri)
        try:
            yield mode, sidecar.port
        finally:
            sidecar.stop()


def test_every_mode_streams_hello_under_exhaust(mode_port: tuple[str, int]) -> None:
    """A monitor's first request carries another process's version (or the one it saw
    before): the first reply comes at once, with moreToCome; the next ones come unasked, each
    after a wait with the version the reply before gave, each answering the reply before."""
    mode, port = mode_port
    ours = current_version(port)
    with connect(port) as sock:
        sock.sendall(op_msg(7, {
            "hello": 1, "topologyVersion": {"processId": ObjectId(), "counter": Int64(0)},
            "maxAwaitTimeMS": SHORT_WAIT_MS, "$db": "admin",
        }, flags=EXHAUST_ALLOWED))
        replies = [read_reply(sock) for _ in range(3)]
    assert replies[0][1] == 7
    for (before, *_), (_, response_to, _, _) in zip(replies, replies[1:], strict=False):
        assert response_to == before
    for _, _, flags, body in replies:
        assert body["ok"] == 1 and flags & MORE_TO_COME, (mode, flags, body)
        assert body["topologyVersion"] == ours
        assert ("msg" in body) == (mode in ("front", "sharded-sidecar"))


def test_stale_process_id_is_answered_at_once(server) -> None:
    """Another processId (a restarted server): answered at once, with this one's version. A
    wait of maxAwaitTimeMS here would trip the hang guard."""
    with connect(server.port) as sock:
        body = hello(sock, topologyVersion={"processId": ObjectId(), "counter": Int64(5)},
                     maxAwaitTimeMS=LONG_WAIT_MS)
    assert body["ok"] == 1 and body["isWritablePrimary"] is True
    assert body["topologyVersion"] == current_version(server.port)


def test_own_version_waits_and_streams_only_with_exhaust_allowed(server) -> None:
    """The server's own version: the reply waits (maxAwaitTimeMS) while requests on other
    connections are answered. Without exhaustAllowed it has no moreToCome and nothing else
    comes unasked (the next reply on the connection is the ping's); with exhaustAllowed each
    reply has moreToCome, and the next one comes without a request, answering the one
    before."""
    ours = current_version(server.port)
    with connect(server.port) as waiting, connect(server.port) as other:
        waiting.sendall(op_msg(3, {"hello": 1, "topologyVersion": ours,
                                   "maxAwaitTimeMS": 1_000, "$db": "admin"}))
        # Answered while the hello waits (it is not answered before its wait is over).
        assert hello(other, 4)["ok"] == 1
        waiting.setblocking(False)
        with pytest.raises(BlockingIOError):
            waiting.recv(1)  # nothing yet
        waiting.setblocking(True)
        waiting.settimeout(HANG_GUARD_S)
        _, response_to, flags, body = read_reply(waiting)
        assert response_to == 3 and flags == 0 and body["ok"] == 1
        assert body["topologyVersion"] == ours
        waiting.sendall(op_msg(5, {"ping": 1, "$db": "admin"}))
        assert read_reply(waiting)[1] == 5  # no unasked reply came before the ping's
    with connect(server.port) as sock:
        sock.sendall(op_msg(11, {"hello": 1, "topologyVersion": ours,
                                 "maxAwaitTimeMS": SHORT_WAIT_MS, "$db": "admin"},
                            flags=EXHAUST_ALLOWED))
        first = read_reply(sock)
        second = read_reply(sock)  # no request sent for it
    assert first[1] == 11 and second[1] == first[0]
    assert first[2] & MORE_TO_COME and second[2] & MORE_TO_COME
    assert first[3]["topologyVersion"] == second[3]["topologyVersion"] == ours


def _is_open(server: Any, connection_id: int) -> bool:
    """Whether the server still serves connection `connection_id` (hello's connectionId):
    its listener's own table, read on its loop (counts of open connections would also move
    with the other tests' connections that are still closing)."""
    return bool(server.call(lambda: connection_id in server.server._connections))


def test_exhaust_stream_ends_when_the_client_closes(server) -> None:
    """The client closes its monitor's connection during the stream's wait (maxAwaitTimeMS
    60 s): the server ends that connection at once (mongod's hello is killed on client
    disconnect), not when the wait is over."""
    ours = current_version(server.port)
    sock = connect(server.port)
    sock.sendall(op_msg(1, {
        "hello": 1, "topologyVersion": {"processId": ObjectId(), "counter": Int64(0)},
        "maxAwaitTimeMS": LONG_WAIT_MS, "$db": "admin",
    }, flags=EXHAUST_ALLOWED))
    _, _, flags, body = read_reply(sock)  # at once; the next one waits 60 s
    assert flags & MORE_TO_COME and body["topologyVersion"] == ours
    connection_id = int(body["connectionId"])
    assert _is_open(server, connection_id)
    sock.close()
    for _ in range(400):  # a hang guard of ~20 s: the wait itself would last 60 s
        if not _is_open(server, connection_id):
            break
        with connect(server.port) as probe:  # a pause of SHORT_WAIT_MS
            hello(probe, topologyVersion=ours, maxAwaitTimeMS=SHORT_WAIT_MS)
    assert not _is_open(server, connection_id)


def test_exhaust_without_max_await_fails_51756(server) -> None:
    with connect(server.port) as sock:
        sock.sendall(op_msg(2, {"hello": 1, "$db": "admin"}, flags=EXHAUST_ALLOWED))
        _, response_to, flags, body = read_reply(sock)
        assert response_to == 2 and flags == 0
        assert body["ok"] == 0 and body["code"] == 51756, body
        assert body["errmsg"] == (
            "An isMaster or hello request with exhaust must specify 'maxAwaitTimeMS'")
        assert hello(sock, 3)["ok"] == 1  # the connection goes on


@pytest.mark.parametrize(("fields", "code", "errmsg"), [
    ({"topologyVersion": "OURS"}, 31368,
     "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'"),
    ({"maxAwaitTimeMS": 10}, 31368,
     "A request with 'maxAwaitTimeMS' must include a 'topologyVersion'"),
    ({"topologyVersion": {"processId": "OURS", "counter": Int64(-1)}, "maxAwaitTimeMS": 10},
     31372, "topologyVersion must have a non-negative counter"),
    ({"topologyVersion": "OURS", "maxAwaitTimeMS": -1}, 51024,
     "BSON field 'maxAwaitTimeMS' value must be >= 0, actual value '-1'"),
    ({"topologyVersion": {"processId": "OURS"}, "maxAwaitTimeMS": 10}, 40414,
     "BSON field 'hello.topologyVersion.counter' is missing but a required field"),
    ({"topologyVersion": {"processId": "OURS", "counter": 0}, "maxAwaitTimeMS": 10}, 14,
     "BSON field 'hello.topologyVersion.counter' is the wrong type 'int', expected type "
     "'long'"),
    ({"topologyVersion": {"processId": "OURS", "counter": Int64(1)}, "maxAwaitTimeMS": 10},
     31382, "Received a topology version with counter: 1 which is greater than the server "
     "topology version counter: 0"),
])
def test_awaitable_arguments_errors(server, fields, code, errmsg) -> None:
    ours = current_version(server.port)
    resolved: dict[str, Any] = {}
    for key, value in fields.items():
        if value == "OURS":
            value = ours
        elif isinstance(value, dict) and value.get("processId") == "OURS":
            value = {**value, "processId": ours["processId"]}
        resolved[key] = value
    with connect(server.port) as sock:
        body = hello(sock, **resolved)
    assert (body["ok"], body.get("code"), body.get("errmsg")) == (0, code, errmsg), body


def test_front_counter_ahead_is_mongos_51761(cluster) -> None:
    ours = current_version(cluster.port)
    with connect(cluster.port) as sock:
        body = hello(sock, topologyVersion={**ours, "counter": Int64(3)}, maxAwaitTimeMS=10)
    assert body["ok"] == 0 and body["code"] == 51761
    assert body["errmsg"] == ("Received a topology version with counter: 3 which is greater "
                              "than the mongos topology version counter: 0")
