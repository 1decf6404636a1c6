"""Incremental framing: bytes in, complete messages out (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ProtocolError
from .header import (
    ACCEPTED_OP_CODES,
    HEADER_SIZE,
    MAX_MESSAGE_SIZE_BYTES,
    MsgHeader,
    check_header,
    parse_header,
)

__all__ = ["Frame", "FrameReader"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One complete message exactly as received: its parsed header and all of its bytes."""

    header: MsgHeader
    data: bytes  # the whole message, header included

    @property
    def op_code(self) -> int:
        return self.header.op_code

    @property
    def request_id(self) -> int:
        return self.header.request_id

    @property
    def response_to(self) -> int:
        return self.header.response_to

    @property
    def payload(self) -> memoryview:
        """The bytes after the header (zero-copy)."""
        return memoryview(self.data)[HEADER_SIZE:]

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
        op_codes: frozenset[int] = ACCEPTED_OP_CODES,
    ) -> Frame:
        """A frame from exactly one whole message; validates like :class:`FrameReader`."""
        header = parse_header(data)
        check_header(header, max_message_size=max_message_size, op_codes=op_codes)
        if header.message_length != len(data):
            raise ProtocolError(
                f"messageLength {header.message_length} does not match the {len(data)} bytes given",
                request_id=header.request_id,
            )
        return cls(header, bytes(data))


class FrameReader:
    """Feed it bytes as they arrive; it returns every message completed so far.

    A header is validated as soon as its 16 bytes are in (length in
    ``[16, max_message_size]``, opcode accepted), so an oversized or garbage message is
    refused without buffering its body. After a :class:`ProtocolError` the stream is out of
    sync and the reader refuses all further input: close the connection. Memory held is at
    most one partial message (< ``max_message_size``) plus the last chunk fed.
    """

    __slots__ = ("_buf", "_error", "_max", "_op_codes")

    def __init__(
        self,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
        op_codes: frozenset[int] = ACCEPTED_OP_CODES,
    ) -> None:
        self._buf = bytearray()
        self._max = max_message_size
        self._op_codes = op_codes
        self._error: ProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview = b"") -> list[Frame]:
        """Frames completed by `data`. On a bad header, the frames completed before it are
        returned first; the error is raised by the next call (feed `b""` to get it)."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        try:
            while end - pos >= HEADER_SIZE:
                header = parse_header(buf, pos)
                check_header(header, max_message_size=self._max, op_codes=self._op_codes)
                length = header.message_length
                if end - pos < length:
                    break
                frames.append(Frame(header, bytes(buf[pos : pos + length])))
                pos += length
        except ProtocolError as exc:
            self._error = exc
            buf.clear()
            if not frames:
                raise
            # Answer the requests that came whole before the garbage (as mongod does); the
            # error is raised on the next feed.
            return frames
        if pos:
            del buf[:pos]  # one compaction per feed, not per frame
        return frames

    @property
    def error(self) -> ProtocolError | None:
        """The error that ended the stream, once one was seen."""
        return self._error

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message held so far."""
        return len(self._buf)

    @property
    def needed(self) -> int:
        """Bytes still missing to complete the current message (16 when idle)."""
        buf = self._buf
        if len(buf) < HEADER_SIZE:
            return HEADER_SIZE - len(buf)
        return parse_header(buf).message_length - len(buf)

    def eof(self) -> None:
        """Call when the peer closed the stream: a partial message left over is an error."""
        if self._error is None and self._buf:
            what = "message header" if len(self._buf) < HEADER_SIZE else "message"
            self._error = ProtocolError(
                f"connection closed with a truncated {what} ({len(self._buf)} bytes buffered)"
            )
            self._buf.clear()
            raise self._error
