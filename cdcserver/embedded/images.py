"""The embedded store's images: `config.system.preimages` and `config.image_collection`.

Pre-images of collections with `changeStreamPreAndPostImages` (what change streams'
`fullDocumentBeforeChange` reads, through `StoreImages`), and the pre- or post-image a
retryable findAndModify keeps for its retry (mongod 8.0's `needsRetryImage`). A mixin of
`Store` (`store.py`).

Pre-images leave with the oplog entries they belong to (`oplog_writer._truncate`) and, once
the `changeStreamOptions` cluster parameter sets `preAndPostImages.expireAfterSeconds`, when
older than that: mongod's pre-image remover (ChangeStreamExpiredPreImagesRemover), a pass every
`expiredChangeStreamPreImageRemovalJobSleepSecs` (`pre_image_remover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.embedded.sessions import OpSession, session_key
from cdcserver.embedded.store_types import id_key
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import (
    _pre_image_key,
    pre_image_id,
)

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection
else:
    StoreState = object  # a base for the type checker only (state.py)

# Where mongod keeps its cluster parameters, one document per parameter (`_id`: its name).
CLUSTER_PARAMETERS = ("config", "clusterParameters")
CHANGE_STREAM_OPTIONS = "changeStreamOptions"
# mongod's expiredChangeStreamPreImageRemovalJobSleepSecs (its default).
PRE_IMAGE_REMOVAL_SLEEP_SECS = 10.0


def expire_after_seconds(options: Mapping[str, Any] | None) -> int | None:
    """The `preAndPostImages.expireAfterSeconds` of a `changeStreamOptions` document (None:
    "off", the oplog alone decides). Its value was checked when set: a positive number or
    "off"; a number is read as IDL `safeInt64` reads it (truncated)."""
    images = options.get("preAndPostImages") if options is not None else None
    value = images.get("expireAfterSeconds") if isinstance(images, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


class ImagesMixin(StoreState):
    """Pre-images and retryable findAndModify images."""

    pre_image_removal_sleep_secs: float = PRE_IMAGE_REMOVAL_SLEEP_SECS

    def cluster_parameter(self, name: str) -> dict[str, Any] | None:
        """Cluster parameter `name`'s document in `config.clusterParameters` (None: never set,
        its default applies): what mongod reads into memory at start and on each write."""
        c = self.catalog.get(CLUSTER_PARAMETERS)
        return c.records.get(id_key(name)) if c is not None else None

    def remove_expired_pre_images(self, now: datetime.datetime | None = None) -> int:
        """One pass of mongod's pre-image remover: with `changeStreamOptions`'
        `expireAfterSeconds` set, every pre-image whose `operationTime` is that many seconds
        before `now` or more is deleted (with "off" only the oplog's truncation removes them).
        Returns how many were deleted."""
        expire = expire_after_seconds(self.cluster_parameter(CHANGE_STREAM_OPTIONS))
        if expire is None:
            return 0
        now = now or datetime.datetime.now(datetime.UTC)
        limit = _utc_naive(now) - datetime.timedelta(seconds=expire)
        with self.batch():  # durable when the batch ends (a command's, if one is running)
            expired = [key for key, (_, when) in self._pre_image_meta.items()
                       if _utc_naive(when) <= limit]
            for key in expired:
                self.images._pre_images.pop(key, None)
                self._pre_image_meta.pop(key, None)
                self._pre_image_ts.pop(key, None)
            if expired and self.persist is not None:
                self.persist.delete_pre_images(expired)
        return len(expired)

    async def pre_image_remover(self) -> None:
        """mongod's periodic pre-image remover: a pass every `pre_image_removal_sleep_secs`.
        The server runs it among its background tasks, as the TTL monitor."""
        while True:
            await asyncio.sleep(self.pre_image_removal_sleep_secs)
            with contextlib.suppress(MongoError):  # a failed commit (logged): next pass
                self.remove_expired_pre_images()

    def _save_pre_image(
        self, c: Collection, ts: Timestamp, wall: datetime.datetime, pre: dict[str, Any],
        index: int = 0,
    ) -> None:
        if self.txn is not None:  # ts is the op's index until the applyOps entry is written
            self.txn.pre_images.append((c, ts.inc, pre))
            return
        doc: dict[str, Any] = {
            "_id": pre_image_id(c.ui, ts, index), "operationTime": wall, "preImage": pre
        }
        key = _pre_image_key(doc["_id"])
        self.images._pre_images[key] = pre
        self._pre_image_ts[key] = ts
        self._pre_image_meta[key] = (doc["_id"], wall)
        if self.persist is not None:
            self.persist.put_pre_image(key, ts, bson_bytes.encode(doc))

    def pre_image_documents(self, keys: Sequence[bytes] | None = None) -> list[dict[str, Any]]:
        """`config.system.preimages` as mongod holds it (`{_id: {nsUUID, ts, applyOpsIndex},
        operationTime, preImage}`, in `_id` order): all, or those with the given keys."""
        if keys is None:
            keys = list(self._pre_image_meta)
        out: list[dict[str, Any]] = []
        for key in keys:
            meta = self._pre_image_meta.get(key)
            image = self.images._pre_images.get(key)
            if meta is None or image is None:
                continue
            out.append({"_id": meta[0], "operationTime": meta[1], "preImage": image})
        out.sort(key=lambda d: (bytes(d["_id"]["nsUUID"]), d["_id"]["ts"],
                                d["_id"]["applyOpsIndex"]))
        return out

    # -- retryable findAndModify images -----------------------------------------------------------

    def _retry_image_kind(self, session: OpSession | None, kind: str | None) -> str | None:
        """mongod 8.0 keeps a retryable findAndModify's pre- or post-image in
        `config.image_collection` (and marks the entry with `needsRetryImage`); not in a
        transaction (its oplog entries are applyOps)."""
        return kind if session is not None and self._txn() is None else None

    def _save_retry_image(
        self, session: OpSession, ts: Timestamp, kind: str, image: dict[str, Any]
    ) -> None:
        doc = {"_id": session.lsid, "txnNum": Int64(session.txn_number), "ts": ts,
               "imageKind": kind, "image": image, "invalidated": False}
        sid = session_key(session.lsid)  # config.image_collection's _id: the whole lsid
        self.retry_images[sid] = doc
        if self.persist is not None:
            self.persist.put_retry_image(sid, bson_bytes.encode(doc))

    def retry_image(
        self, lsid: Mapping[str, Any], txn_number: int, ts: Timestamp | None
    ) -> Any:
        """The image a retried findAndModify answers with, or None when it is gone (a newer
        statement of the session replaced it)."""
        doc = self.retry_images.get(session_key(lsid))
        if doc is None or int(doc["txnNum"]) != txn_number or doc.get("invalidated"):
            return None
        if ts is not None and doc["ts"] != ts:
            return None
        return doc["image"]

    def image_collection(self) -> list[dict[str, Any]]:
        """`config.image_collection` as mongod holds it."""
        return list(self.retry_images.values())


def _utc_naive(when: datetime.datetime) -> datetime.datetime:
    """`when` as a naive UTC datetime: the store keeps aware ones, a reloaded store naive."""
    if when.tzinfo is None:
        return when
    return when.astimezone(datetime.UTC).replace(tzinfo=None)
