"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_null_existence_eq_rewrite_comp_test.js` @
c4005f470c940681b5e0b4f63ff30a7d0f23ec97: for every path of every event of the workload of
`jstests/libs/query/change_stream_oplog_rewrite_test.js` (and a `nonExistentField` under each),
`$eq`/`$ne`/`$lte`/`$gte` null, `$exists` true/false and equality to a value seen there (match
predicates, no `$expr`): a stream with the `$match` returns exactly the events of the same
stream with `$_internalInhibitOptimization` before it. Run resumed from a cluster time (the
jstest's way) and, as well, with every stream open before the workload (their `$match`es in one
filter group). The jstest has no explain assertions."""

from __future__ import annotations

from typing import Any

import pytest
from rewrite_util import run_rewrite_test, values_to_test


def generate(path: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = [
        {path: {"$eq": None}}, {path: {"$ne": None}}, {path: {"$lte": None}},
        {path: {"$gte": None}}, {path: {"$exists": True}}, {path: {"$exists": False}},
    ]
    return filters + [{path: value} for value in values_to_test(fields, path)]


@pytest.mark.parametrize("live", [False, True], ids=["resumed", "live"])
def test_comp(client: Any, live: bool) -> None:
    run_rewrite_test(
        client, "change_stream_null_existence_eq_rewrite_comp_test", generate, live
    )
