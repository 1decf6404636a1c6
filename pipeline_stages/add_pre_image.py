"""`$_internalChangeStreamAddPreImage`: `fullDocumentBeforeChange` for update/replace/delete.

See ../shared/reference/oplog_to_events.md §7. The transform gave every update, replace and
delete event an internal `preImageId` (`{nsUUID, ts, applyOpsIndex}`, the `_id` of its
`config.system.preimages` document); this stage looks all of a batch's pre-images up with one
`ImageSource.pre_images` call, appends `fullDocumentBeforeChange` (the image, or null) at the
end of each such event and drops `preImageId`, as mongod does. With
`fullDocumentBeforeChange: "required"` a missing pre-image fails the stream with
NoMatchingDocument (47), for the first such event of the batch. Other events pass untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import ImageSource
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.transform import MISSING, PRE_IMAGE_ID
from pipeline_stages.value_string import document_string

FULL_DOCUMENT_BEFORE_CHANGE = "fullDocumentBeforeChange"

# Event types that have a pre-image.
PRE_IMAGE_EVENT_TYPES = frozenset({"update", "replace", "delete"})


def image_not_found_description(event: Mapping[str, Any]) -> str:
    """`{operationType, ns, clusterTime[, txnNumber]}` printed as mongod prints a Document
    (missing fields are skipped) — the event as the NoMatchingDocument messages quote it."""
    shown = {}
    for name in ("operationType", "ns", "clusterTime", "txnNumber"):
        value = event.get(name, MISSING)
        if value is not MISSING:
            shown[name] = value
    return document_string(shown)


def pre_image_not_found(event: Mapping[str, Any]) -> MongoError:
    return MongoError(
        47,
        "Change stream was configured to require a pre-image for all update, delete and "
        "replace events, but the pre-image was not found for event: "
        + image_not_found_description(event),
    )


class AddPreImage:
    """Adds `fullDocumentBeforeChange` to a batch of events (`fullDocumentBeforeChange` set to
    `whenAvailable` or `required`)."""

    def __init__(self, spec: ChangeStreamSpec, source: ImageSource) -> None:
        self.spec = spec
        self.source = source
        self.required = spec.full_document_before_change == "required"

    def process(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fills the events in place and returns the same list."""
        targets = [
            event
            for event in events
            if PRE_IMAGE_ID in event and event.get("operationType") in PRE_IMAGE_EVENT_TYPES
        ]
        if not targets:
            return events
        images = self.source.pre_images([event[PRE_IMAGE_ID] for event in targets])
        if len(images) != len(targets):
            raise RuntimeError(
                f"ImageSource.pre_images answered {len(images)} results for {len(targets)} ids"
            )
        if self.required:
            for event, image in zip(targets, images):
                if image is None:
                    raise pre_image_not_found(event)
        for event, image in zip(targets, images):
            event[FULL_DOCUMENT_BEFORE_CHANGE] = image  # None -> null
            del event[PRE_IMAGE_ID]
        return events
