"""`$changeStream` option parsing: scopes, options, and every validation error with mongod's
code, codeName and message (reference oplog_to_events.md §6.2, §5)."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp

from pipeline_stages import resume_token as rt
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import parse_aggregate

UUID = bytes.fromhex("ab1154acacd849a48c61756d70d3b21f")
DROP = rt.ResumeTokenData.for_event(Timestamp(10, 1), "drop", uuid=UUID)


def cs(options=None, *stages, target="c", **extra):
    return {"aggregate": target, "pipeline": [{"$changeStream": options or {}}, *stages], **extra}


def test_the_three_scopes():
    coll = parse_aggregate(cs(), "test")
    assert (coll.scope, coll.db, coll.coll) == ("collection", "test", "c")
    db = parse_aggregate(cs(target=1), "test")
    assert (db.scope, db.db, db.coll) == ("database", "test", None)
    cluster = parse_aggregate(cs({"allChangesForCluster": True}, target=1), "admin")
    assert (cluster.scope, cluster.db) == ("cluster", "admin")


def test_every_option_is_read():
    token = DROP.to_document()
    spec = parse_aggregate(
        cs(
            {
                "fullDocument": "whenAvailable",
                "fullDocumentBeforeChange": "required",
                "startAfter": token,
                "showExpandedEvents": True,
                "showSystemEvents": True,
                "showRawUpdateDescription": True,
                "showMigrationEvents": True,
                "matchCollectionUUIDForUpdateLookup": True,
            },
            {"$match": {"operationType": "insert"}},
        ),
        "test",
    )
    assert spec.full_document == "whenAvailable"
    assert spec.full_document_before_change == "required"
    assert spec.start_after == token and spec.resume_token == DROP
    assert spec.show_expanded_events and spec.show_system_events
    assert spec.show_raw_update_description and spec.show_migration_events
    assert spec.match_collection_uuid_for_update_lookup
    assert spec.user_pipeline == [{"$match": {"operationType": "insert"}}]
    config = parse_aggregate(cs({"allowToRunOnConfigDB": True}), "config")
    assert config.allow_to_run_on_config_db


def test_null_options_count_as_not_given():
    spec = parse_aggregate(cs({"fullDocument": None, "resumeAfter": None}), "test")
    assert spec.full_document == "default" and spec.resume_after is None


def test_start_at_operation_time():
    spec = parse_aggregate(cs({"startAtOperationTime": Timestamp(5, 6)}), "test")
    assert spec.start_at_operation_time == Timestamp(5, 6)


INVALIDATE = DROP.to_document()
_inv = rt.decode(INVALIDATE)
_inv.from_invalidate = True
INVALIDATE = _inv.to_document()
NO_UUID = rt.ResumeTokenData.for_event(Timestamp(10, 1), "dropDatabase").to_document()

ERRORS = [
    (cs(target="c") | {"pipeline": {"$changeStream": {}}}, "test", 14, "TypeMismatch",
     "BSON field 'aggregate.pipeline' is the wrong type 'object', expected type 'array'"),
    (cs({}, {"$nope": {}}), "test", 40324, "Location40324",
     "Unrecognized pipeline stage name: '$nope'"),
    (cs({}, {"$changeStream": {}}), "test", 40602, "Location40602",
     "$changeStream is only valid as the first stage in a pipeline"),
    ({"aggregate": "c", "pipeline": [{"$changeStream": 1}]}, "test", 6188500,
     "Location6188500", "$changeStream must take a nested object but found: $changeStream: 1"),
    (cs(readConcern={"level": "local"}), "test", 72, "InvalidOptions",
     "Aggregation stage $changeStream cannot run with a readConcern other than 'majority'. "
     "Current readConcern: local"),
    (cs(autocommit=False, txnNumber=1), "test", 263, "OperationNotSupportedInTransaction",
     "Operation not permitted in transaction :: caused by :: Aggregation stage $changeStream "
     "cannot run within a multi-document transaction."),
    (cs({"foo": 1}), "test", 40415, "Location40415",
     "BSON field '$changeStream.foo' is an unknown field."),
    (cs({"fullDocument": 1}), "test", 14, "TypeMismatch",
     "BSON field '$changeStream.fullDocument' is the wrong type 'int', expected type 'string'"),
    (cs({"showExpandedEvents": "yes"}), "test", 14, "TypeMismatch",
     "BSON field '$changeStream.showExpandedEvents' is the wrong type 'string', expected type "
     "'bool'"),
    (cs({"resumeAfter": "x"}), "test", 14, "TypeMismatch",
     "BSON field '$changeStream.resumeAfter' is the wrong type 'string', expected type "
     "'object'"),
    (cs({"startAtOperationTime": 5}), "test", 14, "TypeMismatch",
     "BSON field '$changeStream.startAtOperationTime' is the wrong type 'int', expected type "
     "'timestamp'"),
    (cs({"fullDocument": "always"}), "test", 2, "BadValue",
     "Enumeration value 'always' for field '$changeStream.fullDocument' is not a valid value."),
    (cs({"fullDocumentBeforeChange": "updateLookup"}), "test", 2, "BadValue",
     "Enumeration value 'updateLookup' for field '$changeStream.fullDocumentBeforeChange' is "
     "not a valid value."),
    (cs({"showExpandedEvents": True}, apiStrict=True, apiVersion="1"), "test", 323,
     "APIStrictError",
     "The 'showExpandedEvents' parameter to $changeStream is not supported in API Version 1"),
    (cs({"allChangesForCluster": True}, target=1), "test", 72, "InvalidOptions",
     "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' "
     "database, and with no collection name; found test.$cmd.aggregate"),
    (cs({"allChangesForCluster": True}, target="c"), "admin", 72, "InvalidOptions",
     "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' "
     "database, and with no collection name; found admin.c"),
    (cs(target=1), "admin", 73, "InvalidNamespace",
     "$changeStream may not be opened on the internal admin database"),
    (cs(), "local", 73, "InvalidNamespace",
     "$changeStream may not be opened on the internal local database"),
    (cs(), "config", 73, "InvalidNamespace",
     "$changeStream may not be opened on the internal config database"),
    (cs(target="system.views"), "test", 73, "InvalidNamespace",
     "$changeStream may not be opened on the internal test.system.views collection"),
    (cs({"resumeAfter": INVALIDATE, "startAfter": INVALIDATE}), "test", 50865,
     "Location50865",
     "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage"),
    (cs({"resumeAfter": INVALIDATE, "startAtOperationTime": Timestamp(1, 1)}), "test", 40674,
     "Location40674", "Only one type of resume option is allowed, but multiple were found"),
    (cs({"resumeAfter": INVALIDATE}), "test", 260, "InvalidResumeToken",
     "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
     "invalidate notification"),
    (cs({"resumeAfter": NO_UUID}), "test", 260, "InvalidResumeToken",
     "Attempted to resume a single-collection stream, but the resume token does not include "
     "a UUID"),
    (cs({"resumeAfter": {"_data": "zz"}}), "test", 9, "FailedToParse",
     "resume token string was not a valid hex string"),
    (cs({}, {"$group": {"_id": None}}), "test", 20, "IllegalOperation",
     "$group is not permitted in a $changeStream pipeline"),
    (cs({}, {"$count": "n"}), "test", 20, "IllegalOperation",
     "$group is not permitted in a $changeStream pipeline"),
    (cs({}, {"$changeStreamSplitLargeEvent": {"a": 1}}), "test", 7182800, "Location7182800",
     "$changeStreamSplitLargeEvent spec should be an empty object"),
    (cs({}, {"$changeStreamSplitLargeEvent": {}}, {"$match": {}}), "test", 7182802,
     "Location7182802", "$changeStreamSplitLargeEvent must be the last stage in the pipeline"),
    # validateCommon checks the position (7182802) before the single use (7183900), so the first
    # of two split stages fails as not last (jstests/change_streams/split_large_event.js).
    (cs({}, {"$changeStreamSplitLargeEvent": {}}, {"$changeStreamSplitLargeEvent": {}}),
     "test", 7182802, "Location7182802",
     "$changeStreamSplitLargeEvent must be the last stage in the pipeline"),
]


@pytest.mark.parametrize(("cmd", "db", "code", "code_name", "errmsg"), ERRORS)
def test_validation_error(cmd, db, code, code_name, errmsg):
    with pytest.raises(MongoError) as err:
        parse_aggregate(cmd, db)
    assert (err.value.code, err.value.code_name, err.value.errmsg) == (code, code_name, errmsg)


def test_database_stream_accepts_a_token_without_uuid_and_start_after_an_invalidate():
    assert parse_aggregate(cs({"resumeAfter": NO_UUID}, target=1), "test").resume_token
    spec = parse_aggregate(cs({"startAfter": INVALIDATE}), "test")
    assert spec.resume_token.from_invalidate


def test_high_water_mark_token_needs_no_uuid_on_a_collection_stream():
    hwm = rt.ResumeTokenData.high_water_mark(Timestamp(3, 0)).to_document()
    assert parse_aggregate(cs({"resumeAfter": hwm}), "test").resume_token.is_high_water_mark
