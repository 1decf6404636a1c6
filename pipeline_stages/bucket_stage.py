"""`$bucket` and `$sortByCount` as mongod 8.0 runs them (document_source_bucket.cpp,
document_source_sort_by_count.cpp).

`$bucket`: its spec checked in mongod's order with mongod's errors (40191-40202), then run as
the `$group` + `$sort: {_id: 1}` mongod desugars it into: each document goes to the bucket whose
`[lower, upper)` holds its groupBy value (values compared in BSON order, so a value of another
type, or a missing one, falls outside every bucket), else to `default`, else fails with 40066 as
the `$switch` mongod builds does. The accumulators are group_stage.py's (accumulators.py); an
`output` field named `_id` is the second `_id` mongod's `$group` refuses (15948); without
`output`, `count: {$sum: 1}`. Buckets come out sorted by `_id`, `_id` first.

`$sortByCount`: its argument checked (40147-40149), then `$group: {_id: <arg>, count: {$sum:
1}}` (group_stage.py) and a stable sort on `count` descending (ties in the `$group`'s order).

Pure and synchronous; registered on the engine with `query_engine.set_stage_handler`.
"""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from pipeline_stages import group_stage
from pipeline_stages.accumulators import MISSING, Accumulator, order_key, value_key
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

__all__ = ["bucket_stage", "sort_by_count_stage"]


def _canonical_type(v: Any) -> int:
    """canonicalizeBSONType (bsontypes.h)."""
    if v is MISSING:
        return 0
    if isinstance(v, MinKey):
        return -1
    if isinstance(v, MaxKey):
        return 127
    if v is None:
        return 5
    if isinstance(v, bool):
        return 40
    if isinstance(v, (int, float, Int64, Decimal128)):
        return 10
    if isinstance(v, Code):
        return 60
    if isinstance(v, str):
        return 15
    if isinstance(v, DBRef):
        return 55
    if isinstance(v, Mapping):
        return 20
    if isinstance(v, (list, tuple)):
        return 25
    if isinstance(v, (Binary, bytes)):
        return 30
    if isinstance(v, ObjectId):
        return 35
    if isinstance(v, datetime.datetime):
        return 45
    if isinstance(v, Timestamp):
        return 47
    if isinstance(v, Regex):
        return 50
    return 0


def _compare_key(v: Any) -> tuple[int, bytes]:
    """Value::compare's order: canonical type first (missing with undefined, above MinKey,
    below null), then the value (KeyString)."""
    if v is MISSING:
        return (1, b"")
    if isinstance(v, MinKey):
        return (0, b"")
    return (2, order_key(v))


def _reads_document(expr: Any) -> bool:
    """Whether an expression is not a constant: it reads a path or a variable, or is $rand."""
    if isinstance(expr, str):
        return expr.startswith("$")
    if isinstance(expr, Mapping):
        if "$literal" in expr and len(expr) == 1:
            return False
        return "$rand" in expr or any(_reads_document(v) for v in expr.values())
    if isinstance(expr, list):
        return any(_reads_document(v) for v in expr)
    return False


def _constant(expr: Any) -> Any:
    """The value of a constant expression (MISSING when it is not one)."""
    if _reads_document(expr):
        return MISSING
    return group_stage.compile_expression(expr)({})


class _BucketSpec:
    __slots__ = ("boundaries", "default", "group_by", "keys", "statements")

    def __init__(self, group_by: group_stage.Evaluator, boundaries: list[Any], default: Any,
                 statements: list[group_stage.Statement]) -> None:
        self.group_by, self.boundaries, self.default = group_by, boundaries, default
        self.statements = statements
        self.keys = [_compare_key(b) for b in boundaries]


def _parse_bucket(spec: Any) -> _BucketSpec:
    if not isinstance(spec, Mapping):
        raise MongoError(40201, "Argument to $bucket stage must be an object, but found type: "
                         f"{type_name(spec)}.")
    group_by: Any = MISSING
    boundaries: list[Any] = []
    default: Any = MISSING
    output: Mapping[str, Any] | None = None
    for name, arg in spec.items():
        if name == "groupBy":
            is_expression = isinstance(arg, Mapping) and str(next(iter(arg), "")).startswith("$")
            is_path = isinstance(arg, str) and arg.startswith("$")
            if not (is_expression or is_path):
                raise MongoError(40202, "The $bucket 'groupBy' field must be defined as a "
                                 "$-prefixed path or an expression, but found: "
                                 f"{value_string(arg)}.")
            group_by = arg
        elif name == "boundaries":
            if not isinstance(arg, list):
                raise MongoError(40200, "The $bucket 'boundaries' field must be an array, but "
                                 f"found type: {type_name(arg)}.")
            boundaries = []
            for element in arg:
                value = _constant(element)
                if value is MISSING:
                    raise MongoError(40191, "The $bucket 'boundaries' field must be an array of "
                                     "constant values, but found value: "
                                     f"{value_string(element)}.")
                boundaries.append(value)
            if len(boundaries) < 2:
                raise MongoError(40192, "The $bucket 'boundaries' field must have at least 2 "
                                 f"values, but found {len(boundaries)} value(s).")
            for i in range(1, len(boundaries)):
                lower, upper = boundaries[i - 1], boundaries[i]
                if _canonical_type(lower) != _canonical_type(upper):
                    raise MongoError(40193, "All values in the the 'boundaries' option to "
                                     "$bucket must have the same type. Found conflicting types "
                                     f"{type_name(lower)} and {type_name(upper)}.")
                if not _compare_key(lower) < _compare_key(upper):
                    raise MongoError(40194, "The 'boundaries' option to $bucket must be sorted, "
                                     f"but elements {i - 1} and {i} are not in ascending order "
                                     f"({value_string(lower)} is not less than "
                                     f"{value_string(upper)}).")
        elif name == "default":
            default = _constant(arg)
            if default is MISSING:
                raise MongoError(40195, "The $bucket 'default' field must be a constant "
                                 f"expression, but found: {value_string(arg)}.")
        elif name == "output":
            if not isinstance(arg, Mapping):
                raise MongoError(40196, "The $bucket 'output' field must be an object, but "
                                 f"found type: {type_name(arg)}.")
            output = arg
        else:
            raise MongoError(40197, f"Unrecognized option to $bucket: {name}.")
    if group_by is MISSING or not boundaries:
        raise MongoError(40198, "$bucket requires 'groupBy' and 'boundaries' to be specified.")
    if _canonical_type(default) == _canonical_type(boundaries[0]):
        key = _compare_key(default)
        if not (key < _compare_key(boundaries[0]) or key >= _compare_key(boundaries[-1])):
            raise MongoError(40199, "The $bucket 'default' field must be less than the lowest "
                             "boundary or greater than or equal to the highest boundary.")
    # The $group mongod builds: the output fields in order, then `_id`.
    statements: list[group_stage.Statement] = []
    has_id = False
    if output is None:
        statements.append(group_stage.parse_statement("count", {"$sum": 1}))
    else:
        for field, value in output.items():
            if field == "_id":
                has_id = True
            else:
                statements.append(group_stage.parse_statement(field, value))
    if has_id:
        raise MongoError(15948, "a group's _id may only be specified once")
    return _BucketSpec(group_stage.compile_expression(group_by), boundaries, default, statements)


def bucket_stage(docs: list[Any], database: Any, spec: Any, engine_bucket: Any = None) -> list[Any]:
    """The `$bucket` stage over `docs` (the handler `set_stage_handler` installs)."""
    parsed = _parse_bucket(spec)
    statements = parsed.statements
    args = [s.argument for s in statements]
    keys, boundaries = parsed.keys, parsed.boundaries
    groups: dict[Any, tuple[Any, list[Accumulator]]] = {}
    for doc in docs:
        position = bisect.bisect_right(keys, _compare_key(parsed.group_by(doc))) - 1
        if 0 <= position < len(boundaries) - 1:
            bucket = boundaries[position]
        elif parsed.default is not MISSING:
            bucket = parsed.default
        else:
            raise MongoError(40066, "$switch could not find a matching branch for an input, and "
                             "no default was specified.")
        hashed = value_key(bucket)
        entry = groups.get(hashed)
        if entry is None:
            entry = groups[hashed] = (bucket, group_stage._start(statements, bucket))
        for acc, arg in zip(entry[1], args):
            if acc.needs_input:
                acc.process(arg(doc))
    ordered = sorted(groups.values(), key=lambda e: _compare_key(e[0]))
    return [group_stage._output(key, accs, statements) for key, accs in ordered]


def sort_by_count_stage(
    docs: list[Any], database: Any, spec: Any, engine_sort_by_count: Any = None
) -> list[Any]:
    """The `$sortByCount` stage: `$group` on the argument counting, then `count` descending."""
    message = ("the sortByCount field must be defined as a $-prefixed path or an expression "
               "inside an object")
    if isinstance(spec, Mapping):
        if not str(next(iter(spec), "")).startswith("$"):
            raise MongoError(40147, message)
    elif isinstance(spec, str):
        if not spec.startswith("$"):
            raise MongoError(40148, message)
    else:
        raise MongoError(40149,
                         "the sortByCount field must be specified as a string or as an object")
    grouped = group_stage.group_stage(docs, database, {"_id": spec, "count": {"$sum": 1}})
    return sorted(grouped, key=lambda d: -d["count"])
