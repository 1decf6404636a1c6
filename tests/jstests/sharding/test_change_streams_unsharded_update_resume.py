"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_unsharded_update_resume.js` @
73612feca6a62839d9856a055eb2254e9109aee5: the post-image of an update written while the
collection was unsharded (documentKey `{_id}` only) is still looked up once the collection is
sharded on `{a: 1}` and split across the shards (SERVER-44484); once a second document with the
same `_id` lives on the other shard, that lookup is 280 ChangeStreamFatalError."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure
from sharding_util import watch

NAME = "change_streams_unsharded_update_resume"


def test_change_streams_unsharded_update_resume(st):
    coll = st.s[NAME].test
    cs = watch(coll, fullDocument="updateLookup")
    coll.insert_one({"_id": 0, "a": -100})
    insert_event = cs.soon_next()
    assert insert_event["operationType"] == "insert"
    coll.update_one({"_id": 0}, {"$set": {"updated": True}})
    update_event = cs.soon_next()
    assert update_event["operationType"] == "update"
    assert update_event["fullDocument"] == {"_id": 0, "a": -100, "updated": True}

    coll.create_index({"a": 1})
    st.shard_coll(coll, {"a": 1}, {"a": 0}, {"a": 0})
    cs = watch(coll, resumeAfter=insert_event["_id"], fullDocument="updateLookup")
    update_event = cs.soon_next()
    assert update_event["operationType"] == "update"
    assert update_event["fullDocument"] == {"_id": 0, "a": -100, "updated": True}

    coll.insert_one({"_id": 0, "a": 100})  # the same _id, on the other shard
    with pytest.raises(OperationFailure) as err:
        cs = watch(coll, resumeAfter=insert_event["_id"], fullDocument="updateLookup")
        cs.soon_has_next()
        raise AssertionError(f"an event: {cs.next()!r}")
    assert err.value.code == 280, err.value.details
