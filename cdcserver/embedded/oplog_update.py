"""`$_internalApplyOplogUpdate`: an update-pipeline stage that applies a `$v: 2` oplog delta
(what a change stream's `rawUpdateDescription` holds) to the document, as mongod's
DocumentDiffApplier does: within an object, fields keep their order (updated in place, deleted,
or modified by a sub-diff), then the inserted fields follow; an array diff resizes the array to
`l` (padding with null), then updates or modifies elements by index."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

STAGE = "$_internalApplyOplogUpdate"


def apply_stage(doc: dict[str, Any], spec: Any) -> dict[str, Any]:
    update = spec.get("oplogUpdate") if isinstance(spec, Mapping) else None
    if update is None:
        raise MongoError(40414, f"BSON field '{STAGE}.oplogUpdate' is missing but a required "
                         "field")
    if not isinstance(update, Mapping):
        raise MongoError(14, f"BSON field '{STAGE}.oplogUpdate' is the wrong type "
                         f"'{type_name(update)}', expected type 'object'")
    if update.get("$v") != 2 or not isinstance(update.get("diff"), Mapping):
        # (a malformed delta: BadValue, the code of mongod's update-parsing failures)
        raise MongoError(2, "Unsupported oplog update: a $v: 2 delta with a 'diff' object is "
                         "expected")
    return apply_object(doc, update["diff"])


def apply_object(doc: Mapping[str, Any], diff: Mapping[str, Any]) -> dict[str, Any]:
    deletes = diff.get("d") or {}
    updates = diff.get("u") or {}
    inserts = diff.get("i") or {}
    subs = {k[1:]: v for k, v in diff.items() if k.startswith("s") and len(k) > 1}
    out: dict[str, Any] = {}
    for name, value in doc.items():
        if name in deletes or name in inserts:
            continue
        if name in updates:
            out[name] = updates[name]
        elif name in subs:
            out[name] = _apply_sub(value, subs[name])
        else:
            out[name] = value
    for name, value in updates.items():  # an update of a field the document lacks: appended
        if name not in out:
            out[name] = value
    for name, value in inserts.items():
        out[name] = value
    return out


def _apply_sub(value: Any, diff: Mapping[str, Any]) -> Any:
    if diff.get("a") is True:
        return _apply_array(value if isinstance(value, list) else [], diff)
    return apply_object(value if isinstance(value, Mapping) else {}, diff)


def _apply_array(array: list[Any], diff: Mapping[str, Any]) -> list[Any]:
    out = list(array)
    size = diff.get("l")
    if isinstance(size, int):
        out = out[:size] + [None] * max(0, size - len(out))
    for key, value in diff.items():
        if key in ("a", "l") or len(key) < 2 or not key[1:].isdigit():
            continue
        index = int(key[1:])
        if index >= len(out):
            out.extend([None] * (index + 1 - len(out)))
        if key[0] == "u":
            out[index] = value
        elif key[0] == "s":
            out[index] = _apply_sub(out[index], value)
    return out
