"""The query engine: query matching, update operators and aggregation, behind one adapter.

The one module of the project that imports **mongomock** (pinned to one exact version in
pyproject.toml: this module reaches into its internals). Everything that evaluates a filter,
an aggregation expression, a pipeline stage or an update operator with mongomock's semantics
goes through the functions here: the change-stream user stages (`user_stages.py`) and the
embedded store's engine (`cdcserver/embedded/engine.py`, which layers the project's own
semantics on top, replacing mongomock's piece by piece). Pure and synchronous: mongomock
evaluates in memory.

Documents are never stored here: callers pass plain dicts they own. An aggregation that reads
other collections (`$lookup`, `$graphLookup`) gets a `Database` whose collections the caller
resolves by name when the stage runs.

mongomock lacks a BSON order for a few types; `_install_mongomock_types` adds Timestamp,
MinKey/MaxKey and Code to its type-order table, fills its `$type` table (entries mongomock
leaves unimplemented) and makes its comparison expressions take a missing operand as mongod
does. That is installed once, on the first use of this module's functions (never at import).
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from pipeline_stages import expressions
from pipeline_stages.errors import MongoError
from pipeline_stages.regex import compile_filter
from pipeline_stages.transform import MISSING

__all__ = [
    "Database",
    "apply_update",
    "copy_document",
    "evaluate",
    "filter_applies",
    "filter_function",
    "match_filter",
    "normalize",
    "ordered_filter",
    "process_pipeline",
    "project",
    "set_stage_handler",
    "upsert_seed",
]

# -- mongomock type tables ----------------------------------------------------------------------

_INSTALLED = False
# mongomock and its dependencies are a tenth of the server's start-up: imported on the engine's
# first use (`_load`), so a server answers its first ping without them.
mongomock: Any = None
_mm_aggregate: Any = None
_mm_collection: Any = None
_mm_filtering: Any = None
_mm_helpers: Any = None


def _load() -> None:
    global mongomock, _mm_aggregate, _mm_collection, _mm_filtering, _mm_helpers
    import mongomock as mm
    from mongomock import aggregate, collection, filtering, helpers

    mongomock, _mm_aggregate, _mm_collection = mm, aggregate, collection
    _mm_filtering, _mm_helpers = filtering, helpers


def _install_mongomock_types() -> None:
    """Teach mongomock the BSON order of Timestamp, MinKey, MaxKey and Code, and the `$type`
    aliases it leaves unimplemented. Idempotent; other types keep mongomock's behaviour."""
    global _INSTALLED
    if _INSTALLED:
        return
    _load()
    original: Callable[[Any], int] = _mm_filtering._get_compare_type

    def compare_type(val: Any) -> int:
        # Canonical BSON order (bsontypes.h canonicalizeBSONType): MinKey < null < numbers <
        # string < object < array < binData < objectId < bool < date < timestamp < regex <
        # code < MaxKey.
        if isinstance(val, MinKey):
            return 1
        if isinstance(val, MaxKey):
            return 127
        if isinstance(val, Timestamp):
            return 47
        if isinstance(val, Code):
            return 60
        return original(val)

    _mm_filtering._get_compare_type = compare_type

    def is_int(v: Any) -> bool:
        return type(v) is int and -(2**31) <= v < 2**31

    def is_long(v: Any) -> bool:
        return isinstance(v, Int64) or (type(v) is int and not is_int(v))

    def is_number(v: Any) -> bool:
        return isinstance(v, (int, float, decimal.Decimal, Decimal128)) and not isinstance(v, bool)

    predicates: dict[tuple[str, int], Callable[[Any], bool]] = {
        ("double", 1): lambda v: isinstance(v, float),
        ("string", 2): lambda v: isinstance(v, str) and not isinstance(v, Code),
        ("object", 3): lambda v: isinstance(v, dict),
        ("array", 4): lambda v: isinstance(v, list),
        ("binData", 5): lambda v: isinstance(v, bytes),
        ("objectId", 7): lambda v: isinstance(v, ObjectId),
        ("bool", 8): lambda v: isinstance(v, bool),
        ("date", 9): lambda v: isinstance(v, (DatetimeMS, datetime.datetime)),
        ("null", 10): lambda v: v is None,
        ("regex", 11): lambda v: isinstance(v, (Regex, re.Pattern)),
        ("javascript", 13): lambda v: isinstance(v, Code),
        ("int", 16): is_int,
        ("timestamp", 17): lambda v: isinstance(v, Timestamp),
        ("long", 18): is_long,
        ("decimal", 19): lambda v: isinstance(v, (decimal.Decimal, Decimal128)),
        ("minKey", -1): lambda v: isinstance(v, MinKey),
        ("maxKey", 127): lambda v: isinstance(v, MaxKey),
    }
    type_map: dict[Any, Any] = _mm_filtering.TYPE_MAP  # aliases and type numbers
    for (alias, number), predicate in predicates.items():
        type_map[alias] = predicate
        type_map[number] = predicate
    type_map["number"] = is_number
    _install_missing_comparison()
    _install_scalar_path_missing()
    _install_match_operators()
    _install_ordered_group()
    expressions.install(_mm_aggregate._Parser)  # $getField/$setField/$unsetField, 16410
    _mm_aggregate._GROUPING_OPERATOR_MAP["$sum"] = group_sum
    _INSTALLED = True
    _install_stage_handlers()


def group_sum(values: Any) -> Any:
    """`$sum` in `$group` typed as mongod's AccumulatorSum: the widest numeric type met (int,
    then long, then double, then decimal), an int past 32 bits a long and a long past 64 bits
    a double; non-numbers (booleans too) are skipped. mongomock's gives a plain int (an int32
    when small) for longs and counts booleans."""
    total: Any = 0
    widest = 0  # 0 int, 1 long, 2 double, 3 decimal
    for v in values:
        if isinstance(v, bool):
            continue
        if isinstance(v, Decimal128):
            widest, v = 3, v.to_decimal()
        elif isinstance(v, decimal.Decimal):
            widest = 3
        elif isinstance(v, float):
            widest = max(widest, 2)
        elif isinstance(v, Int64):
            widest = max(widest, 1)
        elif not isinstance(v, int):
            continue
        if widest == 3 and not isinstance(total, decimal.Decimal):
            total = decimal.Decimal(repr(total)) if isinstance(total, float) else \
                decimal.Decimal(total)
        total = total + (decimal.Decimal(repr(v)) if widest == 3 and isinstance(v, float)
                         else v)
    if widest == 3:
        return Decimal128(total)
    if widest == 2 or not -(2**63) <= total < 2**63:
        return float(total)
    if widest == 1 or not -(2**31) <= total < 2**31:
        return Int64(total)
    return int(total)


def _install_match_operators() -> None:
    """`$mod` (mongomock: "unknown operator"), `$type` with an array of types (a TypeError),
    a compiled `$where`,
    and `$lte: null` / `$gte: null` matching a missing field as `$eq: null` does (mongod's
    ComparisonMatchExpression with a null operand; mongomock: missing compares with nothing)."""
    missing: Any = vars(_mm_filtering)["NOTHING"]
    operators: dict[str, Any] = _mm_filtering._filterer_inst._operator_map

    def with_null(original: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
        return lambda dv, sv: (sv is None and dv is missing) or original(dv, sv)

    operators["$lte"] = with_null(operators["$lte"])
    operators["$gte"] = with_null(operators["$gte"])
    # A top-level `$where` arrives compiled into a predicate of the document (the embedded
    # store's JavaScript, cdcserver/embedded/javascript.py); mongomock's logical operators are
    # the hook it consults before its "not implemented" for $where.
    _mm_filtering.LOGICAL_OPERATOR_MAP["$where"] = lambda doc, predicate, _apply: predicate(doc)

    def mod(dv: Any, sv: Any) -> bool:
        divisor, remainder = (_truncated(v) for v in sv)
        for name, bound in (("divisor", divisor), ("remainder", remainder)):
            if bound is None:
                raise MongoError(2, f"malformed mod, {name} value is invalid :: caused by :: "
                                 "Unable to coerce NaN/Inf to integral type")
        assert divisor is not None and remainder is not None
        if divisor == 0:
            raise MongoError(2, "divisor cannot be 0")
        value = _truncated(dv) if _is_number(dv) else None
        if value is None:
            return False
        rest = abs(value) % abs(divisor)  # C++'s %: the sign of the dividend
        return (rest if value >= 0 else -rest) == remainder

    def mod_any(dv: Any, sv: Any) -> bool:  # an array matches by any of its elements
        if isinstance(dv, list):
            return any(mod(v, sv) for v in dv)
        return mod(dv, sv)

    operators["$mod"] = mod_any

    type_of: Callable[[Any, Any], bool] = operators["$type"]

    def type_any(dv: Any, sv: Any) -> bool:  # `$type: [9, "string"]`: any of them
        if isinstance(sv, list):
            return any(type_of(dv, t) for t in sv)
        return type_of(dv, sv)

    operators["$type"] = type_any
    operators["$all"] = _all_op
    # apply() calls its own `_all_op` for a top-level `$all` (an instance attribute wins)
    inst: Any = _mm_filtering._filterer_inst
    inst._all_op = _all_op


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128, decimal.Decimal)) and not isinstance(v, bool)


def _truncated(v: Any) -> int | None:
    """A number as mongod's coerceToLong takes it (toward zero); None for NaN / infinity."""
    if isinstance(v, Decimal128):
        v = v.to_decimal()
    try:
        return int(v)
    except (ValueError, OverflowError, TypeError):
        return None


def _install_scalar_path_missing() -> None:
    """A dotted path through a scalar or null (`a.b` on `{a: 5}`, `{a: "x"}`, `{a: null}`) is
    missing there, as in mongod: `{"a.b": null}` and `{$exists: false}` match, `{$ne: null}`
    does not. mongomock found no candidate at all, so null matched nothing and `$ne` everything
    (the oplog_rewrite jstests' `{"operationType.subField": {$eq: null}}`)."""
    original: Callable[[str, Any], Any] = _mm_filtering.iter_key_candidates
    missing: Any = vars(_mm_filtering)["NOTHING"]

    def iter_key_candidates(key: str, doc: Any) -> Any:
        if key and doc is not missing and not isinstance(doc, (dict, list)):
            return [missing]
        return original(key, doc)

    _mm_filtering.iter_key_candidates = iter_key_candidates


def _install_missing_comparison() -> None:
    """mongod's ExpressionCompare ($eq $ne $gt $gte $lt $lte $cmp) compares a missing operand as
    a value: equal to missing (and undefined), below every other value but MinKey
    (canonicalizeBSONType gives it 0). mongomock's parser raises KeyError on it instead."""
    parser: Any = _mm_aggregate._Parser
    original: Callable[[Any, str, Any], Any] = parser._handle_comparison_operator

    def handle_comparison(self: Any, operator_name: str, values: Any) -> Any:
        if not isinstance(values, list) or len(values) != 2:
            return original(self, operator_name, values)
        operands = []
        for value in values:
            try:
                operands.append(self.parse(value))
            except KeyError:
                operands.append(MISSING)
        a, b = operands
        if a is not MISSING and b is not MISSING:
            if operator_name in ("$eq", "$ne") and _has_document(a, b):
                # mongod compares documents field by field in order ({a, b} != {b, a});
                # mongomock's == on dicts ignores the order
                equal = _ordered_equal(a, b, lambda x, y: bool(original(
                    self, "$eq", [{"$literal": x}, {"$literal": y}])))
                return equal if operator_name == "$eq" else not equal
            return original(self, operator_name, [{"$literal": a}, {"$literal": b}])

        def rank(v: Any) -> int:
            return -1 if isinstance(v, MinKey) else 0 if v is MISSING else 1

        cmp = (rank(a) > rank(b)) - (rank(a) < rank(b))
        if operator_name == "$cmp":
            return cmp
        if operator_name == "$eq":
            return cmp == 0
        if operator_name == "$ne":
            return cmp != 0
        return _mm_filtering.SORTING_OPERATOR_MAP[operator_name](cmp, 0)

    parser._handle_comparison_operator = handle_comparison


# -- BSON equality of documents: field by field, in order ------------------------------------


def _leaf_equal(a: Any, b: Any) -> bool:
    """Scalars as BSON compares them: a boolean is never equal to a number."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


class _OrderedDoc(OrderedDict):  # type: ignore[type-arg]
    """A document operand of a query's equality (`{a: {x: 1, y: 2}}`, `$eq`, `$in`...): equal
    only to a document with the same fields in the same order (mongod compares BSON objects
    field by field), where Python's dict equality ignores the order. A subclass of both dict
    and OrderedDict (the documents decoded from BSON), so Python asks its `__eq__` first
    whichever the other side is: OrderedDict's own ignores the order against a plain dict,
    as an expression-built one (`$addFields: {b: {y: ..., x: ...}}`) is."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # (unhashable, as a dict)

    def __eq__(self, other: object) -> bool:
        return _ordered_equal(self, other, _leaf_equal)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


class _OrderedList(list):  # type: ignore[type-arg]
    """An array operand of a query's equality: element by element, documents in order."""

    __slots__ = ()
    __hash__ = None

    def __eq__(self, other: object) -> bool:
        return _ordered_equal(self, other, _leaf_equal)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


def _ordered_value(value: Any) -> Any:
    if isinstance(value, (_OrderedDoc, _OrderedList)):
        return value
    if isinstance(value, Mapping):
        return _OrderedDoc(value)
    if isinstance(value, list):
        return _OrderedList(value)
    return value


def _is_operators(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(
        isinstance(k, str) and k.startswith("$") for k in value)


def _ordered_condition(value: Any) -> Any:
    if not _is_operators(value):
        return _ordered_value(value)
    out: dict[str, Any] = {}
    for op, arg in value.items():
        if op in ("$eq", "$ne"):
            out[op] = _ordered_value(arg)
        elif op in ("$in", "$nin", "$all") and isinstance(arg, list):
            out[op] = [_regex_operand(v) if op == "$all" else _ordered_value(v) for v in arg]
        elif op == "$not" and _is_operators(arg):
            out[op] = _ordered_condition(arg)
        elif op == "$elemMatch" and isinstance(arg, Mapping):
            out[op] = _ordered_condition(arg) if _is_operators(arg) and not any(
                k in ("$and", "$or", "$nor", "$expr", "$where") for k in arg
            ) else ordered_filter(arg)
        else:
            out[op] = arg
    return out


def _regex_operand(value: Any) -> Any:
    """An `$all` element: a regex compiled as `$regex` operands are, anything else ordered."""
    if isinstance(value, (Regex, re.Pattern)):
        from pipeline_stages.regex import as_match_regex

        return as_match_regex(value)
    if isinstance(value, Mapping) and "$elemMatch" in value:
        return value
    return _ordered_value(value)


def ordered_filter(filter_doc: Mapping[str, Any]) -> dict[str, Any]:
    """A (compiled) filter whose equality operands compare documents field by field in order,
    as mongod's BSON comparison does, also inside arrays, `$in`, `$ne`, `$nin`, `$all` and
    `$elemMatch` (mongomock compares them as Python dicts, ignoring the order)."""
    out: dict[str, Any] = {}
    for key, value in filter_doc.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [ordered_filter(c) if isinstance(c, Mapping) else c for c in value]
        elif key.startswith("$"):
            out[key] = value
        else:
            out[key] = _ordered_condition(value)
    return out


def names_where(filter_doc: Mapping[str, Any]) -> bool:
    """Whether `filter_doc` has a `$where` (top level or in `$and` / `$or` / `$nor`): for the
    places mongod's parser refuses one, a `$match` stage among them."""
    for key, value in filter_doc.items():
        if key == "$where":
            return True
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            if any(isinstance(c, Mapping) and names_where(c) for c in value):
                return True
    return False


def check_match_stage(filter_doc: Mapping[str, Any]) -> None:
    """What a `$match` stage refuses that a query takes: `$where` (DocumentSourceMatch parses
    without MatchExpressionParser's kJavascript), in an aggregation or a change stream."""
    if names_where(filter_doc):
        raise MongoError(2, "$where is not allowed in this context")


def match_filter(filter_doc: Mapping[str, Any],
                 compile_regexes: Callable[[Mapping[str, Any]], Any] | None = None
                 ) -> dict[str, Any]:
    """The one compiled form of a query filter, for the embedded store's find and `$match` and
    for a change stream's `$match`: regexes compiled (by `compile_regexes`, the store's with
    its worker-process fallback; pipeline_stages/regex.py's by default), equality operands
    compared field by field in order (`ordered_filter`)."""
    return ordered_filter((compile_regexes or compile_filter)(filter_doc))


def _match_stage(docs: list[Any], database: Any, spec: Any,
                 engine_handler: Callable[..., Any]) -> list[Any]:
    """An aggregation's `$match` (the engine's, whose datetime patch of the filter rebuilds
    its documents as plain dicts): the patched filter ordered again."""
    if not isinstance(spec, Mapping):
        return list(engine_handler(docs, database, spec))
    compiled = ordered_filter(_mm_helpers.patch_datetime_awareness_in_document(spec))
    return [d for d in docs if _mm_filtering.filter_applies(
        compiled, _mm_helpers.patch_datetime_awareness_in_document(d))]


def _all_op(doc_val: Any, search_val: Any) -> bool:
    """`$all`: every operand matches an element (a regex one matching a string element, as
    mongod's `$all: [/re/]` is an `$and` of regexes); an empty `$all` matches nothing."""
    if not isinstance(search_val, list) or not search_val:
        return False
    if isinstance(doc_val, list) and doc_val and isinstance(doc_val[0], list):
        doc_val = [v for sub in doc_val for v in (sub if isinstance(sub, list) else [sub])]
    values = doc_val if isinstance(doc_val, (list, tuple)) else [doc_val]
    inst: Any = _mm_filtering._filterer_inst
    for operand in search_val:
        if isinstance(operand, Mapping) and "$elemMatch" in operand:
            if not inst._elem_match_op(doc_val, operand["$elemMatch"]):
                return False
        elif isinstance(operand, (Regex, re.Pattern)):
            if not _mm_filtering._regex(list(values), operand):
                return False
        elif operand not in values:
            return False
    return True


def _install_ordered_group() -> None:
    """`$group` keys compared as mongod compares values (documents field by field in order,
    1 and 1.0 alike): grouped by their KeyString, groups in the BSON order of their keys."""
    from pipeline_stages import keystring

    handlers: dict[str, Any] = _mm_aggregate._PIPELINE_HANDLERS
    original: Callable[[Any, Any, Any], Any] = handlers["$group"]
    parse: Callable[..., Any] = _mm_aggregate._parse_expression

    def group(in_collection: Any, database: Any, options: Any) -> Any:
        _id = options.get("_id") if isinstance(options, Mapping) else None
        if _id is None:  # one group (a constant such as 0 or "" is a key of its own)
            return original(in_collection, database, options)
        keyed: dict[bytes, tuple[Any, list[Any]]] = {}
        for doc in in_collection:
            try:
                key = parse(_id, doc, ignore_missing_keys=True)
            except KeyError:
                key = None
            try:
                encoded = keystring.encode_values((key,))[0]
            except Exception:  # noqa: BLE001 - a key KeyString cannot encode: mongomock's way
                return original(in_collection, database, options)
            keyed.setdefault(encoded, (key, []))[1].append(doc)
        out = []
        for encoded in sorted(keyed):
            key, docs = keyed[encoded]
            doc_dict = _mm_aggregate._accumulate_group(options, docs)
            doc_dict["_id"] = key
            out.append(doc_dict)
        return out

    handlers["$group"] = group


def _has_document(*values: Any) -> bool:
    return any(
        isinstance(v, Mapping) or (isinstance(v, list) and _has_document(*v)) for v in values
    )


def _ordered_equal(a: Any, b: Any, leaf: Callable[[Any, Any], bool]) -> bool:
    """Value equality with documents compared in field order (arrays element by element, other
    values by `leaf`)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return len(a) == len(b) and all(
            ka == kb and _ordered_equal(va, vb, leaf)
            for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_ordered_equal(x, y, leaf) for x, y in zip(a, b))
    if isinstance(a, (Mapping, list)) or isinstance(b, (Mapping, list)):
        return False
    return leaf(a, b)


# -- the adapter --------------------------------------------------------------------------------

_SCRATCH: Any = None  # a mongomock collection for its document helpers (it holds no documents)


def _scratch() -> Any:
    global _SCRATCH
    _install_mongomock_types()
    if _SCRATCH is None:
        _SCRATCH = mongomock.MongoClient()["cdcserver"]["scratch"]
    return _SCRATCH


def filter_function() -> Callable[[Any, Mapping[str, Any]], bool]:
    """`filter_applies(compiled filter, doc)`, for a caller that matches many documents."""
    _install_mongomock_types()
    return _mm_filtering.filter_applies  # type: ignore[no-any-return]


def filter_applies(compiled: Mapping[str, Any], doc: Mapping[str, Any]) -> bool:
    """Whether `doc` matches the (regex-compiled) filter."""
    _install_mongomock_types()
    return bool(_mm_filtering.filter_applies(compiled, doc))


class Database:
    """The collections an aggregation may read besides its input (`$lookup`, `$graphLookup`):
    `resolve(name)` gives a collection's documents (key -> document, in natural order) or None,
    when the stage runs (so a transaction's snapshot, entered later, is what it reads)."""

    def __init__(
        self, name: str, resolve: Callable[[str], Mapping[bytes, Any] | None] | None = None
    ) -> None:
        self.name = name
        self._resolve = resolve

    def get_collection(self, name: str) -> Any:
        # A throwaway mongomock collection over the caller's documents: read only (mongomock's
        # reads copy what they return).
        client: Any = mongomock.MongoClient()
        collection = client[self.name][name]
        docs = self._resolve(name) if self._resolve is not None else None
        if docs is not None:
            client._store[self.name][name]._documents = docs
        return collection

    def __getitem__(self, name: str) -> Any:
        return self.get_collection(name)

    def documents(self, name: str) -> list[Any]:
        """Collection `name`'s documents in natural order (shared: copy before changing)."""
        docs = self._resolve(name) if self._resolve is not None else None
        return list(docs.values()) if docs is not None else []


_STAGE_HANDLERS: dict[str, Callable[[list[Any], Any, Any], list[Any]]] = {}


def set_stage_handler(
    name: str, handler: Callable[[list[Any], Any, Any, Callable[..., Any]], list[Any]]
) -> None:
    """Run stage `name` with `handler(docs, database, spec, engine_handler)` instead of the
    engine's own (which the handler may call for the forms it leaves to it). Installed on the
    engine's first use; idempotent per name."""
    def run(docs: list[Any], database: Any, spec: Any) -> list[Any]:
        return handler(docs, database, spec, _ENGINE_HANDLERS[name])

    _STAGE_HANDLERS[name] = run
    if _INSTALLED:
        _install_stage_handlers()


_ENGINE_HANDLERS: dict[str, Any] = {}


set_stage_handler("$match", _match_stage)


def _install_stage_handlers() -> None:
    handlers: dict[str, Any] = _mm_aggregate._PIPELINE_HANDLERS
    for name, run in _STAGE_HANDLERS.items():
        _ENGINE_HANDLERS.setdefault(name, handlers.get(name))
        handlers[name] = run


def process_pipeline(docs: list[Any], database: Database | None, pipeline: list[Any]) -> list[Any]:
    """The documents out of an aggregation pipeline (mongomock's stages)."""
    _install_mongomock_types()
    return list(_mm_aggregate.process_pipeline(docs, database, pipeline, None))


def evaluate(expression: Any, doc: Mapping[str, Any], user_vars: dict[str, Any] | None) -> Any:
    """An aggregation expression on `doc`; raises KeyError when a path it reads is missing."""
    _install_mongomock_types()
    return _mm_aggregate._Parser(doc, user_vars, ignore_missing_keys=False).parse(expression)


def normalize(doc: Any) -> Any:
    """A document as the engine holds it (UTC-naive datetimes at millisecond precision)."""
    if not _INSTALLED:
        _install_mongomock_types()
    return _mm_helpers.patch_datetime_awareness_in_document(doc)


def copy_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy whose nested documents and arrays are copied, scalar values shared."""
    if not _INSTALLED:
        _install_mongomock_types()
    return _mm_collection._copy_field(doc, dict)  # type: ignore[no-any-return]


def project(doc: Mapping[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """`doc` with a find projection applied."""
    return _scratch()._copy_only_fields(doc, fields, dict)  # type: ignore[no-any-return]


def apply_update(
    doc: dict[str, Any], query: Mapping[str, Any], update: Mapping[str, Any], is_insert: bool
) -> None:
    """Apply one update operator document to `doc`, in place."""
    _scratch()._apply_update_document(doc, query, update, is_insert)


def upsert_seed(query: Mapping[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the query's equality fields (mongomock's rule)."""
    scratch = _scratch()
    seed = scratch._expand_dots(dict(query))
    seed, _ = scratch._discard_operators(seed)
    return dict(seed or {})
