"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_show_migration_events.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: streams opened on each shard directly with the
undocumented `showMigrationEvents: true` see a migration's writes (the recipient's inserts, the
donor's range deletion) along with the users'; mongos refuses the option (31123). Also after
the last chunk leaves shard0, and for a shard added later (`addShard`: the embedded cluster adds
a shard of its own) that a chunk then moves to. The collection is not clustered, so a
migration's inserts come in the donor's record order (insertion order); the donor's range
deletion deletes in shard key order (mongod's range deleter scans the shard key index:
`range_deletion_util.cpp`, `InternalPlanner::deleteWithShardKeyIndexScan`)."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure
from sharding_util import watch

NS = "test.chunk_mig"


def _check_events(cs, expected: list[tuple[int, str]]) -> None:
    for id_, op in expected:
        event = cs.soon_next()
        assert (event["operationType"], event["documentKey"]) == (op, {"_id": id_}), event


def test_change_stream_show_migration_events(st):
    s = st.s
    coll = s.test.chunk_mig
    s.admin.command({"enableSharding": "test", "primaryShard": st.shard0})
    cs0 = watch(st.rs(0).test.chunk_mig, showMigrationEvents=True)
    cs1 = watch(st.rs(1).test.chunk_mig, showMigrationEvents=True)

    with pytest.raises(OperationFailure) as err:
        s.test.command({"aggregate": "chunk_mig", "cursor": {},
                        "pipeline": [{"$changeStream": {"showMigrationEvents": True}}]})
    assert err.value.code == 31123, err.value.details

    assert not cs0.has_next(), "Do not expect any results yet"
    assert not cs1.has_next(), "Do not expect any results yet"

    s.admin.command("shardCollection", NS, key={"_id": 1})
    coll.insert_one({"_id": 0})
    coll.insert_one({"_id": 20})
    s.admin.command("split", NS, middle={"_id": 10})
    s.admin.command({"moveChunk": NS, "find": {"_id": 20}, "to": st.shard1,
                     "_waitForDelete": True})
    _check_events(cs0, [(0, "insert"), (20, "insert")])
    _check_events(cs0, [(20, "delete")])
    _check_events(cs1, [(20, "insert")])

    coll.insert_one({"_id": 1})
    coll.insert_one({"_id": 21})
    s.admin.command("split", NS, middle={"_id": 0})
    s.admin.command({"moveChunk": NS, "find": {"_id": 5}, "to": st.shard1,
                     "_waitForDelete": True})
    for id_ in (-2, 2, 22):
        coll.insert_one({"_id": id_})
    _check_events(cs0, [(1, "insert"), (0, "delete"), (1, "delete"), (-2, "insert")])
    _check_events(cs1, [(21, "insert"), (0, "insert"), (1, "insert"), (2, "insert"),
                        (22, "insert")])
    assert not cs0.has_next()
    assert not cs1.has_next()

    # The last chunk of shard0 moves to shard1: no invalidate.
    for id_ in (-3, 3, 23):
        coll.insert_one({"_id": id_})
    s.admin.command({"moveChunk": NS, "find": {"_id": -5}, "to": st.shard1,
                     "_waitForDelete": True})
    for id_ in (-4, 4, 24):
        coll.insert_one({"_id": id_})
    assert not s.test.chunk_mig.index_information()["_id_"].get("clustered")
    _check_events(cs0, [(-3, "insert"), (-3, "delete"), (-2, "delete")])
    _check_events(cs1, [(3, "insert"), (23, "insert"), (-2, "insert"), (-3, "insert"),
                        (-4, "insert"), (4, "insert"), (24, "insert")])

    # A new shard, then a chunk moved to it.
    s.admin.command({"addShard": "newShard/127.0.0.1:1", "name": "newShard"})
    cs_new = watch(st.rs(2).test.chunk_mig, showMigrationEvents=True)
    for id_ in (-5, 5, 25):
        coll.insert_one({"_id": id_})
    assert not cs0.has_next(), "Do not expect any results"
    _check_events(cs1, [(-5, "insert"), (5, "insert"), (25, "insert")])
    assert not cs_new.has_next(), "Do not expect any results yet"

    coll.insert_one({"_id": 16})
    s.admin.command({"moveChunk": NS, "find": {"_id": 20}, "to": "newShard",
                     "_waitForDelete": True})
    for id_ in (-6, 6, 26):
        coll.insert_one({"_id": id_})
    assert not cs0.has_next(), "Do not expect any results"
    _check_events(cs1, [(16, "insert")])
    _check_events(cs1, [(16, "delete"), (20, "delete"), (21, "delete"), (22, "delete"),
                        (23, "delete"), (24, "delete"), (25, "delete"), (-6, "insert"),
                        (6, "insert")])
    _check_events(cs_new, [(20, "insert"), (21, "insert"), (22, "insert"), (23, "insert"),
                           (24, "insert"), (25, "insert"), (16, "insert"), (26, "insert")])
    assert not cs0.has_next()
    assert not cs1.has_next()
    assert not cs_new.has_next()
