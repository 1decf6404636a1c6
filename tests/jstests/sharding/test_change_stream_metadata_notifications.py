"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_metadata_notifications.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: a stream on a collection sharded on `shardKey` across
two shards sees the writes before a drop, then `drop` and `invalidate`; a stream resumed from
before the drop whose `$match` filters out everything still ends at the drop's invalidate (its
token is the cursor's last); resuming with and without an explicit collation, also after the
collection is recreated and resharded (a new UUID); `dropDatabase` of an unsharded collection's
database gives `drop` then `invalidate` to its collection stream."""

from __future__ import annotations

from sharding_util import watch

NAME = "change_stream_metadata_notifications"


def test_change_stream_metadata_notifications(st):
    s = st.s
    db = s[NAME]
    coll = db[NAME]
    ns = f"{NAME}.{NAME}"
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    s.admin.command("shardCollection", ns, key={"shardKey": 1})
    s.admin.command("split", ns, middle={"shardKey": 0})
    s.admin.command("moveChunk", ns, find={"shardKey": 1}, to=st.rs_url(1))
    coll.insert_one({"shardKey": -1, "_id": -1})
    coll.insert_one({"shardKey": 1, "_id": 1})

    cs = watch(coll)
    coll.update_one({"shardKey": -1, "_id": -1}, {"$set": {"updated": True}})
    coll.update_one({"shardKey": 1, "_id": 1}, {"$set": {"updated": True}})
    coll.insert_one({"shardKey": 2, "_id": 2})
    coll.drop()

    event = cs.soon_next()
    assert event["operationType"] == "update"
    assert event["documentKey"]["shardKey"] == -1
    resume_from_first_update = event["_id"]
    event = cs.soon_next()
    assert event["operationType"] == "update"
    assert event["documentKey"]["shardKey"] == 1
    event = cs.soon_next()
    assert event["operationType"] == "insert"
    assert event["documentKey"]["_id"] == 2
    event = cs.soon_next()
    assert event["operationType"] == "drop"
    assert event["ns"] == {"db": NAME, "coll": NAME}
    event = cs.soon_next()
    assert event["operationType"] == "invalidate"
    drop_invalidate_token = event["_id"]
    assert not cs.has_next()
    assert cs.is_exhausted()

    # Everything filtered out: the cursor still ends with the invalidate's token.
    resumed = watch(coll, [{"$match": {"operationType": "DummyOperationType"}}],
                    resumeAfter=resume_from_first_update)
    resumed.soon_exhausted()
    assert resumed.get_resume_token() == drop_invalidate_token

    cs = watch(coll, resumeAfter=resume_from_first_update, collation={"locale": "simple"})
    event = cs.soon_next()
    assert event["operationType"] == "update"
    assert event["documentKey"] == {"shardKey": 1, "_id": 1}
    event = cs.soon_next()
    assert event["operationType"] == "insert"
    assert event["documentKey"] == {"shardKey": 2, "_id": 2}
    event = cs.soon_next()
    assert event["operationType"] == "drop"
    assert event["ns"] == {"db": NAME, "coll": NAME}
    assert cs.soon_next()["operationType"] == "invalidate"
    assert not cs.has_next()
    assert cs.is_exhausted()

    resume = {"aggregate": NAME, "cursor": {},
              "pipeline": [{"$changeStream": {"resumeAfter": resume_from_first_update}}]}
    db.command(resume)

    # Recreated and resharded: a new UUID, which a resume without collation ignores.
    db.create_collection(NAME)
    s.admin.command("shardCollection", ns, key={"shardKey": 1})
    db.command(resume)

    # Recreated unsharded; dropDatabase gives its stream "drop" then "invalidate".
    db.drop_collection(NAME)
    db.create_collection(NAME)
    cs = watch(coll)
    s.drop_database(NAME)
    event = cs.soon_next()
    resume_after_db_drop = event["_id"]
    assert event["operationType"] == "drop"
    assert event["ns"] == {"db": NAME, "coll": NAME}
    event = cs.soon_next()
    assert event["operationType"] == "invalidate"
    assert not cs.has_next()
    assert cs.is_exhausted()
    db_drop_invalidate_token = event["_id"]

    resumed = watch(coll, [{"$match": {"operationType": "DummyOperationType"}}],
                    resumeAfter=resume_after_db_drop)
    resumed.soon_exhausted()
    assert resumed.get_resume_token() == db_drop_invalidate_token
