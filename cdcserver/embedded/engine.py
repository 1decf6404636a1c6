"""Query, update and aggregation semantics: the embedded store's query engine.

The evaluation itself is the query engine's (`pipeline_stages/query_engine.py`, the one module
that imports mongomock, shared with the change-stream stages); this module is where the
project's own semantics replace mongomock's piece by piece (`modifiers.py`, `json_schema.py`,
`regex.py`, mongod's parse errors). It adapts the engine's calls to one document
at a time (so the store can write one oplog entry per document, as mongod does), rewrites the
few forms mongomock lacks into equivalent forms it has (`$[]` / `$[<id>]` paths into concrete
indexes, `$unset` / `$replaceWith` stages into their documented equivalents),
and turns mongomock's exceptions into MongoDB errors.
"""

from __future__ import annotations

import copy
import decimal
import re
from collections.abc import Callable, Mapping
from typing import Any

from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded import (
    doc_validation_error,
    javascript,
    json_schema,
    modifiers,
    oplog_update,
    regex,
)
from pipeline_stages import (
    bucket_stage,
    densify_stage,
    expressions,
    fill_stage,
    group_stage,
    keystring,
    query_engine,
    redact,
    union_with,
    window_n_functions,
    window_stage,
)
from pipeline_stages.dotted_path import (
    document_value,
    has_document_path,
    has_path_with_positions,
)
from pipeline_stages.errors import MongoError
from pipeline_stages.expressions import DOLLAR_FIELD_MESSAGE
from pipeline_stages.query_engine import Database
from pipeline_stages.regex import MatchRegex, is_linear
from pipeline_stages.spec import KNOWN_STAGES

UPDATE_OPERATORS = frozenset(
    {
        "$set", "$unset", "$inc", "$min", "$max", "$mul", "$rename", "$setOnInsert",
        "$currentDate", "$addToSet", "$pop", "$pull", "$pullAll", "$push", "$bit",
    }
)
_OWN = frozenset({"$inc", "$mul", "$bit", "$rename"})  # applied by modifiers.py
_ARRAY_OPS = frozenset({"$push", "$addToSet", "$pull", "$pullAll", "$pop"})
# Operators that create their path when it is missing (the others are no-ops then).
_CREATING = frozenset({"$set", "$setOnInsert", "$push", "$addToSet", "$currentDate", "$min",
                       "$max"})
_POSITIONAL_FILTERED = re.compile(r"^\$\[([a-z][a-zA-Z0-9]*)?\]$")


def engine_error(exc: Exception) -> MongoError:
    """A mongomock / Python exception raised while evaluating as a MongoDB error."""
    if isinstance(exc, MongoError):
        return exc
    code = getattr(exc, "code", None)
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, NotImplementedError):
        return MongoError(2, f"not supported by cdcserver's embedded store: {msg}")
    if isinstance(code, int) and code > 0:
        return MongoError(code, msg)
    if msg.startswith("Unrecognized expression '"):  # ExpressionParser's, as mongod words it
        return MongoError(168, msg)
    return MongoError(2, msg)


def normalize(doc: Any) -> Any:
    """A document as the engine holds it (UTC-naive datetimes at millisecond precision)."""
    return query_engine.normalize(doc)


def copy_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a stored document that the caller may change (nested documents and arrays
    copied, scalar values shared: they are immutable)."""
    return query_engine.copy_document(doc)


_FIELD_OPERATORS = frozenset({
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$type", "$size",
    "$all", "$elemMatch", "$regex", "$options", "$not", "$mod", "$bitsAllSet", "$bitsAllClear",
    "$bitsAnySet", "$bitsAnyClear", "$geoWithin", "$geoIntersects", "$near", "$nearSphere",
    "$maxDistance", "$minDistance", "$within", "$_internalSchemaType",
})
_TOP_LEVEL = frozenset({"$expr", "$where", "$text", "$comment", "$jsonSchema", "$alwaysTrue",
                        "$alwaysFalse", "$sampleRate"})
_TYPE_ALIASES = frozenset({
    "double", "string", "object", "array", "binData", "undefined", "objectId", "bool", "date",
    "null", "regex", "dbPointer", "javascript", "symbol", "javascriptWithScope", "int",
    "timestamp", "long", "decimal", "minKey", "maxKey", "number",
})


# Variables every expression may read (Variables::kBuiltinVarNameToId, CURRENT, and $redact's
# three, which mongod defines where $redact runs).
_BUILTIN_VARIABLES = frozenset({
    "ROOT", "CURRENT", "REMOVE", "NOW", "CLUSTER_TIME", "SEARCH_META", "USER_ROLES", "IS_MR",
    "JS_SCOPE", "DESCEND", "PRUNE", "KEEP",
})


def check_variables(expr: Any, defined: frozenset[str] = frozenset()) -> None:
    """17276 for a `$$name` that nothing defines (VariablesParseState::getVariable), as mongod
    refuses it when the expression is parsed; `let` variables are bound (`$literal`) before."""
    if isinstance(expr, str):
        if expr.startswith("$$"):
            name = expr[2:].split(".")[0]
            if name not in defined and name not in _BUILTIN_VARIABLES:
                raise MongoError(17276, f"Use of undefined variable: {name}")
        return
    if isinstance(expr, list):
        for v in expr:
            check_variables(v, defined)
        return
    if not isinstance(expr, Mapping):
        return
    if len(expr) == 1:
        (op, arg), = expr.items()
        if op == "$literal":
            return
        if isinstance(arg, Mapping) and op in ("$let", "$map", "$filter", "$reduce"):
            if op == "$let":
                names = arg.get("vars")
                inner = frozenset(names) if isinstance(names, Mapping) else frozenset()
                scoped: tuple[str, ...] = ("in",)
            elif op == "$reduce":
                inner, scoped = frozenset({"this", "value"}), ("in",)
            else:
                as_name = arg.get("as")
                inner = frozenset({as_name if isinstance(as_name, str) else "this"})
                scoped = ("in", "cond")
            for k, v in arg.items():
                check_variables(v, defined | inner if k in scoped else defined)
            return
    for v in expr.values():
        check_variables(v, defined)


def validate_filter(filter_doc: Mapping[str, Any]) -> None:
    """The parse errors mongod's MatchExpressionParser gives for the common mistakes, which
    mongomock answers with Python errors or silently (e.g. `$regex: 1` matching nothing)."""
    for key, value in filter_doc.items():
        if key == "$expr":
            check_variables(value)
        if key in ("$and", "$or", "$nor"):
            if not isinstance(value, list):
                raise MongoError(2, f"{key} must be an array")
            if not value:
                raise MongoError(2, "$and/$or/$nor must be a nonempty array")
            for clause in value:
                if not isinstance(clause, Mapping):
                    raise MongoError(2, "$or/$and/$nor entries need to be full objects")
                validate_filter(clause)
        elif key.startswith("$"):
            if key not in _TOP_LEVEL:
                raise MongoError(
                    2, f"unknown top level operator: {key}. If you have a field name that starts "
                    "with a '$' symbol, consider using $getField or $setField.",
                )
        elif isinstance(value, Mapping) and value and next(iter(value)).startswith("$"):
            _validate_operators(value)


def _validate_operators(spec: Mapping[str, Any]) -> None:
    for op, arg in spec.items():
        if op not in _FIELD_OPERATORS:
            raise MongoError(2, f"unknown operator: {op}")
        if op in ("$in", "$nin") and not isinstance(arg, list):
            raise MongoError(2, f"{op} needs an array")
        elif op == "$all" and not isinstance(arg, list):
            raise MongoError(2, "$all needs an array")
        elif op == "$size":
            if not modifiers.is_number(arg):
                raise MongoError(2, "$size needs a number")
            whole = arg.to_decimal() if isinstance(arg, Decimal128) else decimal.Decimal(arg)
            if not whole.is_finite() or whole != whole.to_integral_value():  # NaN, ±inf too
                raise MongoError(2, "$size must be a whole number")
            if whole < 0:
                raise MongoError(2, "$size may not be negative")
        elif op == "$regex" and not isinstance(arg, str) and not hasattr(arg, "pattern"):
            raise MongoError(2, "$regex has to be a string")
        elif op == "$options" and "$regex" not in spec:
            raise MongoError(2, "$options needs a $regex")
        elif op == "$elemMatch" and not isinstance(arg, Mapping):
            raise MongoError(2, "$elemMatch needs an Object")
        elif op == "$elemMatch" and query_engine.names_where(arg):
            raise MongoError(2, "$where can only be applied to the top-level document")
        elif op == "$mod":
            if not isinstance(arg, list):
                raise MongoError(2, "malformed mod, needs to be an array")
            if len(arg) < 2:
                raise MongoError(2, "malformed mod, not enough elements")
            if len(arg) > 2:
                raise MongoError(2, "malformed mod, too many elements")
        elif op == "$not":
            if isinstance(arg, Mapping):
                if not arg:
                    raise MongoError(2, "$not cannot be empty")
                _validate_operators(arg)
            elif not hasattr(arg, "pattern"):
                raise MongoError(2, "$not needs a regex or a document")
        elif op == "$type":
            for alias in arg if isinstance(arg, list) else [arg]:
                if isinstance(alias, Code):  # a str subclass, but not a BSON string
                    raise MongoError(14, "type must be represented as a number or a string")
                if isinstance(alias, str) and alias not in _TYPE_ALIASES:
                    raise MongoError(2, f"Unknown type name alias: {alias}")


# $regex operands compiled once, with the fallback that moves backtracking off the loop.
compile_filter = regex.compile_filter


# (filter object, its compiled form): one filter, many documents. Replaced as one tuple, as
# scans with backtracking regexes run in threads.
_compiled: tuple[Any, Any] = (None, None)


def _compiled_filter(filter_doc: Mapping[str, Any]) -> dict[str, Any]:
    global _compiled
    compiled: dict[str, Any]
    known, compiled = _compiled
    if known is not filter_doc:
        validate_filter(filter_doc)
        compiled = query_engine.match_filter(javascript.compile_where(filter_doc),
                                             compile_filter)
        _compiled = (filter_doc, compiled)
    return compiled


def backtracks(filter_doc: Mapping[str, Any] | None) -> bool:
    """Whether the filter holds a regex RE2 cannot run (matched by backtracking, see
    pipeline_stages/regex.py) or a `$where` (JavaScript, javascript.py): its scan then runs off
    the event loop (embedded/regex.py)."""
    if not filter_doc:
        return False

    def walk(value: Any) -> bool:
        if isinstance(value, MatchRegex):
            return not is_linear(value.matcher)
        if isinstance(value, Mapping):
            return any(walk(v) for v in value.values())
        if isinstance(value, list):
            return any(walk(v) for v in value)
        return False

    compiled = _compiled_filter(filter_doc)
    return javascript.has_where(compiled) or walk(compiled)


def matcher(filter_doc: Mapping[str, Any] | None) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate for `filter_doc`, validated and compiled once (mongod's parse errors are
    raised here, before any document)."""
    compiled = _compiled_filter(filter_doc) if filter_doc else {}
    apply = query_engine.filter_function()

    def match(doc: Mapping[str, Any]) -> bool:
        try:
            return apply(compiled, doc)
        except MongoError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine raises many kinds
            raise engine_error(exc) from None

    return match


def matches(filter_doc: Mapping[str, Any] | None, doc: Mapping[str, Any]) -> bool:
    # Validated and compiled once per filter object (a command matches one filter against many
    # documents).
    compiled = _compiled_filter(filter_doc) if filter_doc else {}
    try:
        return query_engine.filter_applies(compiled, doc)
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine raises many kinds
        raise engine_error(exc) from None


def validator_failure(
    validator: Mapping[str, Any], doc: Mapping[str, Any]
) -> tuple[bool, dict[str, Any] | None]:
    """(failed, errInfo `details`) of a collection validator on `doc`: `$jsonSchema` is
    evaluated by json_schema.py, the rest of the validator by the query engine, and the
    details are mongod's (doc_validation_error.py)."""
    schema = validator.get("$jsonSchema")
    rest = {k: v for k, v in validator.items() if k != "$jsonSchema"}
    rules = json_schema.validate(schema, doc) if isinstance(schema, Mapping) else []
    rest_ok = matches(rest, doc) if rest else True
    if not rules and rest_ok:
        return False, None
    try:
        return True, doc_validation_error.details(validator, doc, matches, _expression_result)
    except (MongoError, TypeError, ValueError, KeyError, AttributeError, IndexError):
        return True, None  # the failure stands; only its explanation could not be made


def _expression_result(expression: Any, doc: Mapping[str, Any]) -> Any:
    """What a validator's `$expr` evaluates to on `doc` (its `expressionResult`)."""
    out = run_pipeline([dict(doc)], None, [{"$project": {"_id": 0, "r": expression}}])
    return out[0].get("r") if out else None


# ---------------------------------------------------------------------------------------------
# Aggregation


def rewrite_pipeline(pipeline: list[Any]) -> list[dict[str, Any]]:
    """Stages mongomock lacks, as their documented equivalents."""
    out: list[dict[str, Any]] = []
    for stage in pipeline:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise MongoError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        (name, arg), = stage.items()
        if name == "$unset":
            fields = [arg] if isinstance(arg, str) else list(arg)
            out.append({"$project": {f: 0 for f in fields}})
        elif name == "$replaceWith":
            out.append({"$replaceRoot": {"newRoot": arg}})
        elif name == "$facet" and isinstance(arg, Mapping):
            out.append({"$facet": {k: rewrite_pipeline(v) for k, v in arg.items()}})
        elif name == "$project":
            _check_project_stage(arg)
            out.append(dict(stage))
        elif name == "$match" and isinstance(arg, Mapping):
            query_engine.check_match_stage(arg)
            # regexes: regex.py's matcher; documents compared in field order
            out.append({"$match": query_engine.match_filter(arg, compile_filter)})
        else:
            out.append(dict(stage))
    return out


def _fit_longs(value: Any) -> Any:
    """Integers past the 64-bit range as doubles: mongod's arithmetic ($sum, $add...) turns an
    overflowing long into a double, where Python's ints just grow (and would not encode)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value) if not -(2**63) <= value < 2**63 else value
    if isinstance(value, dict):
        for k, v in value.items():
            fitted = _fit_longs(v)
            if fitted is not v:  # copy only what changes (the common case copies nothing)
                value = {**value, k: fitted}
        return value
    if isinstance(value, list):
        fitted_list = [_fit_longs(v) for v in value]
        return value if all(a is b for a, b in zip(fitted_list, value)) else fitted_list
    return value


def query_database(name: str, resolve: Any = None) -> Database:
    """The collections of database `name` an aggregation may read (`$lookup`...): `resolve(coll)`
    gives their documents (key -> document), or None (none: every collection is empty)."""
    return Database(name, resolve)


# ---------------------------------------------------------------------------------------------
# Projections (projection_parser.cpp): inclusion or exclusion, never both; a find projection
# may compute fields with aggregation expressions and literals, as mongod 4.4+ does.

_FLAG_TYPES = (bool, int, float, Int64, Decimal128)


def _truthy(value: Any) -> bool:
    if isinstance(value, Decimal128):
        return bool(value.to_decimal())
    return bool(value)


class _ProjectionKind:
    __slots__ = ("computed", "type")

    def __init__(self) -> None:
        self.type: str | None = None  # "inclusion" / "exclusion"
        self.computed = False  # an expression or a literal: evaluated as $project does


def _parse_projection(spec: Mapping[str, Any], kind: _ProjectionKind, root: bool,
                      find: bool) -> None:
    """mongod's checks of a projection, in its order (31253, 31254, 31252, 31310)."""
    for name, value in spec.items():
        top_id = root and name == "_id"
        if isinstance(value, Mapping):
            first = next(iter(value), "")
            if len(value) == 1 and isinstance(first, str) and first.startswith("$"):
                if find and first in ("$slice", "$elemMatch"):
                    continue  # find-only forms: they leave the type open
                if not find and first == "$elemMatch":
                    raise MongoError(168, "Cannot use $elemMatch in this context")
                if first != "$meta":
                    if kind.type == "exclusion":
                        raise MongoError(31252, "Cannot use expression other than $meta in "
                                         "exclusion projection")
                    kind.type = "inclusion"
                    kind.computed = True
                continue
            _parse_projection(value, kind, False, find)
        elif isinstance(value, _FLAG_TYPES):
            if _truthy(value):
                if not top_id:
                    if kind.type == "exclusion":
                        raise MongoError(31253, f"Cannot do inclusion on field {name} in "
                                         "exclusion projection")
                    kind.type = "inclusion"
            elif not top_id:
                if kind.type == "inclusion":
                    raise MongoError(31254, f"Cannot do exclusion on field {name} in "
                                     "inclusion projection")
                kind.type = "exclusion"
        else:
            if kind.type == "exclusion":
                raise MongoError(31310, f"Cannot use an expression {name}: "
                                 f"{_short(value)} in an exclusion projection")
            kind.type = "inclusion"
            kind.computed = True


def _as_aggregation(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A find projection with computed fields as the `$project` that evaluates it: literals
    as `$literal` (a find projection's `{a: "x"}` is the string)."""
    out: dict[str, Any] = {}
    for name, value in spec.items():
        if isinstance(value, Mapping):
            first = next(iter(value), "")
            if len(value) == 1 and isinstance(first, str) and first.startswith("$"):
                out[name] = value
            else:
                out[name] = _as_aggregation(value)
        elif isinstance(value, _FLAG_TYPES) or (
            isinstance(value, str) and value.startswith("$")
        ) or isinstance(value, list):
            out[name] = value
        else:
            out[name] = {"$literal": value}
    return out


# projection object -> (it, its $project when it computes fields, else None); one command's
# projection is one object, so its $$NOW is bound once for all its documents
_projections: dict[int, tuple[Mapping[str, Any], dict[str, Any] | None]] = {}


def _projection_plan(fields: Mapping[str, Any]) -> dict[str, Any] | None:
    known = _projections.get(id(fields))
    if known is not None and known[0] is fields:
        return known[1]
    kind = _ProjectionKind()
    _parse_projection(fields, kind, True, True)
    plan = bind_system_variables(_as_aggregation(fields)) if kind.computed else None
    if len(_projections) >= 256:
        _projections.clear()
    _projections[id(fields)] = (fields, plan)
    return plan


def validate_projection(fields: Mapping[str, Any]) -> None:
    """A find projection's parse errors (mongod's, before any document)."""
    _projection_plan(fields)


def project(doc: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` with a find projection applied."""
    try:
        plan = _projection_plan(fields)
        if plan is not None:
            out = query_engine.process_pipeline([dict(doc)], None, [{"$project": plan}])
            return _fit_longs(out[0])  # type: ignore[no-any-return]
        return query_engine.project(doc, _dotted(fields))
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine_error(exc) from None


def _dotted(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Sub-projections as dotted paths (`{a: {b: 1}}` is `{"a.b": 1}`), which the engine's
    find projection takes."""
    out: dict[str, Any] = {}
    for name, value in spec.items():
        first = next(iter(value), "") if isinstance(value, Mapping) else ""
        if isinstance(value, Mapping) and value and not (
            isinstance(first, str) and first.startswith("$")
        ):
            out.update(_dotted(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def _check_project_stage(spec: Any) -> None:
    if isinstance(spec, Mapping):
        try:
            _parse_projection(spec, _ProjectionKind(), True, False)
        except MongoError as exc:
            raise MongoError(exc.code, f"Invalid $project :: caused by :: {exc}") from None


# ---------------------------------------------------------------------------------------------
# System variables ($$NOW, $$CLUSTER_TIME): one value for the whole command


def cluster_time() -> Any:
    """`$$CLUSTER_TIME`: the cluster time as a single-member replica set's (its clock's second)."""
    return expressions.system_variable("CLUSTER_TIME")


def _mentions_system_variable(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(("$$NOW", "$$CLUSTER_TIME"))
    if isinstance(value, Mapping):
        return any(_mentions_system_variable(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_system_variable(v) for v in value)
    return False


def bind_system_variables(stages: Any) -> Any:
    """`$$NOW` and `$$CLUSTER_TIME` in a pipeline (or a projection) as their values, taken
    once, so every document of the command sees the same (Variables::kNowId...)."""
    if not _mentions_system_variable(stages):
        return stages
    values = {"NOW": expressions.now(), "CLUSTER_TIME": cluster_time()}
    if isinstance(stages, list):
        return bind_pipeline(stages, values)
    return bind_expression(stages, values)


# ---------------------------------------------------------------------------------------------
# $lookup with `let` / `pipeline` (mongomock has only localField / foreignField)


def _lookup(docs: list[Any], database: Any, spec: Any, engine_lookup: Any) -> list[Any]:
    if not isinstance(spec, Mapping) or "pipeline" not in spec:
        return engine_lookup(docs, database, spec)  # type: ignore[no-any-return]
    pipeline = spec["pipeline"]
    if not isinstance(pipeline, list):
        raise MongoError(14, "'pipeline' option must be specified as an array")
    as_field = spec.get("as")
    if not isinstance(as_field, str):
        raise MongoError(9, "must specify 'as' field for a $lookup")
    let = spec.get("let") or {}
    if not isinstance(let, Mapping):
        raise MongoError(9, "$lookup argument 'let' must be an object, is type "
                         f"{_type_name(let)}")
    local, foreign = spec.get("localField"), spec.get("foreignField")
    source = spec.get("from")
    foreign_docs = (database.documents(source)
                    if database is not None and isinstance(source, str) else [])
    for doc in docs:
        variables: dict[str, Any] = {}
        for var, expr in let.items():
            _check_let_name(var)
            _bind_variable(variables, var, normalize(expr), doc)
        candidates = foreign_docs
        if isinstance(local, str) and isinstance(foreign, str):
            value = document_value(doc, local, None)
            condition = {foreign: {"$in": value} if isinstance(value, list) else value}
            candidates = [d for d in foreign_docs if matches(condition, d)]
        stages = bind_pipeline(pipeline, variables) if variables else pipeline
        joined = run_pipeline([copy_document(d) for d in candidates], database, stages)
        if "." in as_field:
            modifiers.set_path(doc, as_field, joined)
        else:
            doc[as_field] = joined
    return docs


query_engine.set_stage_handler("$lookup", _lookup)
query_engine.set_stage_handler("$group", group_stage.group_stage)
query_engine.set_stage_handler("$bucketAuto", group_stage.bucket_auto_stage)
query_engine.set_stage_handler("$bucket", bucket_stage.bucket_stage)
query_engine.set_stage_handler("$sortByCount", bucket_stage.sort_by_count_stage)
query_engine.set_stage_handler(
    "$unionWith", lambda d, db, s, _: union_with.union_with(d, db, s, run_pipeline))
query_engine.set_stage_handler("$redact", lambda d, db, s, _: redact.redact(d, s))
window_n_functions.install()
query_engine.set_stage_handler(
    "$setWindowFields", lambda d, db, s, _: window_stage.set_window_fields(d, s))
query_engine.set_stage_handler("$fill", lambda d, db, s, _: fill_stage.fill(d, s))
query_engine.set_stage_handler("$densify", lambda d, db, s, _: densify_stage.densify(d, s))


def run_pipeline(
    docs: list[dict[str, Any]], database: Database | None, pipeline: list[Any]
) -> list[Any]:
    try:
        out = query_engine.process_pipeline(docs, database, rewrite_pipeline(pipeline))
        return [_fit_longs(d) for d in out]
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine_error(exc) from None


# ---------------------------------------------------------------------------------------------
# Updates


def is_pipeline_update(update: Any) -> bool:
    return isinstance(update, list)


def is_replacement(update: Mapping[str, Any]) -> bool:
    return not update or not next(iter(update)).startswith("$")


def _path_key(path: str) -> tuple[tuple[int, Any], ...]:
    """mongod 5.0+ applies update paths in lexicographic order, numeric components numerically."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in path.split("."))


def validate_modifiers(update: Mapping[str, Any]) -> None:
    """The checks mongod's update parser makes before applying anything, in its order: per
    operator and field, the path, the operator's argument (the leaf node's init), then
    conflicts with the paths before it ($rename: its source, then its destination)."""
    seen: list[list[str]] = []

    def updatable(path: str) -> None:  # fieldchecker::isUpdatable
        if path == "":
            raise MongoError(56, "An empty update path is not valid.")
        if "" in path.split("."):
            raise MongoError(
                56, f"An update path '{path}' contains an empty field name, which is not allowed."
            )

    def add(path: str) -> None:
        parts = path.split(".")
        for other in seen:
            n = min(len(other), len(parts))
            if other[:n] == parts[:n]:
                at = ".".join(parts[:n])
                raise MongoError(
                    40, f"Updating the path '{path}' would create a conflict at '{at}'"
                )
        seen.append(parts)

    for op, fields in update.items():
        if op not in UPDATE_OPERATORS:
            raise MongoError(
                9,
                f"Unknown modifier: {op}. Expected a valid update modifier or pipeline-style "
                "update specified as an array",
            )
        if not isinstance(fields, Mapping):
            raise MongoError(
                9,
                f"Modifiers operate on fields but we found type "
                f"{_type_name(fields)} instead. For example: {{$mod: {{<field>: ...}}}} not "
                f"{{{op}: {_short(fields)}}}",
            )
        for path, value in fields.items():
            updatable(path)
            if op == "$rename":  # a placeholder at the source, the RenameNode at the target
                add(path)
                if isinstance(value, str):
                    updatable(value)
                modifiers.check_rename(path, value)
                add(value)
                continue
            modifiers.check_argument(op, path, value)
            add(path)


def _type_name(value: Any) -> str:
    from pipeline_stages.value_string import type_name

    return type_name(value)


def _short(value: Any) -> str:
    from pipeline_stages.value_string import value_string

    return value_string(value)


def _expand_array_filters(
    doc: Mapping[str, Any], path: str, array_filters: dict[str, Mapping[str, Any]]
) -> list[str]:
    """Concrete paths for a path with `$[]` / `$[<identifier>]` components, in `doc`."""
    parts = path.split(".")
    results: list[str] = []

    def walk(value: Any, i: int, prefix: list[str]) -> None:
        if i == len(parts):
            results.append(".".join(prefix))
            return
        part = parts[i]
        m = _POSITIONAL_FILTERED.match(part)
        if m is None:
            if isinstance(value, Mapping):
                nxt = value.get(part)
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                nxt = value[int(part)]
            else:
                nxt = None
            walk(nxt, i + 1, [*prefix, part])
            return
        if not isinstance(value, list):
            shown = ".".join(prefix)
            raise MongoError(
                2, f"The path '{shown}' must exist in the document in order to apply array "
                "updates.",
            )
        ident = m.group(1)
        for index, element in enumerate(value):
            if ident is not None:
                spec = array_filters.get(ident)
                if spec is None:
                    raise MongoError(
                        2,
                        f"No array filter found for identifier '{ident}' in path '{path}'",
                    )
                if not matches(spec, {ident: element}):
                    continue
            walk(element, i + 1, [*prefix, str(index)])

    walk(doc, 0, [])
    return results


def _parse_array_filters(array_filters: list[Any] | None) -> dict[str, Mapping[str, Any]]:
    by_ident: dict[str, Mapping[str, Any]] = {}
    for spec in array_filters or []:
        if not isinstance(spec, Mapping) or not spec:
            raise MongoError(9, "Cannot use an expression without a top-level field name in "
                             "arrayFilters")
        idents = {k.split(".")[0] for k in spec if not k.startswith("$")}
        if len(idents) != 1:
            raise MongoError(
                9, "Error parsing array filter :: caused by :: Expected a single top-level "
                "field name, found " + " and ".join(f"'{i}'" for i in sorted(idents)),
            )
        ident = idents.pop()
        if ident in by_ident:
            raise MongoError(
                9, f"Found multiple array filters with the same top-level field name {ident}"
            )
        by_ident[ident] = spec
    return by_ident


def apply_modifiers(
    doc: dict[str, Any],
    query: Mapping[str, Any],
    update: Mapping[str, Any],
    *,
    is_insert: bool,
    array_filters: list[Any] | None = None,
) -> dict[str, Any]:
    """`doc` after the modifier update (a new document; `doc` is left as it was)."""
    filters = _parse_array_filters(array_filters)
    steps: list[tuple[tuple[Any, ...], str, str, Any]] = []
    for op, fields in update.items():
        for path, value in fields.items():
            if op == "$setOnInsert" and not is_insert:
                continue
            if op == "$rename":  # RenameNode lives at the destination path
                steps.append((_path_key(value), op, path, value))
                continue
            concrete = [path]
            if "$[" in path:
                concrete = _expand_array_filters(doc, path, filters)
            for p in concrete:
                steps.append((_path_key(p), op, p, value))
    steps.sort(key=lambda s: s[0])
    new = copy.deepcopy(doc)
    try:
        for _, op, path, value in steps:
            if op == "$setOnInsert":
                op = "$set"
            if path.startswith("$") and op == "$set":
                # A top-level $-prefixed field (mongomock refuses it): set here; storage
                # validation below refuses it unless the update inserts (an upsert).
                modifiers.set_path(new, path, normalize(value))
                continue
            if op in _OWN and "$" in path.split("."):
                path = _resolve_positional(new, query, path)
            if op in ("$inc", "$mul"):
                modifiers.apply_arithmetic(new, op, path, value)
                continue
            if op == "$bit":
                modifiers.apply_bit(new, path, value)
                continue
            if op == "$rename":
                modifiers.apply_rename(new, path, value)
                continue
            if op in _ARRAY_OPS and "$" not in path.split("."):
                modifiers.check_array_target(new, op, path)
            if op == "$pop" and not has_path_with_positions(new, path):
                continue  # mongod: $pop on a missing field is a no-op (mongomock raises)
            if op in _CREATING and "$" not in path.split("."):
                modifiers.check_creatable(new, path)
            query_engine.apply_update(new, query, {op: {path: normalize(value)}}, is_insert)
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine_error(exc) from None
    if not is_insert:
        # mongod's storage validation of the paths an update modified: a top-level
        # $-prefixed field only an insert may hold (events_containing_version_literals.js).
        for _, op, path, _value in steps:
            top = path.split(".", 1)[0]
            if op != "$unset" and top.startswith("$") and top in new:
                raise MongoError(
                    52,
                    f"The dollar ($) prefixed field '{top}' in '{path}' is not allowed in the "
                    "context of an update's replacement document. Consider using an "
                    "aggregation pipeline with $replaceWith.",
                )
    return new


def _resolve_positional(doc: dict[str, Any], query: Mapping[str, Any], path: str) -> str:
    """`a.$.b` with `$` the index of the first element of `a` the query matched (as mongod
    records it while matching)."""
    parts = path.split(".")
    at = parts.index("$")
    prefix = ".".join(parts[:at])
    relevant = {k: v for k, v in query.items() if k == prefix or k.startswith(prefix + ".")}
    array = modifiers.get_path(doc, prefix)
    if relevant and isinstance(array, list):
        for index, element in enumerate(array):
            probe = copy.deepcopy(doc)
            modifiers.set_path(probe, prefix, [element])
            if matches(relevant, probe):
                return ".".join([*parts[:at], str(index), *parts[at + 1:]])
    raise MongoError(2, "The positional operator did not find the match needed from the query.")


def validate_pipeline_update(pipeline: list[Any]) -> None:
    """An update pipeline's parse errors, before any document is matched (mongod parses it
    with the command): 40324 for a stage mongod does not know, 72 for one not allowed in an
    update, 16410 for a `$`-prefixed field set."""
    check_stage_names(pipeline)
    _check_update_stages(pipeline)


def check_stage_names(pipeline: list[Any]) -> None:
    """40324 for a stage name mongod does not know."""
    for stage in pipeline:
        name = next(iter(stage), None) if isinstance(stage, Mapping) else None
        if isinstance(name, str) and name not in KNOWN_STAGES and name != oplog_update.STAGE:
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")


def _check_update_stages(pipeline: list[Any]) -> None:
    for stage in pipeline:
        name = next(iter(stage), None) if isinstance(stage, Mapping) else None
        if name not in (
            "$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith",
            oplog_update.STAGE,
        ):
            raise MongoError(
                72,
                f"{name} is not allowed to be used within an update",
            )
        if name in ("$addFields", "$set") and isinstance(stage[name], Mapping) and any(
            part.startswith("$") for field in stage[name] for part in field.split(".")
        ):
            raise MongoError(16410, DOLLAR_FIELD_MESSAGE)


def apply_pipeline_update(doc: dict[str, Any], pipeline: list[Any]) -> dict[str, Any]:
    _check_update_stages(pipeline)
    current = copy.deepcopy(doc)
    run: list[Any] = []  # consecutive stages the query engine runs
    for stage in [*pipeline, None]:
        if stage is not None and next(iter(stage)) != oplog_update.STAGE:
            run.append(stage)
            continue
        if run:
            out = run_pipeline([current], None, run)
            if len(out) != 1 or not isinstance(out[0], dict):
                raise MongoError(2, "an update pipeline must produce exactly one document")
            current, run = out[0], []
        if stage is not None:  # $_internalApplyOplogUpdate: a change event's raw delta
            current = oplog_update.apply_stage(current, stage[oplog_update.STAGE])
    return current


def upsert_seed(query: Mapping[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the query's equality fields (mongomock's rule)."""
    try:
        return query_engine.upsert_seed(query)
    except Exception as exc:  # noqa: BLE001
        raise engine_error(exc) from None


def new_object_id() -> ObjectId:
    return ObjectId()


# ---------------------------------------------------------------------------------------------
# The `let` option (find, aggregate, update, delete, findAndModify): command-level variables

# The system variables only mongod's internal clients may set in a `let`
# (Variables::kSystemVarValidators).
_SYSTEM_VARIABLES = frozenset(
    {"NOW", "CLUSTER_TIME", "JS_SCOPE", "IS_MR", "SEARCH_META", "USER_ROLES"}
)


def _check_let_name(name: str) -> None:
    """variableValidation::isValidNameForUserWrite, as Variables::seedVariablesWithLetParameters
    checks each `let` name."""
    if name in _SYSTEM_VARIABLES:
        raise MongoError(4738901, f"Attempt to set internal constant: {name}")
    reason = None
    if not name:
        reason = "empty variable names are not allowed"
    elif not ("a" <= name[0] <= "z" or ord(name[0]) >= 0x80) and name != "CURRENT":
        reason = f"'{name}' starts with an invalid character for a user variable name"
    else:
        bad = next((ch for ch in name[1:] if not (ch.isascii() and (ch.isalnum() or ch == "_"))
                    and ord(ch) < 0x80), None)
        if bad is not None:
            reason = f"'{name}' contains an invalid character for a variable name: '{bad}'"
    if reason is not None:
        raise MongoError(9, f"Invalid 'let' parameter :: caused by :: {reason}")


def _reads_document(expr: Any) -> bool:
    """Whether an expression reads the document (a field path, $$CURRENT or $$ROOT)."""
    if isinstance(expr, str):
        if expr.startswith("$$"):
            return expr[2:].split(".")[0] in ("CURRENT", "ROOT")
        return expr.startswith("$")
    if isinstance(expr, Mapping):
        if "$literal" in expr:
            return False
        return any(_reads_document(v) for v in expr.values())
    if isinstance(expr, list):
        return any(_reads_document(v) for v in expr)
    return False


def _fold_rand(expr: Any) -> Any:
    """`{$rand: {}}` as its value (mongomock has no $rand): a `let` evaluates once."""
    if isinstance(expr, Mapping):
        if len(expr) == 1 and "$rand" in expr:
            import random

            return {"$literal": random.random()}
        return {k: _fold_rand(v) for k, v in expr.items()}
    if isinstance(expr, list):
        return [_fold_rand(v) for v in expr]
    return expr


def let_variables(let: Any, command: str) -> dict[str, Any]:
    """The values of a command's `let` variables: each an expression evaluated once, before
    any document (Variables::seedVariablesWithLetParameters); a later one may use an earlier."""
    if let is None:
        return {}
    if not isinstance(let, Mapping):
        raise MongoError(14, f"BSON field '{command}.let' is the wrong type '{_type_name(let)}', "
                         "expected type 'object'")
    variables: dict[str, Any] = {}
    for name, expr in let.items():
        _check_let_name(name)
        if _reads_document(expr):
            raise MongoError(
                4890500, "Command let Expression tried to access a field, but this is not "
                "allowed becauseCommand let Expressions run before the query examines any "
                "documents.",
            )
        bound = normalize(bind_expression(_fold_rand(expr), variables))
        _bind_variable(variables, name, bound, {})
    return variables


def merge_variables(let: Mapping[str, Any] | None, doc: dict[str, Any]) -> dict[str, Any]:
    """The variables of a `$merge` whenMatched pipeline: `let`'s expressions evaluated on the
    result document `doc` (default `{new: "$$ROOT"}`)."""
    if let is None:
        return {"new": doc}
    variables: dict[str, Any] = {}
    for name, expr in let.items():
        _check_let_name(name)
        _bind_variable(variables, name, normalize(expr), doc)
    return variables


def _bind_variable(
    variables: dict[str, Any], name: str, expr: Any, doc: Mapping[str, Any]
) -> None:
    """`variables[name]` is `expr` evaluated on `doc`; an expression that evaluates to missing
    leaves the variable unset."""
    try:
        variables[name] = query_engine.evaluate(expr, doc, None)
    except KeyError:
        return
    except MongoError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise engine_error(exc) from None


def _variable_value(reference: str, variables: Mapping[str, Any]) -> tuple[bool, Any]:
    """(found, value) of `$$name[.path]` among `variables`."""
    name, _, path = reference[2:].partition(".")
    if name not in variables:
        return False, None
    value = variables[name]
    # a missing path: null, as a comparison reads it
    return True, document_value(value, path, None) if path else value


def bind_expression(expr: Any, variables: Mapping[str, Any]) -> Any:
    """An aggregation expression with each reference to a `let` variable replaced by its value
    (a `$literal`), except where an inner `$let`, `$map`, `$filter` or `$reduce` defines a
    variable of the same name."""
    if not variables:
        return expr
    if isinstance(expr, str):
        if expr.startswith("$$"):
            found, value = _variable_value(expr, variables)
            if found:
                return {"$literal": value}
        return expr
    if isinstance(expr, list):
        return [bind_expression(v, variables) for v in expr]
    if not isinstance(expr, Mapping):
        return expr
    if len(expr) == 1:
        (op, arg), = expr.items()
        if op == "$literal":
            return expr
        if isinstance(arg, Mapping) and op in ("$let", "$map", "$filter", "$reduce"):
            if op == "$let":
                names = arg.get("vars")
                inner = set(names) if isinstance(names, Mapping) else set()
                scoped: tuple[str, ...] = ("in",)
            elif op == "$reduce":
                inner, scoped = {"this", "value"}, ("in",)
            else:
                inner, scoped = {arg.get("as") or "this"}, ("in", "cond")
            rest = {k: v for k, v in variables.items() if k not in inner}
            return {op: {k: bind_expression(v, rest if k in scoped else variables)
                         for k, v in arg.items()}}
    return {k: bind_expression(v, variables) for k, v in expr.items()}


def bind_filter(filter_doc: Any, variables: Mapping[str, Any]) -> Any:
    """A query filter with the `let` variables bound in its `$expr` clauses (elsewhere `$$x`
    is a string like any other)."""
    if not variables or not isinstance(filter_doc, Mapping):
        return filter_doc
    out: dict[str, Any] = {}
    for key, value in filter_doc.items():
        if key == "$expr":
            out[key] = bind_expression(value, variables)
        elif key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [bind_filter(clause, variables) for clause in value]
        else:
            out[key] = value
    return out


def bind_pipeline(pipeline: Any, variables: Mapping[str, Any]) -> Any:
    """An aggregation pipeline with the `let` variables bound in its stages."""
    if not variables or not isinstance(pipeline, list):
        return pipeline
    out: list[Any] = []
    for stage in pipeline:
        if isinstance(stage, Mapping) and len(stage) == 1 and "$match" in stage:
            out.append({"$match": bind_filter(stage["$match"], variables)})
        else:
            out.append(bind_expression(stage, variables))
    return out


def bind_let(cmd: Mapping[str, Any]) -> Mapping[str, Any]:
    """The command with its `let` variables bound into its filters, pipelines and pipeline
    updates (find, aggregate, update, delete, findAndModify); the command itself when it has
    no `let`."""
    if cmd.get("let") is None:
        return cmd
    name = next(iter(cmd))
    variables = let_variables(cmd["let"], name)
    if not variables:
        return cmd
    out = dict(cmd)
    if name == "find":
        out["filter"] = bind_filter(cmd.get("filter"), variables)
    elif name == "aggregate":
        out["pipeline"] = bind_pipeline(cmd.get("pipeline"), variables)
    elif name in ("update", "delete"):
        key = "updates" if name == "update" else "deletes"
        statements = cmd.get(key)
        if isinstance(statements, list):
            out[key] = [_bind_statement(s, variables) for s in statements]
    elif name in ("findAndModify", "findandmodify"):
        out["query"] = bind_filter(cmd.get("query"), variables)
        if isinstance(cmd.get("update"), list):
            out["update"] = bind_pipeline(cmd["update"], variables)
    for key in ("filter", "query"):  # never add a field the command did not have
        if key in out and key not in cmd:
            del out[key]
    return out


def _bind_statement(statement: Any, variables: Mapping[str, Any]) -> Any:
    if not isinstance(statement, Mapping):
        return statement
    out = dict(statement)
    if "q" in out:
        out["q"] = bind_filter(out["q"], variables)
    if isinstance(out.get("u"), list):
        out["u"] = bind_pipeline(out["u"], variables)
    return out


# ---------------------------------------------------------------------------------------------
# The `hint` option and find's `min` / `max` (mongod's QueryPlanner::plan: a hinted index is
# scanned in its key order; min/max bound that scan)


def planner_error(ns: str, code: int, reason: str) -> MongoError:
    """A planner failure as find / count / aggregate report it."""
    return MongoError(code, f"error processing query: ns={ns} planner returned error :: "
                      f"caused by :: {reason}")


def _same_pattern(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Key patterns equal field by field in order (1 and 1.0 alike, as BSON compares them)."""
    return list(a) == list(b) and all(
        a[k] == b[k] and isinstance(a[k], str) == isinstance(b[k], str) for k in a)


def hinted_index(
    indexes: list[dict[str, Any]], hint: Any, ns: str
) -> dict[str, Any] | None:
    """The index `hint` names (by name or by key pattern); None without a hint or for a
    `$natural` one. 2 BadValue when no index answers it (QueryPlanner::plan)."""
    if hint is None or (isinstance(hint, Mapping) and not hint) or hint == "":
        return None
    if isinstance(hint, Mapping) and "$natural" in hint:
        return None
    if isinstance(hint, str):
        found = [ix for ix in indexes if ix.get("name") == hint]
    elif isinstance(hint, Mapping):
        found = [ix for ix in indexes if _same_pattern(ix.get("key", {}), hint)]
        if len(found) > 1:
            raise planner_error(ns, 27, "Hint matched multiple indexes, must hint by index "
                                f"name. Matched: {found[0].get('name')} and "
                                f"{found[1].get('name')}")
    else:
        raise MongoError(9, "hint must be either a string or nested object")
    if not found:
        raise planner_error(ns, 2, "hint provided does not correspond to an existing index")
    return found[0]


def _path_values(doc: Any, path: str) -> list[Any]:
    value = doc
    for part in path.split("."):
        if isinstance(value, list):
            value = [v.get(part) for v in value if isinstance(v, Mapping) and part in v]
            if not value:
                return [None]
            continue
        if not isinstance(value, Mapping) or part not in value:
            return [None]  # a missing field is indexed as null
        value = value[part]
    if isinstance(value, list):
        return value or [None]  # (an empty array's key is undefined; sorted with null here)
    return [value]


class _Key:
    """A document's key in an index, ordered as the index orders its keys."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[bytes, bool]]) -> None:
        self.parts = parts  # (KeyString of the value, descending)

    def compare(self, other: _Key) -> int:
        for (a, desc), (b, _) in zip(self.parts, other.parts):
            if a != b:
                return (1 if a > b else -1) * (-1 if desc else 1)
        return 0

    def __lt__(self, other: _Key) -> bool:
        return self.compare(other) < 0


def _key_of(values: list[Any], pattern: list[tuple[str, bool]]) -> _Key:
    return _Key([(keystring.encode_values((v,))[0], desc)
                 for v, (_, desc) in zip(values, pattern)])


def _direction(value: Any) -> bool:
    """Whether a key pattern's field is descending (a number below 0)."""
    return not isinstance(value, str) and isinstance(value, (int, float)) and value < 0


def in_sparse_index(index: Mapping[str, Any], doc: Mapping[str, Any]) -> bool:
    """Whether a sparse index holds `doc`: it has at least one of the key's fields (null
    counts), as indexes.index_entries keys it."""
    return any(has_document_path(doc, f) or _path_values(doc, f) != [None]
               for f in index.get("key", {}))


def index_scan(
    docs: list[dict[str, Any]], index: dict[str, Any] | None, hint: Any,
    min_doc: Mapping[str, Any] | None, max_doc: Mapping[str, Any] | None, ns: str,
) -> list[dict[str, Any]]:
    """`docs` (in natural order) as the hinted index (or `$natural: -1`) returns them, within
    find's `min` (inclusive) and `max` (exclusive) bounds, with mongod's errors for those."""
    if min_doc or max_doc:
        if min_doc and max_doc and list(min_doc) != list(max_doc):
            raise MongoError(51176, "min() and max() must have the same field names")
        if index is None:
            raise planner_error(ns, 51173, "When using min()/max() a hint of which index to "
                                "use must be provided")
        fields = list(index.get("key", {}))
        if any(bound and list(bound) != fields for bound in (min_doc, max_doc)):
            raise planner_error(ns, 51174, "The index chosen is not compatible with min/max")
    if index is None:
        if isinstance(hint, Mapping) and _direction(hint.get("$natural")):
            return docs[::-1]
        return docs
    if index.get("sparse"):  # the hinted scan reads only the documents the index holds
        docs = [d for d in docs if in_sparse_index(index, d)]
    key = index.get("key", {})
    if any(isinstance(v, str) for v in key.values()):  # hashed, text, 2d...: natural order
        return docs
    pattern = [(f, _direction(v)) for f, v in key.items()]

    def doc_key(doc: dict[str, Any]) -> _Key:
        values = []
        for path, desc in pattern:  # a multikey field: its first key in the index's order
            candidates = _path_values(doc, path)
            keyed = sorted(candidates, key=lambda v: keystring.encode_values((v,))[0])
            values.append(keyed[-1] if desc else keyed[0])
        return _key_of(values, pattern)

    keyed = sorted(((doc_key(d), d) for d in docs), key=lambda t: t[0])  # stable: ties by
    # record id, as an index orders equal keys
    low = _key_of(list(min_doc.values()), pattern) if min_doc else None
    high = _key_of(list(max_doc.values()), pattern) if max_doc else None
    if low is not None and high is not None and low.compare(high) >= 0:
        raise planner_error(ns, 51175, "The value provided for min() does not come before "
                            "the value provided for max() in the hinted index")
    return [d for k, d in keyed
            if (low is None or k.compare(low) >= 0) and (high is None or k.compare(high) < 0)]


def plan_index(
    indexes: list[dict[str, Any]], hint: Any, sort: Any, filter_doc: Mapping[str, Any] | None,
    ns: str,
) -> dict[str, Any] | None:
    """The index a find would scan, as far as returnKey shows it: the hinted one, else one
    whose key pattern gives the sort (either direction), else one whose first field the
    filter names; None for a collection scan."""
    hinted = hinted_index(indexes, hint, ns)
    if hinted is not None or hint is not None:
        return hinted
    btree = [ix for ix in indexes
             if not any(isinstance(v, str) for v in ix.get("key", {}).values())
             and not ix.get("sparse") and "partialFilterExpression" not in ix]
    if isinstance(sort, Mapping) and sort:
        wanted = [(k, _direction(v)) for k, v in sort.items()]
        for ix in btree:
            have = [(k, _direction(v)) for k, v in ix.get("key", {}).items()]
            if have[:len(wanted)] == wanted or have[:len(wanted)] == [
                    (k, not d) for k, d in wanted]:
                return ix
    fields = set(filter_doc or {})
    for ix in btree:
        if next(iter(ix.get("key", {})), None) in fields:
            return ix
    return None


def index_key(doc: Mapping[str, Any], index: dict[str, Any] | None) -> dict[str, Any]:
    """`doc`'s key in `index` as returnKey shows it (the key pattern's field names)."""
    if index is None:
        return {}
    return {path: _path_values(doc, path)[0] for path in index.get("key", {})}
