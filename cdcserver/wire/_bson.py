"""Shared BSON helpers: decoding with validation, encoding once."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from .errors import ProtocolError
from .header import BSON_OBJ_MAX_INTERNAL_SIZE

# Commands decode to plain dicts. DATETIME_AUTO keeps dates outside Python's datetime range
# (valid BSON) from being rejected as "invalid".
DEFAULT_CODEC_OPTIONS: CodecOptions = CodecOptions(
    datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
# Used only to check raw documents; the decoded values are thrown away.
_VALIDATE_OPTIONS: CodecOptions = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)

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
    codec_options: CodecOptions,
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
        raise invalid_bson(f"invalid BSON: {exc}") from exc
    if len(decoded) != len(extents):  # pragma: no cover - sizes were walked above
        raise invalid_bson("invalid BSON: document count mismatch")
    if not raw:
        return decoded
    raw_options = codec_options.with_options(document_class=RawBSONDocument)
    return [RawBSONDocument(bytes(view[s:e]), raw_options) for s, e in extents]


def encode_document(doc: Document, codec_options: CodecOptions) -> bytes:
    """BSON bytes of ``doc``; raw documents and pre-encoded bytes are used as they are."""
    if isinstance(doc, RawBSONDocument):
        return doc.raw
    if isinstance(doc, (bytes, bytearray, memoryview)):
        return bytes(doc)
    # pymongo's C encoder copies embedded RawBSONDocument values byte for byte.
    return bson.encode(doc, check_keys=False, codec_options=codec_options)
