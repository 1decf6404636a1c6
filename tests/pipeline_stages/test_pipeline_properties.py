"""Properties of the whole pipeline over generated oplogs (Hypothesis).

Each example is a random history of writes on three collections in two databases (a.x, a.y,
b.z): CRUD, transactions (single entry, chained `partialTxn` links with other writes in
between, prepared then committed or aborted), DDL (create, createIndexes, dropIndexes, collMod,
drops, renames, dropDatabase — several of which invalidate) and periodic no-ops. For every kind
of stream (collection a.x, database a, cluster; with and without expanded events):

(a) the events are in strictly increasing resume-token order (`_id._data`);
(b) feeding the oplog in random chunks and draining it in random batch sizes gives the same
    events as one `process` call, and the post-batch resume token never goes backwards;
(c) a new stream resumed from any emitted event's token, or from any post-batch resume token
    seen between batches, returns exactly the events that followed it: nothing lost, nothing
    repeated. An invalidate token can only be used with `startAfter`, which must behave like
    starting at the next tick after the invalidating entry; `resumeAfter` with it is 260.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import Oplog, make_lsid, split_ns

NSS = ("a.x", "a.y", "b.z")
DBS = ("a", "b")
STREAMS = [
    (scope, expanded)
    for scope in ("collection", "database", "cluster")
    for expanded in (False, True)
]

# -- generated histories -----------------------------------------------------------------------

crud = st.tuples(
    st.sampled_from(("insert", "update", "replace", "delete")),
    st.integers(0, len(NSS) - 1),
    st.integers(0, 3),
)
crud_action = crud.map(lambda t: ("crud", *t))
transaction_action = st.tuples(
    st.just("txn"),
    st.lists(crud, min_size=1, max_size=5),
    st.integers(1, 3),  # number of oplog entries (links)
    st.sampled_from(("commit", "prepare-commit", "prepare-abort")),
    st.booleans(),  # other writes between the links
)
ddl_action = st.tuples(
    st.just("ddl"),
    st.sampled_from(("create", "createIndexes", "dropIndexes", "collMod")),
    st.integers(0, len(NSS) - 1),
)
invalidating_action = st.one_of(  # for some of the streams
    st.tuples(st.just("drop"), st.integers(0, len(NSS) - 1)),
    st.tuples(st.just("rename"), st.booleans()),  # a.x -> a.y, or a.y -> a.x
    st.tuples(st.just("dropDatabase"), st.integers(0, len(DBS) - 1)),
)
_BY_KIND = {
    "crud": crud_action,
    "txn": transaction_action,
    "noop": st.just(("noop",)),
    "ddl": ddl_action,
    "invalidating": invalidating_action,
}
# Weighted: mostly writes, invalidations rare enough that streams usually go on for a while.
action = st.sampled_from(
    ("crud",) * 6 + ("txn",) * 3 + ("noop",) + ("ddl",) * 2 + ("invalidating",)
).flatmap(_BY_KIND.__getitem__)
histories = st.lists(action, min_size=3, max_size=24)


class Writer:
    """Turns generated actions into an oplog the way mongod would write them."""

    def __init__(self) -> None:
        self.log = Oplog()
        self.sessions = 0
        for ns in NSS:
            self.log.create(ns)

    def ensure(self, ns: str) -> None:
        if not self.log.exists(ns):
            self.log.create(ns)  # implicit creation writes a create entry first

    def op(self, kind: str, ns: str, _id: int) -> dict[str, Any]:
        log = self.log
        if kind == "insert":
            return log.op_insert(ns, {"_id": _id, "v": kind})
        if kind == "update":
            return log.op_update(ns, _id, {"u": {"v": 1}, "sarr": {"a": True, "u0": _id}})
        if kind == "replace":
            return log.op_replace(ns, {"_id": _id, "r": True})
        return log.op_delete(ns, _id)

    def crud(self, kind: str, ns: str, _id: int) -> None:
        self.ensure(ns)
        self.log._append(self.op(kind, ns, _id))

    def transaction(
        self, ops: Sequence[tuple[str, int, int]], links: int, outcome: str, interleave: bool
    ) -> None:
        log = self.log
        self.sessions += 1
        txn = log.transaction(make_lsid(self.sessions), self.sessions)
        inner: list[dict[str, Any]] = []
        for kind, ns_index, _id in ops:
            ns = NSS[ns_index]
            if not log.exists(ns):
                if outcome == "commit":
                    inner.append(log.op_create(ns))  # created inside the transaction
                else:
                    log.create(ns)
            inner.append(self.op(kind, ns, _id))
        links = min(links, len(inner))
        size = -(-len(inner) // links)
        chunks = [inner[i : i + size] for i in range(0, len(inner), size)]
        for i, chunk in enumerate(chunks):
            if interleave and i:
                log.noop()
                self.crud("insert", NSS[i % len(NSS)], 100 + i)
            if i < len(chunks) - 1:
                txn.partial(chunk)
            elif outcome == "commit":
                txn.commit(chunk)
            else:
                txn.prepare(chunk)
        if outcome != "commit":
            if interleave:
                self.crud("update", NSS[0], 1)
            if outcome == "prepare-commit":
                txn.commit_prepared()
            else:
                txn.abort()

    def apply(self, a: tuple[Any, ...]) -> None:
        log = self.log
        kind = a[0]
        if kind == "crud":
            self.crud(a[1], NSS[a[2]], a[3])
        elif kind == "noop":
            log.noop()
        elif kind == "txn":
            self.transaction(a[1], a[2], a[3], a[4])
        elif kind == "drop":
            if log.exists(NSS[a[1]]):
                log.drop(NSS[a[1]])
        elif kind == "rename":
            source, target = ("a.x", "a.y") if a[1] else ("a.y", "a.x")
            self.ensure(source)
            log.rename(source, target)
        elif kind == "dropDatabase":
            log.drop_database(DBS[a[1]])
        else:
            ns = NSS[a[2]]
            if a[1] == "create":
                if not log.exists(ns):
                    log.create(ns)
                return
            self.ensure(ns)
            if a[1] == "createIndexes":
                log.create_indexes(ns, {"k": 1}, "k_1")
            elif a[1] == "dropIndexes":
                log.drop_indexes(ns, "k_1", {"k": 1})
            else:
                log.coll_mod(ns, {"validationLevel": "off"}, {"validationLevel": "strict"})


def build(actions: Sequence[tuple[Any, ...]]) -> tuple[Oplog, Timestamp]:
    writer = Writer()
    start = writer.log.peek_ts()
    for a in actions:
        writer.apply(a)
    writer.log.noop()
    return writer.log, start


# -- streams ------------------------------------------------------------------------------------


def open_stream(
    log: Oplog, scope: str, expanded: bool, start: Timestamp, **options: Any
) -> ChangeStreamPipeline:
    options = {"showExpandedEvents": expanded, **options}
    if scope == "collection":
        db, coll = split_ns(NSS[0])
        cmd: dict[str, Any] = {"aggregate": coll}
    elif scope == "database":
        db, cmd = DBS[0], {"aggregate": 1}
    else:
        db, cmd = "admin", {"aggregate": 1}
        options["allChangesForCluster"] = True
    cmd["pipeline"] = [{"$changeStream": options}]
    return ChangeStreamPipeline(parse_aggregate(cmd, db), start, history=log.history())


def all_events(
    log: Oplog, scope: str, expanded: bool, start: Timestamp, **options: Any
) -> tuple[list[dict[str, Any]], bool]:
    """Events of a stream opened at `start` given the oplog from `start` on, in one go."""
    pipeline = open_stream(log, scope, expanded, start, **options)
    batch = pipeline.process([e for e in log.entries if e["ts"] >= start])
    return [bson.decode(e.raw) for e in batch.events], batch.invalidated


def data(token: dict[str, Any]) -> str:
    return token["_data"]


def next_tick(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1)


def resumed_events(
    log: Oplog, scope: str, expanded: bool, token: dict[str, Any], use_start_after: bool
) -> list[dict[str, Any]]:
    """A fresh stream resumed from `token` (start = its clusterTime)."""
    decoded = resume_token.decode(token)
    key = "startAfter" if use_start_after else "resumeAfter"
    events, _ = all_events(log, scope, expanded, decoded.cluster_time, **{key: token})
    return events


def expected_after(
    log: Oplog,
    scope: str,
    expanded: bool,
    everything: list[dict[str, Any]],
    token: dict[str, Any],
    delivered: int,
) -> list[dict[str, Any]]:
    """What must follow `token`: the rest of the stream, or — after an invalidate — what a
    stream started at the next tick sees."""
    decoded = resume_token.decode(token)
    if decoded.from_invalidate:
        events, _ = all_events(
            log, scope, expanded, next_tick(decoded.cluster_time),
            startAtOperationTime=next_tick(decoded.cluster_time),
        )
        return events
    return everything[delivered:]


def check_resume(
    log: Oplog,
    scope: str,
    expanded: bool,
    everything: list[dict[str, Any]],
    token: dict[str, Any],
    delivered: int,
    rng: random.Random,
) -> None:
    decoded = resume_token.decode(token)
    expected = expected_after(log, scope, expanded, everything, token, delivered)
    if decoded.from_invalidate:
        with pytest.raises(MongoError) as err:
            resumed_events(log, scope, expanded, token, use_start_after=False)
        assert err.value.code == 260
        got = resumed_events(log, scope, expanded, token, use_start_after=True)
    else:
        got = resumed_events(log, scope, expanded, token, use_start_after=rng.random() < 0.5)
    assert [data(e["_id"]) for e in got] == [data(e["_id"]) for e in expected], (
        f"resuming from {decoded!r} (after {delivered} events)"
    )
    assert got == expected


def feed_in_chunks(
    log: Oplog, scope: str, expanded: bool, start: Timestamp, rng: random.Random
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]], bool]:
    """Feed the oplog in random chunks, draining random batch sizes after each; returns the
    events, every (events delivered so far, post-batch token) pair seen, and the final
    invalidated flag."""
    pipeline = open_stream(log, scope, expanded, start)
    entries = [e for e in log.entries if e["ts"] >= start]
    got: list[dict[str, Any]] = []
    seen: list[tuple[int, dict[str, Any]]] = []
    invalidated = False

    def drain(limit: int) -> None:
        nonlocal invalidated
        for _ in range(limit):
            size = rng.choice((None, 1, 1, 2, 3))
            batch = pipeline.next_batch(size)
            got.extend(bson.decode(e.raw) for e in batch.events)
            seen.append((len(got), batch.post_batch_resume_token))
            invalidated = batch.invalidated
            if size is None or not batch.events:
                break

    seen.append((0, pipeline.next_batch(0).post_batch_resume_token))
    i = 0
    while i < len(entries):
        n = rng.randint(1, 6)
        pipeline.push(entries[i : i + n])
        i += n
        drain(rng.randint(0, 3))
    while True:  # drain what is left
        before = len(got)
        drain(50)
        if len(got) == before:
            break
    return got, seen, invalidated


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(histories, st.randoms(use_true_random=False))
def test_pipeline_properties(actions: list[tuple[Any, ...]], rng: random.Random) -> None:
    log, start = build(actions)
    for scope, expanded in STREAMS:
        everything, invalidated = all_events(log, scope, expanded, start)
        tokens = [data(e["_id"]) for e in everything]

        # (a) strictly increasing tokens; an invalidate ends the stream.
        assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
        kinds = [e["operationType"] for e in everything]
        if scope == "cluster":
            assert "invalidate" not in kinds and not invalidated
        if "invalidate" in kinds:
            assert kinds.index("invalidate") == len(kinds) - 1 and invalidated
            assert len(kinds) >= 2
            invalidating = resume_token.decode(everything[-2]["_id"])
            invalidating.from_invalidate = True
            assert invalidating.to_document()["_data"] == tokens[-1]
        else:
            assert not invalidated
        if not expanded:
            assert not {"create", "createIndexes", "dropIndexes", "modify"} & set(kinds)
            assert all("collectionUUID" not in e for e in everything)

        # (b) chunked feeding and batch draining change nothing.
        chunked, seen, chunked_invalidated = feed_in_chunks(log, scope, expanded, start, rng)
        assert chunked == everything
        assert chunked_invalidated == invalidated
        pbrts = [data(token) for _, token in seen]
        assert all(a <= b for a, b in zip(pbrts, pbrts[1:])), pbrts
        for delivered, token in seen:
            # The post-batch token never runs ahead of an event not yet returned...
            assert all(t > data(token) for t in tokens[delivered:])
            # ...nor behind one already returned.
            assert all(t <= data(token) for t in tokens[:delivered])

        # (c) resuming from any event's token, and from the post-batch tokens seen.
        picks = list(range(len(everything)))
        if len(picks) > 12:
            picks = sorted({0, len(picks) - 1, *rng.sample(picks, 10)})
        for i in picks:
            check_resume(log, scope, expanded, everything, everything[i]["_id"], i + 1, rng)
        distinct = {data(token): (delivered, token) for delivered, token in seen}
        for delivered, token in list(distinct.values())[:8]:
            check_resume(log, scope, expanded, everything, token, delivered, rng)
