"""What the `oplog_rewrite/change_stream_match_pushdown_*.js` jstests get from
`jstests/libs/change_stream_rewrite_util.js` (mongodb/mongo @
124eb7f41bfe3082cbe8067503eb02679ab20c6b; facts learned, code our own), on cdcserver's embedded
sharded cluster (`ShardedServer`, two shards behind a mongos), as the jstests'
`ShardingTest({shards: 2})`.

Each jstest checks, per `$match`, the events a stream resumed from one token returns (then
`executionStats` counts: left out, cdcserver has no explain of change streams). Here every case
runs twice: resumed after the writes (the jstest's way: a resumed stream reads by itself), and
"live", every case's stream opened before the writes (streams that differ only in their `$match`
then share one producer and its filter index, `pipeline_stages/filter_index.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer

MODES = ["resumed", "live"]
# getMores after the last expected event that must all come back empty (`!cursor.hasNext()`).
QUIET_GETMORES = 2


@pytest.fixture
def cluster() -> Iterator[ShardedServer]:
    with ShardedServer(2) as server:
        yield server


@pytest.fixture
def mongos(cluster: ShardedServer) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(cluster.uri) as c:
        yield c


def create_sharded_collection(
    client: pymongo.MongoClient, cluster: ShardedServer, shard_key: str, db_name: str,
    coll_name: str, split_at: Any,
) -> Any:
    """`createShardedCollection`: sharded on {shard_key: 1}, split at `split_at`, the upper
    chunk moved to the second shard."""
    db = client[db_name]
    db.drop_collection(coll_name)
    db.create_collection(coll_name)
    coll = db[coll_name]
    coll.create_index([(shard_key, 1)])
    ns = f"{db_name}.{coll_name}"
    client.admin.command("enableSharding", db_name)
    client.admin.command("shardCollection", ns, key={shard_key: 1})
    client.admin.command("split", ns, middle={shard_key: split_at})
    names = [s.name for s in cluster.cluster.shards]
    client.admin.command("moveChunk", ns, find={shard_key: split_at}, to=names[1])
    return coll


def read_exactly(stream: Any, count: int) -> list[dict[str, Any]]:
    """`count` events (`assert.soon(hasNext)` each), then no more (`!hasNext()`)."""
    events: list[dict[str, Any]] = []
    empty = 0
    while len(events) < count or empty < QUIET_GETMORES:
        event = stream.try_next()
        if event is None:
            empty += 1
            assert empty < 200 or len(events) >= count, f"only {events!r}, {count} expected"
            continue
        events.append(event)
        assert len(events) <= count, f"more events than expected: {events!r}"
    return events


Identify = Callable[[dict[str, Any]], Any]


def run_cases(
    mode: str,
    open_stream: Callable[[dict[str, Any], bool], Any],
    phases: list[tuple[Callable[[], None], list[tuple[dict[str, Any], list[Any]]]]],
    identify: Identify,
) -> None:
    """Each phase: its writes, then its cases (a `$match` and the identities of the events it
    returns, in order). `open_stream(match, live)`: "live" opens every case's stream before the
    first writes, from the current time (no resume token: such streams join a filter group)."""
    live: dict[int, Any] = {}
    if mode == "live":
        for _, cases in phases:
            for match, _ in cases:
                live[id(match)] = open_stream(match, True)
    for writes, cases in phases:
        writes()
        for match, expected in cases:
            stream = live.pop(id(match)) if mode == "live" else open_stream(match, False)
            try:
                events = read_exactly(stream, len(expected))
            except AssertionError as exc:
                raise AssertionError(f"{match!r}: {exc}") from None
            finally:
                stream.close()
            got = [identify(e) for e in events]
            assert got == expected, f"{match!r}: {got!r} != {expected!r}"


def whole_cluster_opener(
    client: pymongo.MongoClient, resume_after: Any, **options: Any
) -> Callable[[dict[str, Any], bool], Any]:
    """`verifyChangeStreamOnWholeCluster`'s stream: `admin`, `allChangesForCluster`, resumed
    after `resume_after` (or, live, from now) with `options` (e.g. `full_document`)."""
    def open_stream(match: dict[str, Any], live: bool) -> Any:
        return client.watch([{"$match": match}], resume_after=None if live else resume_after,
                            max_await_time_ms=1, **options)

    return open_stream


def whole_cluster_identity(event: dict[str, Any]) -> tuple[Any, ...]:
    """What `verifyChangeStreamOnWholeCluster` checks of an event: its operationType, its
    identifier (`documentKey._id`, `to.coll`, `ns.coll`, or `ns.db` for dropDatabase) and,
    but for dropDatabase, its `ns.coll`."""
    op = event["operationType"]
    if op == "dropDatabase":
        return (op, event["ns"]["db"])
    if op in ("insert", "update", "replace", "delete"):
        ident = event["documentKey"]["_id"]
    elif op == "rename":
        ident = event["to"]["coll"]
    else:
        ident = event["ns"]["coll"]
    return (op, ident, event["ns"]["coll"])


def whole_cluster_expected(expected: dict[str, dict[str, list[Any]]]) -> list[tuple[Any, ...]]:
    """`expectedResult` ({collOrDb: {op: [identifiers]}}) as identities, in its order."""
    out: list[tuple[Any, ...]] = []
    for coll_or_db, ops in expected.items():
        for op, identifiers in ops.items():
            for ident in identifiers:
                out.append((op, ident) if op == "dropDatabase" else (op, ident, coll_or_db))
    return out


def read_until_quiet(stream: Any, at_least: int) -> list[dict[str, Any]]:
    """Every event until getMores come back empty, waiting for `at_least` first (for a count
    that is the cluster's business, e.g. one DDL event per shard); closes the stream."""
    events: list[dict[str, Any]] = []
    empty = 0
    while empty < QUIET_GETMORES + 1 or (len(events) < at_least and empty < 300):
        event = stream.try_next()
        if event is None:
            empty += 1
        else:
            events.append(event)
    stream.close()
    return events


def absent_field_cases(
    op: str, paths: tuple[str, ...], none: list[Any], every: list[Any]
) -> list[tuple[dict[str, Any], list[Any]]]:
    """The jstests' predicates on a field that an `op` event never has (`fullDocument` of a
    delete, `fullDocumentBeforeChange` of an insert): each expects `none` or `every` event."""
    cases: list[tuple[dict[str, Any], list[Any]]] = []
    for path in paths:
        cases += [
            ({"operationType": op, path: {"$exists": True}}, none),
            ({"operationType": op, path: {"$exists": False}}, every),
            ({"operationType": op, path: {"$eq": None}}, every),
            ({"operationType": op, path: {"$ne": None}}, none),
            ({"operationType": op, path: {"$gt": None}}, none),
            ({"operationType": op, path: {"$not": {"$gt": None}}}, every),
            ({"operationType": op, path: {"$lte": None}}, every),
            ({"operationType": op, path: {"$type": "null"}}, none),
            ({"operationType": op, path: {"$not": {"$type": "null"}}}, every),
            ({"operationType": op, path: {"$eq": 5}}, none),
            ({"operationType": op, path: {"$ne": 5}}, every),
        ]
    return cases


# Expression builders the namespace / `to` pushdown jstests write their predicates with.
def regex_match(field: str, pattern: str, options: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"input": field, "regex": pattern}
    if options:
        spec["options"] = options
    return {"$regexMatch": spec}


def expr(e: Any) -> dict[str, Any]:
    return {"$expr": e}


def expr_eq(field: str, value: Any) -> dict[str, Any]:
    return expr({"$eq": [field, value]})
