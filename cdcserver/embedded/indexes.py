"""The embedded store's indexes: index specs, index keys, and unique checks.

Index specs live on each collection (`Collection.indexes`); a unique index also keeps a table
of its keys (KeyString bytes -> document key) against which every write is checked, inside a
transaction as the transaction sees it. Builds are logged as mongod 8.0 logs them (one
`createIndexes` on an empty collection, else `startIndexBuild` + `commitIndexBuild`). A mixin
of `Store` (`store.py`).
"""

from __future__ import annotations

import math
import uuid as uuid_module
from collections.abc import Mapping, Sequence
from itertools import product
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.regex import Regex

from cdcserver.embedded import engine
from cdcserver.embedded.catalog import bson_string
from cdcserver.embedded.modifiers import is_number
from cdcserver.embedded.sessions import TxnBlocked
from cdcserver.embedded.store_types import ErrorWithFields
from pipeline_stages import bson_bytes, keystring
from pipeline_stages.dotted_path import has_document_path
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection, Txn
else:
    StoreState = object  # a base for the type checker only (state.py)


class DuplicateKeyError(ErrorWithFields):
    """11000, with the `keyPattern` / `keyValue` fields mongod adds to the error."""

    def __init__(
        self, ns: str, index: str, pattern: dict[str, Any], key_value: dict[str, Any]
    ) -> None:
        # buildDupKeyErrorStatus: a key string that is not UTF-8 is quoted as "0x<hex>", so
        # that a driver may take the message as UTF-8 (keyValue keeps the bytes); a long one is
        # cut at 150 bytes by BSONObj::toString, and may end inside a character.
        shown = {k: "0x" + bson_bytes.utf8(v).hex()
                 if isinstance(v, str) and not bson_bytes.is_utf8(v) else v
                 for k, v in key_value.items()}
        super().__init__(
            11000,
            f"E11000 duplicate key error collection: {ns} index: {index} dup key: "
            f"{bson_string(shown)}",
        )
        self.key_pattern = pattern
        self.key_value = key_value

    def extra(self) -> dict[str, Any]:
        return {"keyPattern": self.key_pattern, "keyValue": self.key_value}


def _path_values(value: Any, parts: Sequence[str]) -> list[Any]:
    """The values an index key path reaches (arrays expand to their elements)."""
    if not parts:
        if isinstance(value, list):
            return list(value) if value else [None]
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        if head not in value:
            return [None]
        return _path_values(value[head], rest)
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            return _path_values(value[int(head)], rest)
        out: list[Any] = []
        for element in value:
            out.extend(_path_values(element, parts) if isinstance(element, Mapping) else [None])
        return out or [None]
    return [None]


def index_entries(
    spec: Mapping[str, Any], doc: Mapping[str, Any]
) -> list[tuple[bytes, dict[str, Any]]]:
    """(key bytes, {field: value}) of each index key `doc` produces in the index `spec`."""
    fields = list(spec["key"])
    if spec.get("sparse") and all(
        _path_values(doc, f.split(".")) == [None] and not has_document_path(doc, f) for f in fields
    ):
        return []
    pfe = spec.get("partialFilterExpression")
    if pfe is not None and not engine.matches(pfe, doc):
        return []
    per_field = [_path_values(doc, f.split(".")) for f in fields]
    out = []
    seen: set[bytes] = set()
    for combo in product(*per_field):
        key = keystring.encode_values(combo)[0]
        if key not in seen:
            seen.add(key)
            out.append((key, dict(zip(fields, combo))))
    return out


# -- spec checks (IndexCatalogImpl::prepareSpecForCreate) ----------------------------------------

_PARTIAL_FILTER_MAX_DEPTH = 4  # internalPartialFilterExpressionMaxDepth


class _Node:
    """A node of a partial filter as MatchExpressionParser builds it, enough to tell which
    nodes a partial index takes and to print the first it refuses as `debugString()` does."""

    def __init__(self, kind: str, text: str = "", children: list[_Node] | None = None) -> None:
        self.kind = kind  # "$and" / "$or" / "$nor" / "$not" / "ok" (a leaf it takes) / "refused"
        self.text = text  # a leaf's line (may hold its own indented lines)
        self.children = children or []

    def debug_string(self, level: int = 0) -> str:
        pad = "    " * level
        if self.kind in ("ok", "refused"):  # a leaf's further lines are indented from its own
            return "".join(pad + line + "\n" for line in self.text.split("\n"))
        return pad + self.kind + "\n" + "".join(c.debug_string(level + 1) for c in self.children)


def _true_value(value: Any) -> bool:
    """BSONElement::trueValue: false for false, null, missing and numeric zero."""
    if value is None or value is False:
        return False
    if is_number(value):
        return _as_double(value) != 0
    return True


def _rhs(value: Any) -> str:
    return bson_string(value)


def _partial_tree(filter_doc: Mapping[str, Any]) -> _Node:
    """The match expression tree of a (parsed, valid) filter; one child is the node itself."""
    children: list[_Node] = []
    for path, value in filter_doc.items():
        if path in ("$and", "$or", "$nor") and isinstance(value, list):
            children.append(_Node(path, children=[
                _partial_tree(c) for c in value if isinstance(c, Mapping)]))
        elif path == "$comment":
            continue
        elif path.startswith("$"):
            children.append(_Node("refused", path))
        elif isinstance(value, Mapping) and value and next(iter(value)).startswith("$"):
            children.extend(_operator_nodes(path, value))
        elif isinstance(value, Regex):
            children.append(_Node("refused", f"{path} regex /{value.pattern}/"
                                  f"{_regex_flags(value)}"))
        else:
            children.append(_Node("ok", f"{path} $eq {_rhs(value)}"))
    return children[0] if len(children) == 1 else _Node("$and", children=children)


def _regex_flags(value: Regex[Any]) -> str:
    return bson_string(value).rsplit("/", 1)[1]


def _operator_nodes(path: str, ops: Mapping[str, Any]) -> list[_Node]:
    out: list[_Node] = []
    if "$regex" in ops:
        pattern = ops["$regex"]
        flags = ops.get("$options", "")
        if isinstance(pattern, Regex):
            flags = flags or _regex_flags(pattern)
            pattern = pattern.pattern
        out.append(_Node("refused", f"{path} regex /{pattern}/{flags}"))
    for op, arg in ops.items():
        if op in ("$regex", "$options"):
            continue
        if op in ("$eq", "$lt", "$lte", "$gt", "$gte", "$in", "$type", "$geoWithin",
                  "$geoIntersects", "$within"):
            out.append(_Node("ok", f"{path} {op} {_rhs(arg)}"))
        elif op == "$all" and isinstance(arg, list) and not any(
                isinstance(a, Mapping) and "$elemMatch" in a for a in arg):
            out.extend(_Node("ok", f"{path} $eq {_rhs(a)}") for a in arg)
        elif op == "$exists":
            leaf = _Node("ok", f"{path} exists")
            out.append(leaf if _true_value(arg) else _Node("$not", children=[leaf]))
        elif op == "$ne":
            out.append(_Node("$not", children=[_Node("ok", f"{path} $eq {_rhs(arg)}")]))
        elif op == "$nin" and isinstance(arg, list):
            out.append(_Node("$not", children=[_Node("ok", f"{path} $in {_in_list(arg)}")]))
        elif op == "$not":
            inner = (_operator_nodes(path, arg) if isinstance(arg, Mapping) else
                     [_Node("refused", f"{path} regex /{arg.pattern}/{_regex_flags(arg)}")]
                     if isinstance(arg, Regex) else [])
            child = _Node("$and", children=inner) if isinstance(arg, Mapping) else inner[0]
            out.append(_Node("$not", children=[child]))
        elif op == "$size":
            out.append(_Node("refused", f"{path} $size : {_rhs(arg)}"))
        elif op == "$mod" and isinstance(arg, list) and len(arg) == 2:
            out.append(_Node("refused", f"{path} mod {_rhs(int(arg[0]))} % x == "
                                        f"{_rhs(int(arg[1]))}"))
        elif op == "$elemMatch" and isinstance(arg, Mapping):
            out.append(_Node("refused", _elem_match_text(path, arg)))
        elif op in ("$bitsAllSet", "$bitsAllClear", "$bitsAnySet", "$bitsAnyClear"):
            out.append(_Node("refused", f"{path} {op}: [{', '.join(map(str, _bits(arg)))}]"))
        else:
            out.append(_Node("refused", f"{path} {op} {_rhs(arg)}"))
    return out


def _in_list(values: list[Any]) -> str:
    return "[ " + ", ".join(_rhs(v) for v in values) + "]"


def _bits(arg: Any) -> list[int]:
    if isinstance(arg, list):
        return [int(a) for a in arg]
    if isinstance(arg, bytes):
        return [8 * i + b for i, byte in enumerate(arg) for b in range(8) if byte >> b & 1]
    if is_number(arg):
        mask = int(arg.to_decimal() if isinstance(arg, Decimal128) else arg)
        return [b for b in range(64) if mask >> b & 1]
    return []


def _elem_match_text(path: str, arg: Mapping[str, Any]) -> str:
    if arg and next(iter(arg)).startswith("$") and next(iter(arg)) not in (
            "$and", "$or", "$nor", "$expr", "$where", "$text", "$comment"):
        inner = "".join(f"\n     {op} {_rhs(v)}" for op, v in arg.items())  # (no path)
        return f"{path} $elemMatch (value){inner}"
    return f"{path} $elemMatch (obj)\n{_partial_tree(arg).debug_string(1).rstrip(chr(10))}"


def _first_refused(node: _Node, level: int = 0) -> str | None:
    """IndexCatalogImpl's _checkValidFilterExpressions: the reason `node` cannot be a
    partial filter, else None."""
    if level + 1 > _PARTIAL_FILTER_MAX_DEPTH:
        return f"partialFilterExpression depth may not exceed {_PARTIAL_FILTER_MAX_DEPTH}"
    if node.kind in ("$and", "$or"):
        for child in node.children:
            reason = _first_refused(child, level + 1)
            if reason is not None:
                return reason
        return None
    if node.kind == "ok":
        return None
    return "Expression not supported in partial index: " + node.debug_string()


def _spec_as_given(spec: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec as createIndexes hands it to the catalog: the client's fields in their order
    and `v` added last (index_key_validate::validateIndexSpec)."""
    if given is not None:
        shown = dict(given)
    else:  # rebuilt from the stored form (drivers send key and name first)
        shown = {"key": spec["key"], "name": spec["name"]}
        shown.update((k, v) for k, v in spec.items() if k not in ("v", "key", "name"))
    shown.setdefault("v", spec.get("v", 2))
    return shown


def check_index_spec(spec: Mapping[str, Any], given: Mapping[str, Any] | None = None) -> None:
    """The checks mongod makes of a new index's spec as its catalog prepares it (errors
    prefixed `Error in specification <spec> :: caused by ::`), then those of its access
    method (a 2d index's bounds, unprefixed). `given`: the spec as the client sent it."""
    pfe = spec.get("partialFilterExpression")
    if isinstance(pfe, Mapping):
        reason = None
        if _true_value(spec.get("sparse")):
            reason = 'cannot mix "partialFilterExpression" and "sparse" options'
        else:
            try:
                reason = _first_refused(_partial_tree(pfe))
            except (TypeError, ValueError, IndexError, AttributeError, OverflowError):
                reason = None  # a malformed operand: the match parser's own error stands
        if reason is not None:
            raise MongoError(67, f"Error in specification "
                             f"{bson_string(_spec_as_given(spec, given))} :: caused by :: "
                             f"{reason}")
    geo_2d_params(spec)


def _g(value: float) -> str:
    """A double as mongod's str::stream writes one (printf's %g)."""
    return f"{value:g}"


def _as_double(value: Any) -> float:
    return float(value.to_decimal()) if isinstance(value, Decimal128) else float(value)


def geo_2d_params(spec: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """A 2d index's location field and [min, max] bounds (index2d::parse2dParams and
    GeoHashConverter::createFromDoc, 72 InvalidOptions for bad ones); None for other
    indexes."""
    key = spec.get("key", {})
    if "2d" not in key.values():
        return None
    geo = ""
    others = 0
    for field, kind in key.items():
        if kind == "2d":
            if geo:
                raise MongoError(16800, "can't have 2 geo fields")
            if others:
                raise MongoError(16801, "2d has to be first in index")
            geo = field
        else:
            others += 1
    bits, low, high = spec.get("bits", 26), spec.get("min", -180.0), spec.get("max", 180.0)
    if not all(is_number(v) for v in (bits, low, high)):
        return geo, -180.0, 180.0  # index_key_validate refuses these before (TypeMismatch)
    bits_n, low_f, high_f = int(_as_double(bits)), _as_double(low), _as_double(high)
    if bits_n < 1 or bits_n > 32:
        raise MongoError(72, f"bits for hash must be > 0 and <= 32, but {bits_n} bits were "
                         "specified")
    if not low_f < high_f or math.isinf(low_f) or math.isinf(high_f):
        raise MongoError(72, f"region for hash must be valid and have positive area, but "
                         f"[{_g(low_f)}, {_g(high_f)}] was specified")
    return geo, low_f, high_f


def _geo_elements(value: Any, parts: Sequence[str]) -> list[Any]:
    """The values along a 2d index's path, a trailing array kept whole (mongod's
    extractAllElementsAlongPath without expanding the last field)."""
    if not parts:
        return [value]
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        return _geo_elements(value[head], rest) if head in value else []
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            return _geo_elements(value[int(head)], rest)
        out: list[Any] = []
        for element in value:
            if isinstance(element, Mapping):
                out.extend(_geo_elements(element, parts))
        return out
    return []


def check_2d_keys(spec: Mapping[str, Any], doc: Mapping[str, Any]) -> None:
    """The errors mongod's 2d key generator (index2d::get2DKeys, GeoHashConverter::hash)
    raises for `doc`'s locations: 13068, 13026, 16804, and 13027 for a point outside the
    index's [min, max]."""
    params = geo_2d_params(spec)
    if params is None:
        return
    geo, low, high = params
    for element in _geo_elements(doc, geo.split(".")):
        if not isinstance(element, (Mapping, list)):
            continue
        values = list(element.values()) if isinstance(element, Mapping) else element
        if not values:
            continue
        if is_number(values[0]):
            _check_point(values, doc, low, high)
            continue
        for location in values:
            if not isinstance(location, (Mapping, list)):
                raise MongoError(16804, "location object expected, location array not in "
                                 "correct format")
            coords = list(location.values()) if isinstance(location, Mapping) else location
            if coords:
                _check_point(coords, doc, low, high)


def _check_point(coords: list[Any], doc: Mapping[str, Any], low: float, high: float) -> None:
    source = bson_string(doc)
    if len(coords) < 2:
        raise MongoError(13068, f"geo field only has 1 element :: caused by :: {source}")
    x, y = coords[0], coords[1]
    if not (is_number(x) and is_number(y)):
        raise MongoError(13026, "geo values must be 'legacy coordinate pairs' for 2d indexes "
                         f":: caused by :: {source}")
    if not all(low <= _as_double(v) <= high for v in (x, y)):
        raise MongoError(13027, f"point not in interval of [ {_g(low)}, {_g(high)} ] :: "
                         f"caused by :: {source}")


class IndexMixin(StoreState):
    """Index builds and drops, and the unique checks of every write."""

    def _rebuild_unique(self, c: Collection) -> None:
        c.unique = {}
        c.secondary.clear()  # documents loaded or put back whole: tables rebuilt when read
        for spec in c.indexes[1:]:
            if spec.get("unique"):
                self._build_unique(c, spec)

    def _build_unique(self, c: Collection, spec: dict[str, Any]) -> None:
        table: dict[bytes, bytes] = {}
        for key, doc in self.documents(c).items():
            for entry_key, key_value in index_entries(spec, doc):
                if entry_key in table and table[entry_key] != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
                table[entry_key] = key
        c.unique[spec["name"]] = table

    def _add_index(self, c: Collection, spec: dict[str, Any], empty: bool) -> None:
        if spec.get("unique"):
            self._build_unique(c, spec)
        c.indexes.append(spec)
        self._save_meta(c)
        if empty:
            self.append_oplog("c", f"{c.db}.$cmd", {"createIndexes": c.name, **spec}, ui=c.ui)

    def create_indexes(self, c: Collection, specs: list[dict[str, Any]]) -> None:
        """Add new (already validated) index specs: one `createIndexes` entry each on an empty
        collection, else a two-phase build (`startIndexBuild` + `commitIndexBuild`)."""
        for spec in specs:
            check_index_spec(spec)
        if not self.documents(c):
            for spec in specs:
                self._add_index(c, spec, empty=True)
            return
        for spec in specs:
            if geo_2d_params(spec) is not None:
                for doc in self.documents(c).values():
                    try:
                        check_2d_keys(spec, doc)
                    except MongoError as exc:
                        raise MongoError(
                            exc.code,
                            f"Index build failed: {uuid_module.uuid4()}: Collection {c.ns} "
                            f"( {uuid_module.UUID(bytes=c.uuid)} ) :: caused by :: "
                            f"{exc.errmsg}",
                        ) from None
            if spec.get("unique"):
                try:
                    self._build_unique(c, spec)
                except DuplicateKeyError as exc:
                    c.unique.pop(spec["name"], None)
                    for other in specs:
                        c.unique.pop(other["name"], None) if other is not spec else None
                    raise MongoError(
                        11000,
                        f"Index build failed: {uuid_module.uuid4()}: Collection {c.ns} "
                        f"( {uuid_module.UUID(bytes=c.uuid)} ) :: caused by :: {exc.errmsg}",
                    ) from None
        build = Binary(uuid_module.uuid4().bytes, 4)
        self.append_oplog("c", f"{c.db}.$cmd",
                          {"startIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs},
                          ui=c.ui)
        c.indexes.extend(specs)
        self._save_meta(c)
        self.append_oplog("c", f"{c.db}.$cmd",
                          {"commitIndexBuild": c.name, "indexBuildUUID": build, "indexes": specs},
                          ui=c.ui)

    def drop_index(self, c: Collection, name: str) -> None:
        spec = c.index(name)
        assert spec is not None
        c.indexes.remove(spec)
        c.unique.pop(name, None)
        self._save_meta(c)
        self.append_oplog("c", f"{c.db}.$cmd", {"dropIndexes": c.name, "index": name}, ui=c.ui,
                          o2=spec)

    # -- unique checks ----------------------------------------------------------------------------

    def _check_unique(
        self, c: Collection, key: bytes, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """Raise DuplicateKey if `new` (replacing `old`) collides; returns the index edits."""
        txn = self._txn()
        if txn is not None:
            for spec in c.indexes[1:]:
                check_2d_keys(spec, new)
            self._check_unique_in_txn(txn, c, key, new)
            return []
        edits = []
        for spec in c.indexes[1:]:  # each index's keys in turn, as mongod inserts them
            check_2d_keys(spec, new)
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            old_keys = [k for k, _ in index_entries(spec, old)] if old is not None else []
            new_entries = index_entries(spec, new)
            for k, key_value in new_entries:
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner.state == "in progress":
                    raise TxnBlocked(owner)
                holder = table.get(k)
                if holder is not None and holder != key:
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)
            edits.append((table, old_keys, [k for k, _ in new_entries]))
        return edits

    def _check_unique_in_txn(
        self, txn: Txn, c: Collection, key: bytes, new: Mapping[str, Any]
    ) -> None:
        """Unique indexes as the transaction sees them: committed keys it has not changed, and
        its own documents' keys. A key another open transaction holds, or one committed after
        its snapshot, is a write conflict (as WiredTiger reports it to mongod)."""
        entries = txn.overlay.get(c.uuid, {})
        for spec in c.indexes[1:]:
            table = c.unique.get(spec["name"])
            if table is None:
                continue
            for k, key_value in index_entries(spec, new):
                owner = self._index_owners.get((c.uuid, spec["name"], k))
                if owner is not None and owner is not txn and owner.state == "in progress":
                    self._write_conflict(txn)
                holders = {table[k]} if k in table else set()
                holders.update(
                    other for other, (doc, _) in entries.items()
                    if doc is not None and any(e == k for e, _ in index_entries(spec, doc))
                )
                holders.discard(key)
                for holder in holders:
                    if holder in entries:
                        doc = entries[holder][0]
                        if doc is None or all(e != k for e, _ in index_entries(spec, doc)):
                            continue  # the transaction changed or deleted that document
                    elif self._last_write.get((c.uuid, holder), -1) > txn.snapshot:
                        self._write_conflict(txn)
                    raise DuplicateKeyError(c.ns, spec["name"], dict(spec["key"]), key_value)

    def _index_edits(
        self, c: Collection, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        """The unique index edits of replacing `old` by `new` (either may be None), unchecked."""
        return [
            (c.unique[s["name"]],
             [k for k, _ in index_entries(s, old)] if old is not None else [],
             [k for k, _ in index_entries(s, new)] if new is not None else [])
            for s in c.indexes[1:] if s["name"] in c.unique
        ]

    @staticmethod
    def _apply_edits(
        edits: list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]], key: bytes
    ) -> None:
        for table, old_keys, new_keys in edits:
            for k in old_keys:
                if table.get(k) == key:
                    del table[k]
            for k in new_keys:
                table[k] = key
