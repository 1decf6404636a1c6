"""`$densify` (document_source_densify.cpp) for the embedded store's aggregations.

mongod runs `$densify` as a `$sort` (by the partition fields, unless the bounds are "full", then
the field) and `$_internalDensify`, a streaming state machine that passes every input document
through and generates documents (the partition fields and the field) for the missing steps.
Which steps it generates, and where in the output, follows from that machine's states: the
value it remembers is the last one *on the step* (a document off the step does not move the
grid), "full" bounds run from the smallest value met to the greatest, "partition" bounds from
each partition's first value to its last, explicit `[lower, upper)` bounds from `lower` (the
upper bound excluded). This module runs the same machine, state for state, over the sorted
documents; documents whose field is missing or null pass through as they are.

One difference that no result can rely on: mongod keeps its partitions in a hash table, and
the documents it generates after the input ends ("full" and explicit bounds with partitions)
come out in that table's order; here they come out in the order the partitions were first
met.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Iterator, Mapping
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64

from pipeline_stages import window_stage
from pipeline_stages.errors import MongoError
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import type_name

__all__ = ["densify"]

STAGE = "$densify"

_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000,
             "day": 86_400_000, "week": 604_800_000}
_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_EPOCH = datetime.datetime(1970, 1, 1)
_DECIMAL128 = create_decimal128_context()
_NUMERIC_TYPES = "[long, int, decimal, double]"
_EOF = object()


# -- values ----------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


def _is_date(v: Any) -> bool:
    return isinstance(v, datetime.datetime)


def _ms(v: datetime.datetime) -> int:
    if v.tzinfo is not None:
        v = v.astimezone(datetime.UTC).replace(tzinfo=None)
    delta = v - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _exact(v: Any) -> decimal.Decimal:
    return v.to_decimal() if isinstance(v, Decimal128) else decimal.Decimal(v)


def _compare(a: Any, b: Any) -> int:
    """Value::compare of two numbers or two dates."""
    if _is_date(a):
        x, y = _ms(a), _ms(b)
        return (x > y) - (x < y)
    da, db = _exact(a), _exact(b)
    if da.is_nan() or db.is_nan():  # NaN is below every number
        return int(db.is_nan()) - int(da.is_nan())
    return (da > db) - (da < db)


def _int_type(v: Any) -> str:
    return "long" if isinstance(v, Int64) or not -(2**31) <= v < 2**31 else "int"


def _arith(a: Any, b: Any, sign: int) -> Any:
    """ExpressionAdd / ExpressionSubtract of two numbers, typed as mongod types them."""
    if isinstance(a, Decimal128) or isinstance(b, Decimal128):
        op = _DECIMAL128.add if sign > 0 else _DECIMAL128.subtract
        return Decimal128(op(_exact(a), _exact(b)))
    if isinstance(a, float) or isinstance(b, float):
        return float(a) + float(b) if sign > 0 else float(a) - float(b)
    result = int(a) + sign * int(b)
    if not -(2**63) <= result < 2**63:
        return float(int(a)) + sign * float(int(b))
    if _int_type(a) == "long" or _int_type(b) == "long" or not -(2**31) <= result < 2**31:
        return Int64(result)
    return result


def _date_add(date: datetime.datetime, unit: str, amount: int) -> datetime.datetime:
    if unit in _UNITS_MS:
        return _EPOCH + datetime.timedelta(milliseconds=_ms(date) + amount * _UNITS_MS[unit])
    total = date.year * 12 + date.month - 1 + amount * _MONTHS[unit]
    year, month = divmod(total, 12)
    nxt = datetime.date(year + (month == 11), (month + 1) % 12 + 1, 1)
    last = (nxt - datetime.timedelta(days=1)).day
    return date.replace(year=year, month=month + 1, day=min(date.day, last))


def _int_step(step: Any) -> int:
    return int(_exact(step))


# -- spec ------------------------------------------------------------------------------------


def _wrong_type(field: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '{field}' is the wrong type '{type_name(value)}', "
                      f"expected type '{expected}'")


class _Spec:
    __slots__ = ("bounds", "field", "partitions", "step", "unit")

    def __init__(self) -> None:
        self.field = ""
        self.partitions: list[str] = []
        self.step: Any = None
        self.unit: str | None = None
        self.bounds: Any = None  # "full" / "partition" / (lower, upper)


def _parse_range(spec: Any, parsed: _Spec) -> tuple[Any, Any]:
    """RangeSpec's IDL checks: (step, bounds)."""
    context = f"{STAGE}.range"
    if not isinstance(spec, Mapping):
        raise _wrong_type(context, spec, "object")
    bounds: Any = MISSING
    step: Any = MISSING
    for field, value in spec.items():
        if field == "step":
            if not _is_number(value):
                raise MongoError(14, f"BSON field '{context}.step' is the wrong type "
                                 f"'{type_name(value)}', expected types '{_NUMERIC_TYPES}'")
            step = value
        elif field == "unit":
            if not isinstance(value, str):
                raise _wrong_type(f"{context}.unit", value, "string")
            parsed.unit = value
        elif field == "bounds":
            bounds = value
        else:
            raise MongoError(40415, f"BSON field '{context}.{field}' is an unknown field.")
    for name, value in (("step", step), ("bounds", bounds)):
        if value is MISSING:
            raise MongoError(40414, f"BSON field '{context}.{name}' is missing but a required "
                             "field")
    return step, bounds


def _range_statement(step: Any, bounds: Any, parsed: _Spec) -> None:
    """RangeStatement::parse."""
    if _compare(step, 0) <= 0 or _exact(step).is_nan():
        raise MongoError(5733401, "The step parameter in a range statement must be a strictly "
                         "positive numeric value")
    parsed.step = step
    if parsed.unit is not None:
        d = _exact(step)
        if not d.is_finite() or d != d.to_integral_value() or not -(2**63) <= d < 2**63:
            raise MongoError(6586400, "The step parameter in a range statement must be a whole "
                             "number when densifying a date range")
        if parsed.unit not in _UNITS_MS and parsed.unit not in _MONTHS:
            raise MongoError(9, f"unknown time unit value: {parsed.unit}")
    if isinstance(bounds, list):
        if len(bounds) != 2:
            raise MongoError(5733403, "A bounding array in a range statement must have exactly "
                             "two elements")
        lower, upper = bounds
        if window_stage.sort_key({"v": upper}, "v") < window_stage.sort_key({"v": lower}, "v"):
            raise MongoError(5733402, "A bounding array must be an ascending array of either "
                             "two dates or two numbers")
        if _is_number(lower):
            if parsed.unit is not None:
                raise MongoError(5733409, "Numeric bounds may not have unit parameter")
            if not _is_number(upper):
                raise MongoError(5733406, "A bounding array must contain either both dates or "
                                 "both numeric types")
            if not type_name(lower) == type_name(upper) == type_name(step):
                raise MongoError(5876900, "Upper bound, lower bound, and step must all have the "
                                 "same type")
        elif _is_date(lower):
            if not _is_date(upper):
                raise MongoError(5733405, "A bounding array must contain either both dates or "
                                 "both numeric types")
            if parsed.unit is None:
                raise MongoError(5733410, "A bounding array of dates must specify a unit")
        else:
            raise MongoError(5946800, "Explicit bounds must be numeric or dates")
        parsed.bounds = (lower, upper)
    elif isinstance(bounds, str):
        if bounds not in ("full", "partition"):
            raise MongoError(5946802, "Bounds string must either be 'full' or 'partition'")
        parsed.bounds = bounds
    else:
        raise MongoError(5733404, "The bounds in a range statement must be the string 'full', "
                         "'partition', or an ascending array of two numbers or two dates")


def _parse(spec: Any) -> _Spec:
    if not isinstance(spec, Mapping):
        raise MongoError(9, f"The {STAGE} stage specification must be an object, found "
                         f"{type_name(spec)}")
    parsed = _Spec()
    field: Any = MISSING
    range_spec: tuple[Any, Any] | None = None
    for name, value in spec.items():
        if name == "field":
            if not isinstance(value, str):
                raise _wrong_type(f"{STAGE}.field", value, "string")
            field = value
        elif name == "partitionByFields":
            if not isinstance(value, list):
                raise _wrong_type(f"{STAGE}.partitionByFields", value, "array")
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise _wrong_type(f"{STAGE}.partitionByFields.{i}", item, "string")
            parsed.partitions = list(value)
        elif name == "range":
            range_spec = _parse_range(value, parsed)
        else:
            raise MongoError(40415, f"BSON field '{STAGE}.{name}' is an unknown field.")
    if field is MISSING:
        raise MongoError(40414, f"BSON field '{STAGE}.field' is missing but a required field")
    if range_spec is None:
        raise MongoError(40414, f"BSON field '{STAGE}.range' is missing but a required field")
    _range_statement(*range_spec, parsed)
    parsed.field = field
    if parsed.bounds == "partition" and not parsed.partitions:
        raise MongoError(5733408, "One cannot specify the bounds as 'partition' without "
                         "specifying a non-empty array of partitionByFields. You may have "
                         "meant to specify 'full' bounds.")
    return parsed


# -- the machine -----------------------------------------------------------------------------


def _path_value(doc: Any, path: str) -> Any:
    """Document::getNestedField: through embedded documents only."""
    value = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        sub = node.get(part)
        sub = dict(sub) if isinstance(sub, Mapping) else {}
        node[part] = sub
        node = sub
    node[parts[-1]] = value


class _Generator:
    """DocGenerator: `low`, `low + step`, ... below `high` (the first always), then the
    document it was made for, if any."""

    def __init__(self, machine: _Machine, low: Any, high: Any, include: dict[str, Any] | None,
                 final: Any) -> None:
        self.machine = machine
        self.low = low
        self.high = high
        self.include = include or {}
        self.final = final
        self.state = "generating"

    @property
    def done(self) -> bool:
        return self.state == "done"

    def next(self) -> Any:
        if self.state == "final":
            self.state = "done"
            return self.final
        value = self.low
        following = self.machine.increment(value)
        if self.machine.compare(self.high, following) <= 0:
            self.state = "final" if self.final is not None else "done"
        self.low = following
        doc = _copy(self.include)
        _set_path(doc, self.machine.field, value)
        return doc


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_copy(v) if isinstance(v, Mapping) else v) for k, v in doc.items()}


class _Machine:
    def __init__(self, spec: _Spec, docs: Iterator[Any]) -> None:
        self.spec = spec
        self.field = spec.field
        self.source = docs
        self.state = "uninitialized"
        self.current: Any = None
        self.global_min: Any = None
        self.global_max: Any = None
        self.partitioned = False  # mongod's _partitionExpr, set by the first valued document
        self.table: dict[bytes, tuple[dict[str, Any], Any]] = {}
        self.generator: _Generator | None = None
        self.eof = False

    # values

    def increment(self, value: Any) -> Any:
        if _is_date(value):
            assert self.spec.unit is not None
            return _date_add(value, self.spec.unit, _int_step(self.spec.step))
        return _arith(value, self.spec.step, +1)

    def decrement(self, value: Any) -> Any:
        if _is_date(value):
            assert self.spec.unit is not None
            return _date_add(value, self.spec.unit, -_int_step(self.spec.step))
        return _arith(value, self.spec.step, -1)

    @staticmethod
    def compare(a: Any, b: Any) -> int:
        return _compare(a, b)

    def on_step(self, value: Any, base: Any) -> bool:
        if _is_date(value):
            unit = self.spec.unit
            assert unit is not None
            step = _int_step(self.spec.step)
            if unit in _MONTHS:
                stepped = base
                while _compare(stepped, value) < 0:
                    stepped = _date_add(stepped, unit, step)
                return _compare(stepped, value) == 0
            return (_ms(value) - _ms(base)) % (step * _UNITS_MS[unit]) == 0
        diff = _arith(value, base, -1)
        step = self.spec.step
        if isinstance(diff, Decimal128) or isinstance(step, Decimal128):
            return _DECIMAL128.remainder(_exact(diff), _exact(step)) == 0
        if isinstance(diff, float) or isinstance(step, float):
            return math.fmod(float(diff), float(step)) == 0.0
        return int(diff) % int(step) == 0

    def value_of(self, doc: Any) -> Any:
        """getDensifyValue."""
        value = _path_value(doc, self.field)
        if not (_is_number(value) or _is_date(value)):
            raise MongoError(5733201, "Densify field type must be numeric or a date")
        if self.spec.unit is None and not _is_number(value) or (
            self.spec.unit is not None and not _is_date(value)
        ):
            raise MongoError(6053600, "Encountered numeric densify value in collection when "
                             "step has a date unit." if _is_number(value) else "Encountered "
                             "date densify value in collection when step does not have a date "
                             "unit.")
        return value

    def nullish(self, doc: Any) -> bool:
        value = _path_value(doc, self.field)
        return value is MISSING or value is None

    # partitions

    def partition_of(self, doc: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        for path in self.spec.partitions:
            _set_path(spec, path, "$" + path)
        value = window_stage.evaluate_each(spec, [doc])[0]
        return value if isinstance(value, dict) else {}

    def partition_key(self, doc: Any) -> bytes:
        return window_stage.sort_key({"p": self.partition_of(doc)}, "p")

    def remember(self, doc: Any) -> None:
        """setPartitionValue."""
        if self.partitioned:
            key = self.partition_key(doc)
            self.table[key] = (self.partition_of(doc), self.value_of(doc))

    def lookup(self, doc: Any) -> Any:
        found = self.table.get(self.partition_key(doc))
        return MISSING if found is None else found[1]

    def include(self, doc: Any) -> dict[str, Any] | None:
        return self.partition_of(doc) if self.partitioned else None

    # steps

    def run(self) -> list[Any]:
        out: list[Any] = []
        while True:
            doc = self.step()
            if doc is _EOF:
                return out
            out.append(doc)

    def pull(self) -> Any:
        return next(self.source, _EOF)

    def step(self) -> Any:
        bounds = self.spec.bounds
        if self.state == "uninitialized":
            doc = self.pull()
            if doc is _EOF:
                return self.exhausted()
            if self.nullish(doc):
                return doc
            value = self.value_of(doc)
            if self.spec.partitions and not self.partitioned:
                self.partitioned = True
                self.remember(doc)
            if bounds == "full":
                self.current = self.global_min = self.global_max = value
                self.state = "need"
                return doc
            if bounds == "partition":
                self.state = "need"
                return doc
            return self.first_in_range(doc)
        if self.state == "need":
            doc = self.pull()
            if doc is _EOF:
                return self.exhausted()
            if self.nullish(doc):
                return doc
            value = self.value_of(doc)
            if bounds == "full":
                if self.partitioned:
                    self.global_max = value
                    last = self.lookup(doc)
                    if last is MISSING:
                        self.current = self.decrement(self.global_min)
                        self.remember(doc)
                        return self.need_gen(doc)
                    self.current = last
                return self.need_gen(doc)
            if bounds == "partition":
                last = self.lookup(doc)
                if last is MISSING:
                    self.remember(doc)
                    return doc
                self.current = last
                return self.need_gen(doc)
            if self.partitioned:
                last = self.lookup(doc)
                if last is MISSING:
                    self.remember(doc)
                    self.current = None
                    return self.first_in_range(doc)
                self.current = last
            return self.need_gen_explicit(doc)
        if self.state == "generating":
            assert self.generator is not None
            generated = self.generator.next()
            if bounds in ("full", "partition"):
                if self.generator.done:
                    self.generator = None
                    self.state = "finishing" if (
                        bounds == "full" and self.eof and self.partitioned) else "need"
                value = self.value_of(generated)
                if _compare(value, self.increment(self.current)) == 0:
                    self.current = value
                    self.remember(generated)
                return generated
            value = self.value_of(generated)
            if self.on_step(value, self.current):
                self.current = value
                self.remember(generated)
            self.reset_generator()
            return generated
        if self.state == "finishing":
            return self.finish_partitions()
        return self.pull()  # done: the rest passes through

    def position(self, value: Any) -> str:
        lower, upper = self.spec.bounds
        c = _compare(value, lower)
        if c < 0:
            return "below"
        if c == 0:
            return "min"
        return "inside" if _compare(value, upper) < 0 else "above"

    def first_in_range(self, doc: Any) -> Any:
        """processFirstDocForExplicitRange."""
        lower = self.spec.bounds[0]
        value = self.value_of(doc)
        if self.current is None:
            self.current = self.decrement(lower)
        where = self.position(value)
        if where in ("inside", "above"):
            return self.above_min(doc)
        if where == "min":
            self.state = "need"
            self.current = value
            return doc
        self.state = "uninitialized"
        return doc

    def above_min(self, doc: Any) -> Any:
        """processDocAboveExplicitMinBound."""
        upper = self.spec.bounds[1]
        value = self.value_of(doc)
        low = self.increment(self.current)
        if _compare(value, low) == 0:
            self.remember(doc)
            self.current = low
            return doc
        high = value if _compare(value, upper) < 0 else upper
        self.generator = _Generator(self, low, high, self.include(doc), doc)
        generated = self.generator.next()
        self.current = self.value_of(generated)
        self.state = "generating"
        self.reset_generator()
        self.remember(generated)
        return generated

    def reset_generator(self) -> None:
        """resetDocGen."""
        assert self.generator is not None
        if self.generator.done:
            upper = self.spec.bounds[1]
            if _compare(self.current, upper) >= 0 and not self.partitioned:
                self.state = "done"
            elif self.partitioned and self.eof:
                self.state = "finishing"
            else:
                self.state = "need"
            self.generator = None

    def need_gen(self, doc: Any) -> Any:
        """handleNeedGen ("full" and "partition" bounds)."""
        value = self.value_of(doc)
        following = self.increment(self.current)
        if _compare(value, following) == 0:
            self.remember(doc)
            self.current = value
        if _compare(value, following) <= 0:
            return doc
        self.generator = _Generator(self, following, value, self.include(doc), doc)
        self.state = "generating"
        generated = self.generator.next()
        if self.generator.done:
            self.generator = None
            self.state = "need"
        self.current = self.value_of(generated)
        self.remember(generated)
        return generated

    def need_gen_explicit(self, doc: Any) -> Any:
        """handleNeedGenExplicit."""
        value = self.value_of(doc)
        where = self.position(value)
        if where == "inside":
            following = self.increment(self.current)
            if _compare(value, following) == 0:
                self.current = value
                self.remember(doc)
                return doc
            if _compare(value, following) < 0:
                return doc
            return self.above_min(doc)
        if where == "above":
            following = self.increment(self.current)
            if _compare(following, self.spec.bounds[1]) >= 0:
                self.current = following
                self.remember(doc)
                if not self.partitioned:
                    self.state = "done"
                return doc
            return self.above_min(doc)
        if where == "min":
            self.remember(doc)
            self.current = value
            return doc
        self.remember(doc)
        self.state = "uninitialized"
        return doc

    def exhausted(self) -> Any:
        """handleSourceExhausted."""
        self.eof = True
        bounds = self.spec.bounds
        if bounds == "partition" or (bounds == "full" and not self.partitioned):
            self.state = "done"
            return _EOF
        if self.partitioned:
            return self.finish_partitions()
        lower, upper = bounds
        if self.current is None:
            self.current = lower
            self.generator = _Generator(self, lower, upper, None, None)
        elif _compare(self.increment(self.current), upper) >= 0:
            self.state = "done"
            return _EOF
        else:
            self.generator = _Generator(self, self.increment(self.current), upper, None, None)
        self.state = "generating"
        generated = self.generator.next()
        if self.generator.done:
            self.state = "done"
            self.generator = None
        return generated

    def finish_partitions(self) -> Any:
        """finishDensifyingPartitionedInput."""
        if not self.table:
            self.state = "done"
            return _EOF
        bounds = self.spec.bounds
        minimum: Any = None
        if bounds == "full":
            top = self.global_max
            maximum = self.increment(top) if self.on_step(top, self.current) else top
        else:
            minimum, maximum = bounds
        while self.table:
            key = next(iter(self.table))
            include, last = self.table.pop(key)
            low = self.increment(last)
            if _compare(low, maximum) >= 0:
                continue
            if minimum is not None and _compare(low, minimum) < 0:
                low = minimum
            self.generator = _Generator(self, low, maximum, include, None)
            self.state = "generating"
            generated = self.generator.next()
            if self.generator.done:
                self.generator = None
                self.state = "finishing"
            return generated
        self.state = "done"
        return _EOF


def densify(docs: list[Any], spec: Any) -> list[Any]:
    """The documents out of `{$densify: spec}`."""
    parsed = _parse(spec)
    order = list(range(len(docs)))
    paths = ([] if parsed.bounds == "full" else parsed.partitions) + [parsed.field]
    for path in reversed(paths):
        keys = [window_stage.sort_key(doc, path) for doc in docs]
        order.sort(key=keys.__getitem__)
    return _Machine(parsed, iter([docs[i] for i in order])).run()
