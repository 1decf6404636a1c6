"""The embedded store's indexes: index specs, index keys, and unique checks.

Index specs live on each collection (`Collection.indexes`); a unique index also keeps a table
of its keys (KeyString bytes -> document key) against which every write is checked, inside a
transaction as the transaction sees it. Builds are logged as mongod 8.0 logs them (one
`createIndexes` on an empty collection, else `startIndexBuild` + `commitIndexBuild`). A mixin
of `Store` (`store.py`).
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Mapping, Sequence
from itertools import product
from typing import TYPE_CHECKING, Any

from bson.binary import Binary

from cdcserver.embedded import engine
from cdcserver.embedded.catalog import bson_string
from cdcserver.embedded.sessions import TxnBlocked
from cdcserver.embedded.store_types import ErrorWithFields
from pipeline_stages import keystring
from pipeline_stages.dotted_path import has_document_path
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection, Txn
else:
    StoreState = object  # a base for the type checker only (state.py)


class DuplicateKeyError(ErrorWithFields):
    """11000, with the `keyPattern` / `keyValue` fields mongod adds to the error."""

    def __init__(
        self, ns: str, index: str, pattern: dict[str, Any], key_value: dict[str, Any]
    ) -> None:
        super().__init__(
            11000,
            f"E11000 duplicate key error collection: {ns} index: {index} dup key: "
            f"{bson_string(key_value)}",
        )
        self.key_pattern = pattern
        self.key_value = key_value

    def extra(self) -> dict[str, Any]:
        return {"keyPattern": self.key_pattern, "keyValue": self.key_value}


def _path_values(value: Any, parts: Sequence[str]) -> list[Any]:
    """The values an index key path reaches (arrays expand to their elements)."""
    if not parts:
        if isinstance(value, list):
            return list(value) if value else [None]
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        if head not in value:
            return [None]
        return _path_values(value[head], rest)
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            return _path_values(value[int(head)], rest)
        out: list[Any] = []
        for element in value:
            out.extend(_path_values(element, parts) if isinstance(element, Mapping) else [None])
        return out or [None]
    return [None]


def index_entries(
    spec: Mapping[str, Any], doc: Mapping[str, Any]
) -> list[tuple[bytes, dict[str, Any]]]:
    """(key bytes, {field: value}) of each index key `doc` produces in the index `spec`."""
    fields = list(spec["key"])
    if spec.get("sparse") and all(
        _path_values(doc, f.split(".")) == [None] and not has_document_path(doc, f) for f in fields
    ):
        return []
    pfe = spec.get("partialFilterExpression")
    if pfe is not None and not engine.matches(pfe, doc):
        return []
    per_field = [_path_values(doc, f.split(".")) for f in fields]
    out = []
    seen: set[bytes] = set()
    for combo in product(*per_field):
        key = keystring.encode_values(combo)[0]
        if key not in seen:
            seen.add(key)
            out.append((key, dict(zip(fields, combo))))
    return out


class IndexMixin(StoreState):
    """Index builds and drops, and the unique checks of every write."""

    def _rebuild_unique(self, c: Collection) -> None:
        c.unique = {}
        for spec in c.indexes[1:]:
            if spec.get("unique"):
                self._build_unique(c, spec)

    def _build_unique(self, c: Collection, spec: dict[str, Any]) -> None:
        table: dict[bytes, bytes] = {}
        for key, doc in self.documents(c).items():
            for entry_key, key_value in index_entries(spec, doc):
                if entry_key in table and table[entry_key] != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
                table[entry_key] = key
        c.unique[spec["name"]] = table

    def _add_index(self, c: Collection, spec: dict[str, Any], empty: bool) -> None:
        if spec.get("unique"):
            self._build_unique(c, spec)
        c.indexes.append(spec)
        self._save_meta(c)
        if empty:
            self.append_oplog("c", f"{c.db}.$cmd", {"createIndexes": c.name, **spec}, ui=c.ui)

    def create_indexes(self, c: Collection, specs: list[dict[str, Any]]) -> None:
        """Add new (already validated) index specs: one `createIndexes` entry each on an empty
        collection, else a two-phase build (`startIndexBuild` + `commitIndexBuild`)."""
        if not self.documents(c):
            for spec in specs:
                self._add_index(c, spec, empty=True)
            return
        for spec in specs:
            if spec.get("unique"):
                try:
                    self._build_unique(c, spec)
                except DuplicateKeyError as exc:
                    c.unique.pop(spec["name"], None)
                    for other in specs:
                        c.unique.pop(other["name"], None) if other is not spec else None
                    raise MongoError(
                        11000,
                        f"Index build failed: {uuid_module.uuid4()}: Collection {c.ns} "
                        f"( {uuid_module.UUID(bytes=c.uuid)} ) :: caused by :: {exc.errmsg}",
                    ) from None
        build = Binary(uuid_module.uuid4().bytes, 4)
        self.append_oplog("c", f"{c.db}.$cmd",
                          {"startIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs},
                          ui=c.ui)
        c.indexes.extend(specs)
        self._save_meta(c)
        self.append_oplog("c", f"{c.db}.$cmd",
                          {"commitIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs},
                          ui=c.ui)

    def drop_index(self, c: Collection, name: str) -> None:
        spec = c.index(name)
        assert spec is not None
        c.indexes.remove(spec)
        c.unique.pop(name, None)
        self._save_meta(c)
        self.append_oplog("c", f"{c.db}.$cmd", {"dropIndexes": c.name, "index": name}, ui=c.ui,
                          o2=spec)

    # -- unique checks ----------------------------------------------------------------------------

    def _check_unique(
        self, c: Collection, key: bytes, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """Raise DuplicateKey if `new` (replacing `old`) collides; returns the index edits."""
        txn = self._txn()
        if txn is not None:
            self._check_unique_in_txn(txn, c, key, new)
            return []
        edits = []
        for spec in c.indexes[1:]:
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            old_keys = [k for k, _ in index_entries(spec, old)] if old is not None else []
            new_entries = index_entries(spec, new)
            for k, key_value in new_entries:
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner.state == "in progress":
                    raise TxnBlocked(owner)
                holder = table.get(k)
                if holder is not None and holder != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
            edits.append((table, old_keys, [k for k, _ in new_entries]))
        return edits

    def _check_unique_in_txn(
        self, txn: Txn, c: Collection, key: bytes, new: Mapping[str, Any]
    ) -> None:
        """Unique indexes as the transaction sees them: committed keys it has not changed, and
        its own documents' keys. A key another open transaction holds, or one committed after
        its snapshot, is a write conflict (as WiredTiger reports it to mongod)."""
        entries = txn.overlay.get(c.uuid, {})
        for spec in c.indexes[1:]:
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            for k, key_value in index_entries(spec, new):
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner is not txn and owner.state == "in progress":
                    self._write_conflict(txn)
                holders = {table[k]} if k in table else set()
                holders.update(
                    other for other, (doc, _) in entries.items()
                    if doc is not None and any(e == k for e, _ in index_entries(spec, doc))
                )
                holders.discard(key)
                for holder in holders:
                    if holder in entries:
                        doc = entries[holder][0]
                        if doc is None or all(e != k for e, _ in index_entries(spec, doc)):
                            continue  # the transaction changed or deleted that document
                    elif self._last_write.get((c.uuid, holder), -1) > txn.snapshot:
                        self._write_conflict(txn)
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)

    def _index_edits(
        self, c: Collection, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """The unique index edits of replacing `old` by `new` (either may be None), unchecked."""
        return [
            (c.unique[s["name"]],
             [k for k, _ in index_entries(s, old)] if old is not None else [],
             [k for k, _ in index_entries(s, new)] if new is not None else [])
            for s in c.indexes[1:] if s["name"] in c.unique
        ]

    @staticmethod
    def _apply_edits(
        edits: list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]], key: bytes
    ) -> None:
        for table, old_keys, new_keys in edits:
            for k in old_keys:
                if table.get(k) == key:
                    del table[k]
            for k in new_keys:
                table[k] = key
