"""mongos 8.0's admin commands through the embedded cluster's front: a shard named by its
connection string or host (ShardRegistryData::findShard), moveCollection and
unshardCollection (resharding under `{_id: 1}` into one chunk: a tracked unsharded collection,
`unsplittable: true`; translated in part from jstests/core/ddl/move_collection_basic.js,
jstests/sharding/unshard_collection_basic.js and
jstests/sharding/change_streams/reshard_collection_event.js)."""

from __future__ import annotations

import random
import threading
import time

import bson
import pymongo
import pymongo.errors
import pytest
from bson.binary import Binary
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer

DB = "reshard_collection_event"
COLL = "coll"
NS = f"{DB}.{COLL}"


@pytest.fixture
def cluster():
    with ShardedServer(2) as server:
        yield server


@pytest.fixture
def client(cluster):
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def _counts(cluster: ShardedServer, db: str, coll: str) -> list[int]:
    out = []
    for uri in cluster.shard_uris:
        with pymongo.MongoClient(uri) as c:
            out.append(c[db][coll].count_documents({}))
    return out


def _code(call) -> tuple[int, str]:
    with pytest.raises(OperationFailure) as err:
        call()
    return err.value.code, str(err.value.details.get("errmsg"))


# -- a shard named by its connection string or one of its hosts -----------------------------------

@pytest.mark.parametrize("form", ["connection string", "host"])
def test_a_shard_may_be_named_by_connection_string_or_host(cluster, client, form):
    shards = {s["_id"]: s["host"] for s in client.admin.command("listShards")["shards"]}

    def named(shard: str) -> str:
        host = shards[shard]
        return host if form == "connection string" else host.split("/", 1)[1]

    client.admin.command("enableSharding", "named", primaryShard=named("shard1"))
    assert client.config.databases.find_one({"_id": "named"})["primary"] == "shard1"
    client.admin.command("shardCollection", "named.c", key={"x": 1})
    client.named.c.insert_many([{"x": i} for i in range(10)])
    client.admin.command("split", "named.c", middle={"x": 5})
    client.admin.command("moveChunk", "named.c", find={"x": 0}, to=named("shard0"))
    client.admin.command("moveRange", "named.c", min={"x": 5}, toShard=named("shard0"))
    assert {c["shard"] for c in client.config.chunks.find({})} == {"shard0"}
    assert _counts(cluster, "named", "c") == [10, 0]
    client.named.plain.insert_one({"_id": 1})
    client.admin.command("movePrimary", "named", to=named("shard0"))
    assert client.config.databases.find_one({"_id": "named"})["primary"] == "shard0"
    assert _counts(cluster, "named", "plain") == [1, 0]


def test_an_unknown_shard_is_still_70(client):
    code, _ = _code(lambda: client.admin.command("enableSharding", "x",
                                                 primaryShard="nope/127.0.0.1:1"))
    assert code == 70
    client.admin.command("shardCollection", "x.c", key={"x": 1})
    code, message = _code(lambda: client.admin.command("moveChunk", "x.c", find={"x": 0},
                                                       to="127.0.0.1:1"))
    assert (code, message) == (70, "Could not find shard 127.0.0.1:1")


# -- moveCollection -----------------------------------------------------------------------------

def test_move_collection_moves_an_unsharded_collection_and_tracks_it(cluster, client):
    client.admin.command("enableSharding", "db", primaryShard="shard0")
    cmd = {"moveCollection": "db.foo", "toShard": "shard1"}
    code, message = _code(lambda: client.admin.command(cmd))  # no such collection
    assert code == 26
    client.admin.command("shardCollection", "db.sharded", key={"oldKey": 1})
    code, message = _code(lambda: client.admin.command(
        {"moveCollection": "db.sharded", "toShard": "shard1"}))
    assert (code, message) == (26, "MoveCollection can only be called on an unsharded "
                                   "collection.")
    code, _ = _code(lambda: client.admin.command({"moveCollection": "db.foo"}))
    assert code == 40414  # IDLFailedToParse: toShard is required
    code, _ = _code(lambda: client.db.command(cmd))
    assert code == 13  # admin only

    client.db.foo.insert_many([{"_id": i, "oldKey": i} for i in range(-25, 25)])
    client.db.foo.create_index("oldKey")
    before = client.config.collections.find_one({"_id": "db.foo"})
    assert before is None  # untracked until moved
    client.admin.command(cmd)
    entry = client.config.collections.find_one({"_id": "db.foo"})
    assert entry["unsplittable"] is True and entry["key"] == {"_id": 1}
    chunks = list(client.config.chunks.find({"uuid": entry["uuid"]}))
    assert [c["shard"] for c in chunks] == ["shard1"]
    assert _counts(cluster, "db", "foo") == [0, 50]
    assert client.db.foo.count_documents({}) == 50
    # The primary keeps an empty copy (as of a sharded collection), with the new UUID: DDL
    # through the front reaches it first, listCollections there names the new UUID.
    client.db.foo.create_index("late")
    with pymongo.MongoClient(cluster.shard_uris[0]) as shard0:
        primary_copy = next(shard0.db.list_collections(filter={"name": "foo"}))
    assert primary_copy["info"]["uuid"] == entry["uuid"]
    assert next(client.db.list_collections(filter={"name": "foo"}))["info"]["uuid"] == \
        entry["uuid"]
    with pymongo.MongoClient(cluster.shard_uris[1]) as shard1:
        indexes = {i["name"] for i in shard1.db.foo.list_indexes()}
        assert indexes == {"_id_", "oldKey_1", "late_1"}  # the indexes went along
    # Writes and reads are routed to where it is now.
    client.db.foo.insert_one({"_id": 100, "oldKey": 100})
    client.db.foo.update_one({"_id": 0}, {"$set": {"moved": True}})
    assert _counts(cluster, "db", "foo") == [0, 51]
    assert client.db.foo.find_one({"_id": 0})["moved"] is True
    # ...and back to the primary.
    client.admin.command({"moveCollection": "db.foo", "toShard": "shard0"})
    assert _counts(cluster, "db", "foo") == [51, 0]
    entry = client.config.collections.find_one({"_id": "db.foo"})
    assert entry["unsplittable"] is True
    assert len(list(client.config.chunks.find({"uuid": entry["uuid"]}))) == 1
    # Not sharded for the chunk commands, nor for resharding.
    code, _ = _code(lambda: client.admin.command("moveChunk", "db.foo", find={"_id": 0},
                                                 to="shard1"))
    assert code == 118
    code, _ = _code(lambda: client.admin.command("reshardCollection", "db.foo",
                                                 key={"_id": 1}))
    assert code == 118


def _stream(client: pymongo.MongoClient, level: str, **options):
    target = client[DB][COLL] if level == "collection" else client[DB]
    return target.watch(
        [{"$match": {"operationType": {"$nin": ["create", "createIndexes"]}}}],
        show_expanded_events=True, max_await_time_ms=100, **options)


def _next(stream, guard: int = 100):
    for _ in range(guard):  # a guard against hanging, never a performance expectation
        event = stream.try_next()
        if event is not None:
            return event
    raise AssertionError("no event")


def _collection_uuid(cluster: ShardedServer, holder: int) -> Binary:
    with pymongo.MongoClient(cluster.shard_uris[holder]) as c:
        return next(c[DB].list_collections(filter={"name": COLL}))["info"]["uuid"]


@pytest.mark.parametrize("level", ["collection", "database"])
def test_move_collection_is_a_reshard_collection_event(cluster, client, level):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client[DB].create_collection(COLL)
    old_uuid = _collection_uuid(cluster, 0)
    with _stream(client, level) as stream:
        client.admin.command({"moveCollection": NS, "toShard": "shard1"})
        event = _next(stream)
    new_uuid = _collection_uuid(cluster, 1)
    assert new_uuid != old_uuid
    assert event["operationType"] == "reshardCollection"
    assert event["ns"] == {"db": DB, "coll": COLL}
    assert event["collectionUUID"] == old_uuid
    assert event["operationDescription"] == {
        "reshardUUID": new_uuid, "shardKey": {"_id": 1}, "oldShardKey": {"_id": 1},
        "unique": False, "numInitialChunks": 1, "provenance": "moveCollection",
    }
    client[DB][COLL].insert_one({"_id": 2})
    with _stream(client, level, resume_after=event["_id"]) as stream:
        event = _next(stream)
    assert event["operationType"] == "insert" and event["documentKey"] == {"_id": 2}


def test_ddl_of_a_moved_collection_through_the_front_is_one_event(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client[DB][COLL].insert_one({"_id": 1})
    client.admin.command({"moveCollection": NS, "toShard": "shard1"})
    uuid = client.config.collections.find_one({"_id": NS})["uuid"]
    with client[DB][COLL].watch(show_expanded_events=True, max_await_time_ms=100) as stream:
        client[DB][COLL].create_index("a")
        client[DB][COLL].insert_one({"_id": 2})
        events = [_next(stream), _next(stream)]
    assert [e["operationType"] for e in events] == ["createIndexes", "insert"]
    assert events[0]["collectionUUID"] == uuid
    with pymongo.MongoClient(cluster.shard_uris[1]) as shard1:
        assert "a_1" in {i["name"] for i in shard1[DB][COLL].list_indexes()}
    assert _counts(cluster, DB, COLL) == [0, 2]
    client[DB][COLL].drop()
    assert client.config.collections.find_one({"_id": NS}) is None
    assert _counts(cluster, DB, COLL) == [0, 0]


def test_after_move_primary_the_new_primary_has_a_copy_of_a_moved_collection(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client[DB][COLL].insert_one({"_id": 1})
    client.admin.command({"moveCollection": NS, "toShard": "shard0"})  # tracked, on shard0
    client.admin.command("movePrimary", DB, to="shard1")
    uuid = client.config.collections.find_one({"_id": NS})["uuid"]
    with pymongo.MongoClient(cluster.shard_uris[1]) as shard1:
        info = next(shard1[DB].list_collections(filter={"name": COLL}))
    assert info["info"]["uuid"] == uuid
    with client[DB][COLL].watch(show_expanded_events=True, max_await_time_ms=100) as stream:
        client[DB][COLL].create_index("a")
        event = _next(stream)
    assert event["operationType"] == "createIndexes" and event["collectionUUID"] == uuid
    assert _counts(cluster, DB, COLL) == [1, 0]


@pytest.mark.parametrize("level", ["collection", "database"])
def test_reshard_collection_event_repeats_the_requests_details(cluster, client, level):
    """reshard_collection_event.js's reshardCollection case."""
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client.admin.command("shardCollection", NS, key={"_id": 1})
    client.admin.command({"addShardToZone": "shard1", "zone": "zone1"})
    old_uuid = _collection_uuid(cluster, 0)
    zones = [{"zone": "zone1", "min": {"newKey": MinKey()}, "max": {"newKey": MaxKey()}}]
    with _stream(client, level) as stream:
        client.admin.command({"reshardCollection": NS, "key": {"newKey": 1}, "unique": False,
                              "numInitialChunks": 1, "collation": {"locale": "simple"},
                              "zones": zones})
        event = _next(stream)
    new_uuid = _collection_uuid(cluster, 0)
    assert event["operationType"] == "reshardCollection"
    assert event["collectionUUID"] == old_uuid
    assert event["operationDescription"] == {
        "reshardUUID": new_uuid, "shardKey": {"newKey": 1},
        "oldShardKey": {"_id": 1}, "unique": False, "numInitialChunks": 1,
        "collation": {"locale": "simple"}, "provenance": "reshardCollection", "zones": zones,
    }
    # The zone's range is the collection's now, and its one chunk is on the zone's shard.
    tags = list(client.config.tags.find({"ns": NS}))
    assert [(t["min"], t["max"], t["tag"]) for t in tags] == [
        ({"newKey": MinKey()}, {"newKey": MaxKey()}, "zone1")]
    assert [c["shard"] for c in client.config.chunks.find({"uuid": new_uuid})] == ["shard1"]
    client[DB][COLL].insert_one({"_id": 2})
    with _stream(client, level, resume_after=event["_id"]) as stream:
        event = _next(stream)
    assert event["operationType"] == "insert" and event["documentKey"] == {"_id": 2}


def test_reshard_collection_zones_must_exist_and_not_overlap(client):
    client.admin.command("shardCollection", NS, key={"_id": 1})
    code, message = _code(lambda: client.admin.command({
        "reshardCollection": NS, "key": {"k": 1},
        "zones": [{"zone": "nowhere", "min": {"k": MinKey()}, "max": {"k": 0}}]}))
    assert (code, message) == (2, "Zone must already exist")
    client.admin.command({"addShardToZone": "shard1", "zone": "A"})
    code, message = _code(lambda: client.admin.command({
        "reshardCollection": NS, "key": {"k": 1},
        "zones": [{"zone": "A", "min": {"k": 0}, "max": {"k": 10}},
                  {"zone": "A", "min": {"k": 5}, "max": {"k": 20}}]}))
    assert (code, message) == (2, "Zone ranges must not overlap")


def test_draining_moves_a_moved_collection_off_the_shard(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client[DB][COLL].insert_many([{"_id": i} for i in range(5)])
    client.admin.command({"moveCollection": NS, "toShard": "shard1"})
    with _stream(client, "collection") as stream:
        assert client.admin.command("removeShard", "shard1")["state"] == "started"
        event = _next(stream)
    assert event["operationType"] == "reshardCollection"
    assert event["operationDescription"]["provenance"] == "balancerMoveCollection"
    entry = client.config.collections.find_one({"_id": NS})
    assert [c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})] == ["shard0"]
    assert client.admin.command("removeShard", "shard1")["state"] == "completed"
    assert sorted(d["_id"] for d in client[DB][COLL].find({})) == list(range(5))


# -- unshardCollection --------------------------------------------------------------------------

def test_unshard_collection_puts_a_sharded_collection_on_one_shard(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    code, _ = _code(lambda: client.admin.command({"unshardCollection": NS}))
    assert code == 26  # no such collection
    client[DB].plain.insert_one({"_id": 1})
    code, message = _code(lambda: client.admin.command({"unshardCollection": f"{DB}.plain"}))
    assert (code, message) == (118, "Namespace must be sharded to perform an "
                                    "unshardCollection command")
    client.admin.command("shardCollection", NS, key={"x": 1})
    client[DB][COLL].insert_many([{"_id": i, "x": i} for i in range(20)])
    client.admin.command("split", NS, middle={"x": 10})
    client.admin.command("moveChunk", NS, find={"x": 10}, to="shard1")
    assert _counts(cluster, DB, COLL) == [10, 10]
    old_uuid = _collection_uuid(cluster, 0)
    with _stream(client, "collection") as stream:
        client.admin.command({"unshardCollection": NS, "toShard": "shard1"})
        event = _next(stream)
    assert _counts(cluster, DB, COLL) == [0, 20]
    entry = client.config.collections.find_one({"_id": NS})
    assert entry["unsplittable"] is True and entry["key"] == {"_id": 1}
    assert [c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})] == ["shard1"]
    assert event["operationType"] == "reshardCollection"
    assert event["collectionUUID"] == old_uuid
    assert event["operationDescription"] == {
        "reshardUUID": entry["uuid"], "shardKey": {"_id": 1}, "oldShardKey": {"x": 1},
        "unique": False, "numInitialChunks": 1, "provenance": "unshardCollection",
    }
    code, _ = _code(lambda: client.admin.command({"unshardCollection": NS}))
    assert code == 118  # already unsharded
    # Sharded again where it is.
    client.admin.command("shardCollection", NS, key={"x": 1})
    entry = client.config.collections.find_one({"_id": NS})
    assert "unsplittable" not in entry and entry["key"] == {"x": 1}
    assert [c["shard"] for c in client.config.chunks.find({"uuid": entry["uuid"]})] == ["shard1"]
    assert client[DB][COLL].count_documents({}) == 20


def test_unshard_collection_without_to_shard_picks_the_shard_with_least_data(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client[DB].ballast.insert_many([{"_id": i} for i in range(30)])  # on shard0
    client.admin.command("shardCollection", NS, key={"_id": 1})
    client[DB][COLL].insert_many([{"_id": i} for i in range(5)])
    client.admin.command({"unshardCollection": NS})
    assert _counts(cluster, DB, COLL) == [0, 5]


# -- moveCollection under SIGKILL --------------------------------------------------------------

KILLS = 6  # a handful: the protocol is resharding's, whose own crash test kills 25 times
DOCS = 3000
HANG_GUARD_S = 60.0  # a guard against hanging, never a performance expectation


class _Mover(threading.Thread):
    """moveCollection of crash.plain back and forth until the server dies."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=1000, retryWrites=False)
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                _move_plain(self.client)
                self.done += 1
        except pymongo.errors.PyMongoError:
            pass  # the server was killed
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc
        finally:
            self.client.close()


def _owner(client: pymongo.MongoClient) -> str:
    """The shard the catalog places crash.plain on."""
    entry = client.config.collections.find_one({"_id": "crash.plain"})
    if entry is None:
        return client.config.databases.find_one({"_id": "crash"})["primary"]
    return next(iter(client.config.chunks.find({"uuid": entry["uuid"]})))["shard"]


def _move_plain(client: pymongo.MongoClient) -> None:
    to = "shard1" if _owner(client) == "shard0" else "shard0"
    client.admin.command({"moveCollection": "crash.plain", "toShard": to})


def _check_after_restart(server, start) -> None:
    with pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=5000) as client:
        ids = [d["_id"] for d in client.crash.plain.find({}, {"_id": 1})]
        assert sorted(ids) == list(range(DOCS)), (len(ids), len(set(ids)))
        owner = _owner(client)
        held = {}
        for shard in client.config.shards.find({}):
            address = shard["host"].split("/", 1)[1]
            with pymongo.MongoClient(f"mongodb://{address}/?directConnection=true") as direct:
                held[shard["_id"]] = direct.crash.plain.count_documents({})
        assert held == {n: DOCS if n == owner else 0 for n in held}, (owner, held)
        # The zones outlive every restart.
        assert _shard_tags(client) == {"shard0": [], "shard1": ["Z"]}
        assert [t["tag"] for t in client.config.tags.find({"ns": "crash.zoned"})] == ["Z"]
        inserts: dict[object, int] = {}
        with client.crash.watch(start_at_operation_time=start, max_await_time_ms=50) as stream:
            deadline = time.monotonic() + HANG_GUARD_S
            while sum(inserts.values()) < DOCS and time.monotonic() < deadline:
                event = stream.try_next()
                if event is None:
                    continue
                assert event["operationType"] in ("insert", "create", "createIndexes"), event
                key = (event["ns"]["coll"], event["documentKey"]["_id"])
                inserts[key] = inserts.get(key, 0) + 1
            for _ in range(5):  # a move's writes must not show
                event = stream.try_next()
                assert event is None or event["operationType"] != "insert", event
        assert len(inserts) == DOCS and set(inserts.values()) == {1}


def _shard_tags(client: pymongo.MongoClient) -> dict[str, list[str]]:
    return {s["_id"]: s.get("tags", []) for s in client.admin.command("listShards")["shards"]}


def test_killed_during_move_collection_loses_and_doubles_nothing(tmp_path):
    from cdcserver.testing import SubprocessServer

    rng = random.Random("moveCollection")
    data = tmp_path / "data"
    server = SubprocessServer(data_dir=data, extra_args=["--shards", "2"])
    inside = 0
    try:
        with pymongo.MongoClient(server.uri, retryWrites=False) as client:
            start = client.admin.command("ping")["operationTime"]
            client.admin.command("enableSharding", "crash", primaryShard="shard0")
            client.crash.plain.insert_many([{"_id": i, "pad": "x" * 32} for i in range(DOCS)])
            client.admin.command({"addShardToZone": "shard1", "zone": "Z"})
            client.admin.command({"updateZoneKeyRange": "crash.zoned", "min": {"x": 0},
                                  "max": {"x": 10}, "zone": "Z"})
        for _ in range(KILLS):
            mover = _Mover(server.uri)
            mover.start()
            time.sleep(rng.uniform(0.05, 0.5))
            server.kill()
            mover.join(HANG_GUARD_S)
            assert mover.error is None, mover.error
            inside += bool(bson.decode((data / "config.bson").read_bytes()).get("operations"))
            server.stop()
            server = SubprocessServer(data_dir=data, extra_args=["--shards", "2"])
            _check_after_restart(server, start)
            with pymongo.MongoClient(server.uri, retryWrites=False) as client:
                _move_plain(client)  # the next move works
        _check_after_restart(server, start)
    finally:
        server.stop()
    assert inside >= 1, "no kill landed inside a moveCollection"
