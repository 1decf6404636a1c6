"""Translated from mongodb/mongo `jstests/change_streams/ban_from_lookup.js` @
134a4083953270e8a11430395357fb70a29047ad: $changeStream is refused (51047) in a $lookup
pipeline and in a nested $lookup's pipeline."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

COLL = "change_stream_ban_from_lookup"
FOREIGN = "unsharded"


@pytest.mark.parametrize("nested", [False, True], ids=["lookup", "nested lookup"])
def test_ban_from_lookup(client: Any, nested: bool) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    db[COLL].insert_one({"_id": 1})
    inner: list[Any] = [{"$changeStream": {}}]
    if nested:
        inner = [{"$match": {"_id": 1}},
                 {"$lookup": {"from": FOREIGN, "as": "subas", "pipeline": inner}}]
    with pytest.raises(OperationFailure) as raised:  # assertErrorCode
        db.command({"aggregate": COLL, "cursor": {}, "pipeline": [
            {"$lookup": {"from": FOREIGN, "as": "as", "pipeline": inner}}]})
    assert raised.value.code == 51047, raised.value.details
