"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_streams_update_lookup_shard_metadata_missing.js`
@ 3c86964f0f9dd44d8264f1f9ada8e3275fa93fe0: on a collection sharded on `{a: 1}` across two
shards, a `{multi: true}` update by `_id` logs the document's full shard key, so `updateLookup`
from a stream resumed before it finds the updated document, also once another document with
the same `_id` lives on the other shard (no 280, no TooManyMatchingDocuments: SERVER-44598).

Left out: the step-up of shard0's secondary, which has no sharding metadata loaded when the
update reaches it (each embedded shard is one node and keeps the catalog's routing)."""

from __future__ import annotations

import bson
from sharding_util import watch

NAME = "change_streams_update_lookup_shard_metadata_missing"


def test_update_lookup_with_shard_metadata_missing(st):
    s = st.s
    coll = s[NAME].test
    s.admin.command({"enableSharding": NAME, "primaryShard": st.rs_url(0)})
    st.shard_coll(coll, {"a": 1}, {"a": 0}, {"a": 1})
    cs = watch(coll)
    coll.insert_one({"_id": 0, "a": -100})
    resume_token = cs.soon_next()["_id"]

    coll.update_many({"_id": 0}, {"$set": {"updated": True}})
    expected = bson.encode({"_id": 0, "a": -100, "updated": True})
    cs = watch(coll, resumeAfter=resume_token, fullDocument="updateLookup")
    assert bson.encode(cs.soon_next()["fullDocument"]) == expected

    coll.insert_one({"_id": 0, "a": 100})
    cs = watch(coll, resumeAfter=resume_token, fullDocument="updateLookup")
    assert bson.encode(cs.soon_next()["fullDocument"]) == expected
