"""Translated from mongodb/mongo
`jstests/change_streams/oplog_rewrite/change_stream_match_pushdown_to_rewrite.js` @
02790b2165b60769dbeb39be413b3a9f030425bf: the events a whole-cluster stream resumed from one
token returns for `$match`es on the `to` field of rename events (whole, `to.db`, `to.coll`,
regexes with and without `i`, `$in` / `$nin` of strings, regexes and a non-string, and each
one's `$expr` twin), after inserting documents with an `"o.to"` field (which must not be taken
for the oplog's `o.to`) into two collections sharded on `_id` across two shards
(`pushdown_util.py`) and renaming both. Left out: the `executionStats` counts (oplog entries
each shard's cursor returned: cdcserver has no explain of change streams) and the
`disableMatchExpressionOptimization` fail point (mongod-internal: the events are the same)."""

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
    regex_match,
    run_cases,
    whole_cluster_identity,
    whole_cluster_opener,
)

__all__ = ["cluster", "mongos"]

DB = "change_stream_match_pushdown_and_rewrite"
NS1 = DB + ".newColl1"
NS2 = DB + ".newColl2"
INS1 = [("insert", i, "coll1") for i in (3, 4, 5, 6)]
INS2 = [("insert", i, "coll2") for i in (7, 8, 9, 10)]
R1 = [("rename", "newColl1", "coll1")]
R2 = [("rename", "newColl2", "coll2")]
R = R1 + R2
ALL = INS1 + R1 + INS2 + R2
INS = INS1 + INS2


_rx, _expr, _eq = regex_match, expr, expr_eq  # the jstests' own short names


TO1 = {"db": DB, "coll": "newColl1"}
TO2 = {"db": DB, "coll": "newColl2"}
CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"to": TO1}, R1), (_eq("$to", TO1), R1),
    ({"to": TO2}, R2), (_eq("$to", TO2), R2),
    ({"to": {"db": DB}}, []), (_eq("$to", {"db": DB}), []),
    ({"to": {"db": DB, "coll": "unknown"}}, []), (_eq("$to", {"db": DB, "coll": "unknown"}), []),
    ({"to": {"coll": "newColl1", "db": DB}}, []),
    (_eq("$to", {"coll": "newColl1", "db": DB}), []),
    ({"to": {"db": DB, "coll": "newColl1", "extra": "extra"}}, []),
    (_eq("$to", {"db": DB, "coll": "newColl1", "extra": "extra"}), []),
    ({"to": {}}, []),
    ({"to.db": DB}, R), (_eq("$to.db", DB), R),
    ({"to.db": Regex("^change_stream_match_pushdown.*$")}, R),
    (_expr(_rx("$to.db", "^change_stream_match_pushdown.*$")), R),
    ({"to.db": Regex("^(change_stream_match_pushdown.*$)")}, R),
    (_expr(_rx("$to.db", "^(change_stream_match_pushdown.*$)")), R),
    ({"to.db": Regex("^(Change_Stream_MATCH_PUSHDOWN.*$)", "i")}, R),
    (_expr(_rx("$to.db", "^(Change_Stream_MATCH_PUSHDOWN.*$)", "i")), R),
    ({"to.db": Regex("(^unknown$|^change_stream_match_pushdown.*$)")}, R),
    (_expr(_rx("$to.db", "(^unknown$|^change_stream_match_pushdown.*$)")), R),
    ({"to.db": Regex("^unknown$|^change_stream_match_pushdown.*$")}, R),
    (_expr(_rx("$to.db", "^unknown$|^change_stream_match_pushdown.*$")), R),
    ({"to.db": "unknown"}, []), (_eq("$to.db", "unknown"), []),
    ({"to.db": ""}, []), (_eq("$to.db", ""), []),
    ({"to.db.extra": DB}, []), (_eq("$to.db.extra", DB), []),
    ({"to.coll": "newColl1"}, R1), (_eq("$to.coll", "newColl1"), R1),
    ({"to.coll": "newColl2"}, R2), (_eq("$to.coll", "newColl2"), R2),
    ({"to.coll": Regex("^newColl.*1")}, R1), (_expr(_rx("$to.coll", "^newColl.*1")), R1),
    ({"to.coll": Regex("^newColl.*2")}, R2), (_expr(_rx("$to.coll", "^newColl.*2")), R2),
    ({"to.coll": Regex("^newColl.*")}, R), (_expr(_rx("$to.coll", "^newColl.*")), R),
    ({"to.coll": Regex("^newColl.*", "i")}, R), (_expr(_rx("$to.coll", "^newColl.*", "i")), R),
    ({"to.coll": Regex("^newColl.*1$|^newColl.*2$")}, R),
    (_expr(_rx("$to.coll", "^newColl.*1$|^newColl.*2$")), R),
    ({"to.coll": Regex("^newColl[^1]")}, R2), (_expr(_rx("$to.coll", "^newColl[^1]")), R2),
    ({"to.coll": "unknown"}, []), (_eq("$to.coll", "unknown"), []),
    ({"to.coll": ""}, []), (_eq("$to.coll", ""), []),
    ({"to.coll.extra": "coll1"}, []), (_eq("$to.coll.extra", "coll1"), []),
    ({"to.db": {"$in": [DB, "unknown"]}}, R),
    (_expr({"$in": ["$to.db", [DB, "unknown"]]}), R),
    ({"to.db": {"$in": [Regex("^change_stream_match.*$"), Regex("^unknown$")]}}, R),
    (_expr({"$or": [_rx("$to.db", "^change_stream_match.*$"), _rx("$to.db", "^unknown$")]}), R),
    ({"to.db": {"$in": [Regex("^change_stream_MATCH.*$", "i"), Regex("^unknown$", "i")]}}, R),
    (_expr({"$or": [_rx("$to.db", "^change_stream_MATCH.*$", "i"),
                    _rx("$to.db", "^unknown$", "i")]}), R),
    ({"to.db": {"$in": []}}, []), (_expr({"$in": ["$to.db", []]}), []),
    ({"to.db": {"$in": [DB, 1]}}, R), (_expr({"$in": ["$to.db", [DB, 1]]}), R),
    ({"to.db": {"$in": ["unknown1", Regex("^unknown2$")]}}, []),
    (_expr({"$or": [{"$eq": ["$to.db", "unknown1"]}, _rx("$to.db", "^unknown2$")]}), []),
    ({"to": {"$in": [TO1, TO2]}}, R), (_expr({"$in": ["$to", [TO1, TO2]]}), R),
    ({"to.coll": {"$in": ["newColl1", "newColl2"]}}, R),
    (_expr({"$in": ["$to.coll", ["newColl1", "newColl2"]]}), R),
    ({"to.coll": {"$in": [Regex("^newColl1$"), Regex("^newColl2$")]}}, R),
    (_expr({"$or": [_rx("$to.coll", "^newColl1$"), _rx("$to.coll", "^newColl2$")]}), R),
    ({"to.coll": {"$in": [Regex("^newColl.*$"), Regex("^unknown.*")]}}, R),
    (_expr({"$or": [_rx("$to.coll", "^newColl.*$"), _rx("$to.coll", "^unknown.*")]}), R),
    ({"to.coll": {"$in": [Regex("^newcoll.*$", "i"), Regex("^unknown", "i")]}}, R),
    (_expr({"$or": [_rx("$to.coll", "^newcoll.*$", "i"), _rx("$to.coll", "^unknown", "i")]}), R),
    ({"to.coll": {"$in": []}}, []),
    ({"to.coll": {"$in": ["newColl1", 1]}}, R1),
    (_expr({"$in": ["$to.coll", ["newColl1", 1]]}), R1),
    ({"to.coll": {"$in": ["newColl1", Regex("^newColl.*2$")]}}, R),
    (_expr({"$or": [{"$eq": ["$to.coll", "newColl1"]}, _rx("$to.coll", "^newColl.*2")]}), R),
    ({"to.coll": {"$in": ["unknown1", Regex("^unknown2$")]}}, []),
    (_expr({"$or": [{"$eq": ["$to.coll", "unknown1"]}, _rx("$to.coll", "^unknown2$")]}), []),
    ({"to.db": {"$nin": []}}, ALL), (_expr({"$not": {"$in": ["$to.db", []]}}), ALL),
    ({"to.db": {"$nin": ["unknown1", "unknown2"]}}, ALL),
    (_expr({"$not": {"$in": ["$to.db", ["unknown1", "unknown2"]]}}), ALL),
    ({"to.db": {"$nin": [Regex("^unknown1$"), Regex("^unknown2$")]}}, ALL),
    (_expr({"$not": {"$or": [_rx("$to.db", "^unknown1$"), _rx("$to.db", "^unknown2$")]}}), ALL),
    ({"to.db": {"$nin": [DB, "unknown"]}}, INS),
    (_expr({"$not": {"$in": ["$to.db", [DB, "unknown"]]}}), INS),
    ({"to.db": {"$nin": [Regex("change_stream_match_pushdown_and_rewr.*"),
                         Regex("^unknown.*")]}}, INS),
    (_expr({"$not": {"$or": [_rx("$to.db", "change_stream_match_pushdown_and_rewr.*"),
                             _rx("$to.db", "^unknown.*")]}}), INS),
    ({"to.coll": {"$nin": ["newColl1", "unknown"]}}, INS1 + INS2 + R2),
    (_expr({"$not": {"$or": [{"$in": ["$to.coll", ["newColl1", "unknown"]]}]}}),
     INS1 + INS2 + R2),
    ({"to.coll": {"$nin": [Regex("^newColl1$"), Regex("^unknown$")]}}, INS1 + INS2 + R2),
    (_expr({"$not": {"$or": [_rx("$to.coll", "^newColl1$"), _rx("$to.coll", "^unknown$")]}}),
     INS1 + INS2 + R2),
    ({"to.coll": {"$nin": [Regex("^newColl.*$"), Regex("^unknown.*$")]}}, INS),
    (_expr({"$not": {"$or": [_rx("$to.coll", "^newColl.*$"), _rx("$to.coll", "^unknown.*$")]}}),
     INS),
    ({"to.coll": {"$nin": []}}, ALL), (_expr({"$not": {"$in": ["$to.coll", []]}}), ALL),
    ({"to.coll": {"$nin": ["newColl1", 1]}}, INS1 + INS2 + R2),
    (_expr({"$not": {"$in": ["$to.coll", ["newColl1", 1]]}}), INS1 + INS2 + R2),
    ({"to.coll": {"$nin": ["newColl1", Regex("^newColl2$")]}}, INS),
    (_expr({"$not": {"$or": [{"$eq": ["$to.coll", "newColl1"]},
                             _rx("$to.coll", "^newColl2$")]}}), INS),
]


@pytest.mark.parametrize("mode", MODES)
def test_to_rewrite(mongos: Any, cluster: Any, mode: str) -> None:
    coll1 = create_sharded_collection(mongos, cluster, "_id", DB, "coll1", 5)
    coll2 = create_sharded_collection(mongos, cluster, "_id", DB, "coll2", 9)
    with mongos.watch([]) as stream:
        resume_after = stream.resume_token

    def writes() -> None:
        coll1.insert_one({"_id": 3, "o.to": 3})
        coll1.insert_one({"_id": 4, "o.to": ""})
        coll1.insert_one({"_id": 5, "o.to": NS2})
        coll1.insert_one({"_id": 6, "o.to": DB})
        coll1.rename("newColl1")
        coll2.insert_one({"_id": 7, "o.to": 3})
        coll2.insert_one({"_id": 8, "o.to": ""})
        coll2.insert_one({"_id": 9, "o.to": NS1})
        coll2.insert_one({"_id": 10, "o.to": DB})
        coll2.rename("newColl2")

    run_cases(mode, whole_cluster_opener(mongos, resume_after), [(writes, CASES)],
              whole_cluster_identity)
