"""Zones, as mongos hands them to the config server, and the balancer that respects them.

A shard's zones are its `config.shards` `tags` (addShardToZone, removeShardFromZone); a zone's
key ranges of a collection are `config.tags` documents `{_id, ns, min, max, tag}`
(updateZoneKeyRange, `zone: null` removes one). `shardCollection` of an empty collection with
ranges makes one chunk per range on a shard of its zone and spreads the gaps over every shard
(mongod's SingleChunkPerTagSplitPolicy); a balancer round first splits chunks at the ranges'
bounds, moves each chunk to a shard of its zone (any shard when it is in none), then evens the
chunk counts among the shards each zone allows (mongod 8.0's BalancerPolicy, by chunk count
rather than data size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.sharding.catalog import ShardingCatalog, bound_bytes
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.migration import BALANCER_MOVE_COLLECTION, bson_string
from cdcserver.sharding.router.arguments import admin_only
from cdcserver.sharding.router.collection_moves import move_to
from cdcserver.sharding.router.moves import migrate
from cdcserver.sharding.router.routing import cluster_of
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

ShardNotFound = 70
ZoneStillInUse = 163
ZoneNotFound = 177
RangeOverlapConflict = 178
CannotCreateChunkDistribution = 405


def _string_parameter(cmd: Mapping[str, Any], command_name: str) -> str:
    """An IDL command's string parameter (the value of its first field)."""
    value = cmd[next(iter(cmd))]
    if not isinstance(value, str):
        raise MongoError(14, f"BSON field '{command_name}.{command_name}' is the wrong type "
                         f"'{type_name(value)}', expected type 'string'")
    return value


def _zone_field(cmd: Mapping[str, Any], command_name: str) -> str:
    zone = cmd.get("zone")
    if "zone" not in cmd:
        raise MongoError(40414, f"BSON field '{command_name}.zone' is missing but a required "
                         "field")
    if not isinstance(zone, str):
        raise MongoError(14, f"BSON field '{command_name}.zone' is the wrong type "
                         f"'{type_name(zone)}', expected type 'string'")
    return zone


@command("addShardToZone", "addshardtozone")
async def add_shard_to_zone(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The config server's `$addToSet` of the zone to the shard's `tags`, found by its
    `_id` only (ShardingCatalogManager::addShardToZone: a host or connection string names
    no shard there)."""
    admin_only("addShardToZone", db)
    catalog = cluster_of(server).catalog
    shard = _string_parameter(cmd, "addShardToZone")
    zone = _zone_field(cmd, "addShardToZone")
    if shard not in catalog.shard_names:
        raise MongoError(ShardNotFound, f"shard {shard} does not exist")
    catalog.add_shard_to_zone(shard, zone)
    return {}


@command("removeShardFromZone", "removeshardfromzone")
async def remove_shard_from_zone(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The zone `$pull`ed from the shard's `tags`; refused (163) when the shard is the
    zone's last and a key range is assigned to the zone."""
    admin_only("removeShardFromZone", db)
    catalog = cluster_of(server).catalog
    shard = _string_parameter(cmd, "removeShardFromZone")
    zone = _zone_field(cmd, "removeShardFromZone")
    if shard not in catalog.shard_names:
        raise MongoError(ShardNotFound, f"shard {shard} does not exist")
    if catalog.shard_required_by_zone(shard, zone):
        raise MongoError(ZoneStillInUse,
                         "cannot remove a shard from zone if a chunk range is associated with it")
    catalog.remove_shard_from_zone(shard, zone)
    return {}


def _range_bound(cmd: Mapping[str, Any], name: str) -> dict[str, Any]:
    """ChunkRange::fromBSON's `min` / `max`: a non-empty object."""
    value = cmd.get(name)
    if name not in cmd:
        raise MongoError(4, f"Invalid {name} key :: caused by :: Missing expected field "
                         f"\"{name}\"")
    if not isinstance(value, Mapping):
        raise MongoError(14, f"Invalid {name} key :: caused by :: \"{name}\" had the wrong "
                         f"type. Expected object, found {type_name(value)}")
    if not value:
        raise MongoError(2, f"The {name} key cannot be empty")
    return dict(value)


def _is_valid_namespace(ns: str) -> bool:
    db, dot, coll = ns.partition(".")
    return bool(db and dot and coll) and not any(c in db for c in "/\\. \"$\x00")


def _extended(bound: Mapping[str, Any], fields: list[str]) -> dict[str, Any]:
    """ShardKeyPattern::extendRangeBound(bound, false): the key's missing fields MinKey."""
    return {f: bound[f] if f in bound else MinKey() for f in fields}


def _full_range(catalog: ShardingCatalog, ns: str, low: dict[str, Any], high: dict[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """includeFullShardKey: a sharded collection's range, extended to its whole shard key
    (61 unless both bounds name a prefix of it); an unsharded one's as given."""
    key = catalog.key_pattern(ns)
    if key is None:
        return low, high, None
    fields = list(key)
    for name, bound in (("min", low), ("max", high)):
        if list(bound) != fields[:len(bound)]:
            raise MongoError(61, f"{name}: {bson_string(bound)} is not a prefix of the shard "
                             f"key {bson_string(key)} of ns: {ns}")
    return _extended(low, fields), _extended(high, fields), key


def _check_hashed(low: Mapping[str, Any], high: Mapping[str, Any],
                  key: Mapping[str, Any]) -> None:
    for field, kind in key.items():
        if kind != "hashed":
            continue
        if not all(isinstance(b.get(field), (Int64, MinKey, MaxKey)) for b in (low, high)):
            raise MongoError(72, f"there exists a field in the range {bson_string(low)} -->> "
                             f"{bson_string(high)} not of type NumberLong, MinKey, or MaxKey "
                             "which corresponds to a hashed field in the shard key pattern "
                             f"{bson_string(key)}")


def _range_string(low: Mapping[str, Any], high: Mapping[str, Any], zone: str) -> str:
    return f"{bson_string(low)} -->> {bson_string(high)}  on  {zone}"  # ZoneRange::toString


def _check_overlap(catalog: ShardingCatalog, ns: str, low: dict[str, Any],
                   high: dict[str, Any], zone: str) -> None:
    """DistributionStatus::addRangeToZone over the collection's ranges: the same range of
    the same zone again is fine, any other overlap is 178."""
    lo, hi = bound_bytes(low), bound_bytes(high)
    for t in catalog.zone_ranges(ns):
        t_lo, t_hi = bound_bytes(t["min"]), bound_bytes(t["max"])
        if t_lo < hi and lo < t_hi:
            if t_lo == lo and t_hi == hi and t["tag"] == zone:
                return
            raise MongoError(RangeOverlapConflict, f"Zone range: {_range_string(low, high, zone)}"
                             f" is overlapping with existing: "
                             f"{_range_string(t['min'], t['max'], t['tag'])}")


@command("updateZoneKeyRange", "updatezonekeyrange")
async def update_zone_key_range(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """A key range of `ns` assigned to a zone (an upsert of config.tags by `{ns, min}`), or,
    with `zone: null`, the range's document removed."""
    admin_only("updateZoneKeyRange", db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    ns = cmd[next(iter(cmd))]
    if not isinstance(ns, str):
        raise MongoError(14, f"\"updateZoneKeyRange\" had the wrong type. Expected string, "
                         f"found {type_name(ns)}")
    if not _is_valid_namespace(ns):
        raise MongoError(73, f"{ns} is not a valid namespace")
    low, high = _range_bound(cmd, "min"), _range_bound(cmd, "max")
    if bound_bytes(low) >= bound_bytes(high):
        raise MongoError(9, f"min: {bson_string(low)} should be less than max: "
                         f"{bson_string(high)}")
    if "zone" not in cmd:
        raise MongoError(4, "Missing expected field \"zone\"")
    zone = cmd["zone"]
    if zone is not None and not isinstance(zone, str):
        raise MongoError(14, f"\"zone\" had the wrong type. Expected string or null, found "
                         f"{type_name(zone)}")
    if zone is None:
        low, high, _ = _full_range(catalog, ns, low, high)
        catalog.remove_range(ns, low, high)
        return {}
    if not catalog.zone_shards(zone):
        raise MongoError(ZoneNotFound, f"zone {zone} does not exist")
    low, high, key = _full_range(catalog, ns, low, high)
    _check_hashed(low, high, key if key is not None else dict.fromkeys(low, 1))
    _check_overlap(catalog, ns, low, high, zone)
    catalog.assign_range(ns, low, high, zone)
    if catalog.balancer:  # switched on: the chunks go where their zones say
        await balancer_round(cluster)
    return {}


def initial_layout(catalog: ShardingCatalog, ns: str, key: Mapping[str, Any],
                   ranges: list[dict[str, Any]] | None = None,
                   ) -> list[tuple[dict[str, Any], dict[str, Any], str]] | None:
    """The first chunks of an empty collection with zone ranges (SingleChunkPerTagSplitPolicy):
    one per range (`ranges`, by their min: {tag, min, max}; else its config.tags), on the
    shards of its zone in turn; the gaps between them spread over every shard. None: no
    range."""
    if ranges is None:
        ranges = catalog.zone_ranges(ns)
    if not ranges:
        return None
    fields = list(key)
    for t in ranges:
        if any(list(t[b]) != fields[:len(t[b])] for b in ("min", "max")):
            raise MongoError(72, f"the proposed shard key {bson_string(dict(key))} does not "
                             "match with the shard key of the existing zone "
                             f"{bson_string(t['min'])} -->> {bson_string(t['max'])}")
    shards = catalog.placement_shards()
    zone_shards = {t["tag"]: [s for s in catalog.zone_shards(t["tag"]) if s in shards]
                   for t in ranges}
    if any(not members for members in zone_shards.values()):
        raise MongoError(CannotCreateChunkDistribution,
                         "The initial split policy is not able to find a chunk distribution "
                         "that satisfies the given set of zones with the current shards")
    layout: list[tuple[dict[str, Any], dict[str, Any], str | None]] = []
    turn = dict.fromkeys(zone_shards, 0)
    low = dict.fromkeys(fields, MinKey())
    for t in ranges:
        t_min, t_max = _extended(t["min"], fields), _extended(t["max"], fields)
        if bound_bytes(t_min) > bound_bytes(low):
            layout.append((low, t_min, None))
        members = zone_shards[t["tag"]]
        layout.append((t_min, t_max, members[turn[t["tag"]] % len(members)]))
        turn[t["tag"]] += 1
        low = t_max
    top = dict.fromkeys(fields, MaxKey())
    if bound_bytes(low) < bound_bytes(top):
        layout.append((low, top, None))
    counts = dict.fromkeys(shards, 0)
    for _, _, shard in layout:
        if shard is not None:
            counts[shard] += 1
    out = []
    for lo, hi, shard in layout:
        if shard is None:  # a gap: the shard with the fewest chunks so far
            shard = min(shards, key=lambda n: (counts[n], shards.index(n)))
            counts[shard] += 1
        out.append((lo, hi, shard))
    return out


def reshard_zones(catalog: ShardingCatalog, zones: Any, key: Mapping[str, Any]
                  ) -> list[dict[str, Any]]:
    """reshardCollection's `zones` ({zone, min, max} each; resharding_util's validateZones):
    each a zone some shard is in (else 2), the ranges not overlapping (else 2); as
    config.tags ranges of the new key, by their min."""
    if not isinstance(zones, list):
        raise MongoError(14, "BSON field 'reshardCollection.zones' is the wrong type "
                         f"'{type_name(zones)}', expected type 'array'")
    fields = list(key)
    out = []
    for zone in zones:
        if not isinstance(zone, Mapping) or not isinstance(zone.get("zone"), str) or not all(
                isinstance(zone.get(b), Mapping) for b in ("min", "max")):
            raise MongoError(9, "a zone is {zone: <string>, min: <object>, max: <object>}")
        if not catalog.zone_shards(zone["zone"]):
            raise MongoError(2, "Zone must already exist")
        out.append({"tag": zone["zone"], "min": _extended(zone["min"], fields),
                    "max": _extended(zone["max"], fields)})
    out.sort(key=lambda t: bound_bytes(t["min"]))
    for prev, nxt in zip(out, out[1:], strict=False):
        if bound_bytes(prev["max"]) > bound_bytes(nxt["min"]):
            raise MongoError(2, "Zone ranges must not overlap")
    return out


# -- the balancer ---------------------------------------------------------------------------------

@command("balancerStart", "balancerStop", "balancerStatus")
async def balancer(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    admin_only(next(iter(cmd)), db)
    cluster = cluster_of(server)
    catalog = cluster.catalog
    name = next(iter(cmd))
    if name == "balancerStart":
        catalog.balancer = True
        await balancer_round(cluster)
    elif name == "balancerStop":
        catalog.balancer = False
    else:
        return {"mode": "full" if catalog.balancer else "off", "inBalancerRound": False,
                "numBalancerRounds": Int64(cluster.balancer_rounds)}
    return {}


def _split_at_zone_bounds(catalog: ShardingCatalog, ns: str) -> None:
    fields = list(catalog.key_pattern(ns) or {})
    for t in catalog.zone_ranges(ns):
        for bound in (t["min"], t["max"]):
            point = _extended(bound, fields)
            if all(isinstance(v, MinKey) for v in point.values()):
                continue
            if all(isinstance(v, MaxKey) for v in point.values()):
                continue
            catalog.split(ns, point)


async def balancer_round(cluster: ShardedCluster) -> int:
    """One balancer round: for each sharded collection, its chunks split at its zone ranges'
    bounds; a chunk on a draining shard or outside the shards its zone allows moves to the
    allowed shard with the fewest of the collection's chunks; then, within each zone (and
    among the chunks in none), chunks move from the shard with the most to the one with the
    fewest until they differ by at most one. Migrations: no events. Returns the chunks moved."""
    catalog = cluster.catalog
    moved = 0
    for ns in list(catalog.collections):
        if catalog.is_unsplittable(ns):  # one chunk: off a draining shard by moveCollection
            owner = catalog.chunks[ns][0]["shard"]
            targets = catalog.placement_shards()
            if owner in catalog.draining and targets:
                counts = {n: sum(c["shard"] == n for cs in catalog.chunks.values() for c in cs)
                          for n in targets}
                await move_to(cluster, ns, min(targets, key=lambda n: counts[n]),
                              BALANCER_MOVE_COLLECTION)
                moved += 1
            continue
        _split_at_zone_bounds(catalog, ns)
        moved += await _enforce_zones(cluster, ns)
        moved += await _even_out(cluster, ns)
    cluster.balancer_rounds += 1
    return moved


def _allowed(catalog: ShardingCatalog, zone: str | None) -> list[str]:
    targets = catalog.placement_shards()
    if zone is None:
        return targets
    return [n for n in catalog.zone_shards(zone) if n in targets]


async def _enforce_zones(cluster: ShardedCluster, ns: str) -> int:
    catalog = cluster.catalog
    moved = 0
    while True:
        counts = dict.fromkeys(catalog.shard_names, 0)
        for chunk in catalog.chunks.get(ns, []):
            counts[chunk["shard"]] += 1
        misplaced = None
        for chunk in catalog.chunks.get(ns, []):
            allowed = _allowed(catalog, catalog.range_zone(ns, chunk))
            if allowed and chunk["shard"] not in allowed:
                misplaced = (chunk, min(allowed, key=lambda n: (counts[n], allowed.index(n))))
                break
        if misplaced is None:
            return moved
        await migrate(cluster, ns, misplaced[0], misplaced[1])
        moved += 1


async def _even_out(cluster: ShardedCluster, ns: str) -> int:
    catalog = cluster.catalog
    moved = 0
    zones = [None, *sorted({t["tag"] for t in catalog.zone_ranges(ns)})]
    for zone in zones:
        allowed = _allowed(catalog, zone)
        if not allowed:
            continue
        while True:
            group = [c for c in catalog.chunks.get(ns, [])
                     if catalog.range_zone(ns, c) == zone]
            counts = dict.fromkeys(allowed, 0)
            for chunk in group:
                if chunk["shard"] in counts:
                    counts[chunk["shard"]] += 1
            least = min(allowed, key=lambda n: counts[n])
            most = max(allowed, key=lambda n: counts[n])
            if counts[most] - counts[least] <= 1:
                break
            chunk = next(c for c in group if c["shard"] == most)
            await migrate(cluster, ns, chunk, least)
            moved += 1
    return moved
