"""Where the image stages read documents from: pre-images and current documents, by batch.

mongod looks documents up one event at a time (`lookupSingleDocumentLocally` on
`config.system.preimages` for pre-images, `lookupSingleDocument` on the event's namespace for
`updateLookup`). cdcserver asks for a whole batch at once instead, so a live source can answer
with one query per batch (`{_id: {$in: [...]}}`) and a replay source with dictionary reads.

Both lookups are by BSON equality, as mongod's are: `config.system.preimages` is read through
its `_id` index, and the update lookup runs `{$match: <documentKey>}` on the collection. Two
values are equal when their KeyStrings (keystring.py) are: numbers compare by value whatever
their type (1 == 1.0 == NumberLong(1)), embedded documents field by field in order, strings
byte-wise (the simple collation).
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from bson.binary import Binary, UuidRepresentation
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages import keystring
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

Document = Mapping[str, Any]


@runtime_checkable
class ImageSource(Protocol):
    """Batched document lookups for `$_internalChangeStreamAddPreImage` / `AddPostImage`.

    Each method answers for a whole batch, aligned with its input: the i-th result belongs to
    the i-th id or key, and is None when nothing matches.
    """

    def pre_images(self, ids: Sequence[Document]) -> list[Document | None]:
        """The `preImage` field of the `config.system.preimages` document whose `_id` equals
        each id (`{nsUUID, ts, applyOpsIndex}`), or None when there is no such document."""
        ...

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        """For `fullDocument: "updateLookup"`: the document of `db.coll` currently matching each
        whole documentKey, or None when none does. When `uuid` is given, every answer is None
        unless the collection now at `db.coll` has that UUID (it was dropped, or dropped and
        re-created). More than one match is an error (ChangeStreamFatalError, as in mongod)."""
        ...


# ---------------------------------------------------------------------------------------------
# BSON equality


def equality_key(value: Any) -> bytes:
    """Bytes equal exactly when the values are equal in BSON comparison (their KeyString,
    without type bits: what an index lookup or an `$eq` on that value compares)."""
    return keystring.encode_values((value,))[0]


def _as_uuid_binary(value: Any) -> Any:
    """A collection UUID as BSON stores it (binary subtype 4), from bytes, Binary or UUID."""
    if isinstance(value, uuid_module.UUID):
        return Binary.from_uuid(value, UuidRepresentation.STANDARD)
    if isinstance(value, Binary):
        return value if value.subtype == 4 else Binary(bytes(value), 4)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Binary(bytes(value), 4)
    return value


def _uuid_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, uuid_module.UUID):
        return value.bytes
    return bytes(value)


def pre_image_id(ns_uuid: Any, ts: Timestamp, apply_ops_index: int = 0) -> dict[str, Any]:
    """The `_id` of a `config.system.preimages` document, fields in mongod's order."""
    return {
        "nsUUID": _as_uuid_binary(ns_uuid),
        "ts": ts,
        "applyOpsIndex": Int64(apply_ops_index),
    }


def pre_image_equality_key(id_doc: Any) -> bytes:
    """Equal exactly when two pre-image `_id`s are (nsUUID as bytes, Binary or UUID)."""
    if isinstance(id_doc, Mapping) and "nsUUID" in id_doc:
        fixed = _as_uuid_binary(id_doc["nsUUID"])
        if fixed is not id_doc["nsUUID"]:
            id_doc = {k: (fixed if k == "nsUUID" else v) for k, v in id_doc.items()}
    return equality_key(id_doc)


_pre_image_key = pre_image_equality_key

_ABSENT = object()


def _path_values(value: Any, parts: Sequence[str]) -> Iterator[Any]:
    """The values a dotted path reaches in `value` (mongod's path traversal, simplified: a
    path component descends into an embedded document, into each document of an array, or
    selects an array element by position). Yields `_ABSENT` where the path ends nowhere."""
    if not parts:
        yield value
        return
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        if head in value:
            yield from _path_values(value[head], rest)
        else:
            yield _ABSENT
    elif isinstance(value, list):
        found = False
        if head.isdigit() and int(head) < len(value):
            found = True
            yield from _path_values(value[int(head)], rest)
        for element in value:
            if isinstance(element, Mapping):
                found = True
                yield from _path_values(element, parts)
        if not found:
            yield _ABSENT
    else:
        yield _ABSENT


def _field_equals(doc: Document, path: str, wanted: Any, wanted_key: bytes) -> bool:
    """`{<path>: {$eq: wanted}}` against `doc`."""
    for value in _path_values(doc, path.split(".")):
        if value is _ABSENT:
            if wanted is None:  # {$eq: null} also matches a missing field
                return True
            continue
        if equality_key(value) == wanted_key:
            return True
        if isinstance(value, list) and any(equality_key(v) == wanted_key for v in value):
            return True
    return False


def matches_document_key(doc: Document, key: Document) -> bool:
    """Whether `doc` matches `{$match: key}` for a documentKey (equality on every field)."""
    return all(
        _field_equals(doc, name, value, equality_key(value)) for name, value in key.items()
    )


# ---------------------------------------------------------------------------------------------
# In-memory source


class _Collection:
    __slots__ = ("uuid", "by_id")

    def __init__(self, uuid: bytes | None) -> None:
        self.uuid = uuid
        self.by_id: dict[bytes, Document] = {}


class MemoryImageSource(ImageSource):
    """Pre-images and collections held in dictionaries.

    Used by tests and by `cdcserver replay`, which has no database but can be given the
    `config.system.preimages` documents recorded alongside an oplog (`add_pre_image_document`)
    and, for `updateLookup`, the collections' current contents (`put_document`).
    """

    def __init__(
        self,
        pre_image_documents: Sequence[Document] = (),
    ) -> None:
        self._pre_images: dict[bytes, Document] = {}
        self._collections: dict[tuple[str, str], _Collection] = {}
        for doc in pre_image_documents:
            self.add_pre_image_document(doc)

    # -- config.system.preimages --------------------------------------------------------------

    def add_pre_image_document(self, doc: Document) -> None:
        """Store a `config.system.preimages` document `{_id, operationTime, preImage}`."""
        if "_id" not in doc:
            raise ValueError("a config.system.preimages document needs an _id")
        image = doc.get("preImage")
        if not isinstance(image, Mapping):
            # mongod: tassert 6148000 "Pre-image document must contain the 'preImage' field"
            raise ValueError("a config.system.preimages document needs a preImage document")
        self._pre_images[_pre_image_key(doc["_id"])] = image

    def add_pre_image(
        self, ns_uuid: Any, ts: Timestamp, apply_ops_index: int, pre_image: Document
    ) -> None:
        """Store the pre-image of the write at (`ts`, `apply_ops_index`) on collection
        `ns_uuid` (for a transaction: the applyOps entry's ts and the op's index in it)."""
        self.add_pre_image_document(
            {"_id": pre_image_id(ns_uuid, ts, apply_ops_index), "preImage": pre_image}
        )

    def remove_pre_image(self, id_doc: Document) -> bool:
        """Forget a pre-image (as expiry or oplog truncation does); True if there was one."""
        return self._pre_images.pop(_pre_image_key(id_doc), None) is not None

    def pre_images(self, ids: Sequence[Document]) -> list[Document | None]:
        table = self._pre_images
        return [table.get(_pre_image_key(id_doc)) for id_doc in ids]

    # -- collections ----------------------------------------------------------------------------

    def create_collection(self, db: str, coll: str, uuid: Any = None) -> None:
        """(Re-)create `db.coll`, empty, with collection UUID `uuid` (bytes, Binary or UUID)."""
        self._collections[(db, coll)] = _Collection(_uuid_bytes(uuid))

    def drop_collection(self, db: str, coll: str) -> bool:
        return self._collections.pop((db, coll), None) is not None

    def collection_uuid(self, db: str, coll: str) -> bytes | None:
        c = self._collections.get((db, coll))
        return None if c is None else c.uuid

    def put_document(self, db: str, coll: str, doc: Document) -> None:
        """Insert or replace (by `_id`) a document; creates the collection (no UUID) if
        needed."""
        if "_id" not in doc:
            raise ValueError("a stored document needs an _id")
        c = self._collections.get((db, coll))
        if c is None:
            c = self._collections[(db, coll)] = _Collection(None)
        c.by_id[equality_key(doc["_id"])] = doc

    def delete_document(self, db: str, coll: str, id_value: Any) -> bool:
        c = self._collections.get((db, coll))
        if c is None:
            return False
        return c.by_id.pop(equality_key(id_value), None) is not None

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        c = self._collections.get((db, coll))
        if c is None or (uuid is not None and c.uuid != _uuid_bytes(uuid)):
            return [None] * len(keys)
        return [self._find_one(c, key) for key in keys]

    @staticmethod
    def _find_one(c: _Collection, key: Document) -> Document | None:
        if "_id" in key:
            doc = c.by_id.get(equality_key(key["_id"]))
            candidates: Sequence[Document] = () if doc is None else (doc,)
        else:
            candidates = list(c.by_id.values())
        found = [doc for doc in candidates if matches_document_key(doc, key)]
        if len(found) > 1:
            raise MongoError(
                280,
                f"found more than one document with document key {document_string(key)} "
                f"[{document_string(found[0])}, {document_string(found[1])}]",
            )
        return found[0] if found else None
