"""The types the store's modules share: collections, transactions, the store's images.

A collection (`Collection`) and a transaction (`Txn`) refer to each other (the transaction
creating a collection; the collections a transaction wrote, created or kept pre-images of),
and state.py, which every mixin of `Store` is typed against, declares attributes of both and
of `StoreImages`. So they live here, in a module that imports no mixin: catalog.py,
sessions.py, images.py and state.py import them from here (catalog.py and sessions.py
re-export them, as before) and no import circle runs through state.py.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bson.binary import Binary
from bson.objectid import ObjectId

from cdcserver.embedded import engine
from pipeline_stages import bson_bytes, keystring
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import Document, MemoryImageSource, matches_document_key

ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


_END = bytes((keystring.END,))
_OID = bytes((keystring.OID,))


def id_key(value: Any) -> bytes:
    """Bytes equal exactly when two `_id` values are equal (their KeyString)."""
    kind = type(value)
    # The common `_id`s straight to their KeyString, without the BSON round trip (one per
    # document written: encode_values costs several times more).
    if kind is int and -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return keystring.int_body(value) + _END
    if kind is ObjectId:
        return _OID + bytes(value.binary) + _END
    return keystring.encode_values((value,))[0]


class ErrorWithFields(MongoError):
    """A write error that carries fields of its own (`extra`), which mongod puts after
    `codeName` and before `errorLabels` in the reply."""

    def extra(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_reply(self) -> dict[str, object]:
        reply = super().to_reply()
        labels = reply.pop("errorLabels", None)
        reply.update(self.extra())
        if labels:
            reply["errorLabels"] = labels
        return reply


class DocumentValidationError(ErrorWithFields):
    """121 DocumentValidationFailure, with the `errInfo` mongod adds."""

    def __init__(self, doc_id: Any, details: dict[str, Any] | None = None) -> None:
        super().__init__(121, "Document failed validation")
        self.err_info: dict[str, Any] = {"failingDocumentId": doc_id}
        if details is not None:
            self.err_info["details"] = details

    def extra(self) -> dict[str, Any]:
        return {"errInfo": self.err_info}


@dataclass
class Collection:
    db: str
    name: str
    uuid: bytes
    options: dict[str, Any] = field(default_factory=dict)
    indexes: list[dict[str, Any]] = field(default_factory=lambda: [dict(ID_INDEX)])
    # unique index name -> index key bytes -> document key
    unique: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    # the transaction in progress that created it (mongod's UncommittedCatalogUpdates): until
    # that transaction commits it is in its `Txn.created`, not in the catalog, so nobody else
    # sees it, and it is not durable
    created_by: Txn | None = None
    # the store's commit sequence number when it was created (Store._seq): a transaction (or
    # snapshot read) whose snapshot is older does not see it, as mongod reads the catalog at
    # the snapshot's timestamp
    created_seq: int = 0
    # the store's commit sequence number when it took its name (a rename): older snapshots
    # see it under its old name (CatalogMixin._retire), not this one
    named_seq: int = 0
    # Its documents (the working set: committed ones only), document key -> document in
    # natural order; plain dicts the store owns, read by the query engine.
    _ui: tuple[bytes, Binary] | None = field(default=None, init=False, compare=False, repr=False)
    # index name -> its IndexTable, for the indexes a find has read (index_table.py, which
    # imports this module: not named here)
    secondary: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    records: OrderedDict[bytes, dict[str, Any]] = field(
        default_factory=OrderedDict, compare=False, repr=False
    )
    # a capped collection's documents' BSON sizes (its `size` limit), see cap_collection
    capped_sizes: dict[bytes, tuple[dict[str, Any], int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # a capped collection's RecordIds (document key -> id) and the last one given, see record_ids
    capped_ids: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False)
    last_record_id: int = field(default=0, compare=False, repr=False)

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def ui(self) -> Binary:
        # built once per uuid (every entry the collection logs carries it; a shard gives a new
        # collection the sharded collection's uuid after its create)
        cached = self._ui
        if cached is None or cached[0] is not self.uuid:
            cached = self._ui = (self.uuid, Binary(self.uuid, 4))
        return cached[1]

    @property
    def pre_images(self) -> bool:
        opt = self.options.get("changeStreamPreAndPostImages")
        return isinstance(opt, Mapping) and opt.get("enabled") is True

    def check_valid(self, doc: Mapping[str, Any], pre: Mapping[str, Any] | None = None) -> None:
        """The collection's validator, as mongod applies it (`validationLevel` strict or
        moderate, `validationAction` error or warn), `$jsonSchema` included."""
        validator = self.options.get("validator")
        if not validator:
            return
        level = self.options.get("validationLevel", "strict")
        if level == "off" or self.options.get("validationAction", "error") != "error":
            return
        try:
            failed, details = engine.validator_failure(validator, doc)
            if not failed:
                return
            if level == "moderate" and pre is not None and engine.validator_failure(
                validator, pre
            )[0]:
                return  # moderate: documents already invalid may stay invalid
        except MongoError as exc:
            if "not supported" in exc.errmsg or "not implemented" in exc.errmsg:
                return
            raise
        raise DocumentValidationError(doc.get("_id"), details)

    def meta_bytes(self) -> bytes:
        return bson_bytes.encode({"options": self.options, "indexes": self.indexes})

    def index(self, name: str) -> dict[str, Any] | None:
        return next((i for i in self.indexes if i["name"] == name), None)


@dataclass(eq=False)
class Txn:
    """A multi-document transaction in progress, isolated as mongod's are (read concern
    "snapshot"): it sees what was committed when it started plus its own writes; nobody else
    sees its writes before it commits.

    Its writes go to its own overlay (its latest version of each document it wrote, None once
    deleted), never to the working set, which holds committed documents only. We chose this
    over keeping committed pre-versions next to uncommitted documents in the working set: every
    read outside transactions (the common case, and change streams' `updateLookup`) stays on
    the working set untouched, and an abort only drops the overlay. The transaction's own
    commands read a view built for it (`Store._view`): the working set, minus what was
    committed since its snapshot (`Store._history`), plus its overlay. At commit the overlay is
    applied to the working set and logged as one `applyOps` entry (or a `partialTxn` chain of
    them when large, as mongod does); its documents reach SQLite then.

    An instance without `lsid` collects the deletes of one batched (TTL) delete, which are
    applied at once."""

    lsid: dict[str, Any]
    txn_number: int
    ops: list[dict[str, Any]] = field(default_factory=list)
    persist: list[tuple[bytes, bytes, bytes | None]] = field(default_factory=list)
    pre_images: list[tuple[Collection, int, dict[str, Any]]] = field(default_factory=list)
    state: str = "in progress"  # | committed | aborted
    snapshot: int = 0  # the store's commit sequence number when it started
    # collection uuid -> document key -> (its version here or None once deleted, whether it is
    # a record the transaction inserted: last in natural order)
    overlay: dict[bytes, dict[bytes, tuple[dict[str, Any] | None, bool]]] = field(
        default_factory=dict
    )
    colls: dict[bytes, Collection] = field(default_factory=dict)
    # (db, name) -> each collection it created (explicitly, implicitly or by createIndexes):
    # mongod's UncommittedCatalogUpdates, seen by this transaction only until it commits
    created: dict[tuple[str, str], Collection] = field(default_factory=dict)
    # (collection uuid, document key) of each document it wrote: its write locks
    keys: set[tuple[bytes, bytes]] = field(default_factory=set)
    # (collection uuid, unique index name, index key) its writes added or removed: locked too
    index_keys: set[tuple[bytes, str, bytes]] = field(default_factory=set)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set at commit or abort
    # the readConcern its first command gave (startTransaction), kept for its other commands
    read_concern: dict[str, Any] | None = None
    # The very command object that started it (a retry of that command reads again).
    started_by: Mapping[str, Any] | None = field(default=None, repr=False)
    expiry: asyncio.TimerHandle | None = None  # transactionLifetimeLimitSeconds

    @property
    def of_a_session(self) -> bool:
        """A client's transaction (not a batched TTL delete, which has no lsid)."""
        return bool(self.lsid)


class StoreDocuments(Protocol):
    """What `StoreImages` reads of the store (`Store`): its catalog and documents."""

    @property
    def catalog(self) -> Mapping[tuple[str, str], Collection]: ...

    def documents(self, c: Collection) -> Mapping[bytes, dict[str, Any]]: ...


class StoreImages(MemoryImageSource):
    """Pre-images kept by the store; `updateLookup` reads the store's current documents."""

    def __init__(self, store: StoreDocuments) -> None:
        super().__init__()
        self.store = store

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        meta = self.store.catalog.get((db, coll))
        if meta is None or (uuid is not None and bytes(uuid) != meta.uuid):
            return [None] * len(keys)
        docs = self.store.documents(meta)
        out: list[Document | None] = []
        for key in keys:
            if "_id" in key:
                doc = docs.get(id_key(key["_id"]))
                out.append(doc if doc is not None and matches_document_key(doc, key) else None)
            else:
                out.append(
                    next((d for d in docs.values() if matches_document_key(d, key)), None)
                )
        return out
