"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_empty_apply_ops.js` @
4834d4842935ff0a00fbe9a12997408a035671af: a cross-shard transaction in which shard0 only runs
a no-op (a `$setOnInsert` on an existing document: an empty prepared `applyOps`) and shard1 an
update gives a collection, a whole-db and a whole-cluster stream one event each, the update
(SERVER-50769)."""

from __future__ import annotations

from pymongo.read_concern import ReadConcern
from sharding_util import watch, watch_cluster, watch_db

DB = "test"
COLL = "change_stream_empty_apply_ops"


def test_change_stream_empty_apply_ops(st):
    s = st.s
    db = s[DB]
    coll = db[COLL]
    s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    coll.create_index({"shard": 1})
    st.shard_coll(coll, {"shard": 1}, {"shard": 2}, {"shard": 2}, DB, True)
    coll.insert_one({"shard": 1})
    coll.insert_one({"shard": 2})

    streams = [watch(coll), watch_db(db), watch_cluster(s)]
    with s.start_session(causal_consistency=True) as session:
        session.start_transaction(read_concern=ReadConcern("majority"))
        coll.find_one_and_update({"shard": 1}, {"$setOnInsert": {"a": 1}}, session=session)
        coll.find_one_and_update({"shard": 2}, {"$set": {"a": 1}}, session=session)
        session.commit_transaction()
    for cs in streams:
        change = cs.soon_next()
        assert change["documentKey"]["shard"] == 2
        assert change["operationType"] == "update"
        assert not cs.has_next()
