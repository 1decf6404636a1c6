"""A merged change stream's `updateLookup`, routed as mongos routes it.

The shard that wrote an update event need not hold the document any more: a migration may have
moved it since. mongos looks the current document up through the router
(`MongosProcessInterface::lookupSingleDocument`): a `find` of the documentKey targeted by the
routing table (the shard owning its shard key; every shard holding the collection when the
key lacks a shard-key field; the database's primary for an unsharded collection), the results
of every targeted shard taken together, and 280 ChangeStreamFatalError when more than one
document matches. Pre-images stay where the event was written (each shard keeps its own
`config.system.preimages`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cdcserver.sharding.catalog import ShardingCatalog, hashed_value
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import Document, ImageSource
from pipeline_stages.value_string import document_string


class RoutedImages:
    """The `ImageSource` of a shard's part of a merged stream: its own pre-images, current
    documents looked up on the shards the router targets."""

    def __init__(self, catalog: ShardingCatalog, shards: Callable[[], Mapping[str, ImageSource]],
                 local: str) -> None:
        self.catalog = catalog
        self.shards = shards  # each member shard's own images, by name (asked each time)
        self.local = local  # the shard whose events these are

    def pre_images(self, ids: Sequence[Document]) -> list[Document | None]:
        return self.shards()[self.local].pre_images(ids)

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        shards = self.shards()
        out: list[Document | None] = []
        for key in keys:
            found: list[Document] = []
            for name in self._targets(db, coll, key):
                images = shards.get(name)
                if images is None:
                    continue
                doc = images.current_documents(db, coll, uuid, [key])[0]
                if doc is not None:
                    found.append(doc)
                if len(found) > 1:
                    raise MongoError(
                        280, f"found more than one document matching {document_string(key)} "
                        f"[{document_string(found[0])}, {document_string(found[1])}]",
                    )
            out.append(found[0] if found else None)
        return out

    def _targets(self, db: str, coll: str, key: Document) -> list[str]:
        catalog = self.catalog
        ns = f"{db}.{coll}"
        pattern = catalog.key_pattern(ns)
        if pattern is None:  # unsharded: its database's primary shard
            return [catalog.primary(db) or self.local]
        if all(field in key for field in pattern):
            values = [hashed_value(key[f]) if kind == "hashed" else key[f]
                      for f, kind in pattern.items()]
            return [str(catalog.chunk_for_values(ns, values)["shard"])]
        owners = {str(c["shard"]) for c in catalog.chunks.get(ns, [])}
        return sorted(owners)  # the key lacks a shard-key field: every shard holding chunks
