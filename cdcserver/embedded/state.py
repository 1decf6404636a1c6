"""What the store's mixins (catalog.py, indexes.py, writes.py, transactions.py, images.py,
ttl.py, oplog_writer.py) share, declared once for the type checker.

`Store` (store.py) assembles the mixins and sets these attributes in its `__init__`; each
mixin uses some that another mixin or the store owns. The mixins inherit `StoreState` only
under `TYPE_CHECKING` (at run time their base stays `object`), so it changes nothing when the
server runs: it lets mypy check each mixin against the attributes and methods of the others.
Its methods are the signatures of the mixins' own (kept equal: mypy checks the overrides).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from bson.binary import Binary
from bson.timestamp import Timestamp

from cdcserver.sources.base import EntryList

if TYPE_CHECKING:
    from cdcserver.embedded.persist import Persistence
    from cdcserver.embedded.sessions import OpSession, Session, _Version
    from cdcserver.embedded.store_types import Collection, StoreImages, Txn


class StoreState(EntryList):
    """The attributes `Store.__init__` sets and the methods the mixins call on each other."""

    ttl_monitor_sleep_secs: float
    ttl_monitor_enabled: bool
    txn_oplog_entry_bytes: int
    txn_oplog_entry_ops: int
    catalog: dict[tuple[str, str], Collection]
    emptied_dbs: set[str]
    images: StoreImages
    oplog_size_bytes: int
    oplog_min_retention_hours: float
    _oplog_bytes: int
    _pending: list[tuple[Timestamp, bytes]]
    _last_ts: Timestamp
    _depth: int
    _lock: threading.RLock
    listeners: list[Callable[[], None]]
    sessions: dict[bytes, Session]
    _session_records: dict[bytes, dict[str, Any]]
    # each session this batch logged for, as it was before: (its Session, the OpSession,
    # prevOpTime, executed statements, last write), put back if the batch's commit fails
    _session_undo: dict[
        bytes, tuple[Session | None, OpSession, Timestamp | None, dict[int, Any], Timestamp | None]
    ]
    commit_failing: bool  # the last commit failed (logged once until one succeeds)
    transaction_records: dict[bytes, dict[str, Any]]
    _pre_image_ts: dict[bytes, Timestamp]
    _pre_image_meta: dict[bytes, tuple[dict[str, Any], datetime.datetime]]
    txn: Txn | None
    _owners: dict[tuple[bytes, bytes], Txn]
    _index_owners: dict[tuple[bytes, str, bytes], Txn]
    _live: dict[int, Txn]
    _seq: int
    _history: list[_Version]
    _retired: list[tuple[int, int, tuple[str, str], Collection]]
    _last_write: dict[tuple[bytes, bytes], int]
    _views: dict[bytes, Any]
    transaction_lifetime_limit_seconds: float
    waiting_writes: int
    retry_images: dict[bytes, dict[str, Any]]
    persist: Persistence | None

    # indexes.py
    def _add_index(self, c: Collection, spec: dict[str, Any], empty: bool) -> None:
        raise NotImplementedError

    # indexes.py
    @staticmethod
    def _apply_edits(
        edits: list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]], key: bytes
    ) -> None:
        raise NotImplementedError

    # indexes.py
    def _build_unique(self, c: Collection, spec: dict[str, Any]) -> None:
        raise NotImplementedError

    # indexes.py
    def _rebuild_unique(self, c: Collection) -> None:
        raise NotImplementedError

    # indexes.py
    def _check_unique(
        self, c: Collection, key: bytes, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        raise NotImplementedError

    # transactions.py
    def _check_write_conflict(self, c: Collection, key: bytes) -> None:
        raise NotImplementedError

    # indexes.py
    def _index_edits(
        self, c: Collection, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]]:
        raise NotImplementedError

    # catalog.py
    def _records(self, c: Collection) -> OrderedDict[bytes, dict[str, Any]]:
        raise NotImplementedError

    # transactions.py
    def _remember(
        self,
        c: Collection,
        key: bytes,
        before: dict[str, Any] | None,
        deleted: bool,
        docs: Mapping[bytes, Any],
    ) -> None:
        raise NotImplementedError

    # transactions.py
    def _restore_views(self) -> None:
        raise NotImplementedError

    # images.py
    def _retry_image_kind(self, session: OpSession | None, kind: str | None) -> str | None:
        raise NotImplementedError

    # catalog.py
    def _save_meta(self, c: Collection) -> None:
        raise NotImplementedError

    # images.py
    def _save_pre_image(
        self,
        c: Collection,
        ts: Timestamp,
        wall: datetime.datetime,
        pre: dict[str, Any],
        index: int = 0,
    ) -> None:
        raise NotImplementedError

    # images.py
    def _save_retry_image(
        self, session: OpSession, ts: Timestamp, kind: str, image: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    # transactions.py
    def _swap_view(self, c: Collection, txn: Txn) -> None:
        raise NotImplementedError

    # transactions.py
    def _txn(self) -> Txn | None:
        raise NotImplementedError

    # transactions.py
    def _txn_put(self, txn: Txn, c: Collection, key: bytes, doc: dict[str, Any] | None) -> None:
        raise NotImplementedError

    # oplog_writer.py
    @staticmethod
    def _update_o(
        pre: dict[str, Any],
        post: dict[str, Any],
        kind: str,
        update: Any,
        array_filters: list[Any] | None,
    ) -> dict[str, Any]:
        raise NotImplementedError

    # transactions.py
    def _write_conflict(self, txn: Txn) -> NoReturn:
        raise NotImplementedError

    # oplog_writer.py
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        raise NotImplementedError

    # writes.py
    def delete_document(
        self,
        c: Collection,
        pre: dict[str, Any],
        session: OpSession | None = None,
        stmt_id: int | None = None,
        retry_image: str | None = None,
    ) -> None:
        raise NotImplementedError

    # catalog.py
    def cap_collection(self, c: Collection, inserted: bytes) -> None:
        raise NotImplementedError

    def documents(self, c: Collection) -> dict[bytes, dict[str, Any]]:
        raise NotImplementedError

    # writes.py
    def insert_document(
        self,
        c: Collection,
        doc: dict[str, Any],
        session: OpSession | None = None,
        stmt_id: int | None = None,
        validate: bool = False,
        raw: bytes | None = None,
    ) -> None:
        raise NotImplementedError

    # oplog_writer.py
    def timeseries_uuids(self) -> set[bytes]:
        raise NotImplementedError

    # oplog_writer.py
    def append_oplog(
        self,
        op: str,
        ns: str,
        o: Mapping[str, Any],
        *,
        ui: Binary | None = None,
        o2: Mapping[str, Any] | None = None,
        session: OpSession | None = None,
        stmt_id: int | None = None,
        wall: datetime.datetime | None = None,
        needs_retry_image: str | None = None,
        o_raw: bytes | None = None,
    ) -> tuple[Timestamp, datetime.datetime]:
        raise NotImplementedError

    # writes.py
    def update_document(
        self,
        c: Collection,
        pre: dict[str, Any],
        post: dict[str, Any],
        *,
        kind: str,
        update: Any = None,
        array_filters: list[Any] | None = None,
        session: OpSession | None = None,
        stmt_id: int | None = None,
        validate: bool = False,
        retry_image: str | None = None,
    ) -> bool:
        raise NotImplementedError
