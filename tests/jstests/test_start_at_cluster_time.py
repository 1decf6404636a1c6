"""Translated from mongodb/mongo `jstests/change_streams/start_at_cluster_time.js` @
134a4083953270e8a11430395357fb70a29047ad: startAtOperationTime is inclusive, is not allowed
with resumeAfter (40674), and a time in the future waits for it."""

from __future__ import annotations

from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo import WriteConcern
from pymongo.errors import OperationFailure

COLL = "start_at_cluster_time"


def test_start_at_cluster_time(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    test_start = db.command("isMaster")["$clusterTime"]["clusterTime"]

    majority = coll.with_options(write_concern=WriteConcern(w="majority"))
    majority.insert_one({"_id": -1})
    majority.insert_one({"_id": 1})

    finder = coll.watch()
    coll.update_one({"_id": -1}, {"$set": {"updated": True}})
    coll.update_one({"_id": 1}, {"$set": {"updated": True}})
    event = finder.next()
    assert event["operationType"] == "update"
    assert event["documentKey"] == {"_id": -1}
    time_of_first_update = event["clusterTime"]

    # Inclusive of the first update.
    stream = coll.watch([], start_at_operation_time=time_of_first_update)
    event = stream.next()
    assert (event["operationType"], event["documentKey"]["_id"]) == ("update", -1)
    event = stream.next()
    assert (event["operationType"], event["documentKey"]["_id"]) == ("update", 1)

    with pytest.raises(OperationFailure) as raised:
        db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {
            "startAtOperationTime": time_of_first_update, "resumeAfter": event["_id"]}}],
            "cursor": {}})
    assert raised.value.code == 40674

    # Six hours in the future.
    now = db.command("isMaster")["$clusterTime"]["clusterTime"]
    future = coll.watch([], start_at_operation_time=Timestamp(now.time + 60 * 60 * 6, 1))

    stream = coll.watch([], start_at_operation_time=test_start)
    for op, _id in [("insert", -1), ("insert", 1), ("update", -1), ("update", 1)]:
        event = stream.next()
        assert (event["operationType"], event["documentKey"]["_id"]) == (op, _id)

    assert future.try_next() is None
