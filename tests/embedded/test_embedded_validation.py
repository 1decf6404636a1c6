"""Collection validators with `$jsonSchema`, driven with pymongo: 121 DocumentValidationFailure
with mongod's `errInfo` (`failingDocumentId`, `details.schemaRulesNotSatisfied`), the
validation levels and actions, and `bypassDocumentValidation`."""

from __future__ import annotations

from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import errors

SCHEMA = {
    "bsonType": "object",
    "required": ["name", "age"],
    "properties": {
        "name": {"bsonType": "string", "minLength": 2, "pattern": "^[A-Z]"},
        "age": {"bsonType": ["int", "long"], "minimum": 0, "maximum": 150},
        "kind": {"enum": ["a", "b"]},
        "tags": {"bsonType": "array", "items": {"bsonType": "string"}, "maxItems": 2},
        "score": {"type": "number"},
    },
}


@pytest.fixture
def db(server):
    c = server.client()
    yield c.valid
    c.drop_database("valid")
    c.close()


def _create(db: Any, name: str = "people", **options: Any) -> Any:
    return db.create_collection(name, validator={"$jsonSchema": SCHEMA}, **options)


def _insert_error(coll: Any, doc: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(errors.WriteError) as info:
        coll.insert_one(doc)
    assert info.value.code == 121
    assert info.value.details["errmsg"] == "Document failed validation"
    return info.value.details["errInfo"]


def test_valid_documents_are_written(db):
    coll = _create(db)
    coll.insert_one({"_id": 1, "name": "Ann", "age": 3, "kind": "a", "tags": ["x"],
                     "score": 1.5})
    coll.insert_one({"_id": 2, "name": "Bo", "age": Int64(150)})
    assert coll.count_documents({}) == 2


def test_type_and_required_failures_in_mongods_shape(db):
    coll = _create(db)
    info = _insert_error(coll, {"_id": 7, "name": 5})
    assert info["failingDocumentId"] == 7
    assert info["details"]["operatorName"] == "$jsonSchema"
    rules = sorted(info["details"]["schemaRulesNotSatisfied"], key=lambda r: r["operatorName"])
    assert rules == [
        {"operatorName": "properties", "propertiesNotSatisfied": [
            {"propertyName": "name", "details": [
                {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
                 "reason": "type did not match", "consideredValue": 5,
                 "consideredType": "int"},
            ]},
        ]},
        {"operatorName": "required", "specifiedAs": {"required": ["name", "age"]},
         "missingProperties": ["age"]},
    ]


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("age", -1, {"operatorName": "minimum", "specifiedAs": {"minimum": 0},
                     "reason": "comparison failed", "consideredValue": -1}),
        ("age", 200, {"operatorName": "maximum", "specifiedAs": {"maximum": 150},
                      "reason": "comparison failed", "consideredValue": 200}),
        ("name", "A", {"operatorName": "minLength", "specifiedAs": {"minLength": 2},
                       "reason": "specified string length was not satisfied",
                       "consideredValue": "A"}),
        ("name", "ann", {"operatorName": "pattern", "specifiedAs": {"pattern": "^[A-Z]"},
                         "reason": "regular expression did not match",
                         "consideredValue": "ann"}),
        ("kind", "c", {"operatorName": "enum", "specifiedAs": {"enum": ["a", "b"]},
                       "reason": "value was not found in enum", "consideredValue": "c"}),
        ("tags", ["a", "b", "c"], {"operatorName": "maxItems", "specifiedAs": {"maxItems": 2},
                                   "reason": "array did not match specified length",
                                   "consideredValue": ["a", "b", "c"]}),
        ("tags", [1], {"operatorName": "items",
                       "reason": "At least one item did not match the sub-schema",
                       "itemIndex": 0, "details": [
                           {"operatorName": "bsonType", "specifiedAs": {"bsonType": "string"},
                            "reason": "type did not match", "consideredValue": 1,
                            "consideredType": "int"}]}),
        ("score", "x", {"operatorName": "type", "specifiedAs": {"type": "number"},
                        "reason": "type did not match", "consideredValue": "x",
                        "consideredType": "string"}),
    ],
)
def test_property_rules(db, field, value, rule):
    coll = _create(db)
    doc = {"_id": 1, "name": "Ann", "age": 30, field: value}
    info = _insert_error(coll, doc)
    assert info["details"]["schemaRulesNotSatisfied"] == [
        {"operatorName": "properties",
         "propertiesNotSatisfied": [{"propertyName": field, "details": [rule]}]},
    ]


def test_additional_properties_false(db):
    schema = {"bsonType": "object", "properties": {"_id": {}, "a": {}},
              "additionalProperties": False}
    coll = db.create_collection("strict", validator={"$jsonSchema": schema})
    coll.insert_one({"_id": 1, "a": 1})
    info = _insert_error(coll, {"_id": 2, "a": 1, "b": 2, "c": 3})
    assert info["details"]["schemaRulesNotSatisfied"] == [
        {"operatorName": "additionalProperties",
         "specifiedAs": {"additionalProperties": False}, "additionalProperties": ["b", "c"]},
    ]


def test_updates_are_validated_and_nothing_is_written(db, server):
    coll = _create(db)
    coll.insert_one({"_id": 1, "name": "Ann", "age": 30})
    mark = len(server.entries())
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": 1}, {"$set": {"age": "old"}})
    assert info.value.code == 121
    assert info.value.details["errInfo"]["failingDocumentId"] == 1
    assert coll.find_one() == {"_id": 1, "name": "Ann", "age": 30}
    assert server.entries()[mark:] == []


def test_bypass_document_validation(db):
    coll = _create(db)
    coll.insert_one({"_id": 1}, bypass_document_validation=True)
    assert coll.find_one() == {"_id": 1}


def test_moderate_level_lets_invalid_documents_stay_invalid(db):
    coll = _create(db, validationLevel="moderate")
    coll.insert_one({"_id": 1}, bypass_document_validation=True)
    coll.update_one({"_id": 1}, {"$set": {"x": 1}})  # was invalid: not validated
    coll.insert_one({"_id": 2, "name": "Ann", "age": 1})
    with pytest.raises(errors.WriteError):  # was valid: validated
        coll.update_one({"_id": 2}, {"$unset": {"age": ""}})


def test_warn_action_writes_the_document(db):
    coll = _create(db, validationAction="warn")
    coll.insert_one({"_id": 1, "name": 1})
    assert coll.count_documents({}) == 1


def test_schema_together_with_query_operators(db):
    coll = db.create_collection(
        "mixed", validator={"$jsonSchema": {"required": ["a"]}, "a": {"$gt": 0}}
    )
    coll.insert_one({"_id": 1, "a": 1})
    for bad in ({"_id": 2, "a": 0}, {"_id": 3}):
        with pytest.raises(errors.WriteError) as info:
            coll.insert_one(bad)
        assert info.value.code == 121
        assert info.value.details["errInfo"]["failingDocumentId"] == bad["_id"]


def test_query_operator_validator(db):
    coll = db.create_collection("q", validator={"qty": {"$gte": 0}})
    coll.insert_one({"_id": 1, "qty": 1})
    with pytest.raises(errors.WriteError) as info:
        coll.insert_one({"_id": 2, "qty": -1})
    assert info.value.code == 121
