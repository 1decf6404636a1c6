"""Large transactions: mongod writes a transaction whose operations do not fit one applyOps
entry (16 MB, or maxNumberOfTransactionOperationsInSingleOplogEntry operations) as a chain of
entries linked by `prevOpTime`, all but the last with `partialTxn: true`, the last with
`count`; change streams see one transaction (one clusterTime, txnOpIndex running on across
the entries)."""

from __future__ import annotations

import asyncio

import bson
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo import AsyncMongoClient

from cdcserver.embedded.store import MAX_BSON, pack_transaction
from cdcserver.testing import EmbeddedServer
from pipeline_stages import resume_token as rt

TXN_ORDER = ["lsid", "txnNumber", "op", "ns", "o", "ts", "t", "v", "wall", "prevOpTime"]
NULL_OP_TIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}


def _drain(stream, n):
    got = []
    while len(got) < n:
        event = stream.try_next()
        if event is not None:
            got.append(event)
    return got


def _check_chain(chain, n_ops):
    """The entries of one transaction, as mongod writes a multi-entry one."""
    assert len(chain) > 1
    for k, entry in enumerate(chain):
        assert list(entry) == TXN_ORDER
        assert entry["op"] == "c" and entry["ns"] == "admin.$cmd"
        assert entry["lsid"] == chain[0]["lsid"] and entry["txnNumber"] == chain[0]["txnNumber"]
        assert entry["wall"] == chain[0]["wall"]
        expected_prev = NULL_OP_TIME if k == 0 else {"ts": chain[k - 1]["ts"], "t": Int64(1)}
        assert entry["prevOpTime"] == expected_prev
        if k < len(chain) - 1:
            assert list(entry["o"]) == ["applyOps", "partialTxn"]
            assert entry["o"]["partialTxn"] is True
        else:
            assert list(entry["o"]) == ["applyOps", "count"]
            assert entry["o"]["count"] == n_ops and isinstance(entry["o"]["count"], Int64)
    assert sum(len(e["o"]["applyOps"]) for e in chain) == n_ops


def test_operation_count_limit_chains_entries_and_events_continue_txn_op_index():
    with EmbeddedServer(txn_oplog_entry_ops=2) as server, server.client() as client:
        coll = client.big.c
        coll.insert_many([{"_id": i, "v": 0} for i in range(3)])
        start = len(server.entries())
        with coll.watch(max_await_time_ms=50) as stream:
            with client.start_session() as session:

                def body(s):
                    coll.insert_many([{"_id": 10}, {"_id": 11}], session=s)
                    coll.update_one({"_id": 0}, {"$set": {"v": 1}}, session=s)
                    coll.replace_one({"_id": 1}, {"r": 1}, session=s)
                    coll.delete_one({"_id": 2}, session=s)

                session.with_transaction(body)
                lsid = session.session_id
            events = _drain(stream, 5)
            coll.insert_one({"_id": "after"})
            [after] = _drain(stream, 1)
        chain = server.entries()[start:-1]
        _check_chain(chain, 5)
        assert [len(e["o"]["applyOps"]) for e in chain] == [2, 2, 1]
        assert [e["operationType"] for e in events] == [
            "insert", "insert", "update", "replace", "delete",
        ]
        assert all(e["clusterTime"] == chain[-1]["ts"] for e in events)
        assert all(e["wallTime"] == events[0]["wallTime"] for e in events)
        assert [rt.decode(e["_id"]).txn_op_index for e in events] == [0, 1, 2, 3, 4]
        assert all(list(e)[:3] == ["txnNumber", "lsid", "_id"] for e in events)
        assert all(e["lsid"]["id"] == lsid["id"] for e in events)
        assert "lsid" not in after and after["clusterTime"] > events[-1]["clusterTime"]

        # Resuming inside the transaction gives the rest of it, from the right entry on.
        for k in range(5):
            with coll.watch(resume_after=events[k]["_id"], max_await_time_ms=50) as stream:
                rest = _drain(stream, 5 - k)
            assert [r["_id"] for r in rest] == [e["_id"] for e in events[k + 1:]] + [after["_id"]]


def test_size_limit_chains_entries():
    with EmbeddedServer(txn_oplog_entry_bytes=2000) as server, server.client() as client:
        coll = client.big.s
        coll.insert_one({"_id": "seed"})
        start = len(server.entries())
        with coll.watch(max_await_time_ms=50) as stream, client.start_session() as session:
            session.with_transaction(lambda s: coll.insert_many(
                [{"_id": i, "pad": "x" * 700} for i in range(7)], session=s
            ))
            events = _drain(stream, 7)
        chain = server.entries()[start:]
        _check_chain(chain, 7)
        assert [len(e["o"]["applyOps"]) for e in chain] == [2, 2, 2, 1]
        assert [rt.decode(e["_id"]).txn_op_index for e in events] == list(range(7))
        assert [e["documentKey"]["_id"] for e in events] == list(range(7))


def test_sixteen_megabytes_by_default():
    """Three 6 MB documents: mongod's default 16 MB limit makes two entries."""
    with EmbeddedServer() as server, server.client() as client:
        coll = client.big.m
        coll.insert_one({"_id": "seed"})
        start = len(server.entries())
        big = "x" * (6 * 1024 * 1024)
        with coll.watch(max_await_time_ms=50) as stream, client.start_session() as session:
            session.with_transaction(lambda s: [
                coll.insert_one({"_id": i, "big": big}, session=s) for i in range(3)
            ])
            events = _drain(stream, 3)
        chain = server.entries()[start:]
        _check_chain(chain, 3)
        assert [len(e["o"]["applyOps"]) for e in chain] == [2, 1]
        assert all(len(bson.encode(e)) < MAX_BSON + 16 * 1024 for e in chain)
        assert [rt.decode(e["_id"]).txn_op_index for e in events] == [0, 1, 2]


def test_pre_and_post_images_of_a_chained_transaction():
    with EmbeddedServer(txn_oplog_entry_ops=2) as server, server.client() as client:
        db = client.big
        db.create_collection("img", changeStreamPreAndPostImages={"enabled": True})
        coll = db.img
        coll.insert_many([{"_id": i, "n": i} for i in range(4)])
        with coll.watch(full_document="required", full_document_before_change="required",
                        max_await_time_ms=50) as stream, client.start_session() as session:

            def body(s):
                for i in range(3):
                    coll.update_one({"_id": i}, {"$inc": {"n": 10}}, session=s)
                coll.delete_one({"_id": 3}, session=s)

            session.with_transaction(body)
            events = _drain(stream, 4)
        assert [e["fullDocumentBeforeChange"] for e in events] == [
            {"_id": i, "n": i} for i in range(4)
        ]
        assert [e.get("fullDocument") for e in events[:3]] == [
            {"_id": i, "n": i + 10} for i in range(3)
        ]
        # Each pre-image is keyed by the entry holding its operation and its index there.
        chain = [e for e in server.entries() if e["ns"] == "admin.$cmd"][-2:]
        keys = sorted(server.store.images._pre_images)
        assert len(keys) == 4
        assert [e["o"].get("partialTxn") for e in chain] == [True, None]


def test_async_client_with_transaction():
    async def main(uri):
        client = AsyncMongoClient(uri)
        try:
            coll = client.big.a
            await coll.insert_one({"_id": "seed"})
            async with await coll.watch(max_await_time_ms=50) as stream:
                async with client.start_session() as session:

                    async def body(s):
                        for i in range(5):
                            await coll.insert_one({"_id": i}, session=s)

                    await session.with_transaction(body)
                events = []
                while len(events) < 5:
                    event = await stream.try_next()
                    if event is not None:
                        events.append(event)
            return events
        finally:
            await client.close()

    with EmbeddedServer(txn_oplog_entry_ops=2) as server:
        events = asyncio.run(main(server.direct_uri))
        chain = [e for e in server.entries() if e["ns"] == "admin.$cmd"]
    _check_chain(chain, 5)
    assert [rt.decode(e["_id"]).txn_op_index for e in events] == list(range(5))
    assert len({e["clusterTime"] for e in events}) == 1


def test_chained_transaction_survives_a_restart(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data, txn_oplog_entry_ops=2) as server, server.client() as client:
        coll = client.big.d
        coll.insert_one({"_id": "seed"})
        with coll.watch(max_await_time_ms=50) as stream, client.start_session() as session:
            session.with_transaction(lambda s: coll.insert_many(
                [{"_id": i} for i in range(5)], session=s
            ))
            events = _drain(stream, 5)
        before = server.entries()
    with EmbeddedServer(data) as server, server.client() as client:
        assert server.entries() == before
        with client.big.d.watch(resume_after=events[1]["_id"], max_await_time_ms=50) as stream:
            rest = _drain(stream, 3)
        assert [e["_id"] for e in rest] == [e["_id"] for e in events[2:]]


@pytest.mark.parametrize(
    ("sizes", "max_ops", "max_bytes", "expected"),
    [
        ([10] * 5, 2, MAX_BSON, [2, 2, 1]),
        ([10] * 3, 10, MAX_BSON, [3]),
        ([5000, 10, 10], 10, 1000, [1, 2]),  # an operation too big alone still gets an entry
        ([300, 300, 300], 10, 1000, [2, 1]),
        ([300, 300, 300], 10, 900, [1, 1, 1]),
    ],
)
def test_pack_transaction(sizes, max_ops, max_bytes, expected):
    ops = [{"op": "i", "ns": "a.b", "o": {"_id": i, "p": "x" * n}, "o2": {"_id": i}}
           for i, n in enumerate(sizes)]
    chunks = pack_transaction(ops, max_ops, max_bytes)
    assert [len(c) for c in chunks] == expected
    assert [op for c in chunks for op in c] == ops
