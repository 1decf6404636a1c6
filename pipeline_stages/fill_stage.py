"""`$fill` (document_source_fill.cpp) for the embedded store's aggregations.

mongod parses `$fill` into the stages it stands for, and so does this module: the `method`
outputs become one `$setWindowFields` (`locf` is `$locf`, `linear` is `$linearFill`, over the
field itself, with the stage's `sortBy` and `partitionBy` / `partitionByFields`), the `value`
outputs one `$addFields` of `{$ifNull: ["$<field>", <value>]}` after it. The spec is checked
as FillSpec / FillOutputSpec are, with mongod's codes and messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages import query_engine, window_stage
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

__all__ = ["fill"]

STAGE = "$fill"


def _wrong_type(field: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '{STAGE}.{field}' is the wrong type "
                      f"'{type_name(value)}', expected type '{expected}'")


def _unknown(field: str) -> MongoError:
    return MongoError(40415, f"BSON field '{STAGE}.{field}' is an unknown field.")


def _plan(spec: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the `$setWindowFields` spec or None, the `$addFields` spec)."""
    if not isinstance(spec, Mapping):
        raise MongoError(9, f"The {STAGE} stage specification must be an object, found "
                         f"{type_name(spec)}")
    sort_by: Any = None
    partition_by: Any = None
    partition_fields: list[str] | None = None
    output: Mapping[str, Any] | None = None
    for field, value in spec.items():
        if field == "sortBy":
            if not isinstance(value, Mapping):
                raise _wrong_type(field, value, "object")
            sort_by = value
        elif field == "partitionBy":
            if not isinstance(value, (str, Mapping)):
                raise MongoError(14, f"BSON field '{STAGE}.partitionBy' is the wrong type "
                                 f"'{type_name(value)}', expected types '[string, object]'")
            partition_by = value
        elif field == "partitionByFields":
            if not isinstance(value, list):
                raise _wrong_type(field, value, "array")
            for i, name in enumerate(value):
                if not isinstance(name, str):
                    raise _wrong_type(f"{field}.{i}", name, "string")
            partition_fields = list(value)
        elif field == "output":
            if not isinstance(value, Mapping):
                raise _wrong_type(field, value, "object")
            output = value
        else:
            raise _unknown(field)
    if output is None:
        raise MongoError(40414, f"BSON field '{STAGE}.output' is missing but a required field")
    if not output:
        raise MongoError(6050203, "The output field in '$fill' must contain an object with at "
                         "least one element")
    window_output: dict[str, Any] = {}
    add_fields: dict[str, Any] = {}
    for name, field_spec in output.items():
        if not isinstance(field_spec, Mapping):
            raise MongoError(6050200, "Each fill output specification must be an object with "
                             "exactly one field")
        method: str | None = None
        has_value = False
        fill_value: Any = None
        for key, arg in field_spec.items():
            if key == "method":
                if not isinstance(arg, str):
                    raise _wrong_type(key, arg, "string")
                method = arg
            elif key == "value":
                has_value, fill_value = True, arg
            else:
                raise _unknown(key)
        if method is not None:
            if has_value:
                raise MongoError(6050201, "Each fill output specification must have exactly one "
                                 "of 'method' or 'value' fields, not both")
            if method not in ("locf", "linear"):
                raise MongoError(6050202, "Method must be either locf or linear")
            function = "$linearFill" if method == "linear" else "$locf"
            window_output[name] = {function: "$" + name}
        if has_value:
            add_fields[name] = {"$ifNull": ["$" + name, fill_value]}
    window: dict[str, Any] = {"output": window_output}
    if sort_by is not None:
        window["sortBy"] = sort_by
    if partition_by is not None:
        if partition_fields is not None:
            raise MongoError(6050204, "Maximum one of 'partitionBy' and 'partitionByFields can "
                             "be specified in '$fill'")
        window["partitionBy"] = partition_by
    if partition_fields is not None:
        window["partitionBy"] = {name: "$" + name for name in partition_fields}
    return (window if window_output else None), add_fields


def fill(docs: list[Any], spec: Any) -> list[Any]:
    """The documents out of `{$fill: spec}`."""
    window, add_fields = _plan(spec)
    out = docs
    if window is not None:
        out = window_stage.set_window_fields(out, window)
    if add_fields and out:
        out = query_engine.process_pipeline(out, None, [{"$addFields": add_fields}])
    return out
