"""The sharding catalog of the embedded cluster: what a config server holds.

`config.shards`, `config.databases` (each database's primary shard), `config.collections`
(sharded collections: key, unique, uuid) and `config.chunks` (ranges of the shard key and the
shard that owns each). Chunk bounds are compared as KeyStrings (BSON order, MinKey/MaxKey
included); a hashed field is compared by its 64-bit hash (`hashed_value`, mongod's
`BSONElementHasher::hash64` with seed 0).

Durable as one BSON file (`config.bson` in the data directory) rewritten on every change.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import struct
import uuid as uuid_module
from collections.abc import Mapping, Sequence
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes
from pipeline_stages.dotted_path import document_value
from pipeline_stages.keystring import encode_values

_MISSING = object()


# BSONElement::canonicalType: numbers share one, as do strings and symbols.
_CANONICAL = {
    1: 10, 16: 10, 18: 10, 19: 10, 2: 15, 14: 15, 3: 20, 4: 25, 5: 30, 7: 35, 8: 40,
    9: 45, 17: 47, 10: 5, 6: 0, 11: 50, 12: 55, 13: 60, 15: 65, 255: -1, 127: 127,
}


def _hash_element(md5: Any, type_byte: int, value: bytes, name: bytes | None) -> None:
    md5.update(struct.pack("<i", _CANONICAL.get(type_byte, type_byte)))
    if name is not None:
        md5.update(name + b"\x00")
    if type_byte in (3, 4):  # embedded document/array: each element, named
        pos, end = 4, len(value) - 1
        while pos < end:
            t = value[pos]
            name_end = value.index(b"\x00", pos + 1)
            field = value[pos + 1:name_end]
            size = _value_size(t, value, name_end + 1)
            _hash_element(md5, t, value[name_end + 1:name_end + 1 + size], field)
            pos = name_end + 1 + size
        return
    if type_byte in (1, 16, 18, 19):  # numbers squash to safeNumberLong
        number = bson_bytes.decode(_wrap(type_byte, value))["v"]
        md5.update(struct.pack("<q", _safe_long(number)))
        return
    md5.update(value)


def _wrap(type_byte: int, value: bytes) -> bytes:
    body = bytes([type_byte]) + b"v\x00" + value + b"\x00"
    return struct.pack("<i", len(body) + 4) + body


def _safe_long(number: Any) -> int:
    try:
        value = float(number.to_decimal()) if hasattr(number, "to_decimal") else number
        if value != value:
            return 0
        if value >= 2**63:
            return 2**63 - 1
        if value < -(2**63):
            return -(2**63)
        return int(value)
    except (OverflowError, ValueError):
        return 0


def _int32(buf: bytes, pos: int) -> int:
    value: int = struct.unpack_from("<i", buf, pos)[0]
    return value


def _value_size(t: int, buf: bytes, pos: int) -> int:
    if t in (1, 9, 17, 18):
        return 8
    if t == 16:
        return 4
    if t == 8:
        return 1
    if t in (6, 10, 127, 255):
        return 0
    if t == 7:
        return 12
    if t == 19:
        return 16
    if t in (2, 13, 14):
        return 4 + _int32(buf, pos)
    if t in (3, 4, 15):
        return _int32(buf, pos)
    if t == 5:
        return 5 + _int32(buf, pos)
    if t == 11:
        a = buf.index(b"\x00", pos)
        b = buf.index(b"\x00", a + 1)
        return b + 1 - pos
    if t == 12:
        return 4 + _int32(buf, pos) + 12
    raise ValueError(f"BSON type {t}")


def hashed_value(value: Any) -> Int64:
    """mongod's hash of a shard key value (`BSONElementHasher::hash64(e, 0)`): MD5 over the
    seed, the canonical type and the value (numbers as 64-bit integers), first 8 bytes."""
    raw = bson_bytes.encode({"v": value})
    t = raw[4]
    md5 = hashlib.md5()
    md5.update(struct.pack("<i", 0))
    _hash_element(md5, t, raw[7:-1], None)
    return Int64(struct.unpack("<q", md5.digest()[:8])[0])


def _key_bytes(values: Sequence[Any]) -> bytes:
    return encode_values(values)[0]


def bound_bytes(bound: Mapping[str, Any]) -> bytes:
    """A chunk or zone bound (a document of the key's fields) as bounds compare."""
    return _key_bytes(list(bound.values()))


class ShardingCatalog:
    def __init__(self, shard_names: list[str], path: str | None = None) -> None:
        self.shard_names = shard_names
        self.path = path  # config.bson, or None in memory
        self.databases: dict[str, dict[str, Any]] = {}
        self.collections: dict[str, dict[str, Any]] = {}
        self.chunks: dict[str, list[dict[str, Any]]] = {}
        self.shard_hosts: dict[str, str] = {}
        self.balancer = False
        # config.shards beyond name and host: each shard's topologyTime (the cluster time
        # addShard committed it at) and draining flag (removeShard started); shards removed,
        # with the time their removal completed (their oplogs stay readable for old tokens).
        self.topology_time = {n: Timestamp(1, 1 + i) for i, n in enumerate(shard_names)}
        self.draining: set[str] = set()
        self.removed: dict[str, Timestamp] = {}
        # Data moves under way (sharding/migration.py): each recorded before its first write,
        # its commit saved with the chunk map it changes, dropped once finished.
        self.operations: list[dict[str, Any]] = []
        # Zones: each shard's (config.shards `tags`) and the key ranges assigned to them
        # (config.tags: {_id, ns, min, max, tag}).
        self.shard_zones: dict[str, list[str]] = {}
        self.tags: list[dict[str, Any]] = []
        if path is not None and os.path.exists(path):
            with open(path, "rb") as f:
                saved = bson_bytes.decode(f.read())
            if "shards" in saved:  # added or removed shards outlive a restart
                self.shard_names[:] = [s["_id"] for s in saved["shards"]]
                self.topology_time = {s["_id"]: s["topologyTime"] for s in saved["shards"]}
                self.draining = {s["_id"] for s in saved["shards"] if s.get("draining")}
                self.removed = {s["_id"]: s["removedAt"] for s in saved.get("removed", [])}
                self.shard_zones = {s["_id"]: list(s["tags"]) for s in saved["shards"]
                                    if "tags" in s}
            self.tags = list(saved.get("tags", []))
            self.databases = {d["_id"]: d for d in saved["databases"]}
            self.collections = {c["_id"]: c for c in saved["collections"]}
            for chunk in saved["chunks"]:
                self.chunks.setdefault(chunk["ns"], []).append(chunk)
            self.operations = list(saved.get("operations", []))

    def save(self) -> None:
        if self.path is None:
            return
        doc = {
            "shards": [{"_id": n, "topologyTime": self.topology_time[n],
                        **({"draining": True} if n in self.draining else {}),
                        **({"tags": self.shard_zones[n]} if n in self.shard_zones else {})}
                       for n in self.shard_names],
            "removed": [{"_id": n, "removedAt": t} for n, t in self.removed.items()],
            "databases": list(self.databases.values()),
            "collections": list(self.collections.values()),
            "chunks": [c for cs in self.chunks.values() for c in cs],
            "operations": self.operations,
            "tags": self.tags,
        }
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(bson_bytes.encode(doc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def begin_operation(self, record: dict[str, Any]) -> dict[str, Any]:
        """Record a data move before its first write (saved); returns the record, which the
        move changes in place before the save of its commit."""
        self.operations.append(record)
        self.save()
        return record

    def end_operation(self, record: dict[str, Any]) -> None:
        if any(r is record for r in self.operations):
            self.operations = [r for r in self.operations if r is not record]
            self.save()

    # -- shards -------------------------------------------------------------------------------

    def placement_shards(self) -> list[str]:
        """The shards new databases and chunks may go to (not draining)."""
        return [n for n in self.shard_names if n not in self.draining]

    def add_shard(self, name: str, topology_time: Timestamp) -> None:
        self.shard_names.append(name)
        self.topology_time[name] = topology_time
        self.save()

    def start_draining(self, name: str) -> None:
        self.draining.add(name)
        self.save()

    def remove_shard(self, name: str, removed_at: Timestamp) -> None:
        self.shard_names.remove(name)
        self.draining.discard(name)
        self.removed[name] = removed_at
        self.save()

    # -- zones ----------------------------------------------------------------------------------

    def add_shard_to_zone(self, shard: str, zone: str) -> None:
        zones = self.shard_zones.setdefault(shard, [])
        if zone not in zones:  # $addToSet
            zones.append(zone)
        self.save()

    def remove_shard_from_zone(self, shard: str, zone: str) -> None:
        zones = self.shard_zones.get(shard)
        if zones is not None and zone in zones:  # $pull (an emptied list stays)
            zones.remove(zone)
            self.save()

    def zone_shards(self, zone: str) -> list[str]:
        """The member shards in `zone`, in the shard list's order."""
        return [n for n in self.shard_names if zone in self.shard_zones.get(n, [])]

    def shard_required_by_zone(self, shard: str, zone: str) -> bool:
        """_isShardRequiredByZoneStillInUse: `shard` is the zone's only shard and a key range
        is assigned to the zone."""
        return (self.zone_shards(zone) == [shard]
                and any(t["tag"] == zone for t in self.tags))

    def zone_ranges(self, ns: str) -> list[dict[str, Any]]:
        """config.tags of `ns`, by their min."""
        return sorted((t for t in self.tags if t["ns"] == ns),
                      key=lambda t: bound_bytes(t["min"]))

    def assign_range(self, ns: str, low: dict[str, Any], high: dict[str, Any], zone: str) -> None:
        """Upsert the range starting at `low` (mongod's update of config.tags by {ns, min})."""
        for t in self.tags:
            if t["ns"] == ns and bound_bytes(t["min"]) == bound_bytes(low):
                t.update({"ns": ns, "min": dict(low), "max": dict(high), "tag": zone})
                break
        else:
            self.tags.append({"_id": ObjectId(), "ns": ns, "min": dict(low), "max": dict(high),
                              "tag": zone})
        self.save()

    def remove_range(self, ns: str, low: Mapping[str, Any], high: Mapping[str, Any]) -> None:
        kept = [t for t in self.tags
                if not (t["ns"] == ns and bound_bytes(t["min"]) == bound_bytes(low)
                        and bound_bytes(t["max"]) == bound_bytes(high))]
        if len(kept) != len(self.tags):
            self.tags = kept
            self.save()

    def range_zone(self, ns: str, chunk: Mapping[str, Any]) -> str | None:
        """The zone whose range holds `chunk` whole (None: no zone's)."""
        low, high = bound_bytes(chunk["min"]), bound_bytes(chunk["max"])
        for t in self.tags:
            if t["ns"] == ns and bound_bytes(t["min"]) <= low and high <= bound_bytes(t["max"]):
                return str(t["tag"])
        return None

    # -- databases ------------------------------------------------------------------------------

    def primary(self, db: str) -> str | None:
        entry = self.databases.get(db)
        return None if entry is None else entry["primary"]

    def ensure_database(self, db: str, primary: str | None = None) -> str:
        """The database's primary shard, choosing one for a new database (mongos picks the
        shard with the least data: here the one that is primary for the fewest databases)."""
        entry = self.databases.get(db)
        if entry is not None:
            chosen: str = entry["primary"]
            return chosen
        if primary is None:
            names = self.placement_shards()
            counts = dict.fromkeys(names, 0)
            for d in self.databases.values():
                counts[d["primary"]] = counts.get(d["primary"], 0) + 1
            primary = min(names, key=lambda n: (counts[n], names.index(n)))
        now = Timestamp(int(datetime.datetime.now(datetime.UTC).timestamp()), 1)
        self.databases[db] = {
            "_id": db,
            "primary": primary,
            "version": {"uuid": Binary.from_uuid(uuid_module.uuid4()), "timestamp": now,
                        "lastMod": 1},
        }
        self.save()
        return primary

    def set_primary(self, db: str, shard: str) -> None:
        entry = self.databases[db]
        entry["primary"] = shard
        version = dict(entry["version"])
        version["lastMod"] = int(version.get("lastMod", 1)) + 1
        entry["version"] = version
        self.save()

    def drop_database(self, db: str) -> None:
        self.databases.pop(db, None)
        for ns in [ns for ns in self.collections if ns.split(".", 1)[0] == db]:
            self.drop_collection(ns)
        self.save()

    # -- collections ----------------------------------------------------------------------------

    def key_pattern(self, ns: str) -> dict[str, Any] | None:
        entry = self.collections.get(ns)
        return None if entry is None else entry["key"]

    def is_sharded(self, ns: str) -> bool:
        """In config.collections: sharded, or unsharded but tracked (`unsplittable`: placed on
        one shard by moveCollection/unshardCollection; routed by its one chunk)."""
        return ns in self.collections

    def is_unsplittable(self, ns: str) -> bool:
        entry = self.collections.get(ns)
        return entry is not None and entry.get("unsplittable") is True

    def shard_collection(
        self, ns: str, key: dict[str, Any], unique: bool, uuid: bytes, primary: str,
        layout: Sequence[tuple[dict[str, Any], dict[str, Any], str]] | None = None,
        unsplittable: bool = False,
    ) -> None:
        """`layout`: the first chunks' (min, max, shard), else one chunk on `primary` (a
        hashed key: one per shard). `unsplittable`: a tracked unsharded collection."""
        epoch = ObjectId()
        now = Timestamp(int(datetime.datetime.now(datetime.UTC).timestamp()), 1)
        self.collections[ns] = {
            "_id": ns,
            "lastmodEpoch": epoch,
            "lastmod": datetime.datetime.now(datetime.UTC),
            "timestamp": now,
            "uuid": Binary(uuid, 4),
            "key": dict(key),
            "unique": unique,
            "noBalance": False,
            **({"unsplittable": True} if unsplittable else {}),
        }
        fields = list(key)
        hashed = [f for f, v in key.items() if v == "hashed"]
        names = self.placement_shards()
        ranges: list[tuple[Any, Any, str]]
        if layout:
            ranges = list(layout)
        elif hashed and len(names) > 1 and not unsplittable:
            # One chunk per shard, splitting the hash space evenly (presplit hashed key).
            n = len(names)
            bounds: list[Any] = [MinKey()]
            step = 2**64 // n
            bounds += [Int64(-(2**63) + step * i) for i in range(1, n)]
            bounds.append(MaxKey())
            ranges = [(bounds[i], bounds[i + 1], names[i]) for i in range(n)]
        else:
            ranges = [(MinKey(), MaxKey(), primary)]
        chunks = []
        for i, (low, high, shard) in enumerate(ranges):
            chunks.append(self._chunk(ns, uuid, fields, hashed, low, high, shard, i + 1))
        self.chunks[ns] = chunks
        self.save()

    def _chunk(
        self, ns: str, uuid: bytes, fields: list[str], hashed: list[str], low: Any, high: Any,
        shard: str, minor: int,
    ) -> dict[str, Any]:
        def bound(v: Any) -> dict[str, Any]:
            if isinstance(v, dict):
                return dict(v)
            if isinstance(v, (MinKey, MaxKey)):
                return dict.fromkeys(fields, v)
            # A presplit point: the hashed field takes it, the others MinKey.
            return {f: (v if f == hashed[0] else MinKey()) for f in fields}

        lo, hi = bound(low), bound(high)
        return {
            "_id": ObjectId(),
            "uuid": Binary(uuid, 4),
            "min": lo,
            "max": hi,
            "shard": shard,
            "lastmod": Timestamp(1, minor),
            "onCurrentShardSince": Timestamp(
                int(datetime.datetime.now(datetime.UTC).timestamp()), 1),
            "history": [{"validAfter": Timestamp(1, 0), "shard": shard}],
            "ns": ns,
        }

    def drop_collection(self, ns: str) -> None:
        self.collections.pop(ns, None)
        self.chunks.pop(ns, None)
        self.tags = [t for t in self.tags if t["ns"] != ns]  # a drop removes its zones' ranges
        self.save()

    def rename_collection(self, source: str, target: str) -> None:
        entry = self.collections.pop(source, None)
        chunks = self.chunks.pop(source, None)
        if entry is not None:
            entry["_id"] = target
            self.collections[target] = entry
            for chunk in chunks or []:
                chunk["ns"] = target
            self.chunks[target] = chunks or []
        if any(t["ns"] == source for t in self.tags):  # the ranges go with the collection
            self.tags = [t for t in self.tags if t["ns"] != target]
            for t in self.tags:
                if t["ns"] == source:
                    t["ns"] = target
        self.save()

    # -- chunks ---------------------------------------------------------------------------------

    def key_values(self, ns: str, doc: Mapping[str, Any]) -> list[Any]:
        """The shard key of `doc` as chunk bounds compare it (hashed fields hashed; missing
        fields null)."""
        pattern = self.key_pattern(ns) or {}
        out = []
        for field, kind in pattern.items():
            value = document_value(doc, field, _MISSING)
            if value is _MISSING:
                value = None
            out.append(hashed_value(value) if kind == "hashed" else value)
        return out

    def chunk_for_values(self, ns: str, values: Sequence[Any]) -> dict[str, Any]:
        key = _key_bytes(values)
        for chunk in self.chunks[ns]:
            if _key_bytes(list(chunk["min"].values())) <= key < _key_bytes(
                list(chunk["max"].values())
            ) or (isinstance(list(chunk["max"].values())[0], MaxKey)
                  and _key_bytes(list(chunk["min"].values())) <= key):
                return chunk
        return self.chunks[ns][-1]

    def shard_for(self, ns: str, doc: Mapping[str, Any]) -> str:
        shard: str = self.chunk_for_values(ns, self.key_values(ns, doc))["shard"]
        return shard

    def in_chunk(self, ns: str, chunk: Mapping[str, Any], doc: Mapping[str, Any]) -> bool:
        key = _key_bytes(self.key_values(ns, doc))
        low = _key_bytes(list(chunk["min"].values()))
        high = list(chunk["max"].values())
        if isinstance(high[0], MaxKey):
            return low <= key
        return low <= key < _key_bytes(high)

    def find_chunk(self, ns: str, point: Mapping[str, Any]) -> dict[str, Any] | None:
        """The chunk whose min equals `point` (a bound), else the chunk containing it."""
        values = list(point.values())
        for chunk in self.chunks.get(ns, []):
            if _key_bytes(list(chunk["min"].values())) == _key_bytes(values):
                return chunk
        return self.chunk_for_values(ns, values) if ns in self.chunks else None

    def split(self, ns: str, middle: Mapping[str, Any]) -> None:
        """Split the chunk containing `middle` at `middle` (a bound in the key's fields)."""
        values = list(middle.values())
        chunk = self.chunk_for_values(ns, values)
        if _key_bytes(list(chunk["min"].values())) == _key_bytes(values):
            return  # already a bound
        chunks = self.chunks[ns]
        minor = max(c["lastmod"].inc for c in chunks) + 1
        upper = dict(chunk)
        upper["_id"] = ObjectId()
        upper["min"] = dict(middle)
        upper["lastmod"] = Timestamp(chunk["lastmod"].time, minor + 1)
        chunk["max"] = dict(middle)
        chunk["lastmod"] = Timestamp(chunk["lastmod"].time, minor)
        chunks.insert(chunks.index(chunk) + 1, upper)
        self.save()

    def move(self, ns: str, chunk: dict[str, Any], to: str) -> None:
        major = max(c["lastmod"].time for c in self.chunks[ns]) + 1
        chunk["shard"] = to
        chunk["lastmod"] = Timestamp(major, 0)
        chunk["history"] = [{"validAfter": Timestamp(major, 0), "shard": to}]
        self.save()

    def document_key(self, ns: str, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        """mongod's documentKey of a document of a sharded collection: the shard key's fields
        in the key's order, then `_id` unless the key has it (None: not sharded)."""
        pattern = self.key_pattern(ns)
        if pattern is None:
            return None
        out: dict[str, Any] = {}
        for field in pattern:
            value = document_value(doc, field, _MISSING)
            if value is not _MISSING:
                out[field] = value
        if "_id" not in out and "_id" in doc:
            out["_id"] = doc["_id"]
        return out

