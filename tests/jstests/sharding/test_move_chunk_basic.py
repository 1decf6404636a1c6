"""Translated from mongodb/mongo `jstests/sharding/move_chunk_basic.js` @
07b11864b6c8a72ad5572c900529a18372d072c9: `moveChunk` fails for an invalid namespace, a
database that does not exist and an unsharded collection; on a hashed collection, for bounds
that are not shard keys and for `find` with `bounds`, and it moves a chunk by its bounds; on a
range-sharded one (`{a: 1}`, `{a: 1, b: 1}`), for a `find` that is not a shard key and a `to`
that does not exist, and it moves the chunk by `find`. The jstest finds a collection's chunks
in `config.chunks` by `_id: RegExp(ns)` (chunk ids were `ns-min` before 5.0); here by the
collection's `uuid`, as 8.0's chunks name their collection."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

DB = "db"


def _fails(s, command: dict) -> None:
    with pytest.raises(OperationFailure):
        s.admin.command(command)


def _chunks(s, ns: str) -> dict:
    return {"uuid": s.config.collections.find_one({"_id": ns})["uuid"]}


def _setup(st) -> None:
    s = st.s
    s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    _fails(s, {"moveChunk": "", "find": {"_id": 1}, "to": st.shard1})
    _fails(s, {"moveChunk": "a.b", "find": {"_id": 1}, "to": st.shard1})
    _fails(s, {"moveChunk": f"{DB}.xxx", "find": {"_id": 1}, "to": st.shard1})


def test_move_chunk_basic_hashed(st):
    s = st.s
    shard0, shard1 = st.shard0, st.shard1
    _setup(st)
    ns = f"{DB}.fooHashed"
    s.admin.command("shardCollection", ns, key={"_id": "hashed"})
    chunk = s.config.chunks.find_one({**_chunks(s, ns), "shard": shard0})
    assert chunk
    # `aChunk.min - 1` is NaN in the shell: a bound that is no shard key.
    _fails(s, {"moveChunk": ns, "bounds": [float("nan"), chunk["max"]], "to": shard1})
    _fails(s, {"moveChunk": ns, "bounds": [chunk["min"], float("nan")], "to": shard1})
    _fails(s, {"moveChunk": ns, "find": {"_id": 1}, "bounds": [chunk["min"], chunk["max"]],
               "to": shard1})
    s.admin.command({"moveChunk": ns, "bounds": [chunk["min"], chunk["max"]], "to": shard1})
    # `config.chunks.count(...)`, as a `find`: count on config.* through the front is
    # test_move_range_basic.py's strict xfail (test_config_chunks_count_documents).
    assert len(list(s.config.chunks.find({"_id": chunk["_id"], "shard": shard0}))) == 0
    assert len(list(s.config.chunks.find({"_id": chunk["_id"], "shard": shard1}))) == 1
    s[DB].fooHashed.drop()


@pytest.mark.parametrize("key", [{"a": 1}, {"a": 1, "b": 1}], ids=["a", "a_b"])
def test_move_chunk_basic_not_hashed(st, key):
    s = st.s
    shard0, shard1 = st.shard0, st.shard1
    _setup(st)
    ns = f"{DB}.foo"
    s.admin.command("shardCollection", ns, key=key)
    chunk_id = s.config.chunks.find_one({**_chunks(s, ns), "shard": shard0})["_id"]
    _fails(s, {"moveChunk": ns, "find": {"xxx": 1}, "to": shard1})
    assert s.config.chunks.find_one({"_id": chunk_id})["shard"] == shard0
    s.admin.command({"moveChunk": ns, "find": key, "to": shard1})
    assert s.config.chunks.find_one({"_id": chunk_id})["shard"] == shard1
    _fails(s, {"moveChunk": ns, "find": key, "to": "WrongShard"})
    assert s.config.chunks.find_one({"_id": chunk_id})["shard"] == shard1
    s[DB].foo.drop()
