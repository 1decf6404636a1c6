"""The common stream's events written straight from the oplog entry to BSON.

A stream with no user stages, no images, no split, classic events and v2 tokens, once past its
resume point, does nothing to a CRUD event between the transform and the reply: check
invalidate, check resumability, ensure-token and the classic-type filter all pass insert,
update, replace and delete events through unchanged. For such a stream `encode_crud` writes
each event's bytes directly, in the transform's field order, from the pieces the entry already
holds as bytes (`o`, `o2` as raw BSON, the UUID), with the `ns` subdocument cached per
namespace: no event dict, no encoder call per event.

It covers only what it can write exactly as the general path (transform + `encode_events`)
does; for anything else (commands, transactions, views, entries of unusual shape, events over
the size limit) it answers None and the caller runs the general path over the whole batch.
tests/pipeline_stages/test_fast_path.py checks the two give identical bytes and tokens.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from bson.binary import Binary
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes, keystring, resume_token
from pipeline_stages.oplog_entry import Entry, EntryDocument
from pipeline_stages.split_large_event import BSON_OBJ_MAX_INTERNAL_SIZE
from pipeline_stages.stage_chain import StageChain
from pipeline_stages.transform import _update_shape
from pipeline_stages.update_description import update_description

Item = tuple[RawBSONDocument, dict[str, Any], Timestamp]

_I32 = struct.Struct("<i")
_TS = struct.Struct("<II")  # BSON Timestamp: increment, then seconds
_I64 = struct.Struct("<q")
_EPOCH = datetime.datetime(1970, 1, 1)
_MS = datetime.timedelta(milliseconds=1)

_ID = b"\x03_id\x00"
_DATA = b"\x02_data\x00"
_CLUSTER_TIME = b"\x11clusterTime\x00"
_WALL_TIME = b"\x09wallTime\x00"
_FULL_DOCUMENT = b"\x03fullDocument\x00"
_DOCUMENT_KEY = b"\x03documentKey\x00"


def _op_type(name: str) -> bytes:
    return b"\x02operationType\x00" + _I32.pack(len(name) + 1) + name.encode() + b"\x00"


_INSERT, _UPDATE, _REPLACE, _DELETE = map(_op_type, ("insert", "update", "replace", "delete"))

# `ns` elements by the entry's `ns` string (bounded: cleared when it grows past this).
_NS_CACHE_MAX = 4096
_ns_elements: dict[str, bytes | None] = {}


def _ns_element(ns: str) -> bytes | None:
    """`ns: {db, coll}` as an encoded element, None for a view namespace (view DDL)."""
    element = _ns_elements.get(ns)
    if element is None and ns not in _ns_elements:
        db, _, coll = ns.partition(".")
        element = (
            None if coll == "system.views"
            else bson_bytes.encode({"ns": {"db": db, "coll": coll}})[4:-1]
        )
        if len(_ns_elements) >= _NS_CACHE_MAX:
            _ns_elements.clear()
        _ns_elements[ns] = element
    return element


def fast_eligible(pipeline: StageChain) -> bool:
    """Whether the stages after the transform pass every CRUD event of `pipeline` unchanged
    (the parts that do not change while the stream runs)."""
    spec = pipeline.spec
    return (
        not spec.user_pipeline
        and pipeline.add_pre_image is None
        and pipeline.add_post_image is None
        and pipeline.split is None
        and not spec.show_expanded_events
        and not spec.show_raw_update_description
        and spec.full_document == "default"
        and spec.full_document_before_change == "off"
    )


def _ns_parts(pipeline: StageChain, ns: str) -> bytes | None:
    """The encoded `ns` element of a CRUD entry on `ns` without `fromMigrate`, or None when
    the stream's oplog filter drops such an entry or it is view DDL (cached per stream)."""
    cache = pipeline.fast_ns
    if ns in cache:
        return cache[ns]
    element = None
    # The filter's CRUD branch reads only `op` (not "c"/"n") and `ns` of such an entry.
    if pipeline.filter.matches({"op": "i", "ns": ns}):
        element = _ns_element(ns)
    if len(cache) >= _NS_CACHE_MAX:
        cache.clear()
    cache[ns] = element
    return element


def _token_pieces(operation_type: str) -> tuple[bytes, bytes] | None:
    """KeyString around the UUID of a v2 event token (txnOpIndex 0), when it sets no type bit."""
    pre, head, bits_value = resume_token._event_token_head(operation_type, 0)
    return None if bits_value else (pre, head)


_INSERT_TOKEN, _UPDATE_TOKEN, _REPLACE_TOKEN, _DELETE_TOKEN = map(
    _token_pieces, ("insert", "update", "replace", "delete")
)
_TS_KEYSTRING = struct.Struct(">BII")
_KEY_END = bytes((0, 0, keystring.END))


def encode_crud(
    pipeline: StageChain, entries: list[Entry], start: Timestamp
) -> list[Item] | None:
    """The queued items (event bytes, token, clusterTime) of `entries` (ascending `ts`), or
    None when one of the entries the filter keeps is not a plain CRUD entry this path
    writes exactly (the caller then runs the general path)."""
    if not entries:
        return []
    if entries[0]["ts"] < start:  # skip to the start (`ts` ascends)
        i = 0
        while i < len(entries) and entries[i]["ts"] < start:
            i += 1
        entries = entries[i:]
    transform = pipeline.transform
    versioned = transform.resumed_from is not None
    if transform.spec.token_version != 2 and not versioned:
        return None
    version_of = transform._version
    matches = pipeline.filter.matches
    ns_cache = pipeline.fast_ns
    event_token = resume_token.event_token
    simple_key = resume_token._simple_key_keystring
    pack_i32, pack_ts, pack_i64, pack_ts_key = _I32.pack, _TS.pack, _I64.pack, _TS_KEYSTRING.pack
    epoch, ms = _EPOCH, _MS
    entry_document = EntryDocument
    timestamp_kind = keystring.TIMESTAMP
    key_end = _KEY_END
    last_wall: Any = None
    last_wall_bytes = b""
    id_heads: dict[int, bytes] = {}  # the `_id` element up to the hex, by the hex's length
    out: list[Item] = []
    append = out.append
    for entry in entries:
        ns = entry.get("ns")
        if type(ns) is not str:
            return None
        # The filter reads these beyond `op` and `ns` (the per-namespace cache does not):
        # a migration's write, a transaction's, a viewless time-series one (9.0's marker).
        if "fromMigrate" in entry or "txnOpIndex" in entry or "isTimeseries" in entry:
            if not matches(entry):
                continue
            return None
        op = entry.get("op")
        if op != "i" and op != "u" and op != "d":
            if not matches(entry):
                continue
            return None
        ns_bytes = ns_cache.get(ns, b"")
        if ns_bytes == b"":
            ns_bytes = _ns_parts(pipeline, ns)
        if ns_bytes is None:
            if not matches(entry):
                continue  # another collection's write
            return None  # view DDL
        ts = entry.get("ts")
        ui = entry.get("ui")
        o = entry.get("o")  # (one missing: the general path raises what it raises)
        if (
            type(ui) is not Binary
            or ui._Binary__subtype != 4  # type: ignore[attr-defined]  # `subtype`, uncalled
            or len(ui) != 16
            or type(ts) is not Timestamp
            or type(o) is not entry_document
            or (versioned and version_of(ts) != 2)
        ):
            return None
        wall = entry.get("wall")
        if wall is None:
            wall_bytes = b""
        elif wall == last_wall and type(wall) is datetime.datetime:
            wall_bytes = last_wall_bytes
        elif type(wall) is datetime.datetime and wall.tzinfo is None:
            wall_bytes = last_wall_bytes = _WALL_TIME + pack_i64((wall - epoch) // ms)
            last_wall = wall
        else:
            return None
        o_raw = o._RawBSONDocument__raw
        if type(o_raw) is not bytes:  # a view into a large entry's bytes
            return None
        if op == "d":
            key = o_raw
            head, pieces, operation_type = _DELETE, _DELETE_TOKEN, "delete"
            body: tuple[bytes, ...] = (ns_bytes, _DOCUMENT_KEY, key, b"\x00")
        else:
            o2 = entry.get("o2")
            if type(o2) is not entry_document:
                return None
            key_raw = o2._RawBSONDocument__raw
            if type(key_raw) is not bytes:
                return None
            key = key_raw
            if op == "i":
                head, pieces, operation_type = _INSERT, _INSERT_TOKEN, "insert"
                body = (_FULL_DOCUMENT, o_raw, ns_bytes, _DOCUMENT_KEY, key, b"\x00")
            else:
                version, is_replacement = _update_shape(o)
                if is_replacement:
                    head, pieces, operation_type = _REPLACE, _REPLACE_TOKEN, "replace"
                    body = (_FULL_DOCUMENT, o_raw, ns_bytes, _DOCUMENT_KEY, key, b"\x00")
                elif version == 2:
                    head, pieces, operation_type = _UPDATE, _UPDATE_TOKEN, "update"
                    description = update_description(o["diff"], False)
                    body = (
                        ns_bytes, _DOCUMENT_KEY, key,
                        bson_bytes.encode({"updateDescription": description})[4:-1], b"\x00",
                    )
                else:
                    return None  # legacy updates and errors: the general path
        time, inc = ts._Timestamp__time, ts._Timestamp__inc  # type: ignore[attr-defined]
        key_keystring = simple_key(key) if pieces is not None else None
        if key_keystring is not None:
            assert pieces is not None
            data = b"".join((
                pack_ts_key(timestamp_kind, time, inc), pieces[0], ui, pieces[1],
                key_keystring, key_end,
            )).hex().upper()
            token: dict[str, Any] = {"_data": data}
        else:
            token = event_token(ts, operation_type, ui, key, 0)
            data = token["_data"]
        if len(token) == 1:
            n = len(data)
            id_head = id_heads.get(n)
            if id_head is None:
                id_head = id_heads[n] = _ID + pack_i32(n + 17) + _DATA + pack_i32(n + 1)
            event = b"".join((
                id_head, data.encode(), b"\x00\x00", head, _CLUSTER_TIME, pack_ts(inc, time),
                wall_bytes, *body,
            ))
        else:
            event = b"".join((
                bson_bytes.encode({"_id": token})[4:-1], head, _CLUSTER_TIME, pack_ts(inc, time),
                wall_bytes, *body,
            ))
        size = len(event) + 4
        if size > BSON_OBJ_MAX_INTERNAL_SIZE:
            return None  # the general path words the 10334 error
        append((entry_document(pack_i32(size) + event), token, ts))
    return out
