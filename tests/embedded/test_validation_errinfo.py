"""`errInfo.details` of a 121 DocumentValidationFailure for validators of query operators, as
mongod 5.0+ generates them (doc_validation_error.cpp), through pymongo: the CRUD prose test's
`{x: {$type: "string"}}`, the implicit and explicit `$and`, `$or`, `$nor`, `$not`, the
negations (`$ne`, `$exists: false`) and type mismatches."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import errors
from pymongo.database import Database

from tests.support.embedded_support import database_for_test


@pytest.fixture
def db(client, request) -> Database:
    return database_for_test(client, request)


def _details(db: Database, validator: dict[str, Any], doc: dict[str, Any]) -> Any:
    db.create_collection("v", validator=validator)
    with pytest.raises(errors.WriteError) as info:
        db.v.insert_one(doc)
    assert info.value.code == 121
    err_info = info.value.details["errInfo"]
    assert err_info["failingDocumentId"] == doc["_id"]
    return err_info["details"]


def test_a_type_mismatch_as_the_crud_prose_test_makes_it(db: Database) -> None:
    details = _details(db, {"x": {"$type": "string"}}, {"_id": 1, "x": 1})
    assert list(details.items()) == [
        ("operatorName", "$type"), ("specifiedAs", {"x": {"$type": "string"}}),
        ("reason", "type did not match"), ("consideredValue", 1), ("consideredType", "int")]


def test_a_missing_path(db: Database) -> None:
    assert _details(db, {"a": {"$exists": True}}, {"_id": 1, "b": 1}) == {
        "operatorName": "$exists", "specifiedAs": {"a": {"$exists": True}},
        "reason": "path does not exist"}
    db.drop_collection("v")
    assert _details(db, {"a": 1}, {"_id": 1}) == {
        "operatorName": "$eq", "specifiedAs": {"a": 1}, "reason": "field was missing"}


def test_several_clauses_are_an_and_of_those_that_failed(db: Database) -> None:
    details = _details(db, {"a": {"$gt": 1, "$lt": 5}, "b": {"$in": [1, 2]}},
                       {"_id": 1, "a": 7, "b": 2})
    assert list(details) == ["operatorName", "clausesNotSatisfied"]
    assert details == {"operatorName": "$and", "clausesNotSatisfied": [
        {"index": 1, "details": {"operatorName": "$lt", "specifiedAs": {"a": {"$lt": 5}},
                                 "reason": "comparison failed", "consideredValue": 7}}]}


def test_or_reports_every_clause_and_nor_those_that_matched(db: Database) -> None:
    assert _details(db, {"$or": [{"a": 1}, {"b": {"$in": [1, 2]}}]},
                    {"_id": 1, "a": [3, 4], "b": 5}) == {
        "operatorName": "$or", "clausesNotSatisfied": [
            {"index": 0, "details": {"operatorName": "$eq", "specifiedAs": {"a": 1},
                                     "reason": "comparison failed",
                                     "consideredValues": [3, 4]}},
            {"index": 1, "details": {"operatorName": "$in", "specifiedAs": {"b": {"$in": [1, 2]}},
                                     "reason": "no matching value found in array",
                                     "consideredValue": 5}}]}
    db.drop_collection("v")
    assert _details(db, {"$nor": [{"a": 1}, {"b": 2}]}, {"_id": 1, "a": 1, "b": 3}) == {
        "operatorName": "$nor", "clausesNotSatisfied": [
            {"index": 0, "details": {"operatorName": "$eq", "specifiedAs": {"a": 1},
                                     "reason": "comparison succeeded", "consideredValue": 1}}]}


def test_negations_report_inverted(db: Database) -> None:
    assert _details(db, {"a": {"$ne": 1}}, {"_id": 1, "a": 1}) == {
        "operatorName": "$ne", "specifiedAs": {"a": {"$ne": 1}},
        "reason": "comparison succeeded", "consideredValue": 1}
    db.drop_collection("v")
    assert _details(db, {"a": {"$exists": False}}, {"_id": 1, "a": 1}) == {
        "operatorName": "$exists", "specifiedAs": {"a": {"$exists": False}},
        "reason": "path does exist"}
    db.drop_collection("v")
    assert _details(db, {"a": {"$not": {"$gt": 1}}}, {"_id": 1, "a": 2}) == {
        "operatorName": "$not", "details": {
            "operatorName": "$gt", "specifiedAs": {"a": {"$gt": 1}},
            "reason": "comparison succeeded", "consideredValue": 2}}


def test_operators_that_expect_a_type(db: Database) -> None:
    details = _details(db, {"a": {"$regex": "^x"}}, {"_id": 1, "a": 5})
    assert list(details.items()) == [
        ("operatorName", "$regex"), ("specifiedAs", {"a": {"$regex": "^x"}}),
        ("reason", "type did not match"), ("consideredType", "int"),
        ("expectedTypes", ["regex", "string", "symbol"]), ("consideredValue", 5)]
    db.drop_collection("v")
    assert _details(db, {"a": {"$size": 2}}, {"_id": 1, "a": [1]}) == {
        "operatorName": "$size", "specifiedAs": {"a": {"$size": 2}},
        "reason": "array length was not equal to given size", "consideredValue": [1]}


def test_a_json_schema_beside_other_clauses(db: Database) -> None:
    assert _details(db, {"$jsonSchema": {"required": ["q"]}, "a": 1}, {"_id": 1, "a": 1}) == {
        "operatorName": "$and", "clausesNotSatisfied": [
            {"index": 0, "details": {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": [
                {"operatorName": "required", "specifiedAs": {"required": ["q"]},
                 "missingProperties": ["q"]}]}}]}


def test_an_expr_reports_its_result(db: Database) -> None:
    assert _details(db, {"$expr": {"$gt": ["$a", "$b"]}}, {"_id": 1, "a": 1, "b": 2}) == {
        "operatorName": "$expr", "specifiedAs": {"$expr": {"$gt": ["$a", "$b"]}},
        "reason": "expression did not match", "expressionResult": False}
