"""CRC-32C (Castagnoli), the checksum of OP_MSG's ``checksumPresent`` flag.

No package installed with the project provides CRC-32C, and clients rarely set the flag
(drivers don't; mongod only checksums its own internal non-TLS traffic), so a table-driven
pure-Python implementation is enough. It runs at a few MB/s: a 48 MB message costs seconds,
which is why a server may want to run it off the event loop for large messages.
"""

from __future__ import annotations

__all__ = ["crc32c"]

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


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data``, continuing from a previous result ``crc`` (0 to start)."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
