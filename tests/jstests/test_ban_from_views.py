"""Translated from mongodb/mongo `jstests/change_streams/ban_from_views.js` @
134a4083953270e8a11430395357fb70a29047ad: no view may be defined by a $changeStream pipeline
(create or collMod: 167 OptionNotSupportedOnView) and no change stream opened on a view (166
CommandNotSupportedOnView)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

COLL = "change_stream_ban_from_views"
NORMAL_VIEW = "nonChangeStreamView"
CS_VIEW = "changeStreamView"
CS_PIPE = [{"$changeStream": {}}]


def _fails_with(code: int, fn: Any) -> None:
    with pytest.raises(OperationFailure) as raised:
        fn()
    assert raised.value.code == code, raised.value.details


def test_ban_from_views(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    db[COLL].insert_one({"_id": 1})
    db.drop_collection(NORMAL_VIEW)
    db.drop_collection(CS_VIEW)

    db.command({"create": NORMAL_VIEW, "viewOn": COLL, "pipeline": [{"$match": {"_id": 1}}]})
    _fails_with(167, lambda: db.command({"create": CS_VIEW, "viewOn": COLL, "pipeline": CS_PIPE}))
    _fails_with(167, lambda: db.command({"collMod": NORMAL_VIEW, "viewOn": COLL,
                                         "pipeline": CS_PIPE}))
    _fails_with(166, lambda: db.command({"aggregate": NORMAL_VIEW, "pipeline": CS_PIPE,
                                         "cursor": {}}))
