"""`$densify` on the embedded store (pipeline_stages/densify_stage.py), through pymongo: full,
partition and explicit bounds, numbers and dates, partitions (cases of mongod's jstests
aggregation/sources/densify/partitions.js), output order where mongod's is defined, and the
parse errors of DensifySpec and RangeStatement::parse."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import errors
from pymongo.database import Database

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db() -> Iterator[Database[Any]]:
    with EmbeddedServer() as server:
        client: Any = server.client()
        yield client.densify_tests
        client.close()


def _densify(db: Database[Any], docs: list[dict[str, Any]], spec: Any,
             name: str) -> list[Any]:
    db[name].drop()
    db[name].insert_many([dict(d) for d in docs])
    return list(db[name].aggregate([{"$project": {"_id": 0}}, {"$densify": spec}]))


def _same(found: list[Any], expected: list[Any]) -> bool:
    def norm(docs: list[Any]) -> list[Any]:
        return sorted((sorted(d.items()) for d in docs), key=repr)
    return norm(found) == norm(expected)


def _failure(db: Database[Any], spec: Any) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        list(db.errors.aggregate([{"$densify": spec}]))
    return info.value.code, info.value.details["errmsg"]


def test_full_range_in_order_off_step_values_kept(db: Database[Any]) -> None:
    docs = [{"val": v} for v in (0, 2, 3, 8, None)] + [{"other": 1}]
    out = _densify(db, docs, {"field": "val", "range": {"step": 2, "bounds": "full"}}, "full")
    # missing / null first (they sort first) and untouched; 3 is off the step: the grid stays
    assert out == [{"val": None}, {"other": 1}, {"val": 0}, {"val": 2}, {"val": 3},
                   {"val": 4}, {"val": 6}, {"val": 8}]


@pytest.mark.parametrize("step", [1, 3])
def test_full_range_steps(db: Database[Any], step: int) -> None:  # fullTestOne
    docs = [{"val": 0}] + [{"val": v} for v in range(2, 11, 2)] + [{"val": 11}]
    expected = sorted({0, 11, *range(2, 11, 2), *range(0, 11, step)})
    out = _densify(db, docs, {"field": "val", "range": {"step": step, "bounds": "full"}},
                   f"full{step}")
    assert out == [{"val": v} for v in expected]


def test_explicit_range_in_order(db: Database[Any]) -> None:
    docs = [{"val": v} for v in (-3, 1, 4, 12)]
    out = _densify(db, docs, {"field": "val", "range": {"step": 2, "bounds": [0, 7]}}, "exp")
    assert out == [{"val": -3}, {"val": 0}, {"val": 1}, {"val": 2}, {"val": 4}, {"val": 6},
                   {"val": 12}]
    none = _densify(db, [{"x": 1}], {"field": "val", "range": {"step": 1, "bounds": [0, 3]}},
                    "exp_empty")
    assert none == [{"x": 1}, {"val": 0}, {"val": 1}, {"val": 2}]


def test_partition_bounds(db: Database[Any]) -> None:  # testOne, testTwo, testFive
    docs = [{"val": 0, "partition": 0}, {"val": 2, "partition": 0},
            {"val": 0, "partition": 1}, {"val": 2, "partition": 1},
            {"val": 123, "partition": 2}]
    spec = {"field": "val", "partitionByFields": ["partition"],
            "range": {"step": 1, "bounds": "partition"}}
    out = _densify(db, docs, spec, "part")
    assert out == [{"val": 0, "partition": 0}, {"partition": 0, "val": 1},
                   {"val": 2, "partition": 0}, {"val": 0, "partition": 1},
                   {"partition": 1, "val": 1}, {"val": 2, "partition": 1},
                   {"val": 123, "partition": 2}]
    assert list(out[1]) == ["partition", "val"]  # generated: partition fields, then the field


def test_partition_bounds_interleaved(db: Database[Any]) -> None:  # testThree
    docs = [{"val": i, "part": 0} for i in range(20) if i % 4 == 2] + [
        {"val": i, "part": 1} for i in range(20) if i % 5 == 0]
    expected = [{"val": i, "part": 0} for i in range(2, 19)] + [
        {"val": i, "part": 1} for i in range(16)]
    spec = {"field": "val", "partitionByFields": ["part"],
            "range": {"step": 1, "bounds": "partition"}}
    assert _same(_densify(db, docs, spec, "part3"), expected)


def test_full_bounds_with_partitions(db: Database[Any]) -> None:  # fullTestTwo, fullTestThree
    spec = {"field": "val", "range": {"step": 2, "bounds": "full"},
            "partitionByFields": ["part"]}
    docs = [{"val": 0, "part": 0}, {"val": 0, "part": 1}, {"val": 10, "part": 2}]
    expected = [{"val": v, "part": p} for v in range(0, 11, 2) for p in range(3)]
    assert _same(_densify(db, docs, spec, "fullp2"), expected)
    docs = [{"val": 0, "part": 0}, {"val": 4, "part": 0}, {"val": 0, "part": 1},
            {"val": 5, "part": 1}, {"val": 10, "part": 2}]
    assert _same(_densify(db, docs, spec, "fullp3"), [*expected, {"val": 5, "part": 1}])


def test_explicit_bounds_with_partitions(db: Database[Any]) -> None:
    spec: dict[str, Any] = {"field": "val", "partitionByFields": ["partition"],
                            "range": {"step": 1, "bounds": [2, 3]}}
    docs = [{"val": 0, "partition": 0}, {"val": 4, "partition": 1}]
    assert _same(_densify(db, docs, spec, "rng1"),
                 [*docs, {"val": 2, "partition": 0}, {"val": 2, "partition": 1}])
    spec["range"] = {"step": 2, "bounds": [2, 5]}  # rangeTestThree
    docs = [{"val": 0, "partition": 0}, {"val": 10, "partition": 1}]
    assert _same(_densify(db, docs, spec, "rng3"),
                 [*docs, *({"val": v, "partition": p} for v in (2, 4) for p in (0, 1))])
    spec = {"field": "val", "range": {"step": 2, "bounds": [4, 8]},  # rangeTestTwo
            "partitionByFields": ["part"]}
    docs = [{"val": 0, "part": 0}, {"val": 5, "part": 1}, {"val": 10, "part": 2}]
    assert _same(_densify(db, docs, spec, "rng2"),
                 [*docs, *({"val": v, "part": p} for v in (4, 6) for p in range(3))])


def test_dates(db: Database[Any]) -> None:
    day = datetime.datetime(2021, 1, 1)
    docs = [{"val": day, "partition": 0}, {"val": day.replace(day=3), "partition": 0}]
    spec = {"field": "val", "partitionByFields": ["partition"],
            "range": {"step": 1, "unit": "day", "bounds": "partition"}}
    assert _densify(db, docs, spec, "dates")[1] == {"partition": 0,
                                                    "val": day.replace(day=2)}
    years = [{"val": day, "part": 0}, {"val": day, "part": 1},
             {"val": day.replace(year=2031), "part": 2},
             {"val": day.replace(year=2025), "part": 3}]
    spec = {"field": "val", "range": {"step": 2, "unit": "year", "bounds": "full"},
            "partitionByFields": ["part"]}
    expected = [{"val": day.replace(year=2021 + y), "part": p}
                for y in range(0, 11, 2) for p in range(4)]
    assert _same(_densify(db, years, spec, "years"), expected)
    months = [{"val": datetime.datetime(2021, 1, 31)}]
    spec = {"field": "val", "range": {"step": 1, "unit": "month",
                                      "bounds": [datetime.datetime(2021, 1, 31),
                                                 datetime.datetime(2021, 4, 1)]}}
    assert [d["val"].day for d in _densify(db, months, spec, "months")] == [31, 28, 28]


def test_value_types_at_run_time(db: Database[Any]) -> None:
    spec = {"field": "val", "range": {"step": 1, "bounds": "full"}}
    db.rt.insert_many([{"val": 1}, {"val": "x"}])
    with pytest.raises(errors.OperationFailure) as info:
        list(db.rt.aggregate([{"$densify": spec}]))
    assert (info.value.code, info.value.details["errmsg"]) == (
        5733201, "Densify field type must be numeric or a date")
    db.rt2.insert_many([{"val": datetime.datetime(2021, 1, 1)}])
    with pytest.raises(errors.OperationFailure) as info:
        list(db.rt2.aggregate([{"$densify": spec}]))
    assert (info.value.code, info.value.details["errmsg"]) == (
        6053600, "Encountered date densify value in collection when step does not have a date "
        "unit.")
    db.rt3.insert_many([{"val": 0}, {"val": 3}])
    out = list(db.rt3.aggregate([{"$densify": {"field": "val", "range": {
        "step": 1.5, "bounds": "full"}}}, {"$project": {"_id": 0}}]))
    assert out == [{"val": 0}, {"val": 1.5}, {"val": 3}]


@pytest.mark.parametrize(("spec", "code", "message"), [
    (1, 9, "The $densify stage specification must be an object, found int"),
    ({"range": {"step": 1, "bounds": "full"}}, 40414,
     "BSON field '$densify.field' is missing but a required field"),
    ({"field": "a"}, 40414, "BSON field '$densify.range' is missing but a required field"),
    ({"field": "a", "range": {"bounds": "full"}}, 40414,
     "BSON field '$densify.range.step' is missing but a required field"),
    ({"field": "a", "range": {"step": 1, "bounds": "full", "x": 1}}, 40415,
     "BSON field '$densify.range.x' is an unknown field."),
    ({"field": "a", "range": {"step": 1, "bounds": "full"}, "x": 1}, 40415,
     "BSON field '$densify.x' is an unknown field."),
    ({"field": 1, "range": {"step": 1, "bounds": "full"}}, 14,
     "BSON field '$densify.field' is the wrong type 'int', expected type 'string'"),
    ({"field": "a", "range": {"step": 0, "bounds": "full"}}, 5733401,
     "The step parameter in a range statement must be a strictly positive numeric value"),
    ({"field": "a", "range": {"step": 1.5, "unit": "day", "bounds": "full"}}, 6586400,
     "The step parameter in a range statement must be a whole number when densifying a date "
     "range"),
    ({"field": "a", "range": {"step": 1, "bounds": [1]}}, 5733403,
     "A bounding array in a range statement must have exactly two elements"),
    ({"field": "a", "range": {"step": 1, "bounds": [2, 1]}}, 5733402,
     "A bounding array must be an ascending array of either two dates or two numbers"),
    ({"field": "a", "range": {"step": 1, "bounds": [1, 2.0]}}, 5876900,
     "Upper bound, lower bound, and step must all have the same type"),
    ({"field": "a", "range": {"step": 1, "unit": "day", "bounds": [1, 2]}}, 5733409,
     "Numeric bounds may not have unit parameter"),
    ({"field": "a", "range": {"step": 1, "bounds": [datetime.datetime(2021, 1, 1),
                                                    datetime.datetime(2021, 1, 2)]}},
     5733410, "A bounding array of dates must specify a unit"),
    ({"field": "a", "range": {"step": 1, "bounds": ["a", "b"]}}, 5946800,
     "Explicit bounds must be numeric or dates"),
    ({"field": "a", "range": {"step": 1, "bounds": "all"}}, 5946802,
     "Bounds string must either be 'full' or 'partition'"),
    ({"field": "a", "range": {"step": 1, "bounds": 5}}, 5733404,
     "The bounds in a range statement must be the string 'full', 'partition', or an "
     "ascending array of two numbers or two dates"),
    ({"field": "a", "range": {"step": 1, "bounds": "partition"}}, 5733408,
     "One cannot specify the bounds as 'partition' without specifying a non-empty array of "
     "partitionByFields. You may have meant to specify 'full' bounds."),
])
def test_parse_errors(db: Database[Any], spec: Any, code: int, message: str) -> None:
    assert _failure(db, spec) == (code, message)
