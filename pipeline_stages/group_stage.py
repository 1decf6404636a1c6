"""`$group` and `$bucketAuto` as mongod 8.0 runs them (document_source_group_base.cpp,
group_processor_base.cpp, accumulation_statement.cpp, accumulator_*.cpp,
document_source_bucket_auto.cpp, granularity_rounder_*.cpp).

`$group`: its spec parsed in mongod's order with mongod's errors (15947, 15948, 15955, 17390,
the accumulator statement's 40234-40238 and 15952), documents grouped by their key as mongod
compares values (1, 1.0, NumberLong(1) and NumberDecimal("1") one group, the first key kept;
documents field by field in order; a composite `_id` keeps a missing field missing, a one-field
one makes it null), each output document `_id` first, then the accumulators in spec order, a
missing result as null. The accumulators are `accumulators.py`'s; an N accumulator's `n` is
evaluated once per group on the group key (when a document). Expressions (the key, each
accumulator's argument) are evaluated by the engine's expression parser (query_engine's, with
the project's patches); a missing path evaluates to MISSING.

Groups come out in the BSON order of their keys (mongod's order is its hash table's, which no
client may rely on; a stable one is kinder to tests).

`$bucketAuto`: documents sorted by their groupBy value, about count / buckets per bucket, equal
values never split; with a granularity, boundaries on the preferred-number series or powers of
two (decimal and infinite values not supported).

Pure and synchronous; registered on the engine with `query_engine.set_stage_handler`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from pipeline_stages import accumulators, query_engine
from pipeline_stages.accumulators import MISSING, Accumulator, value_key
from pipeline_stages.errors import MongoError
from pipeline_stages.keystring import encode_values
from pipeline_stages.value_string import type_name, value_string

__all__ = ["bucket_auto_stage", "compile_expression", "group_stage", "parse_group"]

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


# ---------------------------------------------------------------------------------------------
# $bucketAuto


def _parse_bucket_auto(spec: Any) -> tuple[Evaluator, int, list[Statement], Any]:
    if not isinstance(spec, Mapping):
        raise MongoError(
            40240, f"The argument to $bucketAuto must be an object, but found type: "
            f"{type_name(spec)}",
        )
    group_by: Evaluator | None = None
    buckets: int | None = None
    statements: list[Statement] = []
    granularity: Any = None
    for name, arg in spec.items():
        if name == "groupBy":
            if isinstance(arg, Mapping) and arg and str(next(iter(arg))).startswith("$"):
                group_by = compile_expression(dict(arg))
            elif isinstance(arg, str) and len(arg) > 1 and arg.startswith("$"):
                group_by = compile_expression(arg)
            else:
                raise MongoError(
                    40239, "The $bucketAuto 'groupBy' field must be defined as a $-prefixed "
                    f"path or an expression object, but found: {_element_value(arg)}",
                )
        elif name == "buckets":
            number = accumulators.numeric(arg)
            if number is None:
                raise MongoError(
                    40241, "The $bucketAuto 'buckets' field must be a numeric value, but found "
                    f"type: {type_name(arg)}",
                )
            if not -(2**31) <= number < 2**31 or number != int(number):
                raise MongoError(  # the double as a C++ stream prints it (%g)
                    40242, "The $bucketAuto 'buckets' field must be representable as a 32-bit "
                    f"integer, but found {float(number):g}",
                )
            buckets = int(number)
        elif name == "output":
            if not isinstance(arg, Mapping):
                raise MongoError(
                    40244, "The $bucketAuto 'output' field must be an object, but found type: "
                    f"{type_name(arg)}",
                )
            for field, value in arg.items():
                statement = parse_statement(field, value)
                if statement.initializer is not None and not _constant(value):
                    raise MongoError(4544714, "Can't refer to the group key in $bucketAuto")
                statements.append(statement)
        elif name == "granularity":
            if not isinstance(arg, str):
                raise MongoError(
                    40261, "The $bucketAuto 'granularity' field must be a string, but found "
                    f"type: {type_name(arg)}",
                )
            if arg not in _ROUNDERS:
                raise MongoError(40257, f"Unknown rounding granularity '{arg}'")
            granularity = arg
        else:
            raise MongoError(40245, f"Unrecognized option to $bucketAuto: {name}")
    if group_by is None or buckets is None:
        raise MongoError(40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified")
    if buckets <= 0:
        raise MongoError(
            40243, f"The $bucketAuto 'buckets' field must be greater than 0, but found: {buckets}"
        )
    if not statements:
        statements = [parse_statement("count", {"$sum": 1})]
    return group_by, buckets, statements, granularity


def _constant(spec: Mapping[str, Any]) -> bool:
    """Whether an N accumulator's `n` is a constant (it cannot read a group key here)."""
    (arg,) = spec.values()
    n = arg.get("n") if isinstance(arg, Mapping) else None
    return not _reads_path(n)


def _reads_path(expr: Any) -> bool:
    if isinstance(expr, str):
        return expr.startswith("$")
    if isinstance(expr, Mapping):
        if "$literal" in expr:
            return False
        return any(_reads_path(v) for v in expr.values())
    if isinstance(expr, list):
        return any(_reads_path(v) for v in expr)
    return False


def _element_value(value: Any) -> str:
    """BSONElement::toString(false, false): the value alone, as the shell prints it."""
    return value_string(value)


def bucket_auto_stage(
    docs: list[Any], database: Any, spec: Any, engine_bucket_auto: Any = None
) -> list[Any]:
    """The `$bucketAuto` stage: documents sorted by their groupBy value (missing is null),
    about `count / buckets` (rounded) per bucket, a run of equal values never split, the last
    bucket taking what remains; `_id: {min, max}`, max the next bucket's min (the last's own
    max). With a granularity the boundaries are its preferred numbers: the first min rounded
    down, each max rounded up (values below it join the bucket), the next min that max."""
    group_by, buckets, statements, granularity = _parse_bucket_auto(spec)
    rounder = None if granularity is None else _ROUNDERS[granularity]
    keyed = []
    for position, doc in enumerate(docs):
        key = group_by(doc)
        if rounder is not None:
            _check_granular(key)
        if key is MISSING:
            key = None
        keyed.append((encode_values((key,))[0], position, key, doc))
    keyed.sort(key=lambda e: (e[0], e[1]))
    total = len(keyed)
    size = max(1, _round_half_away(total / buckets)) if total else 1
    out: list[dict[str, Any]] = []
    i = 0
    args = [s.argument for s in statements]
    previous_max: list[Any] = []
    while i < total and len(out) < buckets:
        last_bucket = len(out) == buckets - 1
        accs = [s.factory(None if s.initializer is None else s.initializer({}))
                for s in statements]
        end = total if last_bucket else min(total, i + size)
        if rounder is None:
            while end < total and keyed[end][0] == keyed[end - 1][0]:
                end += 1  # equal values stay in one bucket
            low = keyed[i][2]
            high = keyed[end][2] if end < total else keyed[end - 1][2]
        else:
            low = previous_max[0] if previous_max else rounder(keyed[i][2], False)
            boundary = rounder(keyed[end - 1][2], True)
            while end < total and (boundary > keyed[end][2] or keyed[end][0] == keyed[end - 1][0]):
                end += 1  # values below the rounded boundary join this bucket
            if float(boundary) == 0.0 and end < total:
                high = rounder(keyed[end][2], False)
            else:
                high = boundary
            previous_max[:] = [high]
        for _, _, _, doc in keyed[i:end]:
            for acc, arg in zip(accs, args):
                if acc.needs_input:
                    acc.process(arg(doc))
        out.append(_output({"min": low, "max": high}, accs, statements))
        i = end
    return out


def _round_half_away(x: float) -> int:
    """std::round."""
    return int(x + 0.5) if x >= 0 else -int(-x + 0.5)


# -- granularity (granularity_rounder_preferred_numbers.cpp, granularity_rounder_powers_of_two.cpp)


def _check_granular(key: Any) -> None:
    """DocumentSourceBucketAuto::extractKey's checks with a granularity."""
    number = accumulators.numeric(key)
    if number is None:
        raise MongoError(
            40258, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
            f"found a value with type: {'missing' if key is MISSING else type_name(key)}",
        )
    if number != number:
        raise MongoError(
            40259, "$bucketAuto can specify a 'granularity' with numeric boundaries only, but "
            "found a NaN",
        )
    if number < 0:
        raise MongoError(
            40260, "$bucketAuto can specify a 'granularity' with non-negative numbers only, but "
            "found a negative number",
        )
    if type(key) is Decimal128 or number in (math.inf, -math.inf):
        raise MongoError(2, "not supported by cdcserver's embedded store: $bucketAuto "
                         "'granularity' with a decimal or an infinite value")


def _preferred(series: tuple[float, ...]) -> Callable[[Any, bool], Any]:
    """GranularityRounderPreferredNumbers on a double (its own scaling by tens, in doubles)."""
    first, last = series[0], series[-1]

    def round_number(value: Any, up: bool) -> Any:
        x = float(value)
        if x == 0.0:
            return value
        multiplier = 1.0
        if up:
            while x >= last * multiplier:
                multiplier *= 10.0
            while x < first * multiplier:
                previous_min = first * multiplier
                multiplier /= 10.0
                if x >= last * multiplier:
                    return previous_min  # between two decades: up to the previous min
            return next(s * multiplier for s in series if x < s * multiplier)
        while x <= first * multiplier:
            multiplier /= 10.0
        while x > last * multiplier:
            if multiplier == 0.0:  # below the smallest double's decade (SERVER-57091)
                return 0.0
            previous_max = last * multiplier
            multiplier *= 10.0
            if x <= first * multiplier:
                return previous_max
        index = next(k for k, s in enumerate(series) if not s * multiplier < x)
        return series[index - 1] * multiplier

    return round_number


def _power_of_two(exponent: int) -> Any:
    """ExpressionPow of the ints 2 and `exponent`: an int, a long past 32 bits, a double past
    64 (or for a negative exponent)."""
    if exponent < 0 or exponent >= 63:
        return 2.0 ** exponent
    value = 2 ** exponent
    return value if value < 2**31 else Int64(value)


def _powers_of_two(value: Any, up: bool) -> Any:
    """GranularityRounderPowersOfTwo: the next power of two above (below) the value."""
    if float(value) == 0.0:
        return value
    if type(value) is float:
        log = math.log2(value)
        return _power_of_two(int(math.floor(log) + 1.0) if up else int(math.ceil(log) - 1.0))
    n = int(value)
    bits = n.bit_length()
    if up:
        return _power_of_two(bits)
    return _power_of_two(bits - 2 if n & (n - 1) == 0 else bits - 1)


_SERIES: dict[str, tuple[float, ...]] = {
    "R5": (10, 16, 25, 40, 63),
    "R10": (100, 125, 160, 200, 250, 315, 400, 500, 630, 800),
    "R20": (100, 112, 125, 140, 160, 180, 200, 224, 250, 280, 315, 355, 400, 450, 500, 560,
            630, 710, 800, 900),
    "R40": (100, 106, 112, 118, 125, 132, 140, 150, 160, 170, 180, 190, 200, 212, 224, 236,
            250, 265, 280, 300, 315, 355, 375, 400, 425, 450, 475, 500, 530, 560, 600, 630,
            670, 710, 750, 800, 850, 900, 950),
    "R80": (103, 109, 115, 122, 128, 136, 145, 155, 165, 175, 185, 195, 206, 218, 230, 243,
            258, 272, 290, 307, 325, 345, 365, 387, 412, 437, 462, 487, 515, 545, 575, 615,
            650, 690, 730, 775, 825, 875, 925, 975),
    "1-2-5": (10, 20, 50),
    "E6": (10, 15, 22, 33, 47, 68),
    "E12": (10, 12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82),
    "E24": (10, 11, 12, 13, 15, 16, 18, 20, 22, 24, 27, 30, 33, 36, 39, 43, 47, 51, 56, 62, 68,
            75, 82, 91),
    "E48": (100, 105, 110, 115, 121, 127, 133, 140, 147, 154, 162, 169, 178, 187, 196, 205, 215,
            226, 237, 249, 261, 274, 287, 301, 316, 332, 348, 365, 383, 402, 422, 442, 464, 487,
            511, 536, 562, 590, 619, 649, 681, 715, 750, 787, 825, 866, 909, 953),
    "E96": (100, 102, 105, 107, 110, 113, 115, 118, 121, 124, 127, 130, 133, 137, 140, 143, 147,
            150, 154, 158, 162, 165, 169, 174, 178, 182, 187, 191, 196, 200, 205, 210, 215, 221,
            226, 232, 237, 243, 249, 255, 261, 267, 274, 280, 287, 294, 301, 309, 316, 324, 332,
            340, 348, 357, 365, 374, 383, 392, 402, 412, 422, 432, 442, 453, 464, 475, 487, 499,
            511, 523, 536, 549, 562, 576, 590, 604, 619, 634, 649, 665, 681, 698, 715, 732, 750,
            768, 787, 806, 825, 845, 866, 887, 909, 931, 953, 976),
    "E192": (100, 101, 102, 104, 105, 106, 107, 109, 110, 111, 113, 114, 115, 117, 118, 120,
             121, 123, 124, 126, 127, 129, 130, 132, 133, 135, 137, 138, 140, 142, 143, 145,
             147, 149, 150, 152, 154, 156, 158, 160, 162, 164, 165, 167, 169, 172, 174, 176,
             178, 180, 182, 184, 187, 189, 191, 193, 196, 198, 200, 203, 205, 208, 210, 213,
             215, 218, 221, 223, 226, 229, 232, 234, 237, 240, 243, 246, 249, 252, 255, 258,
             261, 264, 267, 271, 274, 277, 280, 284, 287, 291, 294, 298, 301, 305, 309, 312,
             316, 320, 324, 328, 332, 336, 340, 344, 348, 352, 357, 361, 365, 370, 374, 379,
             383, 388, 392, 397, 402, 407, 412, 417, 422, 427, 432, 437, 442, 448, 453, 459,
             464, 470, 475, 481, 487, 493, 499, 505, 511, 517, 523, 530, 536, 542, 549, 556,
             562, 569, 576, 583, 590, 597, 604, 612, 619, 626, 634, 642, 649, 657, 665, 673,
             681, 690, 698, 706, 715, 723, 732, 741, 750, 759, 768, 777, 787, 796, 806, 816,
             825, 835, 845, 856, 866, 876, 887, 898, 909, 920, 931, 942, 953, 965, 976, 988),
}
_ROUNDERS: dict[str, Callable[[Any, bool], Any]] = {
    **{name: _preferred(tuple(float(s) for s in series)) for name, series in _SERIES.items()},
    "POWERSOF2": _powers_of_two,
}
