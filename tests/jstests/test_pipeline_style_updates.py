"""Translated from mongodb/mongo `jstests/change_streams/pipeline_style_updates.js` @
019fa81486e81bb6d0de3fbedd480e40b6929e23: the update events of pipeline-style updates logged as
`$v: 2` delta entries ($set, $unset, $replaceRoot).

One case: the file's first half. Its second half first sets
`internalQueryEnableLoggingV2OplogEntries` to false (replacement-style entries, replace events),
a parameter mongod 8.0 no longer has (it always logs `$v: 2`): listed in README.md."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

LARGE = "*" * 512


def test_pipeline_style_updates(client: Any) -> None:
    db = client["test"]
    db.drop_collection("t1")
    db.create_collection("t1")
    db.t1.insert_one({"_id": 100, "a": 1, "b": 2, "obj": {"a": 1, "b": 2, "str": LARGE}})
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], "t1")

    def check(pipeline: list, updated: dict, removed: list) -> None:
        db.t1.update_one({"_id": 100}, pipeline)
        cst.assert_next_changes_equal(cursor, [{
            "documentKey": {"_id": 100}, "ns": {"db": "test", "coll": "t1"},
            "operationType": "update",
            "updateDescription": {"updatedFields": updated, "removedFields": removed,
                                  "truncatedArrays": []}}])

    check([{"$set": {"a": 2}}], {"a": 2}, [])
    check([{"$unset": ["a"]}], {}, ["a"])
    check([{"$replaceRoot": {"newRoot": {"_id": 100, "b": 2,
                                         "obj": {"a": 2, "b": 2, "str": LARGE}}}}],
          {"obj.a": 2}, [])
    cst.clean_up()
