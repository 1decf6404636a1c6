"""Shared BSON helpers: decoding with validation, encoding once."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import bson
import bson.datetime_ms
import bson.errors
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes

from .errors import ProtocolError
from .header import BSON_OBJ_MAX_INTERNAL_SIZE

# Commands decode to plain dicts. DATETIME_AUTO keeps dates outside Python's datetime range
# (valid BSON) from being rejected as "invalid".
DEFAULT_CODEC_OPTIONS: CodecOptions[Any] = bson_bytes.codec_options(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
# Used only to check raw documents; the decoded values are thrown away.
_VALIDATE_OPTIONS: CodecOptions[Any] = bson_bytes.codec_options(
    datetime_conversion=DatetimeConversion.DATETIME_MS
)

_INT32 = struct.Struct("<i")

Document = Mapping[str, Any] | RawBSONDocument | bytes | bytearray | memoryview


def invalid_bson(errmsg: str) -> ProtocolError:
    # mongod answers invalid BSON with an error reply and keeps the connection.
    return ProtocolError(errmsg, code=22, code_name="InvalidBSON", fatal=False)


def too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        f"BSONObj size: {size} (0x{size:X}) is invalid. "
        f"Size must be between 0 and {limit}({limit // (1024 * 1024)}MB)",
        code=10334,
        code_name="BSONObjectTooLarge",
        fatal=False,
    )


# BSONDepth::kDefaultMaxAllowableDepth: how many levels a message's document may nest below its
# top level (mongod's validateBSON keeps 201 frames: the top one and 200 nested).
MAX_ALLOWABLE_DEPTH = 200


def too_deep(path: list[str], id_text: str | None) -> ProtocolError:
    """mongod's precise validator's error: the dotted path down to the element that would open
    one level too many, and the top-level `_id` when it was read before that element."""
    where = f"_id: {id_text}" if id_text is not None else "unknown _id"
    return ProtocolError(
        f"BSONObj exceeds maximum nested object depth in element with field name "
        f"'{'.'.join(path)}' in object with {where}",
        code=15,
        code_name="Overflow",
        fatal=False,
    )


def element_text(value: Any) -> str:
    """A value as BSONElement::toString() writes it (the common `_id` types)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if value is None:
        return "null"
    if isinstance(value, datetime.datetime):
        return f"new Date({int(bson.datetime_ms.DatetimeMS(value))})"
    if isinstance(value, bson.datetime_ms.DatetimeMS):
        return f"new Date({int(value)})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    return str(value)


def _id_before(doc: Mapping[str, Any], first: str) -> str | None:
    """The text of `doc`'s `_id` if it comes before its field `first` (mongod notes the `_id`
    once it has validated it, in document order)."""
    if "_id" not in doc or first == "_id":
        return None
    for key in doc:
        if key == "_id":
            return element_text(doc["_id"])
        if key == first:
            return None
    return None  # pragma: no cover - `first` is a key of doc


def overflow_path(doc: Mapping[str, Any], max_depth: int = MAX_ALLOWABLE_DEPTH) -> list[str] | None:
    """The path to the first element (depth first, in document order) whose object or array
    value would be nested more than `max_depth` levels below `doc`; None when there is none.
    Iterative: no recursion, whatever the depth."""
    stack: list[Iterator[tuple[str, Any]]] = [iter(doc.items())]
    names: list[str] = []
    while stack:
        for key, value in stack[-1]:
            if isinstance(value, (dict, list)):
                if len(stack) > max_depth:
                    return [*names, key]
                names.append(key)
                stack.append(
                    iter(value.items()) if isinstance(value, dict)
                    else ((str(i), v) for i, v in enumerate(value))
                )
                break
        else:
            stack.pop()
            if names:
                names.pop()
    return None


# Bytes after the field name of each fixed-size BSON type (for the raw walk below).
_FIXED_SIZES = {1: 8, 6: 0, 7: 12, 8: 1, 9: 8, 10: 0, 16: 4, 17: 8, 18: 8, 19: 16, 127: 0, 255: 0}


def raw_overflow(
    data: bytes, start: int, max_depth: int = MAX_ALLOWABLE_DEPTH
) -> ProtocolError | None:
    """The depth error of the document at `data[start:]`, read from its bytes (for documents
    too deep for the C decoder, which recurses); None if it is not too deep or is malformed
    (the decoder's own error stands then)."""
    try:
        ends = [start + int.from_bytes(data[start : start + 4], "little")]
        names: list[str] = []
        id_text: str | None = None
        pos = start + 4
        while ends:
            kind = data[pos]
            if kind == 0:
                pos += 1
                ends.pop()
                if names:
                    names.pop()
                continue
            begin = pos
            nul = data.index(b"\x00", pos + 1)
            name = data[pos + 1 : nul].decode("utf-8", "replace")
            pos = nul + 1
            if kind in (3, 4):
                if len(ends) > max_depth:
                    return too_deep([*names, name], id_text)
                ends.append(pos + int.from_bytes(data[pos : pos + 4], "little"))
                names.append(name)
                pos += 4
                continue
            if kind in _FIXED_SIZES:
                pos += _FIXED_SIZES[kind]
            elif kind in (2, 13, 14):
                pos += 4 + int.from_bytes(data[pos : pos + 4], "little")
            elif kind == 5:
                pos += 5 + int.from_bytes(data[pos : pos + 4], "little")
            elif kind == 11:
                pos = data.index(b"\x00", data.index(b"\x00", pos) + 1) + 1
            elif kind == 12:
                pos += 16 + int.from_bytes(data[pos : pos + 4], "little")
            elif kind == 15:
                pos += int.from_bytes(data[pos : pos + 4], "little")
            else:
                return None
            if pos > ends[-1]:
                return None
            if len(ends) == 1 and name == "_id":
                element = data[begin:pos]
                single = (len(element) + 5).to_bytes(4, "little") + element + b"\x00"
                id_text = element_text(bson_bytes.decode(single)["_id"])
    except (IndexError, ValueError, bson.errors.BSONError):
        return None
    return None


def document_extents(
    view: memoryview, start: int, end: int, max_size: int = BSON_OBJ_MAX_INTERNAL_SIZE
) -> list[tuple[int, int]]:
    """(start, end) of each BSON document packed in ``view[start:end]``, exactly filling it."""
    out = []
    pos = start
    while pos < end:
        if end - pos < 5:
            raise invalid_bson(f"truncated BSON document: {end - pos} bytes left in section")
        (size,) = _INT32.unpack_from(view, pos)
        if size < 5 or size > end - pos:
            raise invalid_bson(f"BSON document size {size} does not fit its section")
        if size > max_size:
            raise too_large(size, max_size)
        out.append((pos, pos + size))
        pos += size
    return out


def decode_documents(
    view: memoryview,
    extents: list[tuple[int, int]],
    codec_options: CodecOptions[Any],
    raw: bool,
) -> list[Any]:
    """Decode (and so validate) documents; ``raw`` keeps them as RawBSONDocuments."""
    if not extents:
        return []
    # Lazily decoded documents would skip validation: validate fully, then wrap the bytes.
    raw = raw or issubclass(codec_options.document_class, RawBSONDocument)
    region = view[extents[0][0] : extents[-1][1]]
    try:
        # One C call over the whole region: fast for large insert batches.
        decoded = bson.decode_all(region, _VALIDATE_OPTIONS if raw else codec_options)
    except Exception as exc:  # InvalidBSON, UnicodeDecodeError, OverflowError, ...
        if "recursion" in str(exc):  # nested too deep for the C decoder: far over the limit
            data = bytes(region)
            base = extents[0][0]
            for s, _ in extents:
                deep = raw_overflow(data, s - base)
                if deep is not None:
                    raise deep from None
        raise invalid_bson(f"invalid BSON: {exc}") from exc
    if len(decoded) != len(extents):  # pragma: no cover - sizes were walked above
        raise invalid_bson("invalid BSON: document count mismatch")
    _check_depth(view, extents, decoded)
    if not raw:
        return decoded
    raw_options = codec_options.with_options(document_class=RawBSONDocument)
    return [RawBSONDocument(bytes(view[s:e]), raw_options) for s, e in extents]


def _check_depth(view: memoryview, extents: list[tuple[int, int]], decoded: list[Any]) -> None:
    """mongod's validateBSON depth limit on each document. Only a document with more than
    MAX_ALLOWABLE_DEPTH object/array type bytes (0x03, 0x04) can nest that deep: counting them
    (in C, over the message's own bytes) spares the walk of almost every document, and a
    document too small to hold that many levels is not even counted."""
    data: Any = view.obj
    if not (isinstance(data, bytes) and view.nbytes == len(data)):
        data, base = bytes(view[extents[0][0] : extents[-1][1]]), extents[0][0]
    else:
        base = 0
    for (s, e), doc in zip(extents, decoded, strict=True):
        if e - s <= _MIN_OVERFLOW_BYTES:
            continue
        s, e = s - base, e - base
        count = data.count(3, s, e)
        if count <= MAX_ALLOWABLE_DEPTH:
            count += data.count(4, s, e)
            if count <= MAX_ALLOWABLE_DEPTH:
                continue
        path = overflow_path(doc)
        if path is not None:
            raise too_deep(path, _id_before(doc, path[0]))


# The smallest document nesting MAX_ALLOWABLE_DEPTH + 1 levels: 7 bytes a level (type, an empty
# name's NUL, length, EOO) and its own 5.
_MIN_OVERFLOW_BYTES = 7 * (MAX_ALLOWABLE_DEPTH + 1) + 5 - 1


def encode_document(doc: Document, codec_options: CodecOptions[Any]) -> bytes:
    """BSON bytes of ``doc``; raw documents and pre-encoded bytes are used as they are."""
    if isinstance(doc, RawBSONDocument):
        return bytes(doc.raw)  # the same object when it is bytes (typed bytes | memoryview)
    if isinstance(doc, (bytes, bytearray, memoryview)):
        return bytes(doc)
    # pymongo's C encoder copies embedded RawBSONDocument values byte for byte.
    return bson_bytes.encode(doc, check_keys=False, codec_options=codec_options)
