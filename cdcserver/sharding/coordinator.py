"""The transaction coordinator's durable decision (mongod: `config.transaction_coordinators`,
`TransactionCoordinator` recovery), for the embedded cluster with `--data-dir`.

A transaction that wrote on several shards commits in two phases. Before any participant
commits, the decision is written to `DIR/coordinator.bson` (fsync'd, atomically replaced)
with what each participant needs to commit on its own: its prepare and commit timestamps and
its prepared writes (the transaction's operations and its documents' new versions). Once every
participant has committed, the record goes. A cluster that restarts with a record finishes the
commit on each participant whose commit did not reach its oplog, at the same timestamps, as
mongod's coordinator does after a crash; a transaction whose decision was never written
aborts (its participants kept nothing: their prepared state is in memory only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes

if TYPE_CHECKING:
    from cdcserver.embedded.sessions import Txn
    from cdcserver.sharding.shard_store import ShardStore

log = logging.getLogger(__name__)

FILE_NAME = "coordinator.bson"


class CoordinatorLog:
    """The pending commit decisions of a cluster (none kept in memory only)."""

    def __init__(self, data_dir: str | None) -> None:
        self.path = None if data_dir is None else os.path.join(data_dir, FILE_NAME)
        self.pending: list[dict[str, Any]] = []
        if self.path is not None and os.path.exists(self.path):
            with open(self.path, "rb") as f:
                self.pending = list(bson_bytes.decode(f.read()).get("pending", []))

    def _save(self) -> None:
        if self.path is None:
            return
        if not self.pending:  # nothing decided and unfinished
            if os.path.exists(self.path):
                os.remove(self.path)
            return
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(bson_bytes.encode({"pending": self.pending}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def decide_commit(self, lsid: Mapping[str, Any], txn_number: int, commit_ts: Timestamp,
                      participants: Iterable[tuple[str, Timestamp, Txn]]) -> dict[str, Any]:
        """Write the commit decision (before any participant commits)."""
        record = {
            "lsid": dict(lsid), "txnNumber": Int64(txn_number), "decision": "commit",
            "commitTimestamp": commit_ts,
            "participants": [_participant(name, prepare_ts, txn)
                             for name, prepare_ts, txn in participants],
        }
        if self.path is not None:
            self.pending.append(record)
            self._save()
        return record

    def forget(self, record: Mapping[str, Any]) -> None:
        """Every participant has committed."""
        if record in self.pending:
            self.pending.remove(record)  # type: ignore[arg-type]
            self._save()

    def recover(self, stores: Mapping[str, ShardStore]) -> int:
        """Finish every decided commit on the participants that did not reach it; returns
        the participants committed now."""
        done = 0
        for record in list(self.pending):
            commit_ts = record["commitTimestamp"]
            for part in record["participants"]:
                store = stores.get(part["shard"])
                if store is None or _committed(store, commit_ts):
                    continue
                _commit_participant(store, record, part)
                done += 1
                log.warning("transaction coordinator: committed the prepared transaction "
                            "(txnNumber %s) on %s after a restart", record["txnNumber"],
                            part["shard"])
            self.forget(record)
        return done


def _participant(name: str, prepare_ts: Timestamp, txn: Txn) -> dict[str, Any]:
    return {
        "shard": name,
        "lsid": dict(txn.lsid),  # as the shard's session has it
        "prepareTimestamp": prepare_ts,
        "ops": list(txn.ops),
        "colls": [{"uuid": Binary(uuid), "db": c.db, "coll": c.name}
                  for uuid, c in txn.colls.items()],
        "overlay": [{"uuid": Binary(uuid), "key": Binary(key), "doc": doc, "newRecord": new}
                    for uuid, entries in txn.overlay.items()
                    for key, (doc, new) in entries.items()],
        "preImages": [{"db": c.db, "coll": c.name, "index": index, "doc": pre}
                      for c, index, pre in txn.pre_images],
    }


def _committed(store: ShardStore, commit_ts: Timestamp) -> bool:
    """Whether the participant's commit is in its oplog (its entry at the commit time)."""
    entries = store.read_from(commit_ts, 1)
    return bool(entries) and entries[0]["ts"] == commit_ts


def _commit_participant(store: ShardStore, record: Mapping[str, Any],
                        part: Mapping[str, Any]) -> None:
    from cdcserver.embedded.store import pack_transaction

    txn = store.begin_transaction(dict(part["lsid"]), int(record["txnNumber"]))
    # The session's transaction: a commit retried by the client (its router asking this
    # participant, the recovery shard) is answered by it, as the first commit would have.
    store.session(dict(part["lsid"])).set_txn_number(int(record["txnNumber"]), txn)
    colls = {}
    for c in part["colls"]:
        coll = store.get(c["db"], c["coll"])
        if coll is not None:
            colls[bytes(c["uuid"])] = coll
    txn.colls = colls
    overlay: dict[bytes, dict[bytes, tuple[Any, bool]]] = {}
    for entry in part["overlay"]:
        uuid = bytes(entry["uuid"])
        if uuid in colls:
            overlay.setdefault(uuid, {})[bytes(entry["key"])] = (entry["doc"],
                                                                 bool(entry["newRecord"]))
    txn.overlay = overlay
    txn.ops = list(part["ops"])
    txn.pre_images = [(c, int(p["index"]), p["doc"]) for p in part["preImages"]
                      if (c := store.get(p["db"], p["coll"])) is not None]
    prepare_ts, commit_ts = part["prepareTimestamp"], record["commitTimestamp"]
    entries = pack_transaction(txn.ops, store.txn_oplog_entry_ops,
                               store.txn_oplog_entry_bytes) if txn.ops else []
    phase = (store.prepared_commit(prepare_ts, commit_ts) if len(entries) == 1
             else store.commit_at(commit_ts))
    with phase, store.batch():
        store.commit_transaction(txn)
