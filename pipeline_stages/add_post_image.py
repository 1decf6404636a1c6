"""`$_internalChangeStreamAddPostImage`: `fullDocument` for update events.

See ../shared/reference/oplog_to_events.md §7. For update events the transform reserved the
`fullDocument` slot after `wallTime` (value `MISSING`); this stage fills it, in place, per
`fullDocument` mode:

* `updateLookup` — the document now matching the event's `documentKey` in its namespace (null
  if there is none). One `ImageSource.current_documents` call per namespace per batch. With
  `matchCollectionUUIDForUpdateLookup` the collection must still have the event's UUID.
* `whenAvailable` / `required` — the pre-image with the oplog's `$v:2` diff applied. The
  pre-image is the event's `fullDocumentBeforeChange` when the pre-image stage ran (null there
  means none: no post-image either), otherwise it is looked up by `preImageId`, for the whole
  batch in one `ImageSource.pre_images` call. No pre-image -> null, or NoMatchingDocument (47)
  under `required`.

Afterwards the internal fields (`preImageId`, `rawOplogUpdateSpec`) are removed from every
event, and an unfilled `fullDocument` slot is dropped (`strip_internal_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages import resume_token
from pipeline_stages.add_pre_image import FULL_DOCUMENT_BEFORE_CHANGE, image_not_found_description
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import ImageSource
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.transform import INTERNAL_FIELDS, MISSING, PRE_IMAGE_ID, RAW_OPLOG_UPDATE_SPEC
from pipeline_stages.update_description import apply_diff

FULL_DOCUMENT = "fullDocument"


def strip_internal_fields(event: dict[str, Any]) -> dict[str, Any]:
    """Remove what only the pipeline's own stages read (`preImageId`, `rawOplogUpdateSpec`) and
    an empty `fullDocument` slot; returns the same event. The pipeline calls this itself for
    every event when neither image stage runs."""
    for name in INTERNAL_FIELDS:
        event.pop(name, None)
    if event.get(FULL_DOCUMENT, None) is MISSING:
        del event[FULL_DOCUMENT]
    return event


def post_image_not_found(event: Mapping[str, Any]) -> MongoError:
    return MongoError(
        47,
        "Change stream was configured to require a post-image for all update events, but the "
        "post-image was not found for event: " + image_not_found_description(event),
    )


def _event_uuid(event: Mapping[str, Any]) -> bytes | None:
    """The collection UUID the event's resume token carries."""
    shown = event.get("collectionUUID")
    if shown is not None:
        return bytes(shown)
    return resume_token.decode(event["_id"]).uuid


class AddPostImage:
    """Fills `fullDocument` of update events for `fullDocument` set to `updateLookup`,
    `whenAvailable` or `required`, then strips the internal fields of every event."""

    def __init__(
        self,
        spec: ChangeStreamSpec,
        source: ImageSource,
        *,
        match_collection_uuid: bool | None = None,
    ) -> None:
        """`match_collection_uuid` overrides `spec.match_collection_uuid_for_update_lookup`
        (whether `updateLookup` requires the collection to still have the event's UUID)."""
        self.spec = spec
        self.source = source
        self.mode = spec.full_document
        self.match_uuid = (
            spec.match_collection_uuid_for_update_lookup
            if match_collection_uuid is None
            else match_collection_uuid
        )

    def process(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fills the events in place and returns the same list."""
        updates = [event for event in events if event.get("operationType") == "update"]
        if updates:
            if self.mode == "updateLookup":
                self._look_up_current(updates)
            elif self.mode in ("whenAvailable", "required"):
                self._apply_to_pre_images(updates)
        for event in events:
            strip_internal_fields(event)
        return events

    # -- updateLookup ---------------------------------------------------------------------------

    def _look_up_current(self, updates: list[dict[str, Any]]) -> None:
        groups: dict[tuple[str, str, bytes | None], list[dict[str, Any]]] = {}
        for event in updates:
            ns = event["ns"]
            uuid = _event_uuid(event) if self.match_uuid else None
            groups.setdefault((ns["db"], ns["coll"], uuid), []).append(event)
        for (db, coll, uuid), group in groups.items():
            found = self.source.current_documents(
                db, coll, uuid, [event["documentKey"] for event in group]
            )
            if len(found) != len(group):
                raise RuntimeError(
                    f"ImageSource.current_documents answered {len(found)} results for "
                    f"{len(group)} keys"
                )
            for event, doc in zip(group, found):
                event[FULL_DOCUMENT] = doc  # None -> null; keeps the slot after wallTime

    # -- whenAvailable / required ---------------------------------------------------------------

    def _apply_to_pre_images(self, updates: list[dict[str, Any]]) -> None:
        pre: list[Mapping[str, Any] | None] = [None] * len(updates)
        to_fetch: list[int] = []
        for i, event in enumerate(updates):
            before = event.get(FULL_DOCUMENT_BEFORE_CHANGE, MISSING)
            if before is not MISSING:
                pre[i] = before  # the pre-image stage ran; null there means there is none
            elif PRE_IMAGE_ID in event:
                to_fetch.append(i)
        if to_fetch:
            images = self.source.pre_images([updates[i][PRE_IMAGE_ID] for i in to_fetch])
            if len(images) != len(to_fetch):
                raise RuntimeError(
                    f"ImageSource.pre_images answered {len(images)} results for "
                    f"{len(to_fetch)} ids"
                )
            for i, image in zip(to_fetch, images):
                pre[i] = image

        posts: list[Mapping[str, Any] | None] = []
        for event, image in zip(updates, pre):
            post: Mapping[str, Any] | None = None
            if image is not None:
                spec = event.get(RAW_OPLOG_UPDATE_SPEC)
                # Only `$v:2` updates carry it; a legacy `$v:1` update (replayed from an old
                # oplog) gives no post-image.
                if isinstance(spec, Mapping) and isinstance(spec.get("diff"), Mapping):
                    post = apply_diff(image, spec["diff"])
            if post is None and self.mode == "required":
                raise post_image_not_found(event)
            posts.append(post)
        for event, post in zip(updates, posts):
            event[FULL_DOCUMENT] = post
