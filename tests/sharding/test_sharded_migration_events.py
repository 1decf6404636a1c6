"""What a chunk migration writes on the donor, as mongod 8.0 writes it: the
`migrateLastChunkFromShard` no-op once the donor has no chunk of the collection left
(migration_source_manager.cpp, notifyChangeStreamsOnDonorLastChunk; translated from
jstests/change_streams/migrate_last_chunk_from_shard_event.js), and the range deleter's
deletes in shard-key order (an index scan over the shard key), not insertion order."""

from __future__ import annotations

import pymongo
import pytest
from bson.binary import Binary

from cdcserver.sharding.testing import ShardedServer

DB = "migrate_last_chunk_from_shard_event"
COLL = "test"
NS = f"{DB}.{COLL}"


@pytest.fixture
def cluster():
    with ShardedServer(2) as server:
        yield server


@pytest.fixture
def client(cluster):
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def _uuid(client: pymongo.MongoClient) -> Binary:
    info = next(client[DB].list_collections(filter={"name": COLL}))
    return info["info"]["uuid"]


def _prepare(client: pymongo.MongoClient) -> None:
    client[DB][COLL].drop()
    client[DB][COLL].insert_one({"_id": 1})
    client.admin.command("shardCollection", NS, key={"_id": 1})


class _Stream:
    """A raw `$changeStream` aggregate and its getMores (pymongo's watch() cannot ask for
    showSystemEvents)."""

    def __init__(self, db, coll: str | None, spec: dict, match: list | None = None) -> None:
        self.db = db
        self.coll = coll
        reply = db.command({"aggregate": coll if coll is not None else 1,
                            "pipeline": [{"$changeStream": spec}, *(match or [])],
                            "cursor": {"batchSize": 0}})
        self.id = reply["cursor"]["id"]
        self.buffer = list(reply["cursor"]["firstBatch"])

    def next(self, guard: int = 100) -> dict:
        for _ in range(guard):  # a guard against hanging, never a performance expectation
            if self.buffer:
                return self.buffer.pop(0)
            reply = self.db.command({"getMore": self.id,
                                     "collection": self.coll or "$cmd.aggregate",
                                     "maxTimeMS": 100})
            self.buffer.extend(reply["cursor"]["nextBatch"])
        raise AssertionError("no event")

    def close(self) -> None:
        self.db.command({"killCursors": self.coll or "$cmd.aggregate", "cursors": [self.id]})


_NOT_DDL = [{"$match": {"operationType": {"$nin": ["create", "createIndexes",
                                                   "shardCollection"]}}}]


def _stream(client, level: str, show_system_events: bool, **options) -> _Stream:
    spec = {"showExpandedEvents": True, "showSystemEvents": show_system_events, **options}
    return _Stream(client[DB], COLL if level == "collection" else None, spec, _NOT_DDL)


@pytest.mark.parametrize("level", ["collection", "database"])
def test_moving_a_donors_last_chunk_is_a_migrate_last_chunk_from_shard_event(client, level):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    _prepare(client)
    stream = _stream(client, level, True)
    client.admin.command("moveChunk", NS, find={"_id": 0}, to="shard1")
    event = stream.next()
    stream.close()
    assert event["operationType"] == "migrateLastChunkFromShard"
    assert event["ns"] == {"db": DB, "coll": COLL}
    assert event["operationDescription"] == {"shardId": "shard0"}
    assert event["collectionUUID"] == _uuid(client)
    client[DB][COLL].insert_one({"_id": 2})
    # Resumed after the event: the insert that followed it.
    stream = _stream(client, level, True, resumeAfter=event["_id"])
    event = stream.next()
    stream.close()
    assert event["operationType"] == "insert"
    assert event["documentKey"] == {"_id": 2}


def test_without_show_system_events_the_event_is_not_shown(client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    _prepare(client)
    stream = _stream(client, "collection", False)
    client.admin.command("moveChunk", NS, find={"_id": 0}, to="shard1")
    client[DB][COLL].insert_one({"_id": 2})
    event = stream.next()
    stream.close()
    assert event["operationType"] == "insert" and event["documentKey"] == {"_id": 2}


def test_the_no_op_on_the_donor_is_written_once_and_only_for_the_last_chunk(cluster, client):
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client.admin.command("shardCollection", NS, key={"x": 1})
    client[DB][COLL].insert_many([{"x": i} for i in range(10)])
    client.admin.command("split", NS, middle={"x": 5})
    with pymongo.MongoClient(cluster.shard_uris[0]) as donor:
        start = donor.admin.command("ping")["operationTime"]
        client.admin.command("moveChunk", NS, find={"x": 0}, to="shard1")  # one left
        client.admin.command("moveChunk", NS, find={"x": 7}, to="shard1")  # the last
        client.admin.command("moveChunk", NS, find={"x": 7}, to="shard0")  # back: none
        notes = list(donor.local["oplog.rs"].find(
            {"ts": {"$gt": start}, "op": "n", "o2.migrateLastChunkFromShard": {"$exists": True}}))
    assert len(notes) == 1
    note = notes[0]
    assert note["ns"] == NS and "fromMigrate" not in note
    assert note["o"] == {"msg": f"Migrate the last chunk for {NS} off shard shard0"}
    assert note["o2"] == {"migrateLastChunkFromShard": NS, "shardId": "shard0"}
    assert note["ui"] == _uuid(client)
    # The shard1 donated its last chunk back only after taking both: no note on shard1 for
    # the move back (shard1 kept one chunk).
    with pymongo.MongoClient(cluster.shard_uris[1]) as other:
        assert other.local["oplog.rs"].count_documents(
            {"o2.migrateLastChunkFromShard": {"$exists": True}}) == 0


def test_the_donors_deletes_are_in_shard_key_order(cluster, client):
    """The range deleter's deletes, seen on the donor's oplog (and by a shard's stream with
    showMigrationEvents), follow the shard key, whatever order the documents came in."""
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client.admin.command("shardCollection", NS, key={"x": 1})
    xs = [7, 3, 9, 1, 5, 8, 2, 6, 4, 0]
    client[DB][COLL].insert_many([{"_id": 100 + i, "x": x} for i, x in enumerate(xs)])
    with pymongo.MongoClient(cluster.shard_uris[0]) as donor:
        start = donor.admin.command("ping")["operationTime"]
        stream = _Stream(donor[DB], COLL, {"showMigrationEvents": True,
                                           "startAtOperationTime": start},
                         [{"$match": {"operationType": "delete"}}])
        client.admin.command("moveChunk", NS, find={"x": 0}, to="shard1")
        deletes = [stream.next()["documentKey"]["x"] for _ in xs]
        stream.close()
    assert deletes == sorted(xs)


def test_a_recipients_first_chunk_is_announced_in_its_oplog_not_to_streams(cluster, client):
    """notifyChangeStreamsOnRecipientFirstChunk: the recipient's no-op before it clones its
    first chunk of the collection (mongos opens a cursor on it then; no user sees it)."""
    client.admin.command("enableSharding", DB, primaryShard="shard0")
    client.admin.command("shardCollection", NS, key={"x": 1})
    client[DB][COLL].insert_many([{"x": i} for i in range(10)])
    client.admin.command("split", NS, middle={"x": 5})
    stream = _stream(client, "database", True)
    with pymongo.MongoClient(cluster.shard_uris[1]) as recipient:
        start = recipient.admin.command("ping")["operationTime"]
        client.admin.command("moveChunk", NS, find={"x": 0}, to="shard1")  # its first
        client.admin.command("moveChunk", NS, find={"x": 7}, to="shard1")  # not its first
        notes = list(recipient.local["oplog.rs"].find(
            {"ts": {"$gt": start}, "o2.migrateChunkToNewShard": {"$exists": True}}))
    assert len(notes) == 1
    assert notes[0]["o"] == {"msg": "Migrating chunk from shard shard0 to shard shard1 with "
                                    "no chunks for this collection"}
    assert notes[0]["o2"] == {"migrateChunkToNewShard": NS, "fromShardId": "shard0",
                              "toShardId": "shard1"}
    assert "fromMigrate" not in notes[0]
    client[DB][COLL].insert_one({"x": 100})
    # The front's stream: the donor's last chunk, then the insert; no migrateChunkToNewShard.
    events = [stream.next()["operationType"], stream.next()["operationType"]]
    stream.close()
    assert events == ["migrateLastChunkFromShard", "insert"]


def test_a_first_migration_creates_the_collection_on_the_recipient_with_its_uuid(cluster, client):
    """The recipient of a collection's first chunk creates it with the collection's UUID (the
    same on every shard): its create entry and the cloned documents' entries carry one `ui`,
    the donor's, as mongod's recipient creates it with the donor's options and UUID."""
    _prepare(client)
    uuid = _uuid(client)
    client.admin.command("moveChunk", NS, find={"_id": 0}, to="shard1")
    with pymongo.MongoClient(cluster.shard_uris[1]) as recipient:
        entries = list(recipient.local["oplog.rs"].find(
            {"$or": [{"ns": NS}, {"ns": f"{DB}.$cmd", "o.create": COLL}]}))
        info = next(recipient[DB].list_collections(filter={"name": COLL}))
    creates = [e for e in entries if e["op"] == "c" and "create" in e["o"]]
    assert len(creates) == 1 and entries, entries
    assert {e["ui"] for e in entries} == {uuid}
    assert info["info"]["uuid"] == uuid
