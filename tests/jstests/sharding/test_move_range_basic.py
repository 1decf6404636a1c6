"""Translated from mongodb/mongo `jstests/sharding/move_range_basic.js` @
097b089f0211ac44246d558a57ae017195bbfebe, its `test()`'s first part, for `{a: 1}`,
`{a: 1, b: 1}` and `{a: "hashed"}`: `moveRange` with a bound that is not a shard key is 72
InvalidOptions, to a shard that does not exist 70 ShardNotFound; it moves a whole chunk given
both bounds, only `min`, or only `max` (a chunk too small to split: a `moveChunk`), each from a
fresh cluster here (the jstest moves one chunk back and forth).

Left out: its big chunks (`chunkSize: 1` MB and 20 MB of documents, so that `moveRange` with
one bound splits the chunk it moves: the embedded cluster splits by bounds, not by size); its
case on an unsplittable collection (`createUnsplittableCollection`, a test-only command); its
8.3-only case (11089203). Its `config.chunks.countDocuments` are `find`s here, but for
`test_config_chunks_count_documents`, which counts as the jstest does."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

DB = "db"


KEYS = pytest.mark.parametrize(("coll_name", "key"), [
    ("nonHashedShardKey", {"a": 1}), ("nonHashedCompundShardKey", {"a": 1, "b": 1}),
    ("hashedShardKey", {"a": "hashed"})], ids=["range", "compound", "hashed"])


def _setup(st, coll_name: str, key: dict) -> tuple[str, dict]:
    s = st.s
    s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    ns = f"{DB}.{coll_name}"
    s.admin.command("shardCollection", ns, key=key)
    uuid = s.config.collections.find_one({"_id": ns})["uuid"]
    chunk = s.config.chunks.find_one({"uuid": uuid, "shard": st.shard0})
    assert chunk
    return ns, chunk


@KEYS
def test_move_range_invalid_bound(st, coll_name, key):
    ns, chunk = _setup(st, coll_name, key)
    with pytest.raises(OperationFailure) as err:
        st.s.admin.command({"moveRange": ns, "min": chunk["min"],
                            "max": {"invalidShardKey": 10}, "toShard": st.shard1})
    assert err.value.code == 72, err.value.details


@KEYS
def test_move_range_unknown_shard(st, coll_name, key):
    ns, chunk = _setup(st, coll_name, key)
    with pytest.raises(OperationFailure) as err:
        st.s.admin.command({"moveRange": ns, "min": chunk["min"], "max": chunk["max"],
                            "toShard": "WrongShard"})
    assert err.value.code == 70, err.value.details


def _on(st, chunk: dict, shard: str) -> int:
    """`config.chunks.countDocuments({_id, shard})`, as a `find` (see CONFIG_COUNT)."""
    return len(list(st.s.config.chunks.find({"_id": chunk["_id"], "shard": shard})))


def test_config_chunks_count_documents(st):
    ns, chunk = _setup(st, "nonHashedShardKey", {"a": 1})
    assert st.s.config.chunks.count_documents({"_id": chunk["_id"], "shard": st.shard0}) == 1


@pytest.mark.parametrize(("coll_name", "key"), [
    pytest.param("nonHashedShardKey", {"a": 1}),
    pytest.param("nonHashedCompundShardKey", {"a": 1, "b": 1}),
    ("hashedShardKey", {"a": "hashed"})], ids=["range", "compound", "hashed"])
def test_move_range_with_both_bounds(st, coll_name, key):
    """(For the hashed key, shard0's chunk ends at 0, not at MaxKey.)"""
    ns, chunk = _setup(st, coll_name, key)
    st.s.admin.command({"moveRange": ns, "min": chunk["min"], "max": chunk["max"],
                        "toShard": st.shard1})
    assert (_on(st, chunk, st.shard0), _on(st, chunk, st.shard1)) == (0, 1)
    uuid = st.s.config.collections.find_one({"_id": ns})["uuid"]
    chunks = list(st.s.config.chunks.find({"uuid": uuid}))
    assert len(chunks) == (2 if "hashed" in key.values() else 1), chunks


@KEYS
def test_move_range_with_min_only(st, coll_name, key):
    """The jstest moves the chunk back with only `min` after its both-bounds move; here it
    moves from shard0, the chunk's own min given."""
    ns, chunk = _setup(st, coll_name, key)
    st.s.admin.command({"moveRange": ns, "min": chunk["min"], "toShard": st.shard1})
    assert (_on(st, chunk, st.shard0), _on(st, chunk, st.shard1)) == (0, 1)


@KEYS
def test_move_range_with_max_only(st, coll_name, key):
    ns, chunk = _setup(st, coll_name, key)
    st.s.admin.command({"moveRange": ns, "max": chunk["max"], "toShard": st.shard1})
    assert (_on(st, chunk, st.shard0), _on(st, chunk, st.shard1)) == (0, 1)
