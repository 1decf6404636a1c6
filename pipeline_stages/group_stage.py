"""`$group` as mongod 8.0 runs it (document_source_group_base.cpp, group_processor_base.cpp,
accumulation_statement.cpp, accumulator_*.cpp).

The stage: its spec parsed in mongod's order with mongod's errors (15947, 15948, 15955, 17390,
the accumulator statement's 40234-40238 and 15952), documents grouped by their key as mongod
compares values (1, 1.0 and NumberLong(1) one group; documents field by field in order), each
output document `_id` first, then the accumulators in spec order, a missing result as null.
The accumulators are `accumulators.py`'s. Expressions (the key, each accumulator's argument)
are evaluated by the engine's expression parser (query_engine's, with the project's patches);
a path that is missing evaluates to MISSING.

Groups come out in the BSON order of their keys (mongod's order is its hash table's, which no
client may rely on; a stable one is kinder to tests).

Pure and synchronous; registered on the engine with `query_engine.set_stage_handler`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline_stages import accumulators, query_engine
from pipeline_stages.accumulators import MISSING, Accumulator, value_key
from pipeline_stages.errors import MongoError
from pipeline_stages.keystring import encode_values

__all__ = ["compile_expression", "group_stage", "parse_group"]

Evaluator = Callable[[Mapping[str, Any]], Any]


def compile_expression(expr: Any) -> Evaluator:
    """`doc -> value` (MISSING for a missing path) for an aggregation expression; plain
    top-level field paths and constants without the parser."""
    if isinstance(expr, str):
        if expr.startswith("$") and not expr.startswith("$$"):
            name = expr[1:]
            if name and "." not in name:
                return lambda doc: doc.get(name, MISSING)
    elif not isinstance(expr, (dict, list)):
        return lambda doc: expr

    def evaluate(doc: Mapping[str, Any]) -> Any:
        parser = query_engine._mm_aggregate._Parser(doc, None, ignore_missing_keys=True)
        try:
            return parser.parse(expr)
        except KeyError:
            return MISSING

    if query_engine._mm_aggregate is None:
        query_engine._install_mongomock_types()
    return evaluate


class Statement:
    """One output field: its name, the accumulator's factory and its argument."""

    __slots__ = ("argument", "factory", "field", "initializer", "name")

    def __init__(self, field: str, name: str, factory: Callable[[Any], Accumulator],
                 argument: Evaluator, initializer: Evaluator | None) -> None:
        self.field, self.name, self.factory = field, name, factory
        self.argument, self.initializer = argument, initializer


def parse_statement(field: str, spec: Any) -> Statement:
    """AccumulationStatement::parseAccumulationStatement."""
    if not (isinstance(spec, Mapping) and spec and str(next(iter(spec))).startswith("$")):
        raise MongoError(40234, f"The field '{field}' must be an accumulator object")
    if "." in field:
        raise MongoError(40235, f"The field name '{field}' cannot contain '.'")
    if field.startswith("$"):
        raise MongoError(40236, f"The field name '{field}' cannot be an operator name")
    if len(spec) != 1:
        raise MongoError(40238, f"The field '{field}' must specify one accumulator")
    (name, arg), = spec.items()
    if isinstance(arg, list):
        raise MongoError(40237, f"The {name} accumulator is a unary operator")
    parsed = accumulators.parse(name, arg)
    if parsed is None:
        raise MongoError(15952, f"unknown group operator '{name}'")
    factory, argument, initializer = parsed
    return Statement(
        field, name, factory, compile_expression(argument),
        None if initializer is None else compile_expression(initializer),
    )


class GroupSpec:
    __slots__ = ("id_fields", "id_key", "statements")

    def __init__(self, id_key: Evaluator, id_fields: list[tuple[str, Evaluator]] | None,
                 statements: list[Statement]) -> None:
        self.id_key, self.id_fields, self.statements = id_key, id_fields, statements


def parse_group(spec: Any) -> GroupSpec:
    """DocumentSourceGroup::createFromBson: the fields in order, `_id` once and required."""
    if not isinstance(spec, Mapping):
        raise MongoError(15947, "a group's fields must be specified in an object")
    id_key: Evaluator | None = None
    id_fields: list[tuple[str, Evaluator]] | None = None
    statements: list[Statement] = []
    for field, value in spec.items():
        if field == "_id":
            if id_key is not None:  # only from raw BSON with a repeated key
                raise MongoError(15948, "a group's _id may only be specified once")
            id_key, id_fields = _parse_id(value)
        else:
            statements.append(parse_statement(field, value))
    if id_key is None:
        raise MongoError(15955, "a group specification must include an _id")
    return GroupSpec(id_key, id_fields, statements)


def _parse_id(value: Any) -> tuple[Evaluator, list[tuple[str, Evaluator]] | None]:
    if isinstance(value, Mapping) and value and not str(next(iter(value))).startswith("$"):
        # An "artificial" document: grouped on its fields' values, rebuilt at the end.
        fields: list[tuple[str, Evaluator]] = []
        for name, sub in value.items():
            if isinstance(sub, (bool, int, float)) or type(sub).__name__ in (
                "Int64", "Decimal128"
            ):
                raise MongoError(17390, "$group does not support inclusion-style expressions")
            fields.append((name, compile_expression(sub)))
        return (lambda doc: MISSING), fields
    return compile_expression(value), None


def _group_key(spec: GroupSpec, doc: Mapping[str, Any]) -> Any:
    fields = spec.id_fields
    if fields is None:
        key = spec.id_key(doc)
        return None if key is MISSING else key
    if len(fields) == 1:  # one field: a missing value is null (computeId)
        name, evaluate = fields[0]
        value = evaluate(doc)
        return {name: None if value is MISSING else value}
    out = {}
    for name, evaluate in fields:  # several: a missing value stays missing
        value = evaluate(doc)
        if value is not MISSING:
            out[name] = value
    return out


def _output(key: Any, accs: list[Accumulator], statements: list[Statement],
            first: str = "_id") -> dict[str, Any]:
    out: dict[str, Any] = {first: key}
    for statement, acc in zip(statements, accs):
        value = acc.result()
        out[statement.field] = None if value is MISSING else value
    return out


def _sorted_groups(groups: dict[Any, tuple[Any, list[Accumulator]]]) -> list[tuple[Any, Any]]:
    """The groups in the BSON order of their keys."""
    entries = list(groups.values())
    if len(entries) < 2:
        return entries
    try:
        return sorted(entries, key=lambda e: encode_values((e[0],))[0])
    except Exception:  # noqa: BLE001 - a key KeyString cannot encode: first-seen order
        return entries


def group_stage(docs: list[Any], database: Any, spec: Any, engine_group: Any = None) -> list[Any]:
    """The `$group` stage over `docs` (the handler `set_stage_handler` installs)."""
    parsed = parse_group(spec)
    statements = parsed.statements
    groups: dict[Any, tuple[Any, list[Accumulator]]] = {}
    args = [s.argument for s in statements]
    for doc in docs:
        key = _group_key(parsed, doc)
        hashed = value_key(key)
        entry = groups.get(hashed)
        if entry is None:
            entry = (key, _start(statements, key))
            groups[hashed] = entry
        for acc, arg in zip(entry[1], args):
            if acc.needs_input:
                acc.process(arg(doc))
    return [_output(key, accs, statements) for key, accs in _sorted_groups(groups)]


def _start(statements: list[Statement], key: Any) -> list[Accumulator]:
    # An initializer (`n`) reads the group's key when it is a document, else an empty one.
    group_doc = key if isinstance(key, Mapping) else {}
    return [
        s.factory(None if s.initializer is None else s.initializer(group_doc))
        for s in statements
    ]
