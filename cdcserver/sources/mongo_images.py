"""Pre-images and updateLookup documents from the upstream, fetched before a push runs.

The pipeline never looks a document up itself: with `UpstreamImages` as its image source (an
`ExternalImages`), a push whose events need images returns a `NeedsLookup`
(pipeline_stages/lookups.py) and runs nothing. `fetch` then reads what it names with
AsyncMongoClient, concurrently, each read bounded by `lookup_timeout_ms`:

* `find {_id: {$in: [...]}}` on `config.system.preimages` for pre-images and
  `whenAvailable` / `required` post-images (answered from the retained log first, when there
  is one);
* `find {_id: {$in: [...]}}` on the event's collection for `updateLookup` (one query per
  namespace; a documentKey without `_id` has its own `{$match: documentKey}` query), after
  checking with `listCollections` that the collection still has the event's UUID.

A failure is recorded as the error of the lookups it covers, raised when a stage asks for one
of them: a resumable error for the stream (6 or 89), or the upstream's own answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bson.binary import Binary
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.materialize.protocol import CopyImages
from cdcserver.sources.mongo_common import RAW, UpstreamLink
from cdcserver.sources.retained import pre_image_key
from pipeline_stages.image_source import Document, equality_key
from pipeline_stages.lookups import ExternalImages, LookupAnswers, Namespace, NeedsLookup


def pre_image_tuple(id_doc: Mapping[str, Any]) -> tuple[bytes, Timestamp, int]:
    """A pre-image `_id` as (nsUUID bytes, ts, applyOpsIndex)."""
    return (bytes(id_doc["nsUUID"]), id_doc["ts"], int(id_doc["applyOpsIndex"]))


def pre_image_query_id(id_doc: Mapping[str, Any]) -> dict[str, Any]:
    """A pre-image `_id` as config.system.preimages stores it (nsUUID as UUID binary)."""
    uuid = id_doc["nsUUID"]
    return {
        "nsUUID": uuid if isinstance(uuid, Binary) else Binary(bytes(uuid), 4),
        "ts": id_doc["ts"],
        "applyOpsIndex": id_doc["applyOpsIndex"],
    }


def _uuid_of(infos: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The collection UUID in a listCollections answer (None: no such collection)."""
    if not infos:
        return None
    value = (infos[0].get("info") or {}).get("uuid")
    if value is None:
        return None
    return bytes(value.bytes if hasattr(value, "bytes") else value)


class UpstreamImages(ExternalImages):
    """The image source of pipelines reading a live upstream: it answers nothing synchronously;
    `fetch` reads what a push said it needs into its `LookupAnswers`."""

    def __init__(self, source: UpstreamLink) -> None:
        self.source = source
        # (db, coll) -> (uuid bytes or None, read at (monotonic), DDL generation)
        self._uuids: dict[tuple[str, str], tuple[bytes | None, float, int]] = {}
        self.queries = 0  # round trips made (tests check batching)
        # A materialized copy (cdcserver/materialize/): it answers the pre-images of its
        # namespaces at the event's own time; the rest are read as below.
        self.copy: CopyImages | None = None

    def _timeout(self) -> Any:
        import pymongo

        return pymongo.timeout(self.source.options.lookup_timeout_ms / 1000)

    async def fetch(self, needs: NeedsLookup, answers: LookupAnswers) -> None:
        """Read the pre-images and documents `needs` names into `answers` (concurrently)."""
        jobs = []
        pre_images: Sequence[Mapping[str, Any]] = needs.pre_images
        if pre_images and self.copy is not None:
            pre_images = await self.copy.answer_pre_images(
                pre_images, answers, self.source.options.lookup_timeout_ms / 1000)
        if pre_images:
            jobs.append(self._fetch_pre_images(answers, pre_images))
        for ns, keys in needs.documents.items():
            jobs.append(self._fetch_documents(answers, ns, keys))
        if jobs:
            await asyncio.gather(*jobs)

    async def _fetch_pre_images(
        self, answers: LookupAnswers, ids: Sequence[Mapping[str, Any]]
    ) -> None:
        import pymongo

        what = "reading pre-images"
        found: dict[tuple[bytes, Timestamp, int], Document] = {}
        missing = self._retained_pre_images(ids, found)
        failed: set[tuple[bytes, Timestamp, int]] = set()  # their error is recorded
        if missing:
            error: BaseException | None = None
            try:
                self.source.lookup_allowed(what)
                coll = self.source.async_client().config.get_collection(
                    "system.preimages", codec_options=RAW
                )
                with self._timeout():
                    self.queries += 1
                    docs = await coll.find(
                        {"_id": {"$in": [pre_image_query_id(i) for i in missing]}}
                    ).to_list()
            except pymongo.errors.PyMongoError as exc:
                error = self.source.lookup_error(what, exc)
            except Exception as exc:  # noqa: BLE001 - lookup_allowed's: raised where asked
                error = exc
            else:
                for doc in docs:
                    image = doc.get("preImage")
                    if isinstance(image, Mapping):
                        found[pre_image_tuple(doc["_id"])] = image
            if error is not None:
                answers.fail_pre_images(missing, error)
                failed = {pre_image_tuple(i) for i in missing}
        for id_doc in ids:
            key = pre_image_tuple(id_doc)
            if key not in failed:
                answers.put_pre_image(id_doc, found.get(key))

    def _retained_pre_images(
        self, ids: Sequence[Mapping[str, Any]], table: dict[tuple[bytes, Timestamp, int], Document]
    ) -> list[Mapping[str, Any]]:
        """Answer from the retained log what it kept (into `table`); the ids left to ask the
        upstream for (it may still have what the log has not fetched yet)."""
        retained = self.source.retained
        if retained is None or not ids:
            return list(ids)
        keys = [pre_image_tuple(i) for i in ids]
        found = retained.pre_images([pre_image_key(k[0], k[1], k[2]) for k in keys])
        if not found:
            return list(ids)
        missing = []
        for id_doc, key in zip(ids, keys):
            image = found.get(pre_image_key(key[0], key[1], key[2]))
            if image is None:
                missing.append(id_doc)
            else:
                table[key] = RawBSONDocument(image, codec_options=RAW)
        return missing

    async def _fetch_documents(
        self, answers: LookupAnswers, ns: Namespace, keys: Sequence[Document]
    ) -> None:
        import pymongo

        db, coll, uuid = ns
        what = "looking up the current documents"
        try:
            self.source.lookup_allowed(what)
            with self._timeout():
                if uuid is not None and await self._collection_uuid(db, coll) != uuid:
                    answers.collection_gone(ns)
                    return
                collection = self.source.async_client()[db].get_collection(
                    coll, codec_options=RAW
                )
                ids, seen = [], set()
                for key in keys:
                    if "_id" in key:
                        k = equality_key(key["_id"])
                        if k not in seen:
                            seen.add(k)
                            ids.append(key["_id"])
                by_id: dict[bytes, list[Document]] = {}
                if ids:
                    self.queries += 1
                    docs = await collection.find({"_id": {"$in": ids}}).to_list()
                    for doc in docs:
                        by_id.setdefault(equality_key(doc["_id"]), []).append(doc)
                for key in keys:
                    if "_id" in key:
                        candidates = by_id.get(equality_key(key["_id"]), [])
                    else:  # a documentKey without _id: its own query
                        self.queries += 1
                        candidates = await collection.find(dict(key), limit=2).to_list()
                    answers.put_document_candidates(ns, key, candidates)
        except pymongo.errors.PyMongoError as exc:
            answers.fail_documents(ns, self.source.lookup_error(what, exc))
        except Exception as exc:  # noqa: BLE001 - lookup_allowed's: raised where asked
            answers.fail_documents(ns, exc)

    # -- collection UUIDs (updateLookup's check), cached briefly --------------------------------

    async def _collection_uuid(self, db: str, coll: str) -> bytes | None:
        source = self.source
        cached = self._uuids.get((db, coll))
        if (
            cached is not None
            and cached[2] == source.ddl_generation
            and time.monotonic() - cached[1] < source.options.uuid_cache_s
        ):
            return cached[0]
        read_at, generation = time.monotonic(), source.ddl_generation
        self.queries += 1
        cursor = await source.async_client()[db].list_collections(filter={"name": coll})
        uuid = _uuid_of(await cursor.to_list())
        if len(self._uuids) > 10_000:
            self._uuids.clear()
        self._uuids[(db, coll)] = (uuid, read_at, generation)
        return uuid
