"""Oplog application as pure functions: (operation, current document) -> new document.

No I/O here: `sync.py` reads the current documents and writes the results. The rules are
mongod's oplog application (`applyOperation_inlock`) for the entries a replica set writes:

* `i`: the document is `o` (an existing one is replaced: idempotent, as initial sync does);
* `u` with `$v: 2`: `o.diff` applied to the current document (`update_description.apply_diff`,
  the same function the post-images of change streams use, so a version and mongod's
  post-image are the same bytes); `u` with a replacement `o`: the document is `o`. An update
  of a missing document is skipped (during initial sync the document was deleted later; in
  steady state it would be an upstream inconsistency, reported by the caller);
* `d`: the document is gone;
* `c`: DDL (`create`, `drop`, `renameCollection`, `dropDatabase`, `collMod`) as a `Ddl`, and
  transactions: an `applyOps` applies its operations at its own `ts`; `partialTxn` entries and
  prepared `applyOps` wait for the entry that commits them (`Transactions`), and apply at that
  entry's `ts`. Each operation keeps the `ts` of the `applyOps` holding it and its index
  there: the `_id` mongod gives its pre-image (`{nsUUID, ts, applyOpsIndex}`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes
from pipeline_stages.image_source import equality_key
from pipeline_stages.oplog_entry import OPLOG_CODEC_OPTIONS, Entry
from pipeline_stages.update_description import apply_diff


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of an entry (a plain entry, or one inside an applyOps)."""

    op: str  # i u d c n
    ns: str
    uuid: bytes | None
    o: Mapping[str, Any]
    o2: Mapping[str, Any] | None
    entry_ts: Timestamp  # the entry holding it: its pre-image `_id`'s ts
    index: int  # its index in that applyOps (0 for a plain entry)
    from_migrate: bool = False  # a chunk migration's (its clone, range deletion, cleanup)


def _uuid(value: Any) -> bytes | None:
    if value is None:
        return None
    return bytes(value.bytes if hasattr(value, "bytes") else value)


def _op(raw: Mapping[str, Any], entry_ts: Timestamp, index: int) -> Op:
    o = raw.get("o")
    o2 = raw.get("o2")
    return Op(
        str(raw.get("op", "")), str(raw.get("ns", "")), _uuid(raw.get("ui")),
        o if isinstance(o, Mapping) else {}, o2 if isinstance(o2, Mapping) else None,
        entry_ts, index, raw.get("fromMigrate") is True,
    )


def inner_ops(entry: Entry) -> list[Op]:
    """The operations of an applyOps entry, in order."""
    ops = entry.get("o", {}).get("applyOps")
    ts = entry["ts"]
    if not isinstance(ops, list):
        return []
    return [_op(inner, ts, i) for i, inner in enumerate(ops) if isinstance(inner, Mapping)]


def _txn_key(entry: Entry) -> bytes | None:
    lsid = entry.get("lsid")
    if lsid is None:
        return None
    raw = lsid.raw if isinstance(lsid, RawBSONDocument) else bson_bytes.encode(lsid)
    return bytes(raw) + int(entry.get("txnNumber", 0)).to_bytes(8, "big", signed=True)


class Transactions:
    """Transactions whose entries came but whose commit has not: `partialTxn` applyOps chains
    and prepared applyOps, by (lsid, txnNumber). In memory: after a restart, `sync.py` reads
    again from the first entry of the oldest one still open (`oldest_open`)."""

    def __init__(self) -> None:
        self._open: dict[bytes, tuple[Timestamp, list[Op]]] = {}

    def oldest_open(self) -> Timestamp | None:
        return min((ts for ts, _ in self._open.values()), default=None)

    def feed(self, entry: Entry) -> list[Op]:
        """The operations `entry` applies at its own `ts` (none while a transaction is open)."""
        if entry.get("op") != "c":
            return [_op(entry, entry["ts"], 0)]
        o = entry.get("o", {})
        key = _txn_key(entry)
        if "applyOps" in o:
            ops = inner_ops(entry)
            if entry.get("partialTxn") or o.get("prepare"):
                if key is not None:
                    first, held = self._open.get(key, (entry["ts"], []))
                    self._open[key] = (first, held + ops)
                return []
            if key is not None and key in self._open:
                return self._open.pop(key)[1] + ops
            return ops
        if "commitTransaction" in o:
            return [] if key is None else self._open.pop(key, (None, []))[1]
        if "abortTransaction" in o:
            if key is not None:
                self._open.pop(key, None)
            return []
        return [_op(entry, entry["ts"], 0)]


def document_id(op: Op) -> Any:
    """The `_id` of the document a CRUD operation writes."""
    if op.op == "u":
        return (op.o2 or {}).get("_id")
    return op.o.get("_id")


def id_key(value: Any) -> bytes:
    """The key a document's versions are stored under: its `_id`'s BSON equality key (what the
    `_id` index compares), so 1, 1.0 and NumberLong(1) are one document, as in mongod."""
    return equality_key(value)


# BSON types of fixed size an `_id` often has: (type byte -> value bytes).
_FIXED = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}


def stored_id_key(raw: bytes) -> bytes:
    """`id_key` of a stored document's `_id` from its bytes: mongod stores `_id` first, so the
    first element is read alone (a fixed-size value or a string), not the whole document (the
    clone's hot path); any other layout is decoded."""
    if len(raw) > 9 and raw[5:9] == b"_id\x00":
        kind = raw[4]
        size = _FIXED.get(kind)
        if size is None and kind == 0x02:
            size = 4 + int.from_bytes(raw[9:13], "little")
        if size is not None and 9 + size < len(raw):
            element = raw[4:9 + size]
            one = (len(element) + 5).to_bytes(4, "little") + element + b"\x00"
            return id_key(bson_bytes.decode(one)["_id"])
    return id_key(bson_bytes.decode(raw)["_id"])


class Skipped(Exception):  # noqa: N818 - an outcome, not an error
    """The operation changes nothing (an update of a missing document)."""


def raw_of(doc: Mapping[str, Any]) -> bytes:
    return bytes(doc.raw) if isinstance(doc, RawBSONDocument) else bson_bytes.encode(doc)


def apply_crud(op: Op, current: bytes | None) -> bytes | None:
    """The document after `op` (an i, u or d) given the current one (None: none): its BSON,
    or None when deleted. Raises `Skipped` for an update of a missing document."""
    if op.op == "i":
        return raw_of(op.o)
    if op.op == "d":
        return None
    if op.op != "u":
        raise ValueError(f"not a CRUD operation: {op.op!r}")
    if current is None:
        raise Skipped
    o = op.o
    if o.get("$v") == 2:
        diff = o.get("diff")
        if not isinstance(diff, Mapping):
            raise Skipped
        pre = RawBSONDocument(current, codec_options=OPLOG_CODEC_OPTIONS)
        return bson_bytes.encode(apply_diff(pre, diff))
    if any(name.startswith("$") for name in o):  # a `$v: 1` modifier update (pre-5.0 oplogs)
        raise Skipped
    return raw_of(o)  # a replacement: the whole document, `_id` included


@dataclass(frozen=True, slots=True)
class Ddl:
    """What a command entry does to the catalog of materialized collections."""

    kind: str  # create, drop, rename, drop_database, other
    db: str
    coll: str = ""
    uuid: bytes | None = None
    to_db: str = ""  # rename: the new name
    to_coll: str = ""
    drop_target: bytes | None = None  # rename onto an existing collection: its UUID
    collation: bytes | None = None  # create: the collection's default collation (BSON)


def ddl_of(op: Op) -> Ddl:
    db = op.ns.partition(".")[0]
    o = op.o
    if "create" in o:
        return Ddl("create", db, str(o["create"]), op.uuid,
                   collation=collation_bson(o.get("collation")))
    if "drop" in o:
        return Ddl("drop", db, str(o["drop"]), op.uuid)
    if "renameCollection" in o:
        src_db, _, src = str(o["renameCollection"]).partition(".")
        to_db, _, to = str(o.get("to", "")).partition(".")
        return Ddl("rename", src_db, src, op.uuid, to_db, to, _uuid(o.get("dropTarget")))
    if "dropDatabase" in o:
        return Ddl("drop_database", db)
    return Ddl("other", db)  # collMod, indexes, ...: no effect on the documents


def ops_in_order(entries: Iterator[Entry], txns: Transactions) -> Iterator[tuple[Entry, list[Op]]]:
    """Each entry with the operations it applies at its `ts`."""
    for entry in entries:
        yield entry, txns.feed(entry)


def collation_bson(spec: Any) -> bytes | None:
    """A collection's default collation as the copy keeps it (None: simple, as mongod leaves
    the field out for `{locale: "simple"}`)."""
    if not isinstance(spec, Mapping) or spec.get("locale") in (None, "simple"):
        return None
    return bson_bytes.encode(dict(spec.items()))
