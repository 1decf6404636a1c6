"""Translated from mongodb/mongo `jstests/change_streams/expanded_update_description.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: `updateDescription.disambiguatedPaths` with
showExpandedEvents (dotted and numeric field names, array indexes, removed fields, truncated
arrays). The jstest is one sequence of updates on one document; each update is a case here,
run after the updates before it."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

LARGE = "*" * 128
NS = {"db": "test", "coll": "coll"}
# (update, updatedFields, removedFields, truncatedArrays, disambiguatedPaths)
STEPS: list[tuple[Any, dict, list, list, dict]] = [
    ({"$set": {"a": 2, "topLevelArray.0.subArray.1.1.0.bottomArray.2": 3,
               "arrayForReplacement": [0]}},
     {"arrayForReplacement": [0], "a": 2, "topLevelArray.0.subArray.1.1.0.bottomArray.2": 3},
     [], [], {}),
    ({"$set": {"arrayWithNumericField.0.0.1": {"b.c": 1}}},
     {"arrayWithNumericField.0.0.1": {"b.c": 1}}, [], [],
     {"arrayWithNumericField.0.0.1": ["arrayWithNumericField", 0, 0, "1"]}),
    ({"$set": {"objectWithNumericField.0.1": "updated"}},
     {"objectWithNumericField.0.1": "updated"}, [], [],
     {"objectWithNumericField.0.1": ["objectWithNumericField", "0", "1"]}),
    ([{"$unset": ["arrayForReplacement"]}], {}, ["arrayForReplacement"], [], {}),
    ([{"$replaceWith": {"$setField": {"field": "arrayForResize", "input": "$$ROOT",
                                      "value": [LARGE]}}}],
     {}, [], [{"field": "arrayForResize", "newSize": 1}], {}),
    ([{"$replaceWith": {"$setField": {"field": "d.o.t.t.e.d.o.b.j.", "input": "$$ROOT",
                                      "value": {"subObj": 1}}}},
      {"$replaceWith": {"$setField": {"field": "new.Field.", "input": "$$ROOT", "value": 1}}}],
     {"d.o.t.t.e.d.o.b.j.": {"subObj": 1}, "new.Field.": 1}, [], [],
     {"d.o.t.t.e.d.o.b.j.": ["d.o.t.t.e.d.o.b.j."], "new.Field.": ["new.Field."]}),
    ([{"$set": {"obj": {"$setField": {
        "field": "sub.obj", "input": "$obj",
        "value": {"$literal": {"d.o.t.t.e.d.a.r.r.a.y..": [[{"a": {"b.c": 2, "field": LARGE}}]]}},
    }}}}],
     {"obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0.0.a.b.c": 2}, [],
     [{"field": "obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0", "newSize": 1}],
     {"obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0": ["obj", "sub.obj", "d.o.t.t.e.d.a.r.r.a.y..", 0],
      "obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0.0.a.b.c":
          ["obj", "sub.obj", "d.o.t.t.e.d.a.r.r.a.y..", 0, 0, "a", "b.c"]}),
    ([{"$replaceWith": {"$setField": {
        "field": "arrayWithDotted.AndNumericFields", "input": "$$ROOT",
        "value": {"$literal": [[{"0": [{"1.2": {"a.b": True, "c": LARGE}}]}]]}}}}],
     {"arrayWithDotted.AndNumericFields.0.0.0.0.1.2.a.b": True}, [], [],
     {"arrayWithDotted.AndNumericFields.0.0.0.0.1.2.a.b":
          ["arrayWithDotted.AndNumericFields", 0, 0, "0", 0, "1.2", "a.b"]}),
]


def _params() -> list[Any]:
    return [pytest.param(i, id=f"update {i + 1}") for i in range(len(STEPS))]


@pytest.mark.parametrize("step", _params())
def test_expanded_update_description(client: Any, step: int) -> None:
    db = client["test"]
    db.drop_collection("coll")
    db.create_collection("coll")
    db.coll.insert_one({
        "_id": 100,
        "topLevelArray": [{"subArray": [0, [0, [{"bottomArray": [1, 2, LARGE]}]], 2, 3, LARGE]}],
        "arrayForReplacement": [0, 1, 2, 3],
        "arrayForResize": [LARGE, 1],
        "obj": {"sub.obj": {"d.o.t.t.e.d.a.r.r.a.y..": [[{"a": {"b.c": 1, "field": LARGE}},
                                                          "truncated"]]}},
        "d.o.t.t.e.d.o.b.j.": {"sub.obj": {"b.c": 2}},
        "objectWithNumericField": {"0": {"1": "numeric", "field": LARGE}},
        "arrayWithNumericField": [[{"0": "numeric", "a": {"b.c": 1}, "field": LARGE}]],
        "arrayWithDotted.AndNumericFields": [[{"0": [{"1.2": {"a.b": None, "c": LARGE}}]}]],
    })
    for update, *_ in STEPS[:step]:  # the updates before this one, as the jstest made them
        db.coll.update_one({"_id": 100}, update)
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {"showExpandedEvents": True}}], "coll")
    update, updated, removed, truncated, disambiguated = STEPS[step]
    db.coll.update_one({"_id": 100}, update)
    cst.assert_next_changes_equal(cursor, [{
        "documentKey": {"_id": 100}, "ns": NS, "operationType": "update",
        "updateDescription": {"updatedFields": updated, "removedFields": removed,
                              "truncatedArrays": truncated, "disambiguatedPaths": disambiguated},
    }])
    cst.clean_up()
