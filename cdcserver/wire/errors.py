"""The one exception the wire layer raises."""

from __future__ import annotations

__all__ = ["ProtocolError"]


class ProtocolError(Exception):
    """A message that cannot be framed or parsed.

    ``fatal`` says what mongod does with the same input: ``True`` means it closes the
    connection (bad framing, illegal OP_MSG flags, too many document sequences, a checksum
    mismatch, an undecodable compressed payload); ``False`` means mongod answers the request
    with an ``{ok: 0, errmsg, code, codeName}`` reply built from ``code``/``code_name``/
    ``errmsg`` and keeps the connection (invalid BSON, duplicate or unknown sections, ...).
    A server that prefers to close the connection on every ``ProtocolError`` is still correct,
    only less forgiving. ``request_id`` is the offending message's requestID when known, so a
    non-fatal error can be answered with ``responseTo`` set. ``more_to_come`` is set when the
    message was an OP_MSG with the ``moreToCome`` flag: mongod sends no reply to it, not even
    for a non-fatal parse error (the client would read it as the answer to its next request).
    """

    def __init__(
        self,
        errmsg: str,
        *,
        code: int = 17,
        code_name: str = "ProtocolError",
        fatal: bool = True,
        request_id: int | None = None,
    ) -> None:
        super().__init__(errmsg)
        self.errmsg = errmsg
        self.code = code
        self.code_name = code_name
        self.fatal = fatal
        self.request_id = request_id
        self.more_to_come = False

    def to_error_document(self) -> dict[str, object]:
        """The reply body mongod would send for a non-fatal parse error."""
        return {"ok": 0.0, "errmsg": self.errmsg, "code": self.code, "codeName": self.code_name}

    def __repr__(self) -> str:
        return (
            f"ProtocolError({self.errmsg!r}, code={self.code}, code_name={self.code_name!r}, "
            f"fatal={self.fatal})"
        )
