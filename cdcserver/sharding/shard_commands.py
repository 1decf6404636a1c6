"""The commands of a shard of the embedded cluster (a `--shardsvr` mongod) beyond the
embedded replica set's (the mode's table: `deployments/shard.py` `SHARD`): `appendOplogNote`,
and reads with `readConcern: {afterClusterTime: T}` as a shard server answers them
(`waitForReadConcern`): T later than the node's cluster time is 72 InvalidOptions; T later
than the last entry of its oplog makes it write a no-op first (`makeNoopWriteIfNeeded`, which
a plain replica set skips), so the read sees everything up to T. A sidecar of the cluster
reads an idle shard's oplog that way to learn at once that it has nothing before T (instead of
waiting for its periodic no-op)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp

from cdcserver.context import ConnectionState, Handler, Route, ServerState
from cdcserver.sharding.shard_store import ShardStore
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

CODE_STALE_CLUSTER_TIME = 209


async def append_oplog_note(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """mongod's AppendOplogNoteCmd: a no-op entry `{op: "n", ns: "", o: data}`; with
    `maxClusterTime`, only when it is after the last applied time (else 209)."""
    if db != "admin":
        raise MongoError(13, "appendOplogNote may only be run against the admin database.")
    data = cmd.get("data")
    if data is None:
        raise MongoError(4, "Missing expected field \"data\"")  # NoSuchKey
    if not isinstance(data, dict):
        raise MongoError(
            14, f"\"data\" had the wrong type. Expected object, found {type_name(data)}"
        )
    store = server.store
    if store is None:  # no oplog of its own to write to (a shard always has its store)
        raise MongoError(76, "Must have replication set up to run \"appendOplogNote\"")
    limit = cmd.get("maxClusterTime")
    if limit is not None:
        if not isinstance(limit, Timestamp):
            raise MongoError(
                14, "\"maxClusterTime\" had the wrong type. Expected timestamp, found "
                f"{type_name(limit)}",
            )
        last = store.latest_ts() or Timestamp(0, 0)
        if not limit > last:
            raise MongoError(
                CODE_STALE_CLUSTER_TIME,
                f"Requested maxClusterTime {{ ts: Timestamp({limit.time}, {limit.inc}) }} is "
                f"less or equal to the last primary OpTime: {{ ts: Timestamp({last.time}, "
                f"{last.inc}) }}",
            )
    with store.batch():
        store.append_oplog("n", "", data)
    return {}


# The no-op mongod's makeNoopWriteIfNeeded asks the primary for (appendOplogNote's data).
AFTER_CLUSTER_TIME_NOOP = {"noop write for afterClusterTime read concern": 1}
# The reads that wait for their read concern on a shard (the others take none).
READS = ("find", "aggregate", "count", "distinct")


def _logical_time(ts: Timestamp) -> str:
    return f"{{ ts: Timestamp({ts.time}, {ts.inc}) }}"  # LogicalTime::toString


def make_noop_write_if_needed(server: ServerState, cmd: Mapping[str, Any]) -> None:
    """mongod's waitForReadConcern on a shard server, for `afterClusterTime`: the time must
    not be past the node's cluster time (gossip in the command counts: it is heard first);
    a time past its last oplog entry gets a no-op written after it (the cluster clock is
    past it), so a read at or after it sees everything the shard has up to it. (One node:
    what it wrote is majority-committed, nothing to wait for.) A transaction's statements
    are left alone: its snapshot is not moved by a write."""
    rc = cmd.get("readConcern")
    if not isinstance(rc, Mapping):
        return
    after = rc.get("afterClusterTime")
    if not isinstance(after, Timestamp) or cmd.get("autocommit") is False:
        return
    store = server.store
    if not isinstance(store, ShardStore):  # a plain replica set skips it
        return
    clock = store.clock
    gossip = cmd.get("$clusterTime")
    if isinstance(gossip, Mapping) and isinstance(gossip.get("clusterTime"), Timestamp):
        clock.advance_to(gossip["clusterTime"])
    if clock.last < after:
        raise MongoError(
            72, "readConcern afterClusterTime value must not be greater than the current "
            f"clusterTime. Requested clusterTime: {_logical_time(after)}; current clusterTime: "
            f"{_logical_time(clock.last)}",
        )
    last = store.latest_ts() or Timestamp(0, 0)
    if after > last:
        with store.batch():
            store.append_oplog("n", "", dict(AFTER_CLUSTER_TIME_NOOP))


def waiting_for_read_concern(entry: Handler | Route) -> Handler | Route:
    """A table's entry for a read, waiting for its read concern first (a route: whichever
    handler it picks per request)."""
    if not isinstance(entry, Route):
        return _waiting(entry)
    pick = entry.choose

    def choose(server: ServerState, cmd: Mapping[str, Any]) -> Handler:
        return _waiting(pick(server, cmd))

    choose.__dict__["__wrapped__"] = pick  # Route's repr (tables.describe) names it
    return Route(choose)


def _waiting(handler: Handler) -> Handler:
    async def read(
        server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
    ) -> dict[str, Any]:
        make_noop_write_if_needed(server, cmd)
        return await handler(server, conn, cmd, db)

    read.__dict__["__wrapped__"] = handler  # qualified_name (tables.describe) names it
    read.__name__ = getattr(handler, "__name__", "read")
    return read

