"""One entry point from a frame to a request, and from a reply document to bytes."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from bson.codec_options import CodecOptions

from ._bson import DEFAULT_CODEC_OPTIONS, Document
from .compression import compress_message, decompress_message
from .errors import ProtocolError
from .framing import Frame
from .header import ACCEPTED_OP_CODES, BSON_OBJ_MAX_INTERNAL_SIZE, MAX_MESSAGE_SIZE_BYTES, OpCode
from .op_msg import MORE_TO_COME, OpMsg, encode_op_msg, parse_op_msg
from .op_query import OpQuery, encode_op_reply, parse_op_query

__all__ = ["Request", "decode_request", "encode_reply"]

Request = OpMsg | OpQuery


def decode_request(
    frame: Frame | bytes | bytearray | memoryview,
    *,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
    raw_sequences: bool = False,
    allowed_compressors: Collection[int] | None = None,
    max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
    max_bson_size: int = BSON_OBJ_MAX_INTERNAL_SIZE,
) -> Request:
    """Parse a client message, unwrapping OP_COMPRESSED first.

    The returned request's ``compressor_id`` is the compressor of the envelope (``None`` if
    it came uncompressed): mongod compresses its reply with the same one.
    """
    if not isinstance(frame, Frame):
        frame = Frame.from_bytes(frame, max_message_size=max_message_size)
    data: bytes = frame.data
    cid: int | None = None
    op_code = frame.op_code
    if op_code == OpCode.COMPRESSED:
        data, cid = decompress_message(
            data,
            allowed_compressors=allowed_compressors,
            max_message_size=max_message_size,
            op_codes=ACCEPTED_OP_CODES,
        )
        op_code = int.from_bytes(data[12:16], "little", signed=True)
    request: Request
    if op_code == OpCode.MSG:
        request = parse_op_msg(
            data,
            codec_options=codec_options,
            raw_sequences=raw_sequences,
            max_bson_size=max_bson_size,
        )
    elif op_code == OpCode.QUERY:
        request = parse_op_query(data, codec_options=codec_options, max_bson_size=max_bson_size)
    else:
        raise ProtocolError(f"unsupported opCode {op_code}", request_id=frame.request_id)
    request.compressor_id = cid
    return request


def encode_reply(
    request: Request,
    document: Document,
    *,
    request_id: int,
    more_to_come: bool = False,
    compressor: str | int | None = None,
    zlib_level: int = -1,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
) -> bytes:
    """The reply to ``request`` in the form its client expects, encoded once.

    OP_QUERY gets an OP_REPLY, OP_MSG an OP_MSG (with a checksum if the request had one,
    and ``moreToCome`` for exhaust streams). ``compressor`` wraps the result in
    OP_COMPRESSED; pass ``request.compressor_id`` to do what mongod does (answer compressed
    requests with their own compressor, uncompressed ones uncompressed).
    """
    if isinstance(request, OpQuery):
        msg = encode_op_reply(
            document,
            request_id=request_id,
            response_to=request.request_id,
            codec_options=codec_options,
        )
    else:
        msg = encode_op_msg(
            document,
            request_id=request_id,
            response_to=request.request_id,
            flags=MORE_TO_COME if more_to_come else 0,
            checksum=request.checksum_present,
            codec_options=codec_options,
        )
    if compressor is not None:
        msg = compress_message(msg, compressor, zlib_level=zlib_level)
    return msg
