"""`getMore` with `maxTimeMS` on a cursor that is not awaitData, in every serving mode.

mongod 8.0 (getmore_cmd.cpp validateMaxTimeMS, a check made when the cursor is pinned, so the
cursor stays open): 2 BadValue "cannot set maxTimeMS on getMore command for a non-awaitData
cursor" for a find / aggregate cursor, a tailable cursor without awaitData, an oplog find that
is not tailable + awaitData. Change streams and tailable awaitData cursors take it (their
await time). mongos (cluster_find.cpp, the sharded front) refuses it with its own text, "maxTimeMS
can only be used with getMore for tailable, awaitData cursors", and its failed pin kills the
cursor (jstests/core/getmore_cmd_maxtimems.js).
"""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer

MONGOD = "cannot set maxTimeMS on getMore command for a non-awaitData cursor"
MONGOS = "maxTimeMS can only be used with getMore for tailable, awaitData cursors"


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer()
    yield server
    server.stop()


@pytest.fixture
def db(embedded: EmbeddedServer) -> Iterator[pymongo.database.Database]:
    client = embedded.client()
    client.drop_database("gm_max_time")
    yield client.gm_max_time
    client.drop_database("gm_max_time")
    client.close()


def _get_more(db, cursor: dict, **fields):
    coll = cursor["ns"].split(".", 1)[1]
    return db.command({"getMore": Int64(cursor["id"]), "collection": coll, **fields})


def _refused(db, cursor: dict, text: str = MONGOD, **fields) -> None:
    with pytest.raises(OperationFailure) as info:
        _get_more(db, cursor, maxTimeMS=60000, **fields)
    err = info.value
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (2, "BadValue", text)


def _fill(coll, n: int = 10) -> None:
    coll.insert_many([{"_id": i, "a": i} for i in range(n)])


def test_find_cursor_refuses_max_time_and_stays_open(db) -> None:
    _fill(db.c)
    cursor = db.command({"find": "c", "batchSize": 2})["cursor"]
    _refused(db, cursor)
    # a pin check: the cursor is still there, and gives the next batch
    batch = _get_more(db, cursor, batchSize=3)["cursor"]["nextBatch"]
    assert [d["_id"] for d in batch] == [2, 3, 4]


def test_zero_max_time_is_refused_too(db) -> None:
    _fill(db.c)
    cursor = db.command({"find": "c", "batchSize": 2})["cursor"]
    with pytest.raises(OperationFailure) as info:
        _get_more(db, cursor, maxTimeMS=0)
    assert (info.value.code, info.value.details["errmsg"]) == (2, MONGOD)


def test_aggregate_and_list_cursors_refuse_max_time(db) -> None:
    _fill(db.c)
    cursor = db.command({"aggregate": "c", "pipeline": [{"$match": {}}],
                         "cursor": {"batchSize": 2}})["cursor"]
    _refused(db, cursor)
    for i in range(4):
        db.create_collection(f"l{i}")
    cursor = db.command({"listCollections": 1, "cursor": {"batchSize": 1}})["cursor"]
    _refused(db, cursor)


def test_capped_cursors(db) -> None:
    db.create_collection("capped", capped=True, size=4096)
    _fill(db.capped)
    plain = db.command({"find": "capped", "batchSize": 2})["cursor"]
    _refused(db, plain)
    tailable = db.command({"find": "capped", "batchSize": 2, "tailable": True})["cursor"]
    _refused(db, tailable)
    awaiting = db.command({"find": "capped", "batchSize": 2, "tailable": True,
                           "awaitData": True})["cursor"]
    reply = _get_more(db, awaiting, maxTimeMS=10)
    assert [d["_id"] for d in reply["cursor"]["nextBatch"]] == list(range(2, 10))


def test_pymongo_tailable_await_cursor_sends_max_time(db) -> None:
    db.create_collection("capped", capped=True, size=4096)
    _fill(db.capped, 3)
    cursor = db.capped.find(cursor_type=pymongo.CursorType.TAILABLE_AWAIT,
                            batch_size=1).max_await_time_ms(10)
    assert [next(cursor)["_id"] for _ in range(3)] == [0, 1, 2]
    assert next(cursor, None) is None  # a getMore with maxTimeMS: 10 that found nothing
    assert cursor.alive
    cursor.close()


def test_change_stream_takes_max_time(db) -> None:
    reply = db.command({"aggregate": "c", "pipeline": [{"$changeStream": {}}],
                        "cursor": {}})
    cursor = reply["cursor"]
    db.c.insert_one({"_id": 1})
    more = _get_more(db, cursor, maxTimeMS=5000)
    assert more["ok"] == 1.0
    with db.c.watch(max_await_time_ms=10) as stream:
        assert stream.try_next() is None  # getMore {maxTimeMS: 10}
        db.c.insert_one({"_id": 2})
        assert stream.next()["documentKey"] == {"_id": 2}


def test_oplog_finds(embedded: EmbeddedServer, db) -> None:
    _fill(db.c)
    local = db.client.local
    plain = local.command({"find": "oplog.rs", "batchSize": 1})["cursor"]
    _refused(local, plain)
    tailable = local.command({"find": "oplog.rs", "batchSize": 1, "tailable": True})["cursor"]
    _refused(local, tailable)
    awaiting = local.command({"find": "oplog.rs", "batchSize": 1, "tailable": True,
                              "awaitData": True})["cursor"]
    assert _get_more(local, awaiting, maxTimeMS=10, batchSize=1)["ok"] == 1.0


def test_recorded_oplog(cdcserver_sample) -> None:
    with pymongo.MongoClient(cdcserver_sample.uri) as client:
        local = client.local
        plain = local.command({"find": "oplog.rs", "batchSize": 1})["cursor"]
        _refused(local, plain)
        stream = client.test.command({"aggregate": 1, "pipeline": [{"$changeStream": {}}],
                                      "cursor": {"batchSize": 0}})["cursor"]
        assert _get_more(client.test, stream, maxTimeMS=10)["ok"] == 1.0


@pytest.fixture(scope="module")
def front():
    from cdcserver.sharding.testing import ShardedServer

    with ShardedServer(2) as server:
        yield server


def test_sharded_front_answers_as_mongos(front) -> None:
    with pymongo.MongoClient(front.uri) as client:
        db = client.gm_front
        db.drop_collection("sharded")
        db.drop_collection("plain")
        client.admin.command("shardCollection", "gm_front.sharded", key={"_id": 1})
        _fill(db.sharded)
        _fill(db.plain)
        for name in ("sharded", "plain"):  # merged on the front; a shard's cursor
            cursor = db.command({"find": name, "batchSize": 2})["cursor"]
            _refused(db, cursor, MONGOS)
            # mongos's pin failed: the cursor is killed
            with pytest.raises(OperationFailure) as info:
                _get_more(db, cursor)
            assert info.value.code == 43
        stream = db.command({"aggregate": "sharded", "pipeline": [{"$changeStream": {}}],
                             "cursor": {}})["cursor"]
        assert _get_more(db, stream, maxTimeMS=10)["ok"] == 1.0


def test_sharded_front_kills_the_shards_cursor_too(front) -> None:
    """mongos's refused getMore kills its cursor (ClusterCursorManager::PinnedCursor's
    destructor: returnAndKillCursor), and with it the shards' cursors (killCursors), where
    a shard's mongod alone would have kept its cursor: nothing is left to the reaper."""
    with pymongo.MongoClient(front.uri) as client:
        db = client.gm_front
        db.drop_collection("plain")
        _fill(db.plain)
        cursor = db.command({"find": "plain", "batchSize": 2})["cursor"]
        _refused(db, cursor, MONGOS)
        for uri in front.shard_uris:
            with pymongo.MongoClient(uri) as shard:
                reply = shard.gm_front.command(
                    {"killCursors": "plain", "cursors": [Int64(cursor["id"])]})
                assert reply["cursorsKilled"] == []
                assert reply["cursorsNotFound"] == [cursor["id"]]
        # a shard's failed getMore (its fail point: its cursor stays) kills both as well
        db.drop_collection("sharded2")
        client.admin.command("shardCollection", "gm_front.sharded2", key={"_id": 1})
        _fill(db.sharded2)
        cursor = db.command({"find": "sharded2", "filter": {"_id": 3}, "batchSize": 0})["cursor"]
        assert cursor["id"]  # targeted to one shard: that shard's cursor
        shards = [pymongo.MongoClient(uri) for uri in front.shard_uris]
        try:
            for shard in shards:
                shard.admin.command("configureFailPoint", "failCommand",
                                    mode={"times": 1},
                                    data={"failCommands": ["getMore"], "errorCode": 96})
            with pytest.raises(OperationFailure) as info:
                _get_more(db, cursor)
            assert info.value.code == 96
            for shard in shards:
                reply = shard.gm_front.command(
                    {"killCursors": "sharded2", "cursors": [Int64(cursor["id"])]})
                assert reply["cursorsKilled"] == []
        finally:
            for shard in shards:
                shard.admin.command("configureFailPoint", "failCommand", mode="off")
                shard.close()
        with pytest.raises(OperationFailure) as info:
            _get_more(db, cursor)
        assert info.value.code == 43


def test_the_fronts_reaper_kills_the_shards_cursor(front) -> None:
    """A cursor the front reaps (idle past cursorTimeoutMillis) is killed on its shard too,
    as mongos's cursor manager kills a reaped cursor's remotes."""
    import asyncio

    with pymongo.MongoClient(front.uri) as client:
        db = client.gm_front
        db.drop_collection("reaped")
        _fill(db.reaped)
        cursor = db.command({"find": "reaped", "batchSize": 2})["cursor"]
        cursors = front.state.cursors
        timeout = cursors.idle_timeout_s

        async def reap_now() -> int:
            cursors.idle_timeout_s = -1.0
            try:
                return cursors.reap()
            finally:
                cursors.idle_timeout_s = timeout
                await asyncio.sleep(0.05)  # the killCursors sent to the shard

        assert front.run(reap_now()) >= 1
        for uri in front.shard_uris:
            with pymongo.MongoClient(uri) as shard:
                reply = shard.gm_front.command(
                    {"killCursors": "reaped", "cursors": [Int64(cursor["id"])]})
                assert reply["cursorsKilled"] == []
        with pytest.raises(OperationFailure) as info:
            _get_more(db, cursor)
        assert info.value.code == 43
