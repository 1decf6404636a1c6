"""Translated from mongodb/mongo `jstests/change_streams/allowlist.js` @
47d99621851c0cd8da8d0628edeaa2f59bff6e14: only the allowlisted stages may follow
$changeStream (each alone and all together); every other one is IllegalOperation (20)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

COLL = "change_stream_allowlist"
ALLOWLIST: list[dict[str, Any]] = [
    {"$match": {"_id": {"$exists": True}}},
    {"$project": {"_id": 1}},
    {"$addFields": {"newField": 1}},
    {"$set": {"newField": 1}},
    {"$replaceRoot": {"newRoot": {"_id": "$_id"}}},
    {"$replaceWith": {"_id": "$_id"}},
    {"$redact": "$$DESCEND"},
]
DENYLIST: list[dict[str, Any]] = [
    {"$group": {"_id": "$_id"}},
    {"$sort": {"_id": 1}},
    {"$skip": 100},
    {"$limit": 100},
    {"$sample": {"size": 100}},
    {"$unwind": "$_id"},
    {"$lookup": {"from": "coll", "as": "as", "localField": "_id", "foreignField": "_id"}},
    {"$graphLookup": {"from": "coll", "as": "as", "startWith": "$_id",
                      "connectFromField": "_id", "connectToField": "_id"}},
    {"$bucketAuto": {"groupBy": "$_id", "buckets": 2}},
    {"$facet": {"facetPipe": [{"$match": {"_id": {"$exists": True}}}]}},
]


@pytest.fixture
def db(client: Any) -> Any:
    d = client["test"]
    d.drop_collection(COLL)
    d.create_collection(COLL)
    return d


@pytest.mark.parametrize("stage", ALLOWLIST, ids=[next(iter(s)) for s in ALLOWLIST])
def test_allowed_stage(db: Any, stage: dict) -> None:
    db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {}}, stage], "cursor": {}})


def test_all_allowed_stages_together(db: Any) -> None:
    db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {}}, *ALLOWLIST],
                "cursor": {}})


@pytest.mark.parametrize("stage", DENYLIST, ids=[next(iter(s)) for s in DENYLIST])
def test_denied_stage(db: Any, stage: dict) -> None:
    with pytest.raises(OperationFailure) as raised:  # assertErrorCode
        db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {}}, stage],
                    "cursor": {}})
    assert raised.value.code == 20, raised.value.details  # IllegalOperation
