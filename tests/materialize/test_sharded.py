"""Images from the copy through a sharded cluster: the sidecar of a mongos front (the embedded
cluster, `serve --shards 2`) keeps a copy per shard; each shard's copy answers the images of
that shard's writes. As in test_images.py: on a collection with images enabled the sidecar's
merged events are the front's byte for byte; on one without, the front's events with the
images the front gave for the same writes on the enabled twin. Documents move between shards
(a chunk migration, an update that changes the shard key) in between, and are then
written on the shard they moved to; a cross-shard transaction (prepared, then committed on
each shard) is among the writes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from cdcserver.sharding.testing import ShardedServer
from tests.materialize.support import MaterializedShardedSidecar
from tests.materialize.test_images import IMAGES, series, with_images_of


def until_end(stream: Any) -> list[Any]:
    events = []
    while not events or events[-1]["documentKey"]["_id"] != "end":
        events.append(stream.next())
    return events[:-1]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with ShardedServer(2) as cluster:
        client = MongoClient(cluster.uri, document_class=RawBSONDocument)
        shards = [s.name for s in cluster.cluster.shards]
        client.admin.command("enableSharding", "shop", primaryShard=shards[0])
        for name, images in (("on", True), ("off", False)):
            client.shop.create_collection(name, changeStreamPreAndPostImages={"enabled": images})
            client.admin.command("shardCollection", f"shop.{name}", key={"x": 1})
            client.admin.command("split", f"shop.{name}", middle={"x": 100})
            client.admin.command("moveChunk", f"shop.{name}", find={"x": 100}, to=shards[1])
            client.shop[name].insert_many([{"_id": i, "x": 60 * i, "n": 0} for i in range(4)])
        side = MaterializedShardedSidecar(cluster.uri, str(tmp_path_factory.mktemp("b")),
                                          ["shop.*"], majority_poll_ms=1.0)
        try:
            side.wait_applied()
            with client.watch(**IMAGES) as front, MongoClient(
                    side.uri, document_class=RawBSONDocument).watch(**IMAGES) as through:
                for name in ("on", "off"):
                    c = client.shop[name]
                    c.update_many({}, {"$inc": {"n": 1}, "$push": {"h": 1}})
                    c.update_one({"_id": 1}, {"$set": {"x": 150}})  # moves to the other shard
                    c.update_one({"_id": 1}, {"$set": {"moved": True}})
                    # a cross-shard transaction (prepared on both, then committed)
                    with client.start_session() as session:
                        session.with_transaction(lambda s, c=c: (
                            c.update_one({"_id": 0}, {"$inc": {"n": 10}}, session=s),
                            c.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=s)))
                    # a chunk migration: _id 0 now on the other shard (its copy got the
                    # migration's fromMigrate insert), then updated there
                    client.admin.command("moveChunk", f"shop.{name}", find={"x": 0},
                                         to=shards[1])
                    c.update_one({"_id": 0}, {"$set": {"migrated": True}})
                    c.replace_one({"_id": 2}, {"x": 120, "r": 1})
                    c.delete_one({"_id": 3})
                client.shop.on.insert_one({"_id": "end", "x": 0})
                front_events, side_events = until_end(front), until_end(through)
            yield {"front": front_events, "side": side_events, "side_server": side,
                   "front_uri": cluster.uri}
        finally:
            side.stop()
            client.close()


def test_images_on_an_enabled_collection_are_the_fronts(world):
    front = series(world["front"], ("on",))
    side = series(world["side"], ("on",))
    assert any(e.get("fullDocumentBeforeChange") is not None for e in front)
    assert [e.raw for e in side] == [e.raw for e in front]


def test_images_on_a_disabled_collection_come_from_each_shards_copy(world):
    on, off = series(world["front"], ("on",)), series(world["front"], ("off",))
    side = series(world["side"], ("off",))
    assert len(on) == len(off) == len(side)
    assert all(e.get("fullDocumentBeforeChange") is None for e in off)
    assert [e.raw for e in side] == [with_images_of(x, y) for x, y in zip(off, on)]
    served = world["side_server"].call(
        lambda: [c.images_served for c in world["side_server"].upstream.copies.values()])
    assert all(n > 0 for n in served), served  # both shards' copies answered


def test_server_status_and_metrics_show_each_shards_copy(world):
    from prometheus_client.parser import text_string_to_metric_families

    from cdcserver.metrics import Metrics

    side = world["side_server"]
    with MongoClient(side.uri) as client:
        reply = client.admin.command("serverStatus")
    assert reply["process"] == "mongos"  # the mongos's own, with the copies added
    keys = list(reply)
    assert keys.index("localTime") < keys.index("materialized") < keys.index("ok")
    section = reply["materialized"]["shards"]
    names = side.call(lambda: sorted(side.upstream.copies))
    assert sorted(section) == names and len(names) == 2
    for name in names:
        assert section[name]["state"] == "ready"
        assert section[name]["imagesServed"] > 0
        assert section[name]["versions"] > 0
    text = side.call(lambda: Metrics(side.state).exposition()).decode()
    served = {s.labels["shard"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "cdcserver_materialized_images_served_total"}
    assert served == {name: float(section[name]["imagesServed"]) for name in names}


def test_snapshot_reads_merge_the_shards_copies(world):
    """find / aggregate / distinct at readConcern snapshot through the sidecar read the
    shards' copies merged as the mongos merges its shards' results: each document once
    (migrated ones too: orphans, the donor's range deletion), sort / skip / limit across
    shards; a later read at the first read's time sees that time."""
    from pymongo.read_concern import ReadConcern

    side = world["side_server"]
    side.wait_applied()
    with MongoClient(side.uri) as through, MongoClient(world["front_uri"]) as front:
        rc = {"level": "snapshot"}
        first = through.shop.command({"find": "off", "readConcern": rc})
        at = first["cursor"]["atClusterTime"]
        assert first["operationTime"] == at
        mine = sorted(first["cursor"]["firstBatch"], key=lambda d: d["_id"])
        theirs = list(front.shop.off.find({}).sort("_id", 1))
        assert mine == theirs and len(theirs) == 3
        # sort, skip, limit across shards, as the mongos merges them
        for fields in ({"sort": {"x": -1}, "skip": 1, "limit": 2},
                       {"sort": {"n": 1, "_id": -1}, "limit": 2},
                       {"filter": {"x": {"$gte": 100}}, "sort": {"_id": 1}}):
            got = through.shop.command({"find": "off", "readConcern": rc, **fields})
            want = front.shop.command({"find": "off", **fields})
            assert got["cursor"]["firstBatch"] == want["cursor"]["firstBatch"], fields
        pipeline = [{"$group": {"_id": None, "n": {"$sum": "$n"}, "c": {"$sum": 1}}}]
        got = through.shop.command({"aggregate": "off", "pipeline": pipeline, "cursor": {},
                                    "readConcern": rc})
        assert got["cursor"]["firstBatch"] == list(front.shop.off.aggregate(pipeline))
        values = through.shop.command({"distinct": "off", "key": "x", "readConcern": rc})
        assert sorted(values["values"]) == sorted(front.shop.off.distinct("x"))
        # a write after `at`, on one shard: the read at `at` does not see it, a new one does
        with front.start_session() as session:
            front.shop.off.insert_one({"_id": "late", "x": 500, "n": 0}, session=session)
            written = session.operation_time
            gossip = session.cluster_time
        again = through.shop.command(
            {"find": "off", "readConcern": {"level": "snapshot", "atClusterTime": at}})
        assert sorted(again["cursor"]["firstBatch"], key=lambda d: d["_id"]) == mine
        # at the write's time (on one shard; the other, idle, promises that time)
        with through.start_session() as session:
            session.advance_cluster_time(gossip)  # the front's time, as a driver gossips it
            later = through.shop.command(
                {"find": "off", "filter": {"_id": "late"},
                 "readConcern": {"level": "snapshot", "atClusterTime": written}},
                session=session)
        assert later["cursor"]["firstBatch"] == [{"_id": "late", "x": 500, "n": 0}]
        side.wait_applied()
        # without a time: the latest time all the copies can be read at
        latest = list(through.shop.get_collection(
            "off", read_concern=ReadConcern("snapshot")).find({"_id": "late"}))
        assert latest == [{"_id": "late", "x": 500, "n": 0}]
        front.shop.off.delete_one({"_id": "late"})


def test_a_snapshot_before_a_migration_reads_each_document_once(world):
    """A chunk moved after T: the read at T has each document once, as it was at T (the
    donor's version; the recipient's clone and the donor's range deletion come after); a read
    after it has each once too, as the recipient holds it."""
    side = world["side_server"]
    with MongoClient(side.uri) as through, MongoClient(world["front_uri"]) as front:
        coll = front.shop.off  # on both shards since the fixture (a new collection's first
        # migration: see the report on the embedded recipient's create entry)
        uuid = front.config.collections.find_one({"_id": "shop.off"})["uuid"]
        with front.start_session() as session:
            coll.update_many({}, {"$inc": {"v": 1}}, session=session)
            before = session.operation_time
            gossip = session.cluster_time
        then = list(coll.find({}).sort("_id", 1))
        chunk = front.config.chunks.find_one({"uuid": uuid, "min": {"x": 100}})
        shards = [s["_id"] for s in front.admin.command("listShards")["shards"]]
        away = next(s for s in shards if s != chunk["shard"])
        front.admin.command("moveChunk", "shop.off", find={"x": 100}, to=away,
                            _waitForDelete=True)
        with front.start_session() as session:  # a time after the donor's range deletion
            front.shop.marker.insert_one({}, session=session)
            moved = session.operation_time
        with front.start_session() as session:
            coll.update_many({}, {"$inc": {"v": 1}}, session=session)
            after = session.operation_time
            gossip = session.cluster_time
        now = list(coll.find({}).sort("_id", 1))
        assert [d["_id"] for d in now] == [d["_id"] for d in then] and now != then

        def read(at):
            with through.start_session() as s:
                s.advance_cluster_time(gossip)
                reply = through.shop.command(
                    {"find": "off", "sort": {"_id": 1},
                     "readConcern": {"level": "snapshot", "atClusterTime": at}}, session=s)
            return reply["cursor"]["firstBatch"]

        assert read(before) == then
        assert read(moved) == then  # the donor's deletions are not the documents' end
        assert read(after) == now
