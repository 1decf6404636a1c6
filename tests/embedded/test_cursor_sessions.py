"""getMore's session checks (cdcserver/commands/cursor_sessions.py): mongod refuses a getMore
in another session or transaction than its cursor's (getmore_cmd.cpp validateLSID /
validateTxnNumber, 50736-50741), mongos with its own codes (cluster_find.cpp, 50799-50804);
the cursor stays open after the refusal.

pymongo sends a session with every command, so a command without one goes over a raw socket.
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Iterator
from typing import Any

import bson
import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import EmbeddedServer

_IDS = itertools.count(1)


def _raw(port: int, cmd: dict[str, Any]) -> dict[str, Any]:
    """One OP_MSG command without the session pymongo would add; its reply."""
    payload = struct.pack("<i", 0) + b"\x00" + bson.encode(cmd)
    header = struct.pack("<iiii", 16 + len(payload), next(_IDS), 0, 2013)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(header + payload)
        size = struct.unpack("<i", _recv(sock, 4))[0]
        body = _recv(sock, size - 4)
    return bson.decode(body[12 + 5:])


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as s:
        c = s.client()
        c.test.c.insert_many([{"_id": i} for i in range(10)])
        c.close()
        yield s


@pytest.fixture(scope="module")
def client(server: EmbeddedServer) -> Iterator[pymongo.MongoClient]:
    with server.client() as c:
        yield c


def _open(db: Any, session: Any = None) -> int:
    return int(db.command("find", "c", batchSize=1, session=session)["cursor"]["id"])


def _get_more(db: Any, cid: int, session: Any = None) -> list[Any]:
    return list(db.command("getMore", Int64(cid), collection="c", batchSize=1,
                           session=session)["cursor"]["nextBatch"])


def _lsid_text(session: Any) -> str:
    return str(session.session_id["id"].as_uuid())


def test_another_session_is_refused_and_the_cursor_stays(client: pymongo.MongoClient) -> None:
    db = client.test
    with client.start_session() as a, client.start_session() as b:
        cid = _open(db, a)
        with pytest.raises(OperationFailure) as err:
            _get_more(db, cid, b)
        assert err.value.code == 50738
        msg = err.value.details["errmsg"]
        assert msg.startswith(f"Cannot run getMore on cursor {cid}, which was created in "
                              f"session {_lsid_text(a)} - ")
        assert f", in session {_lsid_text(b)} - " in msg
        assert _get_more(db, cid, a) == [{"_id": 1}]  # still open, not advanced


def test_cursor_opened_without_session(server: EmbeddedServer,
                                       client: pymongo.MongoClient) -> None:
    reply = _raw(server.port, {"find": "c", "batchSize": 1, "$db": "test"})
    cid = int(reply["cursor"]["id"])
    with client.start_session() as s:
        with pytest.raises(OperationFailure) as err:
            _get_more(client.test, cid, s)
        assert err.value.code == 50736
        assert err.value.details["errmsg"].startswith(
            f"Cannot run getMore on cursor {cid}, which was not created in a session, in "
            f"session {_lsid_text(s)} - ")
    more = _raw(server.port, {"getMore": Int64(cid), "collection": "c", "batchSize": 1,
                              "$db": "test"})
    assert more["ok"] == 1.0 and more["cursor"]["nextBatch"] == [{"_id": 1}]


def test_getmore_without_lsid(server: EmbeddedServer, client: pymongo.MongoClient) -> None:
    with client.start_session() as s:
        cid = _open(client.test, s)
        reply = _raw(server.port, {"getMore": Int64(cid), "collection": "c", "$db": "test"})
        assert reply["ok"] == 0.0 and reply["code"] == 50737
        assert reply["errmsg"].startswith(
            f"Cannot run getMore on cursor {cid}, which was created in session "
            f"{_lsid_text(s)} - ")
        assert reply["errmsg"].endswith(", without an lsid")
        assert _get_more(client.test, cid, s) == [{"_id": 1}]


def test_cursor_outside_transaction_read_in_one(client: pymongo.MongoClient) -> None:
    db = client.test
    with client.start_session() as s:
        cid = _open(db, s)
        s.start_transaction()
        db.command("find", "c", batchSize=1, session=s)  # the transaction's first statement
        with pytest.raises(OperationFailure) as err:
            _get_more(db, cid, s)
        number = s._transaction_id  # type: ignore[attr-defined]
        assert err.value.code == 50739
        assert err.value.details["errmsg"] == (
            f"Cannot run getMore on cursor {cid}, which was not created in a transaction, "
            f"in transaction {number}")
        s.abort_transaction()
        assert _get_more(db, cid, s) == [{"_id": 1}]


def test_transaction_cursor_in_another_transaction(server: EmbeddedServer,
                                                   client: pymongo.MongoClient) -> None:
    db = client.test
    with client.start_session() as s:
        s.start_transaction()
        cid = _open(db, s)
        first = s._transaction_id  # type: ignore[attr-defined]
        s.commit_transaction()
        s.start_transaction()
        db.command("find", "c", batchSize=1, session=s)
        with pytest.raises(OperationFailure) as err:
            _get_more(db, cid, s)
        assert err.value.code == 50741
        assert err.value.details["errmsg"] == (
            f"Cannot run getMore on cursor {cid}, which was created in transaction {first}, "
            f"in transaction {first + 1}")
        s.abort_transaction()
        with pytest.raises(OperationFailure) as err:
            _get_more(db, cid, s)
        assert err.value.code == 50740
        assert err.value.details["errmsg"] == (
            f"Cannot run getMore on cursor {cid}, which was created in transaction {first}, "
            f"without a txnNumber")


@pytest.fixture(scope="module")
def front() -> Iterator[ShardedServer]:
    with ShardedServer(2) as cluster:
        with pymongo.MongoClient(cluster.uri) as c:
            c.test.c.insert_many([{"_id": i} for i in range(10)])
        yield cluster


def test_front_refuses_with_mongos_codes(front: ShardedServer) -> None:
    with pymongo.MongoClient(front.uri) as c:
        db = c.test
        with c.start_session() as a, c.start_session() as b:
            cid = _open(db, a)
            with pytest.raises(OperationFailure) as err:
                _get_more(db, cid, b)
            assert err.value.code == 50801
            assert err.value.details["errmsg"].startswith(
                f"Cannot run getMore on cursor {cid}, which was created in session "
                f"{_lsid_text(a)} - ")
            reply = _raw(front.port, {"getMore": Int64(cid), "collection": "c", "$db": "test"})
            assert reply["code"] == 50800
            assert _get_more(db, cid, a) == [{"_id": 1}]


def test_front_sharded_find_reads_its_shards_in_the_session(front: ShardedServer) -> None:
    with pymongo.MongoClient(front.uri) as c:
        c.admin.command("enableSharding", "test")
        c.admin.command("shardCollection", "test.s", key={"_id": 1})
        c.test.s.insert_many([{"_id": i} for i in range(300)])
        with c.start_session() as s:
            assert len(list(c.test.s.find({}, session=s).batch_size(7))) == 300
        reply = _raw(front.port, {"find": "s", "batchSize": 1, "$db": "test"})
        cid = int(reply["cursor"]["id"])
        with c.start_session() as s:
            with pytest.raises(OperationFailure) as err:
                c.test.command("getMore", Int64(cid), collection="s", session=s)
        assert err.value.code == 50799
