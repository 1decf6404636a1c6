"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_shards_start_in_sync.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: a stream opened through a second mongos while that
mongos cannot reach shard1 (SERVER-31685) still returns, in order, an insert on shard0 and one
on shard1 written before shard1 was reachable again, then a third: the stream starts, on every
shard, at the time it was opened.

The second mongos is a sidecar of the front (`ShardedSidecar`, `serve --upstream`), and shard1
is cut off from it by closing shard1's listener while the stream is opened and the first two
inserts are written (`ShardedServer.restart_shard`; the front writes through its in-process
connection), where the jstest disconnects shard1 from that mongos with mongobridge and opens
the stream in a parallel shell, waiting for its cursors in `$currentOp` (left out)."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from cst import assert_change_stream_event_eq
from sharding_util import watch

from cdcserver.sharding.testing import ShardedSidecar

NAME = "change_streams_shards_start_in_sync"


@pytest.fixture
def s1(st) -> Iterator[pymongo.MongoClient]:
    with ShardedSidecar(st.server.uri) as sidecar, pymongo.MongoClient(sidecar.uri) as client:
        yield client


def _insert(id_: int) -> dict:
    return {"documentKey": {"_id": id_}, "fullDocument": {"_id": id_},
            "ns": {"db": NAME, "coll": NAME}, "operationType": "insert"}


def test_change_streams_shards_start_in_sync(st, s1):
    s0 = st.s
    coll = s0[NAME][NAME]
    ns = f"{NAME}.{NAME}"
    s0.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    s0.admin.command("shardCollection", ns, key={"_id": 1})
    s0.admin.command("split", ns, middle={"_id": 0})
    s0.admin.command("moveChunk", ns, find={"_id": 1}, to=st.rs_url(1))

    opened = {}

    def while_shard1_is_unreachable() -> None:
        opened["cs"] = watch(s1[NAME][NAME], comment=NAME)
        coll.insert_one({"_id": -1000})
        coll.insert_one({"_id": 1001})

    st.server.restart_shard(1, while_shard1_is_unreachable)
    coll.insert_one({"_id": -1002})
    cs = opened["cs"]
    for id_ in (-1000, 1001, -1002):
        # Up to 20 s: the sidecar's tail of shard1 reconnects on its own schedule.
        assert_change_stream_event_eq(cs.soon_next(tries=200), _insert(id_))
    cs.close()
