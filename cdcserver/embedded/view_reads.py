"""What `$lookup`, `$graphLookup` and `$unionWith` read under a name that is a view.

mongod resolves every namespace a pipeline involves before it runs (resolveInvolvedNamespaces,
view_catalog_helpers::resolveView): a view reads as its `viewOn` collection with the view's
pipeline in front (a view on a view: the innermost view's stages first), under the view's
default collation; a time-series collection reads as its view (the buckets unpacked into
measurements). This module gives the query engine's resolver (catalog.py `query_database`)
those documents, computed when the stage runs, so a transaction's snapshot is what it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cdcserver.embedded import engine, query, timeseries
from cdcserver.embedded.store_types import Collection
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
