"""cdcserver/embedded/oplog_update.py: `$_internalApplyOplogUpdate` applies a `$v: 2` delta as
mongod's DocumentDiffApplier (field order kept, inserts last, arrays resized and padded)."""

from __future__ import annotations

import pytest

from cdcserver.embedded.oplog_update import apply_object, apply_stage
from pipeline_stages.errors import MongoError


def test_fields_keep_their_order_and_inserts_come_last() -> None:
    doc = {"_id": 1, "a": 1, "b": {"c": 1, "d": 2}, "e": 5}
    diff = {"d": {"e": False}, "u": {"a": 2}, "i": {"z": 0}, "sb": {"u": {"c": 3}, "i": {"x": 1}}}
    out = apply_object(doc, diff)
    assert list(out.items()) == [("_id", 1), ("a", 2), ("b", {"c": 3, "d": 2, "x": 1}),
                                 ("z", 0)]
    assert list(out["b"]) == ["c", "d", "x"]


def test_array_diff_resizes_pads_and_edits_by_index() -> None:
    out = apply_object({"arr": [0, {"k": 1}, 2, 3]},
                       {"sarr": {"a": True, "l": 2, "s1": {"u": {"k": 9}}}})
    assert out == {"arr": [0, {"k": 9}]}
    out = apply_object({"arr": [0]}, {"sarr": {"a": True, "u3": "x"}})
    assert out == {"arr": [0, None, None, "x"]}


def test_the_stage_argument_is_checked() -> None:
    with pytest.raises(MongoError) as missing:
        apply_stage({}, {})
    assert missing.value.code == 40414
    with pytest.raises(MongoError) as wrong:
        apply_stage({}, {"oplogUpdate": 1})
    assert wrong.value.code == 14
