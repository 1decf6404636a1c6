"""mongod's nesting limit for stored documents (`BSONDepth::getMaxDepthForUserStorage()`).

A message may nest 200 levels (`BSONDepth::kDefaultMaxAllowableDepth`, checked by the wire
layer as mongod's validateBSON does); a document written to a collection may nest 20 fewer,
180 (`kExtraSystemDepthLevels`): the server wraps stored documents in its own (oplog entries,
change events, replies) and those must stay within the message limit. An empty object or array
does not count as a level. The walks are iterative: no recursion, whatever the depth.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pipeline_stages.errors import MongoError

__all__ = [
    "MAX_ALLOWABLE_DEPTH",
    "MAX_DEPTH_FOR_USER_STORAGE",
    "check_insert_depth",
    "check_update_depth",
    "exceeds_storage_depth",
]

MAX_ALLOWABLE_DEPTH = 200
MAX_DEPTH_FOR_USER_STORAGE = MAX_ALLOWABLE_DEPTH - 20


def exceeds_storage_depth(doc: Mapping[str, Any], raw: bytes | None = None) -> bool:
    """Whether `doc` has a field more than MAX_DEPTH_FOR_USER_STORAGE levels down (its top-level
    fields are level 1). With its BSON `raw`, documents with too few object/array type bytes
    (0x03, 0x04) to nest that deep are cleared without a walk."""
    limit = MAX_DEPTH_FOR_USER_STORAGE
    if raw is not None and raw.count(3) + raw.count(4) < limit:
        return False
    stack: list[Iterator[Any]] = [iter(doc.values())]
    while stack:
        for value in stack[-1]:
            if isinstance(value, (dict, list)) and value:
                if len(stack) >= limit:
                    return True
                stack.append(iter(value.values() if isinstance(value, dict) else value))
                break
        else:
            stack.pop()
    return False


def check_insert_depth(doc: Mapping[str, Any], raw: bytes | None = None) -> None:
    """insert.cpp validateDepth: 15 Overflow."""
    if exceeds_storage_depth(doc, raw):
        raise MongoError(
            15,
            f"cannot insert document because it exceeds {MAX_DEPTH_FOR_USER_STORAGE} levels of "
            "nesting",
        )


def check_update_depth(doc: Mapping[str, Any], raw: bytes | None = None) -> None:
    """storage_validation.cpp storageValid (an update's or an upsert's new document)."""
    if exceeds_storage_depth(doc, raw):
        raise MongoError(
            15, f"Document exceeds maximum nesting depth of {MAX_DEPTH_FOR_USER_STORAGE}"
        )
