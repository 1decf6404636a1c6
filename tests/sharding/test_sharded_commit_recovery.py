"""The router keeps a transaction's commit decision (mongos's transaction_router.cpp): every
reply in a transaction carries a `recoveryToken` (its recovery shard: the first participant
that wrote); a retried commitTransaction is answered with the outcome, on the router that ran
the transaction and on one that never saw it (another router, or this one restarted), which
asks the recovery shard. Before, the front forgot a transaction's participants at its first
commit and sent a retry to the first shard: 251 NoSuchTransaction with
TransientTransactionError for a transaction that had committed, so `with_transaction` ran its
callback a second time."""

from __future__ import annotations

import socket
import struct
import uuid
from typing import Any

import bson
import pymongo
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.son import SON

from cdcserver.sharding.testing import ShardedServer

OP_MSG = 2013


def raw(port: int, cmd: SON) -> dict[str, Any]:
    """One OP_MSG, as a driver sends it, and its reply (field order kept)."""
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(cmd)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(payload), 1, 0, OP_MSG) + payload)
        data = b""
        while len(data) < 16 or len(data) < struct.unpack_from("<i", data)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "the connection closed"
            data += chunk
    return bson.decode(data[21:], codec_options=bson.CodecOptions(document_class=SON))


def in_txn(name: str, target: Any, lsid: dict[str, Any], number: int, db: str,
           **fields: Any) -> SON:
    cmd = SON([(name, target)])
    cmd.update(fields)
    cmd.update({"lsid": lsid, "txnNumber": Int64(number), "autocommit": False, "$db": db})
    return cmd


def _split(client: pymongo.MongoClient, ns: str) -> None:
    """x < 100 on shard0, x >= 100 on shard1."""
    client.admin.command("enableSharding", ns.split(".")[0], primaryShard="shard0")
    client.admin.command("shardCollection", ns, key={"x": 1})
    client.admin.command("split", ns, middle={"x": 100})
    client.admin.command("moveChunk", ns, find={"x": 100}, to="shard1")


def _lsid() -> dict[str, Any]:
    return {"id": Binary(uuid.uuid4().bytes, 4)}


def test_replies_in_a_transaction_carry_the_recovery_token_after_ok():
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as client:
        _split(client, "t.c")
        lsid = _lsid()
        found = raw(server.port, in_txn("find", "c", lsid, 1, "t", filter={"x": 150},
                                        startTransaction=True))
        assert found["ok"] == 1.0
        keys = list(found)
        assert keys[keys.index("ok") + 1] == "recoveryToken"
        assert found["recoveryToken"] == {}  # only read so far: nothing to recover
        inserted = raw(server.port, in_txn("insert", "c", lsid, 1, "t",
                                           documents=[{"_id": 1, "x": 150}]))
        assert inserted["n"] == 1
        assert inserted["recoveryToken"] == {"recoveryShardId": "shard1"}
        more = raw(server.port, in_txn("insert", "c", lsid, 1, "t",
                                       documents=[{"_id": 2, "x": 1}]))
        # the first participant that wrote stays the recovery shard
        assert more["recoveryToken"] == {"recoveryShardId": "shard1"}
        committed = raw(server.port, in_txn("commitTransaction", 1, lsid, 1, "admin"))
        assert committed["ok"] == 1.0
        assert committed["recoveryToken"] == {"recoveryShardId": "shard1"}


@pytest.mark.parametrize("shards_written", [["shard1"], ["shard0", "shard1"]])
def test_a_retried_commit_is_answered_with_the_outcome(shards_written):
    """The same router, the commit sent twice (its first reply lost): ok both times, the
    documents once."""
    xs = {"shard0": 1, "shard1": 150}
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as client:
        _split(client, "t.c")
        lsid = _lsid()
        docs = [{"_id": i, "x": xs[name]} for i, name in enumerate(shards_written)]
        first = raw(server.port, in_txn("insert", "c", lsid, 1, "t", documents=docs[:1],
                                        startTransaction=True))
        assert first["ok"] == 1.0, first
        for doc in docs[1:]:
            assert raw(server.port, in_txn("insert", "c", lsid, 1, "t",
                                           documents=[doc]))["ok"] == 1.0
        for _ in range(2):
            reply = raw(server.port, in_txn("commitTransaction", 1, lsid, 1, "admin"))
            assert reply["ok"] == 1.0, reply
        assert sorted(d["_id"] for d in client.t.c.find()) == list(range(len(docs)))


def test_with_transaction_retrying_its_commit_applies_the_callback_once():
    """pymongo's with_transaction retries a commit whose outcome it does not know; the
    commit had been applied."""
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri, retryWrites=True) as client:
        _split(client, "t.c")
        runs = []

        def callback(session: Any) -> None:
            runs.append(1)
            client.t.c.insert_one({"_id": len(runs), "x": 150}, session=session)

        # The commit is applied, its reply says the write concern failed (91): pymongo
        # retries the commit (UnknownTransactionCommitResult).
        client.admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                             data={"failCommands": ["commitTransaction"],
                                   "writeConcernError": {"code": 91, "errmsg": "shutdown"}})
        with client.start_session() as session:
            session.with_transaction(callback)
        assert len(runs) == 1
        assert [d["_id"] for d in client.t.c.find()] == [1]


def test_a_router_that_never_ran_the_transaction_asks_the_recovery_shard(tmp_path):
    """The router restarts (its transactions' state is in memory, as mongos's); the shards'
    outcomes are durable. A commit with the recoveryToken is answered by the recovery shard:
    ok for one that committed, 251 for one that never did; without a token, 50940; an empty
    token (a transaction that only read), 251."""
    with ShardedServer(2, data_dir=tmp_path) as server, \
            pymongo.MongoClient(server.uri) as client:
        _split(client, "t.c")
        done, open_ = _lsid(), _lsid()
        for lsid, docs in ((done, [{"_id": 1, "x": 150}, {"_id": 2, "x": 1}]),
                           (open_, [{"_id": 3, "x": 151}])):
            assert raw(server.port, in_txn("insert", "c", lsid, 4, "t", documents=docs[:1],
                                           startTransaction=True))["ok"] == 1.0
            for doc in docs[1:]:
                assert raw(server.port, in_txn("insert", "c", lsid, 4, "t",
                                               documents=[doc]))["ok"] == 1.0
        token = raw(server.port, in_txn("find", "c", done, 4, "t"))["recoveryToken"]
        assert token == {"recoveryShardId": "shard1"}
        assert raw(server.port, in_txn("commitTransaction", 1, done, 4, "admin"))["ok"] == 1.0
    with ShardedServer(2, data_dir=tmp_path) as server, \
            pymongo.MongoClient(server.uri) as client:
        reply = raw(server.port, in_txn("commitTransaction", 1, done, 4, "admin",
                                        recoveryToken=token))
        assert reply["ok"] == 1.0, reply
        assert reply["recoveryToken"] == {}  # (this router has no recovery shard of its own)
        lost = raw(server.port, in_txn("commitTransaction", 1, open_, 4, "admin",
                                       recoveryToken={"recoveryShardId": "shard1"}))
        assert (lost["ok"], lost["code"]) == (0.0, 251), lost
        assert lost["errorLabels"] == ["TransientTransactionError"]
        no_token = raw(server.port, in_txn("commitTransaction", 1, _lsid(), 1, "admin"))
        assert (no_token["code"], no_token["errmsg"]) == (
            50940, "Cannot recover the transaction decision without a recoveryToken")
        empty = raw(server.port, in_txn("commitTransaction", 1, _lsid(), 1, "admin",
                                        recoveryToken={}))
        assert (empty["code"], empty["codeName"]) == (251, "NoSuchTransaction")
        assert sorted(d["_id"] for d in client.t.c.find()) == [1, 2]


def _owned_counts(server: ShardedServer, db: str, coll: str) -> list[int]:
    counts = []
    for uri in server.shard_uris:
        with pymongo.MongoClient(uri) as direct:
            counts.append(direct[db][coll].count_documents({}))
    return counts


def test_a_commit_after_its_data_moved_aborts_with_stale_config():
    """A transaction wrote on shard1, then its chunk moved to shard0 (another client): mongos
    aborts it at commit (its writes would land on a shard that no longer owns them)."""
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as client:
        _split(client, "t.c")
        with client.start_session() as session:
            session.start_transaction()
            client.t.c.insert_one({"_id": 1, "x": 150}, session=session)
            client.admin.command("moveChunk", "t.c", find={"x": 150}, to="shard0")
            with pytest.raises(pymongo.errors.OperationFailure) as failed:
                session.commit_transaction()
        assert failed.value.code == 13388
        assert failed.value.has_error_label("TransientTransactionError")
        assert "an error from cluster data placement change" in str(failed.value)
        assert client.t.c.count_documents({}) == 0
        assert _owned_counts(server, "t", "c") == [0, 0]  # no orphan on the old owner


def test_a_statement_after_its_data_moved_aborts_the_transaction():
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as client:
        _split(client, "t.c")
        client.t.c.insert_one({"_id": 1, "x": 150})
        with client.start_session() as session:
            session.start_transaction()
            assert client.t.c.find_one({"x": 150}, session=session) is not None
            client.admin.command("moveChunk", "t.c", find={"x": 150}, to="shard0")
            with pytest.raises(pymongo.errors.OperationFailure) as failed:
                client.t.c.update_one({"x": 150}, {"$set": {"y": 1}}, session=session)
            assert failed.value.code == 13388
            assert failed.value.has_error_label("TransientTransactionError")
            session.abort_transaction()
        assert client.t.c.find_one({"x": 150}) == {"_id": 1, "x": 150}
        # a split alone moves nothing: a transaction goes on across it
        with client.start_session() as session:
            session.start_transaction()
            client.t.c.find_one({"x": 150}, session=session)
            client.admin.command("split", "t.c", middle={"x": 120})
            client.t.c.update_one({"x": 150}, {"$set": {"y": 2}}, session=session)
            session.commit_transaction()
        assert client.t.c.find_one({"x": 150})["y"] == 2
