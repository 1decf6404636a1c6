"""The `errInfo.details` of a 121 DocumentValidationFailure, as mongod 5.0+ generates them
(src/mongo/db/matcher/doc_validation_error.cpp) for a validator of query operators.

The validator is parsed into the tree MatchExpressionParser builds (a top-level document of
several clauses is an implicit `$and`, one clause is that clause; `$ne`, `$nin` and
`$exists: false` are a negation that reports through its child), and each node that failed
reports as mongod's visitors do: leaves with `operatorName`, `specifiedAs`, a `reason` and
the `consideredValue(s)`; `$and` / `$or` / `$nor` with the indexes and details of their
clauses that explain the failure; `$not` with its child's details, inverted. `$jsonSchema`
clauses report through json_schema.py. The matcher is passed in (no import of the engine).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson.regex import Regex

from cdcserver.embedded import json_schema
from pipeline_stages.value_string import type_name

Matches = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
Evaluate = Callable[[Any, Mapping[str, Any]], Any]

_MAX_CONSIDERED = 10  # internalQueryMaxDocValidationErrorConsideredValues
_NUMERIC = ("decimal", "double", "int", "long")

# operator -> (normal reason, inverted reason, expected types, leaf-array behaviour)
_PATH_ERRORS: dict[str, tuple[str, str, tuple[str, ...] | None, str]] = {
    **{op: ("comparison failed", "comparison succeeded", None, "omit")
       for op in ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")},
    "$in": ("no matching value found in array", "matching value found in array", None, "omit"),
    "$nin": ("no matching value found in array", "matching value found in array", None,
             "omit"),
    "$regex": ("regular expression did not match", "regular expression did match",
               ("regex", "string", "symbol"), "omit"),
    "$mod": ("$mod did not evaluate to expected remainder",
             "$mod did evaluate to expected remainder", _NUMERIC, "omit"),
    "$size": ("array length was not equal to given size", "array length was equal to given size",
              ("array",), "none"),
    "$elemMatch": ("array did not satisfy the child predicate",
                   "array did satisfy the child predicate", ("array",), "none"),
    **{op: ("bitwise operator failed to match", "bitwise operator matched successfully",
            ("binData", *_NUMERIC), "omit")
       for op in ("$bitsAllSet", "$bitsAllClear", "$bitsAnySet", "$bitsAnyClear")},
}


class _Node:
    def __init__(
        self, kind: str, filter_doc: Mapping[str, Any], *, op: str = "", path: str = "",
        specified_as: Mapping[str, Any] | None = None, children: list[_Node] | None = None,
    ) -> None:
        # kind: "$and" / "$or" / "$nor" / "$not" / "negation" and "ignored $and" (which report
        # through their child) / "$jsonSchema" / "leaf"
        self.kind = kind
        self.filter = filter_doc  # what the node matches, as a filter of its own
        self.op = op
        self.path = path
        self.specified_as = specified_as
        self.children = children or []


def _parse(filter_doc: Mapping[str, Any]) -> _Node:
    children: list[_Node] = []
    for key, value in filter_doc.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            children.append(_Node(key, {key: value}, children=[
                _parse(c) for c in value if isinstance(c, Mapping)]))
        elif key == "$jsonSchema":
            children.append(_Node("$jsonSchema", {key: value}))
        elif key == "$comment":
            continue
        elif key.startswith("$"):
            children.append(_Node("leaf", {key: value}, op=key, specified_as={key: value}))
        else:
            children.extend(_field_nodes(key, value))
    if len(children) == 1:
        return children[0]
    return _Node("$and", filter_doc, children=children)


def _field_nodes(path: str, value: Any) -> list[_Node]:
    if not (isinstance(value, Mapping) and value and next(iter(value)).startswith("$")):
        op = "$regex" if isinstance(value, Regex) else "$eq"
        return [_Node("leaf", {path: value}, op=op, path=path, specified_as={path: value})]
    out: list[_Node] = []
    if "$regex" in value:
        spec = {k: value[k] for k in ("$regex", "$options") if k in value}
        out.append(_Node("leaf", {path: spec}, op="$regex", path=path,
                         specified_as={path: spec}))
    for op, arg in value.items():
        if op in ("$regex", "$options"):
            continue
        own = {path: {op: arg}}
        if op in ("$ne", "$nin") or (op == "$exists" and not _true_value(arg)):
            positive = {"$ne": "$eq", "$nin": "$in", "$exists": "$exists"}[op]
            matched = {path: {positive: True if op == "$exists" else arg}}
            out.append(_Node("negation", own, children=[
                _Node("leaf", matched, op=op, path=path, specified_as=own)]))
        elif op == "$not":
            inner = (_field_nodes(path, arg) if isinstance(arg, Mapping)
                     else _field_nodes(path, arg) if isinstance(arg, Regex) else [])
            child = inner[0] if len(inner) == 1 else _Node("ignored $and", {path: arg},
                                                           children=inner)
            out.append(_Node("$not", own, children=[child] if inner else []))
        else:
            out.append(_Node("leaf", own, op=op, path=path, specified_as=own))
    return out


def _true_value(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    return True


def details(validator: Mapping[str, Any], doc: Mapping[str, Any], matches: Matches,
            evaluate: Evaluate | None = None) -> dict[str, Any] | None:
    """The `details` of `doc` failing `validator` (None if there are none to give);
    `evaluate` computes an `$expr`'s result."""
    return _Generator(doc, matches, evaluate).error(_parse(validator), inverted=False)


class _Generator:
    def __init__(self, doc: Mapping[str, Any], matches: Matches,
                 evaluate: Evaluate | None) -> None:
        self.doc = doc
        self._matches = matches
        self._evaluate = evaluate

    def matches(self, node: _Node) -> bool:
        if node.kind == "$jsonSchema":
            schema = node.filter["$jsonSchema"]
            return not (isinstance(schema, Mapping) and json_schema.validate(schema, self.doc))
        if node.kind in ("$not", "negation"):
            return not all(self.matches(c) for c in node.children)
        if node.kind in ("$and", "ignored $and"):
            return all(self.matches(c) for c in node.children)
        if node.kind == "$or":
            return any(self.matches(c) for c in node.children)
        if node.kind == "$nor":
            return not any(self.matches(c) for c in node.children)
        return self._matches(node.filter, self.doc)  # (a negation's leaf: its positive form)

    def error(self, node: _Node, inverted: bool) -> dict[str, Any] | None:
        if node.kind in ("$and", "$or", "$nor"):
            return self._list_error(node, inverted)
        if node.kind == "$not":
            out: dict[str, Any] = {"operatorName": "$not"}
            child = self.error(node.children[0], not inverted) if node.children else None
            if child is not None:
                out["details"] = child
            return out
        if node.kind in ("negation", "ignored $and"):  # no error of their own: the (last)
            # child's, inverted under a negation
            flip = node.kind == "negation"
            return self.error(node.children[-1], inverted != flip) if node.children else None
        if node.kind == "$jsonSchema":
            if inverted:
                return {"operatorName": "$jsonSchema", "reason": "schema matched"}
            schema = node.filter["$jsonSchema"]
            rules = json_schema.validate(schema, self.doc) if isinstance(schema, Mapping) else []
            return {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": rules}
        return self._leaf_error(node, inverted)

    def _list_error(self, node: _Node, inverted: bool) -> dict[str, Any]:
        """$and / $or / $nor: the clauses whose outcome explains the node's."""
        clauses: list[dict[str, Any]] = []
        for index, child in enumerate(node.children):
            if node.kind == "$nor":
                child_inverted = not inverted
                reports = inverted or self.matches(child)
            elif node.kind == "$and":
                child_inverted = inverted
                reports = inverted or not self.matches(child)
            else:  # $or
                child_inverted = inverted
                reports = not inverted or self.matches(child)
            if not reports:
                continue
            found = self.error(child, child_inverted)
            if found is not None:
                clauses.append({"index": index, "details": found})
        key = "clausesSatisfied" if inverted else "clausesNotSatisfied"
        return {"operatorName": node.kind, key: clauses}

    def _values(self, path: str, leaf: str) -> list[Any] | None:
        """createValuesArray: the values `path` reaches (None: the path is missing), arrays
        on the way traversed, a leaf array kept whole (`none`), expanded (`omit`) or both."""
        found: list[Any] = []

        def walk(value: Any, parts: list[str], behaviour: str, out: list[Any]) -> None:
            if not parts:
                if isinstance(value, list) and behaviour != "none":
                    out.extend(value)
                    if behaviour == "traverse":
                        out.append(value)
                else:
                    out.append(value)
                return
            head, rest = parts[0], parts[1:]
            if isinstance(value, Mapping):
                if head in value:
                    walk(value[head], rest, behaviour, out)
            elif isinstance(value, list):
                if head.isdigit() and int(head) < len(value):
                    walk(value[int(head)], rest, behaviour, out)
                for element in value:
                    if isinstance(element, Mapping):
                        walk(element, parts, behaviour, out)

        parts = path.split(".")
        walk(self.doc, parts, leaf, found)
        if not found:
            exists: list[Any] = []
            walk(self.doc, parts, "traverse", exists)
            return [] if exists else None
        return found

    def _leaf_error(self, node: _Node, inverted: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"operatorName": node.op, "specifiedAs": node.specified_as}
        op = node.op
        if op == "$exists":
            out["reason"] = "path does exist" if inverted else "path does not exist"
            return out
        if op == "$expr":
            out["reason"] = "expression did match" if inverted else "expression did not match"
            if self._evaluate is not None:
                out["expressionResult"] = self._evaluate(node.filter["$expr"], self.doc)
            return out
        if not node.path:
            return out
        if op == "$type":
            values = self._values(node.path, "omit")
            if values is None:
                out["reason"] = "field was missing"
            else:
                out["reason"] = "type did match" if inverted else "type did not match"
            self._considered(out, values)
            self._considered_types(out, values)
            return out
        if op == "$all":
            values = self._values(node.path, "none")
            out["reason"] = ("field was missing" if values is None else
                             "array did contain all specified values" if inverted else
                             "array did not contain all specified values")
            self._considered(out, values)
            return out
        normal, inverse, expected, leaf = _PATH_ERRORS.get(op, ("", "", None, "omit"))
        values = self._values(node.path, leaf)
        if values is None:
            out["reason"] = "field was missing"
        elif expected is not None and not any(type_name(v) in expected for v in values):
            out["reason"] = "type did not match"
            self._considered_types(out, values)
            if len(expected) == 1:
                out["expectedType"] = expected[0]
            else:
                out["expectedTypes"] = list(expected)
        if "reason" not in out and normal:
            out["reason"] = inverse if inverted else normal
        self._considered(out, values)
        return out

    @staticmethod
    def _considered(out: dict[str, Any], values: list[Any] | None) -> None:
        if values is None:
            return
        shown = values[:_MAX_CONSIDERED]
        if len(shown) == 1:
            out["consideredValue"] = shown[0]
        else:
            out["consideredValues"] = shown
        if len(values) > _MAX_CONSIDERED:
            out["consideredValuesTruncated"] = True

    @staticmethod
    def _considered_types(out: dict[str, Any], values: list[Any] | None) -> None:
        if not values:
            return
        types = sorted({type_name(v) for v in values})
        if len(types) == 1:
            out["consideredType"] = types[0]
        else:
            out["consideredTypes"] = types
