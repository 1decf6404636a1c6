"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_null_existence_eq_rewrite_remove_lte_gte_test.js`
@ 2720b69d9f8dd2c426148599cffff22820ad5807: for every path of every event of the workload of
`jstests/libs/query/change_stream_oplog_rewrite_test.js` (and a `nonExistentField` under each),
`$expr` `$lte`/`$gte` against `$$REMOVE` (missing), and `$expr` `$eq` to a value seen there: a
stream with the `$match` returns exactly the events of the same stream with
`$_internalInhibitOptimization` before it. Run resumed from a cluster time (the jstest's way)
and, as well, with every stream open before the workload (their `$match`es in one filter group).
The jstest has no explain assertions."""

from __future__ import annotations

from typing import Any

import pytest
from rewrite_util import run_rewrite_test, values_to_test


def generate(path: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    field = "$" + path
    exprs = [{"$expr": {op: [field, "$$REMOVE"]}} for op in ("$lte", "$gte")]
    return exprs + [{"$expr": {"$eq": [field, v]}} for v in values_to_test(fields, path)]


@pytest.mark.parametrize("live", [False, True], ids=["resumed", "live"])
def test_remove_lte_gte(client: Any, live: bool) -> None:
    run_rewrite_test(
        client, "change_stream_null_existence_eq_rewrite_remove_lte_gte_test", generate, live
    )
