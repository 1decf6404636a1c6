"""Translated from mongodb/mongo `jstests/change_streams/filter_excludes_resume_point.js` @
5e7837f72a8a9261f2720ef19e8931ddd5a98284: a stream whose $match filters out its own resume
point fails with ChangeStreamFatalError (280), since the token is never seen again."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

CHANGE_STREAM_FATAL_ERROR = 280
COLL = "filter_excludes_resume_point"


def test_filter_excludes_resume_point(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]

    cs1 = coll.watch()
    coll.insert_many([{"_id": 1}, {"_id": 2}])
    event1 = cs1.next()
    cs1.next()

    # Filter out the resume point (SERVER-71565) while projecting out '_id'.
    cs2 = coll.watch(
        [{"$match": {"fullDocument._id": {"$gt": 1}}}, {"$project": {"fullDocument": 1, "_id": 0}}],
        resume_after=event1["_id"], batch_size=0,
    )
    with pytest.raises(OperationFailure) as raised:
        cs2.try_next()
    assert raised.value.code == CHANGE_STREAM_FATAL_ERROR


def test_filter_alone_excludes_resume_point(client: Any) -> None:
    """Not in the jstest: its stream without the `$project`, so that the 280 can only come from
    the reason the jstest gives (the filtered-out resume token is never seen), not from the
    projected-out `_id`."""
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    cs1 = coll.watch()
    coll.insert_many([{"_id": 1}, {"_id": 2}])
    event1 = cs1.next()
    cs2 = coll.watch([{"$match": {"fullDocument._id": {"$gt": 1}}}],
                     resume_after=event1["_id"], batch_size=0)
    with pytest.raises(OperationFailure) as raised:
        cs2.try_next()
    assert raised.value.code == CHANGE_STREAM_FATAL_ERROR
    assert "the resume token was not found" in raised.value.details["errmsg"]
