"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/projection_changes_type.js` @
1471d6dfadf06fd8db47be942992b8a60c2eb764 (SERVER-65497): a `$project` or `$addFields` after
the stream that keeps the event fields but changes their types (objects and arrays emptied,
numbers to strings, every other scalar to int 1; `_id` kept) neither fails nor loses an event:
each projected stream returns the `_id`s of the whole workload's events (the
`rewrite_util.py` workload, with its renames, drop and dropDatabase), for each field alone and
for the fields accumulated so far. The jstest shuffles the fields with a seed from the
server's git hash; here with a fixed seed. Nothing else left out (no explain assertions)."""

from __future__ import annotations

import random
from typing import Any

from bson.int64 import Int64
from rewrite_util import (
    cluster_time,
    generate_change_stream_write_workload,
    get_all_change_stream_events,
)

DB = "projection_changes_type"
OPTIONS = {"show_expanded_events": True}


def _changed(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return {"$literal": []}
    if isinstance(value, dict):
        return {"$literal": {}}
    if isinstance(value, (int, float)) and not isinstance(value, (bool, Int64)):
        return {"$literal": "dummy_value"}  # a JavaScript number
    return {"$literal": 1}


def test_projection_changes_type(client: Any) -> None:
    start_point = cluster_time(client)
    generate_change_stream_write_workload(client, DB, "coll1", include_invalidating_events=True)
    end_point = cluster_time(client)
    cluster_time(client)
    full = get_all_change_stream_events(client, [], OPTIONS, start_point, end_point)
    assert full, "expecting fullEvents to be non-empty"
    assert any(e["operationType"] == "dropDatabase" for e in full)
    projection: dict[str, Any] = {}
    for event in full:
        for name, value in event.items():
            if name != "_id" and name not in projection:
                projection[name] = _changed(value)

    def assert_projection(spec: dict[str, Any]) -> None:
        for stage in ("$project", "$addFields"):
            projected = get_all_change_stream_events(
                client, [{stage: spec}], OPTIONS, start_point, end_point)
            assert [e["_id"] for e in projected] == [e["_id"] for e in full], (stage, spec)

    fields = list(projection)
    random.Random(20).shuffle(fields)
    accumulated: dict[str, Any] = {}
    for name in fields:
        assert_projection({name: projection[name]})
        accumulated[name] = projection[name]
        assert_projection(dict(accumulated))
