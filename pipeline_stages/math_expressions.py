"""Arithmetic aggregation expressions mongomock lacks, with mongod 8.0's result types and
errors (exec/expression evaluate_math.cpp, expression_trigonometric.h, accumulator_std_dev.cpp):
`$round`, `$trunc` (with a place), the trigonometric and hyperbolic functions,
`$degreesToRadians`, `$radiansToDegrees`, `$bitAnd`, `$bitOr`, `$bitXor`, `$bitNot`,
`$stdDevPop`, `$stdDevSamp`, `$percentile`, `$median` (expression forms) and `$rand`.

Decimal arithmetic follows IEEE 754 decimal128 (34 digits, ties to even), as mongod's
Decimal128 does. A decimal operand of a trigonometric function, `$atan2`, or a standard
deviation is refused (code 2): mongod computes those with the Intel decimal library, whose
last digits this module does not reproduce.

Installed into the expression parser by expressions.py (`OPERATORS`). Pure and synchronous.
"""

from __future__ import annotations

import decimal
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from pipeline_stages.array_expressions import MISSING, integral32, is_numeric, operands, value
from pipeline_stages.date_expressions import missing_type_name, nullish
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string, type_name, value_string

__all__ = ["OPERATORS"]

_D128 = decimal.Context(prec=34, rounding=decimal.ROUND_HALF_EVEN, Emax=6144, Emin=-6143,
                        clamp=1, traps=[])
_PI = _D128.create_decimal("3.14159265358979323846264338327950288419716939937510")
_PI_OVER_180 = _D128.divide(_PI, decimal.Decimal(180))
_180_OVER_PI = _D128.divide(decimal.Decimal(180), _PI)
_INF = float("inf")


def _unsupported(what: str) -> MongoError:
    return MongoError(2, f"not supported by cdcserver's embedded store: {what}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_long(v: Any) -> bool:
    return isinstance(v, Int64) or (_is_int(v) and not -(2**31) <= v < 2**31)


def _to_double(v: Any) -> float:
    return float(v.to_decimal()) if isinstance(v, Decimal128) else float(v)


def _decimal_of(v: Any) -> decimal.Decimal:
    if isinstance(v, Decimal128):
        return v.to_decimal()
    if isinstance(v, float):
        return _D128.create_decimal(v)  # Decimal128(double, kRoundTo34Digits)
    return _D128.create_decimal(int(v))


def _to_decimal128(d: decimal.Decimal) -> Decimal128:
    return Decimal128(_D128.create_decimal(d))


# -- $round, $trunc ---------------------------------------------------------------------------


def _round_or_trunc(name: str, rounding: str) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        args = operands(name, spec, 1, 2)
        number = value(parser, args[0])
        if nullish(number):
            return None
        if not is_numeric(number):
            raise MongoError(51081, f"{name} only supports numeric types, not "
                             f"{missing_type_name(number)}")
        place = 0
        if len(args) > 1:
            precision = value(parser, args[1])
            if nullish(precision):
                return None
            if not is_numeric(precision):  # Value::coerceToLong
                raise MongoError(16003, f"can't convert from BSON type {type_name(precision)} "
                                 "to long")
            if integral32(precision) is None:  # the two spaces are mongod's
                raise MongoError(51082, f"precision argument to  {name} must be a integral "
                                 "value")
            place = int(integral32(precision) or 0)
            if not -20 <= place <= 100:
                raise MongoError(51083, f"cannot apply {name} with precision value {place} "
                                 "value must be in [-20, 100]")
        quantum = decimal.Decimal((0, (1,), -place))
        if isinstance(number, Decimal128):
            d = number.to_decimal()
            if d.is_infinite():
                return number
            return _to_decimal128(d.quantize(quantum, rounding=rounding, context=_D128))
        if isinstance(number, float):
            d = _decimal_of(number)
            if d.is_infinite() or d.is_nan():
                return number
            return float(d.quantize(quantum, rounding=rounding, context=_D128))
        if place >= 0:
            return number
        out = decimal.Decimal(int(number)).quantize(quantum, rounding=rounding, context=_D128)
        if out.is_nan() or not -(2**63) <= out < 2**63:
            raise MongoError(51080, f"invalid conversion from Decimal128 result in {name} "
                             f"resulting from arguments: [{int(number)}, {place}]")
        result = int(out)
        if _is_long(number) or result > 2**31 - 1:
            return Int64(result)
        return (result + 2**31) % 2**32 - 2**31  # static_cast<int>, as mongod does
    return evaluate


# -- trigonometry ----------------------------------------------------------------------------


def _single_numeric(name: str, spec: Any, parser: Any) -> Any:
    (arg,) = operands(name, spec, 1)
    v = value(parser, arg)
    if nullish(v):
        return MISSING
    if not is_numeric(v):
        raise MongoError(28765, f"{name} only supports numeric types, not {missing_type_name(v)}")
    return v


def _c_function(fn: Callable[[float], float], x: float) -> float:
    """The C library's answer where Python's math raises instead (overflow to infinity, a pole
    at the bound of the domain)."""
    try:
        return fn(x)
    except OverflowError:
        return math.copysign(_INF, x) if fn is not math.cosh else _INF
    except ValueError:
        if fn is math.atanh and abs(x) == 1:
            return math.copysign(_INF, x)
        return math.nan


def _bound(x: float) -> str:
    return "inf" if x == _INF else "-inf" if x == -_INF else f"{x:g}"


def _trig(name: str, fn: Callable[[float], float],
          bounds: tuple[float, float, bool] | None) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        v = _single_numeric(name, spec, parser)
        if v is MISSING:
            return None
        if isinstance(v, Decimal128):
            if v.to_decimal().is_nan() and bounds is not None:
                return v
            raise _unsupported(f"{name} of a decimal")
        x = float(v)
        if bounds is not None:
            if x != x:
                return v
            low, high, inclusive = bounds
            ok = low <= x <= high if inclusive else low < x < high
            if not ok:
                left, right = ("[", "]") if inclusive else ("(", ")")
                raise MongoError(50989, f"cannot apply {name} to {x:g}, value must be in "
                                 f"{left}{_bound(low)},{_bound(high)}{right}")
        return _c_function(fn, x)
    return evaluate


def _atan2(parser: Any, spec: Any) -> Any:
    name = "$atan2"
    args = operands(name, spec, 2)
    values = []
    for arg, code in zip(args, (51044, 51045)):
        v = value(parser, arg)
        if nullish(v):
            return None
        if not is_numeric(v):
            raise MongoError(code, f"{name} only supports numeric types, not "
                             f"{missing_type_name(v)}")
        values.append(v)
    if any(isinstance(v, Decimal128) for v in values):
        raise _unsupported(f"{name} of a decimal")
    return math.atan2(float(values[0]), float(values[1]))


def _angle(name: str, factor: decimal.Decimal, double_factor: float) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        v = _single_numeric(name, spec, parser)
        if v is MISSING:
            return None
        if isinstance(v, Decimal128):
            return _to_decimal128(_D128.multiply(v.to_decimal(), factor))
        return float(v) * double_factor
    return evaluate


# -- bitwise ---------------------------------------------------------------------------------


def _wrap64(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63


def _bitwise(name: str, identity: int,
             op: Callable[[int, int], int]) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        result, is_long = identity, False
        for arg in operands(name, spec, 0, -1):
            v = value(parser, arg)
            if nullish(v):
                return None
            if not _is_int(v):
                raise MongoError(14, f"{name} only supports int and long operands.")
            is_long = is_long or _is_long(v)
            result = op(result, int(v))
        return Int64(_wrap64(result)) if is_long else result
    return evaluate


def _bit_not(parser: Any, spec: Any) -> Any:
    v = _single_numeric("$bitNot", spec, parser)
    if v is MISSING:
        return None
    if not _is_int(v):
        raise MongoError(14, f"$bitNot only supports int and long, not: {type_name(v)}.")
    return Int64(~int(v)) if _is_long(v) else ~int(v)


# -- $stdDevPop, $stdDevSamp, $rand ----------------------------------------------------------


def _std_dev(name: str, sample: bool) -> Callable[[Any, Any], Any]:
    """ExpressionFromAccumulator: one array operand is the list of inputs, else each operand
    is one; non-numeric inputs are ignored (AccumulatorStdDev, Welford's online algorithm)."""
    def evaluate(parser: Any, spec: Any) -> Any:
        args = spec if isinstance(spec, list) else [spec]
        inputs: list[Any] = []
        if len(args) == 1:
            v = value(parser, args[0])
            inputs = v if isinstance(v, list) else [v]
        else:
            inputs = [value(parser, a) for a in args]
        count, mean, m2 = 0, 0.0, 0.0
        for v in inputs:
            if not is_numeric(v):
                continue
            if isinstance(v, Decimal128):
                raise _unsupported(f"{name} of a decimal")
            x = float(v)
            count += 1
            delta = x - mean
            if delta != 0.0:
                mean += delta / count
                m2 += delta * (x - mean)
        if count == 0 or (sample and count == 1):
            return None
        return math.sqrt(m2 / (count - 1 if sample else count))
    return evaluate


# -- $percentile, $median (expression forms) ---------------------------------------------------


def _discrete_rank(n: int, p: float) -> int:
    """PercentileAlgorithm::computeTrueRank: the lower of the ambiguous ranks."""
    return n - 1 if p >= 1.0 else max(0, math.ceil(n * p) - 1)


def _percentiles(samples: list[float], ps: list[float]) -> list[float]:
    """DiscretePercentile, which the expression forms use for method "approximate"."""
    finite = sorted(x for x in samples if not math.isinf(x) and x == x)
    low = sum(1 for x in samples if x == -_INF)
    high = sum(1 for x in samples if x == _INF)
    if not finite and not low and not high:
        return []
    out = []
    for p in ps:
        rank = _discrete_rank(len(finite) + low + high, p)
        if rank < low:
            out.append(-_INF)
        elif rank >= len(finite) + low:
            out.append(_INF)
        else:
            out.append(finite[rank - low])
    return out


def _constant(expression: Any) -> bool:
    if isinstance(expression, str):
        return not expression.startswith("$")
    if isinstance(expression, list):
        return all(_constant(e) for e in expression)
    if isinstance(expression, Mapping):
        if len(expression) == 1 and next(iter(expression)) == "$literal":
            return True
        return not any(k.startswith("$") for k in expression) and all(
            _constant(v) for v in expression.values())
    return True


def _check_quantile_spec(name: str, spec: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """AccumulatorPercentileSpec / AccumulatorMedianSpec as IDL parses them."""
    for key, item in spec.items():
        if key not in fields:
            raise MongoError(40415, f"BSON field '{name}.{key}' is an unknown field.")
        if key == "method":
            if not isinstance(item, str):
                raise MongoError(14, f"BSON field '{name}.method' is the wrong type "
                                 f"'{type_name(item)}', expected type 'string'")
            if item != "approximate":
                raise MongoError(2, "Currently only 'approximate' can be used as percentile "
                                 "'method'.")
    for key in fields:
        if key not in spec:
            raise MongoError(40414, f"BSON field '{name}.{key}' is missing but a required "
                             "field")


def _parse_p(parser: Any, expression: Any) -> list[float]:
    if not _constant(expression):
        raise MongoError(7750300, "The $percentile 'p' field must be an array of constant "
                         f"values, but found value: {bson_obj_string(expression)}.")
    values = value(parser, expression)
    message = "The $percentile 'p' field must be an array of numbers from [0.0, 1.0], but found: "
    if not isinstance(values, list) or not values:
        raise MongoError(7750301, message + value_string(values))
    ps = []
    for v in values:
        if not is_numeric(v):
            raise MongoError(7750302, message + value_string(v))
        p = _to_double(v)
        if p < 0 or p > 1:
            raise MongoError(7750303, message + f"{p:g}")
        ps.append(p)
    return ps


def _quantile(name: str) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        median = name == "$median"
        if not isinstance(spec, Mapping):
            raise MongoError(7436201 if median else 7436200, "specification must be an object; "
                             f"found {name}: {bson_obj_string(spec)}")
        fields = ("input", "method") if median else ("input", "p", "method")
        _check_quantile_spec(name, spec, fields)
        ps = [0.5] if median else _parse_p(parser, spec["p"])
        data = value(parser, spec["input"])
        if is_numeric(data):
            result = [_to_double(data)] * len(ps)
        elif isinstance(data, list):
            result = _percentiles([_to_double(x) for x in data if is_numeric(x)], ps)
        else:
            result = []
        if median:
            return result[0] if result else None
        return result if result else [None] * len(ps)
    return evaluate


def _rand(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        raise MongoError(10065, "invalid parameter: expected an object ($rand)")
    if spec:
        raise MongoError(3040501, "$rand does not currently accept arguments")
    return random.random()


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$round": _round_or_trunc("$round", decimal.ROUND_HALF_EVEN),
    "$trunc": _round_or_trunc("$trunc", decimal.ROUND_DOWN),
    "$sin": _trig("$sin", math.sin, (-_INF, _INF, False)),
    "$cos": _trig("$cos", math.cos, (-_INF, _INF, False)),
    "$tan": _trig("$tan", math.tan, (-_INF, _INF, False)),
    "$asin": _trig("$asin", math.asin, (-1.0, 1.0, True)),
    "$acos": _trig("$acos", math.acos, (-1.0, 1.0, True)),
    "$atanh": _trig("$atanh", math.atanh, (-1.0, 1.0, True)),
    "$acosh": _trig("$acosh", math.acosh, (1.0, _INF, True)),
    "$atan": _trig("$atan", math.atan, None),
    "$asinh": _trig("$asinh", math.asinh, None),
    "$sinh": _trig("$sinh", math.sinh, None),
    "$cosh": _trig("$cosh", math.cosh, None),
    "$tanh": _trig("$tanh", math.tanh, None),
    "$atan2": _atan2,
    "$degreesToRadians": _angle("$degreesToRadians", _PI_OVER_180, math.pi / 180.0),
    "$radiansToDegrees": _angle("$radiansToDegrees", _180_OVER_PI, 180.0 / math.pi),
    "$bitAnd": _bitwise("$bitAnd", -1, lambda a, b: a & b),
    "$bitOr": _bitwise("$bitOr", 0, lambda a, b: a | b),
    "$bitXor": _bitwise("$bitXor", 0, lambda a, b: a ^ b),
    "$bitNot": _bit_not,
    "$stdDevPop": _std_dev("$stdDevPop", False),
    "$stdDevSamp": _std_dev("$stdDevSamp", True),
    "$percentile": _quantile("$percentile"),
    "$median": _quantile("$median"),
    "$rand": _rand,
}
