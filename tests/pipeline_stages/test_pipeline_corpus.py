"""Real oplogs through the whole pipeline: every oplog file of the corpus
(`corpus/oplog/mongodb-mongo-tools/**/*.bson`, plus the Extended JSON lines of
`mongorestore/testdata/oplogs/oplog.json` and the transaction vectors of
`common/txn/testdata/oplog_entries.json`), through a cluster stream, a database stream per
database and a collection stream per collection seen, with and without expanded events.

For each stream: no unexpected error; every event passes a structural check (the fields each
operation type needs, in the order of reference §4.3, a decodable `_id` whose clusterTime and
eventIdentifier agree with the event, an `ns` the stream may report); events strictly increase
by token; the post-batch token is what §9.3 says; resuming from events' tokens gives the rest.
The derived Extended JSON lines (`corpus/oplog/derived-jsonl/`) must give the same events as
their BSON originals.
"""

from __future__ import annotations

import datetime
import pathlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import bson
import pytest
from bson import json_util
from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import Entry, decode_entry, iter_entries, split_ns
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import MemoryHistory

# Only to list the files at collection time; the tests themselves use the `shared_dir` fixture.
_SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared"
TOOLS = pathlib.Path("corpus/oplog/mongodb-mongo-tools")
DERIVED = pathlib.Path("corpus/oplog/derived-jsonl/mongodb-mongo-tools")
JSON_LINES_OPLOGS = (TOOLS / "mongorestore/testdata/oplogs/oplog.json",)
TXN_VECTORS = TOOLS / "common/txn/testdata/oplog_entries.json"


def _list(pattern_root: pathlib.Path, pattern: str) -> list[str]:
    root = _SHARED / pattern_root
    if not root.is_dir():
        return ["(corpus missing)"]
    return sorted(str(p.relative_to(_SHARED)) for p in root.rglob(pattern))


BSON_FILES = _list(TOOLS, "*.bson")
JSONL_FILES = _list(DERIVED, "*.jsonl")

# Collection dumps (documents, not oplog entries) that sit next to the oplogs.
NOT_OPLOGS = {
    "mongorestore/testdata/duplicate_index_key_with_oplog/test/foo.bson",
    "mongorestore/testdata/oplogdump/db1/c1.bson",
}

CLASSIC = {"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate"}
CRUD = {"insert", "update", "replace", "delete"}
DDL = {
    "create", "createIndexes", "dropIndexes", "modify", "shardCollection",
    "refineCollectionShardKey", "reshardCollection",
}
INTERNAL_DBS = {"admin", "config", "local"}

# §4.3: every field an event may have, in the order mongod writes them.
ORDER = [
    "to", "reshardingUUID", "txnNumber", "lsid", "_id", "operationType", "clusterTime",
    "collectionUUID", "wallTime", "fullDocument", "ns", "documentKey", "operationDescription",
    "updateDescription", "stateBeforeChange", "nsType",
]
REQUIRED = {
    "insert": {"fullDocument", "ns", "documentKey"},
    "update": {"ns", "documentKey", "updateDescription"},
    "replace": {"fullDocument", "ns", "documentKey"},
    "delete": {"ns", "documentKey"},
    "drop": {"ns"},
    "rename": {"to", "ns"},
    "dropDatabase": {"ns"},
    "modify": {"ns", "stateBeforeChange"},
    "invalidate": set(),
    **{kind: {"ns"} for kind in DDL - {"modify"}},
}
HEAD = {"_id", "operationType", "clusterTime", "wallTime"}
SESSION = {"txnNumber", "lsid"}
ALLOWED = {
    kind: HEAD | required | {"collectionUUID"}
    | (SESSION if kind in CRUD | {"create", "createIndexes"} else set())
    | ({"operationDescription"} if kind in DDL | {"rename"} else set())
    | ({"nsType"} if kind == "create" else set())
    for kind, required in REQUIRED.items()
}
ALLOWED["invalidate"] = HEAD
ALLOWED["dropDatabase"] = HEAD | {"ns"}


# -- loading ------------------------------------------------------------------------------------


def _from_json(doc: Mapping[str, Any]) -> Entry:
    # Encoded as an embedded document so that no `_id` is moved to the front.
    return decode_entry(bson.encode({"": doc})[6:-1])


def load_bson(path: pathlib.Path) -> list[Entry]:
    return list(iter_entries(path.read_bytes()))


def load_json_lines(path: pathlib.Path) -> list[Entry]:
    lines = path.read_text().splitlines()
    return [_from_json(json_util.loads(line)) for line in lines if line.strip()]


def is_oplog(entries: Sequence[Mapping[str, Any]]) -> bool:
    return bool(entries) and all(
        isinstance(e.get("ts"), Timestamp) and isinstance(e.get("op"), str) for e in entries
    )


def ascending(entries: Iterable[Entry]) -> list[Entry]:
    """The entries a source would deliver: strictly increasing `ts`. (Two test files have
    earlier entries appended again at their end; a real oplog never goes back.)"""
    out: list[Entry] = []
    for e in entries:
        if not out or e["ts"] > out[-1]["ts"]:
            out.append(e)
    return out


def namespaces(entries: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every `db.coll` the entries touch (CRUD, DDL commands, renames, applyOps contents)."""
    out: set[str] = set()

    def visit(e: Mapping[str, Any]) -> None:
        op, ns = e.get("op"), e.get("ns")
        if not isinstance(ns, str) or not ns:
            return
        db, coll = split_ns(ns)
        if op in ("i", "u", "d"):
            out.add(ns)
        elif op == "c" and isinstance(e.get("o"), Mapping):
            o = e["o"]
            for name in ("create", "drop", "createIndexes", "commitIndexBuild",
                         "startIndexBuild", "dropIndexes", "collMod"):
                if isinstance(o.get(name), str):
                    out.add(f"{db}.{o[name]}")
            for name in ("renameCollection", "to"):
                if isinstance(o.get(name), str):
                    out.add(o[name])
            for inner in o.get("applyOps") or []:
                if isinstance(inner, Mapping):
                    visit(inner)

    for e in entries:
        visit(e)
    return out


# -- streams ------------------------------------------------------------------------------------


def stream_commands(entries: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(scope, db, coll) of every stream to open over these entries."""
    nss = sorted(namespaces(entries))
    dbs = sorted({split_ns(ns)[0] for ns in nss})
    return (
        [("cluster", "admin", None)]
        + [("database", db, None) for db in dbs]
        + [("collection", *split_ns(ns)) for ns in nss]
    )


def open_stream(
    scope: str, db: str, coll: str | None, expanded: bool, start: Timestamp,
    history: MemoryHistory, **options: Any,
) -> ChangeStreamPipeline:
    options = {"showExpandedEvents": expanded, **options}
    if scope == "cluster":
        options["allChangesForCluster"] = True
    cmd = {"aggregate": coll if scope == "collection" else 1,
           "pipeline": [{"$changeStream": options}]}
    return ChangeStreamPipeline(parse_aggregate(cmd, db), start, history=history)


def events_of(pipeline: ChangeStreamPipeline, entries: Sequence[Entry]) -> tuple[list, Any]:
    batch = pipeline.process([e for e in entries if e["ts"] >= pipeline.start])
    return [bson.decode(e.raw) for e in batch.events], batch


# -- the structural check -----------------------------------------------------------------------


def check_ns(event: Mapping[str, Any], scope: str, db: str, coll: str | None) -> None:
    kind = event["operationType"]
    ns = event["ns"]
    if kind == "dropDatabase":
        assert list(ns) == ["db"]
    else:
        assert list(ns) == ["db", "coll"]
        assert isinstance(ns["coll"], str) and ns["coll"]
    assert isinstance(ns["db"], str) and ns["db"]
    if scope == "collection":
        watched = {"db": db, "coll": coll}
        assert ns == watched or (kind == "rename" and event["to"] == watched), event
    elif scope == "database":
        assert ns["db"] == db
    else:
        assert ns["db"] not in INTERNAL_DBS
    if kind not in ("dropDatabase",):
        assert not ns["coll"].startswith("system.") and not ns["coll"].startswith("$")


def check_event(
    event: Mapping[str, Any], scope: str, db: str, coll: str | None, expanded: bool
) -> resume_token.ResumeTokenData:
    kind = event["operationType"]
    assert kind in REQUIRED, kind
    fields = list(event)
    assert set(fields) <= ALLOWED[kind], (kind, fields)
    assert fields == sorted(fields, key=ORDER.index), fields
    assert REQUIRED[kind] | {"_id", "operationType", "clusterTime"} <= set(fields), fields
    if not expanded:
        assert kind in CLASSIC
        assert "collectionUUID" not in event and "operationDescription" not in event

    token = resume_token.decode(event["_id"])
    assert token.version == 2 and token.token_type == resume_token.EVENT_TOKEN
    assert token.cluster_time == event["clusterTime"]
    assert token.from_invalidate is (kind == "invalidate")
    assert token.fragment_num is None
    if "wallTime" in event:
        assert isinstance(event["wallTime"], datetime.datetime)
    identifier = token.event_identifier_document()
    assert identifier is not None
    if kind != "invalidate":
        assert identifier["operationType"] == kind
        check_ns(event, scope, db, coll)
    if kind in CRUD:
        assert list(identifier) == ["operationType", "documentKey"]
        assert identifier["documentKey"] == event["documentKey"]
        assert "_id" in event["documentKey"]
    if kind in ("insert", "replace"):
        assert isinstance(event["fullDocument"], Mapping)
    if kind == "update":
        description = event["updateDescription"]
        assert {"updatedFields", "removedFields"} <= set(description)
        if "truncatedArrays" in description:  # a $v:2 update (legacy $v:1 ones have none)
            assert ("disambiguatedPaths" in description) is expanded
        else:
            assert set(description) == {"updatedFields", "removedFields"}
    if "operationDescription" in event:
        assert identifier == {"operationType": kind,
                              "operationDescription": event["operationDescription"]}
    if expanded and kind in DDL | {"rename"}:
        assert "operationDescription" in event
    # The token's UUID is the entry's `ui` (absent before 3.6), shown as collectionUUID.
    if token.uuid is None or kind == "invalidate":
        assert "collectionUUID" not in event
    elif expanded:
        assert bytes(event["collectionUUID"]) == token.uuid
    if kind == "dropDatabase":
        assert token.uuid is None
    if "lsid" in event or "txnNumber" in event:
        assert "lsid" in event and "txnNumber" in event and "id" in event["lsid"]
    return token


def check_stream(
    events: list[dict[str, Any]], batch: Any, entries: Sequence[Entry], scope: str, db: str,
    coll: str | None, expanded: bool,
) -> None:
    previous = None
    for i, event in enumerate(events):
        token = check_event(event, scope, db, coll, expanded)
        if event["operationType"] == "invalidate":
            assert scope != "cluster"
            assert i == len(events) - 1 and i > 0
            assert events[i - 1]["operationType"] in ("drop", "rename", "dropDatabase")
            assert previous is not None
            previous.from_invalidate = True
            assert previous.to_document()["_data"] == event["_id"]["_data"]
            assert batch.invalidated
        previous = token
    data = [e["_id"]["_data"] for e in events]
    assert all(a < b for a, b in zip(data, data[1:]))
    # §9.3: the post-batch token.
    last_ts = entries[-1]["ts"]
    pbrt = bson.decode(bson.encode(batch.post_batch_resume_token))
    if batch.invalidated:
        assert pbrt == events[-1]["_id"]
    elif events and events[-1]["clusterTime"] == last_ts:
        assert pbrt == events[-1]["_id"]
    else:
        hwm = resume_token.decode(batch.post_batch_resume_token)
        assert hwm.is_high_water_mark and hwm.cluster_time == last_ts and hwm.version == 2


def check_resumes(
    events: list[dict[str, Any]], entries: Sequence[Entry], history: MemoryHistory,
    scope: str, db: str, coll: str | None, expanded: bool,
) -> None:
    """Resuming from (a sample of) the events' tokens gives exactly what followed."""
    picks = range(len(events))
    if len(events) > 8:
        step = len(events) // 6
        picks = sorted({0, len(events) - 1, *range(0, len(events), step)})
    for i in picks:
        token = events[i]["_id"]
        at = events[i]["clusterTime"]
        if scope == "collection" and resume_token.decode(token).uuid is None:
            # Entries written before 3.6 have no `ui`: a collection stream cannot resume.
            with pytest.raises(MongoError) as err:
                open_stream(scope, db, coll, expanded, at, history, resumeAfter=token)
            assert err.value.code == 260
            continue
        if events[i]["operationType"] == "invalidate":
            resumed, _ = events_of(
                open_stream(scope, db, coll, expanded, at, history, startAfter=token), entries
            )
            after = Timestamp(at.time, at.inc + 1)
            expected, _ = events_of(
                open_stream(scope, db, coll, expanded, after, history,
                            startAtOperationTime=after),
                entries,
            )
        else:
            resumed, _ = events_of(
                open_stream(scope, db, coll, expanded, at, history, resumeAfter=token), entries
            )
            expected = events[i + 1 :]
        assert resumed == expected, (scope, db, coll, i)


def run_all_streams(entries: list[Entry]) -> Counter[tuple[str, bool, str]]:
    """Every stream over `entries`; returns (scope, expanded, operationType) counts."""
    entries = ascending(entries)
    history = MemoryHistory(entries)
    start = entries[0]["ts"]
    counts: Counter[tuple[str, bool, str]] = Counter()
    for scope, db, coll in stream_commands(entries):
        for expanded in (False, True):
            try:
                pipeline = open_stream(scope, db, coll, expanded, start, history)
            except MongoError as err:
                # Streams mongod refuses to open: internal databases, system collections.
                assert err.code == 73, err
                assert db in INTERNAL_DBS or (coll or "").startswith("system."), (db, coll)
                continue
            pipeline.check_history(entries[0])
            events, batch = events_of(pipeline, entries)
            check_stream(events, batch, entries, scope, db, coll, expanded)
            check_resumes(events, entries, history, scope, db, coll, expanded)
            for event in events:
                counts[(scope, expanded, event["operationType"])] += 1
    return counts


# -- the tests ----------------------------------------------------------------------------------

# What the cluster stream reports for some files (operationType counts, expanded events),
# worked out by reading the files (derived-jsonl twins). Regression pins.
CLUSTER_EXPANDED = {
    # 8.x: a retryable insert, then collMod of a TTL index.
    "mongorestore/testdata/collMod_ttl_index/oplog.bson": {"insert": 1, "modify": 1},
    # 4.4: create, insert, startIndexBuild (no event), commitIndexBuild (the file then repeats
    # the two index-build entries with earlier timestamps: not delivered).
    "mongorestore/testdata/commit_indexes_build/oplog.bson": {
        "create": 1, "insert": 1, "createIndexes": 1,
    },
    # 4.2: create, "Creating indexes" no-op, createIndexes (repeated later: not delivered).
    "mongorestore/testdata/create_indexes/oplog.bson": {"create": 1, "createIndexes": 1},
    # 8.0 retryable batched inserts (multiOpType 1), 3 + 2 documents over two linked entries.
    "mongorestore/testdata/oplogs/bson/linked_vectored_inserts.bson": {"insert": 5},
    "mongorestore/testdata/oplogs/bson/drop_db.bson": {"dropDatabase": 1},
    "mongorestore/testdata/oplogs/bson/drop_collection.bson": {"drop": 1},
    "mongorestore/testdata/oplogs/bson/drop_index.bson": {"dropIndexes": 1},
    "mongorestore/testdata/oplogs/bson/collMod_indexUniqueness.bson": {
        "create": 1, "createIndexes": 4, "modify": 20,
    },
    # 4.4: startIndexBuild, abortIndexBuild: no events.
    "mongorestore/testdata/oplog_ignore_index/oplog.bson": {},
    # 5.0 time-series: updates of system.buckets.* are never reported.
    "mongorestore/testdata/timeseries_tests/ts_dump_with_oplog/oplog.bson": {},
}


@pytest.mark.parametrize("name", BSON_FILES)
def test_corpus_bson_oplog(shared_dir: pathlib.Path, name: str) -> None:
    path = shared_dir / name
    if not path.is_file():
        pytest.skip(f"{name} is not in the corpus")
    relative = str(pathlib.Path(name).relative_to(TOOLS))
    entries = load_bson(path)
    if relative in NOT_OPLOGS:
        assert not is_oplog(entries)
        return
    assert is_oplog(entries), f"{relative}: not an oplog (add it to NOT_OPLOGS if expected)"
    counts = run_all_streams(entries)
    if relative in CLUSTER_EXPANDED:
        got = {k: n for (scope, expanded, k), n in counts.items()
               if scope == "cluster" and expanded}
        assert got == CLUSTER_EXPANDED[relative]


def test_corpus_ddl_lifecycle_json_lines(shared_dir: pathlib.Path) -> None:
    """`oplogs/oplog.json`: a real 4.4/5.0 DDL history of test2 (create, index builds, drops,
    collMod, dropDatabase, re-creation) — invalidations and startAfter across them."""
    path = shared_dir / JSON_LINES_OPLOGS[0]
    if not path.is_file():
        pytest.skip("oplog.json is not in the corpus")
    entries = ascending(load_json_lines(path))
    counts = run_all_streams(entries)
    assert counts[("cluster", True, "createIndexes")] == 6
    assert counts[("cluster", True, "dropIndexes")] == 3
    assert counts[("cluster", True, "modify")] == 2
    assert counts[("cluster", False, "drop")] == 3
    assert counts[("cluster", False, "dropDatabase")] == 1
    assert counts[("database", False, "invalidate")] == 1

    # The collection stream on test2.foo lives three times: follow it with startAfter.
    history = MemoryHistory(entries)
    start = entries[0]["ts"]
    lifetimes: list[list[str]] = []
    options: dict[str, Any] = {}
    while True:
        pipeline = open_stream("collection", "test2", "foo", True, start, history, **options)
        events, batch = events_of(pipeline, entries)
        lifetimes.append([e["operationType"] for e in events])
        if not batch.invalidated:
            break
        start, options = events[-1]["clusterTime"], {"startAfter": events[-1]["_id"]}
    assert lifetimes == [
        ["create", "createIndexes", "drop", "invalidate"],
        ["create", "createIndexes", "dropIndexes", "createIndexes", "dropIndexes",
         "createIndexes", "modify", "modify", "dropIndexes", "drop", "invalidate"],
        ["create", "createIndexes"],
    ]


def test_corpus_transaction_vectors(shared_dir: pathlib.Path) -> None:
    """mongo-tools' hand-made transaction shapes (applyOps, partialTxn, prepare,
    commitTransaction / abortTransaction, multiOpType), one oplog per case."""
    path = shared_dir / TXN_VECTORS
    if not path.is_file():
        pytest.skip("oplog_entries.json is not in the corpus")
    cases = json_util.loads(path.read_text())
    seen: dict[str, Counter[tuple[str, bool, str]]] = {}
    for name, case in cases.items():
        entries = [_from_json(doc) for doc in case["ops"]]
        assert [e["ts"] for e in entries] == sorted(e["ts"] for e in entries), name
        seen[name] = run_all_streams(entries)
    # Aborted prepared transactions produce nothing; committed ones their operations.
    assert sum(seen["small, prepared, aborted"].values()) == 0
    assert sum(seen["large, prepared, aborted"].values()) == 0
    committed = seen["small, prepared, committed"]
    assert sum(n for (s, x, _), n in committed.items() if s == "cluster" and not x) > 0


@pytest.mark.parametrize("name", JSONL_FILES)
def test_derived_json_lines_match_their_bson(shared_dir: pathlib.Path, name: str) -> None:
    path = shared_dir / name
    if not path.is_file():
        pytest.skip(f"{name} is not in the corpus")
    original = shared_dir / TOOLS / pathlib.Path(name).relative_to(DERIVED)
    original = original.with_name(original.name.removesuffix(".canonical.jsonl"))
    from_bson = load_bson(original)
    if not is_oplog(from_bson):
        return
    from_json = load_json_lines(path)
    assert from_json == from_bson  # nested documents compare by their bytes
    entries = ascending(from_bson)
    twin = ascending(from_json)
    history, twin_history = MemoryHistory(entries), MemoryHistory(twin)
    start = entries[0]["ts"]
    for scope, db, coll in stream_commands(entries)[:1]:  # the cluster stream
        for expanded in (False, True):
            a, _ = events_of(open_stream(scope, db, coll, expanded, start, history), entries)
            b, _ = events_of(open_stream(scope, db, coll, expanded, start, twin_history), twin)
            assert a == b
