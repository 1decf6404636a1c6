"""The oplog filter ($_internalChangeStreamOplogMatch, reference §2): the regexes mongod builds
(document_source_change_stream_test.cpp ChangeStreamBuiltInRegexes*, ChangeStreamRegexEscape)
and which entries each kind of stream selects."""

from __future__ import annotations

import datetime
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.oplog_match import (
    REGEX_ALL_COLLECTIONS,
    REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS,
    REGEX_ALL_DBS,
    REGEX_CMD_COLL,
    OplogFilter,
    regex_escape_ns,
)
from pipeline_stages.spec import ChangeStreamSpec

UUID = Binary(b"\x11" * 16, 4)
WALL = datetime.datetime(2024, 7, 1, tzinfo=datetime.UTC)
NULL_OPTIME = {"ts": Timestamp(0, 0), "t": Int64(-1)}


def entry(**fields: Any) -> Any:
    doc = {"ts": Timestamp(1700000000, 1), "t": Int64(1), "v": Int64(2), "wall": WALL}
    doc.update(fields)
    return decode_entry(bson.encode(doc))


def spec(scope: str, **kw: Any) -> ChangeStreamSpec:
    if scope == "collection":
        return ChangeStreamSpec(scope="collection", db="test", coll="watched", **kw)
    if scope == "database":
        return ChangeStreamSpec(scope="database", db="test", **kw)
    return ChangeStreamSpec(scope="cluster", db="admin", **kw)


# -- regexes ----------------------------------------------------------------------------------


def test_escape_matches_mongod_unit_test() -> None:
    # ChangeStreamStageTest.ChangeStreamRegexEscape
    assert regex_escape_ns("") == ""
    assert regex_escape_ns(" ") == " "
    assert regex_escape_ns("foo bar") == "foo bar"
    assert regex_escape_ns("qux-QUX ") == "qux-QUX "
    assert regex_escape_ns("^foo*bar$") == "\\^foo\\*bar\\$"
    assert regex_escape_ns("*+|()^?[]./\\$") == "\\*\\+\\|\\(\\)\\^\\?\\[\\]\\.\\/\\\\\\$"
    # Not escaped by mongod (braces, dashes, '#', non-ASCII).
    assert regex_escape_ns("a{1}-#é") == "a{1}-#é"


def test_constants() -> None:
    assert REGEX_ALL_COLLECTIONS == "(?!(\\$|system\\.))"
    assert REGEX_ALL_DBS == "^(?!(admin|config|local)\\.)[^.]+"
    assert REGEX_CMD_COLL == "\\$cmd$"
    assert REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS == (
        "(?!(\\$|system\\.(?!(js$|resharding\\.|buckets\\.|views$))))"
    )


def test_regexes_single_collection() -> None:
    f = OplogFilter(ChangeStreamSpec(scope="collection", db="unittest", coll="someCollection"))
    assert f.ns_regex == "^unittest\\.someCollection$"
    assert f.coll_regex == "^someCollection$"
    assert f.cmd_ns_regex == "^unittest\\.\\$cmd$"
    assert f.view_ns_regex is None


def test_regexes_single_database() -> None:
    f = OplogFilter(ChangeStreamSpec(scope="database", db="unittest"))
    assert f.ns_regex == "^unittest\\." + REGEX_ALL_COLLECTIONS
    assert f.coll_regex == "^" + REGEX_ALL_COLLECTIONS
    assert f.cmd_ns_regex == "^unittest\\.\\$cmd$"
    assert f.view_ns_regex == "^unittest\\.system.views$"  # 7.0/8.0 helper: '.' unescaped


def test_regexes_whole_cluster() -> None:
    f = OplogFilter(ChangeStreamSpec(scope="cluster", db="admin"))
    assert f.ns_regex == REGEX_ALL_DBS + "\\." + REGEX_ALL_COLLECTIONS
    assert f.coll_regex == "^" + REGEX_ALL_COLLECTIONS
    assert f.cmd_ns_regex == REGEX_ALL_DBS + "\\." + REGEX_CMD_COLL
    assert f.view_ns_regex == REGEX_ALL_DBS + "\\.system.views$"


def test_regexes_show_system_events() -> None:
    for scope in ("database", "cluster"):
        f = OplogFilter(spec(scope, show_system_events=True))
        assert f.ns_regex.endswith("\\." + REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS)
        assert f.coll_regex == "^" + REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS
    f = OplogFilter(spec("collection", show_system_events=True))
    assert f.ns_regex == "^test\\.watched$"


def test_regexes_with_special_characters() -> None:
    f = OplogFilter(ChangeStreamSpec(scope="collection", db="d(b)", coll="a.b*c|x"))
    assert f.ns_regex == "^d\\(b\\)\\.a\\.b\\*c\\|x$"
    assert f.coll_regex == "^a\\.b\\*c\\|x$"
    assert f.cmd_ns_regex == "^d\\(b\\)\\.\\$cmd$"
    assert f.matches(entry(op="i", ns="d(b).a.b*c|x", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="d(b).aXbbbc|x", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="d(b).x", o={"_id": 1}))  # not an alternation
    assert f.matches(entry(op="c", ns="d(b).$cmd", o={"drop": "a.b*c|x"}))

    f = OplogFilter(ChangeStreamSpec(scope="database", db="we+b"))
    assert f.ns_regex == "^we\\+b\\." + REGEX_ALL_COLLECTIONS
    assert f.matches(entry(op="i", ns="we+b.c", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="weeb.c", o={"_id": 1}))


def test_braces_keep_pcre_meaning() -> None:
    # mongod does not escape '{': "{2}" is a PCRE quantifier, "{,2}" is literal (PCRE2 < 10.43)
    # while Python would read it as a quantifier.
    f = OplogFilter(ChangeStreamSpec(scope="collection", db="db", coll="x{,2}"))
    assert f.ns_regex == "^db\\.x{,2}$"
    assert f.matches(entry(op="i", ns="db.x{,2}", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="db.xx", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="db.", o={"_id": 1}))
    f = OplogFilter(ChangeStreamSpec(scope="collection", db="db", coll="x{2}"))
    assert f.matches(entry(op="i", ns="db.xx", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="db.x{2}", o={"_id": 1}))
    f = OplogFilter(ChangeStreamSpec(scope="database", db="a{2}"))
    assert f.matches(entry(op="i", ns="aa.c", o={"_id": 1}))


def test_invalid_pattern_is_a_mongo_error() -> None:
    with pytest.raises(MongoError) as err:
        OplogFilter(ChangeStreamSpec(scope="collection", db="db", coll="{2}x"))
    assert err.value.code == 51091


def test_dollar_matches_before_final_newline_like_pcre() -> None:
    f = OplogFilter(spec("collection"))
    assert f.matches(entry(op="i", ns="test.watched\n", o={"_id": 1}))
    assert not f.matches(entry(op="i", ns="test.watched\nx", o={"_id": 1}))


# -- the entry x scope table ------------------------------------------------------------------


def crud(op: str, ns: str, **kw: Any) -> Any:
    o = {"_id": 1} if op != "u" else {"$v": 2, "diff": {"u": {"a": 1}}}
    extra = {"o2": {"_id": 1}} if op in ("i", "u") else {}
    return entry(op=op, ns=ns, ui=UUID, o=o, **extra, **kw)


def cmd(db: str, o: dict[str, Any], **kw: Any) -> Any:
    return entry(op="c", ns=f"{db}.$cmd", o=o, **kw)


def apply_ops(ops: list[dict[str, Any]], **o_extra: Any) -> dict[str, Any]:
    return {"applyOps": ops, **o_extra}


def inner(op: str, ns: str, **kw: Any) -> dict[str, Any]:
    return {"op": op, "ns": ns, "ui": UUID, "o": {"_id": 1}, **kw}


def txn(o: dict[str, Any], prev: dict[str, Any] | None = NULL_OPTIME, **kw: Any) -> Any:
    fields: dict[str, Any] = {
        "lsid": {"id": UUID, "uid": Binary(b"\x00" * 32, 0)},
        "txnNumber": Int64(3),
    }
    if prev is not None:
        fields["prevOpTime"] = prev
    fields.update(kw)
    return entry(op="c", ns="admin.$cmd", o=o, **fields)


def noop(ns: str, o2: dict[str, Any]) -> Any:
    return entry(op="n", ns=ns, o={"msg": "x"}, o2=o2)


W, OT, X = "test.watched", "test.other", "other.watched"
LINK = {"ts": Timestamp(1700000000, 0), "t": Int64(1)}

# (id, entry, collection, database, cluster)
TABLE: list[tuple[str, Any, bool, bool, bool]] = [
    # CRUD
    ("insert-watched", crud("i", W), True, True, True),
    ("update-watched", crud("u", W), True, True, True),
    ("delete-watched", crud("d", W), True, True, True),
    ("insert-other-coll", crud("i", OT), False, True, True),
    ("insert-other-db", crud("i", X), False, False, True),
    ("insert-db-prefix", crud("i", "testing.watched"), False, False, True),
    ("insert-system-profile", crud("i", "test.system.profile"), False, False, False),
    ("insert-system-views", crud("i", "test.system.views"), False, False, False),
    ("insert-system-buckets", crud("i", "test.system.buckets.ts"), False, False, False),
    ("insert-system-js", crud("i", "test.system.js"), False, False, False),
    ("insert-dollar-coll", crud("i", "test.$foo"), False, False, False),
    ("insert-systemish-name", crud("i", "test.systemx"), False, True, True),
    ("insert-admin", crud("i", "admin.c"), False, False, False),
    ("insert-config", crud("i", "config.system.sessions"), False, False, False),
    ("insert-config-coll", crud("i", "config.c"), False, False, False),
    ("insert-local", crud("i", "local.c"), False, False, False),
    ("insert-adminx", crud("i", "adminx.c"), False, False, True),
    ("insert-fromMigrate", crud("i", W, fromMigrate=True), False, False, False),
    ("insert-fromMigrate-false", crud("i", W, fromMigrate=False), True, True, True),
    ("insert-no-ns", entry(op="i", o={"_id": 1}), False, False, False),
    # DDL
    ("drop-watched", cmd("test", {"drop": "watched"}), True, True, True),
    ("drop-other", cmd("test", {"drop": "other"}), False, True, True),
    ("drop-other-db", cmd("other", {"drop": "watched"}), False, False, True),
    ("drop-system", cmd("test", {"drop": "system.buckets.x"}), False, False, False),
    ("drop-admin", cmd("admin", {"drop": "c"}), False, False, False),
    ("rename-from-watched", cmd("test", {"renameCollection": W, "to": "test.new"}),
     True, True, True),
    ("rename-onto-watched", cmd("test", {"renameCollection": OT, "to": W}), True, True, True),
    ("rename-unwatched", cmd("test", {"renameCollection": OT, "to": "test.b"}), False, True, True),
    ("rename-to-system", cmd("test", {"renameCollection": "test.system.a", "to": "test.system.b"}),
     False, False, False),
    ("rename-other-db", cmd("other", {"renameCollection": "other.a", "to": "other.b"}),
     False, False, True),
    ("to-without-rename", cmd("test", {"xyz": 1, "to": W}), False, False, False),
    ("create-watched", cmd("test", {"create": "watched", "idIndex": {"v": 2}}), True, True, True),
    ("create-other", cmd("test", {"create": "other"}), False, True, True),
    ("create-admin", cmd("admin", {"create": "c"}), False, False, False),
    ("createIndexes", cmd("test", {"createIndexes": "watched", "v": 2, "key": {"a": 1}}),
     True, True, True),
    ("commitIndexBuild", cmd("test", {"commitIndexBuild": "watched", "indexes": []}),
     True, True, True),
    ("startIndexBuild", cmd("test", {"startIndexBuild": "watched", "indexes": []}),
     False, False, False),
    ("abortIndexBuild", cmd("test", {"abortIndexBuild": "watched", "indexes": []}),
     False, False, False),
    ("dropIndexes", cmd("test", {"dropIndexes": "watched", "index": "a_1"}), True, True, True),
    ("collMod", cmd("test", {"collMod": "watched", "validator": {}}), True, True, True),
    ("collMod-other", cmd("test", {"collMod": "other"}), False, True, True),
    ("dropDatabase", cmd("test", {"dropDatabase": 1}), False, True, True),
    ("dropDatabase-other", cmd("other", {"dropDatabase": 1}), False, False, True),
    ("dropDatabase-config", cmd("config", {"dropDatabase": 1}), False, False, False),
    ("drop-fromMigrate", cmd("test", {"drop": "watched"}, fromMigrate=True), False, False, False),
    ("dbCheck", cmd("test", {"dbCheck": "watched"}), False, False, False),
    # transactions and applyOps
    ("applyOps-some-watched", txn(apply_ops([inner("i", OT), inner("i", W)])), True, True, True),
    ("applyOps-other-db", txn(apply_ops([inner("i", X)])), False, False, True),
    ("applyOps-none-watched", txn(apply_ops([inner("i", "other.x")])), False, False, True),
    ("applyOps-admin-only", txn(apply_ops([inner("i", "admin.x")])), False, False, False),
    ("applyOps-empty", txn(apply_ops([])), False, False, False),
    ("applyOps-last-link", txn(apply_ops([inner("i", "admin.x")]), prev=LINK), True, True, True),
    ("applyOps-no-prevOpTime", txn(apply_ops([inner("i", "admin.x")]), prev=None),
     True, True, True),
    ("applyOps-create-cmd", txn(apply_ops([{"op": "c", "ns": "test.$cmd",
                                            "o": {"create": "watched"}}])), True, True, True),
    ("applyOps-createIndexes-cmd", txn(apply_ops([{"op": "c", "ns": "test.$cmd",
                                                   "o": {"createIndexes": "other"}}])),
     False, True, True),
    ("applyOps-drop-cmd", txn(apply_ops([{"op": "c", "ns": "test.$cmd",
                                          "o": {"drop": "watched"}}])), False, False, False),
    ("applyOps-partialTxn", txn(apply_ops([inner("i", W)], partialTxn=True)), False, False, False),
    ("applyOps-partialTxn-link", txn(apply_ops([inner("i", W)], partialTxn=True), prev=LINK),
     False, False, False),
    ("applyOps-prepare", txn(apply_ops([inner("i", W)], prepare=True)), False, False, False),
    ("applyOps-prepare-false", txn(apply_ops([inner("i", W)], prepare=False)), True, True, True),
    ("applyOps-not-array", txn({"applyOps": {"0": inner("i", W)}}), False, False, False),
    ("commitTransaction", txn({"commitTransaction": 1, "commitTimestamp": Timestamp(5, 1)},
                              prev=LINK), True, True, True),
    ("commitTransaction-long", txn({"commitTransaction": Int64(1)}, prev=LINK), True, True, True),
    ("commitTransaction-double", txn({"commitTransaction": 1.0}, prev=LINK), True, True, True),
    ("commitTransaction-bool", txn({"commitTransaction": True}, prev=LINK), False, False, False),
    ("abortTransaction", txn({"abortTransaction": 1}, prev=LINK), False, False, False),
    ("applyOps-fromMigrate", txn(apply_ops([inner("i", W)]), fromMigrate=True),
     False, False, False),
    # no-ops
    ("noop-periodic", entry(op="n", ns="", o={"msg": "periodic noop"}), False, False, False),
    ("noop-initiating", entry(op="n", ns="", o={"msg": "initiating set"}), False, False, False),
    ("noop-shardCollection", noop(W, {"shardCollection": W, "key": {"a": 1}}), True, True, True),
    ("noop-shardCollection-other", noop(OT, {"shardCollection": OT}), False, True, True),
    ("noop-refineCollectionShardKey", noop(W, {"refineCollectionShardKey": W}), True, True, True),
    ("noop-reshardCollection", noop(W, {"reshardCollection": W}), True, True, True),
    ("noop-reshardBegin", noop(W, {"reshardBegin": W, "reshardingUUID": UUID}), True, True, True),
    ("noop-reshardDoneCatchUp", noop(W, {"reshardDoneCatchUp": W}), True, True, True),
    ("noop-migrateChunkToNewShard", noop(W, {"migrateChunkToNewShard": W}), False, False, False),
    ("noop-migrateLastChunkFromShard", noop(W, {"migrateLastChunkFromShard": W}),
     False, False, False),
    ("noop-reshardBlockingWrites", noop(W, {"reshardBlockingWrites": W}), False, False, False),
    ("noop-shardCollection-admin", noop("admin.c", {"shardCollection": "admin.c"}),
     False, False, False),
    ("noop-endOfTransaction", noop("", {"endOfTransaction": [W]}), True, True, True),
    ("noop-endOfTransaction-other", noop("", {"endOfTransaction": [OT]}), False, True, True),
]


SCOPES = ["collection", "database", "cluster"]


@pytest.mark.parametrize("scope_index, scope", list(enumerate(SCOPES)))
@pytest.mark.parametrize("case", TABLE, ids=[row[0] for row in TABLE])
def test_table(case: tuple[str, Any, bool, bool, bool], scope_index: int, scope: str) -> None:
    name, e, *expected = case
    assert OplogFilter(spec(scope)).matches(e) is expected[scope_index], name


def test_show_migration_events() -> None:
    for scope in ("collection", "database", "cluster"):
        f = OplogFilter(spec(scope, show_migration_events=True))
        assert f.matches(crud("i", W, fromMigrate=True))
        assert f.matches(cmd("test", {"drop": "watched"}, fromMigrate=True))
        assert not f.matches(crud("i", "test.system.x", fromMigrate=True))
        assert f.matches_transaction_op(decode_entry(bson.encode(inner("i", W, fromMigrate=True))))


def test_show_system_events() -> None:
    f = OplogFilter(spec("database", show_system_events=True))
    # Migrated create/createIndexes on the watched database pass; other migrated writes do not.
    assert f.matches(cmd("test", {"create": "watched"}, fromMigrate=True))
    assert f.matches(cmd("test", {"createIndexes": "watched"}, fromMigrate=True))
    assert not f.matches(cmd("test", {"drop": "watched"}, fromMigrate=True))
    assert not f.matches(crud("i", W, fromMigrate=True))
    assert not f.matches(cmd("other", {"create": "watched"}, fromMigrate=True))
    # Some system collections become visible, others stay hidden.
    assert f.matches(crud("i", "test.system.js"))
    assert f.matches(crud("i", "test.system.buckets.ts"))
    assert f.matches(crud("i", "test.system.resharding.abc"))
    assert f.matches(crud("i", "test.system.views"))
    assert not f.matches(crud("i", "test.system.profile"))
    assert not f.matches(crud("i", "test.system.jsx"))
    assert not f.matches(crud("i", "test.$foo"))
    assert f.matches(noop(W, {"migrateLastChunkFromShard": W}))
    assert not f.matches(noop(W, {"migrateChunkToNewShard": W}))


def test_needs_merge_adds_migrate_chunk_to_new_shard() -> None:
    f = OplogFilter(spec("collection"), needs_merge=True)
    assert f.matches(noop(W, {"migrateChunkToNewShard": W}))
    assert not f.matches(noop(W, {"migrateLastChunkFromShard": W}))


@pytest.mark.parametrize("scope", ["database", "cluster"])
def test_view_definitions_with_expanded_events(scope: str) -> None:
    f = OplogFilter(spec(scope, show_expanded_events=True))
    view = {"_id": "test.v", "viewOn": "watched", "pipeline": []}
    assert f.matches(entry(op="i", ns="test.system.views", ui=UUID, o=view))
    assert f.matches(entry(op="u", ns="test.system.views", ui=UUID, o=view, o2={"_id": "test.v"}))
    assert f.matches(entry(op="d", ns="test.system.views", ui=UUID, o={"_id": "test.v"}))
    assert not f.matches(crud("i", "test.system.profile"))
    assert not f.matches(crud("i", "admin.system.views"))
    assert f.matches(crud("i", "other.system.views")) is (scope == "cluster")
    # Only CRUD on system.views: commands on it are not view definitions.
    assert not f.matches(cmd("test", {"create": "system.views"}))


def test_collection_stream_never_reads_view_definitions() -> None:
    f = OplogFilter(spec("collection", show_expanded_events=True))
    assert not f.matches(crud("i", "test.system.views"))


# -- invalidation -----------------------------------------------------------------------------


def test_is_invalidating() -> None:
    coll = OplogFilter(spec("collection"))
    db = OplogFilter(spec("database"))
    cluster = OplogFilter(spec("cluster"))
    drop = cmd("test", {"drop": "watched"})
    assert coll.is_invalidating(drop) and not db.is_invalidating(drop)
    assert not coll.is_invalidating(cmd("test", {"drop": "other"}))
    assert coll.is_invalidating(cmd("test", {"renameCollection": W, "to": "test.b"}))
    assert coll.is_invalidating(cmd("test", {"renameCollection": OT, "to": W}))
    assert not coll.is_invalidating(cmd("test", {"renameCollection": OT, "to": "test.b"}))
    assert not coll.is_invalidating(cmd("other", {"drop": "watched"}))
    drop_db = cmd("test", {"dropDatabase": 1})
    assert db.is_invalidating(drop_db) and not coll.is_invalidating(drop_db)
    assert not db.is_invalidating(cmd("other", {"dropDatabase": 1}))
    for e in (drop, drop_db, cmd("test", {"renameCollection": W, "to": "test.b"})):
        assert not cluster.is_invalidating(e)
    assert not coll.is_invalidating(crud("d", W))


def test_invalidation_is_exact_equality() -> None:
    # The operation filter's regex accepts a trailing newline; the invalidation filter does not.
    f = OplogFilter(spec("collection"))
    e = cmd("test", {"drop": "watched\n"})
    assert f.matches(e) and not f.is_invalidating(e)


# -- inner operations -------------------------------------------------------------------------


def raw(doc: dict[str, Any]) -> Any:
    return decode_entry(bson.encode(doc))


def test_matches_transaction_op() -> None:
    c, d, k = (OplogFilter(spec(s)) for s in ("collection", "database", "cluster"))
    assert all(f.matches_transaction_op(raw(inner("i", W))) for f in (c, d, k))
    assert [f.matches_transaction_op(raw(inner("u", OT))) for f in (c, d, k)] == [
        False, True, True,
    ]
    assert [f.matches_transaction_op(raw(inner("d", X))) for f in (c, d, k)] == [
        False, False, True,
    ]
    assert not any(f.matches_transaction_op(raw(inner("i", "test.system.x"))) for f in (c, d, k))
    assert not any(f.matches_transaction_op(raw(inner("i", W, fromMigrate=True)))
                   for f in (c, d, k))
    create = raw({"op": "c", "ns": "test.$cmd", "ui": UUID, "o": {"create": "watched"}})
    assert all(f.matches_transaction_op(create) for f in (c, d, k))
    create_other = raw({"op": "c", "ns": "test.$cmd", "o": {"createIndexes": "other"}})
    assert [f.matches_transaction_op(create_other) for f in (c, d, k)] == [False, True, True]
    # The invalidation filter is not part of the unwind filter; neither are no-ops.
    assert not c.matches_transaction_op(raw({"op": "n", "ns": W, "o": {"msg": "x"}}))
    # An applyOps nested in an applyOps is not an event.
    nested = raw({"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [inner("i", W)]}})
    assert not any(f.matches_transaction_op(nested) for f in (c, d, k))


def test_unknown_scope() -> None:
    with pytest.raises(ValueError):
        OplogFilter(ChangeStreamSpec(scope="shard", db="x"))  # type: ignore[arg-type]


# -- 9.0's upgradeDowngradeViewlessTimeseries: a rename of the buckets onto the collection ----


def _conversion(coll: Any, is_upgrade: Any = True, ns: str = "test.$cmd") -> Any:
    o: dict[str, Any] = {"upgradeDowngradeViewlessTimeseries": coll}
    if is_upgrade is not None:
        o["isUpgrade"] = is_upgrade
    return entry(op="c", ns=ns, ui=UUID, o=o)


@pytest.mark.parametrize("watched,is_upgrade,matches,invalidates", [
    ("watched", True, True, True),  # the target of the upgrade's rename
    ("system.buckets.watched", True, True, True),  # its source
    ("watched", False, True, True),
    ("other", True, False, False),
])
def test_a_viewless_conversion_is_matched_as_a_rename(
    watched: str, is_upgrade: bool, matches: bool, invalidates: bool
) -> None:
    f = OplogFilter(ChangeStreamSpec(scope="collection", db="test", coll=watched))
    e = _conversion("watched", is_upgrade)
    assert f.matches(e) is matches
    assert f.is_invalidating(e) is invalidates


def test_a_viewless_conversion_reaches_database_and_cluster_streams_of_its_db() -> None:
    e = _conversion("ts")
    assert OplogFilter(spec("database")).matches(e)
    assert OplogFilter(spec("cluster")).matches(e)
    assert not OplogFilter(spec("database")).is_invalidating(e)
    assert not OplogFilter(ChangeStreamSpec(scope="database", db="other")).matches(e)


@pytest.mark.parametrize("coll", [1, None, {"x": "ts"}])
def test_a_malformed_viewless_conversion_is_matched_by_no_stream(coll: Any) -> None:
    e = _conversion(coll)
    for s in (spec("cluster"), spec("database"), spec("collection")):
        f = OplogFilter(s)
        assert not f.matches(e) and not f.is_invalidating(e)
