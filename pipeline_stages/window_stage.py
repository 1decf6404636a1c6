"""`$setWindowFields` (document_source_set_window_fields.cpp, window_function/*) for the
embedded store's aggregations.

mongod desugars the stage into a `$sort` by the partition key then `sortBy`, and a pass over
each partition computing the `output` fields. This module does the same: the documents are
sorted with the `$sort` rules (KeyString order, the least element of an array ascending, the
greatest descending, missing as null), cut into partitions (a missing key is the null
partition, an array key is TypeMismatch), and every window function is evaluated over its
window (`documents` offsets or `range` of the sortBy value, a unit for dates) as mongod's
executors do:

- left-unbounded windows use the accumulators ($sum keeps a long a long), the others the
  removable window functions ($sum narrows to the smallest type that holds the result);
- `$first` / `$last` / `$shift` give the value of one document (missing: no field), null
  when the window is empty;
- `$rank` / `$denseRank` / `$documentNumber`, `$locf`, `$linearFill`, `$expMovingAvg`
  (Decimal128 arithmetic, as AccumulatorExpMovingAvg), `$derivative`, `$integral`.

The spec is parsed with mongod's checks and messages, in its order. The expressions (inputs,
`partitionBy`) are evaluated by the query engine's parser, through `$project`, which gives
null for a missing operand and omits a missing result, as mongod does.

`$stdDevPop` / `$stdDevSamp` follow AccumulatorStdDev (Welford) over left-unbounded windows and
WindowFunctionStdDev (its add/remove updates, double-double sums) over the others, in the
order mongod's executors add and remove values.

Not done here (a MongoError code 2, as the engine says of what it lacks): `$meta` in sortBy,
Decimal128 inputs to `$derivative` / `$integral` / `$linearFill`, and `$percentile` / `$median`.
The `n` window functions (`$topN`, `$minN`...) and `$covariancePop` / `$covarianceSamp` are
window_n_functions.py's, installed here with `install()`.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import math
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64

from pipeline_stages import keystring, query_engine
from pipeline_stages.errors import MongoError
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import bson_obj_string, type_name, value_string

__all__ = ["evaluate_each", "install", "set_window_fields", "sort_key"]

STAGE = "$setWindowFields"

_ACCUMULATORS = frozenset({"$sum", "$avg", "$min", "$max", "$push", "$addToSet",
                           "$stdDevPop", "$stdDevSamp"})
_RANKS = frozenset({"$rank", "$denseRank", "$documentNumber"})
_OURS = _ACCUMULATORS | _RANKS | frozenset({
    "$count", "$first", "$last", "$shift", "$locf", "$linearFill", "$expMovingAvg",
    "$derivative", "$integral"})
# Window functions mongod 8.0 knows that this module leaves (parserMap's other names).
_THEIRS = frozenset({"$covariancePop", "$covarianceSamp", "$minN", "$maxN", "$firstN",
                     "$lastN", "$topN", "$bottomN", "$top", "$bottom", "$percentile",
                     "$median"})
_FUNCTIONS = _OURS | _THEIRS
# Window functions another module computes (window_n_functions.py): name -> (parse, outputs).
_INSTALLED: dict[str, tuple[Callable[[Mapping[str, Any], Any], _Function],
                            Callable[[Any, Any], list[Any]]]] = {}


def install(name: str, parse: Callable[[Mapping[str, Any], Any], _Function],
            outputs: Callable[[Any, Any], list[Any]]) -> None:
    """Window function `name` parsed by `parse(obj, sortBy)` into a `_Function` and computed by
    `outputs(function, partition)` (one value per document of the partition)."""
    _INSTALLED[name] = (parse, outputs)


_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000,
             "day": 86_400_000, "week": 604_800_000}
_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_EPOCH = datetime.datetime(1970, 1, 1)
_DECIMAL128 = create_decimal128_context()


def _fail(message: str, code: int = 9) -> MongoError:
    return MongoError(code, message)


def _unsupported(what: str) -> MongoError:
    return MongoError(2, f"not supported by cdcserver's embedded store: {what} in {STAGE}")


def _element(name: str, value: Any) -> str:
    """BSONElement::toString of `name: value`."""
    return f"{name}: {bson_obj_string(value)}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


def _is_date(v: Any) -> bool:
    return isinstance(v, datetime.datetime)


def _ms(v: datetime.datetime) -> int:
    if v.tzinfo is not None:
        v = v.astimezone(datetime.UTC).replace(tzinfo=None)
    delta = v - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _from_ms(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _integral(v: Any) -> int | None:
    """Value::integral(): a number with an exact 32-bit int value."""
    if not _is_number(v):
        return None
    d = v.to_decimal() if isinstance(v, Decimal128) else v
    if isinstance(d, float) and not math.isfinite(d):
        return None
    if isinstance(d, decimal.Decimal) and not d.is_finite():
        return None
    if d != int(d) or not -(2**31) <= int(d) < 2**31:
        return None
    return int(d)


def _has_field_path(expr: Any) -> bool:
    if isinstance(expr, str):
        return expr.startswith("$")
    if isinstance(expr, Mapping):
        return any(_has_field_path(v) for k, v in expr.items() if k != "$literal")
    if isinstance(expr, list):
        return any(_has_field_path(v) for v in expr)
    return False


def _constant(expr: Any) -> Any:
    """The value of an expression mongod's optimizer folds to a constant, or MISSING."""
    if _has_field_path(expr):
        return MISSING
    values = _evaluate_all(expr, [{}])
    return values[0]


def _key(v: Any) -> bytes:
    """The KeyString of a value: byte order is BSON order."""
    return keystring.encode_values((None if v is MISSING else v,))[0]


def _less(a: Any, b: Any) -> bool:
    """Value comparison `a < b` (numbers by value across types, NaN first)."""
    if _is_number(a) and _is_number(b):
        return _numeric(a) < _numeric(b)
    if _is_date(a) and _is_date(b):
        return _ms(a) < _ms(b)
    return _key(a) < _key(b)


def _numeric(v: Any) -> tuple[int, decimal.Decimal]:
    d = v.to_decimal() if isinstance(v, Decimal128) else decimal.Decimal(v)
    if d.is_nan():
        return (0, decimal.Decimal(0))
    return (1, d)


# -- expressions ----------------------------------------------------------------------------


def _as_project_value(expr: Any) -> Any:
    """`expr` as a `$project` value that evaluates it: a field path as it is, anything else
    inside `$let` (so a number is not an inclusion, nor an object a sub-projection)."""
    if isinstance(expr, str) and expr.startswith("$"):
        return expr
    return {"$let": {"vars": {}, "in": expr}}


def _evaluate_all(expr: Any, docs: list[Any]) -> list[Any]:
    """`expr` on each document (MISSING where mongod's result is missing)."""
    if not docs:
        return []
    stage = {"$project": {"_id": 0, "v": _as_project_value(expr)}}
    out = query_engine.process_pipeline([dict(d) for d in docs], None, [stage])
    return [row.get("v", MISSING) for row in out]


# -- sort ------------------------------------------------------------------------------------


def _values_along(value: Any, parts: list[str], out: list[Any]) -> None:
    if not parts:
        out.append(value)
        return
    head = parts[0]
    if isinstance(value, Mapping):
        if head in value:
            _values_along(value[head], parts[1:], out)
        return
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            _values_along(value[int(head)], parts[1:], out)
        for element in value:
            if isinstance(element, Mapping):
                _values_along(element, parts, out)


_NULL_KEY = _key(None)
_EMPTY_ARRAY_KEY = bytes([keystring.UNDEFINED, 4])


def _sort_key(doc: Any, path: str, descending: bool) -> bytes:
    """The `$sort` key of `doc` for one path (SortKeyGenerator)."""
    values: list[Any] = []
    _values_along(doc, path.split("."), values)
    keys: list[bytes] = []
    for value in values:
        if isinstance(value, list):
            if not value:
                keys.append(_EMPTY_ARRAY_KEY)
            keys.extend(_key(v) for v in value)
        else:
            keys.append(_key(value))
    if not keys:
        return _NULL_KEY
    return max(keys) if descending else min(keys)


# -- spec ------------------------------------------------------------------------------------


class _Bounds:
    __slots__ = ("kind", "lower", "unit", "upper")

    def __init__(self, kind: str, lower: Any, upper: Any, unit: str | None = None) -> None:
        self.kind = kind  # "documents" / "range"
        self.lower = lower  # "unbounded" / "current" / a number
        self.upper = upper
        self.unit = unit

    @property
    def removable(self) -> bool:
        return bool(self.lower != "unbounded")


_DEFAULT = _Bounds("documents", "unbounded", "unbounded")
_TO_CURRENT = _Bounds("documents", "unbounded", "current")


class _Function:
    __slots__ = ("bounds", "by", "default", "input", "name", "option", "unit")

    def __init__(self, name: str, input_expr: Any, bounds: _Bounds) -> None:
        self.name = name
        self.input = input_expr
        self.bounds = bounds
        self.option: Any = None  # $expMovingAvg's alpha (a Decimal)
        self.unit: str | None = None
        self.by = 0
        self.default: Any = None


class _Spec:
    __slots__ = ("output", "partition", "sort")

    def __init__(self) -> None:
        self.partition: Any = MISSING
        self.sort: list[tuple[str, bool]] | None = None  # (path, ascending)
        self.output: list[tuple[str, _Function]] = []


def _wrong_type(field: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '{STAGE}.{field}' is the wrong type "
                      f"'{type_name(value)}', expected type '{expected}'")


def _parse_sort(spec: Mapping[str, Any]) -> list[tuple[str, bool]]:
    out = []
    for path, direction in spec.items():
        if isinstance(direction, Mapping):
            raise _unsupported("a $meta sortBy")
        if not _is_number(direction):
            raise MongoError(15974, "Illegal key in $sort specification: "
                             + _element(path, direction))
        n = direction.to_decimal() if isinstance(direction, Decimal128) else direction
        if n not in (1, -1):
            raise MongoError(15975, "$sort key ordering must be 1 (for ascending) or -1 (for "
                             "descending)")
        out.append((path, n == 1))
    return out


def _parse(spec: Any) -> _Spec:
    if not isinstance(spec, Mapping):
        raise _fail(f"the {STAGE} stage specification must be an object, found "
                    f"{type_name(spec)}")
    parsed = _Spec()
    output: Mapping[str, Any] | None = None
    sort_spec: Mapping[str, Any] | None = None
    for field, value in spec.items():
        if field == "partitionBy":
            parsed.partition = value
        elif field == "sortBy":
            if not isinstance(value, Mapping):
                raise _wrong_type(field, value, "object")
            sort_spec = value
        elif field == "output":
            if not isinstance(value, Mapping):
                raise _wrong_type(field, value, "object")
            output = value
        else:
            raise MongoError(40415, f"BSON field '{STAGE}.{field}' is an unknown field.")
    if output is None:
        raise MongoError(40414, f"BSON field '{STAGE}.output' is missing but a required field")
    if sort_spec is not None:
        parsed.sort = _parse_sort(sort_spec)
    seen: list[list[str]] = []
    for name, value in output.items():
        parts = name.split(".")
        for other in seen:
            n = min(len(other), len(parts))
            if other[:n] == parts[:n]:
                raise MongoError(6307900, f"{STAGE} 'output' specification contains two "
                                 "conflicting paths")
        seen.append(parts)
        if not isinstance(value, Mapping):
            raise _fail(f"The field '{name}' must be an object")
        parsed.output.append((name, _parse_function(value, parsed.sort)))
    if parsed.partition is not MISSING and not _has_field_path(parsed.partition):
        if isinstance(_constant(parsed.partition), list):
            raise MongoError(14, "An expression used to partition cannot evaluate to value of "
                             "type array")
    return parsed


def _parse_function(obj: Mapping[str, Any], sort: list[tuple[str, bool]] | None) -> _Function:
    for name in obj:
        if isinstance(name, str) and name.startswith("$"):
            if name not in _FUNCTIONS:
                raise _fail(f"Unrecognized window function, {name}")
            if name in _INSTALLED:
                return _INSTALLED[name][0](obj, sort)
            if name in _THEIRS:
                raise _unsupported(f"the window function {name}")
            if name in _ACCUMULATORS:
                return _parse_accumulator(obj, sort)
            if name == "$count":
                return _parse_count(obj, sort)
            if name in ("$first", "$last"):
                return _parse_first_last(obj, sort, name)
            if name in _RANKS:
                return _parse_rank(obj, sort)
            if name == "$shift":
                return _parse_shift(obj, sort)
            if name in ("$locf", "$linearFill"):
                return _parse_fill(obj, sort)
            if name == "$expMovingAvg":
                return _parse_exp_moving_avg(obj, sort)
            return _parse_with_unit(obj, sort, name)
    first = next(iter(obj), "")
    raise _fail("Expected a $-prefixed window function" + (f", {first}" if first else ""))


def _parse_accumulator(obj: Mapping[str, Any], sort: Any) -> _Function:
    name: str | None = None
    bounds = _DEFAULT
    expr: Any = None
    for arg, value in obj.items():
        if arg == "window":
            bounds = _parse_bounds(value, sort)
        elif arg in _FUNCTIONS:
            if name is not None:
                raise _fail("Cannot specify two functions in window function spec")
            name, expr = arg, value
        else:
            raise _fail(f"Window function found an unknown argument: {arg}")
    assert name is not None
    return _Function(name, expr, bounds)


def _parse_count(obj: Mapping[str, Any], sort: Any) -> _Function:
    found = False
    bounds = _DEFAULT
    for arg, value in obj.items():
        if arg == "window":
            bounds = _parse_bounds(value, sort)
        elif arg in _FUNCTIONS:
            if found:
                raise _fail("Cannot specify multiple functions in window function spec")
            if not isinstance(value, Mapping) or value:
                raise _fail("$count only accepts an empty object as input")
            found = True
        else:
            raise _fail(f"Window function found an unknown argument: {arg}")
    return _Function("$sum", 1, bounds)


def _parse_first_last(obj: Mapping[str, Any], sort: Any, name: str) -> _Function:
    bounds: _Bounds | None = None
    expr: Any = None
    for arg, value in obj.items():
        if arg == "window":
            if bounds is not None:
                raise _fail(f"saw multiple 'window' fields in '{name}' expression")
            bounds = _parse_bounds(value, sort)
        elif arg == name:
            expr = value
        else:
            raise _fail(f"{name} got unexpected argument: {arg}")
    return _Function(name, expr, bounds or _DEFAULT)


def _parse_rank(obj: Mapping[str, Any], sort: Any) -> _Function:
    if len(obj) != 1:
        raise MongoError(5371601, "Rank style window functions take no other arguments")
    (name, value), = obj.items()
    if not isinstance(value, Mapping) or value:
        raise MongoError(5371603, f"{name} must be specified with '{{}}' as the value")
    if not sort or len(sort) != 1:
        raise MongoError(5371602, f"{name} must be specified with a top level sortBy "
                         "expression with exactly one element")
    return _Function(name, None, _TO_CURRENT)


def _parse_shift(obj: Mapping[str, Any], sort: Any) -> _Function:
    function: _Function | None = None
    for arg, value in obj.items():
        if arg == "window":
            raise _fail("$shift does not accept a 'window' field")
        if arg in _FUNCTIONS:
            if function is not None:
                raise _fail("Cannot specify multiple functions in window function spec")
            if not isinstance(value, Mapping):
                raise _fail("Argument to $shift must be an object")
            function = _shift_args(value, arg)
        else:
            raise _fail(f"Window function found an unknown argument: {arg}")
    if not sort:
        raise _fail("'$shift' requires a sortBy")
    assert function is not None
    return function


def _shift_args(args: Mapping[str, Any], name: str) -> _Function:
    output: Any = MISSING
    default: Any = None
    by: int | None = None
    for arg, value in args.items():
        if arg == "output":
            output = value
        elif arg == "default":
            default = _constant(value)
            if default is MISSING:
                raise _fail("'$shift:default' expression must yield a constant value.")
        elif arg == "by":
            by = _int_element(value)
            if by is None:
                raise _fail("'$shift:by' field must be an integer, but found  "
                            + _element("by", value))
        else:
            raise _fail(f"Unknown argument in {name}")
    if output is MISSING:
        raise _fail(f"{name} requires an 'output' expression.")
    if by is None:
        raise _fail(f"{name} requires 'by' as an integer value.")
    function = _Function("$shift", output, _DEFAULT)
    function.by = by
    function.default = default
    return function


def _int_element(value: Any) -> int | None:
    """BSONElement::parseIntegerElementToInt."""
    if not _is_number(value):
        return None
    d = value.to_decimal() if isinstance(value, Decimal128) else value
    try:
        n = int(d)
    except (ValueError, OverflowError):
        return None
    if n != d or not -(2**31) <= n < 2**31:
        return None
    return n


def _parse_fill(obj: Mapping[str, Any], sort: Any) -> _Function:
    name: str | None = None
    expr: Any = None
    window = False
    for arg, value in obj.items():
        if arg == "window":
            window = True
        elif arg in _FUNCTIONS:
            if name is not None:
                raise _fail("Cannot specify two functions in window function spec")
            name, expr = arg, value
        else:
            raise _fail(f"Window function found an unknown argument: {arg}")
    assert name is not None
    if window:
        raise _fail(f"'window' field is not allowed in {name}")
    if name == "$linearFill" and (not sort or len(sort) != 1):
        raise MongoError(605001, f"{name} must be specified with a top level sortBy "
                         "expression with exactly one element")
    return _Function(name, expr, _TO_CURRENT)


def _parse_exp_moving_avg(obj: Mapping[str, Any], sort: Any) -> _Function:
    name = "$expMovingAvg"
    sub = obj.get(name)
    if len(obj) != 1 or not isinstance(sub, Mapping):
        raise _fail("$expMovingAvg must have exactly one argument that is an object")
    if len(sub) != 2 or "input" not in sub:
        raise _fail("$expMovingAvg sub object must have exactly two fields: An 'input' field, "
                    "and either an 'N' field or an 'alpha' field")
    if not sort:
        raise _fail("$expMovingAvg requires an explicit 'sortBy'")
    function = _Function(name, sub["input"], _TO_CURRENT)
    if "N" in sub:
        n = sub["N"]
        if not _is_number(n):
            raise _fail(f"'N' field must be an integer, but found type {type_name(n)}")
        as_double = float(n.to_decimal()) if isinstance(n, Decimal128) else float(n)
        if not math.isfinite(as_double) or as_double != math.floor(as_double):
            raise _fail("'N' field must be an integer, but found  " + _element("N", n)
                        + ". To use a non-integer, use the 'alpha' argument instead")
        whole = int(as_double)
        if whole <= 0:
            raise _fail(f"'N' must be greater than zero. Got {whole}")
        function.option = _DECIMAL128.divide(decimal.Decimal(2), decimal.Decimal(whole + 1))
    elif "alpha" in sub:
        alpha = sub["alpha"]
        if not _is_number(alpha):
            raise _fail("'alpha' must be a number")
        if isinstance(alpha, Decimal128):
            value = alpha.to_decimal()
        elif isinstance(alpha, float):  # BSONElement::numberDecimal: 15 digits
            value = decimal.Context(prec=15).create_decimal(decimal.Decimal(alpha))
        else:
            value = decimal.Decimal(alpha)
        if not 0 < value < 1:
            raise _fail("'alpha' must be between 0 and 1 (exclusive), found "
                        + _element("alpha", alpha))
        function.option = value
    else:
        raise _fail("Got unrecognized field in $expMovingAvg$expMovingAvg sub object must have "
                    "exactly two fields: An 'input' field, and either an 'N' field or an "
                    "'alpha' field")
    return function


def _parse_unit(value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(f"unit' must be a string, but got {type_name(value)}")
    if value not in _UNITS_MS and value not in _MONTHS:
        raise _fail(f"unknown time unit value: {value}")
    if value in _MONTHS:
        raise MongoError(5490710, "unit must be 'week' or smaller")
    return value


def _parse_with_unit(obj: Mapping[str, Any], sort: Any, name: str) -> _Function:
    """$derivative / $integral."""
    if not sort:
        raise _fail(f"{name} requires a sortBy")
    if len(sort) != 1:
        raise _fail(f"{name} requires a non-compound sortBy")
    bounds: _Bounds | None = None
    args: Any = MISSING
    for arg, value in obj.items():
        if arg == "window":
            if bounds is not None and name == "$integral":
                raise _fail("There can be only one 'window' field for $integral")
            bounds = _parse_bounds(value, sort)
        elif arg == name:
            args = value
        else:
            raise _fail(f"{name} got unexpected argument: {arg}")
    if not isinstance(args, Mapping):
        raise _fail(f"{name} expects an object, but got a {type_name(args)}: "
                    + _element(name, args))
    expr: Any = MISSING
    unit: str | None = None
    for arg, value in args.items():
        if arg == "input":
            expr = value
        elif arg == "unit":
            if unit is not None and name == "$integral":
                raise _fail("There can be only one 'unit' field for $integral")
            unit = _parse_unit(value)
        else:
            raise _fail(f"{name} got unexpected argument: {arg}")
    if expr is MISSING:
        raise _fail(f"{name} requires an 'input' expression")
    if bounds is None:
        if name == "$derivative":
            raise _fail("$derivative requires explicit window bounds")
        bounds = _DEFAULT
    function = _Function(name, expr, bounds)
    function.unit = unit
    return function


def _parse_bounds(args: Any, sort: list[tuple[str, bool]] | None) -> _Bounds:
    """WindowBounds::parse."""
    if not isinstance(args, Mapping):
        raise _fail("'window' field must be an object")
    documents, range_, unit = (args.get(k, MISSING) for k in ("documents", "range", "unit"))
    if documents is not MISSING and range_ is not MISSING:
        raise _fail("Window bounds can specify either 'documents' or 'unit', not both.")
    if range_ is MISSING and unit is not MISSING:
        raise _fail("Window bounds can only specify 'unit' with range-based bounds.")
    if range_ is MISSING and documents is MISSING:
        if args:
            raise _fail("'window' field can only contain 'documents' as the only argument or "
                        "'range' with an optional 'unit' field")
        return _DEFAULT

    def unpack(name: str, value: Any) -> tuple[Any, Any]:
        if not isinstance(value, list) or len(value) != 2:
            raise _fail("Window bounds must be a 2-element array: " + _element(name, value))
        return value[0], value[1]

    def bound(value: Any, check: Callable[[Any], Any]) -> Any:
        if isinstance(value, str):
            if value in ("unbounded", "current"):
                return value
            raise _fail("Window bounds must be 'unbounded', 'current', or a number.")
        constant = _constant(value)
        if constant is MISSING:
            raise _fail("Window bounds expression must be a constant.")
        return check(constant)

    def forward(lower: Any, upper: Any) -> None:
        lo = 0 if lower == "current" else lower
        hi = 0 if upper == "current" else upper
        if not isinstance(lo, str) and not isinstance(hi, str) and _less(hi, lo):
            raise MongoError(5339900, "Lower bound must not exceed upper bound: "
                             f"[{value_string(lo)}, {value_string(hi)}]")

    if documents is not MISSING:
        if len(args) != 1:
            raise _fail("'window' field that specifies documents cannot have other fields")
        lower_spec, upper_spec = unpack("documents", documents)

        def as_int(v: Any) -> int:
            n = _integral(v)
            if n is None:
                raise _fail("Numeric document-based bounds must be an integer")
            return n

        lower, upper = bound(lower_spec, as_int), bound(upper_spec, as_int)
        forward(lower, upper)
        bounds = _Bounds("documents", lower, upper)
        if not (lower == upper == "unbounded") and not sort:
            raise MongoError(5339901, "Document-based bounds require a sortBy")
        return bounds
    lower_spec, upper_spec = unpack("range", range_)
    if unit is not MISSING:
        if len(args) != 2:
            raise _fail("'window' field that specifies unit cannot have other fields besides "
                        "'range'")
        if not isinstance(unit, str):
            raise _fail("'unit' must be a string")

        def with_unit(v: Any) -> Any:
            if _integral(v) is None:
                raise _fail("With 'unit', range-based bounds must be an integer")
            return v

        lower, upper = bound(lower_spec, with_unit), bound(upper_spec, with_unit)
        forward(lower, upper)
        if unit not in _UNITS_MS and unit not in _MONTHS:
            raise _fail(f"unknown time unit value: {unit}")
        bounds = _Bounds("range", lower, upper, unit)
    else:
        if len(args) != 1:
            raise _fail("'window' field that specifies range cannot have other fields besides "
                        "'unit'")

        def number(v: Any) -> Any:
            if not _is_number(v):
                raise _fail("Range-based bounds expression must be a number")
            return v

        lower, upper = bound(lower_spec, number), bound(upper_spec, number)
        forward(lower, upper)
        bounds = _Bounds("range", lower, upper)
    if not sort or len(sort) != 1:
        raise MongoError(5339902, "Range-based bounds require sortBy a single field")
    if not sort[0][1]:
        raise MongoError(8947401, "Range-based bounds require an ascending sortBy")
    return bounds


# -- windows ---------------------------------------------------------------------------------


def _add_unit(base: datetime.datetime, unit: str, amount: int) -> datetime.datetime:
    if unit in _UNITS_MS:
        return _from_ms(_ms(base) + amount * _UNITS_MS[unit])
    total = base.year * 12 + base.month - 1 + amount * _MONTHS[unit]
    year, month = divmod(total, 12)
    nxt = datetime.date(year + (month == 11), (month + 1) % 12 + 1, 1)
    last = (nxt - datetime.timedelta(days=1)).day
    return base.replace(year=year, month=month + 1, day=min(base.day, last))


class _Partition:
    """One partition: its documents in order, and what the windows read of them."""

    def __init__(self, docs: list[Any], sort: list[tuple[str, bool]] | None) -> None:
        self.docs = docs
        self.sort = sort
        self._sort_values: list[Any] | None = None

    def sort_values(self) -> list[Any]:
        """The sortBy field's value in each document (ExpressionFieldPath)."""
        if self._sort_values is None:
            assert self.sort
            self._sort_values = _evaluate_all("$" + self.sort[0][0], self.docs)
        return self._sort_values

    def window(self, bounds: _Bounds, i: int) -> tuple[int, int] | None:
        n = len(self.docs)
        if bounds.kind == "documents":
            lo = 0 if bounds.lower == "unbounded" else i + (
                0 if bounds.lower == "current" else bounds.lower)
            hi = n - 1 if bounds.upper == "unbounded" else i + (
                0 if bounds.upper == "current" else bounds.upper)
            if lo > n - 1 or hi < 0:
                return None
            return max(lo, 0), min(hi, n - 1)
        return self._range(bounds, i)

    def _range(self, bounds: _Bounds, i: int) -> tuple[int, int] | None:
        values = self.sort_values()
        base = values[i]
        unit = bounds.unit
        if unit is not None:
            if not _is_date(base):
                raise MongoError(5429513, "Invalid range: Expected the sortBy field to be a "
                                 f"Date, but it was {type_name(_plain(base))}")
        else:
            if _is_date(base):
                raise MongoError(5429413, "Invalid range: For windows that involve date or "
                                 "time ranges, a unit must be provided.")
            if not _is_number(base):
                raise MongoError(5429414, "Invalid range: Expected the sortBy field to be a "
                                 f"number, but it was {type_name(_plain(base))}")

        def expected(v: Any) -> bool:
            return _is_date(v) if unit is not None else _is_number(v)

        def threshold(delta: Any) -> Any:
            if unit is not None:
                return _add_unit(base, unit, int(_integral(delta) or 0))
            return Decimal128(_DECIMAL128.add(_numeric_value(base), _numeric_value(delta)))

        n = len(values)
        lower: int | None
        if bounds.lower == "current":
            lower = i
        elif bounds.lower == "unbounded":
            lower = next((j for j in range(n) if expected(values[j])), None)
        else:
            limit = threshold(bounds.lower)
            lower = next((j for j in range(n) if not _less(values[j], limit)), None)
        if lower is None:
            return None
        if bounds.upper == "current":
            return lower, i
        if bounds.upper == "unbounded":
            j = max(i, lower)
            while j + 1 < n and expected(values[j + 1]):
                j += 1
            return lower, j
        limit = threshold(bounds.upper)
        for j in range(lower, n):
            if _less(limit, values[j]):
                return (lower, j - 1) if j > lower else None
        return lower, n - 1


def _numeric_value(v: Any) -> decimal.Decimal:
    return v.to_decimal() if isinstance(v, Decimal128) else decimal.Decimal(v)


def _plain(v: Any) -> Any:
    return None if v is MISSING else v


# -- window functions ------------------------------------------------------------------------


def _sum(values: list[Any], removable: bool) -> Any:
    """AccumulatorSum (non-removable) / RemovableSum over the numbers among `values`."""
    ints = 0
    doubles: list[float] = []
    decimals: list[decimal.Decimal] = []
    long_seen = False
    nan = pos_inf = neg_inf = 0
    for v in values:
        if isinstance(v, bool) or not _is_number(v):
            continue
        if isinstance(v, Decimal128):
            d = v.to_decimal()
            if d.is_nan():
                nan += 1
            elif d.is_infinite():
                pos_inf, neg_inf = (pos_inf + 1, neg_inf) if d > 0 else (pos_inf, neg_inf + 1)
            decimals.append(d)
        elif isinstance(v, float):
            if math.isnan(v):
                nan += 1
            elif math.isinf(v):
                pos_inf, neg_inf = (pos_inf + 1, neg_inf) if v > 0 else (pos_inf, neg_inf + 1)
            doubles.append(v)
        else:
            long_seen = long_seen or isinstance(v, Int64) or not -(2**31) <= v < 2**31
            ints += int(v)
    if decimals:
        if removable and (nan or (pos_inf and neg_inf)):
            return Decimal128("NaN")
        total = decimal.Decimal(ints)
        for x in doubles:
            total = _DECIMAL128.add(total, _DECIMAL128.create_decimal(decimal.Decimal(x)))
        for dec in decimals:
            total = _DECIMAL128.add(total, dec)
        return Decimal128(total)
    if doubles:
        if nan or (pos_inf and neg_inf):
            return math.nan
        if pos_inf or neg_inf:
            return math.inf if pos_inf else -math.inf
        return math.fsum([*doubles, ints])
    if not -(2**63) <= ints < 2**63:
        return float(ints)
    if removable:
        return ints if -(2**31) <= ints < 2**31 else Int64(ints)
    return Int64(ints) if long_seen else ints


def _avg(values: list[Any], removable: bool) -> Any:
    numbers = [v for v in values if _is_number(v)]
    if not numbers:
        return None
    total = _sum(numbers, removable)
    if isinstance(total, Decimal128):
        return Decimal128(_DECIMAL128.divide(total.to_decimal(), decimal.Decimal(len(numbers))))
    return float(total) / len(numbers)


def _min_max(values: list[Any], greatest: bool) -> Any:
    present = [v for v in values if v is not MISSING and v is not None]
    if not present:
        return None
    best = present[0]
    for v in present[1:]:
        if (_less(best, v) if greatest else _less(v, best)):
            best = v
    return best


def _add_to_set(values: list[Any]) -> list[Any]:
    unique: dict[bytes, Any] = {}
    for v in values:
        if v is not MISSING:
            unique.setdefault(_key(v), v)
    return [unique[k] for k in sorted(unique)]


def _std_dev_welford(values: list[Any], sample: bool) -> Any:
    """AccumulatorStdDev (Welford's online algorithm), as mongod's non-removable windows."""
    count, mean, m2 = 0, 0.0, 0.0
    for v in values:
        if not _is_number(v):
            continue
        x = float(v.to_decimal()) if isinstance(v, Decimal128) else float(v)
        count += 1
        delta = x - mean
        if delta != 0.0:
            mean += delta / count
            m2 += delta * (x - mean)
    adjusted = count - 1 if sample else count
    if adjusted <= 0:
        return None
    return math.sqrt(m2 / adjusted)


class _DoubleDouble:
    """DoubleDoubleSummation (util/summation.h): a rounded sum and its compensation."""

    __slots__ = ("addend", "special", "total")

    def __init__(self) -> None:
        self.total = self.addend = self.special = 0.0

    def add(self, x: float) -> None:
        self.special += x
        s = x + self.addend  # Fast2Sum(x, addend)
        x, self.addend = s, self.addend - (s - x)
        s = self.total + x  # 2Sum(total, x)
        a = s - x
        b = s - a
        self.total, x = s, (self.total - a) + (x - b)
        self.addend += x

    def add_long(self, n: int) -> None:
        high = (abs(n) >> 32 << 32) * (1 if n >= 0 else -1)  # C++ division truncates
        self.add(float(n - high))
        self.add(float(high))

    def value(self) -> float:
        return self.special if math.isnan(self.total) else self.total + self.addend


class _RemovableStdDev:
    """WindowFunctionStdDev: the state bounded windows add values to and remove them from."""

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.reset()

    def reset(self) -> None:
        self.sum = _DoubleDouble()
        self.m2 = _DoubleDouble()
        self.count = 0
        self.nonfinite = 0

    def update(self, v: Any, quantity: int) -> None:
        if not _is_number(v):
            return
        x = float(v.to_decimal()) if isinstance(v, Decimal128) else float(v)
        if not math.isfinite(x):
            self.nonfinite += quantity
            self.count += quantity
            return
        if self.count == 0:
            self.count = 1
            if isinstance(v, Int64) or (isinstance(v, int) and not -(2**31) <= v < 2**31):
                self.sum.add_long(int(v))
            else:
                self.sum.add(x)
            return
        if self.count + quantity == 0:
            self.reset()
            return
        delta = self.count * x - self.sum.value()
        self.count += quantity
        self.sum.add(x * quantity)
        self.m2.add(delta * delta * quantity / (self.count * (self.count - quantity)))

    def value(self) -> Any:
        if self.nonfinite > 0:
            return math.nan
        adjusted = self.count - 1 if self.sample else self.count
        if adjusted == 0:
            return None
        squares = self.m2.value()
        if squares < 0 or (not self.sample and self.count == 1):
            self.m2 = _DoubleDouble()
            return 0
        return math.sqrt(self.m2.value() / adjusted)


def _std_dev_removable(part: _Partition, bounds: _Bounds, values: list[Any],
                       sample: bool) -> list[Any]:
    """The removable executors: per document, the values entering the window added (in
    order), then those leaving it removed (oldest first)."""
    state = _RemovableStdDev(sample)
    out: list[Any] = []
    previous: tuple[int, int] | None = None
    for i in range(len(part.docs)):
        window = part.window(bounds, i)
        if previous is None:
            added = window
            removed = None
        elif window is None:
            added, removed = None, previous
        else:
            added = (previous[1] + 1, window[1]) if previous[1] < window[1] else None
            removed = (previous[0], window[0] - 1) if previous[0] < window[0] else None
        if added is not None:
            for j in range(added[0], added[1] + 1):
                state.update(values[j], +1)
        if removed is not None:
            for j in range(removed[0], removed[1] + 1):
                state.update(values[j], -1)
        previous = window
        out.append(state.value())
    return out


def _accumulate(name: str, values: list[Any], removable: bool) -> Any:
    if name == "$sum":
        return _sum(values, removable)
    if name == "$avg":
        return _avg(values, removable)
    if name in ("$min", "$max"):
        return _min_max(values, name == "$max")
    if name == "$push":
        return [v for v in values if v is not MISSING]
    if name == "$addToSet":
        return _add_to_set(values)
    return _std_dev_welford(values, name == "$stdDevSamp")  # bounded: _std_dev_removable


def _outputs(function: _Function, part: _Partition) -> list[Any]:
    """The function's value for each document of the partition."""
    name, n = function.name, len(part.docs)
    if name in _INSTALLED:
        return _INSTALLED[name][1](function, part)
    if name in _RANKS:
        return _ranks(name, part)
    if name == "$shift":
        values = _evaluate_all(function.input, part.docs)
        return [values[i + function.by] if 0 <= i + function.by < n else function.default
                for i in range(n)]
    if name == "$locf":
        filled, last = [], None
        for v in _evaluate_all(function.input, part.docs):
            if v is not MISSING and v is not None:
                last = v
            filled.append(last)
        return filled
    if name == "$linearFill":
        return _linear_fill(function, part)
    if name == "$expMovingAvg":
        return _exp_moving_avg(function, part)
    values = _evaluate_all(function.input, part.docs)
    if name in ("$stdDevPop", "$stdDevSamp") and function.bounds.removable:
        return _std_dev_removable(part, function.bounds, values, name == "$stdDevSamp")
    if name in ("$derivative", "$integral"):
        times = part.sort_values()
        calc = _derivative if name == "$derivative" else _integral_of
        return [calc(function, times, values, part.window(function.bounds, i))
                for i in range(n)]
    out: list[Any] = []
    previous: tuple[tuple[int, int] | None, Any] | None = None
    for i in range(n):
        window = part.window(function.bounds, i)
        if name in ("$first", "$last"):
            out.append(None if window is None else values[window[0 if name == "$first" else 1]])
            continue
        if previous is not None and previous[0] == window:  # the same documents (unbounded)
            out.append(copy.deepcopy(previous[1]))
            continue
        inside = [] if window is None else values[window[0]:window[1] + 1]
        result = _accumulate(name, inside, function.bounds.removable)
        previous = (window, result)
        out.append(result)
    return out


def _ranks(name: str, part: _Partition) -> list[Any]:
    """AccumulatorRank / DenseRank / DocumentNumber: equal sortBy values (null and missing
    alike, arrays by their sort key) share a rank."""
    assert part.sort
    path, ascending = part.sort[0]
    out: list[Any] = []
    last: bytes | None = None
    rank = 0
    for i, doc in enumerate(part.docs):
        if name == "$documentNumber":
            rank = i + 1
        else:
            key = _sort_key(doc, path, not ascending)
            if key != last:
                rank = i + 1 if name == "$rank" else rank + 1
                last = key
        out.append(_int_or_long(rank))
    return out


def _int_or_long(n: int) -> Any:
    return n if -(2**31) <= n < 2**31 else Int64(n)


def _exp_moving_avg(function: _Function, part: _Partition) -> list[Any]:
    alpha: decimal.Decimal = function.option
    keep = _DECIMAL128.subtract(decimal.Decimal(1), alpha)
    out: list[Any] = []
    current: decimal.Decimal | None = None
    is_decimal = False
    for v in _evaluate_all(function.input, part.docs):
        if _is_number(v):
            if isinstance(v, Decimal128):
                is_decimal = True
                d = v.to_decimal()
            else:
                d = _DECIMAL128.create_decimal(v if isinstance(v, int) else decimal.Decimal(v))
            current = d if current is None else _DECIMAL128.add(
                _DECIMAL128.multiply(d, alpha), _DECIMAL128.multiply(current, keep))
        if current is None:
            out.append(None)
        else:
            out.append(Decimal128(current) if is_decimal else float(current))
    return out


def _no_decimals(name: str, *values: Any) -> None:
    if any(isinstance(v, Decimal128) for v in values):
        raise _unsupported(f"a Decimal128 input to {name}")


def _difference(a: Any, b: Any) -> Any:
    """`a - b` for two numbers or two dates (milliseconds), as ExpressionSubtract."""
    if _is_date(a):
        return _ms(a) - _ms(b)
    if isinstance(a, float) or isinstance(b, float):
        return float(a) - float(b)
    return int(a) - int(b)


def _derivative(function: _Function, times: list[Any], values: list[Any],
                window: tuple[int, int] | None) -> Any:
    if window is None:
        return None
    left, right = window
    t0, t1 = times[left], times[right]
    if function.unit is not None:
        if not (_is_date(t0) and _is_date(t1)):
            raise MongoError(5624900, "$derivative with 'unit' expects the sortBy field to be "
                             "a Date")
    else:
        if _is_date(t0) or _is_date(t1):
            raise MongoError(5624901, "$derivative where the sortBy is a Date requires an "
                             "'unit'")
        if not (_is_number(t0) and _is_number(t1)):
            raise MongoError(5624902, "$derivative (with no 'unit') expects the sortBy field "
                             "to be numeric")
    v0, v1 = values[left], values[right]
    if v0 in (None, MISSING) or v1 in (None, MISSING):
        raise MongoError(5624903, "$derivative input must not be null or missing")
    if not (_is_number(v0) and _is_number(v1)):
        raise _unsupported("a $derivative input that is not a number")
    _no_decimals("$derivative", t0, t1, v0, v1)
    run = _difference(t1, t0)
    rise = _difference(v1, v0)
    if run == 0:
        return None
    result = float(rise) / float(run)
    if function.unit is not None:
        result *= float(_UNITS_MS[function.unit])
    return result


def _integral_of(function: _Function, times: list[Any], values: list[Any],
                 window: tuple[int, int] | None) -> Any:
    if window is None:
        return None
    left, right = window
    for j in range(left, right + 1):
        x, y = times[j], values[j]
        if not _is_number(y) or not (_is_number(x) or _is_date(x)):
            raise MongoError(5423900, "The input value of $integral window function must be a "
                             "vector of 2 value, the first value must be numeric or date type "
                             "and the second must be numeric.")
        if function.unit is not None and not _is_date(x):
            raise MongoError(5423901, "$integral with 'outputUnit' expects the sortBy field to "
                             "be a Date")
        if function.unit is None and not _is_number(x):
            raise MongoError(5423902, "$integral (with no 'outputUnit') expects the sortBy "
                             "field to be numeric")
        _no_decimals("$integral", x, y)
    if any(isinstance(values[j], float) and math.isnan(values[j])
           or isinstance(times[j], float) and math.isnan(times[j])
           for j in range(left, right + 1)):
        return math.nan
    areas = [float(_difference(times[j + 1], times[j]))
             * float(_plain_add(values[j + 1], values[j])) / 2.0
             for j in range(left, right)]
    total: Any = math.fsum(areas) if areas else 0
    if function.unit is not None:
        return float(total) / float(_UNITS_MS[function.unit])
    return total


def _plain_add(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return float(a) + float(b)
    return int(a) + int(b)


def _linear_fill(function: _Function, part: _Partition) -> list[Any]:
    values = _evaluate_all(function.input, part.docs)
    times = part.sort_values()
    out: list[Any] = []
    last_seen: Any = MISSING
    known: tuple[Any, Any] | None = None  # (x1, y1)
    n = len(values)
    for i in range(n):
        y, x = values[i], times[i]
        nullish = y is MISSING or y is None
        if not (_is_number(y) or nullish):
            raise MongoError(14, "Value to be filled must be numeric or nullish, but found "
                             f"{type_name(y)}")
        if not (_is_number(x) or _is_date(x)):
            raise MongoError(14, "Value of the sortBy field must be numeric or a date, but "
                             f"found {type_name(_plain(x))}")
        if last_seen is not MISSING:
            if _key(x) == _key(last_seen):
                raise MongoError(6050106, "There can be no repeated values in the sort field")
            if _is_date(x) != _is_date(last_seen):
                raise MongoError(14, "Conflicting sort value types, previously received type "
                                 f"{type_name(last_seen)}, but found {type_name(x)}")
        last_seen = x
        if not nullish:
            _no_decimals("$linearFill", x, y)
            known = (x, y)
            out.append(y)
            continue
        after = next(((times[j], values[j]) for j in range(i + 1, n)
                      if values[j] not in (None, MISSING) and times[j] not in (None, MISSING)),
                     None)
        if known is None or after is None:
            out.append(None)
            continue
        (x1, y1), (x2, y2) = known, after
        _no_decimals("$linearFill", x2, y2)
        slope = float(_difference(y2, y1)) / float(_difference(x2, x1))
        out.append(_plain_add(y1, float(_difference(x, x1)) * slope))
    return out


def evaluate_each(expr: Any, docs: list[Any]) -> list[Any]:
    """`expr` on each document, as the window functions evaluate their inputs (MISSING where
    mongod's result is missing)."""
    return _evaluate_all(expr, docs)


def sort_key(doc: Any, path: str, descending: bool = False) -> bytes:
    """The `$sort` key of `doc` for one path (compare as bytes)."""
    return _sort_key(doc, path, descending)


# -- the stage -------------------------------------------------------------------------------


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """MutableDocument::setNestedField: documents along the path copied (they may be shared),
    a missing value removes the field."""
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        sub = node.get(part)
        sub = dict(sub) if isinstance(sub, Mapping) else {}
        node[part] = sub
        node = sub
    if value is MISSING:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def set_window_fields(docs: list[Any], spec: Any) -> list[Any]:
    """The documents out of `{$setWindowFields: spec}`: in partition and sortBy order, each
    with the output fields set."""
    parsed = _parse(spec)
    if not docs:
        return []
    order = list(range(len(docs)))
    if parsed.sort:
        for path, ascending in reversed(parsed.sort):
            keys = [_sort_key(doc, path, not ascending) for doc in docs]
            order.sort(key=keys.__getitem__, reverse=not ascending)
    partitions: list[list[Any]]
    if parsed.partition is MISSING or not _has_field_path(parsed.partition):
        partitions = [[docs[i] for i in order]]
    else:
        values = _evaluate_all(parsed.partition, docs)
        for v in values:
            if isinstance(v, list):
                raise MongoError(14, "An expression used to partition cannot evaluate to value "
                                 "of type array")
        keys = [_key(v) for v in values]  # missing is the null partition
        order.sort(key=keys.__getitem__)
        partitions = []
        last: bytes | None = None
        for i in order:
            if keys[i] != last:
                partitions.append([])
                last = keys[i]
            partitions[-1].append(docs[i])
    out: list[Any] = []
    for members in partitions:
        part = _Partition(members, parsed.sort)
        computed = [(name, _outputs(function, part)) for name, function in parsed.output]
        for i, doc in enumerate(members):
            result = dict(doc)
            for name, values in computed:
                _set_path(result, name, values[i])
            out.append(result)
    return out
