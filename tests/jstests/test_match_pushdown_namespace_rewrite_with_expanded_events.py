"""Translated from mongodb/mongo `jstests/change_streams/oplog_rewrite/`
`match_pushdown_namespace_rewrite_with_expanded_events.js` @
1e98a0f23d62eb1f149658d190f0285879d91db5, its first part: the events a whole-cluster stream
(`showExpandedEvents`) resumed from one token returns for `$match`es on `ns` (whole, `ns.db`,
`ns.coll`, regexes, `$in` / `$nin`, each with its `$expr` twin) over `createIndexes`,
`dropIndexes`, `modify` and `create` events besides inserts, on collections with dots in their
names sharded on `_id` across two shards (`pushdown_util.py`), another database's inserts and
two databases' `create`s among them.

Left out: the `executionStats` counts (cdcserver has no explain of change streams); the
`disableMatchExpressionOptimization` fail point (the events are the same); how many shards
report an index DDL event (the jstest expects one per shard, `[collName, collName]`;
cdcserver's embedded cluster reports one: a run of equal DDL events counts as one here, on both
sides); the second and third parts (the `shardCollection` events and chunk-migration no-ops of
re-sharded collections, and an escaped-dot regex over them): sharding-only, the events a
`ShardingTest` logs when sharding a collection."""

from __future__ import annotations

from typing import Any

import pytest
from bson.regex import Regex
from pushdown_util import (
    MODES,
    cluster,
    create_sharded_collection,
    expr,
    expr_eq,
    mongos,
    read_until_quiet,
    regex_match,
    whole_cluster_expected,
    whole_cluster_identity,
    whole_cluster_opener,
)

__all__ = ["cluster", "mongos"]

DB = "change_stream_match_pushdown_and_rewrite"
S0, S1 = "shard0Only", "shard1Only"
CN, C2N, OTHER_CN = "coll.coll1", "coll1.coll2", "coll.coll1.coll2"
E1 = whole_cluster_expected({CN: {"createIndexes": [CN, CN], "insert": [1, 2],
                                  "dropIndexes": [CN, CN]}})
E2 = whole_cluster_expected({C2N: {"createIndexes": [C2N, C2N], "modify": [C2N, C2N],
                                   "insert": [0, 1, 2, 3]}})
EO = whole_cluster_expected({OTHER_CN: {"insert": [1, 2]}})
ES = whole_cluster_expected({S0: {"create": [S0]}, S1: {"create": [S1]}})
DDL = ("createIndexes", "dropIndexes", "modify")


_rx, _expr, _eq = regex_match, expr, expr_eq  # the jstests' own short names


CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"ns": {"db": DB, "coll": CN}}, E1), (_eq("$ns", {"db": DB, "coll": CN}), E1),
    (_eq("$ns", {"db": DB, "coll": C2N}), E2),
    ({"ns": {"db": DB}}, []), (_eq("$ns", {"db": DB}), []),
    ({"ns": {"db": DB, "coll": "unknown"}}, []), (_eq("$ns", {"db": DB, "coll": "unknown"}), []),
    ({"ns": {"coll": CN, "db": DB}}, []), (_eq("$ns", {"coll": CN, "db": DB}), []),
    ({"ns": {}}, []), (_eq("$ns", {}), []),
    ({"ns.db": DB}, E1 + E2), (_eq("$ns.db", DB), E1 + E2),
    ({"ns.db": Regex("^change_stream_match_pushdown.*$")}, E1 + E2),
    (_expr(_rx("$ns.db", "^change_stream_match_pushdown.*$")), E1 + E2),
    ({"ns.db": Regex("^(change_stream_match_pushdown.*$)")}, E1 + E2),
    (_expr(_rx("$ns.db", "(^change_stream_match_pushdown.*$)")), E1 + E2),
    ({"ns.db": Regex("^(Change_Stream_MATCH_PUSHDOWN.*$)", "i")}, E1 + E2),
    (_expr(_rx("$ns.db", "^(Change_Stream_MATCH_PUSHDOWN.*$)", "i")), E1 + E2),
    ({"ns.db": Regex("(^unknown$|^change_stream_match_pushdown.*$)")}, E1 + E2),
    (_expr(_rx("$ns.db", "(^unknown$|^change_stream_match_pushdown.*$)")), E1 + E2),
    ({"ns.db": Regex("^unknown$|^change_stream_match_pushdown.*$")}, E1 + E2),
    (_expr(_rx("$ns.db", "^unknown$|^change_stream_match_pushdown.*$")), E1 + E2),
    ({"ns.db": "unknown"}, []), (_eq("$ns.db", "unknown"), []),
    ({"ns.db": ""}, []), (_eq("$ns.db", ""), []),
    ({"ns.db.extra": DB}, []), (_eq("$ns.db.extra", "unknown"), []),
    ({"ns.coll": CN}, E1), (_eq("$ns.coll", CN), E1),
    ({"ns.coll.extra": CN}, []), (_eq("$ns.coll.extra", CN), []),
    ({"ns.db": {"$in": [DB]}}, E1 + E2), (_expr({"$in": ["$ns.db", [DB]]}), E1 + E2),
    ({"ns.db": {"$in": []}}, []), (_expr({"$in": ["$ns.db", []]}), []),
    ({"ns.db": {"$in": [DB, 1]}}, E1 + E2), (_expr({"$in": ["$ns.db", [DB, 1]]}), E1 + E2),
    ({"ns.db": {"$in": ["unknown1", Regex("^unknown2$")]}}, []),
    (_expr({"$or": [{"$eq": ["$ns.db", "unknown1"]}, _rx("$ns.db", "^unknown2$")]}), []),
    ({"ns.coll": {"$in": [Regex("^coll.coll1$"), Regex("^coll1.coll2$")]}}, E1 + E2),
    (_expr({"$or": [_rx("$ns.coll", "^coll.coll1$"), _rx("$ns.coll", "^coll1.coll2$")]}),
     E1 + E2),
    ({"ns.coll": {"$in": [Regex("^coll.*$"), Regex("^shard.*$")]}}, E1 + E2 + EO + ES),
    (_expr({"$or": [_rx("$ns.coll", "^coll.*$"), _rx("$ns.coll", "^shard.*$")]}),
     E1 + E2 + EO + ES),
    ({"ns.db": {"$nin": [DB, S0, S1]}}, EO),
    (_expr({"$not": {"$or": [{"$eq": ["$ns.db", DB]}, {"$eq": ["$ns.db", S0]},
                             {"$eq": ["$ns.db", S1]}]}}), EO),
    ({"ns.db": {"$nin": [Regex("change_stream_match_pushdown_and_rewr.*"), Regex("shard.*")]}},
     EO),
    (_expr({"$not": {"$or": [_rx("$ns.db", "change_stream_match_pushdown_and_rewr.*"),
                             _rx("$ns.db", "shard.*")]}}), EO),
    ({"ns.coll": {"$nin": [CN, C2N, OTHER_CN, S0]}}, ES[1:]),
    (_expr({"$not": {"$in": ["$ns.coll", [CN, C2N, OTHER_CN, S0]]}}), ES[1:]),
    ({"ns.coll": {"$nin": [CN, 1]}}, E2 + EO + ES),
]


def _collapsed(identities: list[Any]) -> list[Any]:
    """A run of equal index / collMod DDL events as one (how many shards report it is left
    out)."""
    out: list[Any] = []
    for ident in identities:
        if out and ident == out[-1] and ident[0] in DDL:
            continue
        out.append(ident)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_namespace_rewrite_with_expanded_events(mongos: Any, cluster: Any, mode: str) -> None:
    for db in (S0, S1):
        mongos.admin.command("enableSharding", db)
    coll = create_sharded_collection(mongos, cluster, "_id", DB, CN, 2)
    unmonitored = create_sharded_collection(mongos, cluster, "_id", "other_db", OTHER_CN, 2)
    coll2 = create_sharded_collection(mongos, cluster, "_id", DB, C2N, 2)
    with mongos.watch([]) as stream:
        resume_after = stream.resume_token
    opener = whole_cluster_opener(mongos, resume_after, show_expanded_events=True)
    live = [opener(match, True) for match, _ in CASES] if mode == "live" else []

    coll.create_index([("x", 1)])
    coll.insert_many([{"_id": 1}, {"_id": 2}])
    coll.drop_index([("x", 1)])
    coll2.create_index([("create", 1)])
    mongos[DB].command({"collMod": C2N, "index": {"keyPattern": {"create": 1}, "hidden": True}})
    coll2.insert_many([{"_id": 0}, {"_id": 1}, {"_id": 2}, {"_id": 3}])
    unmonitored.insert_many([{"_id": 1}, {"_id": 2}])
    mongos[S0].create_collection(S0)
    mongos[S1].create_collection(S1)

    for i, (match, expected) in enumerate(CASES):
        stream = live[i] if live else opener(match, False)
        wanted = _collapsed(expected)
        got = _collapsed([whole_cluster_identity(e)
                          for e in read_until_quiet(stream, len(wanted))])
        assert got == wanted, f"{match!r}: {got!r} != {wanted!r}"
