"""Translated from mongodb/mongo `jstests/change_streams/show_raw_update_description.js` @
17f49ab8b16a6f45371771d8c152cfbf4ed186af: with `showRawUpdateDescription`, update events carry
the oplog's `$v: 2` delta as `rawUpdateDescription` (op-style and pipeline-style updates), other
events are unchanged, and each delta applied with `$_internalApplyOplogUpdate` to a copy of the
collection gives the same documents."""

from __future__ import annotations

from typing import Any

from cst import ChangeStreamTest

GIANT, MEDIUM, SMALL = "*" * 1024, "*" * 128, "*" * 32


def _ns(coll: str) -> dict[str, str]:
    return {"db": "test", "coll": coll}


def _raw(coll: str, _id: Any, diff: dict) -> dict[str, Any]:
    return {"documentKey": {"_id": _id}, "ns": _ns(coll), "operationType": "update",
            "rawUpdateDescription": {"$v": 2, "diff": diff}}


def test_show_raw_update_description(client: Any) -> None:
    db = client["test"]
    for name in ("t1", "t2", "t1Copy", "t2Copy"):
        db.drop_collection(name)
        db.create_collection(name)
    db.t1.insert_many([{"_id": 3, "a": 5, "b": 1}, {"_id": 4, "a": 0, "b": 1},
                       {"_id": 5, "a": 0, "b": 1}, {"_id": 6, "a": 1, "b": 1},
                       {"_id": 7, "a": 1, "b": 1}, {"_id": 8, "a": 2, "b": {"c": 1}}])
    db.t2.insert_one({"_id": 100, "a": 1, "b": 2,
                      "arrayForSubdiff": [GIANT, {"a": MEDIUM}, 1, 2, 3],
                      "arrayForReplacement": [0, 1, 2, 3], "giantStr": GIANT})
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {"showRawUpdateDescription": True}}],
                                        "t1")

    # Inserts, replacements and deletes are unaffected.
    db.t1.insert_one({"_id": 1, "a": 1})
    cst.assert_next_changes_equal(cursor, [{"documentKey": {"_id": 1}, "ns": _ns("t1"),
                                            "fullDocument": {"_id": 1, "a": 1},
                                            "operationType": "insert"}])
    db.t1.replace_one({"_id": 2}, {"_id": 2, "a": 4}, upsert=True)
    cst.assert_next_changes_equal(cursor, [{"documentKey": {"_id": 2}, "ns": _ns("t1"),
                                            "fullDocument": {"_id": 2, "a": 4},
                                            "operationType": "insert"}])
    for doc in ({"_id": 1, "a": 3}, {"_id": 1, "b": 3}):
        db.t1.replace_one({"_id": 1}, doc)
        cst.assert_next_changes_equal(cursor, [{"documentKey": {"_id": 1}, "ns": _ns("t1"),
                                                "fullDocument": doc,
                                                "operationType": "replace"}])
    db.t1.delete_one({"_id": 1})
    cst.assert_next_changes_equal(cursor, [{"documentKey": {"_id": 1}, "ns": _ns("t1"),
                                            "operationType": "delete"}])
    db.t1.delete_many({"a": 1})
    cst.assert_next_changes_equal_unordered(cursor, [
        {"documentKey": {"_id": i}, "ns": _ns("t1"), "operationType": "delete"} for i in (6, 7)])

    def same_documents(a: str, b: str) -> None:
        assert sorted(db[a].find(), key=repr) == sorted(db[b].find(), key=repr)

    def apply_raw(original: str, copy: str, events: list[dict[str, Any]]) -> None:
        for event in events:
            reply = db.command({"update": copy, "updates": [{
                "q": event["documentKey"],
                "u": [{"$_internalApplyOplogUpdate": {
                    "oplogUpdate": event["rawUpdateDescription"]}}]}]})
            assert not reply.get("writeErrors"), reply
        same_documents(original, copy)

    db.t1Copy.insert_many(list(db.t1.find()))
    same_documents("t1", "t1Copy")
    db.t2Copy.insert_many(list(db.t2.find()))
    same_documents("t2", "t2Copy")

    # Op-style updates.
    db.t1.update_one({"_id": 3}, {"$inc": {"b": 2}})
    expected = [_raw("t1", 3, {"u": {"b": 3}})]
    cst.assert_next_changes_equal(cursor, expected)
    apply_raw("t1", "t1Copy", expected)

    db.t1.update_many({"a": 0}, {"$set": {"b": 2}})
    expected = [_raw("t1", 4, {"u": {"b": 2}}), _raw("t1", 5, {"u": {"b": 2}})]
    cst.assert_next_changes_equal_unordered(cursor, expected)
    apply_raw("t1", "t1Copy", expected)

    db.t1.update_one({"_id": 3}, {"$unset": {"b": ""}})
    expected = [_raw("t1", 3, {"d": {"b": False}})]
    cst.assert_next_changes_equal(cursor, expected)
    apply_raw("t1", "t1Copy", expected)

    db.t1.update_one({"_id": 8}, {"$set": {"b.d": 2}})
    expected = [_raw("t1", 8, {"sb": {"i": {"d": 2}}})]
    cst.assert_next_changes_equal(cursor, expected)
    apply_raw("t1", "t1Copy", expected)

    # Pipeline-style updates, on a stream with and one without updateLookup.
    cursor = cst.start_watching_changes([{"$changeStream": {"showRawUpdateDescription": True}}],
                                        "t2")
    full_doc = cst.start_watching_changes([{"$changeStream": {
        "showRawUpdateDescription": True, "fullDocument": "updateLookup"}}], "t2")

    def check(pipeline: list, diff: dict, full_document: dict) -> None:
        db.t2.update_one({"_id": 100}, pipeline)
        event = _raw("t2", 100, diff)
        cst.assert_next_changes_equal(full_doc, [{**event, "fullDocument": full_document}])
        cst.assert_next_changes_equal(cursor, [event])
        apply_raw("t2", "t2Copy", [event])

    check([{"$set": {"a": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
                     "arrayForReplacement": [0], "c": 3}}],
          {"u": {"a": 2, "arrayForReplacement": [0]}, "i": {"c": 3},
           "sarrayForSubdiff": {"a": True, "l": 2, "s1": {"i": {"b": 3}}}},
          {"_id": 100, "a": 2, "b": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
           "arrayForReplacement": [0], "giantStr": GIANT, "c": 3})
    check([{"$unset": ["a"]}], {"d": {"a": False}},
          {"_id": 100, "b": 2, "arrayForSubdiff": [GIANT, {"a": MEDIUM, "b": 3}],
           "arrayForReplacement": [0], "giantStr": GIANT, "c": 3})
    check([{"$replaceRoot": {"newRoot": {"_id": 100, "giantStr": GIANT}}}],
          {"d": {"c": False, "arrayForReplacement": False, "arrayForSubdiff": False,
                 "b": False}},
          {"_id": 100, "giantStr": GIANT})
    built = {"arr": [{"x": 1, "y": SMALL}, MEDIUM], "arr_a": [1, MEDIUM],
             "arr_b": [[1, SMALL], MEDIUM], "arr_c": [[SMALL, 1, 2, 3], MEDIUM],
             "obj": {"x": {"a": 1, "b": 1, "c": [MEDIUM, 1, 2, 3], "str": MEDIUM}}}
    added = {"a": "updated", "doc": {"a": {"0": "foo"}}}
    check([{"$replaceRoot": {"newRoot": {"_id": 100, "giantStr": GIANT, **built}}},
           {"$addFields": {"a": "updated", "b": 2, "doc": {"a": {"0": "foo"}}}},
           {"$project": {"a": True, "giantStr": True, "doc": True, "arr": True, "arr_a": True,
                         "arr_b": True, "arr_c": True, "obj": True}}],
          {"i": {**built, **added}}, {"_id": 100, "giantStr": GIANT, **built, **added})
    nested = {"arr": [{"y": SMALL}, MEDIUM], "arr_a": [2, MEDIUM], "arr_b": [[2, SMALL], MEDIUM],
              "arr_c": [[SMALL], MEDIUM], "obj": {"x": {"b": 2, "c": [MEDIUM], "str": MEDIUM}}}
    check([{"$replaceRoot": {"newRoot": {"_id": 100, "giantStr": GIANT, **nested}}}],
          {"d": {"a": False, "doc": False}, "sarr": {"a": True, "s0": {"d": {"x": False}}},
           "sarr_a": {"a": True, "u0": 2}, "sarr_b": {"a": True, "s0": {"a": True, "u0": 2}},
           "sarr_c": {"a": True, "s0": {"a": True, "l": 1}},
           "sobj": {"sx": {"d": {"a": False}, "u": {"b": 2}, "sc": {"a": True, "l": 1}}}},
          {"_id": 100, "giantStr": GIANT, **nested})
    cst.clean_up()
