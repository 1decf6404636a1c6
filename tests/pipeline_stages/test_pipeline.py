"""The whole `$changeStream` pipeline (`ChangeStreamPipeline`) on oplogs shaped as mongod 8.0
writes them: every operation type in every scope, exact events (field order, values, resume
tokens), transactions, invalidation, resuming, batches and post-batch resume tokens.

Expected events are written from reference/oplog_to_events.md (§4.1 table, §4.3 order, §4.5
tokens, §5 invalidation, §6 resumability, §9.3 batches), not from the implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.pipeline import Batch, ChangeStreamPipeline
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import ID_INDEX, Oplog, make_lsid, split_ns, uuid_n

SCOPES = ("collection", "database", "cluster")
C1, C2, C3 = "test.c1", "test.c2", "other.c3"
# Which of the three namespaces each scope (watching test.c1 / test / the cluster) reports.
SEES = {"collection": (C1,), "database": (C1, C2), "cluster": (C1, C2, C3)}

ID = object()  # placeholder for the `_id` slot in expected events (checked with check_token)


# -- helpers ------------------------------------------------------------------------------------


def open_stream(
    scope: str,
    start: Timestamp,
    log: Oplog | None = None,
    *,
    watch: str = C1,
    **options: Any,
) -> ChangeStreamPipeline:
    """A pipeline as `aggregate` would build it for `scope` (watching `watch`'s collection or
    database), reading the oplog from `start`."""
    db, coll = split_ns(watch)
    if scope == "collection":
        cmd: dict[str, Any] = {"aggregate": coll}
    elif scope == "database":
        cmd = {"aggregate": 1}
    else:
        cmd, db = {"aggregate": 1}, "admin"
        options = {"allChangesForCluster": True, **options}
    cmd["pipeline"] = [{"$changeStream": options}]
    cmd["cursor"] = {}
    spec = parse_aggregate(cmd, db)
    return ChangeStreamPipeline(spec, start, history=log.history() if log is not None else None)


def decoded(batch: Batch) -> list[dict[str, Any]]:
    return [bson.decode(e.raw) for e in batch.events]


def run(scope: str, log: Oplog, start: Timestamp, **options: Any) -> tuple[list[dict], Batch]:
    """All events of `log` for a stream opened at `start`, in one batch."""
    pipeline = open_stream(scope, start, log, **options)
    batch = pipeline.process(log.entries)
    return decoded(batch), batch


def norm(value: Any) -> Any:
    """`value` as the event decodes it (BSON round trip, field order kept)."""
    return bson.decode(bson.encode({"": value}))[""]


def wall(entry: Mapping[str, Any]) -> Any:
    return norm(entry["wall"])


def check_event(event: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Same field names in the same order, same values (the `_id` slot: any token)."""
    assert list(event) == list(expected)
    assert {k: v for k, v in event.items() if k != "_id"} == norm(
        {k: v for k, v in expected.items() if expected[k] is not ID}
    )
    # Field order of nested documents counts too (BSON equality is order-sensitive).
    for name, value in expected.items():
        if isinstance(value, Mapping):
            assert bson.encode(event[name]) == bson.encode(norm(value)), name


def check_token(
    event: Mapping[str, Any],
    operation_type: str,
    ts: Timestamp,
    uuid: Binary | None,
    *,
    document_key: Mapping[str, Any] | None = None,
    description: Mapping[str, Any] | None = None,
    txn_op_index: int = 0,
    from_invalidate: bool = False,
    version: int = 2,
) -> ResumeTokenData:
    data = resume_token.decode(event["_id"])
    assert data.cluster_time == ts
    assert data.version == version
    assert data.token_type == resume_token.EVENT_TOKEN
    assert data.txn_op_index == txn_op_index
    assert data.from_invalidate is from_invalidate
    assert data.uuid == (None if uuid is None else bytes(uuid))
    assert data.fragment_num is None
    ident: dict[str, Any] = {"operationType": operation_type}
    if document_key is not None:
        ident["documentKey"] = document_key
    if description is not None:
        ident["operationDescription"] = description
    identifier = data.event_identifier_document()
    assert identifier == norm(ident)
    assert bson.encode(identifier) == bson.encode(norm(ident))  # order inside it too
    # The token is what the event says it is, and `_data` is upper-case hex.
    assert event["_id"]["_data"] == event["_id"]["_data"].upper()
    assert norm(data.to_document()) == event["_id"]
    return data


def ns_doc(ns: str) -> dict[str, str]:
    db, coll = split_ns(ns)
    return {"db": db, "coll": coll} if coll else {"db": db}


def head(
    entry: Mapping[str, Any],
    operation_type: str,
    expanded: bool,
    *,
    uuid: bool = True,
    first: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`[first,] _id, operationType, clusterTime, [collectionUUID,] wallTime` (§4.3)."""
    out: dict[str, Any] = dict(first or {})
    out.update({"_id": ID, "operationType": operation_type, "clusterTime": entry["ts"]})
    if expanded and uuid and "ui" in entry:
        out["collectionUUID"] = entry["ui"]
    out["wallTime"] = wall(entry)
    return out


def hwm_data(ts: Timestamp) -> str:
    """A v2 high-water-mark `_data`, spelled out from reference Appendix A:
    `82 <ts> 2B04 (version 2) 29 (tokenType 0) 29 (txnOpIndex 0) 6E (false) 14 (null) 04`."""
    return f"82{ts.time:08X}{ts.inc:08X}2B0429296E1404"


def tokens(events: Sequence[Mapping[str, Any]]) -> list[str]:
    return [e["_id"]["_data"] for e in events]


@pytest.fixture
def log() -> Oplog:
    """Three existing collections in two databases; streams start right after their creation."""
    oplog = Oplog()
    for ns in (C1, C2, C3):
        oplog.create(ns)
        oplog.insert(ns, {"_id": 0, "before": True})
    return oplog


# -- CRUD, every scope -------------------------------------------------------------------------


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_insert(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    doc = {"_id": 7, "x": [1, {"y": "z"}], "a": None}
    entries = {ns: log.insert(ns, doc) for ns in (C1, C2, C3)}
    events, batch = run(scope, log, start, showExpandedEvents=expanded)
    assert len(events) == len(SEES[scope])
    for event, ns in zip(events, SEES[scope]):
        entry = entries[ns]
        expected = head(entry, "insert", expanded)
        expected["fullDocument"] = {"_id": 7, "x": [1, {"y": "z"}], "a": None}
        expected["ns"] = ns_doc(ns)
        expected["documentKey"] = {"_id": 7}
        check_event(event, expected)
        check_token(event, "insert", entry["ts"], entry["ui"], document_key={"_id": 7})
    assert batch.invalidated is False
    # The batch ended at EOF: the post-batch token is a high-water mark at the last scanned
    # entry when that is later than the last event, else the last event's token.
    last = events[-1]
    if last["clusterTime"] == log.last_ts:
        assert batch.post_batch_resume_token == last["_id"]
    else:
        assert batch.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


def test_insert_without_o2_uses_the_id() -> None:
    # Entries written before 5.3 have no o2: documentKey = {_id: o._id}.
    log = Oplog()
    start = log.peek_ts()
    log.insert(C1, {"_id": "k", "v": 1})
    raw = dict(log.entries[-1])
    del raw["o2"]
    log.entries[-1] = decode_entry(bson.encode(raw))
    events, _ = run("collection", log, start)
    assert events[0]["documentKey"] == {"_id": "k"}
    check_token(events[0], "insert", log.entries[-1]["ts"], log.uuid(C1), document_key={"_id": "k"})


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_update(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    diff = {
        "d": {"gone": False},
        "u": {"a": 1},
        "i": {"new": {"n": 1}},
        "sarr": {"a": True, "l": 2, "s0": {"u": {"f": "g"}}, "u1": 5},
        "ssub": {"i": {"1": "x"}, "sdeep.er": {"d": {"q": False}}},
    }
    entries = {ns: log.update(ns, 0, diff) for ns in (C1, C2, C3)}
    events, _ = run(scope, log, start, showExpandedEvents=expanded)
    description: dict[str, Any] = {
        # u, then i, then each sub-diff in order (§4.4).
        "updatedFields": {"a": 1, "new": {"n": 1}, "arr.0.f": "g", "arr.1": 5, "sub.1": "x"},
        "removedFields": ["gone", "sub.deep.er.q"],
        "truncatedArrays": [{"field": "arr", "newSize": 2}],
    }
    if expanded:
        description["disambiguatedPaths"] = {
            "sub.1": ["sub", "1"],
            "sub.deep.er.q": ["sub", "deep.er", "q"],
        }
    assert len(events) == len(SEES[scope])
    for event, ns in zip(events, SEES[scope]):
        entry = entries[ns]
        expected = head(entry, "update", expanded)
        expected["ns"] = ns_doc(ns)
        expected["documentKey"] = {"_id": 0}
        expected["updateDescription"] = description
        check_event(event, expected)
        check_token(event, "update", entry["ts"], entry["ui"], document_key={"_id": 0})


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_replace(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    entries = {ns: log.replace(ns, {"_id": 0, "whole": "new"}) for ns in (C1, C2, C3)}
    events, _ = run(scope, log, start, showExpandedEvents=expanded)
    assert len(events) == len(SEES[scope])
    for event, ns in zip(events, SEES[scope]):
        entry = entries[ns]
        expected = head(entry, "replace", expanded)
        expected["fullDocument"] = {"_id": 0, "whole": "new"}
        expected["ns"] = ns_doc(ns)
        expected["documentKey"] = {"_id": 0}
        check_event(event, expected)
        check_token(event, "replace", entry["ts"], entry["ui"], document_key={"_id": 0})


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_delete(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    entries = {ns: log.delete(ns, 0) for ns in (C1, C2, C3)}
    events, _ = run(scope, log, start, showExpandedEvents=expanded)
    assert len(events) == len(SEES[scope])
    for event, ns in zip(events, SEES[scope]):
        entry = entries[ns]
        expected = head(entry, "delete", expanded)
        expected["ns"] = ns_doc(ns)
        expected["documentKey"] = {"_id": 0}
        check_event(event, expected)
        check_token(event, "delete", entry["ts"], entry["ui"], document_key={"_id": 0})


def test_update_with_unsupported_oplog_version_fails(log: Oplog) -> None:
    start = log.peek_ts()
    log.update(C1, 0, {"u": {"a": 1}})
    raw = dict(log.entries[-1])
    raw["o"] = {"$v": 3, "diff": {"u": {"a": 1}}}
    log.entries[-1] = decode_entry(bson.encode(raw))
    with pytest.raises(MongoError) as err:
        run("collection", log, start)
    assert err.value.code == 6741200
    assert err.value.errmsg == "Unsupported or missing oplog version, $v: 3"


def test_system_and_internal_namespaces_are_never_reported() -> None:
    log = Oplog()
    start = log.peek_ts()
    log.insert("test.system.profile", {"_id": 1})
    log.insert("admin.users", {"_id": 1})
    log.insert("config.chunks", {"_id": 1})
    log.insert("local.x", {"_id": 1})
    log.noop()
    for scope in ("database", "cluster"):
        events, batch = run(scope, log, start)
        assert events == []
        assert batch.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


def test_retryable_write_events_carry_no_session_fields() -> None:
    # lsid/txnNumber only appear on events unwound from a transaction (§3.3).
    log = Oplog()
    start = log.peek_ts()
    entry = log.insert(C1, {"_id": 1}, retryable={"lsid": make_lsid(1), "txnNumber": 3})
    assert "lsid" in entry and "txnNumber" in entry
    events, _ = run("collection", log, start)
    expected = head(entry, "insert", False)
    expected.update(fullDocument={"_id": 1}, ns=ns_doc(C1), documentKey={"_id": 1})
    check_event(events[0], expected)


# -- drop / rename / dropDatabase ----------------------------------------------------------------


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_drop(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    drop2 = log.drop(C2)
    drop3 = log.drop(C3)
    drop1 = log.drop(C1)
    after = log.insert(C2, {"_id": 1})  # implicitly re-created
    log.noop()
    events, batch = run(scope, log, start, showExpandedEvents=expanded)
    by_ns = {}
    for ns, entry in ((C2, drop2), (C3, drop3), (C1, drop1)):
        expected = head(entry, "drop", expanded)
        expected["ns"] = ns_doc(ns)
        by_ns[ns] = (entry, expected)
    order = [ns for ns in (C2, C3, C1) if ns in SEES[scope]]
    for event, ns in zip(events, order):
        entry, expected = by_ns[ns]
        check_event(event, expected)
        check_token(event, "drop", entry["ts"], entry["ui"])
    if scope == "collection":
        # The drop of the watched collection, then invalidate, then nothing.
        assert len(events) == 2
        expected = {"_id": ID, "operationType": "invalidate", "clusterTime": drop1["ts"],
                    "wallTime": wall(drop1)}
        check_event(events[1], expected)
        check_token(events[1], "drop", drop1["ts"], drop1["ui"], from_invalidate=True)
        assert batch.invalidated is True
        assert batch.post_batch_resume_token == events[1]["_id"]
    else:
        assert batch.invalidated is False
        assert len(events) == len(order) + 1  # + the insert into the re-created test.c2
        assert events[-1]["operationType"] == "insert"
        assert events[-1]["clusterTime"] == after["ts"]
        assert batch.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_rename_from_watched(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    entry = log.rename(C1, "test.renamed")
    log.insert("test.renamed", {"_id": 1})
    events, batch = run(scope, log, start, showExpandedEvents=expanded)
    to = {"db": "test", "coll": "renamed"}
    expected = head(entry, "rename", expanded, first={"to": to})
    expected["ns"] = ns_doc(C1)
    if expanded:
        expected["operationDescription"] = {"to": to}
    check_event(events[0], expected)
    check_token(events[0], "rename", entry["ts"], entry["ui"], description={"to": to})
    if scope == "collection":
        assert [e["operationType"] for e in events] == ["rename", "invalidate"]
        check_event(events[1], {"_id": ID, "operationType": "invalidate",
                                "clusterTime": entry["ts"], "wallTime": wall(entry)})
        check_token(events[1], "rename", entry["ts"], entry["ui"], description={"to": to},
                    from_invalidate=True)
        assert batch.invalidated
    else:
        assert [e["operationType"] for e in events] == ["rename", "insert"]
        assert not batch.invalidated


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_rename_onto_watched(log: Oplog, scope: str, expanded: bool) -> None:
    """test.c2 renamed onto test.c1 (dropTarget): the collection stream on test.c1 sees a
    rename whose `to` is the watched collection, then invalidate."""
    start = log.peek_ts()
    old_c1 = log.uuid(C1)
    entry = log.rename(C2, C1)
    events, batch = run(scope, log, start, showExpandedEvents=expanded)
    to = {"db": "test", "coll": "c1"}
    description = {"to": to, "dropTarget": old_c1}
    expected = head(entry, "rename", expanded, first={"to": to})
    expected["ns"] = ns_doc(C2)
    if expanded:
        expected["operationDescription"] = description
    check_event(events[0], expected)
    check_token(events[0], "rename", entry["ts"], entry["ui"], description=description)
    if scope == "collection":
        assert [e["operationType"] for e in events] == ["rename", "invalidate"]
        check_token(events[1], "rename", entry["ts"], entry["ui"], description=description,
                    from_invalidate=True)
        assert batch.invalidated
    else:
        assert len(events) == 1 and not batch.invalidated


def test_rename_of_another_collection_is_not_seen_by_a_collection_stream(log: Oplog) -> None:
    start = log.peek_ts()
    log.rename(C2, "test.c9")
    log.rename(C3, "other.c9")
    events, batch = run("collection", log, start)
    assert events == [] and not batch.invalidated


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_drop_database(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    drops = log.drop_database("test")  # drop c1, drop c2, dropDatabase
    other = log.drop_database("other")  # drop c3, dropDatabase
    events, batch = run(scope, log, start, showExpandedEvents=expanded)
    if scope == "collection":
        assert [e["operationType"] for e in events] == ["drop", "invalidate"]
        assert batch.invalidated
        return
    kinds = ["drop", "drop", "dropDatabase"]
    if scope == "database":
        kinds.append("invalidate")
    else:
        kinds += ["drop", "dropDatabase"]
    assert [e["operationType"] for e in events] == kinds
    for event, entry in zip(events[:2], drops[:2]):
        expected = head(entry, "drop", expanded)
        expected["ns"] = {"db": "test", "coll": entry["o"]["drop"]}
        check_event(event, expected)
    entry = drops[2]
    # dropDatabase: no UUID anywhere, ns without coll, eventIdentifier {operationType} only.
    expected = head(entry, "dropDatabase", expanded)
    expected["ns"] = {"db": "test"}
    check_event(events[2], expected)
    data = check_token(events[2], "dropDatabase", entry["ts"], None)
    assert data.uuid is None
    if scope == "database":
        check_event(events[3], {"_id": ID, "operationType": "invalidate",
                                "clusterTime": entry["ts"], "wallTime": wall(entry)})
        check_token(events[3], "dropDatabase", entry["ts"], None, from_invalidate=True)
        assert batch.invalidated
        assert batch.post_batch_resume_token == events[3]["_id"]
    else:
        assert events[4]["ns"] == {"db": "other"}
        assert events[4]["clusterTime"] == other[-1]["ts"]
        assert not batch.invalidated


# -- expanded events: DDL and sharding no-ops ----------------------------------------------------


def ddl_oplog() -> tuple[Oplog, Timestamp, dict[str, list[tuple[Any, dict[str, Any]]]]]:
    """DDL on test.c1, test.c2, other.c3 with the events an expanded stream should report
    (per namespace, as (entry, expected event, token description))."""
    log = Oplog()
    start = log.peek_ts()
    out: dict[str, list[tuple[Any, dict[str, Any]]]] = {C1: [], C2: [], C3: []}
    build = uuid_n(0xB1D)
    for ns in (C1, C2, C3):
        validator = {"$jsonSchema": {"bsonType": "object"}}
        e = log.create(ns, validator=validator)
        description = {"validator": validator, "idIndex": ID_INDEX}
        exp = head(e, "create", True)
        exp.update(ns=ns_doc(ns), operationDescription=description, nsType="collection")
        out[ns].append((e, exp, description))

        e = log.create_indexes(ns, {"a": 1}, "a_1")
        description = {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
        exp = head(e, "createIndexes", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))

        index = {"v": 2, "key": {"b": -1}, "name": "b_-1"}
        log.start_index_build(ns, build, [index])  # no event (8.0)
        e = log.commit_index_build(ns, build, [index])
        description = {"indexes": [index]}
        exp = head(e, "createIndexes", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))

        e = log.drop_indexes(ns, "a_1", {"a": 1})
        description = {"indexes": [{"v": 2, "key": {"a": 1}, "name": "a_1"}]}
        exp = head(e, "dropIndexes", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))

        e = log.coll_mod(
            ns, {"validationLevel": "moderate"}, old_options={"validationLevel": "strict"}
        )
        description = {"validationLevel": "moderate"}
        exp = head(e, "modify", True)
        exp.update(
            ns=ns_doc(ns), operationDescription=description,
            stateBeforeChange={
                "collectionOptions": {"uuid": log.uuid(ns), "validationLevel": "strict"}
            },
        )
        out[ns].append((e, exp, description))

        e = log.coll_mod(
            ns, {"index": {"name": "b_-1", "expireAfterSeconds": Int64(60)}},
            old_index_options={"expireAfterSeconds": Int64(30)},
        )
        description = {"index": {"name": "b_-1", "expireAfterSeconds": Int64(60)}}
        exp = head(e, "modify", True)
        exp.update(
            ns=ns_doc(ns), operationDescription=description,
            stateBeforeChange={
                "collectionOptions": {"uuid": log.uuid(ns)},
                "indexOptions": {"expireAfterSeconds": Int64(30)},
            },
        )
        out[ns].append((e, exp, description))

        e = log.shard_collection(ns, {"sk": 1})
        description = {
            "key": {"sk": 1}, "unique": False, "numInitialChunks": Int64(0),
            "presplitHashedZones": False,
        }
        exp = head(e, "shardCollection", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))

        e = log.refine_collection_shard_key(ns, {"sk": 1, "sk2": 1}, {"sk": 1})
        description = {"shardKey": {"sk": 1, "sk2": 1}, "oldShardKey": {"sk": 1}}
        exp = head(e, "refineCollectionShardKey", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))

        e = log.reshard_collection(ns, {"other": 1})
        description = {
            "reshardUUID": uuid_n(0xAAAA), "shardKey": {"other": 1}, "oldShardKey": {"_id": 1},
            "unique": False, "numInitialChunks": Int64(1),
        }
        exp = head(e, "reshardCollection", True)
        exp.update(ns=ns_doc(ns), operationDescription=description)
        out[ns].append((e, exp, description))
    log.noop()
    return log, start, out


@pytest.mark.parametrize("scope", SCOPES)
def test_expanded_ddl_events(scope: str) -> None:
    log, start, by_ns = ddl_oplog()
    events, batch = run(scope, log, start, showExpandedEvents=True)
    expected = sorted(
        (item for ns in SEES[scope] for item in by_ns[ns]), key=lambda item: item[0]["ts"]
    )
    assert [e["operationType"] for e in events] == [x["operationType"] for _, x, _ in expected]
    for event, (entry, exp, description) in zip(events, expected):
        check_event(event, exp)
        check_token(event, exp["operationType"], entry["ts"], entry["ui"], description=description)
    assert not batch.invalidated
    assert batch.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


@pytest.mark.parametrize("scope", SCOPES)
def test_ddl_events_are_hidden_without_expanded_events(scope: str) -> None:
    log, start, _ = ddl_oplog()
    events, batch = run(scope, log, start)
    assert events == []
    # They were read, though: the post-batch token moves past them.
    assert batch.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


@pytest.mark.parametrize("scope", ("database", "cluster"))
def test_create_inside_a_transaction_is_an_expanded_event(scope: str) -> None:
    log = Oplog()
    start = log.peek_ts()
    txn = log.transaction(make_lsid(4), 1)
    create = log.op_create("test.tx")
    e = txn.commit([create, log.op_insert("test.tx", {"_id": 1})])
    events, _ = run(scope, log, start, showExpandedEvents=True)
    assert [x["operationType"] for x in events] == ["create", "insert"]
    lsid = norm(make_lsid(4))
    assert list(events[0])[:3] == ["txnNumber", "lsid", "_id"]
    assert events[0]["lsid"] == lsid and events[0]["txnNumber"] == 1
    check_token(events[0], "create", e["ts"], log.uuid("test.tx"),
                description={"idIndex": ID_INDEX})
    check_token(events[1], "insert", e["ts"], log.uuid("test.tx"), document_key={"_id": 1},
                txn_op_index=1)
    events, _ = run(scope, log, start)
    assert [x["operationType"] for x in events] == ["insert"]


# -- transactions -------------------------------------------------------------------------------


def txn_expected(entry_at_commit: Any, op: Mapping[str, Any], lsid: Any, txn: int,
                 expanded: bool) -> dict[str, Any]:
    ns = op["ns"]
    out: dict[str, Any] = {"txnNumber": Int64(txn), "lsid": lsid, "_id": ID}
    kind = {"i": "insert", "d": "delete"}.get(op["op"]) or (
        "update" if "$v" in op["o"] else "replace"
    )
    out["operationType"] = kind
    out["clusterTime"] = entry_at_commit["ts"]
    if expanded:
        out["collectionUUID"] = op["ui"]
    out["wallTime"] = wall(entry_at_commit)
    if kind in ("insert", "replace"):
        out["fullDocument"] = op["o"]
    out["ns"] = ns_doc(ns)
    out["documentKey"] = op.get("o2", op["o"]) if kind != "delete" else op["o"]
    if kind == "update":
        out["updateDescription"] = {"updatedFields": {"x": 1}, "removedFields": [],
                                    "truncatedArrays": []}
        if expanded:
            out["updateDescription"]["disambiguatedPaths"] = {}
    return out


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_single_entry_transaction(log: Oplog, scope: str, expanded: bool) -> None:
    start = log.peek_ts()
    lsid = make_lsid(1)
    ops = [
        log.op_insert(C2, {"_id": 1}),
        log.op_insert(C1, {"_id": 1}),
        log.op_update(C1, 0, {"u": {"x": 1}}),
        log.op_insert(C3, {"_id": 1}),
        log.op_replace(C2, {"_id": 0, "r": 1}),
        log.op_delete(C1, 1),
    ]
    commit = log.transaction(lsid, 12).commit(ops)
    log.insert(C1, {"_id": 99})
    events, _ = run(scope, log, start, showExpandedEvents=expanded)
    # txnOpIndex counts every op of the transaction, watched or not.
    visible = [(i, op) for i, op in enumerate(ops) if op["ns"] in SEES[scope]]
    assert len(events) == len(visible) + 1
    for event, (index, op) in zip(events, visible):
        expected = txn_expected(commit, op, make_lsid(1), 12, expanded)
        check_event(event, expected)
        key = op["o"] if op["op"] == "d" else op["o2"]
        check_token(event, expected["operationType"], commit["ts"], op["ui"], document_key=key,
                    txn_op_index=index)
    # A plain write after the transaction: no session fields, txnOpIndex 0.
    assert list(events[-1])[0] == "_id"
    check_token(events[-1], "insert", log.last_ts, log.uuid(C1), document_key={"_id": 99})


@pytest.mark.parametrize("scope", SCOPES)
def test_multi_entry_transaction_with_interleaved_writes(log: Oplog, scope: str) -> None:
    start = log.peek_ts()
    lsid = make_lsid(2)
    txn = log.transaction(lsid, 5)
    first = [log.op_insert(C1, {"_id": 10}), log.op_insert(C3, {"_id": 10})]
    second = [log.op_insert(C2, {"_id": 11}), log.op_update(C1, 10, {"u": {"x": 1}})]
    last = [log.op_delete(C1, 10)]
    txn.partial(first)
    interleaved = log.insert(C1, {"_id": 20})  # another client, between the links
    txn.partial(second)
    log.noop()
    commit = txn.commit(last)
    events, _ = run(scope, log, start)
    ops = first + second + last
    visible = [(i, op) for i, op in enumerate(ops) if op["ns"] in SEES[scope]]
    assert [e["clusterTime"] for e in events] == [interleaved["ts"]] + [commit["ts"]] * len(
        visible
    )
    check_token(events[0], "insert", interleaved["ts"], log.uuid(C1), document_key={"_id": 20})
    for event, (index, op) in zip(events[1:], visible):
        expected = txn_expected(commit, op, lsid, 5, False)
        check_event(event, expected)
        key = op["o"] if op["op"] == "d" else op["o2"]
        check_token(event, expected["operationType"], commit["ts"], op["ui"], document_key=key,
                    txn_op_index=index)
    assert resume_token.decode(events[-1]["_id"]).txn_op_index == 4  # never reset


def test_multi_entry_transaction_with_missing_link_is_history_lost(log: Oplog) -> None:
    start = log.peek_ts()
    txn = log.transaction(make_lsid(2), 5)
    partial = txn.partial([log.op_insert(C1, {"_id": 10})])
    txn.commit([log.op_insert(C1, {"_id": 11})])
    pipeline = open_stream("collection", start, None)
    pipeline.history = None  # the source lost the partial link
    with pytest.raises(MongoError) as err:
        pipeline.process(log.entries)
    assert err.value.code == 286
    ts = partial["ts"]
    assert err.value.errmsg.endswith(
        f"log with opTime {{ ts: Timestamp({ts.time}, {ts.inc}), t: 1 }} cannot be found"
    )


@pytest.mark.parametrize("scope", SCOPES)
def test_prepared_transaction(log: Oplog, scope: str) -> None:
    start = log.peek_ts()
    lsid = make_lsid(3)
    committed = log.transaction(lsid, 8)
    aborted = log.transaction(make_lsid(4), 1)
    ops = [log.op_insert(C1, {"_id": 30}), log.op_insert(C2, {"_id": 31})]
    more = [log.op_insert(C3, {"_id": 32}), log.op_delete(C1, 30)]
    committed.partial(ops)
    prepare = committed.prepare(more)
    aborted.prepare([log.op_insert(C1, {"_id": 40})])
    between = log.insert(C2, {"_id": 33})
    aborted.abort()
    commit = committed.commit_prepared(commit_ts=prepare["ts"])
    events, _ = run(scope, log, start)
    visible = [(i, op) for i, op in enumerate(ops + more) if op["ns"] in SEES[scope]]
    got = events
    if C2 in SEES[scope]:
        assert got[0]["clusterTime"] == between["ts"]
        got = got[1:]
    assert len(got) == len(visible)
    for event, (index, op) in zip(got, visible):
        # clusterTime and wallTime: the commitTransaction entry's, not commitTimestamp.
        expected = txn_expected(commit, op, lsid, 8, False)
        check_event(event, expected)
        key = op["o"] if op["op"] == "d" else op["o2"]
        check_token(event, expected["operationType"], commit["ts"], op["ui"], document_key=key,
                    txn_op_index=index)


def test_retryable_batched_write_is_not_a_transaction(log: Oplog) -> None:
    """8.0 `applyOps` with `multiOpType: 1`: events without lsid/txnNumber, txnOpIndex kept."""
    start = log.peek_ts()
    entry = log.apply_ops(
        [log.op_insert(C1, {"_id": 1}), log.op_insert(C1, {"_id": 2})],
        retryable={"lsid": make_lsid(9), "txnNumber": 1},
    )
    events, _ = run("collection", log, start)
    assert [list(e)[0] for e in events] == ["_id", "_id"]
    for i, event in enumerate(events):
        check_token(event, "insert", entry["ts"], log.uuid(C1), document_key={"_id": i + 1},
                    txn_op_index=i)


# -- invalidation --------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ("collection", "database"))
def test_nothing_after_invalidate(log: Oplog, scope: str) -> None:
    start = log.peek_ts()
    before = log.insert(C1, {"_id": 1})
    if scope == "collection":
        invalidating = log.drop(C1)
    else:
        invalidating = log.drop_database("test")[-1]
    pipeline = open_stream(scope, start, log)
    pipeline.push(log.entries[:-1] + [invalidating])
    log.insert(C1, {"_id": 2})
    log.insert(C2, {"_id": 2})
    pipeline.push(log.entries[-2:])  # later entries change nothing
    batch = pipeline.next_batch()
    events = decoded(batch)
    assert events[0]["clusterTime"] == before["ts"]
    assert events[-1]["operationType"] == "invalidate"
    assert events[-2]["clusterTime"] == invalidating["ts"]
    assert batch.invalidated
    assert batch.post_batch_resume_token == events[-1]["_id"]
    again = pipeline.next_batch()
    assert again.events == [] and again.invalidated
    assert again.post_batch_resume_token == events[-1]["_id"]


def test_cluster_stream_is_never_invalidated(log: Oplog) -> None:
    start = log.peek_ts()
    log.drop(C1)
    log.rename(C2, "test.x")
    log.drop_database("test")
    log.insert(C1, {"_id": 1})
    events, batch = run("cluster", log, start)
    assert "invalidate" not in [e["operationType"] for e in events]
    assert events[-1]["operationType"] == "insert"
    assert not batch.invalidated


@pytest.mark.parametrize("scope", ("collection", "database"))
def test_start_after_invalidate_continues_past_it(log: Oplog, scope: str) -> None:
    start = log.peek_ts()
    if scope == "collection":
        log.drop(C1)
    else:
        log.drop_database("test")
    first_after = log.insert(C1, {"_id": 1})  # re-creates the collection / the database
    log.drop(C1)
    if scope == "database":
        log.drop_database("test")
    log.insert(C1, {"_id": 2})
    events, _ = run(scope, log, start)
    invalidate = events[-1]
    assert invalidate["operationType"] == "invalidate"
    resumed, batch = run(
        scope, log, invalidate["clusterTime"], startAfter=invalidate["_id"]
    )
    # Swallows the invalidating event and its invalidate, goes on to the next invalidation.
    assert resumed[0]["clusterTime"] == first_after["ts"]
    assert resumed[0]["operationType"] == "insert"
    assert resumed[-1]["operationType"] == "invalidate"
    assert batch.invalidated
    assert tokens(resumed) == sorted(tokens(resumed))
    assert resumed[-1]["_id"] != invalidate["_id"]


def test_resume_after_invalidate_token_is_refused(log: Oplog) -> None:
    start = log.peek_ts()
    log.drop(C1)
    events, _ = run("collection", log, start)
    with pytest.raises(MongoError) as err:
        run("collection", log, events[1]["clusterTime"], resumeAfter=events[1]["_id"])
    assert err.value.code == 260
    assert err.value.errmsg == (
        "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
        "invalidate notification"
    )


@pytest.mark.parametrize("scope", ("collection", "database"))
def test_resume_after_invalidating_event_replays_just_the_invalidate(
    log: Oplog, scope: str
) -> None:
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    if scope == "collection":
        log.rename(C1, "test.gone")
    else:
        log.drop_database("test")
    log.insert(C1, {"_id": 2})
    events, _ = run(scope, log, start)
    invalidating = events[-2]
    resumed, batch = run(
        scope, log, invalidating["clusterTime"], resumeAfter=invalidating["_id"]
    )
    assert resumed == [events[-1]]
    assert batch.invalidated


# -- resuming ------------------------------------------------------------------------------------


def busy_oplog() -> tuple[Oplog, Timestamp]:
    log = Oplog()
    for ns in (C1, C2, C3):
        log.create(ns)
    start = log.peek_ts()
    txn = log.transaction(make_lsid(1), 1)
    txn.partial([log.op_insert(C1, {"_id": 1}), log.op_insert(C2, {"_id": 1})])
    log.insert(C1, {"_id": 2})
    txn.commit([log.op_update(C1, 1, {"u": {"x": 1}}), log.op_insert(C3, {"_id": 1})])
    log.noop()
    log.replace(C2, {"_id": 1, "y": 1})
    log.delete(C1, 2)
    log.insert(C3, {"_id": 2})
    log.create_indexes(C1, {"a": 1}, "a_1")
    log.insert(C1, {"_id": 3})
    return log, start


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("scope", SCOPES)
def test_resume_after_each_event_returns_exactly_the_rest(scope: str, expanded: bool) -> None:
    log, start = busy_oplog()
    events, _ = run(scope, log, start, showExpandedEvents=expanded)
    assert len(events) >= 4
    for key in ("resumeAfter", "startAfter"):
        for i, event in enumerate(events):
            resumed, batch = run(
                scope, log, event["clusterTime"], showExpandedEvents=expanded,
                **{key: event["_id"]},
            )
            assert resumed == events[i + 1 :], (key, i)
            assert list(map(list, resumed)) == list(map(list, events[i + 1 :]))


def test_resume_after_a_token_missing_from_the_stream_is_fatal(log: Oplog) -> None:
    start = log.peek_ts()
    e = log.insert(C1, {"_id": 1})
    log.insert(C1, {"_id": 2})
    events, _ = run("collection", log, start)
    # A token for an event that never happened at that time (another documentKey).
    ghost = ResumeTokenData.for_event(
        e["ts"], "insert", uuid=bytes(log.uuid(C1)), document_key={"_id": 0}
    ).to_document()
    pipeline = open_stream("collection", e["ts"], log, resumeAfter=ghost)
    with pytest.raises(MongoError) as err:
        pipeline.process(log.entries)
    assert err.value.code == 280
    assert err.value.code_name == "ChangeStreamFatalError"
    # mongod quotes the first event past the resume point: here the real insert at that
    # time, whose documentKey sorts after the ghost's.
    assert err.value.errmsg == (
        "cannot resume stream; the resume token was not found. "
        f'{{_data: "{events[0]["_id"]["_data"]}"}}'
    )


def test_resume_token_in_the_future_swallows_everything_until_it(log: Oplog) -> None:
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    events, _ = run("collection", log, start)
    later = ResumeTokenData.for_event(
        Timestamp(log.last_ts.time + 100, 1), "insert", uuid=bytes(log.uuid(C1)),
        document_key={"_id": 1},
    ).to_document()
    resumed, batch = run("collection", log, events[0]["clusterTime"], resumeAfter=later)
    assert resumed == []
    assert batch.post_batch_resume_token == later  # not moved back


def test_start_at_operation_time_includes_that_time(log: Oplog) -> None:
    start = log.peek_ts()
    txn = log.transaction(make_lsid(1), 1)
    commit = txn.commit([log.op_insert(C1, {"_id": 1}), log.op_insert(C1, {"_id": 2})])
    log.insert(C1, {"_id": 3})
    events, _ = run("collection", log, start)
    at, _ = run("collection", log, commit["ts"], startAtOperationTime=commit["ts"])
    assert at == events
    after, _ = run(
        "collection", log, Timestamp(commit["ts"].time, commit["ts"].inc + 1),
        startAtOperationTime=Timestamp(commit["ts"].time, commit["ts"].inc + 1),
    )
    assert after == events[2:]


def test_resume_after_a_high_water_mark_token(log: Oplog) -> None:
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    noop = log.noop()
    log.insert(C1, {"_id": 2})
    pipeline = open_stream("collection", start, log)
    first = pipeline.process(log.entries[:-1])
    assert first.post_batch_resume_token == {"_data": hwm_data(noop["ts"])}
    rest = decoded(pipeline.process(log.entries[-1:]))
    resumed, _ = run("collection", log, noop["ts"], resumeAfter=first.post_batch_resume_token)
    assert resumed == rest and len(rest) == 1


def test_check_history() -> None:
    log = Oplog()
    first = log.noop("initiating set")
    log.insert(C1, {"_id": 1})
    pipeline = open_stream("collection", Timestamp(first["ts"].time - 10, 1), log)
    pipeline.check_history(first)  # the replica set's first entry: nothing was lost
    pipeline.check_history(None)  # an empty oplog
    second = log.entries[1]
    with pytest.raises(MongoError) as err:
        pipeline.check_history(second)
    assert err.value.code == 286
    assert err.value.code_name == "ChangeStreamHistoryLost"
    assert err.value.errmsg == (
        "Resume of change stream was not possible, as the resume point may no longer be in the "
        "oplog."
    )
    at = open_stream("collection", second["ts"], log)
    at.check_history(second)  # oldest entry == start: still there
    at.check_history(first)


# -- batches and post-batch resume tokens --------------------------------------------------------


def test_initial_post_batch_resume_token() -> None:
    log = Oplog()
    start = log.peek_ts()
    batch = open_stream("collection", start, log).next_batch()
    assert batch.events == [] and not batch.invalidated
    assert batch.post_batch_resume_token == {"_data": hwm_data(start)}
    log.insert(C1, {"_id": 1})
    events, _ = run("collection", log, start)
    resumed = open_stream("collection", start, log, resumeAfter=events[0]["_id"])
    assert resumed.next_batch().post_batch_resume_token == events[0]["_id"]


def test_batch_size_is_honoured(log: Oplog) -> None:
    start = log.peek_ts()
    for i in range(5):
        log.insert(C1, {"_id": 10 + i})
    log.noop()
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries)
    everything = decoded(open_stream("collection", start, log).process(log.entries))
    got: list[dict[str, Any]] = []
    b1 = pipeline.next_batch(2)
    assert len(b1.events) == 2
    assert b1.post_batch_resume_token == decoded(b1)[-1]["_id"]
    got += decoded(b1)
    b2 = pipeline.next_batch(2)
    assert len(b2.events) == 2
    assert b2.post_batch_resume_token == decoded(b2)[-1]["_id"]
    got += decoded(b2)
    b3 = pipeline.next_batch(2)  # the last event, then EOF: a high-water mark
    assert len(b3.events) == 1
    assert b3.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}
    got += decoded(b3)
    assert got == everything


def test_batch_filled_exactly_reports_the_last_event(log: Oplog) -> None:
    # The batch ended because it was full, not at EOF: its token is the last event's; the
    # high-water mark only comes with the next (empty) batch (§9.3).
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    log.insert(C1, {"_id": 2})
    log.noop()
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries)
    batch = pipeline.next_batch(2)
    assert batch.post_batch_resume_token == decoded(batch)[-1]["_id"]
    empty = pipeline.next_batch(2)
    assert empty.events == []
    assert empty.post_batch_resume_token == {"_data": hwm_data(log.last_ts)}


def test_batch_size_zero_returns_the_current_token(log: Oplog) -> None:
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries)
    batch = pipeline.next_batch(0)
    assert batch.events == []
    assert batch.post_batch_resume_token == {"_data": hwm_data(start)}
    assert len(pipeline.next_batch(None).events) == 1


def test_invalidate_filling_the_batch_closes_the_stream_on_the_next_one(log: Oplog) -> None:
    start = log.peek_ts()
    log.drop(C1)
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries)
    first = pipeline.next_batch(1)
    assert [e["operationType"] for e in decoded(first)] == ["drop"] and not first.invalidated
    second = pipeline.next_batch(1)
    assert [e["operationType"] for e in decoded(second)] == ["invalidate"]
    assert not second.invalidated  # full batch: the end is seen by the next getMore
    third = pipeline.next_batch(1)
    assert third.events == [] and third.invalidated
    assert third.post_batch_resume_token == decoded(second)[0]["_id"]


def test_high_water_mark_after_only_no_ops(log: Oplog) -> None:
    start = log.peek_ts()
    pipeline = open_stream("database", start, log)
    n1 = log.noop()
    pipeline.push(log.entries)
    batch = pipeline.next_batch()
    assert batch.events == []
    assert batch.post_batch_resume_token == {"_data": hwm_data(n1["ts"])}
    data = resume_token.decode(batch.post_batch_resume_token)
    assert (data.version, data.token_type, data.cluster_time) == (2, 0, n1["ts"])
    assert data.is_high_water_mark
    # The source read further than the entries it handed over (scanned_to).
    scanned = Timestamp(n1["ts"].time + 30, 7)
    pipeline.push([], scanned_to=scanned)
    assert pipeline.next_batch().post_batch_resume_token == {"_data": hwm_data(scanned)}
    # Never backwards.
    pipeline.push([], scanned_to=n1["ts"])
    assert pipeline.next_batch().post_batch_resume_token == {"_data": hwm_data(scanned)}


def test_post_batch_token_does_not_pass_pending_events(log: Oplog) -> None:
    start = log.peek_ts()
    for i in range(3):
        log.insert(C1, {"_id": i + 1})
    log.noop()
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries, scanned_to=Timestamp(log.last_ts.time + 5, 1))
    batch = pipeline.next_batch(1)
    assert batch.post_batch_resume_token == decoded(batch)[0]["_id"]


# -- token versions ------------------------------------------------------------------------------


def test_resumed_v1_token_keeps_v1_until_past_its_time(log: Oplog) -> None:
    txn = log.transaction(make_lsid(1), 1)
    ops = [log.op_insert(C1, {"_id": i}) for i in (1, 2, 3)]
    commit = txn.commit(ops)
    later = log.insert(C1, {"_id": 4})
    uuid = bytes(log.uuid(C1))
    # A v1 token for the first op of the transaction (v1: eventIdentifier = documentKey).
    v1 = ResumeTokenData(
        commit["ts"], version=1, txn_op_index=0, uuid=uuid,
        event_identifier=bson.encode({"_id": 1}),
    ).to_document()
    for key in ("resumeAfter", "startAfter"):
        events, batch = run("collection", log, commit["ts"], **{key: v1})
        assert [e["documentKey"]["_id"] for e in events] == [2, 3, 4]
        versions = [resume_token.decode(e["_id"]).version for e in events]
        assert versions == [1, 1, 2]
        data = resume_token.decode(events[0]["_id"])
        assert data.event_identifier_document() == {"_id": 2}
        assert data.txn_op_index == 1
        check_token(events[2], "insert", later["ts"], log.uuid(C1), document_key={"_id": 4})
        assert batch.post_batch_resume_token == events[-1]["_id"]
    # Before any event: the client's v1 token is the post-batch token.
    p = open_stream("collection", commit["ts"], log, resumeAfter=v1)
    assert p.next_batch().post_batch_resume_token == v1


# -- user stages and the end of the stream -------------------------------------------------------


def test_invalidate_hidden_by_a_user_match_still_closes_the_stream(log: Oplog) -> None:
    """The invalidate comes out of CheckInvalidate before the user's `$match`, which may drop
    it; mongod still closes the cursor and reports the invalidate's token (it takes it from
    the ChangeStreamInvalidated exception, not from the returned events)."""
    start = log.peek_ts()
    log.insert(C1, {"_id": 1})
    drop = log.drop(C1)
    log.insert(C1, {"_id": 2})
    pipeline = open_stream("collection", start, log)
    pipeline.push(log.entries)
    cmd = {"aggregate": "c1", "pipeline": [{"$changeStream": {}},
                                           {"$match": {"operationType": "insert"}}]}
    hidden = ChangeStreamPipeline(parse_aggregate(cmd, "test"), start, history=log.history())
    batch = hidden.process(log.entries)
    assert [e["operationType"] for e in decoded(batch)] == ["insert"]
    assert batch.invalidated
    invalidate = ResumeTokenData.for_event(drop["ts"], "drop", uuid=bytes(drop["ui"]))
    invalidate.from_invalidate = True
    assert batch.post_batch_resume_token == invalidate.to_document()
    # The same token the unfiltered stream reports with its invalidate event.
    assert pipeline.next_batch().post_batch_resume_token == invalidate.to_document()


def test_user_stage_keeps_the_event_field_order(log: Oplog) -> None:
    """`to` and `txnNumber`/`lsid` stay in front of `_id` through a pass-through `$match`."""
    start = log.peek_ts()
    log.transaction(make_lsid(1), 1).commit([log.op_insert(C1, {"_id": 1})])
    log.rename(C1, "test.moved")
    cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {}}, {"$match": {}}]}
    pipeline = ChangeStreamPipeline(parse_aggregate(cmd, "test"), start, history=log.history())
    events = decoded(pipeline.process(log.entries))
    assert [list(e)[:3] for e in events] == [
        ["txnNumber", "lsid", "_id"], ["to", "_id", "operationType"],
    ]


def test_user_stages_keep_fields_before_id_in_mongods_order() -> None:
    # `to` (rename) comes before `_id`; a stage that rebuilds the event must not move `_id`
    # to the front the way a plain bson.encode of a dict would.
    log = Oplog()
    log.insert(C1, {"_id": 1})
    log.rename(C1, C2)
    cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {}}, {"$addFields": {"z": 1}}]}
    pipeline = ChangeStreamPipeline(parse_aggregate(cmd, split_ns(C1)[0]), log.entries[0]["ts"])
    events = decoded(pipeline.process(log.entries))
    assert [list(e)[:2] for e in events] == [["_id", "operationType"], ["to", "_id"]]
    assert all(e["z"] == 1 for e in events)
