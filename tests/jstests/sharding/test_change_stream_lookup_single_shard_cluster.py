"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_lookup_single_shard_cluster.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011, on a one-shard cluster as the jstest: a collection
stream and a whole-db stream with `updateLookup` on a collection sharded on `_id` return the
updated document. Left out: its `explain` of the stream (`splitPipeline`, `mergeType:
"mongos"`): cdcserver has no explain of change streams."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from sharding_util import watch, watch_db

from cdcserver.sharding.testing import ShardedServer

NAME = "change_stream_lookup_single_shard_cluster"


@pytest.fixture
def s() -> Iterator[pymongo.MongoClient]:
    with ShardedServer(1) as server, pymongo.MongoClient(server.uri) as client:
        yield client


def test_change_stream_lookup_single_shard_cluster(s):
    db = s[NAME]
    coll = db[NAME]
    s.admin.command("enableSharding", NAME)
    s.admin.command("shardCollection", f"{NAME}.{NAME}", key={"_id": 1})
    coll.insert_one({"_id": 1})
    stream = watch(coll, fullDocument="updateLookup")
    whole_db = watch_db(db, fullDocument="updateLookup")
    coll.update_one({"_id": 1}, {"$set": {"updated": True}})
    assert stream.soon_next()["fullDocument"] == {"_id": 1, "updated": True}
    assert whole_db.soon_next()["fullDocument"] == {"_id": 1, "updated": True}
    stream.close()
    whole_db.close()
