"""What `$lookup`, `$graphLookup` and `$unionWith` read under a name that is a view.

mongod resolves every namespace a pipeline involves before it runs (resolveInvolvedNamespaces,
view_catalog_helpers::resolveView): a view reads as its `viewOn` collection with the view's
pipeline in front (a view on a view: the innermost view's stages first), under the view's
default collation; a time-series collection reads as its view (the buckets unpacked into
measurements). This module gives the query engine's resolver (catalog.py `query_database`)
those documents, computed when the stage runs, so a transaction's snapshot is what it reads;
the aggregation must run under each such view's default collation (`check_view_collations`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from cdcserver.embedded import engine, query, timeseries
from cdcserver.embedded.store_types import Collection
from pipeline_stages import collation
from pipeline_stages.errors import MongoError
from pipeline_stages.query_engine import Database


class _Catalog(Protocol):
    def get(self, db: str, coll: str) -> Collection | None: ...

    def view(self, db: str, name: str) -> dict[str, Any] | None: ...

    def resolve_view(self, db: str, name: str) -> tuple[str, list[Any]] | None: ...

    def query_database(self, db: str) -> Database: ...


def resolved_documents(
    catalog: _Catalog, db: str, name: str,
    records: Callable[[Collection], Mapping[bytes, dict[str, Any]]],
) -> Mapping[bytes, dict[str, Any]] | None:
    """The documents `db.name` reads as (key -> document, natural order): a collection's own
    (`records(c)`, shared), a view's or a viewless time-series collection's computed (fresh
    documents under made-up keys), None when there is no such namespace."""
    c = catalog.get(db, name)
    base: Collection | None
    if c is not None and not timeseries.is_viewless(c):
        return records(c)
    if c is not None:  # 9.0's viewless time-series collection: read as its view did
        base, pipeline, collation = c, timeseries.view_pipeline(c.options["timeseries"]), (
            c.options.get("collation"))
    else:
        view = catalog.view(db, name)
        resolved = catalog.resolve_view(db, name) if view is not None else None
        if view is None or resolved is None:
            return None
        base_name, pipeline = resolved
        base = catalog.get(db, base_name)
        if base is not None and timeseries.is_viewless(base):  # a view on one
            pipeline = [*timeseries.view_pipeline(base.options["timeseries"]), *pipeline]
        collation = view.get("collation")
    docs = [engine.copy_document(d) for d in records(base).values()] if base is not None else []
    stages = [engine.normalize(dict(s)) for s in pipeline]
    out: list[Any] = []
    query.run_sync(query.pipeline(docs, catalog.query_database(db), stages, out,
                                  collation=query.collation_of(collation)))
    return {i.to_bytes(8, "big"): d for i, d in enumerate(out)}


def _involved(pipeline: Any) -> Iterator[str]:
    """The names a pipeline reads besides its own collection (LiteParsedPipeline's involved
    namespaces): `$lookup` / `$graphLookup` `from`, `$unionWith`, in sub-pipelines too."""
    for stage in pipeline if isinstance(pipeline, list) else []:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            continue
        name, arg = next(iter(stage.items()))
        if name == "$unionWith" and isinstance(arg, str):
            yield arg
        elif name in ("$lookup", "$graphLookup", "$unionWith") and isinstance(arg, Mapping):
            source = arg.get("coll" if name == "$unionWith" else "from")
            if isinstance(source, str):
                yield source
            yield from _involved(arg.get("pipeline"))
        elif name == "$facet" and isinstance(arg, Mapping):
            for sub in arg.values():
                yield from _involved(sub)


def _collator(spec: Any) -> tuple[Any, ...] | None:
    """What tells two collations apart (None: the simple one)."""
    parsed = collation.parse_collation(spec, "aggregate") if spec else None
    if parsed is None:
        return None
    return (spec.get("locale"), *sorted(parsed.spec.items()))


def check_view_collations(catalog: _Catalog, db: str, pipeline: Any, spec: Any) -> None:
    """collatorCompatibleWithPipeline: every view the pipeline reads must have the default
    collation the aggregation runs under (`spec`: the command's, else its collection's or
    view's default), 167 OptionNotSupportedOnView otherwise (the namespace appended to the
    message as mongod appends it, without a space)."""
    wanted = _collator(spec)
    for name in dict.fromkeys(_involved(pipeline)):
        if catalog.get(db, name) is not None:
            continue
        view = catalog.view(db, name)
        if view is not None and _collator(view.get("collation")) != wanted:
            raise MongoError(167, f"Cannot override a view's default collation{db}.{name}")
