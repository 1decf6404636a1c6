"""BSON strings kept as mongod keeps them: as bytes, valid UTF-8 or not.

mongod checks a document's structure, never its strings' UTF-8 (BSONValidate's default level),
so an application can store bytes that are not UTF-8 and read them back as they were (the
Node.js driver's utf8_validation tests do), and a message mongod cuts at a byte count can end in
half a character. Here such bytes decode with Python's `surrogateescape` handler (each byte that
is not part of a UTF-8 sequence becomes a lone surrogate U+DC80..U+DCFF) and encode back to the
same bytes.

PyMongo's C encoder refuses lone surrogates (UnicodeEncodeError), so `encode` then writes the
document again here: strings and names by `surrogateescape`, every other value by the C encoder.
Documents whose strings are all UTF-8 never leave the C encoder.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import bson
from bson.codec_options import DEFAULT_CODEC_OPTIONS, CodecOptions
from bson.raw_bson import RawBSONDocument

SURROGATE_ESCAPE = "surrogateescape"
# bson's default options, but strings that are not UTF-8 decode (and round-trip) as above.
DECODE: CodecOptions[dict[str, Any]] = CodecOptions(
    unicode_decode_error_handler=SURROGATE_ESCAPE)
RAW: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, unicode_decode_error_handler=SURROGATE_ESCAPE)

_INT32 = struct.Struct("<i")


def codec_options(**options: Any) -> CodecOptions[Any]:
    """CodecOptions(**options) that decode strings as they came (see the module)."""
    return CodecOptions(unicode_decode_error_handler=SURROGATE_ESCAPE, **options)


def decode(data: bytes | bytearray | memoryview,
           codec_options: CodecOptions[Any] = DECODE) -> dict[str, Any]:
    """bson.decode, strings as they came."""
    return bson.decode(data, codec_options)


def encode(doc: Mapping[str, Any], check_keys: bool = False,
           codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS) -> bytes:
    """bson.encode, strings that held bytes which are not UTF-8 written back as those bytes."""
    try:
        return bson.encode(doc, check_keys, codec_options)
    except UnicodeEncodeError:
        return _document(doc, codec_options, top_level=True)


def raw_subdocuments(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` with each sub-document that PyMongo cannot encode (a string in it is not UTF-8)
    replaced by its bytes, a RawBSONDocument PyMongo's encoder copies as it is: for commands
    PyMongo itself sends on (a sidecar forwarding a client's command). Field order is kept."""
    return {k: _raw_value(v) for k, v in doc.items()}


def _raw_value(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, RawBSONDocument):
        try:
            bson.encode(value)
        except UnicodeEncodeError:
            return RawBSONDocument(_document(value, DEFAULT_CODEC_OPTIONS, top_level=False), RAW)
        return value
    if isinstance(value, (list, tuple)):
        return [_raw_value(v) for v in value]
    return value


def utf8(text: str) -> bytes:
    """A string's BSON bytes (a decoded lone surrogate is its byte again)."""
    return text.encode("utf-8", SURROGATE_ESCAPE)


def from_utf8(data: bytes) -> str:
    """The string BSON bytes decode to (bytes that are not UTF-8 as lone surrogates)."""
    return data.decode("utf-8", SURROGATE_ESCAPE)


def truncate_utf8(text: str, size: int) -> str:
    """The first `size` bytes of `text`, as mongod cuts a string at a byte count: a character
    cut in two leaves its first bytes, not UTF-8 on their own."""
    return from_utf8(utf8(text)[:size])


def is_utf8(text: str) -> bool:
    """Whether `text`'s bytes are UTF-8 (it holds no decoded lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _name(key: Any) -> bytes:
    if not isinstance(key, str):
        raise bson.errors.InvalidDocument(f"documents must have only string keys, key was {key!r}")
    name = utf8(key)
    if b"\x00" in name:
        raise bson.errors.InvalidDocument(f"Key names must not contain the NULL byte: {key!r}")
    return name + b"\x00"


def _element(name: bytes, value: Any, options: CodecOptions[Any]) -> bytes:
    # A str without a _type_marker is a BSON string (Code, a str subclass, has marker 13).
    if isinstance(value, str) and not hasattr(value, "_type_marker"):
        data = utf8(value)
        return b"\x02" + name + _INT32.pack(len(data) + 1) + data + b"\x00"
    if isinstance(value, Mapping) and not isinstance(value, RawBSONDocument):
        return b"\x03" + name + _document(value, options, top_level=False)
    if isinstance(value, (list, tuple)):
        items = {str(i): v for i, v in enumerate(value)}
        return b"\x04" + name + _document(items, options, top_level=False)
    # Any other value: the C encoder's bytes for {"": value}, under this element's name.
    wrapped = bson.encode({"": value}, False, options)
    return wrapped[4:5] + name + wrapped[6:-1]


def _document(doc: Mapping[str, Any], options: CodecOptions[Any], top_level: bool) -> bytes:
    parts = []
    # As PyMongo's encoder: a top-level `_id` is written first.
    if top_level and "_id" in doc:
        parts.append(_element(b"_id\x00", doc["_id"], options))
    for key, value in doc.items():
        if top_level and key == "_id":
            continue
        parts.append(_element(_name(key), value, options))
    body = b"".join(parts)
    return _INT32.pack(len(body) + 5) + body + b"\x00"
