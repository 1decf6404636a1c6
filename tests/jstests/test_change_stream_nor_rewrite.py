"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_nor_rewrite.js` @
a4f458fe4d7a44eba056f5c150753e73067c8e4d (SERVER-78650: a `$nor` none of whose children can
be rewritten into the oplog filter must not fail): the stream returns the insert. Run opened
before the insert as the jstest does (the stream joins a filter group) and, as well, resumed
from a token taken before it (its own pipeline). Nothing left out."""

from __future__ import annotations

from typing import Any

import pytest

MATCH = {"$match": {"$nor": [{"a": {"$exists": True}}, {"b": {"$exists": True}}]}}


@pytest.mark.parametrize("resumed", [False, True], ids=["live", "resumed"])
def test_nor_rewrite(client: Any, resumed: bool) -> None:
    coll = client["test"]["change_stream_nor_rewrite"]
    coll.drop()
    with coll.watch([]) as before:
        token = before.resume_token
    watch = coll.watch([MATCH], resume_after=token if resumed else None)
    coll.insert_one({"_id": 1})
    if resumed:
        watch.close()
        watch = coll.watch([MATCH], resume_after=token)
    event = watch.next()
    assert event["operationType"] == "insert"
    assert event["documentKey"]["_id"] == 1
    watch.close()
