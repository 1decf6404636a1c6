"""Array and set expressions (pipeline_stages/array_expressions.py) through a pymongo client
against the embedded store, with mongod 8.0's results and errors (evaluate_array.cpp,
accumulator_multi.cpp, jstests/aggregation/expressions/*)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def coll() -> Iterator[Collection[Any]]:
    with EmbeddedServer() as server:
        client = server.client()
        collection = client.array_expressions.c
        collection.insert_one({"_id": 1, "a": [3, 1, 2], "o": {"x": 1, "y": [2]}, "l": Int64(7)})
        yield collection
        client.close()


def _one(coll: Collection[Any], expr: Any) -> Any:
    (doc,) = coll.aggregate([{"$project": {"_id": 0, "v": expr}}])
    return doc.get("v", "<missing>")


def _error(coll: Collection[Any], expr: Any) -> tuple[int | None, str]:
    with pytest.raises(errors.OperationFailure) as exc:
        _one(coll, expr)
    return exc.value.code, exc.value.details["errmsg"]  # type: ignore[index]


@pytest.mark.parametrize(("expr", "expected"), [
    ({"$firstN": {"input": "$a", "n": 2}}, [3, 1]),
    ({"$firstN": {"n": 5, "input": [1, "$zz"]}}, [1, None]),
    ({"$lastN": {"input": "$a", "n": 2.0}}, [1, 2]),
    ({"$maxN": {"input": [1, None, 3, "$zz", 2], "n": 2}}, [3, 2]),
    ({"$minN": {"input": [4, None, 3, 2], "n": Int64(2)}}, [2, 3]),
    ({"$minN": {"input": [None], "n": 1}}, []),
    ({"$sortArray": {"input": "$a", "sortBy": 1}}, [1, 2, 3]),
    ({"$sortArray": {"input": [3, "s", {"k": 1}, None, 1.5], "sortBy": -1}},
     [{"k": 1}, "s", 3, 1.5, None]),
    ({"$sortArray": {"input": [{"a": 2, "b": 1}, {"a": 1}, {"b": 0}, {"a": 2, "b": 0}],
                     "sortBy": {"a": -1, "b": 1}}},
     [{"a": 2, "b": 0}, {"a": 2, "b": 1}, {"a": 1}, {"b": 0}]),
    ({"$sortArray": {"input": "$zz", "sortBy": 1}}, None),
    ({"$sortArray": {"input": [{"a": [2]}, {"a": [1, 5]}, {"a": 3}], "sortBy": {"a": 1}}},
     [{"a": 3}, {"a": [1, 5]}, {"a": [2]}]),  # an array compared whole, after numbers
    ({"$sortArray": {"input": [{"a": [1, 5]}, {"a": [9, 2]}, {"a": [0]}],
                     "sortBy": {"a.1": -1}}},
     [{"a": [1, 5]}, {"a": [9, 2]}, {"a": [0]}]),  # "a.1" indexes; a.1 of [0] is null
    ({"$sortArray": {"input": [{"a": [{"b": 2}]}, {"a": {"b": 1}}], "sortBy": {"a.b": 1}}},
     [{"a": [{"b": 2}]}, {"a": {"b": 1}}]),  # a field name does not reach into an array
    ({"$sortArray": {"input": [{"a": 1}, 5, "s"], "sortBy": {"a": 1}}}, [5, "s", {"a": 1}]),
    ({"$sortArray": {"input": [2, 1], "sortBy": -1.0}}, [2, 1]),
    ({"$reverseArray": "$a"}, [2, 1, 3]),
    ({"$reverseArray": [[]]}, []),
    ({"$reverseArray": "$zz"}, None),
    ({"$zip": {"inputs": ["$a", [4, 5]]}}, [[3, 4], [1, 5]]),
    ({"$zip": {"inputs": ["$a", [4]], "useLongestLength": True}},
     [[3, 4], [1, None], [2, None]]),
    ({"$zip": {"inputs": ["$a", [4]], "useLongestLength": True, "defaults": ["d", "$l"]}},
     [[3, 4], [1, 7], [2, 7]]),
    ({"$zip": {"inputs": ["$a", "$zz"]}}, None),
    ({"$range": [0, 10, 3]}, [0, 3, 6, 9]),
    ({"$range": [10, 0, -4]}, [10, 6, 2]),
    ({"$range": [0, -3]}, []),
    ({"$range": [Int64(1), 3.0]}, [1, 2]),
    ({"$indexOfArray": ["$a", 2.0]}, 2),
    ({"$indexOfArray": [[1, 2, 1], 1, 1]}, 2),
    ({"$indexOfArray": [[1, 2, 1], 1, 1, 2]}, -1),
    ({"$indexOfArray": [[None], "$zz"]}, 0),
    ({"$indexOfArray": ["$zz", 1]}, None),
    ({"$arrayToObject": [[["a", 1], ["b", 2], ["a", 3]]]}, {"a": 3, "b": 2}),
    ({"$arrayToObject": [[{"k": "p", "v": 1}]]}, {"p": 1}),
    ({"$arrayToObject": [[]]}, {}),
    ({"$mergeObjects": ["$o", None, "$zz", {"x": 5, "z": 1}]}, {"x": 5, "y": [2], "z": 1}),
    ({"$mergeObjects": "$zz"}, {}),
    ({"$allElementsTrue": [[1, True, "s", []]]}, True),
    ({"$allElementsTrue": [[1, 0]]}, False),
    ({"$allElementsTrue": [[]]}, True),
    ({"$anyElementTrue": [[0, False, None]]}, False),
    ({"$anyElementTrue": [[0, 0.5]]}, True),
    ({"$setUnion": [[3, 1, 2], [2.0, 3, "x"]]}, [1, 2, 3, "x"]),
    ({"$setUnion": [[1], "$zz"]}, None),
    ({"$setIntersection": [[3, 1, 2, 2], [2, 3, 4]]}, [2, 3]),
    ({"$setIntersection": [[1], None]}, None),
    ({"$setDifference": [[3, 1, 1, 2], [2]]}, [3, 1]),
    ({"$setDifference": [[1], "$zz"]}, None),
    ({"$setIsSubset": [[1, 1], [2, 1]]}, True),
    ({"$setIsSubset": [[3], [2, 1]]}, False),
    ({"$concatArrays": ["$a", ["$zz"]]}, [3, 1, 2, None]),
    ({"$slice": ["$a", -5, 2]}, [3, 1]),
    ({"$slice": ["$a", 1, None]}, None),
    ({"$arrayElemAt": ["$a", None]}, None),
    ({"$first": [[]]}, "<missing>"),
    ({"$last": "$zz"}, None),
])
def test_results(coll: Collection[Any], expr: Any, expected: Any) -> None:
    assert _one(coll, expr) == expected


# Cases mongomock already answered as mongod does, checked together with the result types,
# which it did not (its $indexOfArray and $maxN were missing).
_ALREADY = [
    ({"$arrayToObject": "$zz"}, None),
    ({"$objectToArray": "$o"}, [{"k": "x", "v": 1}, {"k": "y", "v": [2]}]),
    ({"$setUnion": []}, []),
    ({"$setEquals": [[1, 2], [2, 1, 1], [2.0, 1]]}, True),
    ({"$setEquals": [[1, 2], [2]]}, False),
    ({"$concatArrays": ["$a", "$zz"]}, None),
    ({"$slice": ["$a", -2]}, [1, 2]),
    ({"$slice": ["$a", 1, 10]}, [1, 2]),
    ({"$slice": ["$a", 5, 1]}, []),
    ({"$arrayElemAt": ["$a", -1]}, 2),
    ({"$arrayElemAt": ["$a", 3]}, "<missing>"),
    ({"$arrayElemAt": ["$a", -4]}, "<missing>"),
    ({"$first": "$a"}, 3),
    ({"$last": "$a"}, 2),
]


def test_result_types_and_cases_mongomock_had(coll: Collection[Any]) -> None:
    assert [_one(coll, expr) for expr, _ in _ALREADY] == [expected for _, expected in _ALREADY]
    assert type(_one(coll, {"$indexOfArray": ["$a", 1]})) is int
    assert [type(x) for x in _one(coll, {"$range": [Int64(0), 2]})] == [int, int]
    kept = _one(coll, {"$maxN": {"input": [1, Int64(1), 1.0], "n": 3}})
    assert [type(x) for x in kept] == [float, Int64, int]  # equal values, later first
    union = _one(coll, {"$setUnion": [[1.0], [1, Int64(1)]]})
    assert union == [1.0] and type(union[0]) is float  # the first of equal values


@pytest.mark.parametrize(("expr", "code", "message"), [
    ({"$firstN": 1}, 5787801, "specification must be an object; found $firstN: 1"),
    ({"$maxN": [1]}, 5787900, "specification must be an object; found $maxN: [ 1 ]"),
    ({"$lastN": 1.5}, 5787801, "specification must be an object; found $lastN: 1.5"),
    ({"$firstN": {"input": [], "n": 1, "x": 1}}, 5787901, "Unknown argument for 'n' operator: x"),
    ({"$lastN": {"input": []}}, 5787906, "Missing value for 'n'"),
    ({"$lastN": {"n": 1}}, 5787907, "Missing value for 'input'"),
    ({"$firstN": {"input": [], "n": "s"}}, 5787902,
     "Value for 'n' must be of integral type, but found \"s\""),
    ({"$firstN": {"input": [], "n": 1.5}}, 5787903,
     "Value for 'n' must be of integral type, but found 1.5"),
    ({"$minN": {"input": [], "n": 0}}, 5787908, "'n' must be greater than 0, found 0"),
    ({"$minN": {"input": "$zz", "n": 1}}, 5788200, "Input must be an array"),
    ({"$sortArray": [1]}, 2942500, "$sortArray requires an object as an argument, found: array"),
    ({"$sortArray": {"input": [], "sortBy": 1, "x": 1}}, 2942501,
     "$sortArray found an unknown argument: x"),
    ({"$sortArray": {"sortBy": 1}}, 2942502, "$sortArray requires 'input' to be specified"),
    ({"$sortArray": {"input": []}}, 2942503, "$sortArray requires 'sortBy' to be specified"),
    ({"$sortArray": {"input": 1, "sortBy": 1}}, 2942504,
     "The input argument to $sortArray must be an array, but was of type: int"),
    ({"$sortArray": {"input": [], "sortBy": 2}}, 2942506,
     "The $sort element value must be either 1 or -1"),
    ({"$sortArray": {"input": [], "sortBy": "a"}}, 2942506,
     "The $sort element value must be either 1 or -1"),
    ({"$sortArray": {"input": [], "sortBy": {}}}, 2,
     "The $sort pattern is empty when it should be a set of fields."),
    ({"$sortArray": {"input": [], "sortBy": {"a": 0}}}, 2,
     "The $sort element value must be either 1 or -1"),
    ({"$sortArray": {"input": [], "sortBy": {"": 1}}}, 2, "The $sort field cannot be empty"),
    ({"$sortArray": {"input": [], "sortBy": {"a..b": 1}}}, 2,
     "The $sort field is a dotted field but has an empty part: a..b"),
    ({"$reverseArray": 1}, 34435,
     "The argument to $reverseArray must be an array, but was of type: int"),
    ({"$reverseArray": [[1], [2]]}, 16020,
     "Expression $reverseArray takes exactly 1 arguments. 2 were passed in."),
    ({"$zip": 1}, 34460, "$zip only supports an object as an argument, found int"),
    ({"$zip": {"inputs": 1}}, 34461, "inputs must be an array of expressions, found int"),
    ({"$zip": {"inputs": [[1]], "defaults": 1}}, 34462,
     "defaults must be an array of expressions, found int"),
    ({"$zip": {"inputs": [[1]], "useLongestLength": 1}}, 34463,
     "useLongestLength must be a bool, found object"),
    ({"$zip": {"inputs": [[1]], "x": 1}}, 34464, "$zip found an unknown argument: x"),
    ({"$zip": {}}, 34465, "$zip requires at least one input array"),
    ({"$zip": {"inputs": [[1]], "defaults": [1]}}, 34466,
     "cannot specify defaults unless useLongestLength is true"),
    ({"$zip": {"inputs": [[1]], "defaults": [1, 2], "useLongestLength": True}}, 34467,
     "defaults and inputs must have the same length"),
    ({"$zip": {"inputs": [[1], 2]}}, 34468, "$zip found a non-array expression in input: 2"),
    ({"$range": ["a", 1]}, 34443,
     "$range requires a numeric starting value, found value of type: string"),
    ({"$range": [0.5, 1]}, 34444, "$range requires a starting value that can be represented "
     "as a 32-bit integer, found value: 0.5"),
    ({"$range": [0, "$zz"]}, 34445,
     "$range requires a numeric ending value, found value of type: missing"),
    ({"$range": [0, 2**40]}, 34446, "$range requires an ending value that can be represented "
     "as a 32-bit integer, found value: 1099511627776"),
    ({"$range": [0, 1, None]}, 34447,
     "$range requires a numeric step value, found value of type:null"),
    ({"$range": [0, 1, 0]}, 34449, "$range requires a non-zero step value"),
    ({"$range": [0]}, 28667,
     "Expression $range takes at least 2 arguments, and at most 3, but 1 were passed in."),
    ({"$indexOfArray": [1, 1]}, 40090,
     "$indexOfArray requires an array as a first argument, found: int"),
    ({"$indexOfArray": [[1], 1, 1.5]}, 40096, "$indexOfArrayrequires an integral starting "
     "index, found a value of type: double, with value: 1.5"),
    ({"$indexOfArray": [[1], 1, 0, -1]}, 40097,
     "$indexOfArray requires a nonnegative ending index, found: -1"),
    ({"$arrayToObject": 1}, 40386, "$arrayToObject requires an array input, found: int"),
    ({"$arrayToObject": [[1]]}, 40398, "Unrecognised input type format for $arrayToObject: int"),
    ({"$arrayToObject": [[["a", 1], {"k": "b", "v": 1}]]}, 40396,
     "$arrayToObject requires a consistent input format. Elements mustall be arrays or all be "
     "objects. Array was detected, now found: object"),
    ({"$arrayToObject": [[["a"]]]}, 40397,
     "$arrayToObject requires an array of size 2 arrays,found array of size: 1"),
    ({"$arrayToObject": [[[1, 1]]]}, 40395, "$arrayToObject requires an array of key-value "
     "pairs, where the key must be of type string. Found key type: int"),
    ({"$arrayToObject": [[{"k": "a", "v": 1}, ["b", 1]]]}, 40391,
     "$arrayToObject requires a consistent input format. Elements mustall be arrays or all be "
     "objects. Object was detected, now found: array"),
    ({"$arrayToObject": [[{"k": "a"}]]}, 40392, "$arrayToObject requires an object keys of "
     "'k' and 'v'. Found incorrect number of keys:1"),
    ({"$arrayToObject": [[{"k": "a", "x": 1}]]}, 40393, "$arrayToObject requires an object "
     "with keys 'k' and 'v'. Missing either or both keys from: {k: \"a\", x: 1}"),
    ({"$arrayToObject": [[{"k": 1, "v": 1}]]}, 40394, "$arrayToObject requires an object with "
     "keys 'k' and 'v', where the value of 'k' must be of type string. Found type: int"),
    ({"$objectToArray": 1}, 40390, "$objectToArray requires a document input, found: int"),
    ({"$mergeObjects": [{}, 1]}, 40400,
     "$mergeObjects requires object inputs, but input 1 is of type int"),
    ({"$allElementsTrue": "$zz"}, 17040,
     "$allElementsTrue's argument must be an array, but is missing"),
    ({"$anyElementTrue": 1}, 17041, "$anyElementTrue's argument must be an array, but is int"),
    ({"$setUnion": [[1], 1]}, 17043,
     "All operands of $setUnion must be arrays. One argument is of type: int"),
    ({"$setIntersection": [[1], 1]}, 17047,
     "All operands of $setIntersection must be arrays. One argument is of type: int"),
    ({"$setDifference": [1, [1]]}, 17048,
     "both operands of $setDifference must be arrays. First argument is of type: int"),
    ({"$setDifference": [[1], 1]}, 17049,
     "both operands of $setDifference must be arrays. Second argument is of type: int"),
    ({"$setIsSubset": [None, [1]]}, 17046,
     "both operands of $setIsSubset must be arrays. First argument is of type: null"),
    ({"$setIsSubset": [[1], "$zz"]}, 17042,
     "both operands of $setIsSubset must be arrays. Second argument is of type: missing"),
    ({"$setEquals": [[1], None]}, 17044,
     "All operands of $setEquals must be arrays. 2-th argument is of type: null"),
    ({"$setEquals": [[1]]}, 17045, "$setEquals needs at least two arguments had: 1"),
    ({"$concatArrays": [[1], 1]}, 28664, "$concatArrays only supports arrays, not int"),
    ({"$slice": [1, 1]}, 28724, "First argument to $slice must be an array, but is of type: int"),
    ({"$slice": [[1], "s"]}, 28725,
     "Second argument to $slice must be a numeric value, but is of type: string"),
    ({"$slice": [[1], 1.5]}, 28726,
     "Second argument to $slice can't be represented as a 32-bit integer: 1.5"),
    ({"$slice": [[1], 1, "s"]}, 28727,
     "Third argument to $slice must be numeric, but is of type: string"),
    ({"$slice": [[1], 1, 0]}, 28729, "Third argument to $slice must be positive: 0"),
    ({"$arrayElemAt": [1, 0]}, 28689,
     "$arrayElemAt's first argument must be an array, but is int"),
    ({"$arrayElemAt": [[1], "s"]}, 28690,
     "$arrayElemAt's second argument must be a numeric value, but is string"),
    ({"$arrayElemAt": [[1], 0.5]}, 28691,
     "$arrayElemAt's second argument must be representable as a 32-bit integer: 0.5"),
    ({"$first": 1}, 28689, "$first's argument must be an array, but is int"),
    ({"$last": [[1], [2]]}, 16020, "Expression $last takes exactly 1 arguments. 2 were passed in."),
])
def test_errors(coll: Collection[Any], expr: Any, code: int, message: str) -> None:
    assert _error(coll, expr) == (code, message)
