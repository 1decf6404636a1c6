"""Type expressions (pipeline_stages/convert_expressions.py) through a real client against the
embedded store, with mongod 8.0's results and errors: `$convert` (its table, onError, onNull,
241 ConversionFailure and the parse errors of `to`), the `$to*` shorthands, `$type`,
`$isNumber`, `$cmp`, `$binarySize` and `$bsonSize`."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

OID = ObjectId("5ab9cbe531c2ab715d42129e")
NO_ON_ERROR = "in $convert with no onError value"
# mongod's context for an error raised while the aggregation runs (a field's value), and for
# one raised while it is optimized (an expression of constants, folded before it runs)
RUN = "PlanExecutor error during aggregation :: caused by :: "
FOLDED = "Failed to optimize pipeline :: caused by :: "


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        collection = server.client().convert.c
        collection.insert_one({"_id": 1, "s": "café", "n": None, "d": datetime.datetime(
            2024, 1, 2, 3, 4, 5, 678000), "b": Binary(b"\x00\x01\x02", 5), "o": {"a": 1}})
        yield collection


def _one(coll: Collection[Any], expr: object) -> object:
    (doc,) = coll.aggregate([{"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


def _error(coll: Collection[Any], expr: object) -> tuple[int | None, str]:
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, expr)
    return exc.value.code, exc.value.details["errmsg"]  # type: ignore[index]


def _typed(value: object) -> tuple[str, object]:
    return type(value).__name__, value


def test_to_string(coll: Collection[Any]) -> None:
    assert _one(coll, {"$toString": 0.1}) == "0.1"
    assert _one(coll, {"$toString": 2.0}) == "2"
    assert _one(coll, {"$toString": 1e21}) == "1e+21"
    assert _one(coll, {"$toString": 1e-05}) == "1e-05"
    code, message = _error(coll, {"$toString": 1234567.0})  # %g and shortest differ: refused
    assert code == 2 and "not supported" in message
    assert _one(coll, {"$toString": -0.0}) == "-0"
    assert _one(coll, {"$toString": float("-inf")}) == "-Infinity"
    assert _one(coll, {"$toString": Int64(5)}) == "5"
    assert _one(coll, {"$toString": True}) == "true"
    assert _one(coll, {"$toString": "$d"}) == "2024-01-02T03:04:05.678Z"
    assert _one(coll, {"$toString": OID}) == "5ab9cbe531c2ab715d42129e"
    assert _one(coll, {"$toString": Decimal128("1.50")}) == "1.50"
    assert _one(coll, {"$toString": "$nope"}) is None
    assert _error(coll, {"$toString": "$o"}) == (
        241, RUN + f"Unsupported conversion from object to string {NO_ON_ERROR}")
    assert _error(coll, {"$toString": Timestamp(1, 2)}) == (
        241, FOLDED + f"Unsupported conversion from timestamp to string {NO_ON_ERROR}")


def test_to_numbers(coll: Collection[Any]) -> None:
    assert _typed(_one(coll, {"$toInt": 2.9})) == ("int", 2)
    assert _typed(_one(coll, {"$toInt": "-12"})) == ("int", -12)
    assert _typed(_one(coll, {"$toLong": 7})) == ("Int64", 7)
    assert _typed(_one(coll, {"$toLong": "$d"})) == ("Int64", 1704164645678)
    assert _typed(_one(coll, {"$toDouble": True})) == ("float", 1.0)
    assert _one(coll, {"$toDouble": "-1.5e3"}) == -1500.0
    assert _one(coll, {"$toDecimal": 2.5}) == Decimal128("2.50000000000000")  # 15 digits
    assert str(_one(coll, {"$toDecimal": 9.999999999999998})) == "10.0000000000000"
    assert str(_one(coll, {"$toDecimal": 0.0})) == "0"
    assert _one(coll, {"$toDecimal": Int64(3)}) == Decimal128("3")
    assert _one(coll, {"$toInt": [Decimal128("-2.7")]}) == -2
    parse = "Failed to parse number '{}' " + NO_ON_ERROR + ": {}"
    assert _error(coll, {"$toInt": "1.5"}) == (
        241, FOLDED + parse.format("1.5", "Did not consume whole string."))
    assert _error(coll, {"$toInt": "99999999999"}) == (
        241, FOLDED + parse.format("99999999999", "Overflow"))
    assert _error(coll, {"$toLong": ""}) == (241, FOLDED + parse.format("", "No digits"))
    assert _error(coll, {"$toDouble": " 1"}) == (
        241, FOLDED + parse.format(" 1", "Leading whitespace"))
    assert _error(coll, {"$toDouble": "1e400"}) == (
        241, FOLDED + parse.format("1e400", "Out of range"))
    assert _error(coll, {"$toDecimal": "abc"}) == (
        241, FOLDED + parse.format("abc", "Failed to parse string to decimal"))
    assert _error(coll, {"$toInt": "0x1F"}) == (
        241, FOLDED + f"Illegal hexadecimal input {NO_ON_ERROR}: 0x1F")
    assert _error(coll, {"$toInt": 1e10}) == (
        241, FOLDED + f"Conversion would overflow target type {NO_ON_ERROR}: 1e+10")
    assert _error(coll, {"$toInt": Int64(2**40)}) == (
        241, FOLDED + f"Conversion would overflow target type {NO_ON_ERROR}: ")
    assert _error(coll, {"$toLong": float("nan")}) == (
        241, FOLDED + f"Attempt to convert NaN value to integer type {NO_ON_ERROR}")
    assert _error(coll, {"$toInt": "$d"}) == (
        241, RUN + f"Unsupported conversion from date to int {NO_ON_ERROR}")


def test_to_bool_date_object_id(coll: Collection[Any]) -> None:
    assert _one(coll, {"$toBool": 0}) is False
    assert _one(coll, {"$toBool": "false"}) is True  # every string is true
    assert _one(coll, {"$toBool": Decimal128("0")}) is False
    assert _one(coll, {"$toBool": "$b"}) is True
    assert _one(coll, {"$toBool": MinKey()}) is True
    assert _one(coll, {"$toDate": Int64(86_400_000)}) == datetime.datetime(1970, 1, 2)
    assert _one(coll, {"$toDate": OID}) == datetime.datetime(2018, 3, 27, 4, 43, 17)
    assert _one(coll, {"$toDate": Timestamp(60, 1)}) == datetime.datetime(1970, 1, 1, 0, 1)
    assert _one(coll, {"$toObjectId": "5ab9cbe531c2ab715d42129e"}) == OID
    assert _error(coll, {"$toDate": 1}) == (
        241, FOLDED + f"Unsupported conversion from int to date {NO_ON_ERROR}")
    assert _error(coll, {"$toObjectId": "xyz"}) == (
        241, FOLDED + f"Failed to parse objectId 'xyz' {NO_ON_ERROR}: Invalid string length for "
        "parsing to OID, expected 24 but found 3")
    assert _error(coll, {"$toObjectId": "5ab9cbe531c2ab715d42129z"}) == (
        241, FOLDED + f"Failed to parse objectId '5ab9cbe531c2ab715d42129z' {NO_ON_ERROR}: Invalid "
        "character found in hex string: z")
    assert _error(coll, {"$toBool": [1, 2]}) == (50723, "$toBool requires a single argument, "
                                                        "got 2")


def test_convert_arguments(coll: Collection[Any]) -> None:
    assert _one(coll, {"$convert": {"input": "x", "to": "int", "onError": "bad"}}) == "bad"
    assert _one(coll, {"$convert": {"input": "$nope", "to": "int", "onNull": 0}}) == 0
    assert _one(coll, {"$convert": {"input": 1, "to": "$nope"}}) is None
    assert _one(coll, {"$convert": {"input": "$nope", "to": "int", "onNull": "$nope"}}) \
        == "<missing>"
    assert _one(coll, {"$convert": {"input": 1, "to": 2.0}}) == "1"
    assert _one(coll, {"$convert": {"input": 1, "to": Int64(18)}}) == 1
    assert _error(coll, {"$convert": {"input": 1, "to": "dinosaur", "onError": 0}}) == (
        2, "Unknown type name: dinosaur")
    assert _error(coll, {"$convert": {"input": "$n", "to": "dinosaur", "onNull": 0}}) == (
        2, "Unknown type name: dinosaur")  # `to` is parsed before a null input is seen
    assert _error(coll, {"$convert": {"input": 1, "to": 3.5}}) == (
        9, "In $convert, numeric 'to' argument is not an integer")
    assert _error(coll, {"$convert": {"input": 1, "to": 100}}) == (
        9, "In $convert, numeric value for 'to' does not correspond to a BSON type: 100")
    assert _error(coll, {"$convert": {"input": 1, "to": True}}) == (
        9, "$convert's 'to' argument must be a string or number, but is bool")
    assert _error(coll, {"$convert": {"input": 1}}) == (9, "Missing 'to' parameter to $convert")
    assert _error(coll, {"$convert": {"to": "int"}}) == (
        9, "Missing 'input' parameter to $convert")
    assert _error(coll, {"$convert": {"input": 1, "to": "int", "x": 1}}) == (
        9, "$convert found an unknown argument: x")
    assert _error(coll, {"$convert": "x"}) == (
        9, "$convert expects an object of named arguments but found: string")
    assert _error(coll, {"$convert": {"input": "$o", "to": "object"}}) == (
        241, RUN + f"Unsupported conversion from object to object {NO_ON_ERROR}")


def test_type_and_is_number(coll: Collection[Any]) -> None:
    shown = {k: {"$type": v} for k, v in {
        "m": "$nope", "n": "$n", "s": "$s", "i": 1, "l": Int64(1), "big": 2**40, "f": 1.5,
        "dec": Decimal128("1"), "o": "$o", "a": [[1]], "b": "$b", "oid": OID, "d": "$d",
        "t": Timestamp(1, 1), "min": MinKey(), "max": MaxKey(), "bool": True}.items()}
    (doc,) = coll.aggregate([{"$project": {"_id": 0, **shown}}])
    assert doc == {"m": "missing", "n": "null", "s": "string", "i": "int", "l": "long",
                   "big": "long", "f": "double", "dec": "decimal", "o": "object", "a": "array",
                   "b": "binData", "oid": "objectId", "d": "date", "t": "timestamp",
                   "min": "minKey", "max": "maxKey", "bool": "bool"}
    assert _one(coll, {"$isNumber": Decimal128("1")}) is True
    assert _one(coll, {"$isNumber": Int64(1)}) is True
    assert _one(coll, {"$isNumber": "1"}) is False
    assert _one(coll, {"$isNumber": "$nope"}) is False
    assert _error(coll, {"$type": [1, 2]}) == (
        16020, "Expression $type takes exactly 1 arguments. 2 were passed in.")


def test_cmp_orders_as_bson(coll: Collection[Any]) -> None:
    assert _one(coll, {"$cmp": [1, 2]}) == -1
    assert _one(coll, {"$cmp": [Int64(2), 2.0]}) == 0
    assert _one(coll, {"$cmp": ["b", "a"]}) == 1
    assert _one(coll, {"$cmp": ["$nope", None]}) == -1
    assert _one(coll, {"$cmp": ["$nope", MinKey()]}) == 1
    assert _one(coll, {"$cmp": [1, "a"]}) == -1  # numbers before strings
    assert _one(coll, {"$cmp": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]}) == -1  # fields in order
    assert _one(coll, {"$cmp": [[1, 2], [1]]}) == 1
    assert _one(coll, {"$cmp": [True, "$d"]}) == -1
    assert _error(coll, {"$cmp": [1]}) == (
        16020, "Expression $cmp takes exactly 2 arguments. 1 were passed in.")


def test_binary_and_bson_size(coll: Collection[Any]) -> None:
    assert _one(coll, {"$binarySize": "$s"}) == 5
    assert _one(coll, {"$binarySize": "$b"}) == 3
    assert _one(coll, {"$binarySize": "$nope"}) is None
    assert _one(coll, {"$bsonSize": "$o"}) == 12
    assert _one(coll, {"$bsonSize": "$n"}) is None
    assert _error(coll, {"$binarySize": 1}) == (
        51276, "$binarySize requires a string or BinData argument, found: int")
    assert _error(coll, {"$bsonSize": [[1]]}) == (
        31393, "$bsonSize requires a document input, found: array")
