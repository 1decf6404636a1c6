"""Which shards a transaction has reached (mongos's src/mongo/s/transaction_router.cpp): a
shard joins the transaction with the first statement the front sends it (`startTransaction`,
with the transaction's readConcern), and the commit or abort goes to every shard it reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdcserver.sharding.cluster import Shard, ShardedCluster


def txn_key(cmd: Mapping[str, Any]) -> tuple[bytes, int] | None:
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if cmd.get("autocommit") is False and isinstance(lsid, Mapping) and number is not None:
        return (bytes(lsid.get("id", b"")), int(number))
    return None


def join_transaction(cluster: ShardedCluster, shard: Shard, body: dict[str, Any]) -> None:
    """mongos starts the transaction on each shard the first time it sends it a statement of
    it (`startTransaction: true`, with the transaction's readConcern)."""
    key = txn_key(body)
    if key is None or next(iter(body)) in ("commitTransaction", "abortTransaction"):
        return
    if body.get("startTransaction") is True:
        # The client's first statement (a txnNumber is never reused): it may reach several
        # shards; each starts the transaction once.
        cluster.participants.setdefault(key, [])
        cluster.txn_read_concern.setdefault(key, body.get("readConcern"))
        if shard.name in cluster.participants[key]:
            del body["startTransaction"]
            body.pop("readConcern", None)
        return
    if shard.name not in cluster.participants.get(key, [shard.name]):
        body["startTransaction"] = True
        read_concern = cluster.txn_read_concern.get(key)
        if read_concern is not None:
            body["readConcern"] = read_concern


def note_participant(cluster: ShardedCluster, shard: Shard, cmd: Mapping[str, Any]) -> None:
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if cmd.get("autocommit") is False and isinstance(lsid, Mapping) and number is not None:
        key = (bytes(lsid.get("id", b"")), int(number))
        shards = cluster.participants.setdefault(key, [])
        if shard.name not in shards:
            shards.append(shard.name)

