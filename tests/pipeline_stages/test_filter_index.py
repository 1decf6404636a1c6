"""Filter groups and the filter index (pipeline_stages/filter_index.py) against independent
per-stream pipelines (Hypothesis).

Each example: a generated oplog (inserts, updates, replaces, deletes of documents whose fields
are missing, null, numbers of every BSON numeric type, strings, booleans, ObjectIds, arrays,
arrays of subdocuments, NaNs; transactions; drops and renames that invalidate), generated
streams (indexable, partly indexable and unindexable filters, stages after the `$match`),
joining and leaving at generated points, some resumed from a token. Every stream is fed twice:
through one `FilterGroup` (the index on) and through its own `ChangeStreamPipeline` (the index
off, as a stream with no group). Both must give the same event bytes, the same post-batch
resume tokens after every batch, the same invalidation and the same error.
"""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_stages.errors import MongoError
from pipeline_stages.filter_index import (
    FilterGroup,
    FilterIndex,
    compile_cover,
    group_key,
    plain_event,
    ready_to_join,
)
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import Oplog, make_lsid

OID = ObjectId("65a000000000000000000001")

# Values of mixed BSON types, several equal to 5 in a query.
VALUES: list[Any] = [
    5, 5.0, Int64(5), Decimal128("5"), Decimal128("5.00"), -0.0, 0, 1, 2, Int64(2**40),
    1.5, Decimal128("1.5"), True, False, "5", "a", "", None, OID, str(OID),
    [1, 5], [[5]], [], ["a", None], {"x": 5}, float("nan"), Decimal128("NaN"),
    float("inf"), Decimal128("Infinity"), Decimal128("sNaN"),
]
value = st.sampled_from(VALUES)
scalar = st.sampled_from([v for v in VALUES if not isinstance(v, (list, dict))])

field_names = st.sampled_from(["u", "v", "a.b", "a", "w.x.y"])


def set_path(doc: dict[str, Any], path: str, v: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        doc = doc.setdefault(part, {})
        if not isinstance(doc, dict):
            return
    doc[parts[-1]] = v


@st.composite
def documents(draw: Any, _id: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": _id}
    if draw(st.booleans()):
        doc["u"] = draw(value)
    if draw(st.booleans()):
        doc["v"] = draw(value)
    shape = draw(st.integers(0, 3))
    if shape == 1:
        doc["a"] = {"b": draw(value)}
    elif shape == 2:  # an array of subdocuments: paths go through it
        doc["a"] = [{"b": draw(value)}, {"c": 1}, {"b": draw(value)}]
    elif shape == 3:
        doc["a"] = draw(value)
    if draw(st.integers(0, 9)) == 0:
        doc["w"] = {"x": [{"y": draw(value)}]}
    return doc


ids = st.sampled_from([1, 2, 3, "k", OID, 2.0])

# -- filters ------------------------------------------------------------------------------------

fd_paths = st.sampled_from(["fullDocument.u", "fullDocument.v", "fullDocument.a.b",
                            "fullDocument.w.x.y", "fullDocument.a", "fullDocumentBeforeChange.u"])
op_types = st.sampled_from(["insert", "update", "replace", "delete", "drop", "rename",
                            "invalidate"])


def _atom(draw: Any) -> dict[str, Any]:
    kind = draw(st.integers(0, 12))
    if kind <= 2:
        return {draw(fd_paths): draw(value)}
    if kind == 3:
        return {draw(fd_paths): {"$in": draw(st.lists(scalar, max_size=3))}}
    if kind == 4:
        return {"operationType": draw(op_types)}
    if kind == 5:
        return {"operationType": {"$in": draw(st.lists(op_types, min_size=1, max_size=3))}}
    if kind == 6:
        return {"documentKey._id": draw(ids)}
    if kind == 7:
        return {"ns.coll": draw(st.sampled_from(["x", "y", "z"]))}
    if kind == 8:
        return {"updateDescription.updatedFields."
                + draw(st.sampled_from(["u", "v", "a", "a.b"])): {"$exists": True}}
    if kind == 9:
        return {draw(fd_paths): {"$eq": draw(value)}}
    if kind == 10:  # not indexed: ranges, $ne, $nin
        op = draw(st.sampled_from(["$gt", "$lte", "$ne", "$nin"]))
        arg = draw(st.lists(scalar, max_size=2)) if op == "$nin" else draw(scalar)
        return {draw(fd_paths): {op: arg}}
    if kind == 11:
        return {"ns": {"db": "a", "coll": draw(st.sampled_from(["x", "y"]))}}
    return {"fullDocument.u": {"$exists": draw(st.booleans())}}


@st.composite
def filters(draw: Any) -> dict[str, Any]:
    shape = draw(st.integers(0, 6))
    if shape <= 2:
        return _atom(draw)
    if shape == 3:
        a, b = _atom(draw), _atom(draw)
        return {**b, **a}
    if shape == 4:
        return {"$and": [_atom(draw), _atom(draw)]}
    if shape == 5:
        return {"$or": [_atom(draw), _atom(draw)]}
    return {"$nor": [_atom(draw)]}


@st.composite
def user_pipelines(draw: Any) -> list[dict[str, Any]]:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return []
    if kind == 1:
        return [{"$project": {"operationType": 1, "fullDocument.u": 1}}]
    f = draw(filters())
    if kind == 2:
        return [{"$match": f}, {"$project": {"fullDocument": 0}}]
    if kind == 3:
        return [{"$match": f}, {"$match": draw(filters())}]
    return [{"$match": f}]


# -- oplogs -------------------------------------------------------------------------------------

NSS = ("a.x", "a.y", "b.z")


@st.composite
def actions(draw: Any) -> list[tuple[Any, ...]]:
    out = []
    for _ in range(draw(st.integers(2, 18))):
        kind = draw(st.sampled_from(["insert"] * 4 + ["update"] * 3 + ["replace", "delete",
                                     "txn", "noop", "join", "leave", "invalidate"]))
        ns = draw(st.sampled_from(NSS[:2] * 3 + NSS[2:]))
        _id = draw(ids)
        if kind in ("insert", "replace"):
            out.append((kind, ns, draw(documents(_id))))
        elif kind == "update":
            diff: dict[str, Any] = {}
            if draw(st.booleans()):
                diff["d"] = {"w": False}
            if draw(st.booleans()):
                diff["u"] = {"u": draw(value)}
            else:
                diff["i"] = {draw(st.sampled_from(["u", "v", "a"])): draw(value)}
            out.append(("update", ns, _id, diff))
        elif kind == "delete":
            out.append(("delete", ns, _id))
        elif kind == "txn":
            out.append(("txn", ns, draw(documents(_id)), draw(documents(7))))
        elif kind == "join":
            out.append(("join", draw(user_pipelines()), draw(st.integers(0, 3))))
        elif kind == "leave":
            out.append(("leave", draw(st.integers(0, 50))))
        elif kind == "invalidate":
            if draw(st.integers(0, 3)) == 0:
                out.append(("invalidate", draw(st.sampled_from(["drop", "rename"]))))
        else:
            out.append(("noop",))
    return out


SCOPES = [("collection", False), ("database", False), ("cluster", True), ("collection", True)]


def spec_for(scope: str, expanded: bool, stages: list[dict[str, Any]], **options: Any) -> Any:
    options = {"showExpandedEvents": expanded, **options}
    if scope == "collection":
        db, cmd = "a", {"aggregate": "x"}
    elif scope == "database":
        db, cmd = "a", {"aggregate": 1}
    else:
        db, cmd = "admin", {"aggregate": 1}
        options["allChangesForCluster"] = True
    cmd["pipeline"] = [{"$changeStream": options}, *stages]
    return parse_aggregate(cmd, db)


class Stream:
    """One stream fed both ways: `member` through the group, `own` by itself."""

    def __init__(self, member: ChangeStreamPipeline, own: ChangeStreamPipeline) -> None:
        self.member = member
        self.own = own
        self.in_group = False
        self.done = False
        self.tokens: list[dict[str, Any]] = []  # of the events returned

    def drain(self, size: int | None) -> None:
        results = []
        for pipeline in (self.member, self.own):
            try:
                batch = pipeline.next_batch(size)
            except MongoError as exc:
                results.append(("error", exc.code, exc.errmsg))
                continue
            results.append(
                ([e.raw for e in batch.events], bson.encode(batch.post_batch_resume_token),
                 batch.invalidated)
            )
        assert results[0] == results[1]
        if results[0][0] != "error":
            self.tokens.extend(bson.decode(raw)["_id"] for raw in results[0][0])
        if results[0][0] == "error" or results[0][2]:
            self.done = True


def build_oplog(acts: list[tuple[Any, ...]]) -> tuple[Oplog, list[int | tuple[Any, ...]]]:
    """The oplog, and the plan: entry counts between join/leave markers."""
    log = Oplog()
    for ns in NSS:
        log.create(ns)
    plan: list[Any] = []
    sessions = 0
    for a in acts:
        before = len(log.entries)
        kind = a[0]
        if kind == "insert":
            log.insert(a[1], a[2])
        elif kind == "replace":
            log.replace(a[1], a[2])
        elif kind == "update":
            log.update(a[1], a[2], a[3])
        elif kind == "delete":
            log.delete(a[1], a[2])
        elif kind == "txn":
            sessions += 1
            txn = log.transaction(make_lsid(sessions), sessions)
            txn.commit([log.op_insert(a[1], a[2]), log.op_insert("a.x", a[3])])
        elif kind == "noop":
            log.noop()
        elif kind == "invalidate":
            if not log.exists("a.x"):
                log.create("a.x")
            if a[1] == "drop":
                log.drop("a.x")
            else:
                if log.exists("a.y"):
                    log.drop("a.y")
                log.rename("a.x", "a.y")
            log.create("a.x")
        else:
            plan.append(a)
        if len(log.entries) > before:
            plan.append(len(log.entries) - before)
    log.noop()
    plan.append(1)
    return log, plan


def run_example(
    acts: list[tuple[Any, ...]], scope: str, expanded: bool, initial: list[list[dict[str, Any]]],
    sizes: list[int],
) -> None:
    log, plan = build_oplog(acts)
    history = log.history()
    entries = log.entries[len(NSS):]  # after the three creates
    start = entries[0]["ts"]
    base = spec_for(scope, expanded, [])
    group = FilterGroup(base, start, history=history)
    streams: list[Stream] = []
    position = 0  # entries fed so far
    size_i = 0

    def next_size() -> int:
        nonlocal size_i
        size_i += 1
        return sizes[size_i % len(sizes)] if sizes else 3

    def open_stream(stages: list[dict[str, Any]], at: Timestamp) -> None:
        spec = spec_for(scope, expanded, stages)
        assert group_key(spec) == group_key(base)
        member = ChangeStreamPipeline(spec, at, history=history)
        own = ChangeStreamPipeline(spec_for(scope, expanded, stages), at, history=history)
        group.add(member)
        s = Stream(member, own)
        s.in_group = True
        streams.append(s)

    def open_resumed(stages: list[dict[str, Any]], source: Stream) -> None:
        """A stream resumed from a token `source` returned: by itself until it has read past the
        token, then it joins the group."""
        token = source.tokens[-2] if len(source.tokens) > 1 else source.own.post_batch_resume_token
        spec = spec_for(scope, expanded, stages, resumeAfter=token)
        at = spec.resume_token.cluster_time
        member = ChangeStreamPipeline(spec, at, history=history)
        own = ChangeStreamPipeline(spec_for(scope, expanded, stages, resumeAfter=token), at,
                                   history=history)
        earlier = [e for e in entries[:position] if e["ts"] >= at]
        try:
            member.push(earlier, scanned_to=earlier[-1]["ts"] if earlier else None)
            own.push(earlier, scanned_to=earlier[-1]["ts"] if earlier else None)
        except MongoError:
            return  # both raise alike: test_pipeline_properties covers resuming itself
        streams.append(Stream(member, own))

    for pipeline in initial:
        open_stream(pipeline, start)
    for step in plan:
        if isinstance(step, tuple):
            if step[0] == "join" and not group.invalidated and position < len(entries):
                at = entries[position]["ts"]
                if step[2] == 3 and streams:
                    open_resumed(step[1], streams[len(streams) // 2])
                else:
                    open_stream(step[1], at)
            elif step[0] == "leave" and streams:
                s = streams.pop(step[1] % len(streams))
                group.remove(s.member)
            continue
        chunk = entries[position : position + step]
        position += step
        last = chunk[-1]["ts"]
        reached = set(map(id, group.push(chunk, scanned_to=last)))
        for s in streams:
            if s.done:
                continue
            if not s.in_group:
                try:
                    s.member.push(chunk, scanned_to=last)
                except MongoError as exc:
                    s.member.fail(exc)
            else:
                assert id(s.member) in reached or s.member.pending_count == 0 or (
                    s.member.invalidated
                )
            try:
                s.own.push(chunk, scanned_to=last)
            except MongoError as exc:
                s.own.fail(exc)
            s.drain(next_size())
            if not s.in_group and not s.done and not group.invalidated and ready_to_join(
                s.member, last
            ):
                group.add(s.member)  # caught up past its resume point
                s.in_group = True
        for s in streams:
            while not s.done and (s.member.pending_count or s.own.pending_count):
                s.drain(next_size())


@settings(
    max_examples=150, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    acts=actions(),
    scope=st.sampled_from(SCOPES),
    initial=st.lists(user_pipelines(), min_size=1, max_size=8),
    sizes=st.lists(st.integers(1, 5), max_size=4),
)
def test_index_on_equals_own_pipelines(
    acts: list[tuple[Any, ...]], scope: tuple[str, bool],
    initial: list[list[dict[str, Any]]], sizes: list[int],
) -> None:
    run_example(acts, scope[0], scope[1], initial, sizes)


# -- the index alone ----------------------------------------------------------------------------


def event_with(doc: Any) -> dict[str, Any]:
    return {"_id": {"_data": "00"}, "operationType": "insert", "fullDocument": doc,
            "ns": {"db": "a", "coll": "x"}, "documentKey": {"_id": 1}}


@pytest.mark.parametrize("stored", [
    5, 5.0, Int64(5), Decimal128("5"), Decimal128("5.000"), [1, 5], [{"z": 1}, 5],
])
def test_equality_across_numeric_types_and_arrays(stored: Any) -> None:
    index = FilterIndex()
    index.add("s", {"fullDocument.u": 5})
    plain, hazard = plain_event(event_with({"u": stored}))
    matched, failed = index.match(plain, hazard)
    assert [s.subscribers for s in matched] == [{"s": None}] and not failed


def test_a_path_whose_last_slot_has_no_keys_is_removed_once() -> None:
    # `$in: []` covers its path with no key: the other slot's removal empties the path's table
    # first (a hypothesis example of test_index_on_equals_own_pipelines found it: KeyError).
    index = FilterIndex()
    index.add("s", {"fullDocument.a": 5})
    index.add("t", {"fullDocument.a": {"$in": []}})
    index.remove("s")
    index.remove("t")
    assert len(index) == 0
    index.add("u", {"fullDocument.a": 5})
    plain, _ = plain_event(event_with({"a": 5}))
    assert [list(s.subscribers) for s in index.candidates(plain)] == [["u"]]


def test_paths_through_arrays_of_subdocuments() -> None:
    index = FilterIndex()
    index.add("s", {"fullDocument.a.b": "k"})
    index.add("t", {"fullDocument.a.b": "other"})
    plain, _ = plain_event(event_with({"a": [{"b": 1}, {"b": ["z", "k"]}]}))
    assert [list(s.subscribers) for s in index.candidates(plain)] == [["s"]]


def test_null_matches_missing_and_is_evaluated_everywhere() -> None:
    assert compile_cover({"fullDocument.u": None}) is None  # runs on every event
    index = FilterIndex()
    index.add("s", {"fullDocument.u": None})
    plain, _ = plain_event(event_with({"v": 1}))
    matched, _ = index.match(plain)
    assert [list(s.subscribers) for s in matched] == [["s"]]


def test_non_candidates_are_not_evaluated() -> None:
    index = FilterIndex()
    for i in range(1000):
        index.add(i, {"fullDocument.u": i})
    plain, _ = plain_event(event_with({"u": Int64(7)}))
    assert [list(s.subscribers) for s in index.candidates(plain)] == [[7]]


def test_signalling_nan_makes_every_filter_run() -> None:
    index = FilterIndex()
    index.add("s", {"fullDocument.u": 5, "fullDocument.v": 1})
    plain, hazard = plain_event(event_with({"u": 3, "v": Decimal128("sNaN")}))
    assert hazard
    assert len(index.candidates(plain, hazard)) == 1


def test_a_conjunction_is_indexed_by_its_equality() -> None:
    cover = compile_cover({"fullDocument.v": {"$gt": 1}, "fullDocument.u": {"$in": [1, "a"]}})
    assert cover == [("fullDocument.u", frozenset({1, "a"}))]


@pytest.mark.parametrize("query", [
    {"fullDocument.u": {"$gt": 1}}, {"fullDocument.u": float("nan")},
    {"fullDocument.u": {"x": 1}}, {"fullDocument.a.0": 5}, {"$expr": {"$eq": ["$a", 1]}},
    {"fullDocument.u": [1, 5]}, {"fullDocument.u": {"$in": [1, None]}},
])
def test_doubtful_filters_are_not_indexed(query: dict[str, Any]) -> None:
    assert compile_cover(query) is None
