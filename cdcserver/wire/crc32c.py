"""CRC-32C (Castagnoli), the checksum of OP_MSG's ``checksumPresent`` flag.

Computed by ``google-crc32c`` (Google's C library, hardware-accelerated where the CPU has
SSE4.2 or ARMv8 CRC instructions: a 48 MB message in about 10 ms) when its C extension is
installed; otherwise by the table-driven pure-Python implementation below, which runs at a few
MB/s (seconds for a 48 MB message: the server decodes large messages off its event loop).
:data:`IMPLEMENTATION` says which one is in use.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["IMPLEMENTATION", "crc32c", "crc32c_python"]

_POLY = 0x82F63B78  # Castagnoli polynomial, bit-reflected


def _make_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()


def crc32c_python(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data``, continuing from a previous result ``crc`` (0 to start)."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    import google_crc32c as _google_crc32c
except ImportError:  # pragma: no cover - a dependency; the fallback keeps the server working
    _google_crc32c = None  # type: ignore[assignment]

if _google_crc32c is not None and _google_crc32c.implementation == "c":
    IMPLEMENTATION = "c"
    _extend: Callable[[int, bytes], int] = _google_crc32c.extend

    def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
        """CRC-32C of ``data``, continuing from a previous result ``crc`` (0 to start)."""
        buf = data if isinstance(data, bytes) else bytes(data)  # it takes read-only bytes
        return _extend(crc, buf)

else:  # pragma: no cover - without the C extension
    IMPLEMENTATION = "python"
    crc32c = crc32c_python
