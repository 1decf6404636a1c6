"""Aggregation expressions mongomock lacks or evaluates differently from mongod, installed into
its expression parser class (`mongomock.aggregate._Parser`, handed over by query_engine.py, the
one module that imports mongomock), which both the change stream's user stages and the embedded
store's pipelines run on:

- `$getField`, `$setField`, `$unsetField` (5.0), with mongod's parse errors;
- `$indexOfCP`, `$indexOfBytes` (mongomock: NotImplemented); a BSON regex literal in
  `$regexMatch` / `$regexFind` / `$regexFindAll` (mongomock: TypeError without flags);
- an object literal with a `$`-prefixed field after its first (`{_id: 1, $v: 2}`): 16410, as
  ExpressionObject::parse checks each field name (mongomock: code 2);
- `$dateAdd`, `$dateSubtract`, `$dateDiff`, `$dateTrunc`, `$reduce` (date_expressions.py);
- the system variables `$$NOW` (a date) and `$$CLUSTER_TIME` (a timestamp), which mongomock
  reads as undefined user variables (a `$project` of them yielded no field): a command binds
  them once (cdcserver/embedded/engine.py `bind_system_variables`); unbound, they read the
  clock (`system_variable`).

`install(parser_class)` is idempotent; the query engine's installation of its mongomock
patches runs it.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from bson.regex import Regex
from bson.timestamp import Timestamp

from pipeline_stages import (
    array_expressions,
    bson_bytes,
    convert_expressions,
    date_expressions,
    date_from_string,
    date_part_expressions,
    math_expressions,
    string_expressions,
)
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name, value_string

__all__ = ["DOLLAR_FIELD_MESSAGE", "SYSTEM_VARIABLES", "install", "now", "system_variable"]

DOLLAR_FIELD_MESSAGE = (
    "FieldPath field names may not start with '$'. Consider using $getField or $setField."
)


class _Missing:
    """A missing operand (mongod's `Value()`)."""


_MISSING = _Missing()
_INSTALLED = False


def install(parser: Any) -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    original_parse: Callable[[Any, Any], Any] = parser.parse

    def parse(self: Any, expression: Any) -> Any:
        if isinstance(expression, str) and expression.startswith("$$"):
            name, _, path = expression[2:].partition(".")
            if name in SYSTEM_VARIABLES and name not in (self._user_vars or {}):
                if path:  # neither a date nor a timestamp has fields
                    raise KeyError(expression)
                return system_variable(name)
        if isinstance(expression, dict) and expression:
            first = next(iter(expression))
            if len(expression) == 1 and first in _REGEX_OPERATORS:
                expression = _regex_as_string(first, expression[first]) or expression
            if len(expression) == 1 and first in _FIELD_OPERATORS:
                result = _FIELD_OPERATORS[first](self, expression[first])
                if result is _MISSING or result is date_expressions.MISSING:
                    raise KeyError(first)  # mongomock's way of saying "missing"
                return result
            if not first.startswith("$") and any(k.startswith("$") for k in expression):
                raise MongoError(16410, DOLLAR_FIELD_MESSAGE)
        if isinstance(expression, list):
            # ExpressionArray: each element evaluated, a missing one null (mongomock returned
            # the literal as written: `["$x"]` stayed the string "$x").
            return [_element(self, e) for e in expression]
        return original_parse(self, expression)

    def _element(self: Any, expression: Any) -> Any:
        try:
            return parse(self, expression)
        except KeyError:
            return None

    parser.parse = parse
    _INSTALLED = True


_REGEX_OPERATORS = ("$regexMatch", "$regexFind", "$regexFindAll")
SYSTEM_VARIABLES = ("NOW", "CLUSTER_TIME")


def now() -> datetime.datetime:
    """`$$NOW`: the wall clock as a BSON date holds it (UTC, whole milliseconds)."""
    moment = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def system_variable(name: str) -> Any:
    """The value of `$$NOW` or `$$CLUSTER_TIME` when no command bound it."""
    if name == "NOW":
        return now()
    return Timestamp(int(time.time()), 1)


def _regex_as_string(name: str, spec: Any) -> dict[str, Any] | None:
    """A BSON regex literal without `options` as its pattern and options strings: mongomock
    compiles a flagless BSON regex with flags None (a TypeError)."""
    if not isinstance(spec, Mapping) or "options" in spec:
        return None
    regex = spec.get("regex")
    if not isinstance(regex, Regex) or not isinstance(regex.pattern, str):
        return None
    flags = regex.flags
    options = flags if isinstance(flags, str) else "".join(
        letter for letter, bit in (("i", re.I), ("m", re.M), ("s", re.S), ("x", re.X))
        if flags & bit)
    return {name: {**spec, "regex": regex.pattern, "options": options}}


def _parse_or_missing(parser: Any, expression: Any) -> Any:
    try:
        return parser.parse(expression)
    except KeyError:
        return _MISSING


def _constant_field(name: str, spec: Any, codes: tuple[int, int, int]) -> str:
    """The `field` argument: a string constant (or `$literal` of one), as mongod requires."""
    path_code, non_constant_code, non_string_code = codes
    if isinstance(spec, Mapping) and len(spec) == 1 and next(iter(spec)) in ("$literal",
                                                                              "$const"):
        spec = next(iter(spec.values()))
        if isinstance(spec, str):
            return spec
    elif isinstance(spec, str) and spec.startswith("$"):
        raise MongoError(path_code, "A field path reference which is not allowed in this "
                         f"context. Did you mean {{$literal: '{spec}'}}?")
    elif isinstance(spec, Mapping):
        raise MongoError(non_constant_code, f"{name} requires 'field' to evaluate to a "
                         "constant, but got a non-constant argument")
    if not isinstance(spec, str):
        raise MongoError(non_string_code, f"{name} requires 'field' to evaluate to type "
                         f"String, but got {type_name(spec)}")
    return spec


def _get_field(parser: Any, args: Any) -> Any:
    name = "$getField"
    if not isinstance(args, Mapping) or not args or next(iter(args)).startswith("$"):
        args = {"field": args}  # {$getField: <field>}: the input is $$CURRENT
    for key in args:
        if key not in ("field", "input"):
            raise MongoError(3041701, f"{name} found an unknown argument: {key}")
    if "field" not in args:
        raise MongoError(3041702, f"{name} requires 'field' to be specified")
    field = _constant_field(name, args["field"], (5654600, 5654601, 5654602))
    source = _parse_or_missing(parser, args.get("input", "$$CURRENT"))
    if source is _MISSING:
        return _MISSING
    if source is None:
        return None
    if not isinstance(source, Mapping):
        return _MISSING
    return source[field] if field in source else _MISSING


def _set_field(parser: Any, args: Any, name: str = "$setField") -> Any:
    if not isinstance(args, Mapping):
        raise MongoError(4161100, f"{name} only supports an object as its argument")
    allowed = ("field", "input", "value") if name == "$setField" else ("field", "input")
    for key in args:
        if key not in allowed:
            raise MongoError(4161101, f"{name} found an unknown argument: {key}")
    if "field" not in args:
        raise MongoError(4161102, f"{name} requires 'field' to be specified")
    if name == "$setField" and "value" not in args:
        raise MongoError(4161103, f"{name} requires 'value' to be specified")
    if "input" not in args:
        raise MongoError(4161109, f"{name} requires 'input' to be specified")
    field = _constant_field(name, args["field"], (4161108, 4161106, 4161107))
    source = _parse_or_missing(parser, args["input"])
    if source is _MISSING or source is None:
        return None
    if not isinstance(source, Mapping):
        raise MongoError(4161105, f"{name} requires 'input' to evaluate to type Object")
    value = _parse_or_missing(parser, args["value"]) if name == "$setField" else _MISSING
    out = dict(source)
    if value is _MISSING:  # $$REMOVE, a missing path, or $unsetField
        out.pop(field, None)
    else:
        out[field] = value  # in place when present, else last (MutableDocument::setField)
    return out


def _index_of(parser: Any, args: Any, name: str) -> Any:
    """`$indexOfCP` / `$indexOfBytes` (ExpressionIndexOfCP / IndexOfBytes): the code point or
    UTF-8 byte index of the substring in [start, end), -1 if absent, null for a null or
    missing string."""
    if not isinstance(args, list) or not 2 <= len(args) <= 4:
        count = len(args) if isinstance(args, list) else 1
        raise MongoError(28667, f"Expression {name} takes at least 2 arguments, and at most 4, "
                         f"but {count} were passed in.")
    codes = (40091, 40092) if name == "$indexOfBytes" else (40093, 40094)
    values = [_parse_or_missing(parser, a) for a in args]
    string, sub = values[0], values[1]
    if string is _MISSING or string is None:
        return None
    if not isinstance(string, str):
        raise MongoError(codes[0], f"{name} requires a string as the first argument, found: "
                         f"{type_name(string)}")
    if not isinstance(sub, str):
        raise MongoError(codes[1], f"{name} requires a string as the second argument, found: "
                         f"{type_name(sub)}")
    bounds = []
    for which, value in zip(("starting", "ending"), values[2:]):
        whole = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            float(value).is_integer())
        if not whole:
            raise MongoError(40096, f"{name}requires an integral {which} index, found a value "
                             f"of type: {type_name(value)}, with value: {value_string(value)}")
        if value < 0:
            raise MongoError(40097, f"{name} requires a nonnegative {which} index, found: "
                             f"{value}")
        bounds.append(int(value))
    if name == "$indexOfBytes":
        text: str | bytes = bson_bytes.utf8(string)
        needle: str | bytes = bson_bytes.utf8(sub)
    else:
        text, needle = string, sub
    start = bounds[0] if bounds else 0
    end = bounds[1] if len(bounds) > 1 else len(text)
    if start > len(text) or start > end:
        return -1
    return text.find(needle, start, end)  # type: ignore[arg-type]


_FIELD_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "$indexOfCP": lambda parser, args: _index_of(parser, args, "$indexOfCP"),
    "$indexOfBytes": lambda parser, args: _index_of(parser, args, "$indexOfBytes"),
    "$getField": _get_field,
    "$setField": _set_field,
    "$unsetField": lambda parser, args: _set_field(parser, args, "$unsetField"),
    **date_expressions.OPERATORS,
    **array_expressions.OPERATORS,
    **math_expressions.OPERATORS,
    **date_part_expressions.OPERATORS,
    **date_from_string.OPERATORS,
    **string_expressions.OPERATORS,
    **convert_expressions.OPERATORS,
}


def install_operator(name: str, evaluate: Callable[[Any, Any], Any]) -> None:
    """Evaluate expression operator `name` with `evaluate(parser, argument)`: for operators
    whose evaluation needs what pipeline_stages/ must not hold (the embedded store's
    JavaScript engine registers `$function`)."""
    _FIELD_OPERATORS[name] = evaluate
