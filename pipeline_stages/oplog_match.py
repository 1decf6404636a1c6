"""`$_internalChangeStreamOplogMatch`: which oplog entries a change stream reads (reference §2).

mongod builds one MatchExpression per stream out of three regexes (`nsRegex`, `collRegex`,
`cmdNsRegex`) and a handful of predicates on `op`, `o.*`, `o2.*`, `fromMigrate` and
`prevOpTime`. `OplogFilter` evaluates the same predicates directly on a decoded entry, with the
regexes compiled once per spec and cheap string/`op` tests in front of them, because it runs on
every oplog entry for every cursor.

Followed: `change_stream_filter_helpers.cpp` (7.1-8.0 revision: `backingBsonObjs`, `inMongos`,
unconditional `o2.endOfTransaction` branch, no `reshardBlockingWrites`), regex helpers from the
7.0/8.0 `document_source_change_stream.cpp` (own escaping of `*+|()^?[]./\\$`, not the later
`pcre_util::quoteMeta`). The time bound (`ts >= start`) and the user-`$match` rewrites are not
applied here: the caller owns the former, the latter is an optimisation with no semantic effect.

MongoDB match semantics reproduced where they can differ from a naive reading:
* a regex predicate is true for a string that matches, or for an array with a matching string
  element (implicit array traversal); other types never match;
* `{f: {$ne: v}}` / `{f: {$not: {$eq: v}}}` are true when `f` is missing;
* `{f: true}` only matches boolean `true` (not 1); `{f: 1}` matches any numeric 1 but not `true`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from bson.decimal128 import Decimal128
from bson.timestamp import Timestamp

from .errors import MongoError
from .oplog_entry import VIEWLESS_TIMESERIES, viewless_timeseries_rename
from .regex import python_pattern  # `{` as PCRE2 reads it
from .spec import ChangeStreamSpec

# document_source_change_stream.h constants.
REGEX_ALL_COLLECTIONS = r"(?!(\$|system\.))"
REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS = (
    r"(?!(\$|system\.(?!(js$|resharding\.|buckets\.|views$))))"
)
REGEX_ALL_DBS = r"^(?!(admin|config|local)\.)[^.]+"
REGEX_CMD_COLL = r"\$cmd$"

_NS_ESCAPES = frozenset("*+|()^?[]./\\$")

# Command names whose collection name (the command's value) is tested against collRegex.
_COLL_COMMANDS = ("drop", "create", "createIndexes", "commitIndexBuild", "dropIndexes", "collMod")

_CRUD_EXCLUDED_OPS = ("n", "c")

_MISSING: Any = object()


def regex_escape_ns(source: str) -> str:
    """mongod's `regexEscapeNsForChangeStream`: a backslash before each of `*+|()^?[]./\\$`.

    Everything else (including `{`, `}`, `-`, spaces) is left as is, exactly as mongod does.
    """
    return "".join("\\" + c if c in _NS_ESCAPES else c for c in source)


def _compile(pcre: str) -> re.Pattern[str]:
    try:
        return re.compile(python_pattern(pcre))
    except re.error as exc:
        # mongod fails to parse the $match it built (e.g. a collection named "{2}x").
        raise MongoError(51091, f"Regular expression is invalid: {exc}") from None


def _rx(pattern: re.Pattern[str], value: Any) -> bool:
    """A MatchExpression regex predicate on one path value (strings, or arrays of them)."""
    if type(value) is str:
        return pattern.search(value) is not None
    if isinstance(value, list):
        return any(type(v) is str and pattern.search(v) is not None for v in value)
    return False


def _is_true(value: Any) -> bool:
    """`{f: true}`: boolean true, or an array holding it."""
    if value is True:
        return True
    return isinstance(value, list) and any(v is True for v in value)


def _is_one(value: Any) -> bool:
    """`{f: 1}`: any numeric type equal to 1 (bools are a different BSON type)."""
    if isinstance(value, list):
        return any(_is_one(v) for v in value)
    if type(value) is bool:
        return False
    if isinstance(value, (int, float)):
        return value == 1
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        return d.is_finite() and d == Decimal(1)
    return False


def _is_null_op_time(value: Any) -> bool:
    """`{prevOpTime: {ts: Timestamp(0, 0), t: -1}}` under BSON equality (field order counts)."""
    if isinstance(value, list):
        return any(_is_null_op_time(v) for v in value)
    if not isinstance(value, Mapping) or list(value.keys()) != ["ts", "t"]:
        return False
    ts, t = value["ts"], value["t"]
    if not isinstance(ts, Timestamp) or ts.time != 0 or ts.inc != 0:
        return False
    if type(t) is bool:
        return False
    if isinstance(t, (int, float)):
        return t == -1
    return isinstance(t, Decimal128) and t.to_decimal() == Decimal(-1)


def _fast(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """A view of `doc` with a cheap `get`.

    `RawBSONDocument.get` goes through `Mapping.get`, which raises and catches a KeyError for
    every absent field (most fields this filter asks for are absent): about ten times the cost
    of a dict lookup. Its `items()` is the view of its decoded dict, whose `.mapping` is a
    read-only proxy of that dict.
    """
    if type(doc) is dict or type(doc) is MappingProxyType:
        return doc
    mapping = getattr(doc.items(), "mapping", None)
    return mapping if mapping is not None else doc


def _sub(doc: Any, key: str) -> Any:
    """`doc.key` for a document-valued field; _MISSING when `doc` is not a document.

    Oplog `o`/`o2` are always objects (IDL-enforced), so array traversal at this level is not
    reproduced.
    """
    if isinstance(doc, Mapping):
        return _fast(doc).get(key, _MISSING)
    return _MISSING


class OplogFilter:
    """The oplog filter of one change stream, minus the time bound."""

    __slots__ = (
        "scope",
        "ns_regex",
        "coll_regex",
        "cmd_ns_regex",
        "view_ns_regex",
        "_ns",
        "_ns_prefix",
        "_cmd_ns",
        "_coll",
        "_ns_rx",
        "_coll_rx",
        "_cmd_rx",
        "_view_rx",
        "_check_from_migrate",
        "_system_from_migrate",
        "_drop_database",
        "_internal_o2_keys",
        "_hide_timeseries",
    )

    def __init__(self, spec: ChangeStreamSpec, *, needs_merge: bool = False) -> None:
        """`needs_merge`: the stream's results are merged by a router (adds the
        `migrateChunkToNewShard` no-op, as mongod does for `inMongos || needsMerge`)."""
        self.scope = spec.scope
        all_colls = (
            REGEX_ALL_COLLECTIONS_SHOW_SYSTEM_EVENTS
            if spec.show_system_events
            else REGEX_ALL_COLLECTIONS
        )
        db = spec.db
        self._coll = spec.coll if spec.scope == "collection" else None
        self._ns = f"{db}.{spec.coll}" if self._coll is not None else None
        self._cmd_ns = f"{db}.$cmd"

        if spec.scope == "collection":
            assert spec.coll is not None, "a collection stream needs a collection name"
            self.ns_regex = "^" + regex_escape_ns(f"{db}.{spec.coll}") + "$"
            self.coll_regex = "^" + regex_escape_ns(spec.coll) + "$"
            self.cmd_ns_regex = "^" + regex_escape_ns(self._cmd_ns) + "$"
            self.view_ns_regex: str | None = None
        elif spec.scope == "database":
            self.ns_regex = "^" + regex_escape_ns(db) + "\\." + all_colls
            self.coll_regex = "^" + all_colls
            self.cmd_ns_regex = "^" + regex_escape_ns(self._cmd_ns) + "$"
            # The unescaped '.' in "system.views" is mongod's (7.0/8.0 helper).
            self.view_ns_regex = "^" + regex_escape_ns(db) + "\\.system.views$"
        elif spec.scope == "cluster":
            self.ns_regex = REGEX_ALL_DBS + "\\." + all_colls
            self.coll_regex = "^" + all_colls
            self.cmd_ns_regex = REGEX_ALL_DBS + "\\." + REGEX_CMD_COLL
            self.view_ns_regex = REGEX_ALL_DBS + "\\.system.views$"
        else:
            raise ValueError(f"unknown change stream scope {spec.scope!r}")

        self._ns_rx = _compile(self.ns_regex)
        self._coll_rx = _compile(self.coll_regex)
        self._cmd_rx = _compile(self.cmd_ns_regex)
        self._view_rx = (
            _compile(self.view_ns_regex)
            if self.view_ns_regex is not None and spec.show_expanded_events
            else None
        )
        # Every namespace a collection/database stream can match starts with "<db>."; testing
        # that first spares the regex for most entries of other databases.
        # (Not when the name holds a '{', which PCRE may read as a quantifier.)
        self._ns_prefix = f"{db}." if spec.scope != "cluster" and "{" not in db else ""

        self._check_from_migrate = not spec.show_migration_events
        self._system_from_migrate = spec.show_system_events
        self._drop_database = spec.scope != "collection"
        keys = ["reshardBegin", "reshardDoneCatchUp", "shardCollection"]
        if needs_merge:
            keys.append("migrateChunkToNewShard")
        if spec.show_system_events:
            keys.append("migrateLastChunkFromShard")
        keys += ["refineCollectionShardKey", "reshardCollection"]
        self._internal_o2_keys = tuple(keys)
        # 9.0: the entries of a viewless time-series collection (`isTimeseries: true`) only
        # with the aggregate's rawData, whatever showSystemEvents says (mongod 9.0's
        # change_stream_timeseries.js); the conversion entry is every stream's rename.
        self._hide_timeseries = not spec.raw_data

    # -- namespace tests ---------------------------------------------------------------------

    def _ns_match(self, ns: Any) -> bool:
        if type(ns) is str:
            return ns.startswith(self._ns_prefix) and self._ns_rx.search(ns) is not None
        return _rx(self._ns_rx, ns)

    def _cmd_ns_match(self, ns: Any) -> bool:
        if type(ns) is str:
            return ns.startswith(self._ns_prefix) and self._cmd_rx.search(ns) is not None
        return _rx(self._cmd_rx, ns)

    # -- the pieces of mongod's filter -------------------------------------------------------

    def _from_migrate_ok(self, entry: Mapping[str, Any]) -> bool:
        """`buildNotFromMigrateFilter` (only applied without showMigrationEvents)."""
        if not _is_true(entry.get("fromMigrate")):
            return True
        if not self._system_from_migrate:
            return False
        # showSystemEvents lets through migrated create/createIndexes on the watched db(s).
        if not self._cmd_ns_match(entry.get("ns")):
            return False
        o = entry.get("o")
        return _rx(self._coll_rx, _sub(o, "create")) or _rx(self._coll_rx, _sub(o, "createIndexes"))

    def _command_event(self, ns: Any, o: Any) -> bool:
        """Branch (2) of `buildOperationFilter`, for an entry already known to be `op: "c"`."""
        if not isinstance(o, Mapping) or not self._cmd_ns_match(ns):
            return False
        o = _fast(o)
        coll_rx = self._coll_rx
        for name in _COLL_COMMANDS:
            value = o.get(name, _MISSING)
            if value is not _MISSING and _rx(coll_rx, value):
                return True
        renamed = o.get("renameCollection", _MISSING)
        if renamed is not _MISSING and (
            _rx(self._ns_rx, renamed) or _rx(self._ns_rx, o.get("to", _MISSING))
        ):
            return True
        if VIEWLESS_TIMESERIES in o:  # 9.0's time-series conversion: a rename
            names = viewless_timeseries_rename(ns, o)
            if names is not None and (_rx(self._ns_rx, names[0]) or _rx(self._ns_rx, names[1])):
                return True
        return self._drop_database and "dropDatabase" in o

    def _operation_event(self, op: Any, ns: Any, o: Any) -> bool:
        """`buildOperationFilter`: CRUD on a watched namespace, or a watched DDL command."""
        if op == "c":
            return self._command_event(ns, o)
        return op != "n" and self._ns_match(ns)

    def is_invalidating(self, entry: Mapping[str, Any]) -> bool:
        """`buildInvalidationFilter`: the entries that invalidate this stream (exact equality,
        not regexes). Cluster streams are never invalidated."""
        entry = _fast(entry)
        if self.scope == "cluster" or entry.get("op") != "c" or entry.get("ns") != self._cmd_ns:
            return False
        o = entry.get("o")
        if not isinstance(o, Mapping):
            return False
        o = _fast(o)
        if self.scope == "database":
            return "dropDatabase" in o
        if _eq_str(o.get("drop", _MISSING), self._coll):
            return True
        renamed = o.get("renameCollection", _MISSING)
        if renamed is _MISSING:
            names = viewless_timeseries_rename(entry.get("ns"), o)
            return names is not None and self._ns in names
        return _eq_str(renamed, self._ns) or _eq_str(o.get("to", _MISSING), self._ns)

    def _transaction_event(self, entry: Mapping[str, Any], o: Any) -> bool:
        """`buildTransactionFilter` for an `op: "c"` entry (the no-op branch is elsewhere)."""
        if not isinstance(o, Mapping):
            return False
        o = _fast(o)
        apply_ops = o.get("applyOps", _MISSING)
        if isinstance(apply_ops, list):
            if _is_true(o.get("prepare")) or _is_true(o.get("partialTxn")):
                return False
            ns_rx, cmd_rx, coll_rx = self._ns_rx, self._cmd_rx, self._coll_rx
            for inner in apply_ops:
                if not isinstance(inner, Mapping):
                    continue
                inner = _fast(inner)
                inner_ns = inner.get("ns", _MISSING)
                if _rx(ns_rx, inner_ns):
                    return True
                # $elemMatch: a create/createIndexes command on a watched collection.
                if _rx(cmd_rx, inner_ns):
                    inner_o = inner.get("o")
                    if _rx(coll_rx, _sub(inner_o, "create")) or _rx(
                        coll_rx, _sub(inner_o, "createIndexes")
                    ):
                        return True
            # {prevOpTime: {$ne: <null OpTime>}}: true when absent, too.
            return not _is_null_op_time(entry.get("prevOpTime", _MISSING))
        return _is_one(o.get("commitTransaction", _MISSING))

    def _noop_event(self, entry: Mapping[str, Any]) -> bool:
        """`buildInternalOpFilter` and the `o2.endOfTransaction` branch of the transaction
        filter, for an `op: "n"` entry."""
        o2 = entry.get("o2")
        if not isinstance(o2, Mapping):
            return False
        o2 = _fast(o2)
        if _rx(self._ns_rx, o2.get("endOfTransaction", _MISSING)):
            return True
        if not self._ns_match(entry.get("ns")):
            return False
        return any(key in o2 for key in self._internal_o2_keys)

    # -- public ------------------------------------------------------------------------------

    def matches(self, entry: Mapping[str, Any]) -> bool:
        """The whole `buildOplogMatchFilter` except `ts >= start`."""
        entry = _fast(entry)
        get = entry.get
        if self._hide_timeseries and get("isTimeseries") is True and not _is_conversion(entry):
            return False
        # Most entries have no fromMigrate: test presence before calling out.
        if (
            self._check_from_migrate
            and get("fromMigrate") is not None
            and not self._from_migrate_ok(entry)
        ):
            return False
        op = get("op")
        if op == "c":
            o = get("o")
            return (
                self._command_event(get("ns"), o)
                or self.is_invalidating(entry)
                or self._transaction_event(entry, o)
            )
        if op == "n":
            return self._noop_event(entry)
        # CRUD (anything but n/c, as `$nor: [{op: "n"}, {op: "c"}]`), inlined _ns_match.
        ns = get("ns")
        if type(ns) is str:
            if ns.startswith(self._ns_prefix) and self._ns_rx.search(ns) is not None:
                return True
        elif _rx(self._ns_rx, ns):
            return True
        view_rx = self._view_rx
        return view_rx is not None and _rx(view_rx, ns)

    def matches_transaction_op(self, op: Mapping[str, Any]) -> bool:
        """`buildUnwindTransactionFilter`: one operation inside `applyOps`."""
        op = _fast(op)
        if self._hide_timeseries and op.get("isTimeseries") is True:
            return False
        if not self._operation_event(op.get("op"), op.get("ns"), op.get("o")):
            return False
        return not self._check_from_migrate or self._from_migrate_ok(op)


def _is_conversion(entry: Mapping[str, Any]) -> bool:
    o = entry.get("o")
    return entry.get("op") == "c" and isinstance(o, Mapping) and VIEWLESS_TIMESERIES in o


def _eq_str(value: Any, target: str | None) -> bool:
    """`{f: "<target>"}`: string equality, or an array holding the string."""
    if target is None:
        return False
    if type(value) is str:
        return value == target
    return isinstance(value, list) and any(type(v) is str and v == target for v in value)
