"""The merging half of an aggregation on a sharded collection runs on the router over the
shards' results (router/merge.py): `$group` / `$sort` across shards, a `$lookup` there reads
the cluster's collections (every shard's owned documents), and a final `$out` writes where
the target lives. Before, the merge ran on a scratch store of the front's: a `$lookup` there
found nothing and `$out` wrote into a database the front then dropped."""

from __future__ import annotations

import pymongo


def _spread(client: pymongo.MongoClient, ns: str) -> None:
    """x < 100 on shard0, x >= 100 on shard1."""
    db = ns.split(".")[0]
    client.admin.command("enableSharding", db, primaryShard="shard0")
    client.admin.command("shardCollection", ns, key={"x": 1})
    client.admin.command("split", ns, middle={"x": 100})
    client.admin.command("moveChunk", ns, find={"x": 100}, to="shard1")


def test_group_and_sort_merge_across_shards(client):
    _spread(client, "m1.c")
    client.m1.c.insert_many([{"x": x, "g": x % 3} for x in range(0, 200, 10)])
    got = list(client.m1.c.aggregate([
        {"$group": {"_id": "$g", "n": {"$sum": 1}, "top": {"$max": "$x"}}},
        {"$sort": {"_id": 1}},
    ]))
    assert got == [{"_id": 0, "n": 7, "top": 180}, {"_id": 1, "n": 7, "top": 190},
                   {"_id": 2, "n": 6, "top": 170}]


def test_lookup_in_the_merging_half_reads_every_shard(client):
    _spread(client, "m2.orders")
    _spread(client, "m2.items")
    client.m2.orders.insert_many([{"_id": i, "x": x} for i, x in enumerate([5, 150])])
    client.m2.items.insert_many([{"x": x, "order": i} for i, x in enumerate([7, 170])] +
                                [{"x": 180, "order": 0}])
    got = list(client.m2.orders.aggregate([
        {"$sort": {"_id": 1}},  # the merge starts here
        {"$lookup": {"from": "items", "localField": "_id", "foreignField": "order",
                     "as": "items"}},
        {"$project": {"xs": "$items.x"}},
    ]))
    assert [(d["_id"], sorted(d["xs"])) for d in got] == [(0, [7, 180]), (1, [170])]


def test_out_after_a_merge_writes_the_target(client):
    _spread(client, "m3.c")
    client.m3.c.insert_many([{"x": x, "g": x // 100} for x in (1, 2, 150, 160, 170)])
    reply = list(client.m3.c.aggregate([
        {"$group": {"_id": "$g", "n": {"$sum": 1}}}, {"$out": "counts"}]))
    assert reply == []
    assert sorted((d["_id"], d["n"]) for d in client.m3.counts.find()) == [(0, 2), (1, 3)]


def test_let_and_collation_reach_the_merging_half(client):
    _spread(client, "m4.c")
    client.m4.c.insert_many([{"x": 1, "s": "10"}, {"x": 150, "s": "9"}, {"x": 160, "s": "100"}])
    got = list(client.m4.c.aggregate(
        [{"$group": {"_id": "$s", "n": {"$sum": "$$one"}}}, {"$sort": {"_id": 1}}],
        let={"one": 1}, collation={"locale": "en", "numericOrdering": True}))
    # numericOrdering: "9" < "10" < "100" (binary order would put "9" last)
    assert [(d["_id"], d["n"]) for d in got] == [("9", 1), ("10", 1), ("100", 1)]
