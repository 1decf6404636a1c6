"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_update_lookup_sharded_insert_update.js`
@ 1269a90355d914d4593c80b50bb6228d19de1966: on a collection sharded on `sk`, an `_id` with a
`$`-prefixed field is 52 DollarPrefixedFieldName; a document whose shard key value is an object
with a `$`-prefixed field (`{$type: 2}`, `{$operatorDoesNotExist: 2}`) is inserted, found, and
a stream started before it returns its insert and, with `updateLookup`, its update's document:
on the shard that wrote the entry, and after both chunks moved to shard1 ("remote lookup").

Left out: the `forceAggregationSingleDocumentLookupExecutor` fail point (it picks mongod's
lookup executor; the events are the same)."""

from __future__ import annotations

import bson
import pytest
from pymongo.errors import OperationFailure
from sharding_util import watch

NAME = "change_stream_update_lookup_sharded_insert_update"


@pytest.fixture
def coll(st):
    db = st.s[NAME]
    st.s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    st.s.admin.command("shardCollection", f"{NAME}.{NAME}", key={"sk": 1})
    return db[NAME]


def test_prohibits_an_id_with_dollar_prefixed_fields(coll):
    with pytest.raises(OperationFailure) as err:
        coll.insert_one({"_id": {"$v": 2}, "sk": 1, "val": "original"})
    assert err.value.code == 52, err.value.details


@pytest.mark.parametrize(("doc", "remote"), [
    ({"_id": 1, "sk": {"$type": 2}, "val": "original"}, False),
    ({"_id": 1, "sk": {"$type": 2}, "val": "original"}, True),
    ({"_id": 1, "sk": {"$operatorDoesNotExist": 2}, "val": "original"}, False),
], ids=["local_lookup", "remote_lookup", "unknown_operator"])
def test_dollar_prefixed_shard_key_field(st, coll, doc, remote):
    start = st.s[NAME].command("ping")["$clusterTime"]["clusterTime"]
    coll.insert_one(dict(doc))
    found = list(coll.find({"_id": doc["_id"]}))
    assert len(found) == 1 and bson.encode(found[0]) == bson.encode(doc)
    coll.update_one({"_id": doc["_id"]}, {"$set": {"val": "changed"}})
    if remote:
        for split_point in (-1, 1):
            st.s.admin.command({"moveChunk": f"{NAME}.{NAME}",
                                "find": {"sk": {"test": split_point}}, "to": st.rs_url(1),
                                "_waitForDelete": True})
    cs = watch(coll, startAtOperationTime=start, fullDocument="updateLookup")
    event = cs.soon_next()
    assert event["operationType"] == "insert", event
    assert event["fullDocument"] == doc
    event = cs.soon_next()
    assert event["operationType"] == "update", event
    assert event["fullDocument"] == {**doc, "val": "changed"}
    cs.close()
