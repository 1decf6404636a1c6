"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_resume_shard_key_change.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011: a collection stream sees an insert while the
collection is unsharded (documentKey `{_id}`), sharded on `shardField1` (`{shardField1, _id}`)
and refined to `{shardField1, shardField2}` (`{shardField1, shardField2, _id}`), and a stream
resumed after each of those events returns exactly the ones after it, with the same keys."""

from __future__ import annotations

import bson
from sharding_util import watch

DOCS = [
    {"_id": 0, "shardField1": 0, "shardField2": 0},
    {"_id": 1, "shardField1": 1, "shardField2": 0},
    {"_id": 2, "shardField1": 1, "shardField2": 1},
    {"_id": 3, "shardField1": 0, "shardField2": 1},
]
DOC_KEYS = [
    {"_id": 0},
    {"shardField1": 1, "_id": 1},
    {"shardField1": 1, "shardField2": 1, "_id": 2},
    {"shardField1": 0, "shardField2": 1, "_id": 3},
]


def _doc_eq(actual: list, expected: list) -> bool:
    """assert.docEq: field order counts."""
    return [bson.encode(d) for d in actual] == [bson.encode(d) for d in expected]


def test_change_stream_resume_shard_key_change(st):
    db = st.s.testDB
    coll = db.testColl
    cs = watch(coll)
    coll.insert_one(dict(DOCS[0]))
    coll.create_index({"shardField1": 1})
    st.shard_coll(coll, {"shardField1": 1}, {"shardField1": 1}, {"shardField1": 1}, "testDB",
                  True)
    coll.insert_one(dict(DOCS[1]))
    coll.create_index({"shardField1": 1, "shardField2": 1})
    st.s.admin.command({"refineCollectionShardKey": "testDB.testColl",
                        "key": {"shardField1": 1, "shardField2": 1}})
    coll.insert_one(dict(DOCS[2]))
    coll.insert_one(dict(DOCS[3]))

    def verify(stream, start: int) -> list:
        changes = [stream.soon_next() for _ in range(len(DOCS) - start)]
        assert not stream.has_next()
        assert _doc_eq([c["fullDocument"] for c in changes], DOCS[start:])
        assert _doc_eq([c["documentKey"] for c in changes], DOC_KEYS[start:])
        return changes

    changes = verify(cs, 0)
    for i, change in enumerate(changes):
        verify(watch(coll, resumeAfter=change["_id"]), i + 1)
