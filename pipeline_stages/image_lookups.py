"""Which image lookups a batch of oplog entries will make in a pipeline, before it is pushed.

The image stages (add_pre_image.py, add_post_image.py) ask their `ImageSource` synchronously,
while the batch runs. A source whose lookups are I/O (a live upstream) answers faster and
without holding its caller when it has fetched what the batch needs beforehand; this module
says what that is, from the entries alone, with the pipeline's own filters:

* `updateLookup`: the documentKey of every update event, per (db, coll, collection UUID);
* `whenAvailable` / `required` post-images and `fullDocumentBeforeChange`: the
  `config.system.preimages` `_id`s (`{nsUUID, ts, applyOpsIndex}`) of update (and, for
  pre-images, replace and delete) events; transactions are unwound as the pipeline unwinds
  them, so an op inside `applyOps` has its applyOps entry's `ts` and its index there.

It may name a little more than the stages end up asking for (events a later stage drops: the
resume point's own, a stream's events after its invalidate); a source must not treat what it
was told here as an error it has to report: only what the stages ask for counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline_stages.image_source import Document, equality_key, pre_image_id
from pipeline_stages.oplog_entry import Entry, split_ns
from pipeline_stages.unwind_transaction import unwind

if TYPE_CHECKING:
    from pipeline_stages.pipeline import ChangeStreamPipeline

# (db, coll, collection UUID or None: no UUID check)
Namespace = tuple[str, str, bytes | None]


@dataclass(slots=True)
class ImageLookups:
    """What a batch will look up; empty when it needs nothing."""

    # config.system.preimages `_id`s, each once, in batch order.
    pre_images: list[dict[str, Any]] = field(default_factory=list)
    # updateLookup: documentKeys per namespace (each once), namespaces in batch order.
    documents: dict[Namespace, list[Document]] = field(default_factory=dict)
    _seen_pre: set[bytes] = field(default_factory=set)
    _seen_keys: set[tuple[Namespace, bytes]] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.pre_images or self.documents)

    def add_pre_image(self, id_doc: dict[str, Any]) -> None:
        key = equality_key(id_doc)
        if key not in self._seen_pre:
            self._seen_pre.add(key)
            self.pre_images.append(id_doc)

    def add_document(self, ns: Namespace, document_key: Document) -> None:
        seen = (ns, equality_key(document_key))
        if seen not in self._seen_keys:
            self._seen_keys.add(seen)
            self.documents.setdefault(ns, []).append(document_key)


def needs_images(pipeline: ChangeStreamPipeline) -> bool:
    """Whether the pipeline runs an image stage."""
    return pipeline.add_pre_image is not None or pipeline.add_post_image is not None


def image_lookups(pipeline: ChangeStreamPipeline, entries: Iterable[Entry]) -> ImageLookups:
    """The lookups `pipeline.push(entries)` will ask its image source for (or a few more)."""
    out = ImageLookups()
    spec = pipeline.spec
    update_lookup = spec.full_document == "updateLookup"
    post_from_pre = spec.full_document in ("whenAvailable", "required")
    pre = spec.full_document_before_change != "off"
    if not (update_lookup or post_from_pre or pre):
        return out
    start = pipeline.start
    matches = pipeline.filter.matches
    op_filter = pipeline.filter.matches_transaction_op
    prefilter = pipeline.prefilter
    try:
        for entry in entries:
            if entry["ts"] < start or not matches(entry):
                continue
            if entry.get("op") == "c":
                ops: Iterable[Entry] = list(unwind(entry, op_filter, pipeline.history))
            else:
                ops = (entry,)
            for op in ops:
                _add(out, op, prefilter, update_lookup, post_from_pre, pre)
    except Exception:  # noqa: BLE001 - a malformed entry: the push reports it, in its order
        pass
    return out


def _add(
    out: ImageLookups,
    op: Entry,
    prefilter: Any,
    update_lookup: bool,
    post_from_pre: bool,
    pre: bool,
) -> None:
    kind = op.get("op")
    if kind != "u" and kind != "d":
        return
    ns = op.get("ns")
    o = op.get("o")
    if not isinstance(ns, str) or not isinstance(o, Mapping):
        return  # malformed: the transform reports it
    db, coll = split_ns(ns)
    if coll == "system.views":
        return  # view DDL, no images
    if kind == "d":
        operation_type = "delete"
    else:
        # As the transform tells them apart: an update has `$v`, a replacement an `_id`.
        replacement = o.get("$v") is None and "_id" in o
        operation_type = "replace" if replacement else "update"
    if prefilter is not None and not prefilter(operation_type, db, coll):
        return  # the user's leading $match drops it before the transform
    uuid = op.get("ui")
    if uuid is not None:
        uuid = uuid.bytes if hasattr(uuid, "bytes") else bytes(uuid)
    is_update = operation_type == "update"
    if update_lookup and is_update:
        key = op.get("o2")
        if isinstance(key, Mapping):
            out.add_document((db, coll, uuid), key)
    if uuid is not None and (pre or (post_from_pre and is_update)):
        ts = op.get("applyOpsTs", op["ts"])
        out.add_pre_image(pre_image_id(uuid, ts, int(op.get("applyOpsIndex", 0))))
