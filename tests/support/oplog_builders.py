"""Oplog entries shaped as mongod 8.0 writes them, for the pipeline tests.

`Oplog` is a tiny model of one replica set's `local.oplog.rs`: every write gets the next
timestamp (strictly increasing), a term and a wall clock derived from it, and the collection
UUIDs (`ui`) follow creates, drops and renames. Each method appends the entry to
`Oplog.entries` and returns it decoded as the pipeline sees real entries (`decode_entry` of its
BSON bytes: top level decoded, nested documents left raw).

Top-level field order follows the 8.x entries of the corpus
(`/work/shared/corpus/oplog/mongodb-mongo-tools/.../bypassDocumentValidation.bson`,
`collMod_ttl_index/oplog.bson`, `oplogs/bson/linked_vectored_inserts.bson`):

* plain writes and commands: `op, ns, ui, o, o2, ts, t, v, wall`;
* retryable writes: `lsid, txnNumber, op, ns, ui, o, o2, stmtId, ts, t, v, wall, prevOpTime`;
* transaction entries (`applyOps`, `commitTransaction`, `abortTransaction`):
  `lsid, txnNumber, op, ns: "admin.$cmd", o, ts, t, v, wall, prevOpTime`.

(`ts, t, [h,] v, op, ns, ui, wall, o` is the older layout: the 4.2 files of the corpus,
e.g. `oplog_partial_skips/oplog.bson`. The pipeline reads fields by name, so order only
matters for fidelity of the fixtures.)

Inner operations of `applyOps` (`Oplog.op_insert` & co.) are `op, ns, ui, o[, o2]`.
"""

from __future__ import annotations

import datetime
import uuid as uuid_module
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import bson
from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages.oplog_entry import Entry, decode_entry

NULL_OP_TIME: dict[str, Any] = {"ts": Timestamp(0, 0), "t": Int64(-1)}
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def uuid_n(n: int) -> Binary:
    """A deterministic collection / session UUID (subtype 4)."""
    return Binary(uuid_module.UUID(int=(0x5EED << 112) | n).bytes, 4)


def make_lsid(n: int) -> dict[str, Any]:
    """A logical session id as drivers create them: `{id: UUID, uid: sha256 of the user}`."""
    return {"id": uuid_n(0x1000 + n), "uid": Binary(bytes([n % 256]) * 32, 0)}


def wall_for(ts: Timestamp) -> datetime.datetime:
    """The wall clock of an entry at `ts` (ms precision, as BSON dates have)."""
    return EPOCH + datetime.timedelta(seconds=ts.time, milliseconds=ts.inc % 1000)


def split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


class MemoryHistory:
    """An in-memory `TransactionHistory` over a list of entries."""

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        self.by_ts = {e["ts"]: e for e in entries}

    def entry_at(self, ts: Timestamp) -> Entry | None:
        return self.by_ts.get(ts)


class Oplog:
    """An oplog being written: strictly increasing `ts`, UUIDs that follow DDL."""

    def __init__(self, start: Timestamp = Timestamp(1_720_000_000, 1), term: int = 1) -> None:
        self.entries: list[Entry] = []
        self.term = Int64(term)
        self._time = start.time
        self._inc = start.inc - 1
        self._uuids: dict[str, Binary] = {}
        self._uuid_count = 0

    # -- clock and catalog -------------------------------------------------------------------

    def next_ts(self) -> Timestamp:
        self._inc += 1
        if self._inc > 500:  # keep wall-clock milliseconds meaningful
            self._time += 1
            self._inc = 1
        return Timestamp(self._time, self._inc)

    def peek_ts(self) -> Timestamp:
        """The ts the next entry will get."""
        if self._inc + 1 > 500:
            return Timestamp(self._time + 1, 1)
        return Timestamp(self._time, self._inc + 1)

    def advance(self, seconds: int = 1) -> None:
        """Let time pass: the next entry starts a new second."""
        self._time += seconds
        self._inc = 0

    def uuid(self, ns: str) -> Binary:
        """The UUID of `ns`, creating the collection in the catalog if needed."""
        if ns not in self._uuids:
            self._uuid_count += 1
            self._uuids[ns] = uuid_n(self._uuid_count)
        return self._uuids[ns]

    def exists(self, ns: str) -> bool:
        return ns in self._uuids

    def collections(self, db: str) -> list[str]:
        return [ns for ns in self._uuids if split_ns(ns)[0] == db]

    def history(self) -> MemoryHistory:
        return MemoryHistory(self.entries)

    @property
    def last_ts(self) -> Timestamp:
        return self.entries[-1]["ts"]

    def _append(
        self,
        body: Mapping[str, Any],
        *,
        session: Mapping[str, Any] | None = None,
        stmt_id: int | None = None,
        prev: Mapping[str, Any] | None = None,
        ts: Timestamp | None = None,
        tail: Mapping[str, Any] | None = None,
    ) -> Entry:
        ts = self.next_ts() if ts is None else ts
        doc: dict[str, Any] = {}
        if session is not None:
            doc["lsid"] = session["lsid"]
            doc["txnNumber"] = Int64(session["txnNumber"])
        doc.update(body)
        if stmt_id is not None:
            doc["stmtId"] = stmt_id
        doc["ts"] = ts
        doc["t"] = self.term
        doc["v"] = Int64(2)
        doc["wall"] = wall_for(ts)
        if prev is not None:
            doc["prevOpTime"] = dict(prev)
        if tail is not None:
            doc.update(tail)
        entry = decode_entry(bson.encode(doc))
        self.entries.append(entry)
        return entry

    def op_time(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        return {"ts": entry["ts"], "t": entry["t"]}

    # -- inner operations (also the body of top-level CRUD entries) ------------------------------

    def op_insert(self, ns: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "op": "i", "ns": ns, "ui": self.uuid(ns), "o": dict(doc), "o2": {"_id": doc["_id"]},
        }

    def op_update(self, ns: str, _id: Any, diff: Mapping[str, Any]) -> dict[str, Any]:
        """A `$v:2` delta update (`diff`: `{d:{..}, u:{..}, i:{..}, s<field>: {...}}`)."""
        return {
            "op": "u", "ns": ns, "ui": self.uuid(ns), "o": {"$v": 2, "diff": dict(diff)},
            "o2": {"_id": _id},
        }

    def op_replace(self, ns: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "op": "u", "ns": ns, "ui": self.uuid(ns), "o": dict(doc), "o2": {"_id": doc["_id"]},
        }

    def op_delete(self, ns: str, _id: Any) -> dict[str, Any]:
        return {"op": "d", "ns": ns, "ui": self.uuid(ns), "o": {"_id": _id}}

    def op_create(self, ns: str, **options: Any) -> dict[str, Any]:
        """`create` as an inner op of a transaction (or the body of the top-level command)."""
        db, coll = split_ns(ns)
        if ns in self._uuids:
            raise ValueError(f"{ns} exists")
        ui = self.uuid(ns)
        return {
            "op": "c", "ns": f"{db}.$cmd", "ui": ui,
            "o": {"create": coll, **options, "idIndex": ID_INDEX},
        }

    # -- CRUD ------------------------------------------------------------------------------------

    def insert(
        self, ns: str, doc: Mapping[str, Any], *, retryable: Mapping[str, Any] | None = None
    ) -> Entry:
        """An insert; `retryable={lsid, txnNumber}` writes it as a retryable write."""
        if retryable is not None:
            return self._append(
                self.op_insert(ns, doc), session=retryable, stmt_id=0, prev=NULL_OP_TIME
            )
        return self._append(self.op_insert(ns, doc))

    def update(self, ns: str, _id: Any, diff: Mapping[str, Any]) -> Entry:
        return self._append(self.op_update(ns, _id, diff))

    def replace(self, ns: str, doc: Mapping[str, Any]) -> Entry:
        return self._append(self.op_replace(ns, doc))

    def delete(self, ns: str, _id: Any) -> Entry:
        return self._append(self.op_delete(ns, _id))

    # -- DDL -------------------------------------------------------------------------------------

    def create(self, ns: str, **options: Any) -> Entry:
        return self._append(self.op_create(ns, **options))

    def drop(self, ns: str, num_records: int = 0) -> Entry:
        db, coll = split_ns(ns)
        ui = self._uuids.pop(ns)
        return self._append(
            {
                "op": "c", "ns": f"{db}.$cmd", "ui": ui, "o": {"drop": coll},
                "o2": {"numRecords": num_records},
            }
        )

    def rename(self, source: str, target: str) -> Entry:
        """`renameCollection` within a database; replaces `target` if it exists (dropTarget)."""
        db, _ = split_ns(source)
        ui = self._uuids.pop(source)
        o: dict[str, Any] = {"renameCollection": source, "to": target, "stayTemp": False}
        dropped = self._uuids.pop(target, None)
        if dropped is not None:
            o["dropTarget"] = dropped
        self._uuids[target] = ui
        return self._append({"op": "c", "ns": f"{db}.$cmd", "ui": ui, "o": o})

    def drop_database(self, db: str) -> list[Entry]:
        """What `dropDatabase` writes: a `drop` per collection, then `{dropDatabase: 1}`."""
        out = [self.drop(ns) for ns in self.collections(db)]
        out.append(self._append({"op": "c", "ns": f"{db}.$cmd", "o": {"dropDatabase": 1}}))
        return out

    def create_indexes(self, ns: str, key: Mapping[str, Any], name: str, **options: Any) -> Entry:
        """`createIndexes` as written for an index built on an empty collection."""
        db, coll = split_ns(ns)
        o = {"createIndexes": coll, "v": 2, "key": dict(key), "name": name, **options}
        return self._append({"op": "c", "ns": f"{db}.$cmd", "ui": self.uuid(ns), "o": o})

    def start_index_build(
        self, ns: str, build: Binary, indexes: Sequence[Mapping[str, Any]]
    ) -> Entry:
        db, coll = split_ns(ns)
        o = {"startIndexBuild": coll, "indexBuildUUID": build, "indexes": list(indexes)}
        return self._append({"op": "c", "ns": f"{db}.$cmd", "ui": self.uuid(ns), "o": o})

    def commit_index_build(
        self, ns: str, build: Binary, indexes: Sequence[Mapping[str, Any]]
    ) -> Entry:
        db, coll = split_ns(ns)
        o = {"commitIndexBuild": coll, "indexBuildUUID": build, "indexes": list(indexes)}
        return self._append({"op": "c", "ns": f"{db}.$cmd", "ui": self.uuid(ns), "o": o})

    def drop_indexes(self, ns: str, name: str, key: Mapping[str, Any]) -> Entry:
        """`dropIndexes`; `o2` holds the full spec of the dropped index."""
        db, coll = split_ns(ns)
        return self._append(
            {
                "op": "c", "ns": f"{db}.$cmd", "ui": self.uuid(ns),
                "o": {"dropIndexes": coll, "index": name},
                "o2": {"v": 2, "key": dict(key), "name": name},
            }
        )

    def coll_mod(
        self,
        ns: str,
        changes: Mapping[str, Any],
        old_options: Mapping[str, Any] | None = None,
        old_index_options: Mapping[str, Any] | None = None,
    ) -> Entry:
        """`collMod`; `o2 = {collectionOptions_old: {uuid, ...}[, indexOptions_old]}`."""
        db, coll = split_ns(ns)
        ui = self.uuid(ns)
        o2: dict[str, Any] = {"collectionOptions_old": {"uuid": ui, **(old_options or {})}}
        if old_index_options is not None:
            o2["indexOptions_old"] = dict(old_index_options)
        return self._append(
            {"op": "c", "ns": f"{db}.$cmd", "ui": ui, "o": {"collMod": coll, **changes}, "o2": o2}
        )

    # -- no-ops ----------------------------------------------------------------------------------

    def noop(self, msg: Any = "periodic noop") -> Entry:
        return self._append({"op": "n", "ns": "", "o": {"msg": msg}})

    def shard_collection(self, ns: str, key: Mapping[str, Any]) -> Entry:
        return self._append(
            {
                "op": "n", "ns": ns, "ui": self.uuid(ns), "o": {"msg": {"shardCollection": ns}},
                "o2": {
                    "shardCollection": ns, "key": dict(key), "unique": False,
                    "numInitialChunks": Int64(0), "presplitHashedZones": False,
                },
            }
        )

    def reshard_collection(self, ns: str, key: Mapping[str, Any]) -> Entry:
        return self._append(
            {
                "op": "n", "ns": ns, "ui": self.uuid(ns), "o": {"msg": {"reshardCollection": ns}},
                "o2": {
                    "reshardCollection": ns, "reshardUUID": uuid_n(0xAAAA), "shardKey": dict(key),
                    "oldShardKey": {"_id": 1}, "unique": False, "numInitialChunks": Int64(1),
                },
            }
        )

    def refine_collection_shard_key(
        self, ns: str, key: Mapping[str, Any], old_key: Mapping[str, Any]
    ) -> Entry:
        return self._append(
            {
                "op": "n", "ns": ns, "ui": self.uuid(ns),
                "o": {"msg": {"refineCollectionShardKey": ns}},
                "o2": {
                    "refineCollectionShardKey": ns, "shardKey": dict(key),
                    "oldShardKey": dict(old_key),
                },
            }
        )

    # -- transactions ----------------------------------------------------------------------------

    def transaction(self, lsid: Mapping[str, Any], txn_number: int) -> Transaction:
        return Transaction(self, {"lsid": dict(lsid), "txnNumber": txn_number})

    def apply_ops(self, ops: Sequence[Mapping[str, Any]], *, retryable: Mapping[str, Any]) -> Entry:
        """An 8.0 retryable batched write (`multiOpType: 1`): not a transaction."""
        doc = {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [dict(op) for op in ops]}}
        return self._append(
            doc, session=retryable, prev=NULL_OP_TIME, tail={"multiOpType": 1}
        )


class Transaction:
    """One multi-document transaction, written link by link so other writes can interleave.

    Unprepared: `partial(ops)`* then `commit(ops)` (the final, implicitly committing
    `applyOps`; with earlier links it also carries `count`). Prepared: `partial(ops)`* then
    `prepare(ops)`, later `commit_prepared(commit_ts)` or `abort()`.
    """

    def __init__(self, oplog: Oplog, session: dict[str, Any]) -> None:
        self.oplog = oplog
        self.session = session
        self.prev: dict[str, Any] = dict(NULL_OP_TIME)
        self.count = 0
        self.links: list[Entry] = []

    def _link(self, o: Mapping[str, Any]) -> Entry:
        entry = self.oplog._append(
            {"op": "c", "ns": "admin.$cmd", "o": dict(o)}, session=self.session, prev=self.prev
        )
        self.prev = self.oplog.op_time(entry)
        self.links.append(entry)
        return entry

    def partial(self, ops: Sequence[Mapping[str, Any]]) -> Entry:
        self.count += len(ops)
        return self._link({"applyOps": [dict(op) for op in ops], "partialTxn": True})

    def commit(self, ops: Sequence[Mapping[str, Any]]) -> Entry:
        o: dict[str, Any] = {"applyOps": [dict(op) for op in ops]}
        self.count += len(ops)
        if self.links:
            # As in mongo-tools' transaction vectors (common/txn/testdata); the reference
            # marks `count` on the final link as unverified. Change streams ignore it.
            o["count"] = Int64(self.count)
        return self._link(o)

    def prepare(self, ops: Sequence[Mapping[str, Any]]) -> Entry:
        self.count += len(ops)
        return self._link({"applyOps": [dict(op) for op in ops], "prepare": True})

    def commit_prepared(self, commit_ts: Timestamp | None = None) -> Entry:
        commit_ts = self.oplog.peek_ts() if commit_ts is None else commit_ts
        return self._link({"commitTransaction": 1, "commitTimestamp": commit_ts})

    def abort(self) -> Entry:
        return self._link({"abortTransaction": 1})
