"""The embedded store's TTL monitor: deletes expired documents as mongod 8.0's does.

A mixin of `Store` (`store.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cdcserver.embedded.indexes import _path_values
from cdcserver.embedded.store_types import Txn
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection
else:
    StoreState = object  # a base for the type checker only (state.py)

BATCHED_DELETES_TARGET_DOCS = 100  # mongod's batchedDeletesTargetBatchDocs
# mongod's default ttlMonitorSleepSecs: the interval of a monitor turned on at runtime when the
# configuration turned it off (ttl_monitor_sleep_secs = 0).
TTL_MONITOR_SLEEP_SECS = 60.0


def _ttl_date(doc: Mapping[str, Any], path: str) -> datetime.datetime | None:
    """The date a TTL index reads from `doc`: the field's date, or an array's earliest one."""
    values = _path_values(doc, path.split("."))
    dates = [v for v in values if isinstance(v, datetime.datetime)]
    if not dates:
        return None
    return min(d.replace(tzinfo=None) for d in dates)


class TTLMixin(StoreState):
    """mongod's TTL monitor."""

    async def ttl_monitor(self) -> None:
        """mongod's TTL monitor: a pass every `ttl_monitor_sleep_secs`, skipped while
        `ttl_monitor_enabled` is false (TTLMonitor::run reads ttlMonitorEnabled after each
        sleep: setParameter stops and restarts it). The server runs it among its background
        tasks (the store lives on the server's loop) and cancels it at close."""
        while True:
            sleep = self.ttl_monitor_sleep_secs
            await asyncio.sleep(sleep if sleep > 0 else TTL_MONITOR_SLEEP_SECS)
            if not self.ttl_monitor_enabled:
                continue
            with contextlib.suppress(MongoError):  # a failed commit (logged): next pass
                self.ttl_pass()

    def ttl_pass(self, now: datetime.datetime | None = None) -> int:
        """One TTL monitor pass: delete the documents whose TTL index date is past
        `expireAfterSeconds` (the earliest date of an array; non-dates never expire). As mongod
        8.0 does it: deletes batched per index into one `applyOps` entry (without lsid) of up to
        `batchedDeletesTargetBatchDocs` (100), a batch of one as a plain delete entry, and one
        delete entry per document on collections with pre-images (their deletes are not
        batched). Returns the number of documents deleted."""
        now = (now or datetime.datetime.now(datetime.UTC)).replace(tzinfo=None)
        deleted = 0
        with self.batch():
            if self.txn is not None:
                return 0
            for c in list(self.catalog.values()):
                for spec in list(c.indexes[1:]):
                    expire = spec.get("expireAfterSeconds")
                    if expire is None or len(spec["key"]) != 1:
                        continue
                    field_path = next(iter(spec["key"]))
                    limit = now - datetime.timedelta(seconds=float(expire))
                    expired = []
                    for key, doc in self.documents(c).items():
                        if (c.uuid, key) in self._owners:
                            continue  # mongod's pass meets a write conflict: a later pass
                        when = _ttl_date(doc, field_path)
                        if when is not None and when <= limit:
                            expired.append((when, doc))
                    expired.sort(key=lambda pair: pair[0])  # the index's order
                    docs = [doc for _, doc in expired]
                    if c.pre_images:
                        for doc in docs:
                            self.delete_document(c, doc)
                    else:
                        for i in range(0, len(docs), BATCHED_DELETES_TARGET_DOCS):
                            self._batched_delete(c, docs[i:i + BATCHED_DELETES_TARGET_DOCS])
                    deleted += len(docs)
        return deleted

    def _batched_delete(self, c: Collection, docs: list[dict[str, Any]]) -> None:
        if len(docs) == 1:
            self.delete_document(c, docs[0])
            return
        batch = Txn({}, -1)  # collects the deletes as a transaction collects its operations
        self.txn = batch
        try:
            for doc in docs:
                self.delete_document(c, doc)
        finally:
            self.txn = None
        self.append_oplog("c", "admin.$cmd", {"applyOps": batch.ops})
        if self.persist is not None:
            for uuid, key, _ in batch.persist:
                self.persist.delete_document(uuid, key)
