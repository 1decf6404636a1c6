"""The `$group` accumulators as mongod 8.0 computes them (accumulator_*.cpp).

Each accumulator takes the evaluated argument of every document of its group in input order
(`process`, MISSING for a missing path) and gives its value (`result`, MISSING where mongod's
is missing: `$group` makes that null). `parse(name, argument)` gives the factory, the argument
expression and the initializer expression (`n` of the N accumulators, evaluated once per group
on the group key when it is a document, else on an empty one), or None for an unknown name;
the accumulators mongod has and this module lacks ($median, $percentile, $accumulator) are
"not supported" (code 2).

Values are compared in BSON order, numbers by value (1, 1.0, NumberLong(1) and
NumberDecimal("1") are equal): `value_key` is the hashable identity used for group keys and
`$addToSet`, `order_key` the sort key for `$min`/`$max`, their N forms and the sortBy keys of
`$top`/`$bottom` and their N forms.
"""

from __future__ import annotations

import bisect
import decimal
import fractions
import math
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64

from pipeline_stages.errors import MongoError
from pipeline_stages.keystring import encode_values
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import type_name, value_string

__all__ = [
    "MISSING", "Accumulator", "numeric", "order_key", "parse", "value_key",
]

_DECIMAL = create_decimal128_context()
_INT32 = (-(2**31), 2**31)
_INT64 = (-(2**63), 2**63)


def numeric(v: Any) -> int | float | decimal.Decimal | None:
    """A number's value (None for a non-number; booleans are not numbers)."""
    t = type(v)
    if t is int or t is float or t is Int64:
        return v  # type: ignore[no-any-return]
    if t is Decimal128:
        return v.to_decimal()  # type: ignore[no-any-return]
    return None


def value_key(v: Any) -> Any:
    """A hashable key equal for values mongod compares equal (strings by code point, numbers
    by value, documents field by field): native for strings, numbers and null, the KeyString
    otherwise."""
    t = type(v)
    if t is str:
        return v
    if (t is int or t is Int64) or (t is float and v == v):
        return (0, v)  # a tuple: never equal to a str, and True is not 1 here
    if v is None:
        return (1,)
    if t is Decimal128:
        d = v.to_decimal()
        if d.is_finite():
            return (0, d)  # a Decimal equals (and hashes as) the int or float of its value
    try:
        return encode_values((v,))[0]
    except Exception:  # noqa: BLE001 - a type KeyString cannot encode
        return (2, repr(v))


def order_key(v: Any) -> bytes:
    """A sort key in BSON order (KeyString)."""
    return encode_values((v,))[0]


def _less(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is int or ta is float or ta is Int64) and (tb is int or tb is float or tb is Int64) \
            and a == a and b == b:
        return bool(a < b)
    if ta is str and tb is str:
        return bool(a < b)
    return bool(order_key(a) < order_key(b))


def _nullish(v: Any) -> bool:
    return v is MISSING or v is None


class Accumulator:
    needs_input = True

    def process(self, value: Any) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        raise NotImplementedError


# -- $sum, $avg, $count ----------------------------------------------------------------------


class _Total:
    """mongod's sum: ints and longs exact, doubles summed as one correctly rounded double
    (mongod's DoubleDoubleSummation), decimals apart; the widest type met."""

    __slots__ = ("count", "decimals", "floats", "ints", "widest")

    def __init__(self) -> None:
        self.ints = 0
        self.floats: list[float] = []
        self.decimals: list[decimal.Decimal] = []
        self.widest = 0  # 0 int, 1 long, 2 double, 3 decimal
        self.count = 0

    def add(self, v: Any) -> None:
        t = type(v)
        if t is int:
            self.ints += v
            if not _INT32[0] <= v < _INT32[1] and self.widest < 1:
                self.widest = 1
        elif t is float:
            self.floats.append(v)
            if self.widest < 2:
                self.widest = 2
        elif t is Int64:
            self.ints += int(v)
            if self.widest < 1:
                self.widest = 1
        elif t is Decimal128:
            self.decimals.append(v.to_decimal())
            self.widest = 3
        else:
            return
        self.count += 1

    def _double(self) -> float:
        floats = self.floats
        if not floats:
            return float(self.ints)
        try:
            return math.fsum([*floats, self.ints]) if abs(self.ints) < 2**53 else \
                float(decimal.Decimal(math.fsum(floats)) + self.ints)
        except (OverflowError, ValueError):  # infinities, NaN or a sum past the double range
            return float(sum(floats) + self.ints)

    def _decimal(self) -> decimal.Decimal:
        """The decimals summed in order, plus the other numbers' total as mongod converts its
        double-double sum (each double exactly, rounded to 34 digits)."""
        with decimal.localcontext(_DECIMAL) as ctx:
            total = ctx.create_decimal(0)
            for d in self.decimals:
                total = ctx.add(total, d)
            if not self.floats:
                return ctx.add(total, ctx.create_decimal(self.ints))
            head = self._double()
            if not math.isfinite(head):
                return ctx.add(total, ctx.create_decimal(head))
            exact = sum((fractions.Fraction(f) for f in self.floats), fractions.Fraction(0))
            tail = float(exact + self.ints - fractions.Fraction(head))
            others = ctx.create_decimal(head)
            if tail:
                others = ctx.add(others, ctx.create_decimal(tail))
            return ctx.add(total, others)

    def value(self) -> Any:
        if self.widest == 3:
            return Decimal128(self._decimal())
        if self.widest == 2:
            return self._double()
        total = self.ints
        if self.widest == 0 and _INT32[0] <= total < _INT32[1]:
            return total
        if _INT64[0] <= total < _INT64[1]:
            return Int64(total)
        return float(total)


class Sum(Accumulator):
    """AccumulatorSum: numbers only (booleans and arrays skipped); 0 (an int) for none."""

    def __init__(self, _n: Any = None) -> None:
        self.total = _Total()

    def process(self, value: Any) -> None:
        self.total.add(value)

    def result(self) -> Any:
        return self.total.value()


class ConstantSum(Accumulator):
    """AccumulatorSum of a constant double (`$sum: 0.5`): plain double additions, as mongod's
    constant-sum state adds them (no compensated summation)."""

    def __init__(self, addend: float) -> None:
        self.addend = addend
        self.total = 0.0

    def process(self, value: Any) -> None:
        self.total += self.addend

    def result(self) -> Any:
        return self.total


class Avg(Accumulator):
    """AccumulatorAvg: a double (a decimal when a decimal was met); null for no number."""

    def __init__(self, _n: Any = None) -> None:
        self.total = _Total()

    def process(self, value: Any) -> None:
        self.total.add(value)

    def result(self) -> Any:
        total = self.total
        if not total.count:
            return None
        if total.widest == 3:
            with decimal.localcontext(_DECIMAL) as ctx:
                return Decimal128(ctx.divide(total._decimal(), ctx.create_decimal(total.count)))
        return total._double() / total.count


# -- $min, $max, $first, $last, $push, $addToSet, $mergeObjects ------------------------------


class Min(Accumulator):
    """AccumulatorMinMax: null and missing skipped; the first of equal values kept."""

    sense = 1

    def __init__(self, _n: Any = None) -> None:
        self.value: Any = MISSING

    def process(self, value: Any) -> None:
        if value is MISSING or value is None:
            return
        current = self.value
        if current is MISSING or (_less(value, current) if self.sense > 0
                                  else _less(current, value)):
            self.value = value

    def result(self) -> Any:
        return None if self.value is MISSING else self.value


class Max(Min):
    sense = -1


class First(Accumulator):
    """AccumulatorFirst: the first document's value, even a missing one (then null)."""

    def __init__(self, _n: Any = None) -> None:
        self.value: Any = MISSING

    def process(self, value: Any) -> None:
        self.value = value
        self.needs_input = False

    def result(self) -> Any:
        return self.value


class Last(First):
    def process(self, value: Any) -> None:
        self.value = value


class Push(Accumulator):
    """AccumulatorPush: every value but missing ones, in input order."""

    def __init__(self, _n: Any = None) -> None:
        self.values: list[Any] = []

    def process(self, value: Any) -> None:
        if value is not MISSING:
            self.values.append(value)

    def result(self) -> Any:
        return self.values


class AddToSet(Accumulator):
    """AccumulatorAddToSet: distinct values (missing skipped), the first of equal ones kept,
    in the order first met."""

    def __init__(self, _n: Any = None) -> None:
        self.seen: dict[Any, Any] = {}

    def process(self, value: Any) -> None:
        if value is not MISSING:
            self.seen.setdefault(value_key(value), value)

    def result(self) -> Any:
        return list(self.seen.values())


class MergeObjects(Accumulator):
    """AccumulatorMergeObjects: documents merged left to right (null and missing skipped)."""

    def __init__(self, _n: Any = None) -> None:
        self.merged: dict[str, Any] = {}

    def process(self, value: Any) -> None:
        if _nullish(value):
            return
        if not isinstance(value, Mapping):
            raise MongoError(
                40400, f"$mergeObjects requires object inputs, but input {value_string(value)} "
                f"is of type {type_name(value)}",
            )
        self.merged.update(value)

    def result(self) -> Any:
        return self.merged


# -- $stdDevPop, $stdDevSamp -----------------------------------------------------------------


class StdDevPop(Accumulator):
    """AccumulatorStdDev: Welford's running variance over the numbers, as doubles."""

    sample = False

    def __init__(self, _n: Any = None) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0

    def process(self, value: Any) -> None:
        x = numeric(value)
        if x is None:
            return
        x = float(x)
        self.count += 1
        delta = x - self.mean
        if delta != 0.0:
            self.mean += delta / self.count
            self.m2 += delta * (x - self.mean)

    def result(self) -> Any:
        n = self.count - 1 if self.sample else self.count
        if n <= 0:
            return None
        return math.sqrt(self.m2 / n)


class StdDevSamp(StdDevPop):
    sample = True


# -- $firstN, $lastN, $minN, $maxN -----------------------------------------------------------


def _validate_n(value: Any) -> int:
    """AccumulatorN::validateN."""
    number = numeric(value)
    shown = "MISSING" if value is MISSING else value_string(value)
    if number is None:
        raise MongoError(5787902, f"Value for 'n' must be of integral type, but found {shown}")
    try:
        n = int(number)
    except (ValueError, OverflowError):
        n = None
    if n is None or n != number:
        raise MongoError(5787903, f"Value for 'n' must be of integral type, but found {shown}")
    if n <= 0:
        raise MongoError(5787908, f"'n' must be greater than 0, found {n}")
    return n


class FirstN(Accumulator):
    """AccumulatorFirstN: the first n values, missing ones as null."""

    def __init__(self, n: Any) -> None:
        self.n = _validate_n(n)
        self.values: list[Any] = []

    def process(self, value: Any) -> None:
        self.values.append(None if value is MISSING else value)
        if len(self.values) >= self.n:
            self.needs_input = False

    def result(self) -> Any:
        return self.values


class LastN(FirstN):
    def process(self, value: Any) -> None:
        self.values.append(None if value is MISSING else value)
        if len(self.values) > self.n:
            del self.values[0]


class MinN(Accumulator):
    """AccumulatorMinMaxN, min sense: the n smallest non-null values, ascending. mongod keeps a
    multiset (an equal value goes after the ones it holds); when full, a value replaces the
    largest held only when smaller. MaxN: when full, a value larger than the smallest held
    replaces it (the earliest of the equal smallest ones); the values come out descending."""

    sense = 1

    def __init__(self, n: Any) -> None:
        self.n = _validate_n(n)
        self.entries: list[tuple[Any, int, Any]] = []  # (KeyString, arrival, value), ascending
        self.position = 0

    def process(self, value: Any) -> None:
        if _nullish(value):
            return
        key = order_key(value)
        entries = self.entries
        if len(entries) == self.n:
            if self.sense > 0:
                if not entries[-1][0] > key:
                    return
                entries.pop()
            else:
                if not entries[0][0] < key:
                    return
                del entries[0]
        self.position += 1
        bisect.insort(entries, (key, self.position, value), key=lambda e: (e[0], e[1]))

    def result(self) -> Any:
        values = [value for _, _, value in self.entries]
        return values if self.sense > 0 else values[::-1]


class MaxN(MinN):
    sense = -1


# -- $top, $bottom, $topN, $bottomN ---------------------------------------------------------

_EMPTY_ARRAY_KEY = bytes([0x0F, 4])  # KeyString's undefined: an empty array sorts before null
_NULL_KEY = encode_values((None,))[0]


def _sort_field_key(value: Any, descending: bool) -> bytes:
    """SortKeyGenerator for one field: an array by its least (greatest, descending) element,
    an empty one before null, missing as null."""
    if value is MISSING:
        return _NULL_KEY
    if isinstance(value, list):
        if not value:
            return _EMPTY_ARRAY_KEY
        keys = [order_key(v) for v in value]
        return max(keys) if descending else min(keys)
    return order_key(value)


class TopN(Accumulator):
    """AccumulatorTopBottomN, top sense: the outputs of the n documents first in sortBy order
    (missing outputs as null), in that order. mongod's multimap: an equal key goes after the
    ones held; when full, a document replaces the last held only when it sorts before it (so
    ties keep the first met). BottomN: the n last, in sortBy order; when full, a document that
    sorts after the first held replaces it."""

    top = True
    single = False

    def __init__(self, n: Any, directions: tuple[bool, ...]) -> None:
        self.n = _validate_n(n)
        self.directions = directions  # True: descending
        self.entries: list[tuple[list[bytes], Any]] = []

    def _compare(self, a: list[bytes], b: list[bytes]) -> int:
        for x, y, descending in zip(a, b, self.directions):
            if x != y:
                return (1 if x > y else -1) * (-1 if descending else 1)
        return 0

    def process(self, value: Any) -> None:
        fields = value if isinstance(value, Mapping) else {}
        output = fields.get("output", MISSING)
        key = [_sort_field_key(fields.get(f"sortFields{i}", MISSING), descending)
               for i, descending in enumerate(self.directions)]
        entries = self.entries
        if len(entries) == self.n:
            if self.top:
                if not self._compare(entries[-1][0], key) > 0:
                    return
                entries.pop()
            else:
                if not self._compare(key, entries[0][0]) > 0:
                    return
                del entries[0]
        low, high = 0, len(entries)
        while low < high:  # after the equal keys
            middle = (low + high) // 2
            if self._compare(key, entries[middle][0]) < 0:
                high = middle
            else:
                low = middle + 1
        entries.insert(low, (key, None if output is MISSING else output))

    def result(self) -> Any:
        values = [value for _, value in self.entries]
        if self.single:
            return values[0] if values else None
        return values


class BottomN(TopN):
    top = False


class Top(TopN):
    single = True


class Bottom(BottomN):
    single = True


_TOP_BOTTOM: dict[str, type[TopN]] = {
    "$topN": TopN, "$bottomN": BottomN, "$top": Top, "$bottom": Bottom,
}


def _parse_top_bottom(name: str, arg: Any) -> Parsed:
    """accumulatorNParseArgs and parseAccumulatorTopBottomNSortBy: the argument becomes
    `{output: <output>, sortFields0: "$<first sort field>", ...}`."""
    kind = _TOP_BOTTOM[name]
    if not isinstance(arg, Mapping):
        raise MongoError(5788001, f"specification must be an object; found {name}: "
                         f"{value_string(arg)}")
    n: Any = 1 if kind.single else MISSING
    output: Any = MISSING
    sort_by: Any = MISSING
    for field, value in arg.items():
        if field == "n" and not kind.single:
            n = value
        elif field == "output":
            output = value
        elif field == "sortBy":
            if not isinstance(value, Mapping):
                raise MongoError(10065, "invalid parameter: expected an object (sortBy)")
            sort_by = value
        else:
            raise MongoError(5788002, f"Unknown argument to {name} '{field}'")
    if n is MISSING:
        raise MongoError(5788003, "Missing value for 'n'")
    if output is MISSING:
        raise MongoError(5788004, "Missing value for 'output'")
    if sort_by is MISSING:
        raise MongoError(5788005, "Missing value for 'sortBy'")
    directions: list[bool] = []
    argument: dict[str, Any] = {"output": output}
    for field, direction in sort_by.items():
        if isinstance(direction, Mapping):
            raise MongoError(2, f"not supported by cdcserver's embedded store: {name} with a "
                             "$meta sortBy")
        number = numeric(direction)
        if number is None:
            raise MongoError(15974, "Illegal key in $sort specification: "
                             f"{field}: {value_string(direction)}")
        if number not in (1, -1):
            raise MongoError(15975, "$sort key ordering must be 1 (for ascending) or -1 (for "
                             "descending)")
        argument[f"sortFields{len(directions)}"] = f"${field}"
        directions.append(number < 0)
    frozen = tuple(directions)
    return (lambda n_value: kind(n_value, frozen)), argument, n


# -- parsing ---------------------------------------------------------------------------------

Parsed = tuple[Callable[[Any], Accumulator], Any, Any]


def _parse_n(name: str, arg: Any, code: int, factory: Callable[[Any], Accumulator]) -> Parsed:
    """AccumulatorN::parseArgs."""
    if not isinstance(arg, Mapping):
        raise MongoError(code, f"specification must be an object; found {name}: "
                         f"{value_string(arg)}")
    n: Any = MISSING
    argument: Any = MISSING
    for field, value in arg.items():
        if field == "input":
            argument = value
        elif field == "n":
            n = value
        else:
            raise MongoError(5787901, f"Unknown argument for 'n' operator: {field}")
    if n is MISSING:
        raise MongoError(5787906, "Missing value for 'n'")
    if argument is MISSING:
        raise MongoError(5787907, "Missing value for 'input'")
    return factory, argument, n


_SIMPLE: dict[str, Callable[[Any], Accumulator]] = {
    "$sum": Sum, "$avg": Avg, "$min": Min, "$max": Max, "$first": First, "$last": Last,
    "$push": Push, "$addToSet": AddToSet, "$mergeObjects": MergeObjects,
    "$stdDevPop": StdDevPop, "$stdDevSamp": StdDevSamp,
}
_N: dict[str, tuple[int, Callable[[Any], Accumulator]]] = {
    "$firstN": (5787801, FirstN), "$lastN": (5787801, LastN),
    "$minN": (5787900, MinN), "$maxN": (5787900, MaxN),
}


def parse(name: str, arg: Any) -> Parsed | None:
    """(factory, argument expression, initializer expression or None) for accumulator `name`,
    None when the name is not an accumulator this module has."""
    if name == "$sum" and type(arg) is float:
        addend = arg
        return (lambda _n: ConstantSum(addend)), arg, None
    simple = _SIMPLE.get(name)
    if simple is not None:
        return simple, arg, None
    if name == "$count":
        if not (isinstance(arg, Mapping) and not arg):
            raise MongoError(14, "$count takes no arguments, i.e. $count:{}")
        return Sum, 1, None
    n_form = _N.get(name)
    if n_form is not None:
        return _parse_n(name, arg, *n_form)
    if name in _TOP_BOTTOM:
        return _parse_top_bottom(name, arg)
    installed = _INSTALLED.get(name)
    if installed is not None:
        return installed(arg)
    if name in NOT_SUPPORTED:
        raise MongoError(2, f"not supported by cdcserver's embedded store: group operator "
                         f"'{name}'")
    return None


# Accumulators whose evaluation needs what pipeline_stages/ must not hold (the embedded store's
# JavaScript engine installs `$accumulator`): name -> its parse.
_INSTALLED: dict[str, Callable[[Any], Parsed]] = {}


def install(name: str, parse_spec: Callable[[Any], Parsed]) -> None:
    """Accumulator `name` parsed by `parse_spec(argument)` into (factory, argument,
    initializer), as this module's own are."""
    _INSTALLED[name] = parse_spec


# mongod 8.0's other accumulators, which this module does not compute yet (`$accumulator`
# until an engine installs it).
NOT_SUPPORTED = frozenset({
    "$median", "$percentile", "$accumulator",
})
