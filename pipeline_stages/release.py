"""The MongoDB release cdcserver answers as: one profile per release, read by everything that
differs between them (version strings, wire version, `$changeStream` options, serverStatus's
change-stream counters, the feature compatibility version).

A profile is data, not behaviour: code asks "does this release accept option X" or "which FCV
does it report", never "is this 9.0". The server holds one (`ServerState.release`); a sidecar
takes its upstream's (`release_for_upstream`).

Chosen from the release notes and mongod's source (document_source_change_stream.idl/.cpp):
- 9.0's `$changeStream` accepts `ignoreRemovedShards` (bool) and `version` ("v1" | "v2";
  another string is IDL's BadValue); 8.0 rejects both as unknown fields (40415).
- 9.0's serverStatus counts the options a stream was opened with
  (`metrics.changeStreams.option.*`) and its scope (`.scope.{cluster, collection, db}`); the
  mongod-side `changeStreams.showExpandedEvents` of 8.0 moved to `option.showExpandedEvents`.
- Not copied: 8.2.0's `collectionUUID`/`operationDescription` without `showExpandedEvents`
  (reverted in 8.2.1), 9.0's optimized updateLookup and sharded "v2" reader (off again in 9.0.2):
  a 9.0 stream asking `version: "v2"` reads as a v1 stream does, as 9.0.2+ does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Release:
    name: str  # "8.0": what `[server] compatibility` names
    version: str  # buildInfo / serverStatus `version`
    max_wire_version: int  # hello's maxWireVersion
    fcv: str  # featureCompatibilityVersion.version
    # $changeStream fields beyond 8.0's, by name -> IDL type name (TypeMismatch messages).
    change_stream_fields: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}))
    # Enumerated string fields among those: name -> accepted values.
    change_stream_enums: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    # serverStatus.metrics.changeStreams.option.* / .scope.* (9.0); else 8.0's
    # showExpandedEvents counter.
    change_stream_option_metrics: bool = False
    # The FCV from which time-series collections are viewless (9.0's
    # featureFlagCreateViewlessTimeseriesCollections): setFeatureCompatibilityVersion across
    # it converts them, logging `upgradeDowngradeViewlessTimeseries`. None: always viewful.
    viewless_timeseries_fcv: str | None = None
    # The `op: "c"` commands its oplog holds (the first field of `o`): a sidecar warns once of
    # another (a newer release's), which change streams skip as mongod's filter does.
    oplog_commands: frozenset[str] = frozenset()
    # A collection change stream on a time-series collection's view is refused (166) with
    # "Cannot run aggregation on timeseries" (8.0's OplogAggCatalogState::validate) rather
    # than as any view ("is a view, not a collection", 8.3+ / 9.0).
    timeseries_view_stream_message: bool = True
    # mongos answers `getParameter {featureCompatibilityVersion: 1}` with its binary's FCV
    # (8.0, 8.2: feature_compatibility_version.idl linked into mongos, SERVER-100224); from
    # 8.3.0 it has no such parameter: 72 "no option found to get" (SERVER-118760).
    router_fcv_parameter: bool = True

    @property
    def version_array(self) -> list[int]:
        major, minor, patch = (int(x) for x in self.version.split("."))
        return [major, minor, patch, 0]


# What mongod 8.0's OpObserverImpl logs as commands (and applyOps / transactions').
_OPLOG_COMMANDS_8_0 = frozenset({
    "create", "drop", "renameCollection", "dropDatabase", "createIndexes", "startIndexBuild",
    "commitIndexBuild", "abortIndexBuild", "dropIndexes", "deleteIndexes", "collMod",
    "convertToCapped", "emptycapped", "importCollection", "applyOps", "commitTransaction",
    "abortTransaction", "dbCheck", "createDatabaseMetadata", "modifyCollectionShardingIndexCatalog",
    "truncateRange",
})
MONGODB_8_0 = Release(name="8.0", version="8.0.12", max_wire_version=25, fcv="8.0",
                      oplog_commands=_OPLOG_COMMANDS_8_0)
MONGODB_9_0 = Release(
    name="9.0",
    version="9.0.4",
    max_wire_version=29,
    fcv="9.0",
    change_stream_fields=MappingProxyType({"ignoreRemovedShards": "bool", "version": "string"}),
    change_stream_enums=MappingProxyType({"version": ("v1", "v2")}),
    change_stream_option_metrics=True,
    viewless_timeseries_fcv="9.0",
    oplog_commands=_OPLOG_COMMANDS_8_0 | {"upgradeDowngradeViewlessTimeseries"},
    timeseries_view_stream_message=False,
    router_fcv_parameter=False,
)
RELEASES: Mapping[str, Release] = MappingProxyType({r.name: r for r in (MONGODB_8_0, MONGODB_9_0)})
DEFAULT_RELEASE = MONGODB_8_0


def release_named(name: str) -> Release:
    """The profile for `[server] compatibility`; ValueError naming the choices otherwise."""
    found = RELEASES.get(name)
    if found is None:
        raise ValueError(f"unknown compatibility {name!r}: expected one of "
                         + ", ".join(repr(n) for n in RELEASES))
    return found


def release_for_upstream(version: str | None, max_wire_version: int | None) -> Release:
    """The newest profile not newer than what an upstream says it is (its buildInfo version,
    else its hello's maxWireVersion): a sidecar answers as the deployment it serves. A release
    between two profiles (8.2) gets the older one; one newer than every profile the newest."""
    by_version = sorted(RELEASES.values(), key=lambda r: r.version_array)
    if version:
        try:
            wanted = [int(x) for x in version.split("-")[0].split(".")[:2]]
        except ValueError:
            wanted = []
        if len(wanted) == 2:
            fits = [r for r in by_version if r.version_array[:2] <= wanted]
            return fits[-1] if fits else by_version[0]
    if max_wire_version is not None:
        fits = [r for r in by_version if r.max_wire_version <= max_wire_version]
        return fits[-1] if fits else by_version[0]
    return DEFAULT_RELEASE
