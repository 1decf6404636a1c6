"""Translated from mongodb/mongo `jstests/change_streams/shell_helper.js`, the index's newest
revision (ES-module imports; its batchSize stream's $match lets the resume point through with
`{_id: resumeToken}`, which 8.0 requires; the revision cited by the index as
01ed0776388cc8cff83a82e3671d313b00d5096d predates that): what the shell's `watch()` helper sends
and reads
(through `ShellCursor`, the shell's cursor): no options, a pipeline, resumeAfter / startAfter /
startAtOperationTime, updateLookup, batchSize (batches of 2 on aggregate and getMore),
maxAwaitTimeMS (a getMore with maxTimeMS 500), the drop and invalidate that close the cursor,
and startAfter the invalidate (with a simple collation).

Left out: the first step, `setParameter` of `logLevel` (a server parameter cdcserver does not
have; it changes no reply)."""

from __future__ import annotations

from typing import Any

from cst import ShellCursor, assert_change_stream_event_eq

COLL = "change_stream_shell_helper"
NS = {"db": "test", "coll": COLL}


def _check_next(cursor: ShellCursor, expected: dict[str, Any]) -> dict[str, Any]:
    cursor.soon_has_next()
    event = cursor.next()
    assert_change_stream_event_eq(event, expected)
    return event


def test_shell_helper(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]

    def watch(pipeline: list | None = None, **options: Any) -> ShellCursor:
        return ShellCursor(coll, pipeline or [], **options)

    # watch() without options.
    cursor = watch()
    assert not cursor.has_next()
    coll.insert_one({"_id": 0, "x": 1})
    cursor.soon_has_next()
    change = cursor.next()
    assert not cursor.has_next()
    resume_token = change.pop("_id")
    del change["clusterTime"], change["wallTime"]
    assert change == {"documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "x": 1}, "ns": NS,
                      "operationType": "insert"}

    # With a pipeline: the event's clusterTime is the insert's operationTime.
    cursor = watch([{"$project": {"clusterTime": 1, "docId": "$documentKey._id"}}])
    resume_time = db.command({"insert": COLL, "documents": [{"_id": 1, "x": 1}]})[
        "operationTime"]
    event = _check_next(cursor, {"docId": 1})
    assert event["clusterTime"] == resume_time

    project = [{"$project": {"docId": "$documentKey._id"}}]
    _check_next(watch(project, resumeAfter=resume_token), {"docId": 1})
    _check_next(watch(project, startAfter=resume_token), {"docId": 1})
    _check_next(watch(project, startAtOperationTime=resume_time), {"docId": 1})

    # updateLookup.
    cursor = watch(fullDocument="updateLookup")
    coll.update_one({"_id": 0}, {"$set": {"x": 10}})
    _check_next(cursor, {"documentKey": {"_id": 0}, "fullDocument": {"_id": 0, "x": 10},
                         "ns": NS, "operationType": "update",
                         "updateDescription": {"removedFields": [], "updatedFields": {"x": 10},
                                               "truncatedArrays": []}})

    # batchSize: 2 on the aggregate and on each getMore.
    for _ in range(5):
        coll.update_one({"_id": 1}, {"$inc": {"x": 1}})
    cursor = watch([{"$match": {"$or": [{"_id": resume_token}, {
        "documentKey": {"_id": 1}, "operationType": "update"}]}}],
        batch_size=2, resumeAfter=resume_token)
    assert cursor.objs_left_in_batch() == 2
    for _ in range(2):
        assert cursor.has_next()
        cursor.next()
    assert cursor.objs_left_in_batch() == 0
    assert cursor.has_next()
    assert cursor.objs_left_in_batch() == 2
    for _ in range(2):
        assert cursor.has_next()
        cursor.next()
    assert cursor.objs_left_in_batch() == 0
    assert cursor.has_next()  # more changes, not in this batch

    # maxAwaitTimeMS: the helper's getMore carries maxTimeMS 500; nothing comes.
    cursor = watch()
    reply = db.command({"getMore": cursor.id, "collection": COLL, "maxTimeMS": 500},
                       session=cursor.session)
    assert reply["cursor"]["nextBatch"] == [] and reply["cursor"]["id"] == cursor.id

    # The drop: a drop event, then the invalidate that closes the cursor.
    cursor = watch([{"$project": {"clusterTime": 0}}])
    coll.insert_one({"_id": 2, "x": 1})
    _check_next(cursor, {"documentKey": {"_id": 2}, "fullDocument": {"_id": 2, "x": 1},
                         "ns": NS, "operationType": "insert"})
    assert not cursor.has_next()
    assert not cursor.is_exhausted()
    db.drop_collection(COLL)
    cursor.soon_has_next()
    assert not cursor.is_exhausted()
    _check_next(cursor, {"operationType": "drop", "ns": NS})
    cursor.soon_has_next()
    invalidate = cursor.next()
    assert invalidate["operationType"] == "invalidate"
    assert cursor.is_exhausted()

    # startAfter the invalidate, with a simple collation: the next insert.
    coll.insert_one({"_id": "After drop"})
    session = client.start_session()  # the cursor's, for its getMores too
    reply = db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {
        "startAfter": invalidate["_id"]}}], "collation": {"locale": "simple"}, "cursor": {}},
        session=session)
    resumed = ShellCursor(coll, reply=reply, session=session)
    resumed.soon_has_next()
    assert resumed.next()["documentKey"]["_id"] == "After drop"
