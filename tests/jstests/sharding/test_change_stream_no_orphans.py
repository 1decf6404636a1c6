"""Translated from mongodb/mongo `jstests/sharding/query/change_streams/change_stream_no_orphans.js`
@ 4834d4842935ff0a00fbe9a12997408a035671af, its part that needs no fail point: writes sent
to shard0 directly on a document of a range that shard1 owns (an orphan: inserted, updated,
then deleted there) give a collection stream through mongos no event (the stream's resume
token advances past them), and change shard0's copy.

Left out: every case on orphans left behind by a migration (the jstest keeps them with the
`suspendRangeDeletion` fail point, which cdcserver does not have: its range deletion runs as the
migration commits), i.e. the direct writes on two orphans, the broadcast updates and deletes,
and the transactions through mongos and on the shard. Its `writePeriodicNoops` shards: a
no-op written on each shard (`appendOplogNote`) before each getMore of `assertNoChanges`."""

from __future__ import annotations

from cst import SOON_TRIES, wo_compare
from sharding_util import watch

NS = "test.foo"


def _periodic_noops(st) -> None:
    """What the jstest's `writePeriodicNoops` (every second) writes on each shard: a no-op
    (`appendOplogNote`, as mongod's NoopWriter), so the shards' post-batch tokens can move on
    (a token never passes the newest oplog entry; the embedded shards write no no-ops)."""
    for k in range(len(st.server.cluster.shards)):
        st.rs(k).admin.command({"appendOplogNote": 1, "data": {"msg": "periodic noop"}})


def _assert_no_changes(st, cs) -> None:
    """`assertNoChanges`: no event, and the resume token moves past where it was."""
    assert not cs.has_next(), cs.batch
    start = cs.get_resume_token()
    for _ in range(SOON_TRIES):
        _periodic_noops(st)
        assert not cs.has_next(), cs.batch
        if wo_compare(cs.get_resume_token(), start) > 0:
            return
    raise AssertionError("the resume token did not advance")


def test_change_stream_no_orphans(st):
    s = st.s
    s.admin.command({"enableSharding": "test", "primaryShard": st.shard0})
    s.admin.command("shardCollection", NS, key={"_id": 1})
    coll = s.test.foo
    for doc in ({"_id": -2, "name": "emma", "age": 20}, {"_id": -1, "name": "olivia", "age": 25},
                {"_id": 0, "name": "matt", "age": 30}, {"_id": 1, "name": "matt", "age": 35},
                {"_id": 6, "name": "liam", "age": 60}):
        coll.insert_one(doc)
    s.admin.command("split", NS, middle={"_id": 0})
    s.admin.command("moveChunk", NS, find={"_id": 0}, to=st.shard1)
    cs = watch(coll)
    direct = st.rs(0).test.foo

    direct.insert_one({"_id": 7, "name": "ken", "age": 65})
    _assert_no_changes(st, cs)
    assert direct.find_one({"_id": 7}) is not None

    direct.update_one({"name": "ken"}, {"$set": {"age": 66}})
    _assert_no_changes(st, cs)
    assert direct.find_one({"_id": 7})["age"] == 66

    direct.delete_one({"name": "ken"})
    _assert_no_changes(st, cs)
    assert direct.find_one({"_id": 7}) is None

    # The stream is alive: an owned document's write is seen.
    coll.update_one({"_id": 6}, {"$set": {"age": 61}})
    assert cs.soon_next()["operationType"] == "update"
