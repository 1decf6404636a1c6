"""Arithmetic expressions (pipeline_stages/math_expressions.py) through a pymongo client
against the embedded store: mongod 8.0's results, result types and errors (evaluate_math.cpp,
expression_trigonometric.h, accumulator_std_dev.cpp, jstests/aggregation/expressions/
round_trunc.js, trig_*.js, bitwise.js)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer

D = Decimal128


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        client = server.client()
        collection = client.math_expressions.c
        collection.insert_one({"_id": 1, "x": 2.675, "n": [1, 2, 3, 4], "i": 12, "l": Int64(10)})
        yield collection
        client.close()


def _one(coll: Collection[Any], expr: Any) -> Any:
    (doc,) = coll.aggregate([{"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


def _typed(v: Any) -> tuple[str, Any]:
    return type(v).__name__, v


@pytest.mark.parametrize(("expr", "expected"), [
    ({"$round": [2.5, 0]}, 2.0),  # ties to even
    ({"$round": [3.5]}, 4.0),
    ({"$round": [-2.5]}, -2.0),
    ({"$round": ["$x", 2]}, 2.67),  # 2.675 is 2.67499999... as a double
    ({"$round": [D("2.675"), 2]}, D("2.68")),
    ({"$round": [D("1"), 2]}, D("1.00")),
    ({"$round": [D("Infinity"), 1]}, D("Infinity")),
    ({"$round": [1234, -2]}, 1200),
    ({"$round": [Int64(1250), -2]}, Int64(1200)),
    ({"$round": [1234, 2]}, 1234),
    ({"$round": [2147483647, -1]}, Int64(2147483650)),  # an int that no longer fits
    ({"$round": [1.5, None]}, None),
    ({"$round": ["$zz", 1]}, None),
    ({"$trunc": [1.279, 2]}, 1.27),
    ({"$trunc": [-1.27]}, -1.0),
    ({"$trunc": [1299, -2]}, 1200),
    ({"$trunc": [D("-1.279"), 1]}, D("-1.2")),
    ({"$sin": 0}, 0.0),
    ({"$cos": Int64(0)}, 1.0),
    ({"$tan": 0.0}, 0.0),
    ({"$asin": 1}, math.pi / 2),
    ({"$acos": -1}, math.pi),
    ({"$atan": 1}, math.atan(1)),
    ({"$atanh": 1}, math.inf),
    ({"$acosh": 1}, 0.0),
    ({"$asinh": 0}, 0.0),
    ({"$sinh": 1000}, math.inf),
    ({"$cosh": -1000}, math.inf),
    ({"$tanh": 1}, math.tanh(1)),
    ({"$sin": None}, None),
    ({"$acos": "$zz"}, None),
    ({"$atan2": [1, 0]}, math.pi / 2),
    ({"$atan2": [1, None]}, None),
    ({"$degreesToRadians": 180}, math.pi),
    ({"$degreesToRadians": D("90")}, D("1.570796326794896619231321691639752")),
    ({"$radiansToDegrees": D("1")}, D("57.29577951308232087679815481410517")),
    ({"$radiansToDegrees": math.pi}, 180.0),
    ({"$bitAnd": [12, 10]}, 8),
    ({"$bitAnd": []}, -1),
    ({"$bitOr": ["$i", "$l"]}, Int64(14)),
    ({"$bitXor": [12, 10, 1]}, 7),
    ({"$bitOr": [1, None]}, None),
    ({"$bitNot": 12}, -13),
    ({"$bitNot": Int64(12)}, Int64(-13)),
    ({"$bitNot": "$zz"}, None),
    ({"$stdDevPop": ["$n"]}, math.sqrt(1.25)),
    ({"$stdDevSamp": [1, 2, 3, 4]}, math.sqrt(5 / 3)),
    ({"$stdDevPop": [1, "a", None, 3]}, 1.0),  # non-numbers ignored
    ({"$stdDevSamp": [[1]]}, None),
    ({"$stdDevPop": "$zz"}, None),
    ({"$stdDevPop": [[]]}, None),
])
def test_results(coll: Collection[Any], expr: Any, expected: Any) -> None:
    assert _typed(_one(coll, expr)) == _typed(expected)


def test_nan_passes_through(coll: Collection[Any]) -> None:
    assert math.isnan(_one(coll, {"$acos": math.nan}))
    assert _one(coll, {"$asin": D("NaN")}).to_decimal().is_nan()


def test_trunc_of_one_number_and_rand(coll: Collection[Any]) -> None:
    # mongomock had the one-operand $trunc; $rand it had not.
    assert _typed(_one(coll, {"$trunc": -1.7})) == _typed(-1.0)
    assert _typed(_one(coll, {"$trunc": Int64(5)})) == _typed(Int64(5))
    draws = [_one(coll, {"$rand": {}}) for _ in range(5)]
    assert all(type(d) is float and 0 <= d < 1 for d in draws) and len(set(draws)) > 1


@pytest.mark.parametrize(("expr", "code", "message"), [
    ({"$round": ["a"]}, 51081, "$round only supports numeric types, not string"),
    ({"$trunc": [1, 1.5]}, 51082, "precision argument to  $trunc must be a integral value"),
    ({"$round": [1, 101]}, 51083,
     "cannot apply $round with precision value 101 value must be in [-20, 100]"),
    ({"$round": [1, "x"]}, 16003, "can't convert from BSON type string to long"),
    ({"$round": [1, 2, 3]}, 28667,
     "Expression $round takes at least 1 arguments, and at most 2, but 3 were passed in."),
    ({"$sin": "a"}, 28765, "$sin only supports numeric types, not string"),
    ({"$sin": [1, 2]}, 16020, "Expression $sin takes exactly 1 arguments. 2 were passed in."),
    ({"$sin": math.inf}, 50989, "cannot apply $sin to inf, value must be in (-inf,inf)"),
    ({"$cos": -math.inf}, 50989, "cannot apply $cos to -inf, value must be in (-inf,inf)"),
    ({"$acos": 2}, 50989, "cannot apply $acos to 2, value must be in [-1,1]"),
    ({"$asin": -1.5}, 50989, "cannot apply $asin to -1.5, value must be in [-1,1]"),
    ({"$atanh": 1.0000001}, 50989, "cannot apply $atanh to 1, value must be in [-1,1]"),
    ({"$acosh": 0.5}, 50989, "cannot apply $acosh to 0.5, value must be in [1,inf]"),
    ({"$atan2": ["a", 1]}, 51044, "$atan2 only supports numeric types, not string"),
    ({"$atan2": [1, True]}, 51045, "$atan2 only supports numeric types, not bool"),
    ({"$degreesToRadians": "a"}, 28765,
     "$degreesToRadians only supports numeric types, not string"),
    ({"$bitAnd": [1, 1.0]}, 14, "$bitAnd only supports int and long operands."),
    ({"$bitXor": "a"}, 14, "$bitXor only supports int and long operands."),
    ({"$bitNot": 1.5}, 14, "$bitNot only supports int and long, not: double."),
    ({"$bitNot": "a"}, 28765, "$bitNot only supports numeric types, not string"),
    ({"$rand": {"a": 1}}, 3040501, "$rand does not currently accept arguments"),
    ({"$rand": 1}, 10065, "invalid parameter: expected an object ($rand)"),
])
def test_errors(coll: Collection[Any], expr: Any, code: int, message: str) -> None:
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, expr)
    assert (exc.value.code, exc.value.details["errmsg"]) == (code, message)  # type: ignore[index]


def _q(name: str, **spec: Any) -> dict[str, Any]:
    return {name: {**spec, "method": "approximate"}}


@pytest.mark.parametrize(("expr", "expected"), [
    (_q("$median", input=[4, 1, 3, 2]), 2.0),  # the lower of the two middle ranks
    (_q("$median", input=[4, 1, "x", None, 3]), 3.0),  # non-numbers ignored
    (_q("$median", input=[Int64(5), D("2.5")]), 2.5),
    (_q("$median", input=7), 7.0),
    (_q("$median", input=[]), None),
    (_q("$median", input="$zz"), None),
    (_q("$percentile", input="$n", p=[0, 0.5, 0.9, 1]), [1.0, 2.0, 4.0, 4.0]),
    (_q("$percentile", input=7, p=[0.1, 0.2]), [7.0, 7.0]),
    (_q("$percentile", input=["a"], p=[0.1, 0.2]), [None, None]),
    (_q("$percentile", input=[math.inf, 1, -math.inf, math.nan], p=[0, 0.5, 1]),
     [-math.inf, 1.0, math.inf]),  # NaN left out, infinities ranked
    (_q("$percentile", input="$n", p={"$literal": [0.25]}), [1.0]),
])
def test_quantiles(coll: Collection[Any], expr: Any, expected: Any) -> None:
    got = _one(coll, expr)
    assert got == expected
    if isinstance(expected, list):
        assert [type(x) for x in got] == [type(x) for x in expected]
    else:
        assert type(got) is type(expected)


@pytest.mark.parametrize(("expr", "code", "message"), [
    ({"$median": 1}, 7436201, "specification must be an object; found $median: 1"),
    ({"$percentile": [1]}, 7436200, "specification must be an object; found $percentile: [ 1 ]"),
    ({"$median": {"input": 1}}, 40414,
     "BSON field '$median.method' is missing but a required field"),
    ({"$percentile": {"input": 1, "method": "approximate"}}, 40414,
     "BSON field '$percentile.p' is missing but a required field"),
    ({"$median": {"input": 1, "method": 1}}, 14,
     "BSON field '$median.method' is the wrong type 'int', expected type 'string'"),
    ({"$median": {"input": 1, "method": "approximate", "p": [1]}}, 40415,
     "BSON field '$median.p' is an unknown field."),
    ({"$median": {"input": 1, "method": "exact"}}, 2,
     "Currently only 'approximate' can be used as percentile 'method'."),
    (_q("$percentile", input=1, p="$x"), 7750300, "The $percentile 'p' field must be an array "
     "of constant values, but found value: \"$x\"."),
    (_q("$percentile", input=1, p=[]), 7750301, "The $percentile 'p' field must be an array of "
     "numbers from [0.0, 1.0], but found: []"),
    (_q("$percentile", input=1, p=["a"]), 7750302, "The $percentile 'p' field must be an array "
     "of numbers from [0.0, 1.0], but found: \"a\""),
    (_q("$percentile", input=1, p=[1.5]), 7750303, "The $percentile 'p' field must be an array "
     "of numbers from [0.0, 1.0], but found: 1.5"),
])
def test_quantile_errors(coll: Collection[Any], expr: Any, code: int, message: str) -> None:
    test_errors(coll, expr, code, message)
