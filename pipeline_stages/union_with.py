"""`$unionWith` (document_source_union_with.cpp): the input's documents, then those of another
collection run through a sub-pipeline.

Pure: the other collection's documents come from the `Database` the engine passes to the stage
(the same one `$lookup` reads), and the sub-pipeline runs through the engine's own pipeline
runner, which the caller hands in. The spec is parsed as mongod's IDL parser does
(UnionWithSpec: `coll` a string, `pipeline` an array of objects, nothing else), in field order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline_stages import query_engine
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

__all__ = ["parse", "union_with"]

STAGE = "$unionWith"

RunPipeline = Callable[[list[Any], Any, list[Any]], list[Any]]

_COLLECTIONLESS = ("$unionWith stage without explicit collection must have a pipeline with "
                   "$documents as first stage")
# Stages whose constraints refuse a place in a union's sub-pipeline (isAllowedInUnionPipeline).
_NOT_IN_UNION = ("$out", "$merge", "$changeStream")


def _wrong_type(field: str, value: Any, expected: str) -> MongoError:
    return MongoError(14, f"BSON field '{STAGE}.{field}' is the wrong type "
                      f"'{type_name(value)}', expected type '{expected}'")


def parse(spec: Any) -> tuple[str | None, list[Any]]:
    """(collection or None for the collection-less form, sub-pipeline), or mongod's error."""
    if isinstance(spec, str):
        return spec, []
    if not isinstance(spec, Mapping):
        raise MongoError(9, "the $unionWith stage specification must be an object or string, "
                         f"but found {type_name(spec)}")
    coll: str | None = None
    pipeline: list[Any] | None = None
    for field, value in spec.items():
        if field == "coll":
            if not isinstance(value, str):
                raise _wrong_type("coll", value, "string")
            coll = value
        elif field == "pipeline":
            if not isinstance(value, list):
                raise _wrong_type("pipeline", value, "array")
            for i, stage in enumerate(value):
                if not isinstance(stage, Mapping):
                    raise _wrong_type(f"pipeline.{i}", stage, "object")
            pipeline = list(value)
        else:
            raise MongoError(40415, f"BSON field '{STAGE}.{field}' is an unknown field.")
    if coll is None:
        if not pipeline or "$documents" not in pipeline[0]:
            raise MongoError(9, _COLLECTIONLESS)
    for stage in pipeline or []:
        name = next(iter(stage), "")
        if name in _NOT_IN_UNION:
            raise MongoError(31441, f"{name} is not allowed within a $unionWith's sub-pipeline")
    return coll, pipeline or []


def _documents(spec: Any) -> list[dict[str, Any]]:
    """A `$documents` stage's documents (its expression evaluated on no document)."""
    values = spec
    if not isinstance(values, list):
        try:
            values = query_engine.evaluate(spec, {}, None)
        except KeyError:
            values = None
    if not isinstance(values, list) or not all(isinstance(v, Mapping) for v in values):
        raise MongoError(5858203, "error during evaluation of the $documents expression: "
                         "an array of objects is required")
    return [query_engine.normalize(dict(v)) for v in values]


def union_with(docs: list[Any], database: Any, spec: Any, run: RunPipeline) -> list[Any]:
    """The stage's output: `docs`, then the other collection's documents through the
    sub-pipeline (`run(documents, database, pipeline)` is the engine's pipeline)."""
    coll, pipeline = parse(spec)
    if coll is None:
        foreign = _documents(pipeline[0]["$documents"])
        pipeline = pipeline[1:]
    else:
        stored = database.documents(coll) if database is not None else []
        foreign = [query_engine.copy_document(d) for d in stored]
    return [*docs, *run(foreign, database, pipeline)]
