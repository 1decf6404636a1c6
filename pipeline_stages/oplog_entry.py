"""How the pipeline holds oplog entries: decoded by pymongo's C codec, nested documents left raw.

An entry is a `Mapping[str, Any]` whose top-level fields are decoded Python values and whose
embedded documents (`o`, `o2`, `lsid`, the ops inside `applyOps`, ...) stay `RawBSONDocument`s.
A document that passes through unchanged (`o` -> `fullDocument`) is therefore never decoded
into Python objects nor re-encoded field by field: the reply encoder copies its bytes.
UUIDs (`ui`, `lsid.id`) decode as `bson.Binary` subtype 4, which is also the 16 raw bytes a
resume token needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from bson.codec_options import CodecOptions
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes

OPLOG_CODEC_OPTIONS: CodecOptions[RawBSONDocument] = bson_bytes.RAW

Entry = Mapping[str, Any]

# The "null" OpTime that ends a prevOpTime chain.
NULL_OP_TIME_TS = Timestamp(0, 0)


class EntryDocument(RawBSONDocument):
    """The embedded documents of a decoded entry (`o`, `o2`, `lsid`, ...): `RawBSONDocument`s
    made without its `__init__` checks, which the C decoder handing over the bytes has just
    made (length, bounds, terminator). Their own nested documents are plain RawBSONDocuments.

    Measured: an insert entry decodes in ~2.2 us instead of ~3.1 us.
    """

    __slots__ = ()

    # `raw` read straight from the slot RawBSONDocument's property returns (a C-level read:
    # every queued event's size is taken from it, and the reply encoder reads it per event).
    raw = RawBSONDocument.__dict__["_RawBSONDocument__raw"]

    def __init__(self, bson_bytes: bytes | memoryview, codec_options: Any = None) -> None:
        self._RawBSONDocument__raw = bson_bytes
        self._RawBSONDocument__inflated_doc = None
        self._RawBSONDocument__codec_options = OPLOG_CODEC_OPTIONS


_ENTRY_CODEC_OPTIONS: CodecOptions[RawBSONDocument] = bson_bytes.codec_options(
    document_class=EntryDocument)


try:  # pymongo's own top-level inflation of a RawBSONDocument (one C call)
    from bson.raw_bson import _inflate_bson as _inflate
except ImportError:  # pragma: no cover - a pymongo without it: fall back to the lazy Mapping
    _inflate = None  # type: ignore[assignment]
try:  # the C function behind it, called without its two Python-level wrappers (~0.3 us)
    from bson._cbson import _raw_to_dict as _c_raw_to_dict  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - pymongo without its C extension
    _c_raw_to_dict = None


def decode_entry(raw: bytes) -> Entry:
    """One oplog entry from its BSON bytes: a dict of its top-level fields whose embedded
    documents stay `RawBSONDocument`s.

    Measured (bench/pipeline.py): a plain dict of top-level fields costs one C call, and
    reading a field is then a dict lookup; a lazy RawBSONDocument pays a Python-level
    `Mapping.get` on every access, which made the whole pipeline ~15% slower.
    """
    if _c_raw_to_dict is not None:
        entry: Entry = _c_raw_to_dict(raw, 4, len(raw) - 1, _ENTRY_CODEC_OPTIONS, {}, False)
        return entry
    if _inflate is not None:
        return _inflate(raw, _ENTRY_CODEC_OPTIONS)
    return RawBSONDocument(raw, OPLOG_CODEC_OPTIONS)


def iter_entries(data: bytes) -> Iterator[Entry]:
    """Entries from concatenated BSON documents (a mongodump `oplog.bson`)."""
    pos, n = 0, len(data)
    while pos < n:
        size = int.from_bytes(data[pos : pos + 4], "little")
        yield decode_entry(data[pos : pos + size])
        pos += size


def split_ns(ns: str) -> tuple[str, str]:
    """`db.coll` -> (db, coll); `db` -> (db, "")."""
    db, _, coll = ns.partition(".")
    return db, coll


def encode_in_order(doc: Any, codec_options: CodecOptions[Any] | None = None) -> bytes:
    """`doc` as BSON with its fields in its own order.

    `bson.encode` moves a top-level `_id` to the front, but events keep mongod's order, in
    which `to` (rename) and `txnNumber`/`lsid` (transactions) come before `_id`. An embedded
    document is written as is, so encode `{"": doc}` and cut the embedded document out
    (4-byte length, type 0x03, empty name's NUL ... trailing NUL).
    """
    if codec_options is None:
        return bson_bytes.encode({"": doc})[6:-1]
    return bson_bytes.encode({"": doc}, codec_options=codec_options)[6:-1]


def encode_many_in_order(docs: list[Any]) -> list[bytes]:
    """`[encode_in_order(d) for d in docs]` in one encoder call.

    Each `bson.encode` call pays ~1 us of its own (codec options are converted on every call),
    more than encoding a typical event: encode `{"": [docs...]}` once (array elements are
    embedded documents, written as they are) and cut each element out: after its type byte
    and its key (the index as digits, NUL) comes the document with its own length.
    """
    data = bson_bytes.encode({"": docs})
    out = []
    pos = 10  # total length, 0x04, "" NUL, the array's length
    index_of = data.index
    for _ in range(len(docs)):
        pos = index_of(0, pos + 1) + 1  # past the type byte and the key
        end = pos + int.from_bytes(data[pos : pos + 4], "little")
        out.append(data[pos:end])
        pos = end
    return out


# Fields mongod writes as NumberLong: relaxed Extended JSON (mongoexport's and mongosh's
# default) writes them as plain numbers, which read back as int32 when they fit.
_LONG_FIELDS = ("t", "v", "h", "txnNumber")
_OP_TIME_FIELDS = ("prevOpTime", "preImageOpTime", "postImageOpTime")


def with_oplog_types(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry read from Extended JSON with the types mongod gives its own fields (`t`, `v`,
    `txnNumber`, the op times' `t`, an applyOps' `count` are longs), changed in place: relaxed
    JSON loses them, and the change-stream stages check them (40532). User data in `o` stays
    as read (relaxed JSON cannot say whether a number was an int or a long)."""
    for key in _LONG_FIELDS:
        if type(entry.get(key)) is int:
            entry[key] = Int64(entry[key])
    for key in _OP_TIME_FIELDS:
        op_time = entry.get(key)
        if isinstance(op_time, dict) and type(op_time.get("t")) is int:
            op_time["t"] = Int64(op_time["t"])
    o = entry.get("o")
    if entry.get("op") == "c" and isinstance(o, dict):
        if type(o.get("count")) is int:
            o["count"] = Int64(o["count"])
        ops = o.get("applyOps")
        if isinstance(ops, list):
            for op in ops:
                if isinstance(op, dict):
                    with_oplog_types(op)
    return entry


# MongoDB 9.0's setFeatureCompatibilityVersion converts each time-series collection between
# its viewful form (a view `<coll>` on `system.buckets.<coll>`) and its viewless one (one
# collection `<coll>`), logging `{upgradeDowngradeViewlessTimeseries: <coll>, isUpgrade}` on
# `<db>.$cmd` (op_observer_impl.cpp). Change streams read it as the rename it is.
VIEWLESS_TIMESERIES = "upgradeDowngradeViewlessTimeseries"
_BUCKETS_PREFIX = "system.buckets."


def viewless_timeseries_rename(ns: Any, o: Mapping[str, Any]) -> tuple[str, str] | None:
    """(from, to) namespaces of an `upgradeDowngradeViewlessTimeseries` command entry: the
    buckets collection onto the collection on upgrade, back on downgrade; None for another
    entry (or a malformed one, which no stream matches, as mongod's filter drops it)."""
    coll = o.get(VIEWLESS_TIMESERIES)
    if type(coll) is not str or type(ns) is not str or not ns.endswith(".$cmd"):
        return None
    db = ns[: -len(".$cmd")]
    main, buckets = f"{db}.{coll}", f"{db}.{_BUCKETS_PREFIX}{coll}"
    return (buckets, main) if o.get("isUpgrade") is True else (main, buckets)
