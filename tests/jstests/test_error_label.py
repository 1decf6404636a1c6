"""Translated from mongodb/mongo `jstests/change_streams/error_label.js` @
0e9564888a31af6b49afb7a6106301bc16ae6956: a stream whose $project removes the resume token
fails with ChangeStreamFatalError carrying the NonResumableChangeStreamError label."""

from __future__ import annotations

from typing import Any

import pytest
from cst import SOON_TRIES
from pymongo.errors import OperationFailure

CHANGE_STREAM_FATAL_ERROR = 280


def test_error_label(client: Any) -> None:
    db = client["test"]
    db.drop_collection("change_stream_error_label")
    db.create_collection("change_stream_error_label")
    coll = db["change_stream_error_label"]

    stream = coll.watch([{"$project": {"_id": 0}}], batch_size=1)
    coll.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as raised:
        for _ in range(SOON_TRIES):
            if stream.try_next() is not None:
                break
    error = raised.value
    assert error.code == CHANGE_STREAM_FATAL_ERROR
    assert "errorLabels" in error.details, error.details
    assert "NonResumableChangeStreamError" in error.details["errorLabels"]
