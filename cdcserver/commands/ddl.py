"""DDL commands of the embedded store: create, drop, renameCollection, dropDatabase,
createIndexes, dropIndexes, listIndexes, collMod, listCollections, listDatabases."""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64

from cdcserver.commands import oplog_find, queries
from cdcserver.commands.arguments import cursor_batch_size, is_string, object_arg
from cdcserver.commands.base import Handler, family
from cdcserver.commands.crud_common import coll_arg
from cdcserver.commands.fcv import feature_compatibility_version, version_key
from cdcserver.commands.queries import cursor_first_batch
from cdcserver.commands.stream_namespace import refusal, store_kind, stream_collection
from cdcserver.commands.transactions import get_store, snapshot_reads
from cdcserver.commands.writes import _run_writes
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded import engine, indexes, timeseries
from cdcserver.embedded.store import (
    ID_INDEX,
    OPTION_ORDER,
    SYSTEM_VIEWS,
    VIEW_MAX_DEPTH,
    Collection,
    Store,
    bson_string,
    ordered_options,
    validate_collection_name,
)
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import is_change_stream_aggregate
from pipeline_stages.value_string import type_name

# The catalog commands (collections, views, indexes) of the embedded store: their table (which
# modes serve them: cdcserver/deployments/).
TABLE: dict[str, Handler] = {}
command = family(TABLE)

# Options `create` accepts and stores (others are refused as unknown fields).
_CREATE_OPTIONS = {
    "capped", "size", "max", "autoIndexId", "changeStreamPreAndPostImages", "storageEngine",
    "indexOptionDefaults", "validator", "validationLevel", "validationAction", "collation",
    "expireAfterSeconds", "clusteredIndex", "temp",
}
# Generic command arguments drivers add (not options).
_GENERIC = {
    "$db", "lsid", "txnNumber", "writeConcern", "readConcern", "$clusterTime", "comment",
    "maxTimeMS", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
    "autocommit", "startTransaction", "stmtId", "$audit", "$client",
}


def _ns_not_found(ns: str) -> MongoError:
    return MongoError(26, f"ns does not exist: {ns}")


async def _exclusive_lock(
    store: Store, cmd: Mapping[str, Any], colls: Callable[[], list[Collection | None]]
) -> None:
    """Wait, as mongod's DDL waits for the collection's exclusive lock, until no open
    transaction has written or created these collections (within maxTimeMS, else 50)."""
    await _run_writes(store, cmd, lambda: store.check_ddl_lock([c for c in colls() if c]))


def _in_txn(cmd: Mapping[str, Any]) -> bool:
    return cmd.get("autocommit") is False


def _check_txn_read_concern(store: Store, name: str) -> None:
    """create and createIndexes support read concern "local" only (the default of mongod's
    CommandInvocation::supportsReadConcern); in a transaction the transaction's read concern
    counts (jstests/core/txns/commands_in_txns_read_concern.js): another level is 72
    InvalidOptions, and the error aborts the transaction."""
    txn = store.txn
    rc = txn.read_concern if txn is not None else None
    if not rc or rc.get("level", "local") == "local":
        return
    shown = ", ".join(f'{k}: "{v}"' if isinstance(v, str) else f"{k}: {v}"
                      for k, v in {**rc, "provenance": "clientSupplied"}.items())
    raise MongoError(72, f"Command {name} does not support {{ readConcern: {{ {shown} }} }} :: "
                     "caused by :: read concern not supported")


# ---------------------------------------------------------------------------------------------
# create / drop / rename / dropDatabase


def _check_pre_post(value: Any) -> None:
    if not isinstance(value, Mapping) or not isinstance(value.get("enabled"), bool):
        raise MongoError(
            40414,
            "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field",
        )


@command("create")
async def create(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "create")
    if "timeseries" in cmd and not timeseries.is_buckets(coll):
        return _create_timeseries(store, cmd, db, coll, viewless=viewless_timeseries(server))
    if "viewOn" in cmd or "pipeline" in cmd:
        if _in_txn(cmd):
            raise MongoError(263, "Cannot create a view in a multi-document transaction.")
        return _create_view(store, cmd, db, coll)
    options: dict[str, Any] = {}
    id_index: Mapping[str, Any] | None = None
    for k, v in cmd.items():
        if k == "create" or k in _GENERIC:
            continue
        if k == "encryptedFields":
            raise MongoError(2, f"'{k}' (queryable encryption) is not supported by "
                             "cdcserver's embedded store yet")
        if k == "timeseries":  # a buckets collection created as such (a restore)
            options[k] = timeseries.set_bucketing(timeseries.parse_options(v))
            continue
        if k == "idIndex":
            if not isinstance(v, Mapping):
                raise MongoError(14, "BSON field 'create.idIndex' is the wrong type "
                                 f"'{type_name(v)}', expected type 'object'")
            id_index = v  # not a collection option: it describes the _id index
            continue
        if k not in _CREATE_OPTIONS:
            raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
        if k == "changeStreamPreAndPostImages":
            _check_pre_post(v)
            v = {"enabled": v["enabled"]}
        elif k == "clusteredIndex" and isinstance(v, Mapping):
            # As ClusteredIndexSpec serializes it: version first, the name defaulted.
            v = {"v": 2, "key": v.get("key"), "name": v.get("name", "_id_"),
                 **({"unique": v["unique"]} if "unique" in v else {})}
        elif k == "expireAfterSeconds" and isinstance(v, (int, float)):
            v = Int64(v)  # CollectionOptions keeps it as a long
        options[k] = v
    if _in_txn(cmd) and coll.startswith("system."):
        raise MongoError(263, f"Cannot create system collection {db}.{coll} within a "
                         "transaction.")
    # In a transaction: the transaction's snapshot, and its create goes into its applyOps.
    with store.batch(), snapshot_reads(store, cmd):
        _check_txn_read_concern(store, "create")
        existing = store.get(db, coll)
        if existing is not None:
            if ordered_options(options) == existing.options and not _in_txn(cmd):
                return {}
            raise _exists_with_other_options(existing)  # in a transaction, always (48)
        view = store.view(db, coll)
        if view is not None:
            raise MongoError(48, f"namespace {db}.{coll} already exists, but is a view on "
                             f"{db}.{view['viewOn']} rather than {db}")
        store.create_collection(db, coll, options, id_index=id_index)
    return {}


def viewless_timeseries(server: ServerState) -> bool:
    """Whether time-series collections are viewless now: the release has an FCV from which
    they are (9.0's featureFlagCreateViewlessTimeseriesCollections) and the FCV is that one
    or later. Under the 8.0 binary, or the 9.0 one at FCV 8.0, they are viewful."""
    since = server.release.viewless_timeseries_fcv
    return since is not None and (
        version_key(feature_compatibility_version(server)) >= version_key(since))


def _create_timeseries(
    store: Store, cmd: Mapping[str, Any], db: str, coll: str, viewless: bool = False
) -> dict[str, Any]:
    """create with `timeseries` (create_command.cpp, then create_collection.cpp's
    _createTimeseries): the buckets collection `system.buckets.<coll>` (clustered, with its
    validator, the time-series options and mongod's default index on meta and time), then
    the view `<coll>` on it. A create that finds the same time-series collection answers ok.
    `viewless` (9.0 at FCV 9.0): the collection `<coll>` itself holds the buckets, clustered,
    with no validator and no view (its create entry names `<coll>`)."""
    ns = f"{db}.{coll}"
    for k in cmd:  # the IDL's unknown fields first
        if k in ("create", "timeseries", "viewOn", "pipeline", "idIndex", "encryptedFields"):
            continue
        if k not in _GENERIC and k not in _CREATE_OPTIONS:
            raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
    if "encryptedFields" in cmd:
        raise MongoError(6346401, "Encrypted fields cannot be used with views or timeseries "
                         "collections")
    ts = timeseries.parse_options(cmd["timeseries"])
    timeseries.check_create(ns, cmd, ts, _GENERIC)
    if "expireAfterSeconds" in cmd:
        _check_expire_after_seconds(cmd["expireAfterSeconds"])
    if _in_txn(cmd):
        raise MongoError(263, "Cannot create a time-series collection in a multi-document "
                         "transaction.")
    validate_collection_name(db, coll)
    ts = timeseries.set_bucketing(ts)
    collation = _full_collation(cmd.get("collation"))
    options: dict[str, Any] = {
        "clusteredIndex": True,  # the legacy form mongod keeps for buckets collections
        "validator": timeseries.bucket_validator(ts["timeField"]),
        "timeseries": ts,
    }
    if viewless:  # a viewless collection has no bucket validator (validate.cpp checks so)
        del options["validator"]
    for k in ("storageEngine", "indexOptionDefaults", "temp"):
        if k in cmd:
            options[k] = cmd[k]
    if collation is not None:
        options["collation"] = collation
    if "expireAfterSeconds" in cmd:
        options["expireAfterSeconds"] = timeseries.expire_after_seconds(
            cmd["expireAfterSeconds"])
    buckets = timeseries.buckets_name(coll)
    with store.batch():
        existing = store.get(db, coll)
        if existing is not None:
            if viewless and timeseries.is_viewless(existing) and _same_timeseries(
                existing.options, options
            ):
                return {}
            raise MongoError(48, f"Collection {ns} already exists.")
        view = store.view(db, coll)
        found = store.get(db, buckets)
        if view is not None:
            if timeseries.is_timeseries_view(view) and found is not None and _same_timeseries(
                found.options, options
            ):
                return {}
            if timeseries.is_timeseries_view(view):
                raise MongoError(48, f"A timeseries collection already exists. NS: {ns}")
            raise MongoError(48, f"A view already exists. NS: {ns}")
        if viewless:
            c = store.create_collection(db, coll, options)
            index = timeseries.default_index_spec(ts, collation)
            if index is not None:
                store.create_indexes(c, [index])
            return {}
        if found is not None:
            if not _same_timeseries(found.options, options):
                raise MongoError(48, f"Bucket Collection already exists. NS: {db}.{buckets}. "
                                 f"UUID: {uuid_module.UUID(bytes=found.uuid)}")
        else:
            found = store.create_collection(db, buckets, options)
            index = timeseries.default_index_spec(ts, collation)
            if index is not None:
                store.create_indexes(found, [index])
        store.put_view(db, coll, buckets, timeseries.view_pipeline(ts), collation)
    return {}


def _same_timeseries(existing: Mapping[str, Any], requested: Mapping[str, Any]) -> bool:
    """Whether an existing buckets collection is the one a create asks for (its time-series
    options, and the other options the create may give)."""
    if not timeseries.same_options(existing.get("timeseries") or {}, requested["timeseries"]):
        return False
    return all(existing.get(k) == requested.get(k) for k in timeseries.ALLOWED_CREATE_OPTIONS
               if k != "timeseries")


def _check_expire_after_seconds(value: Any, command: str = "create") -> None:
    """expireAfterSeconds of a clustered collection (validateExpireAfterSeconds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MongoError(14, f"BSON field '{command}.expireAfterSeconds' is the wrong type "
                         f"'{type_name(value)}', expected types '[long, int, decimal, double]'")
    if value < 0:
        raise MongoError(72, "TTL index 'expireAfterSeconds' option cannot be less than 0")


def _exists_with_other_options(existing: Collection) -> MongoError:
    # Kept as this store has answered so far (tests/embedded/test_embedded.py); mongod 8.0's
    # checkCollectionOptions says "namespace D.C already exists, but with different options:".
    return MongoError(48, f"Collection {existing.ns} already exists.")


# ---------------------------------------------------------------------------------------------
# Views (mongod's create_collection.cpp _createView, views/view_graph.cpp, views/util.cpp)

# Aggregation stages mongod 8.0 knows (a view's pipeline is parsed, so an unknown one is 40324).
_STAGES = {
    "$addFields", "$bucket", "$bucketAuto", "$changeStream", "$changeStreamSplitLargeEvent",
    "$collStats", "$count", "$currentOp", "$densify", "$documents", "$facet", "$fill",
    "$geoNear", "$graphLookup", "$group", "$indexStats", "$limit", "$listLocalSessions",
    "$listSampledQueries", "$listSearchIndexes", "$listSessions", "$lookup", "$match", "$merge",
    "$out", "$planCacheStats", "$project", "$querySettings", "$redact", "$replaceRoot",
    "$replaceWith", "$sample", "$search", "$searchMeta", "$set", "$setWindowFields",
    "$shardedDataDistribution", "$skip", "$sort", "$sortByCount", "$unionWith", "$unset",
    "$unwind", "$vectorSearch", "$_internalUnpackBucket",
}
# Stages whose DocumentSource writes (constraints().writesPersistentData()).
_WRITING_STAGES = ("$out", "$merge")
# Stages that read no collection (constraints().isIndependentOfAnyCollection).
_COLLECTIONLESS_STAGES = (
    "$currentOp", "$documents", "$listLocalSessions", "$listSessions", "$querySettings",
    "$shardedDataDistribution",
)
# ICU collation defaults mongod fills in (CollationSpec::toBSON) for a locale's default options.
_COLLATION_DEFAULTS = {
    "caseLevel": False, "caseFirst": "off", "strength": 3, "numericOrdering": False,
    "alternate": "non-ignorable", "maxVariable": "punct", "normalization": False,
    "backwards": False, "version": "57.1",
}


def _view_argument_errors(cmd: Mapping[str, Any], name: str) -> None:
    """The IDL type checks of `viewOn` / `pipeline` in create and collMod."""
    if "viewOn" in cmd and not isinstance(cmd["viewOn"], str):
        raise MongoError(14, f"BSON field '{name}.viewOn' is the wrong type "
                         f"'{type_name(cmd['viewOn'])}', expected type 'string'")
    if "pipeline" in cmd and not isinstance(cmd["pipeline"], list):
        raise MongoError(14, f"BSON field '{name}.pipeline' is the wrong type "
                         f"'{type_name(cmd['pipeline'])}', expected type 'array'")
    if cmd.get("viewOn") == "":
        raise MongoError(2, "'viewOn' cannot be empty")


def _involved_namespaces(pipeline: list[Any]) -> list[str]:
    """Collections a pipeline reads besides its own (LiteParsedPipeline's involved
    namespaces): `$lookup` / `$graphLookup` `from`, `$unionWith`, and those of sub-pipelines."""
    out: list[str] = []
    for stage in pipeline:
        if not isinstance(stage, Mapping) or not stage:
            continue
        name, arg = next(iter(stage.items()))
        if name in ("$lookup", "$graphLookup") and isinstance(arg, Mapping):
            if isinstance(arg.get("from"), str):
                out.append(arg["from"])
            if isinstance(arg.get("pipeline"), list):
                out.extend(_involved_namespaces(arg["pipeline"]))
        elif name == "$unionWith":
            if isinstance(arg, str):
                out.append(arg)
            elif isinstance(arg, Mapping):
                if isinstance(arg.get("coll"), str):
                    out.append(arg["coll"])
                if isinstance(arg.get("pipeline"), list):
                    out.extend(_involved_namespaces(arg["pipeline"]))
        elif name == "$facet" and isinstance(arg, Mapping):
            for sub in arg.values():
                if isinstance(sub, list):
                    out.extend(_involved_namespaces(sub))
    return out


def _validate_view_pipeline(db: str, name: str, pipeline: list[Any]) -> None:
    """view_catalog_helpers::validatePipeline: the pipeline parses, and holds no stage that
    writes, no `$changeStream` and no collection-less stage."""
    for stage in pipeline:
        if not isinstance(stage, Mapping):
            raise MongoError(14, "Each element of the 'pipeline' array must be an object")
        if len(stage) != 1:
            raise MongoError(40323, "A pipeline stage specification object must contain "
                             "exactly one field.")
        stage_name = next(iter(stage))
        if stage_name not in _STAGES:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{stage_name}'")
    context = f"Invalid pipeline for view {db}.{name} :: caused by :: "
    for i, stage in enumerate(pipeline):
        stage_name = next(iter(stage))
        if stage_name in _WRITING_STAGES:
            raise MongoError(167, f"{context}The aggregation stage {stage_name} in location {i} "
                             f"of the pipeline cannot be used in the view definition of "
                             f"{db}.{name} because it writes to disk")
    if pipeline and next(iter(pipeline[0])) == "$changeStream":
        raise MongoError(167, f"{context}$changeStream cannot be used in a view definition")
    for stage in pipeline:
        stage_name = next(iter(stage))
        if stage_name in _COLLECTIONLESS_STAGES:
            raise MongoError(73, f"{context}'{stage_name}' cannot be used in a view definition")


def _validate_view_graph(
    store: Store, db: str, name: str, view_on: str, pipeline: list[Any]
) -> None:
    """ViewGraph::insertAndValidate: no cycle through the new definition (5
    GraphContainsCycle, with mongod's path), and no chain of views deeper than 20."""

    def refs(view: str) -> list[str]:
        if view == name:
            return [*_involved_namespaces(pipeline), view_on]
        definition = store.view(db, view)
        if definition is None:
            return []
        return [*_involved_namespaces(definition.get("pipeline", [])), definition["viewOn"]]

    path: list[str] = [name]
    heights: dict[str, int] = {}

    def children_height(node: str, depth: int) -> int:
        if depth > VIEW_MAX_DEPTH:
            raise MongoError(165, "View depth limit exceeded; maximum depth is "
                             f"{VIEW_MAX_DEPTH}")
        best = 0
        for child in refs(node):
            if child == name:
                trail = [*path, child]
                raise MongoError(5, "View cycle detected: " + f"{db}.{trail[-1]}" + "".join(
                    f" => {db}.{n}" for n in reversed(trail)))
            if child not in heights:
                path.append(child)
                heights[child] = children_height(child, depth + 1)
                path.pop()
            best = max(best, heights[child])
        return best + 1

    below = children_height(name, 0) - 1

    def parents_height(node: str, depth: int) -> int:
        if depth > VIEW_MAX_DEPTH:
            raise MongoError(165, "View depth limit exceeded; maximum depth is "
                             f"{VIEW_MAX_DEPTH}")
        best = 0
        for view in store.views_of(db):
            view_name = view["_id"][len(db) + 1:]
            if view_name != name and node in refs(view_name):
                best = max(best, parents_height(view_name, depth + 1))
        return best + 1

    if parents_height(name, 0) + below - 1 > VIEW_MAX_DEPTH:
        raise MongoError(165, f"View depth limit exceeded; maximum depth is {VIEW_MAX_DEPTH}")


def _full_collation(collation: Any) -> dict[str, Any] | None:
    """The collation a view stores: none for `simple`, else the spec with ICU's defaults."""
    if collation is None:
        return None
    if not isinstance(collation, Mapping):
        raise MongoError(14, "BSON field 'create.collation' is the wrong type "
                         f"'{type_name(collation)}', expected type 'object'")
    if not isinstance(collation.get("locale"), str):
        raise MongoError(40414, "BSON field 'locale' is missing but a required field")
    if collation["locale"] == "simple":
        return None
    return {"locale": collation["locale"],
            **{k: collation.get(k, v) for k, v in _COLLATION_DEFAULTS.items()}}


def _pipeline_string(pipeline: list[Any]) -> str:
    """A pipeline as mongod prints the BSON array (an object keyed "0", "1", ...)."""
    return bson_string({str(i): stage for i, stage in enumerate(pipeline)})


def _create_view(store: Store, cmd: Mapping[str, Any], db: str, coll: str) -> dict[str, Any]:
    _view_argument_errors(cmd, "create")
    if "viewOn" not in cmd:
        raise MongoError(72, "'pipeline' requires 'viewOn' to also be specified")
    for k in cmd:
        if k in ("create", "viewOn", "pipeline") or k in _GENERIC:
            continue
        if k == "idIndex":
            raise MongoError(72, "'idIndex' is not allowed with 'viewOn': "
                             + bson_string(cmd[k]))
        if k == "clusteredIndex":
            raise MongoError(6026500, "The 'clusteredIndex' option is not supported with views")
        if k not in _CREATE_OPTIONS:
            raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
    view_on: str = cmd["viewOn"]
    pipeline = [dict(s) if isinstance(s, Mapping) else s for s in cmd.get("pipeline") or []]
    collation = _full_collation(cmd.get("collation"))
    if coll == SYSTEM_VIEWS:
        raise MongoError(73, f"Cannot create a view called '{coll}': this is a reserved system "
                         "namespace")
    with store.batch():
        existing = store.get(db, coll)
        if existing is not None:
            raise _exists_with_other_options(existing)
        view = store.view(db, coll)
        if view is not None:
            if view["viewOn"] != view_on:
                raise MongoError(48, f"namespace {db}.{coll} already exists, but is a view on "
                                 f"{db}.{view['viewOn']} rather than {db}.{view_on}")
            old_pipeline = view.get("pipeline", [])
            if bson_bytes.encode({"p": old_pipeline}) != bson_bytes.encode({"p": pipeline}):
                raise MongoError(48, f"namespace {db}.{coll} already exists, but with pipeline "
                                 f"{_pipeline_string(view.get('pipeline', []))} rather than "
                                 f"{_pipeline_string(pipeline)}")
            if view.get("collation") != collation:
                raise MongoError(48, f"namespace {db}.{coll} already exists, but with "
                                 f"collation: {bson_string(view.get('collation') or {})} "
                                 f"rather than {bson_string(cmd.get('collation') or {})}")
            return {}
        pre_post = cmd.get("changeStreamPreAndPostImages")
        if pre_post is not None:
            _check_pre_post(pre_post)
            if pre_post["enabled"]:
                raise MongoError(72, "option not supported on a view: "
                                 "changeStreamPreAndPostImages")
        if timeseries.is_buckets(view_on):
            raise MongoError(73, "Cannot create view on a system.buckets namespace except by "
                             "creating a time-series collection")
        validate_collection_name(db, coll)
        _validate_view_pipeline(db, coll, pipeline)
        _validate_view_graph(store, db, coll, view_on, pipeline)
        _check_collation_matches(store, db, coll, view_on, pipeline, collation)
        store.put_view(db, coll, view_on, pipeline, collation)
    return {}


def _check_collation_matches(
    store: Store, db: str, name: str, view_on: str, pipeline: list[Any],
    collation: dict[str, Any] | None,
) -> None:
    """ViewsForDatabase::_validateCollation: a view reads only views of its own collation."""
    for ref in [*_involved_namespaces(pipeline), view_on]:
        other = store.view(db, ref)
        if other is not None and other.get("collation") != collation:
            raise MongoError(167, f"View {db}.{name} has conflicting collation with view "
                             f"{db}.{ref}")


@command("drop")
async def drop(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "drop")
    await _exclusive_lock(store, cmd, lambda: [store.get(db, coll)])
    with store.batch():
        view = store.view(db, coll) if store.get(db, coll) is None else None
        if view is not None and timeseries.is_timeseries_view(view):
            return _drop_timeseries(store, db, coll, view["viewOn"])
        c = store.drop_collection(db, coll)
        if c is None and store.drop_view(db, coll):
            return {"ns": f"{db}.{coll}"}  # mongod's _dropView: no nIndexesWas
    if c is None:
        return {}
    if timeseries.is_viewless(c):  # answered as the viewful one's drop (_drop_timeseries)
        timeseries.forget(c.uuid)
        return {"nIndexesWas": len(_secondary_indexes(c)), "ns": f"{db}.{coll}"}
    return {"nIndexesWas": len(c.indexes), "ns": f"{db}.{coll}"}


def _drop_timeseries(store: Store, db: str, coll: str, buckets: str) -> dict[str, Any]:
    """drop of a time-series collection (drop_collection.cpp): its view, then its buckets
    collection; nIndexesWas counts the buckets collection's indexes (not its clustered one)."""
    store.drop_view(db, coll)
    c = store.drop_collection(db, buckets)
    if c is None:
        return {"ns": f"{db}.{coll}"}
    timeseries.forget(c.uuid)
    return {"nIndexesWas": len(_secondary_indexes(c)), "ns": f"{db}.{coll}"}


def _secondary_indexes(c: Collection) -> list[dict[str, Any]]:
    """The index catalog of `c`: a clustered collection's _id placeholder left out (its
    clustered index is an option, not an index)."""
    if "clusteredIndex" not in c.options:
        return list(c.indexes)
    return [s for i, s in enumerate(c.indexes)
            if not (i == 0 and s.get("name") == "_id_" and dict(s["key"]) == {"_id": 1})]


def clustered_index_spec(c: Collection) -> dict[str, Any] | None:
    """A clustered collection's index as listIndexes shows it
    (clustered_util::formatClusterKeyForListIndexes): its spec (the legacy `true` form: `_id`,
    named "_id_", unique), the collection's collation, expireAfterSeconds, `clustered: true`."""
    option = c.options.get("clusteredIndex")
    if not option:
        return None
    if isinstance(option, Mapping):
        spec = {k: option[k] for k in ("v", "key", "name", "unique") if k in option}
    else:
        spec = {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True}
    collation = c.options.get("collation")
    if isinstance(collation, Mapping) and collation.get("locale") != "simple":
        spec["collation"] = dict(collation)
    if "expireAfterSeconds" in c.options:
        spec["expireAfterSeconds"] = c.options["expireAfterSeconds"]
    spec["clustered"] = True
    return spec


@command("dropDatabase")
async def drop_database(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    if db in ("admin", "config", "local"):
        raise MongoError(20, f"Cannot drop '{db}' database while replication is active")
    await _exclusive_lock(store, cmd, lambda: list(store.collections_of(db)))
    with store.batch():
        dropped = store.drop_database(db)
    return {"dropped": db} if dropped else {}


def _namespace_arg(cmd: Mapping[str, Any], name: str) -> str:
    value = cmd.get(name)
    if not isinstance(value, str) or not is_string(value):  # (is_string: not Code either)
        raise MongoError(
            14, f"BSON field 'renameCollection.{name}' is the wrong type "
            f"'{type_name(value)}', expected type 'string'",
        )
    return value


@command("renameCollection")
async def rename_collection(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    if db != "admin":
        raise MongoError(13, "renameCollection may only be run against the admin database.")
    source = _namespace_arg(cmd, "renameCollection")
    target = _namespace_arg(cmd, "to")
    src_db, _, src_coll = source.partition(".")
    to_db, _, to_coll = target.partition(".")
    if not src_coll:
        raise MongoError(73, f"Invalid source namespace: {source}")
    if not to_coll:
        raise MongoError(73, f"Invalid target namespace: {target}")
    # (rename_collection.cpp's namespace check, before it looks the collections up; 8.0 still
    # renames system.js: jstests/change_streams/show_system_events.js)
    if "system.views" in (src_coll, to_coll):
        raise MongoError(20, "renaming system.views collection or renaming to system.views is "
                         "not allowed")
    drop_target = cmd.get("dropTarget") is True
    await _exclusive_lock(
        store, cmd, lambda: [store.get(src_db, src_coll), store.get(to_db, to_coll)]
    )
    with store.batch():
        src = store.get(src_db, src_coll)
        if src is None:
            if store.view(src_db, src_coll) is not None:
                raise MongoError(166, f"cannot rename view: {source}")
            raise MongoError(26, f"Source collection {source} does not exist")
        if source == target:
            raise MongoError(20, "Can't rename a collection to itself")
        if store.get(to_db, to_coll) is not None and not drop_target:
            raise MongoError(48, "Target namespace exists")
        if store.view(to_db, to_coll) is not None:
            raise MongoError(48, f"a view already exists with that name: {target}")
        store.rename_collection(src, to_db, to_coll, drop_target)
    return {}


# ---------------------------------------------------------------------------------------------
# Indexes


def index_name(key: Mapping[str, Any]) -> str:
    return "_".join(f"{k}_{v}" for k, v in key.items())


def _spec_string(spec: Mapping[str, Any]) -> str:
    return bson_string(spec)


_INDEX_OPTIONS = {
    "unique", "sparse", "partialFilterExpression", "expireAfterSeconds", "hidden", "collation",
    "background", "prepareUnique", "weights", "default_language", "language_override",
    "textIndexVersion", "2dsphereIndexVersion", "bits", "min", "max", "wildcardProjection",
    "storageEngine", "bucketSize", "ns",
}


def normalize_index_spec(raw: Any) -> dict[str, Any]:
    """The spec as mongod stores and logs it (IndexCatalogImpl::_fixIndexSpec): `v`, then
    `unique` / `hidden` / `prepareUnique` when true, `key`, `name`, then every other field in
    the order given."""
    if not isinstance(raw, Mapping):
        raise MongoError(14, "BSON field 'createIndexes.indexes' element is not an object")
    key = raw.get("key")
    if not isinstance(key, Mapping) or not key:
        raise MongoError(67 if isinstance(key, Mapping) else 9,
                         "Index keys cannot be an empty field." if isinstance(key, Mapping)
                         else "The 'key' field is a required property of an index specification")
    name = raw.get("name")
    if not is_string(name) or not name:
        raise MongoError(9, "The 'name' field is a required property of an index specification")
    for k in raw:
        if k not in ("key", "name", "v", "_id", "dropDups") and k not in _INDEX_OPTIONS:
            raise MongoError(
                197, f"The field '{k}' is not valid for an index specification. "
                f"Specification: {_spec_string(raw)}",
            )
    if name == "_id_" and (list(key) != ["_id"]):
        raise MongoError(197, "The index name '_id_' is reserved for the _id index")
    if "partialFilterExpression" in raw:  # index_key_validate, then the match parser's errors
        pfe = raw["partialFilterExpression"]
        if not isinstance(pfe, Mapping):
            raise MongoError(14, "The field 'partialFilterExpression' must be an object, but "
                             f"got {type_name(pfe)}")
        engine.validate_filter(pfe)
    spec: dict[str, Any] = {"v": 2}
    for flag in ("unique", "hidden", "prepareUnique"):
        if raw.get(flag):
            spec[flag] = True
    spec["key"] = dict(key)
    spec["name"] = name
    for k, v in raw.items():
        if k in ("_id", "dropDups", "ns", "unique", "key", "v", "name", "hidden",
                 "prepareUnique"):
            continue
        spec[k] = dict(v) if isinstance(v, Mapping) else v
    if "text" in spec["key"].values():
        _fix_text_spec(spec)
    return spec


_TEXT_OPTIONS = ("weights", "default_language", "language_override", "textIndexVersion")


def _fix_text_spec(spec: dict[str, Any]) -> None:
    """A text index as FTSSpec::fixSpec stores it: its text fields become `_fts: "text",
    _ftsx: 1` in the key (other fields keep their place), and the text options follow the
    spec's other fields with their defaults (each text field weighing 1)."""
    key: dict[str, Any] = {}
    weights: dict[str, Any] = {}
    for field_name, kind in spec["key"].items():
        if kind == "text":
            weights[field_name] = 1
            if "_fts" not in key:
                key["_fts"], key["_ftsx"] = "text", 1
        else:
            key[field_name] = kind
    spec["key"] = key
    given = {k: spec.pop(k) for k in _TEXT_OPTIONS if k in spec}
    spec["weights"] = given.get("weights", weights)
    spec["default_language"] = given.get("default_language", "english")
    spec["language_override"] = given.get("language_override", "language")
    spec["textIndexVersion"] = given.get("textIndexVersion", 3)


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in spec.items() if k not in ("v", "name", "background", "hidden")}
    out["key"] = list(spec["key"].items())  # a key pattern's field order counts
    return out


def _index_collation(spec: Mapping[str, Any]) -> Any:
    """An index's collation as indexes compare it: None for the simple one, else the spec
    with ICU's defaults (`{locale: "en_US"}` is the same collation written out in full)."""
    collation = spec.get("collation")
    if not isinstance(collation, Mapping) or collation.get("locale") in (None, "simple"):
        return None
    return {"locale": collation["locale"],
            **{k: collation.get(k, v) for k, v in _COLLATION_DEFAULTS.items()}}


def _collation_defaults(spec: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """CollectionImpl::addCollationDefaultsToIndexSpecsForCreate: the simple collation is
    stored as none, and an index given none takes the collection's default collation."""
    collation = spec.get("collation")
    if isinstance(collation, Mapping) and collation.get("locale") == "simple":
        return {k: v for k, v in spec.items() if k != "collation"}
    default = options.get("collation")
    if ("collation" not in spec and isinstance(default, Mapping)
            and default.get("locale") not in (None, "simple")):
        return {**spec, "collation": dict(default)}
    return spec


def _same_index(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """IndexDescriptor's identity: the same key pattern (fields in the same order) and the
    same collation; `{a: 1, b: 1}` and `{b: 1, a: 1}` are two indexes, and so are `{a: 1}`
    with a collation and without."""
    return (list(a["key"].items()) == list(b["key"].items())
            and _index_collation(a) == _index_collation(b))


@command("createIndexes")
async def create_indexes(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "createIndexes")
    raw = cmd.get("indexes")
    if not isinstance(raw, list):
        raise MongoError(40414 if raw is None else 14,
                         "BSON field 'createIndexes.indexes' is missing but a required field"
                         if raw is None else
                         f"BSON field 'createIndexes.indexes' is the wrong type "
                         f"'{type_name(raw)}', expected type 'array'")
    if not raw:
        raise MongoError(2, "Must specify at least one index to create")
    specs = [normalize_index_spec(r) for r in raw]
    for given, spec in zip(raw, specs, strict=True):  # before the collection is created
        indexes.check_index_spec(spec, given)
    in_txn = _in_txn(cmd)
    with store.batch(), snapshot_reads(store, cmd):
        _check_txn_read_concern(store, "createIndexes")
        c = store.get(db, coll)
        created = c is None
        # mongod builds indexes in a transaction only on a collection the transaction creates
        # (runCreateIndexesOnNewCollection), and only while it is empty.
        new_in_txn = in_txn and (c is None or c.created_by is store.txn)
        if c is None:
            store.check_not_view(db, coll)
            c = store.create_collection(db, coll)
        before = len(c.indexes)
        new: list[dict[str, Any]] = []
        for spec in [_collation_defaults(spec, c.options) for spec in specs]:
            if dict(spec["key"]) == {"_id": 1} and spec["name"] != "_id_":
                # mongod corrects an _id index's name to "_id_" (createIndex({_id: 1}) is
                # "all indexes already exist", as the jstests' createShardedCollection needs)
                spec = {**spec, "name": "_id_"}
            same_name = c.index(spec["name"]) or next(
                (s for s in new if s["name"] == spec["name"]), None
            )
            same_key = next((s for s in [*c.indexes, *new] if _same_index(s, spec)), None)
            if same_name is not None:
                if _comparable(same_name) == _comparable(spec):
                    continue
                if list(same_name["key"].items()) != list(spec["key"].items()):
                    raise MongoError(
                        86,
                        "An existing index has the same name as the requested index. When index "
                        "names are not specified, they are auto generated and can cause "
                        "conflicts. Please refer to our documentation. Requested index: "
                        f"{_spec_string(spec)}, existing index: {_spec_string(same_name)}",
                    )
                raise MongoError(
                    85,
                    f"An existing index has the same name as the requested index. Requested "
                    f"index: {_spec_string(spec)}, existing index: {_spec_string(same_name)}",
                )
            if same_key is not None and _comparable(same_key) == _comparable(spec):
                raise MongoError(
                    85,
                    "Index already exists with a different name: " + same_key["name"],
                )
            new.append(spec)
        if new and in_txn:
            if not new_in_txn:
                raise MongoError(263, f"Cannot create new indexes on existing collection "
                                 f"{db}.{coll} in a multi-document transaction.")
            if store.documents(c):
                raise MongoError(263, f"Cannot create new indexes on non-empty collection "
                                 f"{db}.{coll} in a multi-document transaction.")
            created = True  # mongod answers so for a collection the transaction created
        if new:
            store.create_indexes(c, new)
    reply: dict[str, Any] = {
        "numIndexesBefore": before,
        "numIndexesAfter": len(c.indexes),
    }
    if not new:
        reply["note"] = "all indexes already exist"
    else:
        reply["createdCollectionAutomatically"] = created
    reply["commitQuorum"] = "votingMembers"
    return reply


@command("dropIndexes", "deleteIndexes")
async def drop_indexes(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    name = next(iter(cmd))
    coll = coll_arg(cmd, name)
    which = cmd.get("index")
    await _exclusive_lock(store, cmd, lambda: [store.get(db, coll)])
    with store.batch():
        c = store.get(db, coll)
        if c is None:
            store.check_not_view(db, coll)
            raise _ns_not_found(f"{db}.{coll}")
        was = len(c.indexes)
        names: list[str]
        # "*", or a list whose first name is "*" (dropReadyIndexes looks only at the front):
        # every index but _id.
        wildcard = which == "*" or (isinstance(which, list) and which[:1] == ["*"])
        if wildcard:
            names = [s["name"] for s in c.indexes if s["name"] != "_id_"]
        elif isinstance(which, str):
            names = [which]
        elif isinstance(which, list):
            names = [str(n) for n in which]
        elif isinstance(which, Mapping):
            found = [s for s in c.indexes if dict(s["key"]) == dict(which)]
            if not found:
                raise MongoError(27, f"can't find index with key: {bson_string(dict(which))}")
            if len(found) > 1:
                raise MongoError(
                    27 if False else 2,
                    f"{len(found)} indexes found for key: {bson_string(dict(which))}, identify "
                    "by name instead. Conflicting indexes: "
                    + ", ".join(_spec_string(s) for s in found),
                )
            names = [found[0]["name"]]
        else:
            raise MongoError(40414, "BSON field 'dropIndexes.index' is missing but a required "
                             "field")
        for n in names:
            if n == "_id_":
                raise MongoError(72, "cannot drop _id index")
            if c.index(n) is None:
                raise MongoError(27, f"index not found with name [{n}]")
        for n in names:
            store.drop_index(c, n)
    if wildcard:
        return {"nIndexesWas": was, "msg": "non-_id indexes dropped for collection"}
    return {"nIndexesWas": was}


@command("listIndexes")
async def list_indexes(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "listIndexes")
    batch_size = cursor_batch_size(cmd, "listIndexes")  # parsed (IDL) before the lookup
    c = store.get(db, coll)
    if c is None:
        view = store.view(db, coll)
        if timeseries.is_timeseries_view(view):
            assert view is not None
            return cursor_first_batch(server, f"{db}.$cmd.listIndexes.{coll}",
                                      _timeseries_indexes(store, db, view), batch_size)
        store.check_not_view(db, coll)
        raise _ns_not_found(f"{db}.{coll}")
    if timeseries.is_viewless(c) and cmd.get("rawData") is not True:
        # 9.0's viewless collection lists as its view did: indexes on the measurements
        return cursor_first_batch(server, f"{db}.$cmd.listIndexes.{coll}",
                                  _measurement_indexes(c), batch_size)
    specs = [dict(s) for s in _secondary_indexes(c)]
    clustered = clustered_index_spec(c)
    if clustered is not None:  # listed first (list_indexes.cpp)
        specs.insert(0, clustered)
    return cursor_first_batch(server, f"{db}.$cmd.listIndexes.{coll}", specs, batch_size)


def _timeseries_indexes(store: Store, db: str, view: Mapping[str, Any]) -> list[Any]:
    """listIndexes of a time-series collection: its buckets collection's indexes as indexes on
    the measurements (timeseries::createTimeseriesIndexesFromBucketsIndexes); 26 when the
    buckets collection is gone."""
    c = store.get(db, view["viewOn"])
    if c is None:
        raise _ns_not_found(str(view["_id"]))
    return _measurement_indexes(c)


def _measurement_indexes(c: Collection) -> list[Any]:
    """A collection of buckets' indexes as indexes on its measurements."""
    options = c.options.get("timeseries") or {}
    out = []
    for spec in _secondary_indexes(c):
        shown = timeseries.user_index_spec(spec, options)
        if shown is not None:
            out.append(shown)
    return out


# ---------------------------------------------------------------------------------------------
# collMod


_COLLMOD_OPTIONS = {
    "changeStreamPreAndPostImages", "validator", "validationLevel", "validationAction",
    "expireAfterSeconds", "index", "collation",
}


def _find_index(c: Collection, spec: Mapping[str, Any]) -> dict[str, Any]:
    if "name" in spec:
        found = c.index(spec["name"])
        if found is None:
            raise MongoError(27, f"cannot find index {spec['name']} for ns {c.ns}")
        return found
    if "keyPattern" in spec:
        key = dict(object_arg(spec, "keyPattern", "collMod.index") or {})
        found = next((s for s in c.indexes if dict(s["key"]) == key), None)
        if found is None:
            raise MongoError(27, f"cannot find index {bson_string(key)} for ns {c.ns}")
        return found
    raise MongoError(2, "must specify either index name or key pattern")


@command("collMod")
async def coll_mod(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "collMod")
    _view_argument_errors(cmd, "collMod")
    await _exclusive_lock(store, cmd, lambda: [store.get(db, coll)])
    with store.batch():
        c = store.get(db, coll)
        if c is not None and timeseries.is_viewless(c) and cmd.get("rawData") is not True:
            return _coll_mod_timeseries(store, cmd, db, coll, None)
        if c is None:
            if store.view(db, coll) is not None:
                view = store.view(db, coll)
                if timeseries.is_timeseries_view(view):
                    assert view is not None
                    return _coll_mod_timeseries(store, cmd, db, coll, view)
                return _coll_mod_view(store, cmd, db, coll)
            raise _ns_not_found(f"{db}.{coll}")
        for k in ("pipeline", "viewOn"):
            if k in cmd:
                raise MongoError(72, f"option only supported on a view: {k}")
        o: dict[str, Any] = {"collMod": coll}
        new_options: dict[str, Any] = {}
        index_change = None
        reply: dict[str, Any] = {}
        for k, v in cmd.items():
            if k == "collMod" or k in _GENERIC:
                continue
            if k == "timeseries":
                raise MongoError(72, "option only supported on a time-series collection: "
                                 "timeseries")
            if k not in _COLLMOD_OPTIONS:
                raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
            if k == "index":
                if not isinstance(v, Mapping):
                    raise MongoError(14, "BSON field 'collMod.index' is the wrong type")
                spec = _find_index(c, v)
                changes = {f: v[f] for f in v if f not in ("name", "keyPattern")}
                if not changes:
                    raise MongoError(
                        2, "no expireAfterSeconds, hidden, unique, or prepareUnique field"
                    )
                old: dict[str, Any] = {}
                for f, value in changes.items():
                    if f in ("hidden", "prepareUnique", "unique"):
                        old[f] = bool(spec.get(f, False))
                        reply[f"{f}_old"] = old[f]
                        reply[f"{f}_new"] = value
                    elif f == "expireAfterSeconds":
                        if "expireAfterSeconds" in spec:
                            old[f] = spec[f]
                            reply["expireAfterSeconds_old"] = spec[f]
                        reply["expireAfterSeconds_new"] = value
                    else:
                        raise MongoError(40415, f"BSON field 'collMod.index.{f}' is an unknown "
                                         "field.")
                index_change = (spec["name"], changes, old)
                o["index"] = {"name": spec["name"], **changes}
                continue
            if k == "changeStreamPreAndPostImages":
                _check_pre_post(v)
                v = {"enabled": v["enabled"]}
            new_options[k] = v
            o[k] = v
        if "validator" in new_options:
            # A collection given a validator keeps the default level and action as options
            # (listCollections and the next modify event's stateBeforeChange show them).
            for k, default in (("validationLevel", "strict"), ("validationAction", "error")):
                if k not in new_options and k not in c.options:
                    new_options[k] = default
        store.coll_mod(c, o, new_options, index_change)
    return reply


def _coll_mod_timeseries(
    store: Store, cmd: Mapping[str, Any], db: str, coll: str, view: Mapping[str, Any] | None
) -> dict[str, Any]:
    """collMod of a time-series collection (processCollModCommandWithTimeSeriesTranslation):
    `timeseries` (granularity, custom bucketing) and `expireAfterSeconds` go to the buckets
    collection's collMod; when the bucketing changes, the view's pipeline is redefined first.
    `view` None: a viewless collection (9.0), its own collMod, no view to redefine."""
    buckets = store.get(db, coll if view is None else str(view["viewOn"]))
    if buckets is None:
        raise _ns_not_found(f"{db}.{coll}")
    current = buckets.options.get("timeseries") or {}
    o: dict[str, Any] = {"collMod": buckets.name}
    new_options: dict[str, Any] = {}
    new_ts: dict[str, Any] | None = None
    for k, v in cmd.items():
        if k == "collMod" or k in _GENERIC:
            continue
        if k == "timeseries":
            mod = timeseries.parse_coll_mod(v)
            o[k] = mod
            options, changed = timeseries.apply_coll_mod(current, mod)
            if changed:
                new_ts = options
        elif k == "expireAfterSeconds":
            if v != "off":
                _check_expire_after_seconds(v, "collMod")
            o[k] = v
            new_options[k] = None if v == "off" else timeseries.expire_after_seconds(v)
        elif k in _COLLMOD_OPTIONS or k in ("viewOn", "pipeline"):
            raise MongoError(72, f"option not supported on a time-series collection by "
                             f"cdcserver's embedded store: {k}")
        else:
            raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
    if new_ts is not None:
        if view is not None:
            store.put_view(db, coll, buckets.name, timeseries.view_pipeline(new_ts),
                           view.get("collation"))
        new_options["timeseries"] = new_ts
    if len(o) > 1:
        store.coll_mod(buckets, o, new_options, None)
    return {}


def _coll_mod_view(store: Store, cmd: Mapping[str, Any], db: str, coll: str) -> dict[str, Any]:
    """collMod of a view: `viewOn` and `pipeline` each replace their half of the definition,
    written as a replacement of its `system.views` document (no collMod entry: mongod's
    coll_mod.cpp modifies the view catalog only)."""
    for k in cmd:
        if k in ("collMod", "viewOn", "pipeline") or k in _GENERIC:
            continue
        if k not in _COLLMOD_OPTIONS:
            raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
        raise MongoError(72, f"option not supported on a view: {k}")
    view = store.view(db, coll)
    assert view is not None
    if "viewOn" not in cmd and "pipeline" not in cmd:
        return {}
    view_on = cmd.get("viewOn", view["viewOn"])
    pipeline = [dict(s) if isinstance(s, Mapping) else s
                for s in cmd.get("pipeline", view.get("pipeline", []))]
    _validate_view_pipeline(db, coll, pipeline)
    _validate_view_graph(store, db, coll, view_on, pipeline)
    _check_collation_matches(store, db, coll, view_on, pipeline, view.get("collation"))
    store.put_view(db, coll, view_on, pipeline, view.get("collation"))
    return {}


# ---------------------------------------------------------------------------------------------
# listCollections / listDatabases


def collection_info(c: Collection, raw_data: bool = False) -> dict[str, Any]:
    """A collection as listCollections shows it; a viewless time-series one (9.0) as
    buildCollectionBson does: type "timeseries" and its creation options only, unless the
    command asks `rawData` (then as the collection of buckets it is)."""
    as_timeseries = not raw_data and timeseries.is_viewless(c)
    info = {
        "name": c.name,
        "type": "timeseries" if as_timeseries else "collection",
        "options": (timeseries.listing_options(c.options, OPTION_ORDER) if as_timeseries
                    else dict(c.options)),
        "info": {"readOnly": False, "uuid": Binary(c.uuid, 4)},
    }
    if "clusteredIndex" not in c.options:  # a clustered collection has no _id index
        id_index = next((i for i in c.indexes if i.get("name") == "_id_"), ID_INDEX)
        info["idIndex"] = dict(id_index)
    return info


def view_info(view: Mapping[str, Any], store: Store | None = None) -> dict[str, Any]:
    """A view as listCollections shows it: its definition, read-only, no uuid, no idIndex; a
    time-series collection's (type "timeseries", its buckets collection's creation options,
    not read-only: list_collections.cpp's buildTimeseriesBson)."""
    db, _, name = str(view["_id"]).partition(".")
    if store is not None and timeseries.is_timeseries_view(view):
        buckets = store.get(db, str(view["viewOn"]))
        options = timeseries.listing_options(buckets.options, OPTION_ORDER) if buckets else {}
        return {"name": name, "type": "timeseries", "options": options,
                "info": {"readOnly": False}}
    options = {k: view[k] for k in ("viewOn", "pipeline", "collation") if k in view}
    return {"name": name, "type": "view", "options": options, "info": {"readOnly": True}}


@command("aggregate")
async def aggregate_refusing_views(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The embedded store's aggregate: a change stream on a view (or, without rawData, on a
    viewless time-series collection) is refused as mongod refuses it when it takes the
    collection (stream_namespace.py), before any of the stream's own work; then
    queries.aggregate."""
    target = stream_collection(cmd)
    if target is not None and is_change_stream_aggregate(cmd):
        kind = store_kind(get_store(server), db, target)
        error = refusal(kind, db, target, server.release, cmd.get("rawData") is True)
        if error is not None:
            raise error
    return await queries.aggregate(server, conn, cmd, db)


@command("listCollections")
async def list_collections(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The store's collections and views (a recorded oplog's: handshake.py)."""
    store = get_store(server)
    filter_doc = object_arg(cmd, "filter", "listCollections") or {}
    name_only = cmd.get("nameOnly") is True
    out = []
    raw_data = cmd.get("rawData") is True
    infos = [collection_info(c, raw_data) for c in store.collections_of(db)]
    # mongod lists the collections, then the views (list_collections.cpp)
    infos.extend(view_info(v, store)
                 for v in sorted(store.views_of(db), key=lambda v: v["_id"]))
    if db == oplog_find.OPLOG_DB:
        infos.append(oplog_find.collection_info(server.oplog))
    for info in infos:
        if filter_doc and not engine.matches(filter_doc, info):
            continue
        out.append({"name": info["name"], "type": info["type"]} if name_only else info)
    batch_size = cursor_batch_size(cmd, "listCollections")
    return cursor_first_batch(server, f"{db}.$cmd.listCollections", out, batch_size)


def _db_size(store: Store, db: str) -> int:

    total = 0
    for c in store.collections_of(db):
        total += sum(len(bson_bytes.encode(d)) for d in store.documents(c).values())
    return total


@command("listDatabases")
async def list_databases(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """The store's databases (a recorded oplog's: handshake.py)."""
    store = get_store(server)
    names = sorted({*store.databases(), "admin", "config", "local"})
    dbs = []
    total = 0
    for name in names:
        size = _db_size(store, name) + 4096 * max(1, len(store.collections_of(name)))
        total += size
        dbs.append({"name": name, "sizeOnDisk": Int64(size), "empty": False})
    filter_doc = object_arg(cmd, "filter", "listDatabases")
    if filter_doc:
        dbs = [d for d in dbs if engine.matches(filter_doc, d)]
    if cmd.get("nameOnly"):
        return {"databases": [{"name": d["name"]} for d in dbs]}
    return {"databases": dbs, "totalSize": Int64(total), "totalSizeMb": Int64(total >> 20)}
