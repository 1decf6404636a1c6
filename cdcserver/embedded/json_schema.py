"""`$jsonSchema` in collection validators, with the `errInfo.details` mongod 5.0+ reports.

mongomock has no `$jsonSchema`, and general JSON Schema libraries know neither `bsonType` nor
mongod's error details (`schemaRulesNotSatisfied`, `propertiesNotSatisfied`, ...), which are
what a driver user sees on a 121 DocumentValidationFailure. So the keywords MongoDB supports
are evaluated here, each reporting a failure in mongod's shape.

Left out: `dependencies`, `$ref`-free `definitions` reuse, `encrypt`. The details of the
query operators beside or around a `$jsonSchema` are doc_validation_error.py's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from pipeline_stages.keystring import encode_values
from pipeline_stages.value_string import type_name


def _id_key(value: Any) -> bytes:
    """Bytes equal exactly when two values are equal (their KeyString, as store.id_key)."""
    return encode_values((value,))[0]


# bsonType aliases -> a test; "number" covers the four numeric types.
_NUMERIC = ("int", "long", "double", "decimal")
# JSON Schema `type` names -> BSON type names (`integer` is not supported by MongoDB).
_JSON_TYPES = {
    "object": ("object",), "array": ("array",), "string": ("string",), "boolean": ("bool",),
    "null": ("null",), "number": _NUMERIC,
}


def _bson_type(value: Any) -> str:
    return type_name(value)


def _type_matches(value: Any, names: list[str] | tuple[str, ...]) -> bool:
    actual = _bson_type(value)
    return any(actual == n or (n == "number" and actual in _NUMERIC) for n in names)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128, Int64)) and not isinstance(value, bool)


def _num(value: Any) -> Any:
    return value.to_decimal() if isinstance(value, Decimal128) else value


def validate(schema: Mapping[str, Any], doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rules of `schema` the (top-level) document does not satisfy, as mongod lists them
    in `schemaRulesNotSatisfied` (empty: valid)."""
    return _object_rules(schema, doc, top=True)


def _object_rules(
    schema: Mapping[str, Any], value: Any, top: bool = False
) -> list[dict[str, Any]]:
    failures: list[dict[str, Any]] = []
    for keyword, arg in schema.items():
        failure = _rule(keyword, arg, schema, value)
        if failure is not None:
            failures.append(failure)
    return failures


def _considered(value: Any) -> dict[str, Any]:
    return {"consideredValue": value}


def _rule(
    keyword: str, arg: Any, schema: Mapping[str, Any], value: Any
) -> dict[str, Any] | None:
    is_obj = isinstance(value, Mapping)
    is_arr = isinstance(value, list)
    is_str = isinstance(value, str)
    if keyword in ("bsonType", "type"):
        names = arg if isinstance(arg, list) else [arg]
        if keyword == "type":
            names = [t for n in names for t in _JSON_TYPES.get(n, (n,))]
        if _type_matches(value, names):
            return None
        return {"operatorName": keyword, "specifiedAs": {keyword: arg},
                "reason": "type did not match", **_considered(value),
                "consideredType": _bson_type(value)}
    if keyword == "required" and is_obj:
        missing = [name for name in arg if name not in value]
        if not missing:
            return None
        return {"operatorName": "required", "specifiedAs": {"required": list(arg)},
                "missingProperties": sorted(missing)}
    if keyword == "properties" and is_obj:
        bad = []
        for name, sub in arg.items():
            if name in value:
                details = _object_rules(sub, value[name])
                if details:
                    bad.append({"propertyName": name, "details": details})
        return {"operatorName": "properties", "propertiesNotSatisfied": bad} if bad else None
    if keyword == "additionalProperties" and is_obj:
        known = set(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        extra = [k for k in value if k not in known and not any(p.search(k) for p in patterns)]
        if arg is False:
            if not extra:
                return None
            return {"operatorName": "additionalProperties",
                    "specifiedAs": {"additionalProperties": False}, "additionalProperties": extra}
        if isinstance(arg, Mapping):
            bad = []
            for name in extra:
                details = _object_rules(arg, value[name])
                if details:
                    bad.append({"propertyName": name, "details": details})
            if bad:
                return {"operatorName": "additionalProperties", "reason":
                        "at least one additional property did not match the subschema",
                        "failingProperty": bad[0]["propertyName"], "details": bad[0]["details"]}
        return None
    if keyword == "patternProperties" and is_obj:
        for pattern, sub in arg.items():
            regex = re.compile(pattern)
            for name, v in value.items():
                if regex.search(name):
                    details = _object_rules(sub, v)
                    if details:
                        return {"operatorName": "patternProperties", "details": [
                            {"propertyName": name, "regex": pattern, "details": details}]}
        return None
    if keyword in ("minProperties", "maxProperties") and is_obj:
        n = len(value)
        if (n >= arg) if keyword == "minProperties" else (n <= arg):
            return None
        return {"operatorName": keyword, "specifiedAs": {keyword: arg},
                "reason": "specified number of properties was not satisfied",
                "numberOfProperties": n}
    if keyword in ("minimum", "maximum") and _is_number(value):
        exclusive = schema.get("exclusiveMinimum" if keyword == "minimum" else
                               "exclusiveMaximum") is True
        v, bound = _num(value), _num(arg)
        ok = (v > bound if exclusive else v >= bound) if keyword == "minimum" else (
            v < bound if exclusive else v <= bound)
        if ok:
            return None
        spec = {keyword: arg}
        if exclusive:
            spec["exclusiveMinimum" if keyword == "minimum" else "exclusiveMaximum"] = True
        return {"operatorName": keyword, "specifiedAs": spec, "reason": "comparison failed",
                **_considered(value)}
    if keyword == "multipleOf" and _is_number(value):
        if _num(value) % _num(arg) == 0:
            return None
        return {"operatorName": "multipleOf", "specifiedAs": {"multipleOf": arg},
                "reason": "considered value is not a multiple of the specified value",
                **_considered(value)}
    if keyword == "enum":
        if any(_id_key(value) == _id_key(option) for option in arg):
            return None
        return {"operatorName": "enum", "specifiedAs": {"enum": list(arg)},
                "reason": "value was not found in enum", **_considered(value)}
    if keyword in ("minLength", "maxLength") and is_str:
        n = len(value)
        if (n >= arg) if keyword == "minLength" else (n <= arg):
            return None
        return {"operatorName": keyword, "specifiedAs": {keyword: arg},
                "reason": "specified string length was not satisfied", **_considered(value)}
    if keyword == "pattern" and is_str:
        if re.search(arg, value):
            return None
        return {"operatorName": "pattern", "specifiedAs": {"pattern": arg},
                "reason": "regular expression did not match", **_considered(value)}
    if keyword in ("minItems", "maxItems") and is_arr:
        n = len(value)
        if (n >= arg) if keyword == "minItems" else (n <= arg):
            return None
        return {"operatorName": keyword, "specifiedAs": {keyword: arg},
                "reason": "array did not match specified length", **_considered(value)}
    if keyword == "uniqueItems" and is_arr and arg is True:
        seen: set[bytes] = set()
        for item in value:
            key = _id_key(item)
            if key in seen:
                return {"operatorName": "uniqueItems", "specifiedAs": {"uniqueItems": True},
                        "reason": "found a duplicate item", **_considered(value),
                        "duplicatedValue": item}
            seen.add(key)
        return None
    if keyword == "items" and is_arr:
        subs = arg if isinstance(arg, list) else None
        for index, item in enumerate(value):
            sub = arg if subs is None else (subs[index] if index < len(subs) else None)
            if sub is None:
                continue
            details = _object_rules(sub, item)
            if details:
                return {"operatorName": "items",
                        "reason": "At least one item did not match the sub-schema",
                        "itemIndex": index, "details": details}
        return None
    if keyword == "allOf":
        for sub in arg:
            details = _object_rules(sub, value)
            if details:
                return {"operatorName": "allOf", "schemasNotSatisfied": [
                    {"index": arg.index(sub), "details": details}]}
        return None
    if keyword == "anyOf":
        failed = [{"index": i, "details": d} for i, sub in enumerate(arg)
                  if (d := _object_rules(sub, value))]
        if len(failed) < len(arg):
            return None
        return {"operatorName": "anyOf", "schemasNotSatisfied": failed}
    if keyword == "oneOf":
        failed = [{"index": i, "details": d} for i, sub in enumerate(arg)
                  if (d := _object_rules(sub, value))]
        passed = len(arg) - len(failed)
        if passed == 1:
            return None
        if passed == 0:
            return {"operatorName": "oneOf", "schemasNotSatisfied": failed}
        return {"operatorName": "oneOf", "reason": "more than one subschema matched",
                "matchingSchemaIndexes": [i for i in range(len(arg))
                                          if all(f["index"] != i for f in failed)]}
    if keyword == "not":
        if _object_rules(arg, value):
            return None
        return {"operatorName": "not", "reason": "child expression matched"}
    return None  # title, description, and keywords on values of other types
