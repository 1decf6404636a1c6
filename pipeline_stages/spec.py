"""`$changeStream` options: parsing and validation of the aggregate command.

`ChangeStreamSpec` is what every other stage reads. `parse_aggregate` builds it from an
aggregate command, raising mongod's errors (reference oplog_to_events.md §6.2) in the order
mongod checks them: pipeline shape and stage names, the stage's argument, read concern and
transactions, the IDL fields, scope and namespace, resume options, the resume token, then the
user stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.collation import parse_collation
from pipeline_stages.errors import MongoError
from pipeline_stages.release import DEFAULT_RELEASE, Release
from pipeline_stages.resume_token import DEFAULT_TOKEN_VERSION
from pipeline_stages.value_string import type_name, value_string

Scope = Literal["collection", "database", "cluster"]


@dataclass(slots=True)
class ChangeStreamSpec:
    scope: Scope
    db: str  # "admin" for cluster streams
    coll: str | None = None  # only for collection streams
    full_document: str = "default"  # default | updateLookup | whenAvailable | required
    full_document_before_change: str = "off"  # off | whenAvailable | required
    resume_after: dict[str, Any] | None = None
    start_after: dict[str, Any] | None = None
    start_at_operation_time: Timestamp | None = None
    show_expanded_events: bool = False
    # Internal options mongod accepts.
    show_system_events: bool = False
    show_raw_update_description: bool = False
    show_migration_events: bool = False
    allow_to_run_on_config_db: bool = False
    match_collection_uuid_for_update_lookup: bool = False
    # 9.0's options (its profile accepts them): a removed shard's history is skipped; the
    # reader version asked for (this server reads every stream as a v1 reader does).
    ignore_removed_shards: bool = False
    reader_version: str | None = None
    # The aggregate's `rawData: true` (9.0): a viewless time-series collection's events,
    # marked `isTimeseries` in the oplog, are shown only then.
    raw_data: bool = False
    # Which options the client gave (not the defaults filled in): 9.0's option counters.
    given_options: frozenset[str] = frozenset()
    # The stages after $changeStream, as given.
    user_pipeline: list[dict[str, Any]] = field(default_factory=list)
    # The decoded startAfter / resumeAfter token.
    resume_token: resume_token.ResumeTokenData | None = None
    # The aggregate's `collation`, None for the simple one: a change stream never takes the
    # collection's default (resume_from_high_water_mark_token.js); its $match compares by it.
    collation: dict[str, Any] | None = None
    # 1 when the aggregate asks `$_generateV2ResumeTokens: false` (tests, 6.0 mongos).
    token_version: int = DEFAULT_TOKEN_VERSION

    def requested_start(self) -> Timestamp | None:
        """Where the aggregate asks the stream to start: its token's clusterTime, else
        `startAtOperationTime`; None when it asks neither (the source picks a new stream's)."""
        if self.resume_token is not None:
            return self.resume_token.cluster_time
        return self.start_at_operation_time


# ---------------------------------------------------------------------------------------------
# Parsing the aggregate command


# The stages allowed after $changeStream (docs/change_streams.md, Pipeline::validate...).
ALLOWED_USER_STAGES = frozenset(
    {
        "$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith",
        "$redact", "$changeStreamSplitLargeEvent", "$_internalInhibitOptimization",
    }
)
# Stages a pipeline may hold only when it is a $changeStream pipeline (ChangeStreamRequirement::
# kRequiresChangeStream).
REQUIRES_CHANGE_STREAM = frozenset({"$changeStreamSplitLargeEvent"})
# $_internalInhibitOptimization passes every document on unchanged; it only stops the stages
# after it from moving ahead of the stages before it.
INHIBIT_OPTIMIZATION = "$_internalInhibitOptimization"

# Stage names mongod knows (so others get 40324), with the name of the stage they become
# (an alias desugars before the allowed-stage check, which reports the desugared name).
KNOWN_STAGES: dict[str, str] = {
    name: name
    for name in (
        "$bucketAuto", "$collStats", "$currentOp", "$densify", "$documents", "$facet",
        "$fill", "$geoNear", "$graphLookup", "$group", "$indexStats", "$limit",
        "$listLocalSessions", "$listSessions", "$listSearchIndexes", "$lookup", "$merge",
        "$out", "$planCacheStats", "$sample", "$search", "$searchMeta", "$setWindowFields",
        "$skip", "$sort", "$unionWith", "$unwind", "$vectorSearch", "$changeStream",
        "$listSampledQueries", "$querySettings", "$shardedDataDistribution",
        *ALLOWED_USER_STAGES,
    )
} | {"$count": "$group", "$sortByCount": "$group", "$bucket": "$group"}

_SPEC_FIELDS: dict[str, str] = {
    # name -> IDL type name used in TypeMismatch messages
    "fullDocument": "string",
    "fullDocumentBeforeChange": "string",
    "resumeAfter": "object",
    "startAfter": "object",
    "startAtOperationTime": "timestamp",
    "allChangesForCluster": "bool",
    "showExpandedEvents": "bool",
    "showSystemEvents": "bool",
    "showRawUpdateDescription": "bool",
    "showMigrationEvents": "bool",
    "allowToRunOnConfigDB": "bool",
    "allowToRunOnSystemNS": "bool",
    "matchCollectionUUIDForUpdateLookup": "bool",
    # accepted and ignored (internal, sent by mongos/tests)
    "$_generateV2ResumeTokens": "bool",
}
_ENUMS = {
    "fullDocument": ("default", "updateLookup", "whenAvailable", "required"),
    "fullDocumentBeforeChange": ("off", "whenAvailable", "required"),
}
# Flags not allowed with apiStrict: true (API Version 1).
_NOT_IN_API_V1 = ("showExpandedEvents", "showRawUpdateDescription", "showSystemEvents")


def is_change_stream_aggregate(cmd: Mapping[str, Any]) -> bool:
    pipeline = cmd.get("pipeline")
    return (
        isinstance(pipeline, list)
        and bool(pipeline)
        and isinstance(pipeline[0], Mapping)
        and "$changeStream" in pipeline[0]
    )


def parse_aggregate(
    cmd: Mapping[str, Any], db: str, release: Release = DEFAULT_RELEASE
) -> ChangeStreamSpec:
    """Validate an aggregate command whose pipeline starts with $changeStream, as mongod does,
    and return its spec; raises MongoError with mongod's code and message otherwise. `release`:
    the profile answered as (the options it accepts)."""
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(
            14,
            "BSON field 'aggregate.pipeline' is the wrong type "
            f"'{type_name(pipeline)}', expected type 'array'",
        )
    for i, stage in enumerate(pipeline):
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise MongoError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        name = next(iter(stage))
        if name not in KNOWN_STAGES:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
        if name == "$changeStream" and i > 0:
            raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline")
    options = pipeline[0]["$changeStream"]
    if not isinstance(options, Mapping):
        raise MongoError(
            6188500,
            "$changeStream must take a nested object but found: $changeStream: "
            + value_string(options),
        )

    # Read concern and transactions are checked on the lite-parsed pipeline, before the stage.
    read_concern = cmd.get("readConcern")
    level = read_concern.get("level") if isinstance(read_concern, Mapping) else None
    if level is not None and level != "majority":
        raise MongoError(
            72,
            "Aggregation stage $changeStream cannot run with a readConcern other than "
            f"'majority'. Current readConcern: {level}",
        )
    if cmd.get("autocommit") is False or cmd.get("startTransaction") is True:
        raise MongoError(
            263,
            "Operation not permitted in transaction :: caused by :: Aggregation stage "
            "$changeStream cannot run within a multi-document transaction.",
        )

    values: dict[str, Any] = {}
    for name, value in options.items():
        expected = _SPEC_FIELDS.get(name) or release.change_stream_fields.get(name)
        if expected is None:
            raise MongoError(40415, f"BSON field '$changeStream.{name}' is an unknown field.")
        if value is None:  # null counts as not specified
            continue
        actual = type_name(value)
        if actual != expected:
            raise MongoError(
                14,
                f"BSON field '$changeStream.{name}' is the wrong type '{actual}', "
                f"expected type '{expected}'",
            )
        enum = _ENUMS.get(name) or release.change_stream_enums.get(name)
        if enum is not None and value not in enum:
            raise MongoError(
                2,
                f"Enumeration value '{value}' for field '$changeStream.{name}' is not a valid "
                "value.",
            )
        values[name] = value

    if cmd.get("apiStrict") is True:
        for name in _NOT_IN_API_V1:
            if name in values:
                raise MongoError(
                    323,
                    f"The '{name}' parameter to $changeStream is not supported in API Version 1",
                )

    target = cmd.get("aggregate")
    coll = target if isinstance(target, str) else None
    all_changes = values.get("allChangesForCluster", False)
    if all_changes:
        if db != "admin" or coll is not None:
            ns = f"{db}.{coll}" if coll is not None else f"{db}.$cmd.aggregate"
            raise MongoError(
                72,
                "A $changeStream with 'allChangesForCluster:true' may only be opened on the "
                f"'admin' database, and with no collection name; found {ns}",
            )
        scope: Scope = "cluster"
    else:
        if db == "admin" or db == "local" or (
            db == "config" and not values.get("allowToRunOnConfigDB", False)
        ):
            raise MongoError(73, f"$changeStream may not be opened on the internal {db} database")
        if coll is not None and coll.startswith("system.") and not values.get(
            "allowToRunOnSystemNS", False
        ):
            raise MongoError(
                73, f"$changeStream may not be opened on the internal {db}.{coll} collection"
            )
        scope = "collection" if coll is not None else "database"

    if "resumeAfter" in values and "startAfter" in values:
        raise MongoError(
            50865, "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage"
        )
    if "startAtOperationTime" in values and (
        "resumeAfter" in values or "startAfter" in values
    ):
        raise MongoError(
            40674, "Only one type of resume option is allowed, but multiple were found"
        )

    spec = ChangeStreamSpec(
        scope=scope,
        db=db,
        coll=coll,
        full_document=values.get("fullDocument", "default"),
        full_document_before_change=values.get("fullDocumentBeforeChange", "off"),
        resume_after=values.get("resumeAfter"),
        start_after=values.get("startAfter"),
        start_at_operation_time=values.get("startAtOperationTime"),
        show_expanded_events=values.get("showExpandedEvents", False),
        show_system_events=values.get("showSystemEvents", False),
        show_raw_update_description=values.get("showRawUpdateDescription", False),
        show_migration_events=values.get("showMigrationEvents", False),
        allow_to_run_on_config_db=values.get("allowToRunOnConfigDB", False),
        match_collection_uuid_for_update_lookup=values.get(
            "matchCollectionUUIDForUpdateLookup", False
        ),
        ignore_removed_shards=values.get("ignoreRemovedShards", False),
        reader_version=values.get("version"),
        raw_data=cmd.get("rawData") is True,
        given_options=frozenset(values),
        user_pipeline=[dict(s) for s in pipeline[1:]],
        token_version=_token_version(cmd),
        collation=(dict(cmd["collation"])
                   if parse_collation(cmd.get("collation"), "aggregate") is not None else None),
    )

    token = spec.start_after if spec.start_after is not None else spec.resume_after
    if token is not None:
        data = resume_token.decode(token)
        if spec.resume_after is not None and data.from_invalidate:
            raise MongoError(
                260,
                "Attempting to resume a change stream using 'resumeAfter' is not allowed from "
                "an invalidate notification",
            )
        if scope == "collection" and data.uuid is None and not data.is_high_water_mark:
            raise MongoError(
                260,
                "Attempted to resume a single-collection stream, but the resume token does not "
                "include a UUID",
            )
        spec.resume_token = data

    _validate_user_stages(spec.user_pipeline)
    split = any(next(iter(s)) == "$changeStreamSplitLargeEvent" for s in spec.user_pipeline)
    if spec.resume_token is not None and spec.resume_token.fragment_num is not None and not split:
        raise MongoError(
            280,
            "To resume from a split event, the $changeStream pipeline must include a "
            "$changeStreamSplitLargeEvent stage",
        )
    if split and any(next(iter(s)) == INHIBIT_OPTIMIZATION for s in spec.user_pipeline):
        _check_split_position(spec)
    # A no-op once the pipeline is validated.
    spec.user_pipeline = [s for s in spec.user_pipeline if next(iter(s)) != INHIBIT_OPTIMIZATION]
    return spec


def _token_version(cmd: Mapping[str, Any]) -> int:
    """The aggregate's `$_generateV2ResumeTokens`: v2 is the default, so only an explicit false
    (v1 tokens) is accepted (mongod's makeExpressionContext, 6528200)."""
    generate_v2 = cmd.get("$_generateV2ResumeTokens")
    if generate_v2 is None:
        return resume_token.DEFAULT_TOKEN_VERSION
    if generate_v2 is not False and generate_v2 != 0:
        raise MongoError(6528200, "Invalid request for v2 tokens")
    return 1


def _check_split_position(spec: ChangeStreamSpec) -> None:
    """DocumentSourceChangeStreamSplitLargeEvent::optimizeAt moves the stage ahead of the
    router stages (add pre-/post-image, ensure the resume token is present) that mongod puts
    between $changeStream's internal stages and the user's; $_internalInhibitOptimization
    before it stops that move, and the check after optimization fails."""
    token = spec.resume_token
    router_stages = (
        spec.full_document != "default"
        or spec.full_document_before_change != "off"
        or (token is not None and not token.is_high_water_mark)
    )
    if router_stages:
        raise MongoError(
            7182803,
            "$changeStreamSplitLargeEvent is at the wrong position in the pipeline after "
            "optimization",
        )


def check_requires_change_stream(pipeline: Any) -> None:
    """A pipeline that is not a $changeStream pipeline must not hold stages that only a
    change stream may (Pipeline::validateTopLevelPipeline)."""
    if not isinstance(pipeline, list):
        return
    for stage in pipeline:
        if isinstance(stage, Mapping) and len(stage) == 1:
            name = next(iter(stage))
            if name in REQUIRES_CHANGE_STREAM:
                raise MongoError(20, f"{name} can only be used in a $changeStream pipeline")
            if name == "$lookup" and isinstance(stage[name], Mapping):
                _check_lookup_pipeline(stage[name].get("pipeline"))


def _check_lookup_pipeline(pipeline: Any) -> None:
    """lookupPipeValidator: a $lookup sub-pipeline (at any depth) holds no $changeStream
    (51047; mongod names the stage as it parsed it)."""
    if not isinstance(pipeline, list):
        return
    for stage in pipeline:
        if isinstance(stage, Mapping) and len(stage) == 1:
            name = next(iter(stage))
            if name == "$changeStream":
                raise MongoError(51047, f"{name} is not allowed within a $lookup's sub-pipeline")
            if name == "$lookup" and isinstance(stage[name], Mapping):
                _check_lookup_pipeline(stage[name].get("pipeline"))


def _validate_user_stages(stages: list[dict[str, Any]]) -> None:
    for i, stage in enumerate(stages):
        name = next(iter(stage))
        if name not in ALLOWED_USER_STAGES:
            raise MongoError(
                20, f"{KNOWN_STAGES[name]} is not permitted in a $changeStream pipeline"
            )
        if name == "$changeStreamSplitLargeEvent":
            if not isinstance(stage[name], Mapping) or stage[name]:
                raise MongoError(
                    7182800, "$changeStreamSplitLargeEvent spec should be an empty object"
                )
            # validatePipelinePosition runs before the single-use check (validateCommon):
            # a second split stage makes the first one not the last.
            if i != len(stages) - 1:
                raise MongoError(
                    7182802, "$changeStreamSplitLargeEvent must be the last stage in the pipeline"
                )
