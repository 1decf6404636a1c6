"""The embedded store's document writes (mongod's collection_write_path).

Every write goes through here one document at a time, as mongod does: checked (depth, size,
`_id`, validator, unique indexes, write conflicts), logged (`oplog_writer.py`), its pre-image
and retry image kept (`images.py`), then applied to the working set (and SQLite) or to the
running transaction's overlay. A mixin of `Store` (`store.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdcserver.embedded import index_table
from cdcserver.embedded.bson_depth import check_insert_depth, check_update_depth
from cdcserver.embedded.indexes import DuplicateKeyError
from cdcserver.embedded.oplog_writer import MAX_BSON
from cdcserver.embedded.store_types import id_key
from cdcserver.embedded.timeseries import TimeseriesView, insert_measurement
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError

if TYPE_CHECKING:
    from cdcserver.embedded.sessions import OpSession
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection
else:
    StoreState = object  # a base for the type checker only (state.py)


class WritesMixin(StoreState):
    """Inserts, updates and deletes of one document."""

    def insert_document(
        self, c: Collection, doc: dict[str, Any], session: OpSession | None = None,
        stmt_id: int | None = None, validate: bool = False, raw: bytes | None = None,
    ) -> None:
        """Insert one document (`_id` first, normalized; `raw`: its BSON, if the caller has
        it). Raises DuplicateKeyError."""
        if isinstance(c, TimeseriesView):  # a measurement: into a bucket (catalog.py)
            insert_measurement(self, c, doc, session, stmt_id)
            return
        if raw is None:
            raw = bson_bytes.encode(doc)
        check_insert_depth(doc, raw)  # first, as mongod's fixDocumentForInsert
        key = id_key(doc["_id"])
        self._check_write_conflict(c, key)
        docs = self.documents(c)
        if validate:
            c.check_valid(doc)
        if key in docs:
            raise DuplicateKeyError(c.ns, "_id_", {"_id": 1}, {"_id": doc["_id"]})
        edits = self._check_unique(c, key, None, doc)
        if len(raw) > MAX_BSON:
            raise MongoError(10334, f"object to insert too large. size in bytes: {len(raw)}, "
                             f"max size: {MAX_BSON}")
        if c.options.get("capped") and len(raw) > int(c.options.get("size") or 0):
            raise MongoError(2, "object to insert exceeds cappedMaxSize")  # WiredTiger's
        # The entry's `o` is the document's own bytes, not encoded again, where they are what
        # encoding it inside the entry gives: with `_id` first (a top-level encode moves it).
        o_raw = raw if next(iter(doc)) == "_id" else None
        self.append_oplog("i", c.ns, doc, ui=c.ui, o2={"_id": doc["_id"]}, session=session,
                          stmt_id=stmt_id, o_raw=o_raw)
        self._put(c, key, None, doc, raw, edits)
        if c.options.get("capped"):
            self.cap_collection(c, key)

    def update_document(
        self,
        c: Collection,
        pre: dict[str, Any],
        post: dict[str, Any],
        *,
        kind: str,  # "replacement" | "modifier" | "pipeline"
        update: Any = None,
        array_filters: list[Any] | None = None,
        session: OpSession | None = None,
        stmt_id: int | None = None,
        validate: bool = False,
        retry_image: str | None = None,
    ) -> bool:
        """Replace `pre` by `post`; False (and nothing written) when nothing changed."""
        pre_raw, post_raw = bson_bytes.encode(pre), bson_bytes.encode(post)
        if pre_raw == post_raw:
            return False
        if "_id" not in post or id_key(post["_id"]) != id_key(pre["_id"]):
            if kind == "replacement":
                raise MongoError(
                    66,
                    "After applying the update, the (immutable) field '_id' was found to have "
                    f"been altered to _id: {_value(post.get('_id'))}",
                )
            raise MongoError(
                66, "Performing an update on the path '_id' would modify the immutable field "
                "'_id'",
            )
        check_update_depth(post, post_raw)
        if len(post_raw) > MAX_BSON:
            raise MongoError(17419, f"Resulting document after update is larger than {MAX_BSON}")
        self._check_write_conflict(c, id_key(pre["_id"]))
        if validate:
            c.check_valid(post, pre)
        key = id_key(pre["_id"])
        edits = self._check_unique(c, key, pre, post)
        # "delta": `update` is the `$v: 2` diff itself (a time-series bucket's update)
        o = ({"$v": 2, "diff": update} if kind == "delta"
             else self._update_o(pre, post, kind, update, array_filters))
        image = self._retry_image_kind(session, retry_image)
        ts, wall = self.append_oplog("u", c.ns, o, ui=c.ui, o2={"_id": post["_id"]},
                                     session=session, stmt_id=stmt_id, needs_retry_image=image)
        if c.pre_images:
            self._save_pre_image(c, ts, wall, pre)
        if image is not None and session is not None:
            self._save_retry_image(session, ts, image, pre if image == "preImage" else post)
        self._put(c, key, pre, post, post_raw, edits)
        return True

    def delete_document(
        self, c: Collection, pre: dict[str, Any], session: OpSession | None = None,
        stmt_id: int | None = None, retry_image: str | None = None,
    ) -> None:
        key = id_key(pre["_id"])
        self._check_write_conflict(c, key)
        image = self._retry_image_kind(session, retry_image)
        ts, wall = self.append_oplog("d", c.ns, {"_id": pre["_id"]}, ui=c.ui, session=session,
                                     stmt_id=stmt_id, needs_retry_image=image)
        if c.pre_images:
            self._save_pre_image(c, ts, wall, pre)
        if image is not None and session is not None:
            self._save_retry_image(session, ts, image, pre)
        self._put(c, key, pre, None, None, self._index_edits(c, pre, None))

    def _put(
        self, c: Collection, key: bytes, pre: dict[str, Any] | None,
        doc: dict[str, Any] | None, raw: bytes | None,
        edits: list[tuple[dict[bytes, bytes], list[bytes], list[bytes]]],
    ) -> None:
        """One checked document write (None: delete): into the running transaction's overlay,
        or into the working set (and SQLite), remembered for older open snapshots."""
        txn = self._txn()
        if txn is not None:
            self._txn_put(txn, c, key, doc)
            return
        self._seq += 1
        docs = self._records(c)
        self._remember(c, key, pre, doc is None, docs)
        if doc is None:
            del docs[key]
        else:
            docs[key] = doc
        if c.secondary:
            index_table.change(c, key, pre, doc, new_record=pre is None)
        self._apply_edits(edits, key)
        self._persist_doc(c, key, raw, pre)

    def _persist_doc(
        self, c: Collection, key: bytes, raw: bytes | None, pre: dict[str, Any] | None
    ) -> None:
        if self.txn is not None:  # a batched delete: to SQLite at its end
            self.txn.persist.append((c.uuid, key, raw))
            return
        if self.persist is None:
            return
        if raw is None:
            self.persist.delete_document(c.uuid, key)
        else:
            self.persist.put_document(c.uuid, key, raw)


def _value(v: Any) -> str:
    from pipeline_stages.value_string import value_string

    return value_string(v)
