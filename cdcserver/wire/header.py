"""Standard message header, opcodes and the size limits mongod advertises."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from .errors import ProtocolError

__all__ = [
    "ACCEPTED_OP_CODES",
    "BSON_OBJ_MAX_INTERNAL_SIZE",
    "HEADER_SIZE",
    "MAX_BSON_OBJECT_SIZE",
    "MAX_MESSAGE_SIZE_BYTES",
    "MAX_WRITE_BATCH_SIZE",
    "MsgHeader",
    "OpCode",
    "check_header",
    "pack_header",
    "parse_header",
]

# Limits mongod reports in `hello` and enforces on the wire.
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
# mongod accepts (and produces) objects slightly over 16 MiB so that a 16 MiB user document
# still fits inside a command or reply that wraps it.
BSON_OBJ_MAX_INTERNAL_SIZE = MAX_BSON_OBJECT_SIZE + 16 * 1024
MAX_MESSAGE_SIZE_BYTES = 48_000_000
MAX_WRITE_BATCH_SIZE = 100_000

HEADER_SIZE = 16
_HEADER = struct.Struct("<iiii")


class OpCode(IntEnum):
    REPLY = 1
    QUERY = 2004
    COMPRESSED = 2012
    MSG = 2013


# What a client may send us. Legacy opcodes other than OP_QUERY (removed in MongoDB 6.0) and
# OP_REPLY (server → client only) are rejected as unknown.
ACCEPTED_OP_CODES: frozenset[int] = frozenset({OpCode.QUERY, OpCode.COMPRESSED, OpCode.MSG})


class MsgHeader(NamedTuple):
    message_length: int
    request_id: int
    response_to: int
    op_code: int


def pack_header(message_length: int, request_id: int, response_to: int, op_code: int) -> bytes:
    return _HEADER.pack(message_length, request_id, response_to, op_code)


def parse_header(data: bytes | bytearray | memoryview, offset: int = 0) -> MsgHeader:
    """Unpack the 16-byte header at ``offset`` (no validation; see :func:`check_header`)."""
    if len(data) - offset < HEADER_SIZE:
        raise ProtocolError(
            f"truncated message header: {len(data) - offset} of {HEADER_SIZE} bytes"
        )
    return MsgHeader._make(_HEADER.unpack_from(data, offset))


def check_header(
    header: MsgHeader,
    *,
    max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
    op_codes: frozenset[int] = ACCEPTED_OP_CODES,
) -> None:
    """Reject a header before its body is read, as mongod's transport layer does."""
    length = header.message_length
    if length < HEADER_SIZE or length > max_message_size:
        raise ProtocolError(
            f"recv(): message msgLen {length} is invalid. "
            f"Min {HEADER_SIZE} Max: {max_message_size}",
            request_id=header.request_id,
        )
    if header.op_code not in op_codes:
        raise ProtocolError(f"unsupported opCode {header.op_code}", request_id=header.request_id)
