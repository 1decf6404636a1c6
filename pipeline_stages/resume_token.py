"""Resume tokens: `ResumeTokenData` <-> `{_data: <hex KeyString>[, _typeBits: BinData(0)]}`.

Byte-identical to mongod 7.0/8.0 (`resume_token.cpp`): the token is a BSON object of unnamed
values (clusterTime, version, [tokenType], txnOpIndex, [fromInvalidate], uuid, eventIdentifier,
[fragmentNum]) encoded as an all-ascending KeyString V1 and printed as upper-case hex, so that
comparing `_data` strings orders events exactly as mongod (and mongos's merge) orders them.
See ../shared/reference/resume_tokens.md.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Mapping
from typing import Any

import bson
from bson.binary import Binary
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes, keystring
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import document_string

__all__ = ["MongoError", "ResumeTokenData", "decode", "encode", "make_event_identifier", "sort_key"]

HIGH_WATER_MARK_TOKEN = 0
EVENT_TOKEN = 128
DEFAULT_TOKEN_VERSION = 2

# Operation types whose v0/v1 eventIdentifier is the bare documentKey
# (change_stream_legacy::kClassicOperationTypes).
CLASSIC_OPERATION_TYPES = frozenset(
    {
        "insert", "update", "replace", "delete", "drop", "rename", "dropDatabase",
        "invalidate", "reshardBegin", "reshardDoneCatchUp", "kNewShardDetected",
    }
)

_HEX = re.compile(r"[0-9A-Fa-f]*")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


def _raw_doc(body: bytes) -> bytes:
    return _I32.pack(len(body) + 5) + body + b"\x00"


def _raw_string_element(name: bytes, s: str) -> bytes:
    b = bson_bytes.utf8(s)
    return b"\x02" + name + b"\x00" + _I32.pack(len(b) + 1) + b + b"\x00"


def _as_raw_document(doc: bytes | Mapping[str, Any]) -> bytes:
    if type(doc) is bytes:
        return doc
    if isinstance(doc, (bytes, bytearray, memoryview)):
        return bytes(doc)
    raw = getattr(doc, "raw", None)  # RawBSONDocument keeps its bytes
    return raw if isinstance(raw, bytes) else bson_bytes.encode(doc)


def make_event_identifier(
    operation_type: str,
    version: int,
    document_key: bytes | Mapping[str, Any] | None = None,
    operation_description: bytes | Mapping[str, Any] | None = None,
) -> bytes | None:
    """The eventIdentifier as raw BSON (`ResumeTokenData`'s constructor in resume_token.cpp).

    v0/v1 classic events use the bare documentKey (None when the event has none); v2 events
    and expanded events use {operationType, documentKey | operationDescription}.
    """
    return ResumeTokenData.for_event(
        Timestamp(0, 0),
        operation_type,
        document_key=document_key,
        operation_description=operation_description,
        version=version,
    ).event_identifier


@functools.lru_cache(maxsize=256)
def _identifier_head(operation_type: str, by_document_key: bool) -> bytes:
    name = b"documentKey" if by_document_key else b"operationDescription"
    return _raw_string_element(b"operationType", operation_type) + b"\x03" + name + b"\x00"


class ResumeTokenData:
    """The decoded content of a resume token (mongod's `ResumeTokenData`).

    `uuid` is the collection UUID's 16 raw bytes; `event_identifier` is raw BSON.
    """

    __slots__ = (
        "cluster_time", "version", "token_type", "txn_op_index", "from_invalidate",
        "uuid", "_event_identifier", "_identifier_parts", "fragment_num",
    )

    def __init__(
        self,
        cluster_time: Timestamp,
        version: int = DEFAULT_TOKEN_VERSION,
        token_type: int = EVENT_TOKEN,
        txn_op_index: int = 0,
        from_invalidate: bool = False,
        uuid: bytes | None = None,
        event_identifier: bytes | None = None,
        fragment_num: int | None = None,
    ) -> None:
        self.cluster_time = cluster_time
        self.version = version
        self.token_type = token_type
        self.txn_op_index = txn_op_index
        self.from_invalidate = from_invalidate
        self.uuid = uuid if uuid is None or type(uuid) is bytes else bytes(uuid)
        self._event_identifier = event_identifier
        # (operationType, by documentKey?, raw key document) when built by for_event: the
        # encoder then appends a cached head and walks only the key document.
        self._identifier_parts: tuple[str, bool, bytes] | None = None
        self.fragment_num = fragment_num

    @classmethod
    def for_event(
        cls,
        cluster_time: Timestamp,
        operation_type: str,
        *,
        uuid: bytes | None = None,
        document_key: bytes | Mapping[str, Any] | None = None,
        operation_description: bytes | Mapping[str, Any] | None = None,
        txn_op_index: int = 0,
        version: int = DEFAULT_TOKEN_VERSION,
    ) -> ResumeTokenData:
        """An event token, as mongod's `ResumeTokenData(clusterTime, version, txnOpIndex, uuid,
        opType, documentKey, opDescription)` builds it."""
        data = cls(cluster_time, version, EVENT_TOKEN, txn_op_index, False, uuid)
        if operation_type in CLASSIC_OPERATION_TYPES and version <= 1:
            if document_key is not None:
                data._event_identifier = _as_raw_document(document_key)
        elif document_key is not None or operation_description is not None:
            if document_key is not None and operation_description is not None:
                raise MongoError(
                    6280100,
                    "both documentKey and operationDescription cannot be present for an event",
                )
            by_key = document_key is not None
            doc = document_key if by_key else operation_description
            assert doc is not None  # one of the two, checked above
            data._identifier_parts = (operation_type, by_key, _as_raw_document(doc))
        else:
            data._event_identifier = _raw_doc(_raw_string_element(b"operationType", operation_type))
        return data

    @property
    def event_identifier(self) -> bytes | None:
        """The eventIdentifier as raw BSON (None when the token has none)."""
        if self._event_identifier is None and self._identifier_parts is not None:
            op, by_key, doc = self._identifier_parts
            self._event_identifier = _raw_doc(_identifier_head(op, by_key) + doc)
        return self._event_identifier

    @event_identifier.setter
    def event_identifier(self, raw: bytes | None) -> None:
        self._event_identifier = raw
        self._identifier_parts = None

    @classmethod
    def high_water_mark(
        cls, cluster_time: Timestamp, version: int = DEFAULT_TOKEN_VERSION
    ) -> ResumeTokenData:
        return cls(cluster_time, version, HIGH_WATER_MARK_TOKEN)

    @property
    def is_high_water_mark(self) -> bool:
        # mongod: equal to a freshly made HWM token at the same time and version.
        return (
            self.token_type == HIGH_WATER_MARK_TOKEN
            and self.txn_op_index == 0
            and not self.from_invalidate
            and self.uuid is None
            and self.event_identifier is None
            and self.fragment_num is None
        )

    def event_identifier_document(self) -> dict[str, Any] | None:
        return None if self.event_identifier is None else bson_bytes.decode(self.event_identifier)

    def _key(self) -> tuple[Any, ...]:
        return (
            self.cluster_time, self.version, self.token_type, self.txn_op_index,
            self.from_invalidate, self.uuid, self.event_identifier, self.fragment_num,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResumeTokenData):
            return NotImplemented
        if self._key()[:6] != other._key()[:6] or self.fragment_num != other.fragment_num:
            return False
        # eventIdentifier compares as a BSON value (1 == 1.0); equal KeyStrings mean equal values.
        return identifier_keystring(self.event_identifier) == identifier_keystring(
            other.event_identifier
        )

    def __hash__(self) -> int:
        return hash(self._key()[:6])

    def __repr__(self) -> str:
        ident = self.event_identifier_document()
        return (
            f"ResumeTokenData(clusterTime={self.cluster_time!r}, version={self.version}, "
            f"tokenType={self.token_type}, txnOpIndex={self.txn_op_index}, "
            f"fromInvalidate={self.from_invalidate}, "
            f"uuid={self.uuid.hex() if self.uuid else None}, "
            f"eventIdentifier={ident!r}, fragmentNum={self.fragment_num})"
        )

    # -- encoding ---------------------------------------------------------------------------

    def to_keystring(self) -> tuple[bytes, bytes | None]:
        """(KeyString bytes, serialized type bits or None)."""
        b = self._encode()
        return bytes(b.out), b.serialize()

    def _encode(self) -> keystring.Builder:
        """The complete KeyString, with mongod's build-time checks (ResumeToken(data))."""
        version = self.version
        hwm = self.token_type == HIGH_WATER_MARK_TOKEN
        has_identifier = (
            self._identifier_parts is not None or self._event_identifier is not None
        )
        if hwm and (
            self.txn_op_index > 0 or self.from_invalidate or self.uuid is not None
            or has_identifier
        ):
            raise MongoError(6189505, "Invalid high water mark token")
        if self.uuid is None and has_identifier and version < 2:
            raise MongoError(50788, "Unexpected resume token with a eventIdentifier but no UUID")
        if not hwm and not has_identifier and version >= 2:
            raise MongoError(6189502, "Expected an eventIdentifier for an event resume token")
        prefix, bits = _token_prefix(
            version, self.token_type, self.txn_op_index, self.from_invalidate
        )
        ts = _TS_STRUCT.pack(keystring.TIMESTAMP, self.cluster_time.time, self.cluster_time.inc)
        if self.uuid is not None:
            b = keystring.Builder(b"".join((ts, prefix, _UUID_HEADER, self.uuid)), bits)
        else:
            b = keystring.Builder(ts + prefix, bits)
            if version >= 2:
                b.append_null()
        if self._identifier_parts is not None:
            _append_identifier_parts(b, *self._identifier_parts)
        elif self._event_identifier is not None:
            b.append_document(self._event_identifier)
        if self.fragment_num is not None:
            if version < 2:
                raise MongoError(
                    7182504, f"Tokens of version {version} cannot have a fragmentNum"
                )
            _append_number(b, self.fragment_num)
        b.out.append(keystring.END)
        return b

    def to_document(self) -> dict[str, Any]:
        """The `_id` of an event / a postBatchResumeToken: `{_data[, _typeBits]}`."""
        return _token_document(self._encode())


def _token_document(b: keystring.Builder) -> dict[str, Any]:
    type_bits = b.serialize()
    if type_bits is None:
        return {"_data": b.out.hex().upper()}
    return {"_data": b.out.hex().upper(), "_typeBits": Binary(type_bits, 0)}


def _append_identifier_parts(b: keystring.Builder, op: str, by_key: bool, doc: bytes) -> None:
    """`{operationType: op, documentKey|operationDescription: doc}`: a cached head, then the
    document's fields."""
    head, (value, count) = _identifier_head_keystring(op, by_key)
    b.out += head
    b.value |= value << b.count
    b.count += count
    b._append_fields(doc, 0)
    b.out.append(0)


def event_token(
    cluster_time: Timestamp,
    operation_type: str,
    uuid: bytes,
    document_key: bytes,
    txn_op_index: int = 0,
) -> dict[str, Any]:
    """`ResumeTokenData.for_event(...).to_document()` for the per-event case (a v2 token of an
    event with a collection UUID and a raw documentKey), without building the object."""
    pre, head, bits_value = _event_token_head(operation_type, txn_op_index)
    if not bits_value and type(document_key) is bytes:
        # The common documentKey `{_id: int32 | ObjectId | string}` sets no type bit: the token
        # is one concatenation and has no _typeBits.
        key = _simple_key_keystring(document_key)
        if key is not None:
            ts = _TS_STRUCT.pack(keystring.TIMESTAMP, cluster_time.time, cluster_time.inc)
            return {"_data": b"".join((ts, pre, uuid, head, key, _KEY_END)).hex().upper()}
    prefix, bits = _token_prefix(DEFAULT_TOKEN_VERSION, EVENT_TOKEN, txn_op_index, False)
    b = keystring.Builder(
        b"".join((
            _TS_STRUCT.pack(keystring.TIMESTAMP, cluster_time.time, cluster_time.inc),
            prefix, _UUID_HEADER, uuid,
        )),
        bits,
    )
    _append_identifier_parts(b, operation_type, True, document_key)
    b.out.append(keystring.END)
    return _token_document(b)


_UUID_HEADER = bytes((keystring.BINDATA, 16, 4))
_TS_STRUCT = struct.Struct(">BII")
# End of the documentKey, end of the eventIdentifier, end of the KeyString.
_KEY_END = bytes((0, 0, keystring.END))


@functools.lru_cache(maxsize=1024)
def _event_token_head(operation_type: str, txn_op_index: int) -> tuple[bytes, bytes, int]:
    """(KeyString from version up to the UUID's bytes, from the UUID up to the documentKey's
    fields, type bits value of both): what `event_token` puts around the UUID."""
    prefix, (value, count) = _token_prefix(DEFAULT_TOKEN_VERSION, EVENT_TOKEN, txn_op_index, False)
    head, (head_value, _) = _identifier_head_keystring(operation_type, True)
    return prefix + _UUID_HEADER, head, value | (head_value << count)


def _simple_key_keystring(raw: bytes) -> bytes | None:
    """KeyString of the fields of `{_id: int32 | ObjectId | string without NUL}` (what
    `Builder._append_fields` writes, and none of them sets a type bit), else None."""
    if raw[5:9] != b"_id\x00":
        return None
    t, n = raw[4], len(raw)
    if t == 0x10 and n == 14:
        return b"\x1e_id\x00" + keystring.int_body(_I32.unpack_from(raw, 9)[0])
    if t == 0x07 and n == 22:
        return b"\x64_id\x00\x64" + raw[9:21]
    if t == 0x02 and n == 14 + _I32.unpack_from(raw, 9)[0]:
        s = raw[13:-2]
        if 0 not in s:
            return b"\x3c_id\x00\x3c" + s + b"\x00"
    return None


@functools.lru_cache(maxsize=1024)
def _token_prefix(
    version: int, token_type: int, txn_op_index: int, from_invalidate: bool
) -> tuple[bytes, tuple[int, int]]:
    """KeyString of version, [tokenType], txnOpIndex, [fromInvalidate], and their type bits.

    Cached: nearly every token shares one of a handful of these.
    """
    b = keystring.Builder()
    b.append_int32(version)
    if version >= 1:
        b.append_int32(token_type)
    _append_number(b, txn_op_index)
    if version >= 1:
        b.append_bool(from_invalidate)
    return bytes(b.out), (b.value, b.count)


@functools.lru_cache(maxsize=256)
def _identifier_head_keystring(operation_type: str, by_key: bool) -> tuple[bytes, tuple[int, int]]:
    """KeyString of `{operationType: <op>, <documentKey|operationDescription>: ` up to the key
    document's fields, and its type bits: `46 <operationType field> 46 <name> 00 46`."""
    b = keystring.Builder()
    b.append_document(_raw_doc(_raw_string_element(b"operationType", operation_type)))
    name = b"documentKey" if by_key else b"operationDescription"
    head = bytes(b.out[:-1]) + bytes((keystring.OBJECT,)) + name + bytes((0, keystring.OBJECT))
    return head, (b.value, b.count)


def _append_number(b: keystring.Builder, n: int) -> None:
    # BSONObjBuilder::appendNumber(long long): int below 2^30, double below 2^40, else long.
    if -(1 << 30) < n < (1 << 30):
        b.append_int32(n)
    elif -(1 << 40) < n < (1 << 40):
        b.append_values(bson_bytes.encode({"": float(n)}))
    else:
        b.append_values(bson_bytes.encode({"": bson.Int64(n)}))


def identifier_keystring(raw: bytes | None) -> bytes | None:
    if raw is None:
        return None
    b = keystring.Builder()
    b.append_document(raw)
    return bytes(b.out)


def encode(data: ResumeTokenData) -> dict[str, Any]:
    return data.to_document()


# -- decoding -----------------------------------------------------------------------------------


def parse(token: Any) -> tuple[str, bytes | None]:
    """`ResumeToken(Document)`: shape checks only; returns (hex `_data`, `_typeBits` bytes)."""
    if not isinstance(token, Mapping):
        raise MongoError(
            40647,
            "Bad resume token: _data of missing or of wrong type. Expected string, got "
            + document_string({}),
        )
    data = token.get("_data")
    if not isinstance(data, str):
        raise MongoError(
            40647,
            "Bad resume token: _data of missing or of wrong type. Expected string, got "
            + document_string(token),
        )
    type_bits = token.get("_typeBits", _MISSING)
    if type_bits is _MISSING:
        return data, None
    if isinstance(type_bits, Binary):
        if type_bits.subtype == 0:
            return data, bytes(type_bits)
    elif isinstance(type_bits, bytes):  # pymongo decodes BinData(0) as bytes
        return data, type_bits
    raise MongoError(40648, "Bad resume token: _typeBits of wrong type " + document_string(token))


_MISSING = object()


def decode(token: Any) -> ResumeTokenData:
    """`ResumeToken::parse(doc).getData()`, with mongod's checks, codes and messages."""
    hex_data, type_bits = parse(token)
    return decode_parts(hex_data, type_bits)


def decode_parts(hex_data: str, type_bits: bytes | None) -> ResumeTokenData:
    # mongod reads the type bits before it validates the hex.
    bits_reader = keystring.TypeBitsReader(type_bits)
    if len(hex_data) % 2 or not _HEX.fullmatch(hex_data):
        raise MongoError(9, "resume token string was not a valid hex string")
    values = keystring.decode(bytes.fromhex(hex_data), bits_reader)
    it = iter(values)
    first = next(it, None)
    if first is None:
        raise MongoError(40649, "invalid empty resume token")
    cluster_time = _element_timestamp(*first)

    elt = next(it, None)
    if elt is None:
        raise MongoError(50796, "Resume Token does not contain version")
    if elt[0] != 0x10:
        raise MongoError(50854, "Invalid resume token: wrong type for version")
    version = _I32.unpack(elt[1])[0]
    if version not in (0, 1, 2):
        raise MongoError(50795, "Invalid Resume Token: only supports version 0, 1 and 2")

    token_type = EVENT_TOKEN
    if version >= 1:
        elt = next(it, None)
        if elt is None:
            raise MongoError(51055, "Resume Token does not contain tokenType")
        if elt[0] != 0x10:
            raise MongoError(51056, "Resume Token tokenType is not an int.")
        token_type = _I32.unpack(elt[1])[0]
        if token_type not in (EVENT_TOKEN, HIGH_WATER_MARK_TOKEN):
            raise MongoError(51057, f"Token type {token_type} not recognized")

    elt = next(it, None)
    if elt is None:
        raise MongoError(50793, "Resume Token does not contain txnOpIndex")
    if elt[0] != 0x10:
        raise MongoError(50855, "Resume Token txnOpIndex is not an integer")
    txn_op_index = _I32.unpack(elt[1])[0]
    if txn_op_index < 0:
        raise MongoError(50794, "Invalid Resume Token: txnOpIndex should be non-negative")

    from_invalidate = False
    if version >= 1:
        elt = next(it, None)
        if elt is None:
            raise MongoError(50872, "Resume Token does not contain fromInvalidate")
        if elt[0] != 0x08:
            raise MongoError(50870, "Resume Token fromInvalidate is not a boolean.")
        from_invalidate = elt[1] != b"\x00"

    result = ResumeTokenData(cluster_time, version, token_type, txn_op_index, from_invalidate)
    elt = next(it, None)
    if elt is None:
        if version > 1:
            raise MongoError(6189500, "Expected UUID or null")
        return result
    if elt[0] != 0x0A:
        t, v = elt
        if t != 0x05 or v[4] != 4 or _I32.unpack_from(v)[0] != 16:
            raise MongoError(207, "uuid must be a 16-byte binary field with UUID (4) subtype")
        result.uuid = v[5:21]

    elt = next(it, None)
    if token_type == HIGH_WATER_MARK_TOKEN and elt is not None:
        raise MongoError(6189504, "Invalid high water mark token")
    if elt is None:
        if token_type == EVENT_TOKEN and version >= 2:
            raise MongoError(6189501, "Expected an eventIdentifier for an event resume token")
        return result
    if elt[0] != 0x03:
        raise MongoError(6189503, "Resume Token eventIdentifier is not an object")
    result.event_identifier = elt[1]

    elt = next(it, None)
    if elt is not None and version >= 2:
        if elt[0] != 0x10 or _I32.unpack(elt[1])[0] < 0:
            raise MongoError(7182501, "Resume token 'fragmentNum' must be a non-negative integer.")
        result.fragment_num = _I32.unpack(elt[1])[0]
        elt = next(it, None)
    if elt is not None:
        raise MongoError(40646, "invalid oversized resume token")
    return result


def _element_timestamp(t: int, v: bytes) -> Timestamp:
    # BSONElement::timestamp(): Timestamp and Date reinterpret their 8 bytes; others give 0.
    if t in (0x11, 0x09):
        u = _U64.unpack(v)[0]
        return Timestamp(u >> 32, u & 0xFFFFFFFF)
    return Timestamp(0, 0)


# -- versions and order -------------------------------------------------------------------------


def version_for_event(
    cluster_time: Timestamp, resumed_from: ResumeTokenData | None,
    default: int = DEFAULT_TOKEN_VERSION,
) -> int:
    """The token version of an event at `cluster_time` (ChangeStreamEventTransformation).

    A stream resumed from a token of another version keeps that version for events at or
    before the token's clusterTime, then switches to the stream's (`default`: 2, or 1 when the
    aggregate asks `$_generateV2ResumeTokens: false`).
    """
    if resumed_from is not None and cluster_time <= resumed_from.cluster_time:
        return resumed_from.version
    return default


def sort_key(token: Mapping[str, Any]) -> str:
    """The merge key mongos uses (`{"_id._data": 1}`): the upper-case `_data` string."""
    data: str = token["_data"]
    return data.upper()
