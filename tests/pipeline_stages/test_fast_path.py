"""The fast path (pipeline_stages/fast_path.py) against the general path, over generated oplogs.

Two pipelines of the same spec read the same entries in the same chunks; one may write CRUD
events straight to bytes, the other is held to the general path (transform, stages, encoder).
Every batch must be identical: the event bytes, the tokens, the post-batch resume token, the
end of the stream, and any error (its code and message). Entries cover what the fast path must
hand back to the general path: other namespaces, fromMigrate, view DDL, commands, no-ops,
entries without `o2`, `ui` or `wall`, a `wall` of the wrong type, legacy and malformed updates,
documentKeys of every common BSON type (some set KeyString type bits), retryable-write fields,
and streams resumed from a token, started at an operation time, or with v1 tokens.
"""

from __future__ import annotations

import datetime
from typing import Any

import bson
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_stages import pipeline as pipeline_module
from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.filter_index import FilterGroup
from pipeline_stages.oplog_entry import EntryDocument, decode_entry
from pipeline_stages.pipeline import ChangeStreamPipeline, TooLargeEvent
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import make_lsid, uuid_n

WALL = datetime.datetime(2026, 11, 24, 12, 0, 0, 123000)

ids = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(allow_nan=False, width=64),
    st.text(max_size=6),
    st.just("a\x00b"),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.booleans(),
    st.none(),
    st.just(Decimal128("1.5")),
    st.dictionaries(st.sampled_from(["k", "_id"]), st.integers(0, 3), max_size=2),
)
values = st.one_of(st.integers(-5, 5), st.text(max_size=4), st.booleans(), st.none())
diffs = st.fixed_dictionaries(
    {},
    optional={
        "u": st.dictionaries(st.sampled_from(["a", "b"]), values, min_size=1, max_size=2),
        "i": st.dictionaries(st.sampled_from(["c", "d"]), values, min_size=1, max_size=2),
        "d": st.dictionaries(st.sampled_from(["e"]), st.just(False), min_size=1, max_size=1),
    },
)
namespaces = st.sampled_from(["a.x"] * 12 + ["a.y", "b.z", "a.system.views"])


@st.composite
def entry_fields(draw: Any, plain: bool) -> dict[str, Any]:
    """The fields of one entry but `ts` (given in order when the oplog is built). `plain`:
    only what the fast path writes itself; else anything, rarely."""
    crud = ["i"] * 8 + ["u"] * 5 + ["r"] * 2 + ["d"] * 2
    kind = draw(st.sampled_from(
        crud if plain else crud + ["legacy", "bad-update", "noop", "create", "drop"]
    ))
    ns = draw(st.sampled_from(["a.x", "a.y", "b.z"]) if plain else namespaces)
    _id = draw(ids)
    e: dict[str, Any] = {}
    if draw(st.integers(0, 9)) == 0:  # a retryable write
        e["lsid"] = make_lsid(1)
        e["txnNumber"] = Int64(3)
    if kind in ("noop", "create", "drop"):
        if kind == "noop":
            e.update(op="n", ns="", o={"msg": "periodic noop"})
        else:
            db, _, coll = ns.partition(".")
            e.update(op="c", ns=f"{db}.$cmd", ui=uuid_n(1),
                     o={"create": coll} if kind == "create" else {"drop": coll})
    else:
        doc = {"_id": _id, "v": draw(values)}
        e.update(op={"i": "i", "d": "d"}.get(kind, "u"), ns=ns)
        if plain or draw(st.integers(0, 39)):
            e["ui"] = uuid_n(1 if ns == "a.x" else 2)
        if kind == "i":
            e["o"] = doc
            if plain or draw(st.integers(0, 9)):
                e["o2"] = {"_id": _id}
        elif kind == "d":
            e["o"] = {"_id": _id}
        elif kind == "r":
            e["o"], e["o2"] = doc, {"_id": _id}
        elif kind == "u":
            e["o"], e["o2"] = {"$v": 2, "diff": draw(diffs)}, {"_id": _id}
        elif kind == "legacy":
            e["o"], e["o2"] = {"$v": 1, "$set": {"a": 1}}, {"_id": _id}
        else:
            e["o"], e["o2"] = {"$v": 3, "diff": {}}, {"_id": _id}
    if not plain and draw(st.integers(0, 39)) == 0:
        e["fromMigrate"] = True
    walls = ["same", "next", "none"]
    wall = draw(st.sampled_from(walls if plain else walls * 6 + ["bad"]))
    if wall != "none":
        e["wall"] = {"same": WALL, "next": WALL + datetime.timedelta(milliseconds=7),
                     "bad": "yesterday"}[wall]
    return e


def oplog(fields: list[dict[str, Any]]) -> list[Any]:
    out = []
    for i, e in enumerate(fields):
        ts = Timestamp(1_800_000_000 + i // 3, i % 3 + 1)
        out.append(decode_entry(bson.encode({**e, "ts": ts, "t": Int64(1), "v": Int64(2)})))
    return out


def run(pipeline: ChangeStreamPipeline, entries: list[Any], chunks: list[int],
        batch_sizes: list[int | None]) -> list[Any]:
    """Every batch (bytes, tokens, post-batch token, end) and the error, if any."""
    seen: list[Any] = []
    pos, k = 0, 0
    try:
        while pos < len(entries):
            n = chunks[k % len(chunks)]
            chunk = entries[pos : pos + n]
            pos += n
            pipeline.push(chunk, chunk[-1]["ts"])
            size = batch_sizes[k % len(batch_sizes)]
            k += 1
            batch = pipeline.next_batch(size)
            seen.append(([e.raw for e in batch.events], batch.post_batch_resume_token,
                         batch.invalidated))
        seen.append(pipeline.next_batch(None).events)
    except MongoError as exc:
        seen.append(("error", exc.code, str(exc)))
    return seen


def both(cmd: dict[str, Any], db: str, start: Timestamp, entries: list[Any], chunks: list[int],
         batch_sizes: list[int | None]) -> tuple[list[Any], list[Any], ChangeStreamPipeline]:
    fast = ChangeStreamPipeline(parse_aggregate(cmd, db), start)
    general = ChangeStreamPipeline(parse_aggregate(cmd, db), start)
    general._fast = False
    return (run(fast, entries, chunks, batch_sizes), run(general, entries, chunks, batch_sizes),
            fast)


STREAMS = [
    ("x", {}), ("x", {"$_generateV2ResumeTokens": False}), (1, {}), (1, {"cluster": True}),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.booleans().flatmap(lambda plain: st.lists(entry_fields(plain), min_size=1, max_size=40)),
    st.sampled_from(STREAMS),
    st.lists(st.integers(1, 12), min_size=1, max_size=4),
    st.lists(st.one_of(st.none(), st.integers(1, 7)), min_size=1, max_size=4),
    st.integers(0, 39),
    st.sampled_from(["new", "at", "resume", "pbrt"]),
)
def test_fast_path_gives_the_general_paths_bytes(
    fields: list[dict[str, Any]], stream: tuple[Any, dict[str, Any]], chunks: list[int],
    batch_sizes: list[int | None], where: int, how: str,
) -> None:
    entries = oplog(fields)
    coll, extra = stream
    db = "admin" if extra.get("cluster") else "a"
    options: dict[str, Any] = {"allChangesForCluster": True} if extra.get("cluster") else {}
    base = {"aggregate": coll, "cursor": {}, **{k: v for k, v in extra.items() if k[0] == "$"}}
    first = entries[0]["ts"]
    cmd = {**base, "pipeline": [{"$changeStream": options}]}
    fast, general, pipeline = both(cmd, db, first, entries, chunks, batch_sizes)
    assert fast == general
    start = entries[min(where, len(entries) - 1)]["ts"]
    if how == "at":
        cmd = {**base, "pipeline": [{"$changeStream": {**options, "startAtOperationTime": start}}]}
    elif how in ("resume", "pbrt"):
        # resume from an event's token or any post-batch token (high-water marks among them)
        tokens = [
            b[1] for b in fast
            if isinstance(b, tuple) and b[0] != "error" and (b[0] or how == "pbrt")
        ]
        if not tokens:
            return
        token = tokens[where % len(tokens)]
        cmd = {**base, "pipeline": [{"$changeStream": {**options, "resumeAfter": token}}]}
        start = _token_time(token)
    else:
        return
    try:
        parse_aggregate(cmd, db)
    except MongoError:
        return  # a token this stream cannot resume from (no UUID for a collection stream)
    fast, general, _ = both(cmd, db, start, entries, chunks, batch_sizes)
    assert fast == general


def _token_time(token: dict[str, Any]) -> Timestamp:
    return resume_token.decode(token).cluster_time


def test_fast_path_is_taken_for_plain_crud() -> None:
    """The property above compares something: plain inserts on the watched collection are
    written by the fast path (the general path is not run for them)."""
    entries = oplog([
        {"op": "i", "ns": "a.x", "ui": uuid_n(1), "o": {"_id": i, "v": i}, "o2": {"_id": i},
         "wall": WALL}
        for i in range(5)
    ])
    cmd = {"aggregate": "x", "cursor": {}, "pipeline": [{"$changeStream": {}}]}
    pipeline = ChangeStreamPipeline(parse_aggregate(cmd, "a"), entries[0]["ts"])
    calls = []
    pipeline._transform = lambda *a: calls.append(a)  # type: ignore[method-assign]
    pipeline.push(entries)
    events = pipeline.next_batch(None).events
    assert not calls
    assert [bson.decode(e.raw)["fullDocument"] for e in events] == [
        {"_id": i, "v": i} for i in range(5)
    ]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.booleans().flatmap(lambda plain: st.lists(entry_fields(plain), min_size=1, max_size=40)),
    st.lists(st.integers(1, 12), min_size=1, max_size=4),
    st.lists(st.one_of(st.none(), st.integers(1, 7)), min_size=1, max_size=4),
    st.integers(1, 3),
)
def test_filter_group_of_unfiltered_streams_gives_the_general_paths_bytes(
    fields: list[dict[str, Any]], chunks: list[int], batch_sizes: list[int | None], members: int
) -> None:
    """A filter group whose members have no stages queues the producer's fast-path bytes in
    every member: each member's batches are those of a general-path pipeline of its own."""
    entries = oplog(fields)
    spec = parse_aggregate(
        {"aggregate": "x", "cursor": {}, "pipeline": [{"$changeStream": {}}]}, "a"
    )
    start = entries[0]["ts"]
    group = FilterGroup(spec, start)
    streams = [ChangeStreamPipeline(spec, start) for _ in range(members)]
    for stream in streams:
        group.add(stream)
    general = ChangeStreamPipeline(spec, start)
    general._fast = False
    expected = run(general, entries, chunks, batch_sizes)
    pos, k = 0, 0
    seen: list[list[Any]] = [[] for _ in streams]
    try:
        while pos < len(entries):
            chunk = entries[pos : pos + chunks[k % len(chunks)]]
            pos += len(chunk)
            group.push(chunk, chunk[-1]["ts"])
            size = batch_sizes[k % len(batch_sizes)]
            k += 1
            for out, stream in zip(seen, streams, strict=True):
                batch = stream.next_batch(size)
                out.append(([e.raw for e in batch.events], batch.post_batch_resume_token,
                            batch.invalidated))
        for out, stream in zip(seen, streams, strict=True):
            out.append(stream.next_batch(None).events)
    except MongoError as exc:
        for out in seen:
            out.append(("error", exc.code, str(exc)))
    for out in seen:
        assert out == expected


def _reference_next_batch(items: list[Any], batch_size: int | None, budget: int) -> Any:
    """The per-event loop next_batch ran before (what it must still do): the events taken, and
    the error of a too-large event the batch reached."""
    out, size = [], 0
    limit = len(items) if batch_size is None else min(batch_size, len(items))
    while len(out) < limit:
        event = items[len(out)][0]
        if isinstance(event, TooLargeEvent):
            return ("error", event.error.code)
        n = len(event.raw)
        if out and size + n > budget:
            break
        size += n
        out.append(event)
    return out


def _reference_fills(items: list[Any], budget: int) -> bool:
    size = 0
    for event, _token, _ts in items:
        if isinstance(event, TooLargeEvent):
            return True
        if size + len(event.raw) > budget:
            return True
        size += len(event.raw)
    return False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(5, 60), st.just(-1)), max_size=12),
    st.one_of(st.none(), st.integers(0, 8)),
    st.integers(0, 12),
    st.sampled_from([1, 2, 3, 4096]),
)
def test_batch_budget_and_too_large_events(sizes: list[int], batch_size: int | None,
                                           split: int, scan_chunk: int) -> None:
    """next_batch and pending_fills (whole-queue operations) take what the per-event loop
    took: the first event whatever its size, then events while the reply stays within its
    budget; a too-large event (-1) the batch reaches fails it."""
    budget = 100
    items = []
    for i, n in enumerate(sizes):
        ts = Timestamp(1_800_000_000, i + 1)
        event: Any = (
            TooLargeEvent(MongoError(10334, "too large")) if n < 0
            else EntryDocument(bson.encode({"p": "x" * max(n - 13, 0)}))
        )
        items.append((event, {"_data": str(i)}, ts))
    spec = parse_aggregate({"aggregate": "x", "cursor": {}, "pipeline": [{"$changeStream": {}}]},
                           "a")
    pipeline = ChangeStreamPipeline(spec, Timestamp(1_800_000_000, 1))
    original = pipeline_module.MAX_BATCH_BYTES, pipeline_module.SCAN_CHUNK
    pipeline_module.MAX_BATCH_BYTES, pipeline_module.SCAN_CHUNK = budget, scan_chunk
    try:
        # counted in two steps, as pushes add to the queue between getMores
        pipeline.enqueue(items[:split])
        pipeline.pending_fills(budget)
        pipeline.enqueue(items[split:])
        batch = _take_and_check(pipeline, items, batch_size, budget)
        if batch is None:
            return
        taken = len(batch.events)
        assert pipeline.pending_count == len(items) - taken
        if taken:
            assert batch.post_batch_resume_token == {"_data": str(taken - 1)}
        # the next batch starts where this one stopped
        _take_and_check(pipeline, items[taken:], batch_size, budget)
    finally:
        pipeline_module.MAX_BATCH_BYTES, pipeline_module.SCAN_CHUNK = original


def _take_and_check(pipeline: Any, queued: list[Any], batch_size: int | None,
                    budget: int) -> Any:
    """One getMore's batch from the queue, checked against the per-event reference (None:
    the batch failed, as the reference says it must)."""
    expected = _reference_next_batch(queued, batch_size, budget)
    try:
        assert pipeline.pending_fills(budget) == _reference_fills(queued, budget)
        batch = pipeline.next_batch(batch_size)
    except MongoError as exc:
        assert expected == ("error", exc.code)
        return None
    assert batch.events == expected
    return batch
