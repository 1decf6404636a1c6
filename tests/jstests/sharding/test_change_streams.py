"""Translated from mongodb/mongo `jstests/sharding/query/change_streams/change_streams.js` @
591928c6193659fc8e1bf6a9ea0b234d3ac25b67: change streams on a collection sharded across two
shards (chunks [MinKey, 0) on shard0, [0, MaxKey) on shard1), once with `_id` as the shard
key and once with `non_id`: `$sort` / `$group` / `$out` after `$changeStream` are 20
IllegalOperation; inserts on both shards come in cluster-time order; a multi-update's events
come from both shards; a drop gives `drop` then `invalidate` and closes the cursor; a stream
resumes from before the drop, with and without an explicit simple collation.

Left out: the config server's `periodicNoopIntervalSecs` (no config server here), toggling the
shards' `writePeriodicNoops` (an idle embedded shard never holds an event back) and the mongos
`internalQueryProhibitMergingOnMongoS` parameter (not a cdcserver parameter; it changes no
reply for a change stream)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import assert_change_stream_event_eq, canonicalize_event_for_testing, event_eq
from pymongo.errors import OperationFailure
from sharding_util import watch

DB = "change_streams"


def _assert_error_code(coll: Any, pipeline: list[Any], code: int) -> None:
    with pytest.raises(OperationFailure) as err:
        coll.database.command({"aggregate": coll.name, "pipeline": pipeline, "cursor": {}})
    assert err.value.code == code, err.value.details


@pytest.mark.parametrize(("coll_name", "shard_key"), [
    ("with_id_shard_key", "_id"), ("with_non_id_shard_key", "non_id")])
def test_change_streams(st, coll_name, shard_key):
    s = st.s
    s.admin.command({"enableSharding": DB, "primaryShard": st.shard0})
    db = s[DB]
    coll = db[coll_name]
    ns = {"db": DB, "coll": coll_name}

    _assert_error_code(db.NegativeTest, [{"$changeStream": {}}, {"$sort": {"operationType": 1}}],
                       20)
    _assert_error_code(db.NegativeTest, [{"$changeStream": {}},
                                         {"$group": {"_id": "$documentKey"}}], 20)
    _assert_error_code(coll, [{"$changeStream": {}}, {"$out": "shouldntWork"}], 20)

    def key(value: Any) -> dict[str, Any]:
        return {shard_key: value}

    def doc(value: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {} if shard_key == "_id" else {"_id": value}
        out[shard_key] = value
        out.update(extra or {})
        return out

    st.shard_coll(coll, key(1), key(0), key(1))
    coll.insert_one(doc(-1))
    coll.insert_one(doc(1))

    cs = watch(coll)
    coll.insert_one(doc(1000))
    coll.insert_one(doc(-1000))
    assert_change_stream_event_eq(cs.soon_next(), {
        "documentKey": doc(1000), "fullDocument": doc(1000), "ns": ns,
        "operationType": "insert"})
    coll.insert_one(doc(1001))
    assert_change_stream_event_eq(cs.soon_next(), {
        "documentKey": doc(-1000), "fullDocument": doc(-1000), "ns": ns,
        "operationType": "insert"})
    assert_change_stream_event_eq(cs.soon_next(), {
        "documentKey": doc(1001), "fullDocument": doc(1001), "ns": ns,
        "operationType": "insert"})
    cs.close()

    # Multi-update: one event from each shard, in either order.
    coll.insert_one(doc(10, {"a": 0, "b": 0}))
    coll.insert_one(doc(-10, {"a": 0, "b": 0}))
    cs = watch(coll)
    coll.update_many({"a": 0}, {"$set": {"b": 2}})
    expected = [
        {"operationType": "update", "ns": ns, "documentKey": doc(v),
         "updateDescription": {"updatedFields": {"b": 2}, "removedFields": [],
                               "truncatedArrays": []}}
        for v in (-10, 10)]
    actual = [canonicalize_event_for_testing(cs.soon_next(), e) for e in expected]
    cs.close()
    for event in actual:
        assert any(event_eq(event, e, lambda a, _e: a) for e in expected), actual
    assert not event_eq(actual[0], actual[1], lambda a, _e: a)

    coll.delete_many({})
    coll.insert_one(doc(0, {"a": 1}))
    cs = watch(coll)
    assert not cs.has_next()

    # A drop: "drop", then "invalidate", and the cursor is closed.
    coll.drop()
    assert cs.soon_next()["operationType"] == "drop"
    assert cs.soon_next()["operationType"] == "invalidate"
    assert not cs.has_next()
    assert cs.is_exhausted()

    # The aggregate closes a cursor at an invalidate too; resume from before the drop.
    st.shard_coll(coll, key(1), key(0), key(1))
    coll.insert_one(doc(-1))
    coll.insert_one(doc(1))
    cs = watch(coll)
    assert not cs.has_next()
    coll.insert_one(doc(-2))
    coll.insert_one(doc(2))
    resume_token = cs.soon_next()["_id"]
    coll.drop()
    inserted_2 = {"documentKey": doc(2), "fullDocument": doc(2), "ns": ns,
                  "operationType": "insert"}
    assert_change_stream_event_eq(cs.soon_next(), inserted_2)
    assert cs.soon_next()["operationType"] == "drop"
    assert cs.soon_next()["operationType"] == "invalidate"

    cs = watch(coll, resumeAfter=resume_token, collation={"locale": "simple"})
    assert_change_stream_event_eq(cs.soon_next(), inserted_2)
    assert cs.soon_next()["operationType"] == "drop"
    assert cs.soon_next()["operationType"] == "invalidate"

    db.command({"aggregate": coll_name, "pipeline": [{"$changeStream": {
        "resumeAfter": resume_token}}], "cursor": {}})
