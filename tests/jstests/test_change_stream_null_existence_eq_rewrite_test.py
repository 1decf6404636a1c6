"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_null_existence_eq_rewrite_test.js` @
17d84476ecff974cf05a16b956f9d26fdee998ce: for every path of every event of a workload (and a
`nonExistentField` under each), `$eq`/`$ne`/`$lte`/`$gte` null, `$exists` and equality to a
value seen there, as match predicates and as `$expr` (null and `$$REMOVE`): a stream with the
`$match` returns exactly the events of the same stream with `$_internalInhibitOptimization`
before it. Run resumed from a cluster time (the jstest's way) and, as well, with every stream
open before the workload (their `$match`es in one filter group). The jstest has no explain
assertions."""

from __future__ import annotations

from typing import Any

import pytest
from rewrite_util import run_rewrite_test, values_to_test


def generate(path: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = [
        {path: {"$eq": None}}, {path: {"$ne": None}}, {path: {"$lte": None}},
        {path: {"$gte": None}}, {path: {"$exists": True}}, {path: {"$exists": False}},
    ]
    filters += [{path: value} for value in values_to_test(fields, path)]
    field = "$" + path
    filters += [{"$expr": {op: [field, operand]}} for operand in (None, "$$REMOVE")
                for op in ("$eq", "$ne", "$lte", "$gte")]
    filters += [{"$expr": {"$eq": [field, value]}} for value in values_to_test(fields, path)]
    return filters


@pytest.mark.parametrize("live", [False, True], ids=["resumed", "live"])
def test_null_existence_eq_rewrite(client: Any, live: bool) -> None:
    run_rewrite_test(client, "change_stream_rewrite_null_existence_test", generate, live)
