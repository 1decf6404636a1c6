"""What the `oplog_rewrite/*.js` jstests get from `jstests/libs/change_stream_rewrite_util.js` and
`jstests/libs/query/change_stream_oplog_rewrite_test.js` (mongodb/mongo @
124eb7f41bfe3082cbe8067503eb02679ab20c6b and 46c73b253b0180167511be1d178de527efa86ad1; facts
learned, code our own).

- `generate_change_stream_write_workload`: the DDL, CRUD and view events of a replica set
  (not a `ShardingTest`: no `shardCollection`, so `documentKey` is `{_id}`).
- `get_all_change_stream_events`: a whole-cluster stream from a cluster time, read until its
  post-batch resume token passes the end point.
- `fields_to_be_tested` / `compare_optimized_and_non_optimized`: every path seen in the events
  (and a `nonExistentField` under each), and, per predicate, the events of `[$match]` against
  those of `[$_internalInhibitOptimization, $match]`.

Besides the jstest's way (every stream resumed from a cluster time: each reads by itself),
`compare_optimized_and_non_optimized(..., live=True)` opens the same streams before the
workload runs, so that those streams differing only in their `$match` share one filter group
(`pipeline_stages/filter_index.py`): the events must be the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import bson
from bson.timestamp import Timestamp
from pymongo import MongoClient

NUM_DOCS = 8
CS_CONFIG = {"full_document": "updateLookup", "show_expanded_events": True}


def generate_change_stream_write_workload(
    client: MongoClient, db_name: str, coll_name: str, num_docs: int = NUM_DOCS,
    include_invalidating_events: bool = False,
) -> Timestamp:
    """`generateChangeStreamWriteWorkload(db, collName, numDocs, includeInvalidatingEvents)`:
    returns the operationTime of its last write (the jstest's `endPoint`)."""
    db = client[db_name]
    db.create_collection(coll_name)
    coll = db[coll_name]
    coll.create_index([("a", 1)])
    db.command({"collMod": coll_name,
                "index": {"keyPattern": {"a": 1}, "hidden": True, "expireAfterSeconds": 500}})
    coll.drop_index([("a", 1)])
    db.command({"collMod": coll_name, "validator": {}, "validationLevel": "off",
                "validationAction": "warn"})
    db.command({"collMod": coll_name, "validator": {}, "validationLevel": "strict",
                "validationAction": "error"})
    for i in range(num_docs):
        coll.insert_one({"_id": i, "shardKey": i, "a": [1, [2], {"b": 3}],
                         "f1": {"subField": True}, "f2": False})
    update_specs: list[list[dict[str, Any]]] = [
        [{"$set": {"f2": True}}],
        [{"$unset": ["f1"]}],
        [{"$set": {"a": [1, [2]]}}],
        [{"$set": {"a": [1, [2]], "f2": True}}, {"$unset": ["f1"]}],
    ]
    for i in range(num_docs // 2):
        coll.update_one({"_id": i, "shardKey": i}, update_specs[i % len(update_specs)])
    for i in range(num_docs // 2, num_docs):
        coll.replace_one({"_id": i, "shardKey": i}, {"_id": i, "shardKey": i})
    for i in range(num_docs // 4):
        coll.delete_one({"_id": i, "shardKey": i})
    db.command({"create": "view", "viewOn": coll_name, "pipeline": []})
    db.command({"collMod": "view", "viewOn": "viewOnView", "pipeline": []})
    reply = db.command({"drop": "view"})
    if include_invalidating_events:
        renamed = f"{coll_name}_renamed"
        client.admin.command("renameCollection", f"{db_name}.{coll_name}",
                             to=f"{db_name}.{renamed}")
        client.admin.command("renameCollection", f"{db_name}.{renamed}",
                             to=f"{db_name}.{coll_name}")
        db.command({"drop": coll_name})
        reply = db.command({"dropDatabase": 1})
    return reply["operationTime"]


def cluster_time(client: MongoClient) -> Timestamp:
    """`getClusterTime(db)`, by a write elsewhere (its operationTime): the `advanceClusterTime`
    of the jstest too, so the streams' post-batch tokens can pass the end point."""
    reply = client["rewrite_util_clock"].command(
        {"insert": "ticks", "documents": [{"t": 1}]})
    return reply["operationTime"]


def next_cluster_time(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


def token_time(token: dict[str, Any]) -> Timestamp:
    """The cluster time at the start of a resume token's KeyString (0x82, then 8 bytes)."""
    data = bytes.fromhex(token["_data"])
    assert data[0] == 0x82, token
    return Timestamp(int.from_bytes(data[1:5], "big"), int.from_bytes(data[5:9], "big"))


def drain(stream: Any, end_point: Timestamp) -> list[dict[str, Any]]:
    """The events of an open stream up to `end_point`: getMores until its post-batch resume
    token is past it (the jstest's loop on `_postBatchResumeToken`)."""
    events: list[dict[str, Any]] = []
    for _ in range(10_000):
        event = stream.try_next()
        if event is not None:
            if token_time(event["_id"]) > end_point:  # (a $project may drop clusterTime)
                break
            events.append(event)
            continue
        token = stream.resume_token
        if token is not None and token_time(token) > end_point:
            break
    else:
        raise AssertionError("the stream's post-batch resume token never passed the end point")
    stream.close()
    return events


def get_all_change_stream_events(
    client: MongoClient, pipeline: list[Any], cs_options: dict[str, Any],
    start_point: Timestamp, end_point: Timestamp,
) -> list[dict[str, Any]]:
    stream = client.watch(pipeline, start_at_operation_time=start_point, max_await_time_ms=1,
                          **cs_options)
    return drain(stream, end_point)


def _is_plain_object(value: Any) -> bool:
    return isinstance(value, dict)


def _traverse_event(event: Any, output: dict[str, dict[str, list]], prefix: str = "") -> None:
    """`traverseEvent`: every path (array indexes too), a `nonExistentField` below each, and
    the first value seen at each path (array elements are values of the array's path)."""
    items = event.items() if isinstance(event, dict) else enumerate(event)
    for name, value in items:
        path = f"{prefix}.{name}" if prefix else str(name)
        output.setdefault(path, {"extraValues": [], "values": []})
        output.setdefault(path + ".nonExistentField", {"extraValues": [], "values": []})

        def add(p: str, v: Any) -> None:
            values = output[p]["values"]
            if not values:  # maxValuesPerPath = 1
                values.append(v)

        add(path, value)
        if _is_plain_object(value):
            _traverse_event(value, output, path)
        if isinstance(value, list):
            for elem in value:
                if _is_plain_object(elem):
                    _traverse_event(elem, output, path)
                else:
                    add(path, elem)
            _traverse_event(value, output, path)


def fields_to_be_tested(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, list]]:
    fields: dict[str, dict[str, list]] = {
        "documentKey": {"extraValues": [{"f2": None, "_id": 1}], "values": []},
        "documentKey.f1": {"extraValues": [{"subField": True}], "values": []},
    }
    for event in events:
        _traverse_event(event, fields)
    return fields


def values_to_test(fields: dict[str, dict[str, list]], path: str) -> list[Any]:
    return fields[path]["values"] + fields[path]["extraValues"]


def generate_events_and_fields(
    client: MongoClient, db_name: str, coll_name: str
) -> tuple[Timestamp, dict[str, dict[str, list]]]:
    """`generateEventsAndFieldsToBeTestedForOplogRewrites`."""
    start_point = next_cluster_time(cluster_time(client))
    end_point = generate_change_stream_write_workload(client, db_name, coll_name)
    cluster_time(client)
    events = get_all_change_stream_events(client, [], CS_CONFIG, start_point, end_point)
    assert events, "expecting allEvents to be non-empty"
    return start_point, fields_to_be_tested(events)


def _cs_config(predicate: dict[str, Any]) -> dict[str, Any]:
    """`fullDocument: updateLookup` only where the predicate names fullDocument."""
    config = dict(CS_CONFIG)
    if "fullDocument" not in json.dumps(predicate, default=str):
        del config["full_document"]
    return config


def _same(optimized: dict[str, Any], non_optimized: dict[str, Any]) -> bool:
    """`friendlyEqual` after copying the wallTime over: field order counts (tojson)."""
    optimized = dict(optimized)
    if "wallTime" in optimized and "wallTime" in non_optimized:
        optimized["wallTime"] = non_optimized["wallTime"]
    return bson.encode(optimized) == bson.encode(non_optimized)


def _failures(predicate: dict[str, Any], config: dict[str, Any],
              non_optimized: list[dict], optimized: list[dict]) -> list[dict[str, Any]]:
    if len(optimized) > len(non_optimized):
        return [{"matchExpr": predicate, "csConfig": config, "moreOptimized": optimized}]
    for i, event in enumerate(non_optimized):
        if i >= len(optimized) or not _same(optimized[i], event):
            return [{"matchExpr": predicate, "csConfig": config,
                     "events": {"nonOptimized": event,
                                "optimized": optimized[i] if i < len(optimized) else None}}]
    return []


def compare_optimized_and_non_optimized(
    client: MongoClient, predicates: list[dict[str, Any]], start_point: Timestamp
) -> list[dict[str, Any]]:
    """`compareOptimizedAndNonOptimizedChangeStreamResults`: the failed cases."""
    end_point = cluster_time(client)
    cluster_time(client)
    failed: list[dict[str, Any]] = []
    for predicate in predicates:
        config = _cs_config(predicate)
        match = {"$match": predicate}
        non_optimized = get_all_change_stream_events(
            client, [{"$_internalInhibitOptimization": {}}, match], config, start_point,
            end_point)
        optimized = get_all_change_stream_events(client, [match], config, start_point, end_point)
        failed += _failures(predicate, config, non_optimized, optimized)
    return failed


def compare_live(
    client: MongoClient, db_name: str, coll_name: str, predicates: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The same comparison with every stream opened before the workload (run again, on
    `db_name` dropped first): streams with the same options share a filter group. Each
    predicate's optimized events must also equal what the same stream resumed from the start
    point gives (its own pipeline, no filter group)."""
    client.drop_database(db_name)
    start_point = next_cluster_time(cluster_time(client))
    streams = []
    for predicate in predicates:
        config = _cs_config(predicate)
        match = {"$match": predicate}
        streams.append((predicate, config,
                        client.watch([{"$_internalInhibitOptimization": {}}, match],
                                     max_await_time_ms=1, **config),
                        client.watch([match], max_await_time_ms=1, **config)))
    generate_change_stream_write_workload(client, db_name, coll_name)
    end_point = cluster_time(client)
    cluster_time(client)
    failed: list[dict[str, Any]] = []
    for predicate, config, inhibited, plain in streams:
        non_optimized = drain(inhibited, end_point)
        optimized = drain(plain, end_point)
        failed += _failures(predicate, config, non_optimized, optimized)
        if not failed:
            resumed = get_all_change_stream_events(
                client, [{"$match": predicate}], config, start_point, end_point)
            failed += _failures(predicate, {**config, "resumed": True}, resumed, optimized)
    return failed


def run_rewrite_test(
    client: MongoClient, db_name: str,
    generate: Callable[[str, dict[str, dict[str, list]]], list[dict[str, Any]]],
    live: bool,
) -> None:
    """The body the six `change_stream_null_existence_eq_rewrite_*.js` files share."""
    coll_name = "coll1"
    start_point, fields = generate_events_and_fields(client, db_name, coll_name)
    predicates: list[dict[str, Any]] = []
    for path in fields:
        predicates += generate(path, fields)
    if live:
        failed = compare_live(client, db_name, coll_name, predicates)
    else:
        failed = compare_optimized_and_non_optimized(client, predicates, start_point)
    assert not failed, failed[:5]
