"""MongoDB wire-protocol framing: bytes in, requests out; reply documents in, bytes out.

No sockets, no asyncio, no command logic (like asyncpg's or redis-py's protocol parsers):
the server owns the transport and feeds a :class:`FrameReader`, turns each :class:`Frame`
into an :class:`OpMsg` or :class:`OpQuery` with :func:`decode_request`, and answers with
:func:`encode_reply`. Malformed input raises :class:`ProtocolError`.
"""

from .codec import Request, decode_request, encode_reply
from .compression import (
    COMPRESSOR_IDS,
    COMPRESSOR_NAMES,
    available_compressors,
    compress_message,
    compressor_id,
    decompress_message,
    negotiate_compressors,
)
from .crc32c import crc32c
from .errors import ProtocolError
from .framing import Frame, FrameReader
from .header import (
    ACCEPTED_OP_CODES,
    BSON_OBJ_MAX_INTERNAL_SIZE,
    HEADER_SIZE,
    MAX_BSON_OBJECT_SIZE,
    MAX_MESSAGE_SIZE_BYTES,
    MAX_WRITE_BATCH_SIZE,
    MsgHeader,
    OpCode,
    check_header,
    pack_header,
    parse_header,
)
from .op_msg import (
    CHECKSUM_PRESENT,
    EXHAUST_ALLOWED,
    MORE_TO_COME,
    OpMsg,
    encode_op_msg,
    parse_op_msg,
)
from .op_query import (
    QUERY_EXHAUST,
    QUERY_SECONDARY_OK,
    REPLY_AWAIT_CAPABLE,
    REPLY_QUERY_FAILURE,
    OpQuery,
    encode_op_query,
    encode_op_reply,
    parse_op_query,
)

__all__ = [
    "ACCEPTED_OP_CODES",
    "BSON_OBJ_MAX_INTERNAL_SIZE",
    "CHECKSUM_PRESENT",
    "COMPRESSOR_IDS",
    "COMPRESSOR_NAMES",
    "EXHAUST_ALLOWED",
    "HEADER_SIZE",
    "MAX_BSON_OBJECT_SIZE",
    "MAX_MESSAGE_SIZE_BYTES",
    "MAX_WRITE_BATCH_SIZE",
    "MORE_TO_COME",
    "QUERY_EXHAUST",
    "QUERY_SECONDARY_OK",
    "REPLY_AWAIT_CAPABLE",
    "REPLY_QUERY_FAILURE",
    "Frame",
    "FrameReader",
    "MsgHeader",
    "OpCode",
    "OpMsg",
    "OpQuery",
    "ProtocolError",
    "Request",
    "available_compressors",
    "check_header",
    "compress_message",
    "compressor_id",
    "crc32c",
    "decode_request",
    "decompress_message",
    "encode_op_msg",
    "encode_op_query",
    "encode_op_reply",
    "encode_reply",
    "negotiate_compressors",
    "pack_header",
    "parse_header",
    "parse_op_msg",
    "parse_op_query",
]
