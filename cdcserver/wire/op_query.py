"""Legacy OP_QUERY (2004) / OP_REPLY (1), kept only for the first handshake.

Drivers that predate OP_MSG-only handshakes open a connection with ``isMaster``/``hello``
sent as OP_QUERY on ``<db>.$cmd``; the answer must be an OP_REPLY. OP_QUERY layout after
the header: ``int32 flags``, cstring ``fullCollectionName``, ``int32 numberToSkip``,
``int32 numberToReturn``, the query document, then optionally a ``returnFieldsSelector``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from bson.codec_options import CodecOptions

from ._bson import DEFAULT_CODEC_OPTIONS, Document, decode_documents, document_extents
from ._bson import encode_document as _encode_document
from .errors import ProtocolError
from .framing import Frame
from .header import BSON_OBJ_MAX_INTERNAL_SIZE, HEADER_SIZE, OpCode, pack_header, parse_header

__all__ = [
    "QUERY_AWAIT_DATA",
    "QUERY_EXHAUST",
    "QUERY_NO_CURSOR_TIMEOUT",
    "QUERY_OPLOG_REPLAY",
    "QUERY_PARTIAL",
    "QUERY_SECONDARY_OK",
    "QUERY_TAILABLE_CURSOR",
    "REPLY_AWAIT_CAPABLE",
    "REPLY_CURSOR_NOT_FOUND",
    "REPLY_QUERY_FAILURE",
    "REPLY_SHARD_CONFIG_STALE",
    "OpQuery",
    "encode_op_query",
    "encode_op_reply",
    "parse_op_query",
]

# OP_QUERY flags (bit 0 is reserved).
QUERY_TAILABLE_CURSOR = 1 << 1
QUERY_SECONDARY_OK = 1 << 2
QUERY_OPLOG_REPLAY = 1 << 3
QUERY_NO_CURSOR_TIMEOUT = 1 << 4
QUERY_AWAIT_DATA = 1 << 5
QUERY_EXHAUST = 1 << 6
QUERY_PARTIAL = 1 << 7

# OP_REPLY responseFlags.
REPLY_CURSOR_NOT_FOUND = 1 << 0
REPLY_QUERY_FAILURE = 1 << 1
REPLY_SHARD_CONFIG_STALE = 1 << 2
REPLY_AWAIT_CAPABLE = 1 << 3  # mongod sets it on every successful reply

_INT32 = struct.Struct("<i")
_SKIP_RETURN = struct.Struct("<ii")
_REPLY_PREFIX = struct.Struct("<iqii")  # responseFlags, cursorID, startingFrom, numberReturned


def _err(errmsg: str, code: int, code_name: str, rid: int) -> ProtocolError:
    # Upconversion errors: mongod replies with them, the connection stays open.
    return ProtocolError(errmsg, code=code, code_name=code_name, fatal=False, request_id=rid)


@dataclass(slots=True)
class OpQuery:
    request_id: int
    response_to: int
    flags: int
    full_collection_name: str
    number_to_skip: int
    number_to_return: int
    query: dict[str, Any]
    return_fields_selector: dict[str, Any] | None = None
    compressor_id: int | None = None  # set when the request arrived inside OP_COMPRESSED

    op_code = OpCode.QUERY

    @property
    def database(self) -> str:
        return self.full_collection_name.split(".", 1)[0]

    @property
    def collection(self) -> str:
        parts = self.full_collection_name.split(".", 1)
        return parts[1] if len(parts) > 1 else ""

    @property
    def is_command(self) -> bool:
        return self.collection == "$cmd"

    def to_command(self) -> dict[str, Any]:
        """The command as mongod sees it after upconverting OP_QUERY to OP_MSG.

        Unwraps ``{$query: cmd, $readPreference: ...}`` (or ``query``), turns the
        secondaryOk flag into ``$readPreference: {mode: secondaryPreferred}`` and appends
        ``$db``. Raises a non-fatal ProtocolError with mongod's code for requests mongod
        refuses at this stage (not a ``$cmd`` namespace, exhaust, bad numberToReturn, ...).
        Which commands may arrive this way (mongod 8.0: the handshake only) is for the
        command layer to decide.
        """
        rid = self.request_id
        if self.flags & QUERY_EXHAUST:
            raise _err(
                f"The 'exhaust' OP_QUERY flag is invalid for commands: "
                f"{self.full_collection_name} {self.query}",
                18527,
                "Location18527",
                rid,
            )
        if not self.is_command:
            raise _err(
                f"Trying to handle namespace {self.full_collection_name} as a command",
                40473,
                "Location40473",
                rid,
            )
        if self.number_to_return not in (1, -1):
            raise _err(
                f"Bad numberToReturn ({self.number_to_return}) for $cmd type ns - "
                "can only be 1 or -1",
                16979,
                "Location16979",
                rid,
            )
        cmd = self.query
        read_pref: dict[str, Any] | None = None
        first = next(iter(cmd), None)
        if first in ("$query", "query"):
            if "$maxTimeMS" in cmd:
                raise _err(
                    "cannot use $maxTimeMS query option with commands; use maxTimeMS "
                    "command option instead",
                    72,
                    "InvalidOptions",
                    rid,
                )
            if "$readPreference" in cmd:
                read_pref = {"$readPreference": cmd["$readPreference"]}
            inner = cmd[first]
            if not isinstance(inner, dict):
                raise _err(f"{first} must be an object", 14, "TypeMismatch", rid)
            cmd = inner
        elif isinstance(cmd.get("$queryOptions"), dict):
            read_pref = dict(cmd["$queryOptions"])
            cmd = {k: v for k, v in cmd.items() if k != "$queryOptions"}
        out = dict(cmd)
        if read_pref:
            out.update(read_pref)
        elif "$readPreference" not in out and self.flags & QUERY_SECONDARY_OK:
            out["$readPreference"] = {"mode": "secondaryPreferred"}
        if "$db" in out:
            raise _err("$db is not allowed in OP_QUERY requests", 40621, "Location40621", rid)
        out["$db"] = self.database
        return out


def _cstring(view: memoryview, pos: int, end: int, rid: int) -> tuple[str, int]:
    nul = bytes(view[pos:end]).find(b"\x00")
    if nul < 0:
        raise ProtocolError("OP_QUERY fullCollectionName is not terminated", request_id=rid)
    try:
        return bytes(view[pos : pos + nul]).decode(), pos + nul + 1
    except UnicodeDecodeError:
        raise ProtocolError("OP_QUERY fullCollectionName is not UTF-8", request_id=rid) from None


def parse_op_query(
    message: Frame | bytes | bytearray | memoryview,
    *,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
    max_bson_size: int = BSON_OBJ_MAX_INTERNAL_SIZE,
) -> OpQuery:
    """Parse one whole OP_QUERY message (header included)."""
    data = message.data if isinstance(message, Frame) else message
    view = memoryview(data)
    header = parse_header(view)
    rid = header.request_id
    if header.op_code != OpCode.QUERY:
        raise ProtocolError(f"not an OP_QUERY message: opCode {header.op_code}", request_id=rid)
    end = len(view)
    if header.message_length != end:
        raise ProtocolError(
            f"messageLength {header.message_length} does not match {end} bytes", request_id=rid
        )
    if end - HEADER_SIZE < 4:
        raise ProtocolError("OP_QUERY is truncated", request_id=rid)
    (flags,) = _INT32.unpack_from(view, HEADER_SIZE)
    name, pos = _cstring(view, HEADER_SIZE + 4, end, rid)
    if end - pos < _SKIP_RETURN.size:
        raise ProtocolError("OP_QUERY is truncated", request_id=rid)
    skip, to_return = _SKIP_RETURN.unpack_from(view, pos)
    pos += _SKIP_RETURN.size
    if end - pos < 5:
        raise ProtocolError("OP_QUERY has no query document", request_id=rid)
    try:
        extents = document_extents(view, pos, end, max_bson_size)
        if len(extents) > 2:
            raise ProtocolError("OP_QUERY has trailing data after returnFieldsSelector")
        docs = decode_documents(view, extents, codec_options, raw=False)
    except ProtocolError as exc:
        exc.request_id = rid
        raise
    query = docs[0] if isinstance(docs[0], dict) else dict(docs[0])
    selector = None
    if len(docs) == 2:
        selector = docs[1] if isinstance(docs[1], dict) else dict(docs[1])
    return OpQuery(rid, header.response_to, flags, name, skip, to_return, query, selector)


def encode_op_reply(
    document: Document,
    *,
    request_id: int,
    response_to: int,
    response_flags: int = REPLY_AWAIT_CAPABLE,
    cursor_id: int = 0,
    starting_from: int = 0,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
) -> bytes:
    """A whole OP_REPLY carrying one document (the handshake answer)."""
    doc = _encode_document(document, codec_options)
    body = _REPLY_PREFIX.pack(response_flags, cursor_id, starting_from, 1) + doc
    return pack_header(HEADER_SIZE + len(body), request_id, response_to, OpCode.REPLY) + body


def encode_op_query(
    query: Document,
    *,
    request_id: int,
    full_collection_name: str,
    flags: int = 0,
    number_to_skip: int = 0,
    number_to_return: int = -1,
    return_fields_selector: Document | None = None,
    codec_options: CodecOptions[Any] = DEFAULT_CODEC_OPTIONS,
) -> bytes:
    """A whole OP_QUERY message (for tests and tools that play the client)."""
    parts = [
        _INT32.pack(flags),
        full_collection_name.encode() + b"\x00",
        _SKIP_RETURN.pack(number_to_skip, number_to_return),
        _encode_document(query, codec_options),
    ]
    if return_fields_selector is not None:
        parts.append(_encode_document(return_fields_selector, codec_options))
    body = b"".join(parts)
    return pack_header(HEADER_SIZE + len(body), request_id, 0, OpCode.QUERY) + body
