"""OP_COMPRESSED (2012): unwrap a client's compressed message, compress our replies.

Layout after the standard header: ``int32 originalOpcode``, ``int32 uncompressedSize`` (the
size of the original message *without* its header), ``uint8 compressorId``, then the
compressed bytes. The codecs are the ones drivers use: snappy raw blocks (python-snappy),
zlib streams (stdlib) and zstd frames (``compression.zstd`` on Python 3.14+, else
``backports.zstd``, which is what pymongo imports for its ``zstd`` compressor).
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Collection, Iterable
from typing import Any

from .errors import ProtocolError
from .header import (
    ACCEPTED_OP_CODES,
    HEADER_SIZE,
    MAX_MESSAGE_SIZE_BYTES,
    OpCode,
    pack_header,
    parse_header,
)

__all__ = [
    "COMPRESSOR_IDS",
    "COMPRESSOR_NAMES",
    "available_compressors",
    "compress_message",
    "compressor_id",
    "decompress_message",
    "negotiate_compressors",
]

COMPRESSOR_IDS: dict[str, int] = {"noop": 0, "snappy": 1, "zlib": 2, "zstd": 3}
COMPRESSOR_NAMES: dict[int, str] = {v: k for k, v in COMPRESSOR_IDS.items()}

_COMPRESSED_PREFIX = struct.Struct("<iiB")  # originalOpcode, uncompressedSize, compressorId
_COMPRESSED_HEADER_SIZE = HEADER_SIZE + _COMPRESSED_PREFIX.size  # 25


# Loaded when a client first asks for a codec: most clients ask for none, and the codecs'
# modules are a few ms of every start-up.
@functools.cache
def _zstd() -> Any | None:
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python >= 3.14
    except ImportError:
        try:
            from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            return None
    return zstd


@functools.cache
def _snappy() -> Any | None:
    try:
        import snappy  # type: ignore[import-untyped]
    except ImportError:
        return None
    return snappy


def available_compressors() -> list[str]:
    """Compressor names usable here, in mongod's default preference order."""
    names = []
    if _snappy() is not None:
        names.append("snappy")
    if _zstd() is not None:
        names.append("zstd")
    names.append("zlib")
    return names


def negotiate_compressors(
    requested: Iterable[Any], enabled: Iterable[str] | None = None
) -> list[str]:
    """The ``compression`` list for a handshake reply, as mongod computes it.

    mongod keeps the client's order and drops names it does not support; non-string entries
    are ignored. ``noop`` is never negotiated (drivers don't offer it).
    """
    allowed = set(available_compressors() if enabled is None else enabled)
    out: list[str] = []
    for name in requested:
        if isinstance(name, str) and name in allowed and name != "noop" and name not in out:
            out.append(name)
    return out


def compressor_id(name_or_id: str | int) -> int:
    if isinstance(name_or_id, str):
        try:
            return COMPRESSOR_IDS[name_or_id]
        except KeyError:
            raise ValueError(f"unknown compressor {name_or_id!r}") from None
    if name_or_id not in COMPRESSOR_NAMES:
        raise ValueError(f"unknown compressor id {name_or_id}")
    return name_or_id


# --- codecs -----------------------------------------------------------------------------


def _compress(cid: int, data: bytes, zlib_level: int) -> bytes:
    if cid == 0:
        return data
    if cid == 1:
        snappy = _snappy()
        if snappy is None:
            raise ValueError("snappy compression needs the python-snappy package")
        return bytes(snappy.compress(data))
    if cid == 2:
        return zlib.compress(data, zlib_level)
    if cid == 3:
        zstd = _zstd()
        if zstd is None:
            raise ValueError("zstd compression needs the backports.zstd package")
        return bytes(zstd.compress(data))
    raise ValueError(f"unknown compressor id {cid}")


def _snappy_declared_length(data: memoryview) -> int:
    # A raw snappy block starts with the uncompressed length as a little-endian varint; read
    # it first so that a small payload claiming a huge output is refused before decoding.
    result = shift = 0
    for i in range(5):
        if i >= len(data):
            break
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result
        shift += 7
    raise ProtocolError("invalid snappy payload: bad length header")


def _decompress(cid: int, data: memoryview, expected: int) -> bytes:
    """Decompress at most ``expected`` bytes; anything else is a ProtocolError."""
    try:
        if cid == 0:
            out = bytes(data)
        elif cid == 1:
            snappy = _snappy()
            if snappy is None:
                raise ProtocolError("snappy compression is not available")
            declared = _snappy_declared_length(data)
            if declared != expected:
                raise ProtocolError(
                    f"snappy payload declares {declared} bytes, uncompressedSize is {expected}"
                )
            out = bytes(snappy.uncompress(bytes(data)))
        elif cid == 2:
            d = zlib.decompressobj()
            # max_length bounds the allocation: a zip bomb cannot make us allocate more than
            # uncompressedSize + 1 bytes.
            out = d.decompress(data, expected + 1)
            if len(out) <= expected and (not d.eof or d.unused_data):
                raise ProtocolError("invalid zlib payload: truncated or trailing data")
        elif cid == 3:
            zstd = _zstd()
            if zstd is None:
                raise ProtocolError("zstd compression is not available")
            zd = zstd.ZstdDecompressor()
            out = zd.decompress(data, expected + 1)
            if len(out) <= expected and (not zd.eof or zd.unused_data):
                raise ProtocolError("invalid zstd payload: truncated or trailing data")
        else:  # pragma: no cover - filtered by the caller
            raise ProtocolError(f"unknown compressor id {cid}")
    except ProtocolError:
        raise
    except Exception as exc:  # each codec raises its own error type for corrupt input
        raise ProtocolError(f"invalid {COMPRESSOR_NAMES[cid]} payload: {exc}") from exc
    if len(out) != expected:
        raise ProtocolError(
            f"Decompressed message size {len(out)} does not match uncompressedSize {expected}"
        )
    return out


# --- messages ---------------------------------------------------------------------------


def decompress_message(
    message: bytes | bytearray | memoryview,
    *,
    allowed_compressors: Collection[int] | None = None,
    max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
    op_codes: Collection[int] = ACCEPTED_OP_CODES,
) -> tuple[bytes, int]:
    """Turn a whole OP_COMPRESSED message into the original message (with a rebuilt header).

    Returns ``(message_bytes, compressor_id)``; the caller answers with the same compressor.
    ``allowed_compressors`` (ids) restricts which compressors are accepted, e.g. to the ones
    the connection negotiated; ``None`` accepts every compressor available here.
    """
    view = memoryview(message)
    header = parse_header(view)
    rid = header.request_id
    if header.op_code != OpCode.COMPRESSED:
        raise ProtocolError(f"not an OP_COMPRESSED message: opCode {header.op_code}")
    if len(view) < _COMPRESSED_HEADER_SIZE or header.message_length != len(view):
        raise ProtocolError("OP_COMPRESSED message is truncated", request_id=rid)
    original_op, size, cid = _COMPRESSED_PREFIX.unpack_from(view, HEADER_SIZE)
    if original_op == OpCode.COMPRESSED or original_op not in op_codes:
        raise ProtocolError(f"OP_COMPRESSED wraps unsupported opCode {original_op}", request_id=rid)
    if size < 0 or size + HEADER_SIZE > max_message_size:
        raise ProtocolError(
            f"Decompressed message would be larger than maximum message size: {size}",
            request_id=rid,
        )
    if cid not in COMPRESSOR_NAMES or (
        allowed_compressors is not None and cid not in allowed_compressors
    ):
        raise ProtocolError(
            f"Compression algorithm specified in message is not available: {cid}",
            request_id=rid,
        )
    try:
        body = _decompress(cid, view[_COMPRESSED_HEADER_SIZE:], size)
    except ProtocolError as exc:
        exc.request_id = rid
        raise
    return pack_header(size + HEADER_SIZE, rid, header.response_to, original_op) + body, cid


def compress_message(
    message: bytes | bytearray | memoryview,
    compressor: str | int,
    *,
    zlib_level: int = -1,
) -> bytes:
    """Wrap a whole message (header included) in OP_COMPRESSED, keeping its ids."""
    view = memoryview(message)
    header = parse_header(view)
    cid = compressor_id(compressor)
    compressed = _compress(cid, bytes(view[HEADER_SIZE:]), zlib_level)
    return (
        pack_header(
            _COMPRESSED_HEADER_SIZE + len(compressed),
            header.request_id,
            header.response_to,
            OpCode.COMPRESSED,
        )
        + _COMPRESSED_PREFIX.pack(header.op_code, len(view) - HEADER_SIZE, cid)
        + compressed
    )
