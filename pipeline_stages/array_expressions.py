"""Array and set aggregation expressions, evaluated with mongod 8.0's semantics and errors
(exec/expression evaluate_array.cpp, expression.cpp, accumulator_multi.cpp), where mongomock
lacks them or differs: `$firstN`, `$lastN`, `$maxN`, `$minN` (expression forms),
`$sortArray`, `$reverseArray`, `$zip`, `$range`, `$indexOfArray`, `$arrayToObject`,
`$objectToArray`, `$mergeObjects`, `$allElementsTrue`, `$anyElementTrue`, the five set
operators, `$concatArrays`, `$slice`, `$arrayElemAt`, `$first`, `$last`.

Values compare as mongod's simple ValueComparator does (BSON order, 1 == 1.0 == 1L), through
their KeyString bytes, which sort exactly so. Collations are not applied here.

Installed into the expression parser by expressions.py (`OPERATORS`). Pure and synchronous.
"""

from __future__ import annotations

import bisect
import decimal
from collections.abc import Callable, Mapping
from typing import Any

from bson.decimal128 import Decimal128

from pipeline_stages import keystring
from pipeline_stages.date_expressions import MISSING, missing_type_name, nullish
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string, type_name, value_string

__all__ = ["MISSING", "OPERATORS", "integral32", "is_numeric", "operands", "sort_key",
           "value"]


# -- evaluation helpers (shared with math_expressions.py) -----------------------------------------


def value(parser: Any, expression: Any) -> Any:
    """An operand's value, MISSING for a missing path. Array and object literals are evaluated
    here, element by element, as ExpressionArray / ExpressionObject do (mongomock returns an
    array literal unevaluated): a missing element is null, a missing field is left out."""
    if isinstance(expression, list):
        return [None if v is MISSING else v for v in (value(parser, e) for e in expression)]
    if isinstance(expression, Mapping) and expression and not any(
            k.startswith("$") for k in expression):
        out = {}
        for key, sub in expression.items():
            v = value(parser, sub)
            if v is not MISSING:
                out[key] = v
        return out
    try:
        return parser.parse(expression)
    except KeyError:
        return MISSING


def operands(name: str, spec: Any, low: int, high: int | None = None) -> list[Any]:
    """ExpressionNary's arguments: the elements of an array operand, else the operand alone;
    `high` None means exactly `low`, -1 means no upper bound."""
    args = list(spec) if isinstance(spec, list) else [spec]
    n = len(args)
    if high is None:
        if n != low:
            raise MongoError(16020, f"Expression {name} takes exactly {low} arguments. {n} were "
                             "passed in.")
    elif high >= 0 and not low <= n <= high:
        raise MongoError(28667, f"Expression {name} takes at least {low} arguments, and at "
                         f"most {high}, but {n} were passed in.")
    return args


def is_numeric(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


def _as_decimal(v: Any) -> decimal.Decimal:
    if isinstance(v, Decimal128):
        return v.to_decimal()
    return decimal.Decimal(v)


def integral32(v: Any) -> int | None:
    """Value::integral(): a number whose value is a whole 32-bit integer, as that int."""
    if not is_numeric(v):
        return None
    if isinstance(v, float):
        ok = v == v and v not in (float("inf"), float("-inf")) and v.is_integer()
        n = int(v) if ok else None
    elif isinstance(v, Decimal128):
        d = v.to_decimal()
        n = int(d) if d.is_finite() and d == d.to_integral_value() else None
    else:
        n = int(v)
    return n if n is not None and -(2**31) <= n < 2**31 else None


def sort_key(v: Any) -> bytes:
    """Bytes that order values as BSON comparison does (and are equal for equal values)."""
    return keystring.encode_values([None if v is MISSING else v])[0]


def _double(v: Any) -> float:
    return float(v.to_decimal()) if isinstance(v, Decimal128) else float(v)


# -- element access --------------------------------------------------------------------------


def _elem_at(name: str, array: Any, index: Any, arity: int) -> Any:
    if nullish(array) or nullish(index):
        return None
    if not isinstance(array, list):
        which = "argument" if arity == 1 else "first argument"
        raise MongoError(28689, f"{name}'s {which} must be an array, but is "
                         f"{missing_type_name(array)}")
    if not is_numeric(index):
        raise MongoError(28690, f"{name}'s second argument must be a numeric value, but is "
                         f"{missing_type_name(index)}")
    i = integral32(index)
    if i is None:
        raise MongoError(28691, f"{name}'s second argument must be representable as a 32-bit "
                         f"integer: {value_string(_double(index))}")
    if i < 0:
        i += len(array)
    return array[i] if 0 <= i < len(array) else MISSING


def _array_elem_at(parser: Any, spec: Any) -> Any:
    array, index = (value(parser, a) for a in operands("$arrayElemAt", spec, 2))
    return _elem_at("$arrayElemAt", array, index, 2)


def _first_last(name: str) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        (arg,) = operands(name, spec, 1)
        return _elem_at(name, value(parser, arg), 0 if name == "$first" else -1, 1)
    return evaluate


def _slice(parser: Any, spec: Any) -> Any:
    args = operands("$slice", spec, 2, 3)
    array, second = value(parser, args[0]), value(parser, args[1])
    if nullish(array) or nullish(second):
        return None
    if not isinstance(array, list):
        raise MongoError(28724, "First argument to $slice must be an array, but is of type: "
                         f"{missing_type_name(array)}")
    if not is_numeric(second):
        raise MongoError(28725, "Second argument to $slice must be a numeric value, but is of "
                         f"type: {missing_type_name(second)}")
    first_int = integral32(second)
    if first_int is None:
        raise MongoError(28726, "Second argument to $slice can't be represented as a 32-bit "
                         f"integer: {value_string(_double(second))}")
    size = len(array)
    if len(args) == 2:
        return array[:first_int] if first_int >= 0 else array[max(0, size + first_int):]
    start = max(0, size + first_int) if first_int < 0 else min(size, first_int)
    count = value(parser, args[2])
    if nullish(count):
        return None
    if not is_numeric(count):
        raise MongoError(28727, "Third argument to $slice must be numeric, but is of type: "
                         f"{missing_type_name(count)}")
    n = integral32(count)
    if n is None:
        raise MongoError(28728, "Third argument to $slice can't be represented as a 32-bit "
                         f"integer: {value_string(_double(count))}")
    if n <= 0:
        raise MongoError(28729, f"Third argument to $slice must be positive: {n}")
    return array[start:start + n]


def _concat_arrays(parser: Any, spec: Any) -> Any:
    out: list[Any] = []
    for arg in operands("$concatArrays", spec, 0, -1):
        v = value(parser, arg)
        if nullish(v):
            return None
        if not isinstance(v, list):
            raise MongoError(28664, f"$concatArrays only supports arrays, not "
                             f"{missing_type_name(v)}")
        out.extend(v)
    return out


def _reverse_array(parser: Any, spec: Any) -> Any:
    (arg,) = operands("$reverseArray", spec, 1)
    v = value(parser, arg)
    if nullish(v):
        return None
    if not isinstance(v, list):
        raise MongoError(34435, "The argument to $reverseArray must be an array, but was of "
                         f"type: {missing_type_name(v)}")
    return v[::-1]


def _index_of_array(parser: Any, spec: Any) -> Any:
    name = "$indexOfArray"
    args = operands(name, spec, 2, 4)
    array = value(parser, args[0])
    if nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40090, f"{name} requires an array as a first argument, found: "
                         f"{missing_type_name(array)}")
    bounds = [0, len(array)]
    for position, which in ((2, "starting index"), (3, "ending index")):
        if len(args) <= position:
            continue
        v = value(parser, args[position])
        n = integral32(v)
        if n is None:  # the missing space is mongod's
            raise MongoError(40096, f"{name}requires an integral {which}, found a value of "
                             f"type: {missing_type_name(v)}, with value: "
                             f"{'MISSING' if v is MISSING else value_string(v)}")
        if n < 0:
            raise MongoError(40097, f"{name} requires a nonnegative {which}, found: "
                             f"{value_string(v)}")
        bounds[position - 2] = n if position == 2 else min(len(array), n)
    target = sort_key(value(parser, args[1]))
    for i in range(bounds[0], bounds[1]):
        if sort_key(array[i]) == target:
            return i
    return -1


def _range(parser: Any, spec: Any) -> Any:
    args = operands("$range", spec, 2, 3)
    numbers = []
    for v, which, codes in ((value(parser, args[0]), "starting", (34443, 34444)),
                            (value(parser, args[1]), "ending", (34445, 34446))):
        if not is_numeric(v):
            raise MongoError(codes[0], f"$range requires a numeric {which} value, found value "
                             f"of type: {missing_type_name(v)}")
        n = integral32(v)
        if n is None:
            article = "a" if which == "starting" else "an"
            raise MongoError(codes[1], f"$range requires {article} {which} value that can be "
                             f"represented as a 32-bit integer, found value: {value_string(v)}")
        numbers.append(n)
    step = 1
    if len(args) == 3:
        v = value(parser, args[2])
        if not is_numeric(v):
            raise MongoError(34447, "$range requires a numeric step value, found value of "
                             f"type:{missing_type_name(v)}")
        n = integral32(v)
        if n is None:
            raise MongoError(34448, "$range requires a step value that can be represented as a "
                             f"32-bit integer, found value: {value_string(v)}")
        if n == 0:
            raise MongoError(34449, "$range requires a non-zero step value")
        step = n
    start, end = numbers
    steps = abs(end - start) // abs(step) * (1 if (end - start) * step >= 0 else -1)
    length = 1 + steps if steps >= 0 else 0  # C++'s truncating division, as mongod counts
    limit = 104_857_600  # internalQueryMaxRangeBytes
    needed = 24 + length * 16  # sizeof(std::vector<Value>) + length * sizeof(Value)
    if needed >= limit:
        raise MongoError(146, f"$range would use too much memory ({needed} bytes) and cannot "
                         f"spill to disk. Memory limit: {limit} bytes")
    return list(range(start, end, step))


# -- objects ----------------------------------------------------------------------------------


def _object_to_array(parser: Any, spec: Any) -> Any:
    (arg,) = operands("$objectToArray", spec, 1)
    v = value(parser, arg)
    if nullish(v):
        return None
    if not isinstance(v, Mapping):
        raise MongoError(40390, "$objectToArray requires a document input, found: "
                         f"{missing_type_name(v)}")
    return [{"k": k, "v": item} for k, item in v.items()]


def _array_to_object(parser: Any, spec: Any) -> Any:
    (arg,) = operands("$arrayToObject", spec, 1)
    array = value(parser, arg)
    if nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40386, "$arrayToObject requires an array input, found: "
                         f"{missing_type_name(array)}")
    out: dict[str, Any] = {}
    if not array:
        return out
    pairs = isinstance(array[0], list)
    if not pairs and not isinstance(array[0], Mapping):
        raise MongoError(40398, "Unrecognised input type format for $arrayToObject: "
                         f"{missing_type_name(array[0])}")
    for elem in array:
        if pairs:
            if not isinstance(elem, list):
                raise MongoError(40396, "$arrayToObject requires a consistent input format. "
                                 "Elements mustall be arrays or all be objects. Array was "
                                 f"detected, now found: {missing_type_name(elem)}")
            if len(elem) != 2:
                raise MongoError(40397, "$arrayToObject requires an array of size 2 arrays,"
                                 f"found array of size: {len(elem)}")
            key, item = elem
            if not isinstance(key, str):
                raise MongoError(40395, "$arrayToObject requires an array of key-value pairs, "
                                 "where the key must be of type string. Found key type: "
                                 f"{missing_type_name(key)}")
            if "\0" in key:
                raise MongoError(4940400, "Key field cannot contain an embedded null byte")
        else:
            if not isinstance(elem, Mapping):
                raise MongoError(40391, "$arrayToObject requires a consistent input format. "
                                 "Elements mustall be arrays or all be objects. Object was "
                                 f"detected, now found: {missing_type_name(elem)}")
            if len(elem) != 2:
                raise MongoError(40392, "$arrayToObject requires an object keys of 'k' and "
                                 f"'v'. Found incorrect number of keys:{len(elem)}")
            if "k" not in elem or "v" not in elem:
                raise MongoError(40393, "$arrayToObject requires an object with keys 'k' and "
                                 "'v'. Missing either or both keys from: "
                                 f"{value_string(elem)}")
            key, item = elem["k"], elem["v"]
            if not isinstance(key, str):
                raise MongoError(40394, "$arrayToObject requires an object with keys 'k' and "
                                 "'v', where the value of 'k' must be of type string. Found "
                                 f"type: {missing_type_name(key)}")
            if "\0" in key:
                raise MongoError(4940401, "Key field cannot contain an embedded null byte")
        out[key] = item  # a repeated key keeps its first position, takes the last value
    return out


def _merge_objects(parser: Any, spec: Any) -> Any:
    out: dict[str, Any] = {}
    for arg in operands("$mergeObjects", spec, 0, -1):
        v = value(parser, arg)
        if nullish(v):
            continue
        if not isinstance(v, Mapping):
            raise MongoError(40400, f"$mergeObjects requires object inputs, but input "
                             f"{value_string(v)} is of type {missing_type_name(v)}")
        for key, item in v.items():
            out[key] = item
    return out


# -- booleans and sets ------------------------------------------------------------------------


def _truthy(v: Any) -> bool:
    """Value::coerceToBool."""
    if nullish(v) or v is False:
        return False
    if is_numeric(v):
        return _double(v) != 0 if not isinstance(v, Decimal128) else not v.to_decimal().is_zero()
    return True


def _elements_true(name: str, code: int) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        (arg,) = operands(name, spec, 1)
        v = value(parser, arg)
        if not isinstance(v, list):
            raise MongoError(code, f"{name}'s argument must be an array, but is "
                             f"{missing_type_name(v)}")
        if name == "$allElementsTrue":
            return all(_truthy(x) for x in v)
        return any(_truthy(x) for x in v)
    return evaluate


def _ordered_set(values: list[Any]) -> dict[bytes, Any]:
    """A ValueSet: the first of equal values, in BSON order."""
    seen: dict[bytes, Any] = {}
    for v in values:
        seen.setdefault(sort_key(v), v)
    return dict(sorted(seen.items()))


def _set_union(parser: Any, spec: Any) -> Any:
    union: list[Any] = []
    for arg in operands("$setUnion", spec, 0, -1):
        v = value(parser, arg)
        if nullish(v):
            return None
        if not isinstance(v, list):
            raise MongoError(17043, "All operands of $setUnion must be arrays. One argument is "
                             f"of type: {missing_type_name(v)}")
        union.extend(v)
    return list(_ordered_set(union).values())


def _set_intersection(parser: Any, spec: Any) -> Any:
    current: dict[bytes, Any] | None = None
    for arg in operands("$setIntersection", spec, 0, -1):
        v = value(parser, arg)
        if nullish(v):
            return None
        if not isinstance(v, list):
            raise MongoError(17047, "All operands of $setIntersection must be arrays. One "
                             f"argument is of type: {missing_type_name(v)}")
        if current is None:
            current = _ordered_set(v)
        elif current:
            other = _ordered_set(v)
            if len(current) > len(other):  # the smaller set's values are kept
                current, other = other, current
            current = {k: x for k, x in current.items() if k in other}
    return list((current or {}).values())


def _set_difference(parser: Any, spec: Any) -> Any:
    lhs, rhs = (value(parser, a) for a in operands("$setDifference", spec, 2))
    if nullish(lhs) or nullish(rhs):
        return None
    for v, which, code in ((lhs, "First", 17048), (rhs, "Second", 17049)):
        if not isinstance(v, list):
            raise MongoError(code, f"both operands of $setDifference must be arrays. {which} "
                             f"argument is of type: {missing_type_name(v)}")
    seen = {sort_key(x) for x in rhs}
    out = []
    for x in lhs:
        key = sort_key(x)
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def _set_equals(parser: Any, spec: Any) -> Any:
    args = spec if isinstance(spec, list) else [spec]
    if len(args) < 2:
        raise MongoError(17045, f"$setEquals needs at least two arguments had: {len(args)}")
    sets = []
    for i, arg in enumerate(args):
        v = value(parser, arg)
        if not isinstance(v, list):
            raise MongoError(17044, f"All operands of $setEquals must be arrays. {i + 1}-th "
                             f"argument is of type: {missing_type_name(v)}")
        sets.append({sort_key(x) for x in v})
    return all(s == sets[0] for s in sets[1:])


def _set_is_subset(parser: Any, spec: Any) -> Any:
    args = operands("$setIsSubset", spec, 2)
    lhs = value(parser, args[0])
    if not isinstance(lhs, list):
        raise MongoError(17046, "both operands of $setIsSubset must be arrays. First argument "
                         f"is of type: {missing_type_name(lhs)}")
    rhs = value(parser, args[1])
    if not isinstance(rhs, list):
        raise MongoError(17042, "both operands of $setIsSubset must be arrays. Second argument "
                         f"is of type: {missing_type_name(rhs)}")
    keys = {sort_key(x) for x in rhs}
    return all(sort_key(x) in keys for x in lhs)


# -- $zip, $sortArray -------------------------------------------------------------------------


def _zip(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        raise MongoError(34460, "$zip only supports an object as an argument, found "
                         f"{type_name(spec)}")
    inputs: list[Any] = []
    defaults: list[Any] = []
    longest = False
    for key, item in spec.items():
        if key == "inputs":
            if not isinstance(item, list):
                raise MongoError(34461, "inputs must be an array of expressions, found "
                                 f"{type_name(item)}")
            inputs = list(item)
        elif key == "defaults":
            if not isinstance(item, list):
                raise MongoError(34462, "defaults must be an array of expressions, found "
                                 f"{type_name(item)}")
            defaults = list(item)
        elif key == "useLongestLength":
            if not isinstance(item, bool):  # mongod names the spec's type, not the value's
                raise MongoError(34463, "useLongestLength must be a bool, found object")
            longest = item
        else:
            raise MongoError(34464, f"$zip found an unknown argument: {key}")
    if not inputs:
        raise MongoError(34465, "$zip requires at least one input array")
    if defaults and not longest:
        raise MongoError(34466, "cannot specify defaults unless useLongestLength is true")
    if defaults and len(defaults) != len(inputs):
        raise MongoError(34467, "defaults and inputs must have the same length")
    arrays = []
    for expression in inputs:
        v = value(parser, expression)
        if nullish(v):
            return None
        if not isinstance(v, list):
            raise MongoError(34468, "$zip found a non-array expression in input: "
                             f"{value_string(v)}")
        arrays.append(v)
    sizes = [len(a) for a in arrays]
    filler = [None] * len(arrays)
    if min(sizes) != max(sizes) and defaults:
        filler = [None if v is MISSING else v for v in (value(parser, d) for d in defaults)]
    length = max(sizes) if longest else min(sizes)
    return [[a[row] if row < len(a) else filler[col] for col, a in enumerate(arrays)]
            for row in range(length)]


def _direction(v: Any) -> int | None:
    """pattern_cmp::isPatternElement: a number equal to 1 or -1."""
    if is_numeric(v) and _double(v) in (1.0, -1.0):
        return int(_double(v))
    return None


def _sort_fields(pattern: Mapping[str, Any]) -> list[tuple[list[str], int]]:
    """pattern_cmp::checkSortClause (BadValue), as $sortArray checks an object `sortBy`."""
    if not pattern:
        raise MongoError(2, "The $sort pattern is empty when it should be a set of fields.")
    fields = []
    for path, direction in pattern.items():
        d = _direction(direction)
        if d is None:
            raise MongoError(2, "The $sort element value must be either 1 or -1")
        if not path:
            raise MongoError(2, "The $sort field cannot be empty")
        parts = path.split(".")
        if any(not part for part in parts):
            raise MongoError(2, "The $sort field is a dotted field but has an empty part: "
                             f"{path}")
        fields.append((parts, d))
    return fields


def _sort_array(parser: Any, spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        raise MongoError(2942500, "$sortArray requires an object as an argument, found: "
                         f"{type_name(spec)}")
    for key in spec:
        if key not in ("input", "sortBy"):
            raise MongoError(2942501, f"$sortArray found an unknown argument: {key}")
    if "input" not in spec:
        raise MongoError(2942502, "$sortArray requires 'input' to be specified")
    if "sortBy" not in spec:
        raise MongoError(2942503, "$sortArray requires 'sortBy' to be specified")
    sort_by = spec["sortBy"]
    fields: list[tuple[list[str], int]] = []
    whole = None
    if isinstance(sort_by, Mapping):
        fields = _sort_fields(sort_by)
    else:
        whole = _direction(sort_by)
        if whole is None:
            raise MongoError(2942506, "The $sort element value must be either 1 or -1")
    array = value(parser, spec["input"])
    if nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(2942504, "The input argument to $sortArray must be an array, but was "
                         f"of type: {missing_type_name(array)}")
    if whole is not None:
        return sorted(array, key=sort_key, reverse=whole < 0)
    out = list(array)
    for path, d in reversed(fields):  # stable sorts, the last key first
        keys = [sort_key(_path_value(elem, path)) for elem in out]
        order = sorted(range(len(out)), key=keys.__getitem__, reverse=d < 0)
        out = [out[i] for i in order]
    return out


def _path_value(elem: Any, path: list[str]) -> Any:
    """extractElementsBasedOnTemplate(useNullIfMissing): the value at the dotted path, an array
    entered only by its numeric field names ("a.0") and compared whole; null when missing (a
    value that is not a document has no fields)."""
    current = elem
    for part in path:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isascii() and part.isdigit() \
                and str(int(part)) == part and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
    return current


# -- $firstN, $lastN, $maxN, $minN ------------------------------------------------------------


def _n_spec(name: str, spec: Any) -> tuple[Any, Any]:
    if not isinstance(spec, Mapping):
        code = 5787900 if name in ("$maxN", "$minN") else 5787801
        raise MongoError(code, f"specification must be an object; found {name}: "
                         f"{bson_obj_string(spec)}")
    n = array = None
    seen = set()
    for key, item in spec.items():
        if key == "input":
            array = item
        elif key == "n":
            n = item
        else:
            raise MongoError(5787901, f"Unknown argument for 'n' operator: {key}")
        seen.add(key)
    if "n" not in seen:
        raise MongoError(5787906, "Missing value for 'n'")
    if "input" not in seen:
        raise MongoError(5787907, "Missing value for 'input'")
    return n, array


def _validate_n(v: Any) -> int:
    shown = "MISSING" if v is MISSING else value_string(v)
    if not is_numeric(v):
        raise MongoError(5787902, f"Value for 'n' must be of integral type, but found {shown}")
    d = _as_decimal(v)
    if not d.is_finite() or d != d.to_integral_value():
        raise MongoError(5787903, f"Value for 'n' must be of integral type, but found {shown}")
    n = int(d)
    if n <= 0:
        raise MongoError(5787908, f"'n' must be greater than 0, found {n}")
    return n


def _accumulator_n(name: str) -> Callable[[Any, Any], Any]:
    def evaluate(parser: Any, spec: Any) -> Any:
        n_expression, input_expression = _n_spec(name, spec)
        n = _validate_n(value(parser, n_expression))
        array = value(parser, input_expression)
        if not isinstance(array, list):
            raise MongoError(5788200, "Input must be an array")
        if name == "$firstN":
            return array[:n]
        if name == "$lastN":
            return array[-n:]
        return _min_max_n(array, n, name == "$minN")
    return evaluate


def _min_max_n(array: list[Any], n: int, smallest: bool) -> list[Any]:
    """AccumulatorMinMaxN: a multiset of the n smallest (largest) non-nullish values, an equal
    value arriving later left out once the set is full."""
    keys: list[bytes] = []
    kept: list[Any] = []
    for v in array:
        if v is None:
            continue
        key = sort_key(v)
        if len(kept) == n:
            if smallest and keys[-1] > key:
                keys.pop()
                kept.pop()
            elif not smallest and keys[0] < key:
                keys.pop(0)
                kept.pop(0)
            else:
                continue
        at = bisect.bisect_right(keys, key)
        keys.insert(at, key)
        kept.insert(at, v)
    return kept if smallest else kept[::-1]


OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$arrayElemAt": _array_elem_at,
    "$first": _first_last("$first"),
    "$last": _first_last("$last"),
    "$slice": _slice,
    "$concatArrays": _concat_arrays,
    "$reverseArray": _reverse_array,
    "$indexOfArray": _index_of_array,
    "$range": _range,
    "$objectToArray": _object_to_array,
    "$arrayToObject": _array_to_object,
    "$mergeObjects": _merge_objects,
    "$allElementsTrue": _elements_true("$allElementsTrue", 17040),
    "$anyElementTrue": _elements_true("$anyElementTrue", 17041),
    "$setUnion": _set_union,
    "$setIntersection": _set_intersection,
    "$setDifference": _set_difference,
    "$setEquals": _set_equals,
    "$setIsSubset": _set_is_subset,
    "$zip": _zip,
    "$sortArray": _sort_array,
    "$firstN": _accumulator_n("$firstN"),
    "$lastN": _accumulator_n("$lastN"),
    "$maxN": _accumulator_n("$maxN"),
    "$minN": _accumulator_n("$minN"),
}
