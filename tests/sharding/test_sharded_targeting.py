"""Targeting of reads on a sharded collection by the front, as mongos's: a query's equality on
the shard key goes to the one shard owning that value, unless a non-simple collation compares
the value differently from the shard key index (`ChunkManager::findIntersectingChunk`), then
to every shard owning a chunk."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.collation import Collation

from cdcserver.sharding.testing import ShardedServer

CASE_INSENSITIVE = Collation(locale="en_US", strength=2)


def _split_by_case(client: pymongo.MongoClient, cluster: ShardedServer, ns: str) -> None:
    """Sharded on {k: 1}, split at "a": upper-case strings (they sort first, binary) on the
    first shard, lower-case ones on the second."""
    first, second = (s.name for s in cluster.cluster.shards[:2])
    db = ns.split(".", 1)[0]
    client.admin.command("enableSharding", db, primaryShard=first)
    client.admin.command("shardCollection", ns, key={"k": 1})
    client.admin.command("split", ns, middle={"k": "a"})
    client.admin.command("moveChunk", ns, find={"k": "a"}, to=second)


def _on_each_shard(cluster: ShardedServer, db: str, coll: str) -> list[list[str]]:
    out = []
    for uri in cluster.shard_uris:
        with pymongo.MongoClient(uri) as c:
            out.append(sorted(d["k"] for d in c[db][coll].find({}, {"_id": 0, "k": 1})))
    return out


def test_find_with_a_non_simple_collation_on_a_string_key_broadcasts(cluster, client):
    _split_by_case(client, cluster, "coll1.c")
    docs = [{"_id": i, "k": k} for i, k in enumerate(["a", "A", "b", "B", "a", "A", "c", "C"])]
    client.coll1.c.insert_many(docs)
    assert _on_each_shard(cluster, "coll1", "c") == [["A", "A", "B", "C"], ["a", "a", "b", "c"]]
    c = client.coll1.c
    found = sorted(d["k"] for d in c.find({"k": "a"}, collation=CASE_INSENSITIVE))
    assert found == ["A", "A", "a", "a"]  # 2 on each shard: targeted, it finds only 2
    found = sorted(d["k"] for d in c.find({"k": {"$eq": "B"}}, collation=CASE_INSENSITIVE))
    assert found == ["B", "b"]
    # The simple collation, given or not, compares binary: the one shard's documents.
    assert sorted(d["k"] for d in c.find({"k": "a"})) == ["a", "a"]
    assert sorted(d["k"] for d in c.find({"k": "a"}, collation=Collation("simple"))) == [
        "a", "a"]
    # count and distinct under the collation: every shard's matches.
    assert c.count_documents({"k": "a"}, collation=CASE_INSENSITIVE) == 4
    assert sorted(c.distinct("_id", {"k": "c"}, collation=CASE_INSENSITIVE)) == [6, 7]
    got = c.aggregate([{"$match": {"k": "b"}}, {"$group": {"_id": None, "n": {"$sum": 1}}}],
                      collation=CASE_INSENSITIVE)
    assert [d["n"] for d in got] == [2]


def test_find_with_a_non_simple_collation_on_a_hashed_key_broadcasts(cluster, client):
    """A hashed field's value may be a string's hash: no targeting by it under a collation."""
    first = cluster.cluster.shards[0].name
    client.admin.command("enableSharding", "coll2", primaryShard=first)
    client.admin.command("shardCollection", "coll2.c", key={"k": "hashed"})
    c = client.coll2.c
    c.insert_many([{"_id": i, "k": k} for i, k in enumerate(["x", "X", "y", "Y", "z", "Z"])])
    per_shard = _on_each_shard(cluster, "coll2", "c")
    assert all(per_shard), per_shard  # both shards hold some
    for k in ("x", "y", "z"):
        found = sorted(d["k"] for d in c.find({"k": k}, collation=CASE_INSENSITIVE))
        assert found == [k.upper(), k]


def test_numeric_key_under_a_collation_is_still_found(cluster, client):
    """Numbers compare alike under every collation: the targeted shard has them all."""
    first, second = (s.name for s in cluster.cluster.shards[:2])
    client.admin.command("enableSharding", "coll3", primaryShard=first)
    client.admin.command("shardCollection", "coll3.c", key={"n": 1})
    client.admin.command("split", "coll3.c", middle={"n": 10})
    client.admin.command("moveChunk", "coll3.c", find={"n": 10}, to=second)
    c = client.coll3.c
    c.insert_many([{"_id": i, "n": i, "s": "a" if i % 2 else "A"} for i in range(20)])
    got = list(c.find({"n": 15}, collation=CASE_INSENSITIVE))
    assert [d["_id"] for d in got] == [15]
    got = sorted(d["_id"] for d in c.find({"n": 3, "s": "a"}, collation=CASE_INSENSITIVE))
    assert got == [3]


def test_collection_default_collation_broadcasts_a_string_key(cluster, client):
    """No collation given: the collection's own default (non-simple) is the query's."""
    first, second = (s.name for s in cluster.cluster.shards[:2])
    client.admin.command("enableSharding", "coll4", primaryShard=first)
    client.coll4.create_collection("c", collation=CASE_INSENSITIVE)
    client.admin.command("shardCollection", "coll4.c", key={"k": 1},
                         collation={"locale": "simple"})
    client.admin.command("split", "coll4.c", middle={"k": "a"})
    client.admin.command("moveChunk", "coll4.c", find={"k": "a"}, to=second)
    c = client.coll4.c
    c.insert_many([{"_id": 1, "k": "a"}, {"_id": 2, "k": "A"}])
    assert sorted(d["_id"] for d in c.find({"k": "a"})) == [1, 2]
    assert [d["_id"] for d in c.find({"k": "a"}, collation=Collation("simple"))] == [1]


def _failing(cluster: ShardedServer, index: int, commands: list[str]):
    """Shard `index` fails these commands (failCommand, set on its own port) while inside."""
    import contextlib

    @contextlib.contextmanager
    def failing():
        with pymongo.MongoClient(cluster.shard_uris[index]) as shard:
            shard.admin.command("configureFailPoint", "failCommand", mode="alwaysOn",
                                data={"failCommands": commands, "errorCode": 2})
            try:
                yield
            finally:
                shard.admin.command("configureFailPoint", "failCommand", mode="off")

    return failing()


def test_count_distinct_aggregate_target_the_owning_shard(cluster, client):
    """An equality on the shard key (simple collation) reaches the one shard owning it, as
    mongos targets count, distinct and an aggregation's leading $match: the other shard
    failing every such command does not fail them; under a non-simple collation they go to
    both, and so fail."""
    _split_by_case(client, cluster, "coll5.c")
    c = client.coll5.c
    c.insert_many([{"_id": i, "k": k} for i, k in enumerate(["a", "A", "b", "B"])])
    with _failing(cluster, 0, ["count", "distinct", "aggregate", "find"]):
        assert c.count_documents({"k": "a"}) == 1
        assert client.coll5.command("count", "c", query={"k": "b"})["n"] == 1
        assert c.distinct("_id", {"k": "b"}) == [2]
        assert [d["_id"] for d in c.aggregate([{"$match": {"k": "a"}}])] == [0]
        assert [d["_id"] for d in c.find({"k": "a"})] == [0]
        for run in (lambda: c.count_documents({"k": "a"}, collation=CASE_INSENSITIVE),
                    lambda: c.distinct("_id", {"k": "b"}, collation=CASE_INSENSITIVE),
                    lambda: list(c.aggregate([{"$match": {"k": "a"}}],
                                             collation=CASE_INSENSITIVE)),
                    lambda: list(c.find({"k": "a"}, collation=CASE_INSENSITIVE))):
            with pytest.raises(pymongo.errors.OperationFailure) as err:
                run()
            assert err.value.code == 2
    assert c.count_documents({"k": "a"}, collation=CASE_INSENSITIVE) == 2
    assert sorted(c.distinct("_id", {"k": "b"}, collation=CASE_INSENSITIVE)) == [2, 3]


def test_writes_with_a_non_simple_collation_on_a_string_key_reach_every_shard(cluster, client):
    """update_many, delete_many and findAndModify under a case-insensitive collation: the
    documents it matches on both shards (targeted by the value, half were missed)."""
    _split_by_case(client, cluster, "coll_w.c")
    c = client.coll_w.c
    c.insert_many([{"_id": i, "k": k} for i, k in enumerate(["a", "A", "b", "B", "c", "C"])])
    result = c.update_many({"k": "a"}, {"$set": {"seen": True}}, collation=CASE_INSENSITIVE)
    assert result.modified_count == 2
    assert sorted(d["_id"] for d in c.find({"seen": True})) == [0, 1]
    result = c.delete_many({"k": "b"}, collation=CASE_INSENSITIVE)
    assert result.deleted_count == 2
    # findAndModify: the first shard holds "C", the second "c"; either is a match.
    found = c.find_one_and_update({"k": "C", "_id": 5}, {"$set": {"fam": 1}},
                                  collation=CASE_INSENSITIVE)
    assert found is not None and found["_id"] == 5
    found = c.find_one_and_update({"k": "C", "_id": 4}, {"$set": {"fam": 1}},
                                  collation=CASE_INSENSITIVE)
    assert found is not None and found["_id"] == 4
    assert sorted(d["_id"] for d in c.find({})) == [0, 1, 4, 5]
