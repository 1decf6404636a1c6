"""Translated from mongodb/mongo `jstests/change_streams/pipeline_style_updates_v2_oplog_entries.js`
@ 019fa81486e81bb6d0de3fbedd480e40b6929e23: pipeline-style updates logged as `$v: 2` delta
entries give update events whose updateDescription is computed from the delta (sub-diffs of
arrays and objects, truncated arrays, removed fields), with and without updateLookup."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

GIANT, MEDIUM, SMALL = "*" * 1024, "*" * 128, "*" * 32
NS = {"db": "test", "coll": "t1"}


def _update(updated: dict, removed: list, truncated: list) -> dict[str, Any]:
    return {"documentKey": {"_id": 100}, "ns": NS, "operationType": "update",
            "updateDescription": {"updatedFields": updated, "removedFields": removed,
                                  "truncatedArrays": truncated}}


def test_pipeline_style_updates_v2_oplog_entries(client: Any) -> None:
    db = client["test"]
    db.drop_collection("t1")
    db.create_collection("t1")
    t1 = db["t1"]
    t1.insert_one({"_id": 100, "a": 1, "b": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM}, 1, 2, 3],
                   "arrayForReplacement": [0, 1, 2, 3], "giantStr": GIANT})
    cst = ChangeStreamTest(db)
    stream = cst.start_watching_changes([{"$changeStream": {}}], "t1")
    full_doc = cst.start_watching_changes([{"$changeStream": {"fullDocument": "updateLookup"}}],
                                          "t1")

    # $set
    t1.update_one({"_id": 100}, [{"$set": {
        "a": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}], "arrayForReplacement": [0],
        "c": 3}}])
    expected = _update({"a": 2, "c": 3, "arrayForReplacement": [0], "arrayForSubdiff.1.b": 3},
                       [], [{"field": "arrayForSubdiff", "newSize": 2}])
    cst.assert_next_changes_equal(full_doc, [{**expected, "fullDocument": {
        "_id": 100, "a": 2, "b": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
        "arrayForReplacement": [0], "giantStr": GIANT, "c": 3}}])
    cst.assert_next_changes_equal(stream, [expected])

    # $unset
    t1.update_one({"_id": 100}, [{"$unset": ["a"]}])
    cst.assert_next_changes_equal(stream, [_update({}, ["a"], [])])

    # $replaceRoot
    t1.update_one({"_id": 100}, [{"$replaceRoot": {"newRoot": {"_id": 100, "giantStr": GIANT}}}])
    cst.assert_next_changes_equal(stream, [
        _update({}, ["c", "arrayForReplacement", "arrayForSubdiff", "b"], [])])

    # A complex pipeline.
    t1.update_one({"_id": 100}, [
        {"$replaceRoot": {"newRoot": {
            "_id": 100, "giantStr": GIANT, "arr": [{"x": 1, "y": SMALL}, MEDIUM],
            "arr_a": [1, MEDIUM], "arr_b": [[1, SMALL], MEDIUM],
            "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
            "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}}}}},
        {"$addFields": {"a": "updated", "b": 2, "doc": {"a": {"0": "foo"}}}},
        {"$project": {"a": True, "giantStr": True, "doc": True, "arr": True, "arr_a": True,
                      "arr_b": True, "arr_c": True, "obj": True}},
    ])
    cst.assert_next_changes_equal(stream, [_update({
        "a": "updated", "doc": {"a": {"0": "foo"}}, "arr": [{"x": 1, "y": SMALL}, MEDIUM],
        "arr_a": [1, MEDIUM], "arr_b": [[1, SMALL], MEDIUM], "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
        "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}}}, [], [])])

    # Modifications to nested elements.
    t1.update_one({"_id": 100}, [{"$replaceRoot": {"newRoot": {
        "_id": 100, "giantStr": GIANT, "arr": [{"y": SMALL}, MEDIUM], "arr_a": [2, MEDIUM],
        "arr_b": [[2, SMALL], MEDIUM], "arr_c": [[SMALL], MEDIUM],
        "obj": {"x": {"b": 2, "c": [MEDIUM], "str": MEDIUM}}}}}])
    cst.assert_next_changes_equal(stream, [_update(
        {"arr_a.0": 2, "arr_b.0.0": 2, "obj.x.b": 2}, ["a", "doc", "arr.0.x", "obj.x.a"],
        [{"field": "arr_c.0", "newSize": 1}, {"field": "obj.x.c", "newSize": 1}])])
    cst.clean_up()
