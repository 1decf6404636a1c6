"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_update_lookup_too_many_matching_documents.js`
@ 0115e8f372d27483cc3be3cb8c5fb0bcc1a2e950 (`assertChangeStreamThrowsCode`: `cst.py`): an update
written while the collection was unsharded (documentKey `{_id: 1}`), replayed with
`updateLookup` after the collection was sharded on `{b: 1}` and a second `_id: 1` document was
inserted on the other shard, is 280 ChangeStreamFatalError ("found more than one document"),
not a crash or a wrong document."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

NAME = "change_stream_update_lookup_too_many_matching_documents"


def test_scattered_duplicate_id_lookup_is_280(st):
    s = st.s
    db = s[NAME]
    coll = db.coll
    s.admin.command({"enableSharding": NAME, "primaryShard": st.shard0})
    coll.create_index({"b": 1})
    coll.insert_one({"_id": 1, "b": -100})
    start = db.command("ping")["$clusterTime"]["clusterTime"]
    coll.update_one({"_id": 1}, {"$set": {"updated": True}})
    s.admin.command("shardCollection", f"{NAME}.coll", key={"b": 1})
    s.admin.command("split", f"{NAME}.coll", middle={"b": 0})
    s.admin.command("moveChunk", f"{NAME}.coll", find={"b": 0}, to=st.shard1)
    coll.insert_one({"_id": 1, "b": 100})

    pipeline = [{"$changeStream": {"startAtOperationTime": start,
                                   "fullDocument": "updateLookup"}}]
    with pytest.raises(OperationFailure) as err:
        reply = db.command({"aggregate": "coll", "pipeline": pipeline, "cursor": {}})
        for _ in range(30):
            batch = db.command({"getMore": reply["cursor"]["id"], "collection": "coll",
                                "maxTimeMS": 100})["cursor"]["nextBatch"]
            assert not batch, f"Unexpected result from cursor: {batch!r}"
    assert err.value.code == 280, err.value.details
    assert "found more than one document" in str(err.value.details["errmsg"]), err.value.details
