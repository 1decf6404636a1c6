"""The equality filters query.compile_equalities compiles (issue 30: the scan's match compiled
once per query) decide every document as the general matcher does, quirks included (a boolean
equal to 0 / 1; an ObjectId matching its hex string in an array): a differential check over
documents holding each kind of value an equality meets (numbers of each type, bools, strings
and Code, dates, ObjectIds, arrays, nested arrays, Decimal128, null, missing)."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded import engine, query

OID = ObjectId("65f000000000000000000001")
DAY = datetime.datetime(2024, 5, 1, 12, 0, 0, 123000)
VALUES: list[Any] = [
    5, 5.0, Int64(5), 5.5, 6, -0.0, 0, True, False, 1, "5", "a", Code("a"), DAY,
    DAY + datetime.timedelta(milliseconds=1), OID, ObjectId("65f000000000000000000002"),
    Decimal128("5"), Decimal128("5.5"), None, [5], [6, 5.0], [[5]], [], ["a", 1],
    [Decimal128("5")], [Decimal128("7"), 5], {"x": 5}, [{"x": 5}], [str(OID)], [OID, 1],
]
OPERANDS: list[Any] = [5, 5.0, Int64(5), 5.5, 0, True, False, 1, "a", "5", DAY, OID,
                       float("inf")]


def _docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [{"_id": "missing"}]
    docs += [{"_id": i, "u": v, "w": w}
             for i, (v, w) in enumerate(itertools.product(VALUES, [1, "a", [1, 2]]))]
    return docs


@pytest.mark.parametrize("operand", OPERANDS, ids=repr)
def test_compiled_equality_agrees_with_the_engine(operand: Any) -> None:
    for filter_doc in ({"u": operand}, {"u": {"$eq": operand}}, {"u": operand, "w": 1},
                       {"w": "a", "u": operand}):
        general = engine.matcher(filter_doc)
        fast = query.compile_equalities(filter_doc, general)
        assert fast is not None, filter_doc
        for doc in _docs():
            assert fast(doc) == general(doc), (filter_doc, doc)


@pytest.mark.parametrize("filter_doc", [
    {"u.x": 5}, {"u": {"$gt": 5}}, {"u": None}, {"u": [5]}, {"u": {"x": 5}},
    {"u": float("nan")}, {"$or": [{"u": 5}]}, {"u": Decimal128("5")},
    {"u": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)},
])
def test_other_filters_are_not_compiled(filter_doc: dict[str, Any]) -> None:
    assert query.compile_equalities(filter_doc, engine.matcher(filter_doc)) is None
