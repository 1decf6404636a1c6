"""Translated from mongodb/mongo
`jstests/change_streams/change_stream_pre_image_lookup_whole_db_whole_cluster.js` @
357a487a54b0a3e1da9d089c69ca2c16fdf42335: whole-database and whole-cluster streams with
`fullDocumentBeforeChange: "required"` fail on a collection without pre-images
(NoMatchingDocument or 51770), and succeed when a `$match` keeps only the namespace that has
them (the `$match` runs ahead of the pre-image lookup)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import SOON_TRIES
from pymongo.errors import OperationFailure

DB = "change_stream_pre_image_lookup_whole_db_whole_cluster"
WITH, WITHOUT = "coll_with_pre_images", "coll_with_no_pre_images"


def _next(stream: Any) -> dict[str, Any]:
    for _ in range(SOON_TRIES):
        event = stream.try_next()
        if event is not None:
            return dict(event)
    raise AssertionError("no event")


def test_pre_image_lookup_whole_db_whole_cluster(client: Any) -> None:
    client.drop_database(DB)
    db = client[DB]
    db.create_collection(WITH, changeStreamPreAndPostImages={"enabled": True})
    db.create_collection(WITHOUT, changeStreamPreAndPostImages={"enabled": False})
    with_images, without_images = db[WITH], db[WITHOUT]

    with without_images.watch() as stream:
        without_images.insert_one({"_id": -1})
        resume_token = _next(stream)["_id"]

    for coll in (without_images, with_images):
        coll.insert_one({"_id": 0})
    for coll in (without_images, with_images):
        coll.replace_one({"_id": 0}, {"foo": "bar"})
    for coll in (without_images, with_images):
        coll.update_one({"_id": 0}, {"$set": {"foo": "baz"}})
    for coll in (without_images, with_images):
        coll.delete_one({"_id": 0})
    db.sentinelColl.insert_one({"_id": "last_change_sentinel"})

    # Whole database, then whole cluster, with "required": a failure before the sentinel.
    for target, extra in ((db, {}), (client.admin, {"allChangesForCluster": True})):
        with pytest.raises(OperationFailure) as failure:  # at the aggregate or a getMore
            reply = target.command({"aggregate": 1, "pipeline": [{"$changeStream": {
                "fullDocumentBeforeChange": "required", "resumeAfter": resume_token, **extra}}],
                "cursor": {}})
            cursor = reply["cursor"]
            batch = cursor["firstBatch"]
            for _ in range(SOON_TRIES):
                if any(e["documentKey"]["_id"] == "last_change_sentinel" for e in batch):
                    break
                batch = target.command({"getMore": cursor["id"],
                                        "collection": "$cmd.aggregate"})["cursor"]["nextBatch"]
        assert failure.value.code in (47, 51770), failure.value.details

    # Filtered to the namespace with pre-images, both succeed.
    expected = [("insert", None), ("replace", {"_id": 0}), ("update", {"_id": 0, "foo": "bar"}),
                ("delete", {"_id": 0, "foo": "baz"})]
    for target in (db, client):  # client.watch(): allChangesForCluster on admin
        pipeline = [{"$match": {"$or": [{"_id": resume_token}, {"ns.coll": WITH}]}}]
        stream = target.watch(pipeline, full_document_before_change="required",
                              resume_after=resume_token)
        for op, pre_image in expected:
            event = _next(stream)
            assert event["operationType"] == op, event
            assert event.get("fullDocumentBeforeChange") == pre_image, event
        stream.close()
