"""The embedded store's transactions: snapshots, write conflicts, commit and abort.

How a multi-document transaction is isolated (see `sessions.Txn`): its overlay, the view its
commands read, the committed versions kept for older snapshots, the write locks whose
conflicts are mongod's 112 WriteConflict (or, outside transactions, a wait: `TxnBlocked`),
and commit as `applyOps` entries. Also the sessions' state rebuilt at start. A mixin of
`Store` (`store.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.embedded import index_table
from cdcserver.embedded.indexes import index_entries
from cdcserver.embedded.oplog_writer import NULL_OP_TIME, _now_ms, pack_transaction
from cdcserver.embedded.persist import _DECODE
from cdcserver.embedded.sessions import (
    LoggedWrite,
    OpSession,
    Session,
    TxnBlocked,
    _Version,
    session_key,
)
from cdcserver.embedded.store_types import Txn, id_key
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry

if TYPE_CHECKING:
    from cdcserver.embedded.state import StoreState
    from cdcserver.embedded.store_types import Collection
else:
    StoreState = object  # a base for the type checker only (state.py)


class TransactionMixin(StoreState):
    """Sessions, transactions, snapshots and write conflicts."""

    # -- sessions ---------------------------------------------------------------------------------

    def session(self, lsid: dict[str, Any]) -> Session:
        """The session of `lsid` (`{id, uid}`), made on first use."""
        key = session_key(lsid)
        found = self.sessions.get(key)
        if found is None:
            found = self.sessions[key] = Session(lsid)
        return found

    def _load_sessions(self) -> None:
        """Each session's active txnNumber as `config.transactions` recorded it (a committed
        transaction's outcome, a retryable write's last entry), and the statements a retryable
        write executed, from its oplog chain: what makes a retried commit answer ok and a
        retried statement not run again after a restart."""
        assert self.persist is not None
        entries: dict[Timestamp, Mapping[str, Any]] = {}
        entry: Mapping[str, Any] | None
        for raw in self._raw:
            if raw[5:10] == b"lsid\x00":  # `lsid` is the first field when present
                entry = decode_entry(raw)
                if entry.get("txnNumber") is not None:
                    entries[entry["ts"]] = entry
        records = [bson_bytes.decode(bytes(raw), _DECODE) for _, raw in self.persist.transactions()]
        for record in records:
            self.transaction_records[session_key(record["_id"])] = record
            session = self.session(dict(record["_id"]))
            session.txn_number = int(record["txnNum"])
            session.last_write = record["lastWriteOpTime"]["ts"]
            if record.get("state") == "committed":
                session.txn = Txn(session.lsid, session.txn_number, state="committed")
                session.txn.ended.set()
                continue
            ts = session.last_write
            while ts != NULL_OP_TIME["ts"]:  # the retryable write's chain, newest first
                entry = entries.get(ts)
                if entry is None:  # truncated from the capped oplog
                    session.incomplete = True
                    break
                self._record_statements(session, entry)
                ts = entry.get("prevOpTime", NULL_OP_TIME)["ts"]
        recorded = {session_key(r["_id"]) for r in records}
        for entry in entries.values():  # sessions last written before records were kept
            if session_key(entry["lsid"]) not in recorded:
                self._load_from_entry(entry)

    def _load_from_entry(self, entry: Mapping[str, Any]) -> None:
        session = self.session(dict(entry["lsid"]))
        number, op = int(entry["txnNumber"]), entry.get("op")
        if number < session.txn_number:
            return
        applied = op == "c" and "applyOps" in entry["o"]
        if number > session.txn_number:
            session.set_txn_number(number, None)
        if applied and not entry["o"].get("partialTxn") and not entry["o"].get("prepare"):
            session.txn = Txn(session.lsid, number, state="committed")
            session.txn.ended.set()
        elif session.txn is None:
            self._record_statements(session, entry)
        session.last_write = entry["ts"]

    @staticmethod
    def _record_statements(session: Session, entry: Mapping[str, Any]) -> None:
        op, stmt = entry.get("op"), entry.get("stmtId")
        if stmt is None or op not in ("i", "u", "d"):
            return
        doc_key = entry["o2"] if op == "u" else entry["o"]
        for stmt_id in stmt if isinstance(stmt, list) else [stmt]:
            session.stmts[int(stmt_id)] = LoggedWrite(
                op, doc_key.get("_id"), entry["ts"], entry.get("needsRetryImage")
            )

    # -- write conflicts --------------------------------------------------------------------------

    def _txn(self) -> Txn | None:
        """The transaction the running command belongs to (not a batched delete)."""
        txn = self.txn
        return txn if txn is not None and txn.lsid else None

    def _write_conflict(
        self, txn: Txn,
        context: str = "Write conflict during plan execution and yielding is disabled.",
    ) -> NoReturn:
        self.abort_transaction(txn)
        # mongod 8.0's throwWriteConflictException(context): "Caused by :: <context> :: ..."
        raise MongoError(
            112, f"Caused by :: {context} :: Please retry your operation or multi-document "
            "transaction.",
            labels=["TransientTransactionError"],
        )

    def check_catalog_for_write(self, c: Collection | None) -> None:
        """A statement's collection as a write acquires it: in a transaction, its snapshot's
        collection dropped or renamed since (CatalogMixin._retire) is 112 WriteConflict and
        aborts, whether or not the statement then writes anything (mongod's acquisition for a
        write in a transaction checks the latest catalog first)."""
        if c is None or c.created_by is not None:
            return
        txn = self._txn()
        if txn is not None and self.catalog.get((c.db, c.name)) is not c:
            self._write_conflict(txn, f"Unable to write to collection '{c.ns}' due to catalog "
                                      "changes; please retry the operation")

    def _check_write_conflict(self, c: Collection, key: bytes) -> None:
        """As on mongod: a transaction writing a document that another transaction in progress
        has written (the first writer wins), or that was committed after its snapshot, gets
        112 WriteConflict with TransientTransactionError and is aborted; a write outside
        transactions waits for the other transaction to end (TxnBlocked)."""
        txn = self._txn()
        creator = c.created_by
        if txn is None and creator is None and not self._owners:
            return  # no transaction in progress holds it
        self.check_catalog_for_write(c)
        owner = self._owners.get((c.uuid, key))
        if creator is not None and creator is not txn and creator.state == "in progress":
            owner = creator  # a collection another transaction is creating
        if owner is not None and owner is not txn and owner.state == "in progress":
            if txn is None:
                raise TxnBlocked(owner)
            self._write_conflict(txn)
        if txn is not None and self._last_write.get((c.uuid, key), -1) > txn.snapshot:
            self._write_conflict(txn)

    def check_ddl_lock(self, colls: Sequence[Collection]) -> None:
        """mongod's DDL takes a collection's exclusive lock, which waits for every transaction
        holding an intent lock on it (one that wrote or created it) to end: TxnBlocked, so the
        command waits as outside writes do."""
        for txn in list(self._live.values()):
            if txn.lsid and txn.state == "in progress" and any(
                c.uuid in txn.colls for c in colls
            ):
                raise TxnBlocked(txn)

    def _release(self, txn: Txn) -> None:
        for k in txn.keys:
            if self._owners.get(k) is txn:
                del self._owners[k]
        txn.keys.clear()
        for ik in txn.index_keys:
            if self._index_owners.get(ik) is txn:
                del self._index_owners[ik]
        txn.index_keys.clear()

    # -- transactions -----------------------------------------------------------------------------

    def begin_transaction(self, lsid: dict[str, Any], txn_number: int) -> Txn:
        """A new transaction. Its snapshot is what is committed now; mongod's reaper aborts it
        once it outlives transactionLifetimeLimitSeconds (a timer on the server's loop)."""
        txn = Txn(lsid, txn_number, snapshot=self._seq)
        self._live[id(txn)] = txn
        if self.transaction_lifetime_limit_seconds > 0:
            with contextlib.suppress(RuntimeError):  # no running loop: the store used directly
                txn.expiry = asyncio.get_running_loop().call_later(
                    self.transaction_lifetime_limit_seconds, self._expire, txn
                )
        return txn

    def _expire(self, txn: Txn) -> None:
        with self.batch():
            self.abort_transaction(txn)

    def enter_snapshot(self, txn: Txn) -> None:
        """The running command belongs to `txn`: until its batch ends, its reads see the
        transaction's snapshot and own writes, and its writes go to the overlay."""
        self.txn = txn
        uuids = set(txn.overlay) | {v.uuid for v in self._history if v.seq > txn.snapshot}
        if uuids:
            retired = [old for _, _, _, old in self._retired]
            for c in [*self.catalog.values(), *txn.created.values(), *retired]:
                if c.uuid in uuids:
                    self._swap_view(c, txn)

    def _swap_view(self, c: Collection, txn: Txn) -> None:
        if c.uuid in self._views:
            return
        self._views[c.uuid] = self._view(c, txn)

    def _restore_views(self) -> None:
        self._views.clear()

    def _view(self, c: Collection, txn: Txn) -> Any:
        """`c`'s documents as `txn` sees them, in natural order."""
        docs = self._records(c)
        view = type(docs)(docs)
        later = [v for v in self._history if v.uuid == c.uuid and v.seq > txn.snapshot]
        for v in reversed(later):  # undo the commits its snapshot does not see, newest first
            if v.before is None:
                view.pop(v.key, None)
            elif not v.deleted or v.key in view:
                view[v.key] = v.before
            else:
                items = list(view.items())
                at = 0
                if v.pred is not None:
                    at = next((i + 1 for i, (k, _) in enumerate(items) if k == v.pred),
                              len(items))
                items.insert(at, (v.key, v.before))
                view = type(docs)(items)
        for key, (doc, new_record) in txn.overlay.get(c.uuid, {}).items():
            if doc is None:
                view.pop(key, None)
            else:
                view[key] = doc
                if new_record:
                    view.move_to_end(key)
        return view

    def _txn_put(self, txn: Txn, c: Collection, key: bytes, doc: dict[str, Any] | None) -> None:
        self._swap_view(c, txn)
        view = self._records(c)
        entries = txn.overlay.setdefault(c.uuid, {})
        txn.colls[c.uuid] = c
        old = view.get(key)
        _, new_record = entries.get(key, (None, False))
        if doc is None:
            view.pop(key, None)
        elif old is None:  # an insert: a new record, last in natural order
            new_record = True
            entries.pop(key, None)
            view[key] = doc
        else:
            view[key] = doc
        entries[key] = (doc, new_record)
        txn.keys.add((c.uuid, key))
        self._owners[(c.uuid, key)] = txn
        for spec in c.indexes[1:]:  # unique keys it adds or removes are its own until it ends
            if spec["name"] not in c.unique:
                continue
            for version in (old, doc):
                for k, _ in index_entries(spec, version) if version is not None else []:
                    ik = (c.uuid, spec["name"], k)
                    txn.index_keys.add(ik)
                    self._index_owners[ik] = txn

    def _remember(
        self, c: Collection, key: bytes, before: dict[str, Any] | None, deleted: bool,
        docs: Mapping[bytes, Any],
    ) -> None:
        """Keep the committed version a write (numbered `self._seq`) replaces, while open
        transactions started before it."""
        if not self._live:
            return
        pred = None
        if deleted:
            for k in docs:
                if k == key:
                    break
                pred = k
        self._history.append(_Version(self._seq, c.uuid, key, before, deleted, pred))
        self._last_write[(c.uuid, key)] = self._seq

    def _end(self, txn: Txn, state: str) -> None:
        txn.state = state
        self._release(txn)
        # its session keeps it (the outcome) until the next txnNumber: not its writes
        txn.ops, txn.persist, txn.pre_images, txn.overlay = [], [], [], {}
        txn.created = {}
        self._live.pop(id(txn), None)
        if txn.expiry is not None:
            txn.expiry.cancel()
        txn.ended.set()
        if not self._live:
            self._history.clear()
            self._last_write.clear()
            self._retired.clear()
            return
        oldest = min(t.snapshot for t in self._live.values())
        if self._retired and self._retired[0][1] <= oldest:  # no snapshot that old is open
            self._retired = [r for r in self._retired if r[1] > oldest]
        if self._history and self._history[0].seq <= oldest:
            self._history = [v for v in self._history if v.seq > oldest]
            self._last_write = {(v.uuid, v.key): v.seq for v in self._history}

    def commit_transaction(self, txn: Txn) -> None:
        """Log the transaction's writes as `applyOps` entries (one, or a chain linked by
        `prevOpTime` whose entries but the last carry `partialTxn: true` and the last
        `count`, as mongod splits a large transaction), apply its overlay to the working set
        and make it durable."""
        if txn.state != "in progress":
            return
        self._check_created(txn)
        if not txn.ops:
            self._end(txn, "committed")
            return
        session = OpSession(txn.lsid, txn.txn_number)
        wall = _now_ms()
        chunks = pack_transaction(txn.ops, self.txn_oplog_entry_ops, self.txn_oplog_entry_bytes)
        # op index in the transaction -> (ts of the entry holding it, its index there)
        where: list[tuple[Timestamp, int]] = []
        for k, ops in enumerate(chunks):
            o: dict[str, Any] = {"applyOps": ops}
            last = k == len(chunks) - 1
            if not last:
                o["partialTxn"] = True
            elif k > 0:
                o["count"] = Int64(len(txn.ops))
            ts, _ = self.append_oplog("c", "admin.$cmd", o, session=session, wall=wall)
            where.extend((ts, i) for i in range(len(ops)))
        # the outcome, in config.transactions with the commit's entries: a retried
        # commitTransaction answers ok after a restart, other statements 256
        record = self._session_records.get(session_key(txn.lsid))
        if record is not None:
            record["state"] = "committed"
        self._seq += 1
        for ns, made in txn.created.items():  # its collections become everyone's, and durable
            made.created_by, made.created_seq = None, self._seq
            self.catalog[ns] = made
            self._save_meta(made)
        for uuid, entries in txn.overlay.items():
            c = txn.colls[uuid]
            if self.catalog.get((c.db, c.name)) is not c:
                continue  # dropped since
            docs = self._records(c)
            for key, (doc, new_record) in entries.items():
                old = docs.get(key)
                if old is None and doc is None:
                    continue
                self._remember(c, key, old, doc is None, docs)
                self._apply_edits(self._index_edits(c, old, doc), key)
                if doc is None:
                    del docs[key]
                else:
                    docs[key] = doc
                    if new_record:
                        docs.move_to_end(key)
                if c.secondary:
                    index_table.change(c, key, old, doc, new_record or old is None)
                if self.persist is not None:
                    if doc is None or (new_record and old is not None):
                        self.persist.delete_document(uuid, key)  # a new record: a new row
                    if doc is not None:
                        self.persist.put_document(uuid, key, bson_bytes.encode(doc))
        for c, index, pre in txn.pre_images:
            ts, in_entry = where[index]
            self._save_pre_image(c, ts, wall, pre, in_entry)
        self._end(txn, "committed")

    def abort_transaction(self, txn: Txn) -> None:
        """Drop the transaction's writes: they never reached the working set, the oplog or
        SQLite."""
        if txn.state != "in progress":
            return
        for c in txn.created.values():  # never in the catalog, never logged or persisted
            c.records = OrderedDict()
        self._end(txn, "aborted")

    def _check_created(self, txn: Txn) -> None:
        """mongod's pre-commit check of each collection the transaction created
        (CollectionCatalog::ensureCollectionIsNew): a collection committed under that name
        since (created outside, or by a transaction that committed first) makes the commit a
        112 WriteConflict, a view a 48 NamespaceExists; the transaction is aborted."""
        for (db, name) in txn.created:
            if (db, name) in self.catalog:
                self.abort_transaction(txn)
                raise MongoError(
                    112, f"Caused by :: Collection namespace '{db}.{name}' is already in use. "
                    ":: Please retry your operation or multi-document transaction.",
                    labels=["TransientTransactionError"],
                )
            system_views = self.catalog.get((db, "system.views"))
            if system_views is not None and self.documents(system_views).get(
                id_key(f"{db}.{name}")
            ) is not None:
                self.abort_transaction(txn)
                raise MongoError(48, "Conflicted registering namespace, already have a view "
                                 "with the same namespace")

    def kill_sessions(self, matches: Callable[[Mapping[str, Any]], bool]) -> int:
        """killSessions / killAllSessions / endSessions: abort the open transaction of each
        session whose lsid `matches` (mongod's killSessionsAbortUnpreparedTransactions); the
        session keeps its txnNumber, so its later statements get 251 (aborted). Returns how
        many transactions were aborted."""
        aborted = 0
        with self.batch():
            for session in list(self.sessions.values()):
                txn = session.txn
                if txn is not None and txn.state == "in progress" and matches(session.lsid):
                    self.abort_transaction(txn)
                    aborted += 1
        return aborted
