"""Secondary indexes a find reads: equality, `$in` and range predicates on a single-field
index scan only the documents in the index's bounds (mongod's IXSCAN + FETCH), and `explain`
says so, with the keys and documents examined.

A table is built from the collection's documents the first time a query can use the index,
then kept in step by every write to the working set (`WritesMixin._put`, a transaction's
commit): KeyString of the indexed value -> the keys of the documents holding it (each with
its RecordId, the order of equal keys), and the distinct KeyStrings sorted, for ranges. A
table that may be stale (other documents, another spec, another count) is rebuilt rather
than read, and every document it yields is matched against the whole filter again: the
index only narrows which documents are looked at, never what matches.

The planner takes one index: among the single-field, non-partial, non-hidden, collation-free
b-tree indexes whose field has an equality, `$in` or range predicate at the top of the filter
(or in a top-level `$and`), the one whose bounds hold the fewest keys (mongod's multi-planner
ends on the same index for such filters). Filters under a collation, `hint`, `min`/`max`,
`$text`, transactions and snapshot reads scan the collection as before.
"""

from __future__ import annotations

import bisect
import datetime
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded.indexes import index_entries
from pipeline_stages import keystring

if TYPE_CHECKING:
    from cdcserver.embedded.store_types import Collection

Records = Mapping[bytes, dict[str, Any]]

# KeyString CType ranges of the type brackets a range predicate stays in (mongod's bounds
# never cross types): [first byte, first byte of the next bracket).
_NUMBERS = (bytes((keystring.NUMERIC,)), bytes((keystring.NUMERIC_POS_LARGE + 1,)))
_STRINGS = (bytes((keystring.STRING_LIKE,)), bytes((keystring.STRING_LIKE + 1,)))
_OIDS = (bytes((keystring.OID,)), bytes((keystring.OID + 1,)))
_DATES = (bytes((keystring.DATE,)), bytes((keystring.DATE + 1,)))
_RANGE_OPS = ("$gt", "$gte", "$lt", "$lte")
_BOUND_OPS = frozenset({"$eq", "$in", *_RANGE_OPS})


def _key(value: Any) -> bytes:
    return keystring.encode_values((value,))[0]


def _bracket(value: Any) -> tuple[bytes, bytes] | None:
    """The type bracket of a range operand the planner bounds (else None: no index)."""
    kind = type(value)
    if kind in (int, Int64) or (kind is float and not math.isnan(value)):
        return _NUMBERS
    if kind is Decimal128 and not value.to_decimal().is_nan():
        return _NUMBERS
    if kind is str:
        return _STRINGS
    if kind is ObjectId:
        return _OIDS
    if kind is datetime.datetime:
        return _DATES
    return None


def _point(value: Any) -> bool:
    """Whether an equality operand is one the planner bounds: a scalar whose matches are
    exactly the documents holding an equal value (or an array with one)."""
    return type(value) is bool or _bracket(value) is not None


class IndexTable:
    """One single-field index's entries (see the module docstring)."""

    def __init__(self, spec: Mapping[str, Any], records: Records) -> None:
        self.spec = spec
        self.signature = _signature(spec)
        self.records: Records = records  # the working set it was built from
        self.entries: dict[bytes, dict[bytes, None]] = {}
        self.sorted: list[bytes] = []  # the distinct KeyStrings, ascending
        self.record_ids: dict[bytes, int] = {}  # document key -> its RecordId
        self.next_id = 0
        self.multikey = False
        for key, doc in records.items():
            self.change(key, None, doc, new_record=True)

    def _keys(self, doc: Mapping[str, Any]) -> list[bytes]:
        entries = index_entries(self.spec, doc)
        if len(entries) > 1 or any(isinstance(v, list) for _, kv in entries for v in kv.values()):
            self.multikey = True
        elif not self.multikey and _has_array(doc, next(iter(self.spec["key"])).split(".")):
            self.multikey = True
        return [k for k, _ in entries]

    def change(self, key: bytes, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
               new_record: bool) -> None:
        """Document `key` went from `old` to `new` (None: absent); `new_record`: it takes a
        new RecordId (an insert), else keeps its own."""
        if old is not None:
            for k in self._keys(old):
                bucket = self.entries.get(k)
                if bucket is not None:
                    bucket.pop(key, None)
                    if not bucket:
                        del self.entries[k]
                        del self.sorted[bisect.bisect_left(self.sorted, k)]
        if new is None:
            self.record_ids.pop(key, None)
            return
        if new_record or key not in self.record_ids:
            self.record_ids[key] = self.next_id
            self.next_id += 1
        for k in self._keys(new):
            bucket = self.entries.get(k)
            if bucket is None:
                bucket = self.entries[k] = {}
                bisect.insort(self.sorted, k)
            bucket[key] = None

    def fresh(self, spec: Mapping[str, Any], records: Records) -> bool:
        return (self.records is records and self.signature == _signature(spec)
                and len(self.record_ids) == len(records))

    def scan(self, intervals: list[Interval], reverse: bool) -> tuple[list[bytes], int]:
        """The document keys in the intervals (index order, each once) and the keys examined."""
        out: dict[bytes, None] = {}
        examined = 0
        for interval in reversed(intervals) if reverse else intervals:
            if interval.low == interval.high and interval.low_in and interval.high_in:
                keys = [interval.low] if interval.low in self.entries else []
            else:
                lo = (bisect.bisect_left if interval.low_in else bisect.bisect_right)(
                    self.sorted, interval.low)
                hi = (bisect.bisect_right if interval.high_in else bisect.bisect_left)(
                    self.sorted, interval.high)
                keys = self.sorted[lo:hi]
                if reverse:
                    keys.reverse()
            ids = self.record_ids
            for k in keys:
                bucket = self.entries[k]
                examined += len(bucket)
                for doc_key in sorted(bucket, key=ids.__getitem__):
                    out[doc_key] = None
        return list(out), examined


def _has_array(value: Any, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if isinstance(value, list):
            return True
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
        if i == len(parts) - 1:
            return isinstance(value, list)
    return False


def _signature(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    return (spec.get("name"), tuple(dict(spec.get("key", {})).items()), bool(spec.get("sparse")))


def change(c: Collection, key: bytes, old: Mapping[str, Any] | None,
           new: Mapping[str, Any] | None, new_record: bool) -> None:
    """Keep `c`'s built tables in step with one document write to its working set."""
    for name, table in list(c.secondary.items()):
        try:
            table.change(key, old, new, new_record)
        except Exception:  # noqa: BLE001 - a value the table cannot key: rebuilt when read
            del c.secondary[name]


@dataclass
class Interval:
    low: bytes
    low_in: bool
    high: bytes
    high_in: bool
    low_text: str  # the ends as explain's indexBounds show them
    high_text: str
    shown_low_in: bool  # the brackets shown (a type bracket's own ends are mongod's)
    shown_high_in: bool

    def text(self, reverse: bool) -> str:
        if reverse:  # a descending index: from the greatest end
            return (f"{'[' if self.shown_high_in else '('}{self.high_text}, {self.low_text}"
                    f"{']' if self.shown_low_in else ')'}")
        return (f"{'[' if self.shown_low_in else '('}{self.low_text}, {self.high_text}"
                f"{']' if self.shown_high_in else ')'}")


def _points(values: list[Any]) -> list[Interval]:
    by_key = sorted({_key(v): v for v in values}.items())
    return [Interval(k, True, k, True, _shown(v), _shown(v), True, True) for k, v in by_key]


@dataclass
class IndexPlan:
    """A find's index scan: which documents it reads, and what explain says of it."""

    spec: Mapping[str, Any]
    path: str
    intervals: list[Interval]
    reverse: bool  # a descending index: keys read from the greatest
    multikey: bool
    doc_keys: list[bytes] = field(default_factory=list)
    keys_examined: int = 0
    residual: dict[str, Any] = field(default_factory=dict)  # the FETCH stage's filter

    def documents(self, records: Records) -> Iterator[dict[str, Any]]:
        for k in self.doc_keys:
            doc = records.get(k)
            if doc is not None:
                yield doc

    def bounds(self) -> list[str]:
        ordered = reversed(self.intervals) if self.reverse else self.intervals
        return [i.text(self.reverse) for i in ordered]

    def winning_plan(self) -> dict[str, Any]:
        key = dict(self.spec["key"])
        scan = {"stage": "IXSCAN", "keyPattern": key, "indexName": self.spec["name"],
                "isMultiKey": self.multikey,
                "multiKeyPaths": {self.path: [self.path] if self.multikey else []},
                "isUnique": bool(self.spec.get("unique")),
                "isSparse": bool(self.spec.get("sparse")), "isPartial": False,
                "indexVersion": 2, "direction": "forward",
                "indexBounds": {self.path: self.bounds()}}
        fetch: dict[str, Any] = {"stage": "FETCH"}
        if self.residual:
            fetch["filter"] = self.residual
        fetch["inputStage"] = scan
        return fetch


# -- planning ----------------------------------------------------------------------------------


def _predicates(filter_doc: Mapping[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """(operator, operand) of each field's predicates ANDed at the top of the filter."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for path, value in filter_doc.items():
        if path == "$and" and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    for p, preds in _predicates(clause).items():
                        out.setdefault(p, []).extend(preds)
            continue
        if not isinstance(path, str) or path.startswith("$"):
            continue
        if isinstance(value, Mapping) and value and all(
                isinstance(k, str) and k.startswith("$") for k in value):
            out.setdefault(path, []).extend(value.items())
        elif not isinstance(value, Mapping):
            out.setdefault(path, []).append(("$eq", value))
    return out


def _shown(value: Any) -> str:
    """A bound as mongod's explain prints it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf.0" if value > 0 else "-inf.0"
        return f"{int(value)}.0" if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, (int, Int64)):
        return str(int(value))
    if isinstance(value, Decimal128):
        return f"{value}"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        ms = (aware - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(
            milliseconds=1)
        return f"new Date({ms})"
    return str(value)


_BRACKET_EDGES = {
    _NUMBERS: ("-inf.0", "inf.0"),
    _STRINGS: ('""', "{}"),
    _OIDS: ("ObjectId('000000000000000000000000')", "ObjectId('ffffffffffffffffffffffff')"),
    _DATES: ("new Date(-9223372036854775808)", "new Date(9223372036854775807)"),
}


def _intervals(preds: list[tuple[str, Any]], multikey: bool) -> list[Interval] | None:
    """The index intervals of one field's predicates (None: none the planner bounds). On a
    multikey index the bounds of two range predicates are not intersected (each may hold
    for another element of an array): the first one's alone, as mongod's planner does."""
    for op, v in preds:
        if op == "$eq" and _point(v):
            return _points([v])
    for op, v in preds:
        if op == "$in" and isinstance(v, list) and v and all(_point(x) for x in v):
            return _points(v)
    ranges = [(op, v) for op, v in preds if op in _RANGE_OPS]
    if not ranges:
        return None
    if multikey:
        ranges = ranges[:1]
    brackets = {_bracket(v) for _, v in ranges}
    if len(brackets) != 1 or None in brackets:
        return None
    (bracket,) = brackets
    assert bracket is not None
    low_edge, high_edge = _BRACKET_EDGES[bracket]
    # the bracket's own ends as mongod shows them: closed, but for the next type's first
    # value ({} after the strings)
    found = Interval(bracket[0], True, bracket[1], False, low_edge, high_edge, True,
                     bracket is not _STRINGS)
    for op, v in ranges:
        k = _key(v)
        if op in ("$gt", "$gte"):
            inclusive = op == "$gte"
            if k > found.low or (k == found.low and not inclusive):
                found.low, found.low_in, found.low_text = k, inclusive, _shown(v)
                found.shown_low_in = inclusive
        else:
            inclusive = op == "$lte"
            if k < found.high or (k == found.high and not inclusive):
                found.high, found.high_in, found.high_text = k, inclusive, _shown(v)
                found.shown_high_in = inclusive
    if found.low > found.high:
        return None
    return [found]


def usable(spec: Mapping[str, Any]) -> str | None:
    """The field of an index the planner reads (None: it does not)."""
    key = spec.get("key")
    if not isinstance(key, Mapping) or len(key) != 1:
        return None
    ((path, direction),) = key.items()
    if isinstance(direction, str) or spec.get("hidden") or "partialFilterExpression" in spec:
        return None
    if spec.get("collation") or any(part.isdigit() for part in path.split(".")):
        return None
    return str(path)


def table_for(c: Collection, spec: Mapping[str, Any], records: Records) -> IndexTable | None:
    table: IndexTable | None = c.secondary.get(spec["name"])
    if table is not None and table.fresh(spec, records):
        return table
    try:
        table = IndexTable(spec, records)
    except Exception:  # noqa: BLE001 - a value it cannot key: this index is not read
        c.secondary.pop(spec["name"], None)
        return None
    c.secondary[spec["name"]] = table
    return table


def plan(c: Collection, records: Records, filter_doc: Mapping[str, Any] | None
         ) -> IndexPlan | None:
    """The index scan a find with `filter_doc` reads (None: a collection scan)."""
    if not filter_doc:
        return None
    preds = _predicates(filter_doc)
    best: IndexPlan | None = None
    for spec in c.indexes[1:]:
        path = usable(spec)
        if path is None or path not in preds:
            continue
        if _intervals(preds[path], False) is None:
            continue
        table = table_for(c, spec, records)
        if table is None:
            continue
        intervals = _intervals(preds[path], table.multikey)
        assert intervals is not None
        reverse = float(next(iter(spec["key"].values()))) < 0
        doc_keys, examined = table.scan(intervals, reverse)
        if best is None or examined < best.keys_examined:
            best = IndexPlan(spec, path, intervals, reverse, table.multikey, doc_keys,
                             examined, _residual(filter_doc, path, table.multikey))
    return best


def _residual(filter_doc: Mapping[str, Any], path: str, multikey: bool) -> dict[str, Any]:
    """The filter less the indexed field's predicate where the bounds say all of it."""
    value = filter_doc.get(path)
    covered = not isinstance(value, Mapping) or bool(value) and (
        (all(k in _RANGE_OPS for k in value) and (len(value) == 1 or not multikey))
        or (len(value) == 1 and next(iter(value)) in _BOUND_OPS))
    rest = [_parsed(k, v) for k, v in filter_doc.items() if not (k == path and covered)]
    if len(rest) <= 1:
        return rest[0] if rest else {}
    return {"$and": rest}


def _parsed(path: str, value: Any) -> dict[str, Any]:
    """One predicate as explain serializes it (`{a: 1}` is `{a: {$eq: 1}}`)."""
    if path.startswith("$") or (isinstance(value, Mapping) and value and all(
            isinstance(k, str) and k.startswith("$") for k in value)):
        return {path: value}
    return {path: {"$eq": value}}
