"""The `n` window functions and the covariances in `$setWindowFields`
(pipeline_stages/window_n_functions.py) through a real pymongo client against the embedded
store, as mongod 8.0 computes them (window_function_expression.cpp ExpressionN,
window_function_first_last_n.h, window_function_min_max.h, window_function_top_bottom_n.h,
window_function_covariance.cpp; jstests/aggregation/sources/setWindowFields/n_accumulators.js,
covariance.js)."""

from __future__ import annotations

import math
from typing import Any

import pymongo
import pytest

from cdcserver.testing import EmbeddedServer

DOCS = [{"_id": 1, "t": 1, "x": 3, "y": 1.5}, {"_id": 2, "t": 2, "x": 1, "y": 2},
        {"_id": 3, "t": 3, "y": 7}, {"_id": 4, "t": 4, "x": 3, "y": -1},
        {"_id": 5, "t": 5, "x": None, "y": 4}]
AROUND = {"documents": [-1, 1]}
TO_CURRENT = {"documents": ["unbounded", "current"]}


@pytest.fixture(scope="module")
def db() -> Any:
    with EmbeddedServer() as server:
        yield server.client().get_database("window_n_functions")


def run(db: Any, function: dict[str, Any], docs: list[dict[str, Any]] = DOCS) -> list[Any]:
    """Field `a` of each output document, in sortBy order."""
    coll = db["c"]
    coll.drop()
    coll.insert_many(docs)
    out = coll.aggregate([{"$setWindowFields": {"sortBy": {"t": 1}, "output": {"a": function}}}])
    return [d["a"] for d in out]


def error(db: Any, function: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(pymongo.errors.OperationFailure) as info:
        run(db, function)
    return info.value.code, info.value.details["errmsg"]


def test_first_n_unbounded_uses_the_accumulator(db: Any) -> None:
    # missing as null, as AccumulatorFirstN
    assert run(db, {"$firstN": {"input": "$x", "n": 3}}) == [[3, 1, None]] * 5


def test_first_n_bounded_leaves_missing_out(db: Any) -> None:
    assert run(db, {"$firstN": {"input": "$x", "n": 2}, "window": AROUND}) == [
        [3, 1], [3, 1], [1], [3], [3, None]]


def test_last_n_growing_and_bounded(db: Any) -> None:
    assert run(db, {"$lastN": {"input": "$x", "n": 2}, "window": TO_CURRENT}) == [
        [3], [3, 1], [1, None], [None, 3], [3, None]]
    assert run(db, {"$lastN": {"input": "$x", "n": 2}, "window": AROUND}) == [
        [3, 1], [1], [3], [3, None], [3, None]]


def test_min_n_max_n_skip_nullish(db: Any) -> None:
    assert run(db, {"$minN": {"input": "$x", "n": 2}}) == [[1, 3]] * 5
    assert run(db, {"$maxN": {"input": "$x", "n": 2}, "window": AROUND}) == [
        [3, 1], [3, 1], [3, 1], [3], [3]]


def test_max_n_bounded_equal_values_latest_first(db: Any) -> None:
    docs = [{"_id": 1, "t": 1, "x": 1}, {"_id": 2, "t": 2, "x": 1.0}, {"_id": 3, "t": 3, "x": 0}]
    out = run(db, {"$maxN": {"input": "$x", "n": 2}, "window": {"documents": [0, 1]}}, docs)
    assert [[(type(v).__name__, v) for v in a] for a in out] == [
        [("float", 1.0), ("int", 1)], [("float", 1.0), ("int", 0)], [("int", 0)]]


def test_top_n_and_bottom(db: Any) -> None:
    assert run(db, {"$topN": {"output": "$_id", "n": 2, "sortBy": {"y": 1}}}) == [[4, 1]] * 5
    assert run(db, {"$bottom": {"output": "$_id", "sortBy": {"y": -1}}, "window": AROUND}) == [
        1, 1, 4, 4, 4]
    assert run(db, {"$top": {"output": "$x", "sortBy": {"y": -1}}, "window": AROUND}) == [
        1, None, None, None, None]


def test_bottom_n_ties_bounded_keep_the_latest_unbounded_the_first(db: Any) -> None:
    docs = [{"_id": i, "t": i, "k": 0} for i in range(1, 5)]
    bounded = run(db, {"$bottomN": {"output": "$_id", "n": 2, "sortBy": {"k": 1}},
                       "window": {"documents": [-3, 0]}}, docs)
    assert bounded == [[1], [1, 2], [2, 3], [3, 4]]
    growing = run(db, {"$bottomN": {"output": "$_id", "n": 2, "sortBy": {"k": 1}},
                       "window": TO_CURRENT}, docs)
    assert growing == [[1], [1, 2], [1, 2], [1, 2]]


def test_empty_window(db: Any) -> None:
    window = {"documents": ["unbounded", -1]}
    assert run(db, {"$firstN": {"input": "$x", "n": 1}, "window": window})[0] == []
    assert run(db, {"$top": {"output": "$x", "sortBy": {"t": 1}},
                    "window": {"documents": [1, 2]}})[-1] is None


@pytest.mark.parametrize(("function", "code", "message"), [
    ({"$minN": "x"}, 5787900, 'specification must be an object; found $minN: "x"'),
    ({"$firstN": "x"}, 5787801, 'specification must be an object; found $firstN: "x"'),
    ({"$lastN": {"n": 2}, "window": AROUND}, 5787907, "Missing value for 'input'"),
    ({"$maxN": {"input": "$x"}}, 5787906, "Missing value for 'n'"),
    ({"$minN": {"input": "$x", "n": 2.1}}, 5787903,
     "Value for 'n' must be of integral type, but found 2.1"),
    ({"$minN": {"input": "$x", "n": "$a"}, "window": AROUND}, 5787902,
     "Value for 'n' must be of integral type, but found MISSING"),
    ({"$firstN": {"input": "$x", "n": 0}}, 5787908, "'n' must be greater than 0, found 0"),
    ({"$minN": {"input": "$x", "n": 2}, "foo": 1}, 9, "$minN got unexpected argument: foo"),
    ({"$topN": {"output": "$x", "n": 2}}, 5788005, "Missing value for 'sortBy'"),
    ({"$covariancePop": ["$t", "$y"], "foo": 1}, 9,
     "Window function found an unknown argument: foo"),
])
def test_errors(db: Any, function: dict[str, Any], code: int, message: str) -> None:
    assert error(db, function) == (code, message)


def test_covariance_pop_and_samp(db: Any) -> None:
    pop = run(db, {"$covariancePop": ["$t", "$y"]})
    assert all(isinstance(v, float) for v in pop)
    assert pop == [pytest.approx(0.4)] * 5
    assert run(db, {"$covarianceSamp": ["$t", "$y"], "window": AROUND}) == [
        0.25, 2.75, -1.5, -1.5, 2.5]
    growing = run(db, {"$covariancePop": ["$t", "$y"], "window": TO_CURRENT})
    assert growing[:2] == [0.0, 0.125]


def test_covariance_one_pair_and_non_numbers(db: Any) -> None:
    docs = [{"_id": 1, "t": 1, "y": 2}, {"_id": 2, "t": 2, "y": "a"}]
    assert run(db, {"$covarianceSamp": ["$t", "$y"]}, docs) == [None, None]
    assert run(db, {"$covariancePop": ["$t", "$y"]}, docs) == [0.0, 0.0]


def test_covariance_infinite_pair(db: Any) -> None:
    docs = [{"_id": 1, "t": 1, "y": 1}, {"_id": 2, "t": 2, "y": math.inf},
            {"_id": 3, "t": 3, "y": 2}]
    out = run(db, {"$covariancePop": ["$t", "$y"], "window": TO_CURRENT}, docs)
    assert out == [0.0, 0.0, math.inf]
