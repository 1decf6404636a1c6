"""`$redact` (document_source_redact.cpp) for the embedded store's aggregations.

The expression runs on each document and, where it answers `$$DESCEND`, on each embedded
document (also inside arrays, at any depth) with `$$CURRENT` that document and `$$ROOT` the
whole one. `$$KEEP` keeps the (sub)document as it is, `$$PRUNE` drops it (a top-level one
leaves the stage's output), anything else is error 17053. The three variables are the strings
"keep" / "prune" / "descend", as in mongod, so an expression that computes one of those strings
means that decision too. The expression is the query engine's (mongomock's parser with the
project's patches); this module is the traversal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages import query_engine
from pipeline_stages.errors import MongoError
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import value_string

__all__ = ["redact"]

_VARIABLES = {"DESCEND": "descend", "PRUNE": "prune", "KEEP": "keep"}


def _decide(expression: Any, current: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    variables = dict(_VARIABLES, ROOT=root, CURRENT=current)
    try:
        return query_engine.evaluate(expression, current, variables)
    except KeyError:  # the expression is a path that is missing
        return MISSING


def _object(expression: Any, current: Mapping[str, Any],
            root: Mapping[str, Any]) -> dict[str, Any] | None:
    result = _decide(expression, current, root)
    if type(result) is str:
        if result == "keep":
            return dict(current)
        if result == "prune":
            return None
        if result == "descend":
            out: dict[str, Any] = {}
            for key, value in current.items():
                value = _value(expression, value, root)
                if value is not MISSING:
                    out[key] = value
            return out
    raise MongoError(
        17053,
        "$redact's expression should not return anything aside from the variables $$KEEP, "
        "$$DESCEND, and $$PRUNE, but returned "
        + ("MISSING" if result is MISSING else value_string(result)),
    )


def _value(expression: Any, value: Any, root: Mapping[str, Any]) -> Any:
    if isinstance(value, Mapping):
        result = _object(expression, value, root)
        return MISSING if result is None else result
    if isinstance(value, list):
        out = []
        for item in value:
            if isinstance(item, (Mapping, list)):
                item = _value(expression, item, root)
                if item is MISSING:
                    continue
            out.append(item)
        return out
    return value


def redact(docs: list[Any], spec: Any) -> list[Any]:
    """The documents `$redact` with expression `spec` lets through, redacted."""
    out = []
    for doc in docs:
        result = _object(spec, doc, doc)
        if result is not None:
            out.append(result)
    return out
