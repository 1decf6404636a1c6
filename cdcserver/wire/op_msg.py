"""OP_MSG (2013): parse client requests, build replies.

Layout after the header: ``uint32 flagBits``, then sections until the end of the message
(or the optional trailing CRC-32C): kind 0 is the command body (one BSON document); kind 1
is a document sequence (``int32 size`` counting itself, a cstring identifier, then BSON
documents filling the rest). Validation and error codes follow mongod's ``OpMsg::parse``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson.codec_options import CodecOptions

from pipeline_stages.dotted_path import has_document_path

from ._bson import (
    DEFAULT_CODEC_OPTIONS,
    Document,
    decode_documents,
    document_extents,
    encode_document,
)
from .crc32c import crc32c
from .errors import ProtocolError
from .framing import Frame
from .header import BSON_OBJ_MAX_INTERNAL_SIZE, HEADER_SIZE, OpCode, pack_header, parse_header

__all__ = [
    "CHECKSUM_PRESENT",
    "EXHAUST_ALLOWED",
    "MORE_TO_COME",
    "OpMsg",
    "encode_op_msg",
    "parse_op_msg",
]

CHECKSUM_PRESENT = 1 << 0
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
_SUPPORTED_FLAGS = CHECKSUM_PRESENT | MORE_TO_COME
# The low 16 bits are "required": a receiver must reject a message with one it doesn't
# know. The high 16 bits are optional hints (exhaustAllowed) and may be ignored.
_REQUIRED_MASK = 0xFFFF
_MAX_SEQUENCES = 2  # mongod's limit (bulkWrite uses two: ops and nsInfo)

_UINT32 = struct.Struct("<I")
_INT32 = struct.Struct("<i")


@dataclass(slots=True)
class OpMsg:
    """A parsed OP_MSG request.

    ``body`` is the command with every document sequence merged in as an array field of the
    same name (as mongod presents it to commands), so ``insert``'s ``documents`` sequence
    reads like a ``documents`` array; ``sequences`` holds the same lists by identifier.
    """

    request_id: int
    response_to: int
    flags: int
    body: dict[str, Any]
    sequences: dict[str, list[Any]] = field(default_factory=dict)
    compressor_id: int | None = None  # set when the request arrived inside OP_COMPRESSED

    op_code = OpCode.MSG

    @property
    def checksum_present(self) -> bool:
        return bool(self.flags & CHECKSUM_PRESENT)

    @property
    def more_to_come(self) -> bool:
        """The client expects no reply (e.g. an unacknowledged write)."""
        return bool(self.flags & MORE_TO_COME)

    @property
    def exhaust_allowed(self) -> bool:
        return bool(self.flags & EXHAUST_ALLOWED)

    @property
    def command_name(self) -> str | None:
        return next(iter(self.body), None)

    @property
    def database(self) -> Any:
        """The ``$db`` field (its absence is the command layer's error to report)."""
        return self.body.get("$db")


def _err(errmsg: str, code: int, code_name: str, fatal: bool, rid: int) -> ProtocolError:
    return ProtocolError(errmsg, code=code, code_name=code_name, fatal=fatal, request_id=rid)


def parse_op_msg(
    message: Frame | bytes | bytearray | memoryview,
    *,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
    raw_sequences: bool = False,
    max_bson_size: int = BSON_OBJ_MAX_INTERNAL_SIZE,
) -> OpMsg:
    """Parse one whole OP_MSG message (header included: the checksum covers it).

    ``raw_sequences=True`` leaves sequence documents as validated ``RawBSONDocument``s
    (their bytes untouched) instead of decoding them with ``codec_options``.
    """
    data = message.data if isinstance(message, Frame) else message
    view = memoryview(data)
    header = parse_header(view)
    rid = header.request_id
    if header.op_code != OpCode.MSG:
        raise ProtocolError(f"not an OP_MSG message: opCode {header.op_code}", request_id=rid)
    if header.message_length != len(view):
        raise ProtocolError(
            f"messageLength {header.message_length} does not match {len(view)} bytes",
            request_id=rid,
        )
    if len(view) < HEADER_SIZE + 4:
        raise ProtocolError("OP_MSG is too short to hold flagBits", request_id=rid)

    (flags,) = _UINT32.unpack_from(view, HEADER_SIZE)
    if flags & ~_SUPPORTED_FLAGS & _REQUIRED_MASK:
        raise _err(
            f"Message contains illegal flags value: Ob{flags:032b}",
            223,
            "IllegalOpMsgFlag",
            True,
            rid,
        )

    try:
        body, sequences = _parse_sections(view, flags, rid, codec_options, raw_sequences,
                                          max_bson_size)
    except ProtocolError as exc:
        exc.more_to_come = bool(flags & MORE_TO_COME)
        raise
    return OpMsg(rid, header.response_to, flags, body, sequences)


def _parse_sections(
    view: memoryview,
    flags: int,
    rid: int,
    codec_options: CodecOptions[Any],
    raw_sequences: bool,
    max_bson_size: int,
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The body (document sequences merged in) and the sequences, after the flagBits."""
    end = len(view)
    if flags & CHECKSUM_PRESENT:
        if end - HEADER_SIZE - 4 <= 4:
            raise _err(
                "Invalid message size for an OpMsg containing a checksum",
                51251,
                "Location51251",
                False,
                rid,
            )
        end -= 4
        (expected,) = _UINT32.unpack_from(view, end)
        # Checked before the sections are interpreted: a corrupted message must not be
        # half-parsed into misleading errors.
        if crc32c(view[:end]) != expected:
            raise _err(
                "OP_MSG checksum does not match contents", 288, "ChecksumMismatch", True, rid
            )

    body: dict[str, Any] | None = None
    sequences: dict[str, list[Any]] = {}
    pos = HEADER_SIZE + 4
    while pos < end:
        kind = view[pos]
        pos += 1
        if kind == 0:
            if body is not None:
                raise _err("Multiple body sections in message", 40430, "Location40430", False, rid)
            if end - pos < 4:
                raise ProtocolError("OP_MSG body section is truncated", request_id=rid)
            (size,) = _INT32.unpack_from(view, pos)
            if size < 5 or size > end - pos:
                raise ProtocolError(
                    f"OP_MSG body of {size} bytes overruns the message", request_id=rid
                )
            try:
                extents = document_extents(view, pos, pos + size, max_bson_size)
                (body,) = decode_documents(view, extents, codec_options, raw=False)
            except ProtocolError as exc:
                exc.request_id = rid
                raise
            if not isinstance(body, dict):  # a custom document_class
                body = dict(body)
            pos += size
        elif kind == 1:
            if len(sequences) >= _MAX_SEQUENCES:
                raise _err(
                    "Too many document sequences in OP_MSG",
                    233,
                    "TooManyDocumentSequences",
                    True,
                    rid,
                )
            if end - pos < 4:
                raise ProtocolError("OP_MSG document sequence is truncated", request_id=rid)
            (size,) = _INT32.unpack_from(view, pos)
            if size < 5 or size > end - pos:
                raise ProtocolError(
                    f"OP_MSG document sequence of {size} bytes overruns the message",
                    request_id=rid,
                )
            seq_end = pos + size
            name_start = pos + 4
            nul = bytes(view[name_start:seq_end]).find(b"\x00")
            if nul < 0:
                raise ProtocolError(
                    "OP_MSG document sequence identifier is not terminated", request_id=rid
                )
            try:
                name = bytes(view[name_start : name_start + nul]).decode()
            except UnicodeDecodeError:
                raise ProtocolError(
                    "OP_MSG document sequence identifier is not UTF-8", request_id=rid
                ) from None
            if name in sequences:
                raise _err(
                    f"Duplicate document sequence: {name}", 40431, "Location40431", False, rid
                )
            try:
                extents = document_extents(view, name_start + nul + 1, seq_end, max_bson_size)
                sequences[name] = decode_documents(view, extents, codec_options, raw_sequences)
            except ProtocolError as exc:
                exc.request_id = rid
                raise
            pos = seq_end
        elif kind == 2:
            # Security-token section: only meaningful to a multitenant mongod.
            raise _err("Unsupported Security Token provided", 13, "Unauthorized", False, rid)
        else:
            raise _err(f"Unknown section kind {kind}", 40432, "Location40432", False, rid)

    if body is None:
        raise _err("OP_MSG messages must have a body", 40587, "Location40587", False, rid)
    for name, docs in sequences.items():
        # mongod rejects a sequence whose identifier also names a field (dotted paths included).
        if has_document_path(body, name):
            raise _err(
                f"Duplicate field between body and document sequence {name}",
                40433,
                "Location40433",
                False,
                rid,
            )
        body[name] = docs
    return body, sequences


def encode_op_msg(
    body: Document,
    *,
    request_id: int,
    response_to: int = 0,
    flags: int = 0,
    checksum: bool = False,
    sequences: Mapping[str, Sequence[Document]] | None = None,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
) -> bytes:
    """A whole OP_MSG message: the body (kind 0) and optional document sequences (kind 1).

    ``body`` may be a mapping (encoded once by pymongo's C encoder, which copies any
    embedded ``RawBSONDocument`` verbatim), a ``RawBSONDocument`` or already-encoded BSON
    bytes. Set ``flags=MORE_TO_COME`` for exhaust replies; ``checksum=True`` appends a
    CRC-32C (mongod does so when the request carried one).
    """
    flags &= ~CHECKSUM_PRESENT
    if checksum:
        flags |= CHECKSUM_PRESENT
    parts = [b"", _UINT32.pack(flags), b"\x00", encode_document(body, codec_options)]
    for name, docs in (sequences or {}).items():
        encoded = [encode_document(d, codec_options) for d in docs]
        ident = name.encode() + b"\x00"
        size = 4 + len(ident) + sum(len(d) for d in encoded)
        parts += [b"\x01", _INT32.pack(size), ident, *encoded]
    length = sum(len(p) for p in parts) + HEADER_SIZE + (4 if checksum else 0)
    parts[0] = pack_header(length, request_id, response_to, OpCode.MSG)
    msg = b"".join(parts)
    if checksum:
        msg += _UINT32.pack(crc32c(msg))
    return msg
