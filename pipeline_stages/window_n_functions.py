"""The `n` window functions and the covariances of `$setWindowFields`, as mongod 8.0 computes
them (window_function_expression.cpp ExpressionN, window_function_first_last_n.h,
window_function_min_max.h, window_function_top_bottom_n.h, window_function_covariance.cpp,
accumulator_covariance.cpp).

`$firstN $lastN $minN $maxN $topN $bottomN $top $bottom`: the argument parsed as `$group`
parses it (accumulators.py, with its errors), then `window` once; anything else is "<name> got
unexpected argument". `n` is evaluated on an empty document when the stage runs (a path is
MISSING, refused by validateN). A left-unbounded window feeds accumulators.py's accumulator in
document order (mongod's non-removable executor). A bounded one reproduces the removable
window functions, which hold every value of the window:

- `$firstN` / `$lastN`: the first (last) n values of the window; a missing one takes its place
  among the n but is left out of the array (an array does not hold a missing value);
- `$minN` / `$maxN`: the non-null values in order, equal values in window order (the multiset);
  `$maxN` reads it backwards, so equal values come latest first;
- `$topN` / `$bottomN` / `$top` / `$bottom`: the window's outputs (missing as null) ordered by
  their sortBy key, ties in window order, the first n (top) or the last n (bottom).

An empty window gives `[]` (`$top` / `$bottom`: null).

`$covariancePop` / `$covarianceSamp` (`[x, y]`): WindowFunctionCovariance, which both the
accumulator and the removable window use: pairs of two numbers only; the online co-moment
with the means and the co-moment sum kept as WindowFunctionAvg / WindowFunctionSum keep them
(their sums exact, read rounded to a double), a NaN or an infinite pair counted apart (and
forgotten when the last finite pair leaves the window), values added then removed in the
executors' order. One pair: 0.0 (pop) / null (samp). Decimal128 inputs are not supported
(code 2).

Pure and synchronous; installed into window_stage.py by `install()`.
"""

from __future__ import annotations

import copy
import fractions
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from pipeline_stages import accumulators, group_stage, window_stage
from pipeline_stages.accumulators import MISSING, order_key
from pipeline_stages.errors import MongoError

__all__ = ["install"]

_N_NAMES = ("$firstN", "$lastN", "$minN", "$maxN", "$topN", "$bottomN", "$top", "$bottom")
_COVARIANCES = ("$covariancePop", "$covarianceSamp")


# -- the n functions -------------------------------------------------------------------------


class _NSpec:
    __slots__ = ("factory", "n")

    def __init__(self, factory: Callable[[Any], accumulators.Accumulator], n: Any) -> None:
        self.factory, self.n = factory, n


def _parse_n(obj: Mapping[str, Any], sort: Any) -> Any:
    """ExpressionN::parse."""
    name = next(k for k in obj if isinstance(k, str) and k.startswith("$"))
    spec: _NSpec | None = None
    argument: Any = None
    bounds = None
    for field, value in obj.items():
        if field == name:
            parsed = accumulators.parse(name, value)
            assert parsed is not None
            factory, argument, n = parsed
            spec = _NSpec(factory, n)
        elif field == "window":
            bounds = window_stage._parse_bounds(value, sort)
        else:
            raise window_stage._fail(f"{name} got unexpected argument: {field}")
    assert spec is not None
    function = window_stage._Function(name, argument, bounds or window_stage._DEFAULT)
    function.option = spec
    return function


def _n_value(spec: _NSpec) -> Any:
    return group_stage.compile_expression(spec.n)({})


def _outputs_n(function: Any, part: Any) -> list[Any]:
    spec: _NSpec = function.option
    n_value = _n_value(spec)
    probe = spec.factory(n_value)  # validateN, when the stage runs
    n: int = probe.n  # type: ignore[attr-defined]
    values = window_stage.evaluate_each(function.input, part.docs)
    bounds = function.bounds
    windows = [part.window(bounds, i) for i in range(len(part.docs))]
    if not bounds.removable:
        return _non_removable(spec, n_value, values, windows)
    single = function.name in ("$top", "$bottom")
    out: list[Any] = []
    for window in windows:
        inside = [] if window is None else values[window[0]:window[1] + 1]
        result = _removable(function.name, getattr(probe, "directions", ()), n, inside)
        out.append((result[0] if result else None) if single else result)
    return out


def _non_removable(spec: _NSpec, n_value: Any, values: list[Any],
                   windows: list[tuple[int, int] | None]) -> list[Any]:
    """The accumulator fed the window's values in order (the window grows at its end)."""
    acc = spec.factory(n_value)
    fed = 0
    out: list[Any] = []
    cache: tuple[int, Any] | None = None
    for window in windows:
        end = -1 if window is None else window[1]
        while fed <= end:
            if acc.needs_input:
                acc.process(values[fed])
            fed += 1
        if cache is None or cache[0] != fed:
            cache = (fed, acc.result())
        out.append(copy.deepcopy(cache[1]))
    return out


def _removable(name: str, directions: tuple[bool, ...], n: int, inside: list[Any]) -> list[Any]:
    if name == "$firstN":
        return [v for v in inside[:n] if v is not MISSING]
    if name == "$lastN":
        return [v for v in inside[-n:] if v is not MISSING]
    if name in ("$minN", "$maxN"):
        present = [v for v in inside if v is not MISSING and v is not None]
        ordered = sorted(present, key=order_key)  # stable: equal values in window order
        return ordered[:n] if name == "$minN" else ordered[::-1][:n]
    keyed = []
    for value in inside:
        fields = value if isinstance(value, Mapping) else {}
        output = fields.get("output", MISSING)
        key = [accumulators._sort_field_key(fields.get(f"sortFields{i}", MISSING), descending)
               for i, descending in enumerate(directions)]
        keyed.append((key, None if output is MISSING else output))

    def compare(a: tuple[list[bytes], Any], b: tuple[list[bytes], Any]) -> int:
        for x, y, descending in zip(a[0], b[0], directions):
            if x != y:
                return (1 if x > y else -1) * (-1 if descending else 1)
        return 0

    keyed.sort(key=functools.cmp_to_key(compare))  # stable: ties in window order
    chosen = keyed[:n] if name in ("$topN", "$top") else keyed[-n:]
    return [output for _, output in chosen]


# -- $covariancePop, $covarianceSamp ---------------------------------------------------------


def _is_number(v: Any) -> bool:
    return accumulators.numeric(v) is not None


def _finite(v: Any) -> bool:
    return math.isfinite(float(v)) if isinstance(v, float) else True


class _Mean:
    """WindowFunctionAvg over finite non-decimal numbers: the exact sum, read as a double."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.total = fractions.Fraction(0)
        self.count = 0

    def add(self, v: Any, quantity: int) -> None:
        self.total += quantity * fractions.Fraction(int(v) if isinstance(v, Int64) else v)
        self.count += quantity

    def value(self) -> float | None:
        if self.count == 0:
            return None
        return float(self.total) / float(self.count)


class _Covariance:
    """WindowFunctionCovariance."""

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.mean_x, self.mean_y = _Mean(), _Mean()
        self.co_moment = fractions.Fraction(0)
        self.nan = self.pos_inf = self.neg_inf = 0

    def _non_finite(self, x: Any, y: Any, quantity: int) -> None:
        nans = sum(1 for v in (x, y) if isinstance(v, float) and math.isnan(v))
        pos = sum(1 for v in (x, y) if isinstance(v, float) and v == math.inf)
        neg = sum(1 for v in (x, y) if isinstance(v, float) and v == -math.inf)
        if nans or (pos and neg):
            self.nan += quantity
        elif pos:
            self.pos_inf += quantity
        else:
            self.neg_inf += quantity

    def update(self, pair: Any, quantity: int) -> None:
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_number(v) for v in pair)):
            return
        x, y = pair
        if isinstance(x, Decimal128) or isinstance(y, Decimal128):
            raise MongoError(2, "not supported by cdcserver's embedded store: Decimal128 "
                             "inputs to $covariancePop / $covarianceSamp in $setWindowFields")
        if not (_finite(x) and _finite(y)):
            self._non_finite(x, y, quantity)
            return
        if quantity > 0:
            self.count += 1
            mean = self.mean_x.value()
            delta_x = None if mean is None else float(x) - mean
            self.mean_x.add(x, 1)
            self.mean_y.add(y, 1)
            mean_y = self.mean_y.value()
            assert mean_y is not None
            delta_y = float(y) - mean_y
            if delta_x is not None:
                self.co_moment += fractions.Fraction(delta_x * delta_y)
            return
        self.count -= 1
        if self.count == 0:
            self.reset()
            return
        self.mean_x.add(x, -1)
        mean_x, mean_y = self.mean_x.value(), self.mean_y.value()
        assert mean_x is not None and mean_y is not None
        self.co_moment -= fractions.Fraction((float(x) - mean_x) * (float(y) - mean_y))
        self.mean_y.add(y, -1)

    def value(self) -> Any:
        if self.count == 1 and not self.sample:
            return 0.0
        adjusted = self.count - 1 if self.sample else self.count
        if adjusted <= 0:
            return None
        if self.nan or (self.pos_inf and self.neg_inf):
            total = math.nan
        elif self.pos_inf or self.neg_inf:
            total = math.inf if self.pos_inf else -math.inf
        else:
            total = float(self.co_moment)
        return total / float(adjusted)


def _outputs_covariance(function: Any, part: Any) -> list[Any]:
    """Per document, the values entering the window added (in order), then those leaving it
    removed (oldest first), as the executors do."""
    values = window_stage.evaluate_each(function.input, part.docs)
    state = _Covariance(function.name == "$covarianceSamp")
    out: list[Any] = []
    previous: tuple[int, int] | None = None
    for i in range(len(part.docs)):
        window = part.window(function.bounds, i)
        if previous is None:
            added, removed = window, None
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


def install() -> None:
    """Install these window functions into window_stage.py (idempotent)."""
    for name in _N_NAMES:
        window_stage.install(name, _parse_n, _outputs_n)
    for name in _COVARIANCES:
        window_stage.install(name, window_stage._parse_accumulator, _outputs_covariance)
