"""User stages after $changeStream (reference oplog_to_events.md §9.1) on events made by the
transform from oplog entries; errors with mongod's codes and messages; the $match pre-filter."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_stages.add_post_image import strip_internal_fields
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.transform import MISSING, ChangeStreamTransform
from pipeline_stages.user_stages import (
    ID_MODIFIED_MESSAGE,
    UserStages,
    bsonobj_string,
    match_prefilter,
)

UUID_A = Binary(uuid.UUID("0123456789abcdef0123456789abcdef").bytes, 4)
WALL = datetime.datetime(2024, 5, 1, 12, 0, 0)
OID = ObjectId("65f1c0ffee0000000000abcd")
DOC = {
    "_id": OID,
    "a": {"b": 5, "c": [1, {"d": 2, "level": 5}, {"d": 3}]},
    "s": "hello",
    "n": Int64(7),
    "dec": Decimal128("1.5"),
    "bin": Binary(b"\x01\x02", 0),
    "when": datetime.datetime(2024, 1, 2, 3, 4, 5, 6000),
    "level": 1,
}


def _entry(fields: dict[str, Any]):
    return decode_entry(bson.encode(fields))


def _transform(*entries, **spec_fields) -> list[dict[str, Any]]:
    spec = ChangeStreamSpec(scope="collection", db="test", coll="c", **spec_fields)
    transform = ChangeStreamTransform(spec)
    events = []
    for entry in entries:
        event = transform.transform(entry)
        strip_internal_fields(event)
        events.append(event)
    return events


def insert_event(doc: dict[str, Any] = DOC, ts: int = 1) -> dict[str, Any]:
    return _transform(
        _entry({"op": "i", "ns": "test.c", "ui": UUID_A, "o": doc, "o2": {"_id": doc["_id"]},
                "ts": Timestamp(1700000000, ts), "t": Int64(1), "v": Int64(2), "wall": WALL})
    )[0]


def update_event(ts: int = 2) -> dict[str, Any]:
    return _transform(
        _entry({"op": "u", "ns": "test.c", "ui": UUID_A, "o": {"$v": 2, "diff": {"u": {"s": "x"}}},
                "o2": {"_id": OID}, "ts": Timestamp(1700000000, ts), "t": Int64(1),
                "v": Int64(2), "wall": WALL})
    )[0]


def delete_event(ts: int = 3) -> dict[str, Any]:
    return _transform(
        _entry({"op": "d", "ns": "test.c", "ui": UUID_A, "o": {"_id": OID},
                "ts": Timestamp(1700000000, ts), "t": Int64(1), "v": Int64(2), "wall": WALL})
    )[0]


def plain(value: Any) -> Any:
    """An event (or value) with RawBSONDocuments decoded, for comparisons."""
    return bson.decode(bson.encode({"v": value}))["v"]


def run(stages: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return UserStages(stages).process(events)


def raises(code: int, message: str, fn, *args):
    with pytest.raises(MongoError) as info:
        fn(*args)
    assert (info.value.code, info.value.errmsg) == (code, message)
    return info.value


# -- fast paths ---------------------------------------------------------------------------------


def test_no_stages_returns_the_same_objects():
    events = [insert_event(), update_event()]
    out = run([], events)
    assert all(a is b for a, b in zip(out, events))
    assert not UserStages([])


def test_match_only_keeps_the_event_objects_and_their_raw_documents():
    event = insert_event()
    out = run([{"$match": {"fullDocument.a.b": 5}}, {"$match": {"ns.coll": "c"}}], [event])
    assert out[0] is event
    assert isinstance(out[0]["fullDocument"], RawBSONDocument)


def test_missing_slots_are_not_seen_by_the_stages():
    event = insert_event()
    event["fullDocumentBeforeChange"] = MISSING
    out = run([{"$match": {"fullDocumentBeforeChange": {"$exists": False}}}], [event])
    assert out == [event]
    out = run([{"$set": {"x": 1}}], [event])
    assert "fullDocumentBeforeChange" not in out[0] and out[0]["x"] == 1


# -- $match -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, expected",
    [
        ({"fullDocument.a.b": 5}, [True, False, False]),
        ({"fullDocument.a.b": {"$gt": 4}}, [True, False, False]),
        ({"fullDocument.a.b": {"$gt": "4"}}, [False, False, False]),  # no cross-type match
        ({"fullDocument.a.c.d": 3}, [True, False, False]),  # through the array
        ({"fullDocument.a.c": {"$elemMatch": {"d": 2, "level": 5}}}, [True, False, False]),
        ({"operationType": {"$in": ["insert", "delete"]}}, [True, False, True]),
        ({"operationType": {"$nin": ["insert", "delete"]}}, [False, True, False]),
        ({"$or": [{"operationType": "delete"}, {"updateDescription.updatedFields.s": "x"}]},
         [False, True, True]),
        ({"documentKey._id": OID}, [True, True, True]),
        ({"fullDocument": {"$exists": False}}, [False, True, True]),
        ({"fullDocument.missing": None}, [True, True, True]),
        ({"clusterTime": {"$gte": Timestamp(1700000000, 2)}}, [False, True, True]),
        ({"clusterTime": {"$type": "timestamp"}}, [True, True, True]),
        ({"wallTime": {"$lt": datetime.datetime(2025, 1, 1)}}, [True, True, True]),
        ({"fullDocument.n": 7}, [True, False, False]),
        ({"fullDocument.n": {"$type": "long"}}, [True, False, False]),
        ({"fullDocument.dec": 1.5}, [True, False, False]),
        ({"fullDocument.dec": Decimal128("1.5")}, [True, False, False]),
        ({"fullDocument.dec": {"$type": "decimal"}}, [True, False, False]),
        ({"fullDocument.s": Regex("^HEL", "i")}, [True, False, False]),
        ({"fullDocument.s": {"$regex": "^h", "$options": ""}}, [True, False, False]),
        ({"$expr": {"$eq": ["$ns.coll", "c"]}}, [True, True, True]),
        ({"$expr": {"$gt": ["$fullDocument.a.b", 4]}}, [True, False, False]),
        # Embedded documents are equal only with the same fields in the same order.
        ({"ns": {"db": "test", "coll": "c"}}, [True, True, True]),
        ({"ns": {"coll": "c", "db": "test"}}, [False, False, False]),
        ({"$nor": [{"operationType": "update"}]}, [True, False, True]),
        ({"$comment": "anything", "operationType": "update"}, [False, True, False]),
    ],
)
def test_match(query, expected):
    events = [insert_event(), update_event(), delete_event()]
    out = run([{"$match": query}], events)
    assert [any(o is e for o in out) for e in events] == expected


def test_match_with_tz_aware_datetimes_in_the_filter():
    aware = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    assert len(run([{"$match": {"wallTime": {"$lt": aware}}}], [insert_event()])) == 1


# -- $project / $unset ---------------------------------------------------------------------------


def test_project_inclusion_keeps_id_first_and_document_order():
    event = insert_event()
    out = run([{"$project": {"ns": 1, "operationType": 1, "fullDocument.a.b": 1}}], [event])
    assert list(out[0]) == ["_id", "operationType", "fullDocument", "ns"]
    assert out[0]["_id"] == event["_id"]
    assert plain(out[0]["fullDocument"]) == {"a": {"b": 5}}


def test_project_nested_sub_projection_is_an_inclusion():
    out = run([{"$project": {"fullDocument": {"a": {"b": 1}, "s": True}}}], [insert_event()])
    assert plain(out[0]) == {
        "_id": insert_event()["_id"], "fullDocument": {"a": {"b": 5}, "s": "hello"}
    }


def test_project_exclusion_keeps_the_rest_in_order():
    event = insert_event()
    out = run([{"$project": {"fullDocument.a": 0, "wallTime": 0, "documentKey": False}}], [event])
    assert list(out[0]) == ["_id", "operationType", "clusterTime", "fullDocument", "ns"]
    assert list(plain(out[0]["fullDocument"])) == ["_id", "s", "n", "dec", "bin", "when", "level"]


def test_project_computed_fields():
    out = run(
        [{"$project": {
            "operationType": 1,
            "b1": {"$add": ["$fullDocument.a.b", 1]},
            "fullDocument.upper": {"$toUpper": "$fullDocument.s"},
            "lit": "text",
        }}],
        [insert_event()],
    )
    doc = plain(out[0])
    assert doc["b1"] == 6 and doc["lit"] == "text"
    assert doc["fullDocument"] == {"upper": "HELLO"}
    assert doc["operationType"] == "insert"


def test_project_only_nested_computed_fields_keeps_id():
    event = insert_event()
    stage = {"fullDocument.t": {"$toUpper": "$fullDocument.s"}}
    out = run([{"$project": stage}], [event])
    assert plain(out[0]) == {"_id": event["_id"], "fullDocument": {"t": "HELLO"}}
    out, _ = UserStages([{"$project": {"_id": 0, **stage}}]).apply([event])
    assert plain(out[0]) == {"fullDocument": {"t": "HELLO"}}


def test_project_computed_id_replaces_it_in_place():
    event = insert_event()
    out, _ = UserStages([{"$project": {"_id": "$documentKey._id", "operationType": 1}}]).apply(
        [event]
    )
    assert list(out[0].items()) == [("_id", OID), ("operationType", "insert")]


def test_project_only_id():
    event = insert_event()
    assert run([{"$project": {"_id": 1}}], [event]) == [{"_id": event["_id"]}]


def test_values_keep_their_bson_types_through_a_transforming_stage():
    event = insert_event()
    out = run([{"$project": {"fullDocument": 1}}], [event])
    assert out[0]["fullDocument"].raw == event["fullDocument"].raw  # byte for byte
    full = out[0]["fullDocument"]
    assert isinstance(full["n"], Int64) and isinstance(full["dec"], Decimal128)
    assert full["bin"] == b"\x01\x02" and full["when"] == DOC["when"]


def test_unset():
    event = insert_event()
    out = run([{"$unset": ["wallTime", "fullDocument.a"]}], [event])
    assert "wallTime" not in out[0] and "a" not in out[0]["fullDocument"]
    assert out[0]["_id"] == event["_id"]
    out = run([{"$unset": "documentKey"}], [event])
    assert "documentKey" not in out[0]


# -- $addFields / $set --------------------------------------------------------------------------


def test_add_fields_and_set():
    event = update_event()
    out = run(
        [
            {"$addFields": {"isUpdate": {"$eq": ["$operationType", "update"]}}},
            {"$set": {"ns.full": {"$concat": ["$ns.db", ".", "$ns.coll"]},
                      "k": "$documentKey._id"}},
        ],
        [event],
    )
    doc = plain(out[0])
    assert doc["isUpdate"] is True and doc["k"] == OID
    assert doc["ns"] == {"db": "test", "coll": "c", "full": "test.c"}
    assert list(doc)[-2:] == ["isUpdate", "k"]


def test_set_nested_object_merges_into_the_document():
    out = run([{"$set": {"fullDocument": {"extra": "$fullDocument.s"}}}], [insert_event()])
    full = plain(out[0]["fullDocument"])
    assert full["extra"] == "hello" and full["a"]["b"] == 5


def test_set_decimal_arithmetic_stays_decimal():
    out = run([{"$set": {"d2": {"$add": ["$fullDocument.dec", 1]}}}], [insert_event()])
    assert out[0]["d2"] == Decimal128("2.5")


# -- $replaceRoot / $replaceWith ----------------------------------------------------------------


def test_replace_root_keeping_the_id():
    event = insert_event()
    out = run([{"$replaceRoot": {"newRoot": {"_id": "$_id", "doc": "$fullDocument.a"}}}], [event])
    assert plain(out[0]) == {"_id": event["_id"], "doc": {"b": 5, "c": DOC["a"]["c"]}}


def _token_string(token: dict[str, Any]) -> str:
    data = token["_data"]
    shown = data if len(data) < 160 else data[:150] + "..."
    return '{ _id: { _data: "' + shown + '" } }'


def test_replace_root_to_full_document_is_280():
    event = insert_event()
    assert len(event["_id"]["_data"]) > 159  # printed cut, as BSONObj::toString does
    raises(
        280,
        ID_MODIFIED_MESSAGE + "Expected: " + _token_string(event["_id"])
        + " but found: { _id: ObjectId('65f1c0ffee0000000000abcd') }",
        run, [{"$replaceRoot": {"newRoot": "$fullDocument"}}], [event],
    )


def test_replace_with_to_a_document_without_id_is_280():
    event = insert_event()
    raises(
        280,
        ID_MODIFIED_MESSAGE + "Expected: " + _token_string(event["_id"]) + " but found: {}",
        run, [{"$replaceWith": "$ns"}], [event],
    )


def test_replace_root_to_a_non_object():
    event = delete_event()
    err = raises(
        40228,
        "'replacement document'  must evaluate to an object, but resulting value was: MISSING. "
        "Type of resulting value: 'missing'. Input document: "
        + "{_id: {_data: \"" + event["_id"]["_data"] + "\"}, operationType: \"delete\", "
        "clusterTime: Timestamp(1700000000, 3), wallTime: " + _value(WALL) + ", "
        "ns: {db: \"test\", coll: \"c\"}, "
        "documentKey: {_id: ObjectId('65f1c0ffee0000000000abcd')}}",
        run, [{"$replaceWith": "$fullDocument"}], [event],
    )
    assert err.code == 40228
    with pytest.raises(MongoError) as info:
        run([{"$replaceRoot": {"newRoot": "$ns.db"}}], [event])
    assert info.value.errmsg.startswith(
        "'newRoot' expression  must evaluate to an object, but resulting value was: \"test\". "
        "Type of resulting value: 'string'. Input document: {_id: "
    )


def _value(v: Any) -> str:
    from pipeline_stages.value_string import value_string

    return value_string(v)


# -- the _id check ------------------------------------------------------------------------------


def test_unset_id_is_280_and_apply_returns_the_event_without_id():
    event = insert_event()
    raises(
        280,
        ID_MODIFIED_MESSAGE + "Expected: " + _token_string(event["_id"]) + " but found: {}",
        run, [{"$unset": "_id"}], [event],
    )
    out, tokens = UserStages([{"$project": {"_id": 0}}]).apply([event])
    assert "_id" not in out[0] and out[0]["operationType"] == "insert"
    assert tokens == [event["_id"]]


def test_set_id_to_another_value_is_280():
    event = insert_event()
    raises(
        280,
        ID_MODIFIED_MESSAGE + "Expected: " + _token_string(event["_id"])
        + " but found: { _id: 1.5 }",
        run, [{"$set": {"_id": 1.5}}], [event],
    )


def test_rewriting_id_with_the_same_value_is_allowed():
    event = insert_event()
    out = run([{"$set": {"_id": {"_data": event["_id"]["_data"]}}}], [event])
    assert out[0]["_id"] == event["_id"]


# -- $redact ------------------------------------------------------------------------------------


def test_redact_prunes_subdocuments_at_every_level():
    event = insert_event()
    prune_level_5 = {
        "$cond": {"if": {"$eq": ["$level", 5]}, "then": "$$PRUNE", "else": "$$DESCEND"}
    }
    out = run([{"$redact": prune_level_5}], [event])
    full = plain(out[0]["fullDocument"])
    assert full["a"]["c"] == [1, {"d": 3}]  # the {level: 5} element is gone
    assert out[0]["_id"] == event["_id"] and full["s"] == "hello"


def test_redact_keep_and_prune_whole_events():
    events = [insert_event(), update_event(), delete_event()]
    keep_updates = {
        "$cond": [{"$eq": ["$$ROOT.operationType", "update"]}, "$$KEEP", "$$PRUNE"]
    }
    out = run([{"$redact": keep_updates}], events)
    assert [o["operationType"] for o in out] == ["update"]


def test_redact_bad_result():
    raises(
        17053,
        "$redact's expression should not return anything aside from the variables $$KEEP, "
        "$$DESCEND, and $$PRUNE, but returned \"insert\"",
        run, [{"$redact": "$operationType"}], [insert_event()],
    )


# -- argument errors (when the stream is opened) -----------------------------------------------


@pytest.mark.parametrize(
    "stage, code, message",
    [
        ({"$match": 1}, 15959, "the match filter must be an expression in an object"),
        ({"$match": {"a": {"$foo": 1}}}, 2, "unknown operator: $foo"),
        ({"$match": {"$foo": 1}}, 2,
         "unknown top level operator: $foo. If you have a field name that starts with a '$' "
         "symbol, consider using $getField or $setField."),
        ({"$match": {"$not": {"a": 1}}}, 2,
         "unknown top level operator: $not. If you are trying to negate an entire expression, "
         "use $nor."),
        ({"$match": {"a": {"$in": 5}}}, 2, "$in needs an array"),
        ({"$match": {"$or": 5}}, 2, "$or must be an array"),
        ({"$match": {"$and": []}}, 2, "$and/$or/$nor must be a nonempty array"),
        ({"$match": {"$or": [1]}}, 2, "$or/$and/$nor entries need to be full objects"),
        ({"$project": "a"}, 15969, "$project specification must be an object"),
        ({"$project": {}}, 51272,
         "Invalid $project :: caused by :: projection specification must have at least one field"),
        ({"$project": {"a": 1, "b": 0}}, 31254,
         "Invalid $project :: caused by :: Cannot do exclusion on field b in inclusion projection"),
        ({"$project": {"a": 0, "b": 1}}, 31253,
         "Invalid $project :: caused by :: Cannot do inclusion on field b in exclusion projection"),
        ({"$project": {"a": 0, "b": "x"}}, 31310,
         "Invalid $project :: caused by :: Cannot use an expression b: \"x\" in an exclusion "
         "projection"),
        ({"$project": {"$a": 1}}, 16410,
         "Invalid $project :: caused by :: FieldPath field names may not start with '$'. "
         "Consider using $getField or $setField."),
        ({"$project": {"a.": 1}}, 40353,
         "Invalid $project :: caused by :: FieldPath must not end with a '.'."),
        ({"$project": {"a..b": 1}}, 15998,
         "Invalid $project :: caused by :: FieldPath field names may not be empty strings."),
        ({"$project": {"a": {}}}, 51270,
         "Invalid $project :: caused by :: An empty sub-projection is not a valid value. Found "
         "empty object at path"),
        ({"$project": {"a": 1, "a.b": 1}}, 31249,
         "Invalid $project :: caused by :: Path collision at a.b remaining portion b"),
        ({"$project": {"a.b": 1, "a": 1}}, 31250,
         "Invalid $project :: caused by :: Path collision at a"),
        ({"$addFields": []}, 40272, "$addFields specification stage must be an object, got array"),
        ({"$set": 5}, 40272, "$set specification stage must be an object, got int"),
        ({"$set": {"$x": 1}}, 16410,
         "Invalid $set :: caused by :: FieldPath field names may not start with '$'. Consider "
         "using $getField or $setField."),
        ({"$unset": 1}, 31002, "$unset specification must be a string or an array"),
        ({"$unset": []}, 31119,
         "$unset specification must be a string or an array with at least one field"),
        ({"$unset": ["a", 1]}, 31120,
         "$unset specification must be a string or an array containing only string values"),
        ({"$unset": "a."}, 40353,
         "Invalid $unset :: caused by :: FieldPath must not end with a '.'."),
        ({"$replaceRoot": "$a"}, 40229,
         "expected an object as specification for $replaceRoot stage, got string"),
        ({"$replaceRoot": {"root": "$a"}}, 40415,
         "BSON field '$replaceRoot.root' is an unknown field."),
        ({"$replaceRoot": {}}, 40414,
         "BSON field '$replaceRoot.newRoot' is missing but a required field"),
        ({"$group": {"_id": None}}, 20, "$group is not permitted in a $changeStream pipeline"),
        ({"$count": "n"}, 20, "$group is not permitted in a $changeStream pipeline"),
        ({"$bogus": {}}, 40324, "Unrecognized pipeline stage name: '$bogus'"),
        ({"$match": {}, "$project": {"a": 1}}, 40323,
         "A pipeline stage specification object must contain exactly one field."),
    ],
)
def test_argument_errors(stage, code, message):
    raises(code, message, UserStages, [stage])


@pytest.mark.parametrize(
    "stage, context",
    [
        ({"$set": {"x": {"$bogus": 1}}}, "Invalid $set :: caused by :: "),
        ({"$project": {"x": {"$add": [1, {"$bogus": 1}]}}}, "Invalid $project :: caused by :: "),
        ({"$replaceWith": {"$bogus": 1}}, ""),
        ({"$replaceRoot": {"newRoot": {"a": {"$bogus": 1}}}}, ""),
        ({"$redact": {"$cond": [{"$bogus": 1}, "$$KEEP", "$$PRUNE"]}}, ""),
        ({"$match": {"$or": [{"$expr": {"$bogus": 1}}]}}, ""),
    ],
)
def test_unknown_expression_fails_when_the_stream_opens(stage, context):
    raises(168, context + "Unrecognized expression '$bogus'", UserStages, [stage])


def test_literal_arguments_are_not_parsed():
    out = run([{"$set": {"x": {"$literal": {"$bogus": 1}}}}], [insert_event()])
    assert plain(out[0]["x"]) == {"$bogus": 1}


def test_an_expression_the_engine_lacks_is_238_when_evaluated():
    stages = UserStages([{"$set": {"x": {"$toHashedIndexKey": "$$ROOT"}}}])
    raises(238, "$set: the expression $toHashedIndexKey is not supported by cdcserver's "
           "expression engine", stages.process, [insert_event()])


def test_get_field_and_set_field_evaluate_as_mongod():
    event = insert_event()
    [out] = UserStages([{"$set": {"x": {"$getField": "operationType"},
                                  "y": {"$setField": {"field": {"$literal": "$v"},
                                                      "input": {"a": 1}, "value": 2}}}}]
                         ).process([event])
    assert (out["x"], plain(out["y"])) == ("insert", {"a": 1, "$v": 2})
    raises(4161108, "A field path reference which is not allowed in this context. Did you mean "
           "{$literal: '$a'}?", UserStages([{"$set": {"y": {"$setField": {
               "field": "$a", "input": "$$ROOT", "value": 1}}}}]).process, [event])


def test_split_stage_is_left_to_split_large_event():
    stages = UserStages([{"$match": {"operationType": "insert"}},
                         {"$changeStreamSplitLargeEvent": {}}])
    assert len(stages.stages) == 1


# -- BSONObj::toString -------------------------------------------------------------------------


def test_bsonobj_string():
    assert bsonobj_string({}) == "{}"
    assert bsonobj_string({"a": 1, "b": [1, "x"], "c": {}}) == '{ a: 1, b: [ 1, "x" ], c: {} }'
    assert bsonobj_string({"d": 1.0, "e": 0.1, "f": 1e20}) == "{ d: 1.0, e: 0.1, f: 1e+20.0 }"
    assert bsonobj_string({"t": Binary(b"\x00\x01", 0)}) == "{ t: BinData(0, 0001) }"
    assert bsonobj_string({"u": UUID_A}) == '{ u: UUID("01234567-89ab-cdef-0123-456789abcdef") }'
    assert bsonobj_string({"s": "x" * 159}) == '{ s: "' + "x" * 159 + '" }'
    assert bsonobj_string({"s": "x" * 160}) == '{ s: "' + "x" * 150 + '..." }'
    assert bsonobj_string({"ts": Timestamp(5, 6), "n": None, "b": True}) == (
        "{ ts: Timestamp(5, 6), n: null, b: true }"
    )


# -- $match pre-filter --------------------------------------------------------------------------


def test_prefilter_simple_predicates():
    f = match_prefilter([{"$match": {"operationType": {"$in": ["insert", "update"]},
                                     "ns.coll": "c", "fullDocument.a": 1}}])
    assert f is not None
    assert f("insert", "test", "c") and f("update", "test", "c")
    assert not f("delete", "test", "c") and not f("insert", "test", "other")
    assert f("insert", "test", None)  # unknown: never rejected


def test_prefilter_or_and_ns_document():
    f = match_prefilter([{"$match": {"$or": [{"operationType": "insert"},
                                             {"ns": {"db": "test", "coll": "x"}}]}}])
    assert f is not None
    assert f("insert", "a", "b") and f("delete", "test", "x") and not f("delete", "test", "c")


def test_prefilter_absent_when_nothing_is_implied():
    assert match_prefilter([]) is None
    assert match_prefilter([{"$project": {"a": 1}}, {"$match": {"operationType": "x"}}]) is None
    assert match_prefilter([{"$match": {"fullDocument.a": 1}}]) is None
    assert match_prefilter([{"$match": {"operationType": {"$regex": "^ins"}}}]) is None
    assert match_prefilter([{"$match": {"$or": [{"operationType": "insert"}, {"x": 1}]}}]) is None
    collation = {"locale": "en", "strength": 2}
    assert match_prefilter([{"$match": {"operationType": "insert"}}], collation) is None


OPS = ["insert", "update", "delete"]
NAMES = ["test", "c", "Test"]
ALL_OPS = OPS + ["replace", "drop", "rename", "dropDatabase", "invalidate"]
FIELDS = ["operationType", "ns.db", "ns.coll", "documentKey._id", "fullDocument.a", "ns"]

strings = st.sampled_from(OPS + NAMES)
scalars = st.one_of(strings, st.integers(-1, 2), st.none(), st.booleans())
conditions = st.one_of(
    scalars,
    st.builds(lambda v: {"$eq": v}, scalars),
    st.builds(lambda v: {"$ne": v}, scalars),
    st.builds(lambda v: {"$in": v}, st.lists(scalars, max_size=3)),
    st.builds(lambda v: {"$nin": v}, st.lists(scalars, max_size=3)),
    st.builds(lambda v: {"$in": [Regex(v)]}, st.sampled_from(["^in", "c", "^t"])),
    st.builds(lambda v: {"$exists": v}, st.booleans()),
    st.builds(lambda v: {"$regex": v}, st.sampled_from(["^up", "e", "x$"])),
    st.builds(lambda v: {"$not": {"$eq": v}}, scalars),
    st.builds(lambda d, c: {"db": d, "coll": c}, strings, strings),
    st.builds(lambda d: {"db": d}, strings),
)
leaves = st.dictionaries(st.sampled_from(FIELDS), conditions, min_size=1, max_size=3)
queries = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(lambda k, qs: {k: qs}, st.sampled_from(["$and", "$or", "$nor"]),
                  st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda q, extra: {**extra, **q}, children, leaves),
    ),
    max_leaves=6,
)


extras = st.fixed_dictionaries(
    {}, optional={"documentKey": st.builds(lambda v: {"_id": v}, scalars),
                  "fullDocument": st.builds(lambda v: {"a": v}, scalars)}
)
COMBINATIONS = [(op, db, coll) for op in OPS for db in NAMES for coll in [None, *NAMES]]


def _event(op: str, db: str, coll: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    ns = {"db": db} if coll is None else {"db": db, "coll": coll}
    return {"_id": {"_data": "00"}, "operationType": op, "ns": ns, **extra}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=queries, extra=extras)
def test_prefilter_never_rejects_what_the_match_accepts(query, extra):
    """Every (operationType, db, coll) combination, with and without ns.coll: an event the
    full $match accepts always passes the pre-filter."""
    try:
        stages = UserStages([{"$match": query}])
    except MongoError:
        return  # e.g. $in with a non-array: the stream would not open
    prefilter = match_prefilter([{"$match": query}])
    if prefilter is None:
        return
    for op, db, coll in COMBINATIONS:
        if stages.process([_event(op, db, coll, extra)]):
            assert prefilter(op, db, coll), (op, db, coll)


def test_prefilter_rejects_something_for_typical_filters():
    f = match_prefilter([{"$match": {"operationType": "insert", "ns.coll": {"$in": ["c"]}}}])
    assert f is not None
    rejected = [(op, c) for op in ALL_OPS for c in NAMES if not f(op, "test", c)]
    assert len(rejected) == len(ALL_OPS) * len(NAMES) - 1
