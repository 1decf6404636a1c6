"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_namespace_rewrite.js` @
02790b2165b60769dbeb39be413b3a9f030425bf: the events a whole-cluster stream resumed from one
token returns for `$match`es on `ns` (whole, `ns.db`, `ns.coll`, regexes with and without `i`,
`$in` / `$nin` of strings, regexes and a non-string, each with its `$expr` twin), on
collections sharded on `_id` across two shards (`pushdown_util.py`) holding documents with
`renameCollection` / `drop` / `dropDatabase` fields (which must not be taken for commands),
with a rename, a drop and another database's inserts among them; then the events of a
`dropDatabase` through `ns` filters, then a regex with an escaped dot (SERVER-67715). Left out:
the `executionStats` counts (oplog entries each shard's cursor returned: cdcserver has no
explain of change streams) and the `disableMatchExpressionOptimization` fail point
(mongod-internal: the events are the same)."""

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
    run_cases,
    whole_cluster_expected,
    whole_cluster_identity,
    whole_cluster_opener,
)

__all__ = ["cluster", "mongos"]

DB = "change_stream_match_pushdown_and_rewrite"
C1 = whole_cluster_expected({"coll1": {"insert": [1, 2]}})
C2 = whole_cluster_expected({"coll2": {"insert": [3, 4], "rename": ["newColl2"]}})
C3 = whole_cluster_expected({"coll.coll3": {"insert": [5, 6], "drop": ["coll.coll3"]}})
C4 = whole_cluster_expected({"coll4": {"insert": [7, 8, 9, 10, 11, 12]}})
OTHER = whole_cluster_expected({"other_coll": {"insert": [1, 2]}})
ALL_DB = C1 + C2 + C3 + C4
ALL = ALL_DB + OTHER
NS1 = {"db": DB, "coll": "coll1"}
NS2 = {"db": DB, "coll": "coll2"}


_rx, _expr, _eq = regex_match, expr, expr_eq  # the jstests' own short names


def _regex_pair(field: str, pattern: str, options: str, expected: list) -> list:
    """A `$match` on a regex and its `$expr` `$regexMatch` twin."""
    return [({field: Regex(pattern, options)}, expected),
            (_expr(_rx("$" + field, pattern, options)), expected)]


DB_REGEXES = [("^change_stream_match_pushdown.*$", ""), ("^(change_stream_match_pushdown.*$)", ""),
              ("^(Change_Stream_MATCH_PUSHDOWN.*$)", "i"),
              ("(^unknown$|^change_stream_match_pushdown.*$)", ""),
              ("^unknown$|^change_stream_match_pushdown.*$", "")]
CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"ns": NS1}, C1), (_eq("$ns", NS1), C1),
    ({"ns": NS2}, C2), (_eq("$ns", NS2), C2),
    ({"ns": {"db": DB, "coll": "coll.coll3"}}, C3),
    (_eq("$ns", {"db": DB, "coll": "coll.coll3"}), C3),
    ({"ns": {"db": DB}}, []), (_eq("$ns", {"db": DB}), []),
    ({"ns": {"db": DB, "coll": "unknown"}}, []), (_eq("$ns", {"db": DB, "coll": "unknown"}), []),
    ({"ns": {"coll": "coll1", "db": DB}}, []), (_eq("$ns", {"coll": "coll1", "db": DB}), []),
    ({"ns": {"db": DB, "coll": "coll1", "extra": "extra"}}, []),
    (_eq("$ns", {"db": DB, "coll": "unknown", "extra": "extra"}), []),
    ({"ns": {}}, []), (_eq("$ns", {}), []),
    ({"ns.db": DB}, ALL_DB), (_eq("$ns.db", DB), ALL_DB),
    *[c for p, o in DB_REGEXES for c in _regex_pair("ns.db", p, o, ALL_DB)],
    ({"ns.db": "unknown"}, []), (_eq("$ns.db", "unknown"), []),
    ({"ns.db": ""}, []), (_eq("$ns.db", ""), []),
    ({"ns.db.extra": DB}, []), (_eq("$ns.db.extra", "unknown"), []),
    ({"ns.coll": "coll1"}, C1), (_eq("$ns.coll", "coll1"), C1),
    ({"ns.coll": "coll2"}, C2), (_eq("$ns.coll", "coll2"), C2),
    ({"ns.coll": "coll.coll3"}, C3), (_eq("$ns.coll", "coll.coll3"), C3),
    *_regex_pair("ns.coll", "^col.*1", "", C1),
    *_regex_pair("ns.coll", "^col.*2", "", C2),
    *_regex_pair("ns.coll", "^col.*3", "", C3),
    *_regex_pair("ns.coll", "^col.*", "", ALL_DB),
    *_regex_pair("ns.coll", "^CoLL.*", "i", ALL_DB),
    *_regex_pair("ns.coll", "^col.*1$|^col.*2$|^col.*3$", "", C1 + C2 + C3),
    *_regex_pair("ns.coll", "^coll[^124]", "", C3),
    ({"ns.coll": "unknown"}, []), (_eq("$ns.coll", "unknown"), []),
    ({"ns.coll": ""}, []), (_eq("$ns.coll", ""), []),
    ({"ns.coll.extra": "coll1"}, []), (_eq("$ns.coll.extra", "coll1"), []),
    ({"ns.db": {"$in": [DB]}}, ALL_DB), (_expr({"$in": ["$ns.db", [DB]]}), ALL_DB),
    ({"ns.db": {"$in": [Regex("^change_stream_match.*$")]}}, ALL_DB),
    (_expr({"$or": [_rx("$ns.db", "^change_stream_match.*$")]}), ALL_DB),
    ({"ns.db": {"$in": [Regex("^change_stream_MATCH.*$", "i")]}}, ALL_DB),
    (_expr({"$or": [_rx("$ns.db", "^change_stream_MATCH.*$", "i")]}), ALL_DB),
    ({"ns.db": {"$in": []}}, []), (_expr({"$in": ["$ns.db", []]}), []),
    ({"ns.db": {"$in": [DB, 1]}}, ALL_DB), (_expr({"$in": ["$ns.db", [DB, 1]]}), ALL_DB),
    ({"ns.db": {"$in": ["unknown1", Regex("^unknown2$")]}}, []),
    (_expr({"$or": [{"$eq": ["$ns.db", "unknown1"]}, _rx("$ns.db", "^unknown2$")]}), []),
    ({"ns": {"$in": [NS1, NS2]}}, C1 + C2), (_expr({"$in": ["$ns", [NS1, NS2]]}), C1 + C2),
    ({"ns.coll": {"$in": ["coll1", "coll2"]}}, C1 + C2),
    (_expr({"$in": ["$ns.coll", ["coll1", "coll2"]]}), C1 + C2),
    ({"ns.coll": {"$in": [Regex("^coll1$"), Regex("^coll2$")]}}, C1 + C2),
    (_expr({"$or": [_rx("$ns.coll", "^coll1$"), _rx("$ns.coll", "^coll2$")]}), C1 + C2),
    ({"ns.coll": {"$in": [Regex("^coll.*$")]}}, ALL_DB),
    (_expr({"$or": [_rx("$ns.coll", "^coll.*$")]}), ALL_DB),
    ({"ns.coll": {"$in": [Regex("^COLL.*$", "i")]}}, ALL_DB),
    (_expr({"$or": [_rx("$ns.coll", "^COLL.*$", "i")]}), ALL_DB),
    ({"ns.coll": {"$in": []}}, []),
    ({"ns.coll": {"$in": ["coll1", 1]}}, C1), (_expr({"$in": ["$ns.coll", ["coll1", 1]]}), C1),
    ({"ns.coll": {"$in": ["coll1", Regex("^coll.*3$")]}}, C1 + C3),
    (_expr({"$or": [{"$eq": ["$ns.coll", "coll1"]}, _rx("$ns.coll", "^coll.*3$")]}), C1 + C3),
    ({"ns.coll": {"$in": ["unknown1", Regex("^unknown2$")]}}, []),
    (_expr({"$or": [{"$eq": ["$ns.coll", "unknown1"]}, _rx("$ns.coll", "^unknown2$")]}), []),
    ({"ns.db": {"$nin": []}}, ALL),
    ({"ns.db": {"$nin": ["unknown"]}}, ALL),
    (_expr({"$not": {"$or": [{"$eq": ["$ns.db", "unknown"]}]}}), ALL),
    ({"ns.db": {"$nin": [Regex("^unknown$")]}}, ALL),
    (_expr({"$not": {"$or": [_rx("$ns.db", "^unknown$")]}}), ALL),
    ({"ns.db": {"$nin": [DB]}}, OTHER),
    (_expr({"$not": {"$or": [{"$eq": ["$ns.db", DB]}]}}), OTHER),
    ({"ns.db": {"$nin": [Regex("change_stream_match_pushdown_and_rewr.*")]}}, OTHER),
    (_expr({"$not": {"$or": [_rx("$ns.db", "change_stream_match_pushdown_and_rewr.*")]}}), OTHER),
    ({"ns.coll": {"$nin": ["coll1", "coll2", "coll4"]}}, C3 + OTHER),
    (_expr({"$not": {"$in": ["$ns.coll", ["coll1", "coll2", "coll4"]]}}), C3 + OTHER),
    ({"ns.coll": {"$nin": [Regex("^coll1$"), Regex("^coll2$"), Regex("^coll4$")]}}, C3 + OTHER),
    (_expr({"$not": {"$or": [_rx("$ns.coll", "^coll1$"), _rx("$ns.coll", "^coll2$"),
                             _rx("$ns.coll", "^coll4$")]}}), C3 + OTHER),
    ({"ns.coll": {"$nin": [Regex("^coll.*$"), Regex("^sys.*$")]}}, OTHER),
    (_expr({"$not": {"$or": [_rx("$ns.coll", "^coll.*$"), _rx("$ns.coll", "^sys.*$")]}}), OTHER),
    ({"ns.coll": {"$nin": []}}, ALL),
    ({"ns.coll": {"$nin": ["coll1", 1]}}, C2 + C3 + C4 + OTHER),
    (_expr({"$not": {"$in": ["$ns.coll", ["coll1", 1]]}}), C2 + C3 + C4 + OTHER),
    ({"ns.coll": {"$nin": ["coll1", Regex("^coll2$"), "coll4"]}}, C3 + OTHER),
    (_expr({"$not": {"$or": [{"$in": ["$ns.coll", ["coll1", "coll4"]]},
                             _rx("$ns.coll", "^coll2$")]}}), C3 + OTHER),
]
DROP1 = whole_cluster_expected({"coll1": {"drop": ["coll1"]}})
# The jstest expects [DB, DB]: a dropDatabase event from each shard of its ShardingTest. How many
# shards report one is the sharded cluster's business (cdcserver's embedded cluster: the primary
# shard's): checked here is what the filter decides, only dropDatabase events of DB, at least one.
DROP_DATABASE_MATCHES = [{"ns": {"db": DB}}, {"$expr": {"$eq": ["$ns", {"db": DB}]}}]
DROP_CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"ns": NS1}, DROP1), (_eq("$ns", NS1), DROP1),
    ({"ns.coll": "coll1"}, DROP1), (_eq("$ns.coll", "coll1"), DROP1),
    *_regex_pair("ns.coll", "^col.*1", "", DROP1),
]
ESCAPED_DOT_CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"ns.coll": {"$nin": [Regex(r"^foo\.")]}},
     whole_cluster_expected({"foo_bar": {"insert": [1, 3]}})),
]


@pytest.mark.parametrize("mode", MODES)
def test_namespace_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    def sharded(db: str, coll: str, split_at: int) -> Any:
        return create_sharded_collection(mongos, cluster, "_id", db, coll, split_at)

    coll1 = sharded(DB, "coll1", 2)
    other = sharded("other_db", "other_coll", 2)
    coll2 = sharded(DB, "coll2", 4)
    coll3 = sharded(DB, "coll.coll3", 6)
    coll4 = sharded(DB, "coll4", 10)
    with mongos.watch([]) as stream:
        first_token = stream.resume_token
    fields = {"renameCollection": True, "drop": {}, "dropDatabase": None}

    def writes() -> None:
        coll1.insert_many([{"_id": 1, **fields}, {"_id": 2, **fields}], ordered=True)
        coll2.insert_one({"_id": 3, **fields})
        coll2.insert_one({"_id": 4, **fields})
        coll2.rename("newColl2")
        coll3.insert_one({"_id": 5, **fields})
        coll3.insert_one({"_id": 6, **fields})
        coll3.drop()
        coll4.insert_one({"_id": 7, "renameCollection": "coll2", "drop": "coll.coll3",
                          "dropDatabase": 1})
        coll4.insert_one({"_id": 8, **fields})
        coll4.insert_one({"_id": 9, "renameCollection": "no_dot_ns", "drop": "",
                          "dropDatabase": ""})
        coll4.insert_one({"_id": 10, "renameCollection": "coll2", "drop": "coll.coll3",
                          "dropDatabase": 1})
        coll4.insert_one({"_id": 11, **fields})
        coll4.insert_one({"_id": 12, "renameCollection": "no_dot_ns", "drop": "",
                          "dropDatabase": ""})
        other.insert_one({"_id": 1, **fields})
        other.insert_one({"_id": 2, **fields})

    run_cases(mode, whole_cluster_opener(mongos, first_token), [(writes, CASES)],
              whole_cluster_identity)

    with mongos.watch([]) as stream:
        second_token = stream.resume_token
    opener = whole_cluster_opener(mongos, second_token)
    live = [opener(m, True) for m in DROP_DATABASE_MATCHES] if mode == "live" else []
    run_cases(mode, opener, [(lambda: mongos.drop_database(DB), DROP_CASES)],
              whole_cluster_identity)
    for i, match in enumerate(DROP_DATABASE_MATCHES):
        stream = live[i] if live else opener(match, False)
        events = read_until_quiet(stream, 1)
        assert events and all(whole_cluster_identity(e) == ("dropDatabase", DB)
                              for e in events), (match, events)

    with_dot = sharded(DB, "foo.bar", 2)
    with_underscore = sharded(DB, "foo_bar", 2)
    with mongos.watch([]) as stream:
        third_token = stream.resume_token

    def inserts() -> None:
        for coll in (with_dot, with_underscore):
            coll.insert_one({"_id": 1})
            coll.insert_one({"_id": 3})

    run_cases(mode, whole_cluster_opener(mongos, third_token), [(inserts, ESCAPED_DOT_CASES)],
              whole_cluster_identity)
