"""The `$clusterTime` a client gossips, parsed and validated as mongod 8.0 does before a command
runs (vector_clock.idl's `ClusterTime`, VectorClock::SignedComponentFormat::in,
LogicalTimeValidator::validate).

mongod 8.0 parses `$clusterTime` as a generic argument of the command (the IDL context is the
command's): a document with a required Timestamp `clusterTime` and an optional `signature`
({hash: BinData general, keyId: long}); no signature counts as the dummy one (a zero hash,
keyId 0). Then:

- without authorization every client may advance the clock: any well-formed time is taken;
- with authorization, a dummy-signed time from a client that is not authenticated, on a
  command that needs no authentication (hello, ping...), is ignored; a client without the
  `advanceClusterTime` privilege must sign a time past the server's with a real key: cdcserver
  signs with none (keyId 0, as a server without keys), so that is 211 KeyNotFound;
- a time more than maxAcceptableLogicalClockDriftSecs (one year) past the wall clock is
  refused (205 ClusterTimeFailsRateLimiter, VectorClock::_ensurePassesRateLimiter).

cdcserver does not move its own clock to a gossiped time (its times are its oplog's).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.timestamp import Timestamp

from cdcserver import auth as server_auth
from cdcserver.commands import arguments
from cdcserver.context import ConnectionState, ServerState
from pipeline_stages.errors import MongoError

__all__ = ["MAX_ACCEPTABLE_LOGICAL_CLOCK_DRIFT_SECS", "check_gossiped_cluster_time"]

# The server parameter maxAcceptableLogicalClockDriftSecs (logical_clock.idl): 365 days.
MAX_ACCEPTABLE_LOGICAL_CLOCK_DRIFT_SECS = 365 * 24 * 60 * 60
_ZERO_HASH = bytes(20)


def _parse(cmd: Mapping[str, Any], where: str) -> tuple[Timestamp, bytes, int] | None:
    """(clusterTime, signature hash, keyId) of the command's `$clusterTime`, None when absent;
    the IDL parser's errors for a malformed one (null counts as absent, as IDL skips it)."""
    gossip = arguments.object_arg(cmd, "$clusterTime", where)
    if gossip is None:
        return None
    ctx = f"{where}.$clusterTime"
    ts = gossip.get("clusterTime")
    if ts is None:
        raise arguments.missing(f"{ctx}.clusterTime")
    if not isinstance(ts, Timestamp):
        raise arguments.wrong_type(f"{ctx}.clusterTime", ts, "timestamp")
    signature = arguments.object_arg(gossip, "signature", ctx)
    if signature is None:
        return ts, _ZERO_HASH, 0
    sig_ctx = f"{ctx}.signature"
    proof = signature.get("hash")
    if proof is None:
        raise arguments.missing(f"{sig_ctx}.hash")
    if not isinstance(proof, (Binary, bytes)):
        raise arguments.wrong_type(f"{sig_ctx}.hash", proof, "binData")
    subtype = proof.subtype if isinstance(proof, Binary) else 0
    if subtype != 0:
        raise MongoError(
            14, f"BSON field '{sig_ctx}.hash' is the wrong binData type "
            f"'{arguments._bindata_name(subtype)}', expected type 'general'",
        )
    if signature.get("keyId") is None:
        raise arguments.missing(f"{sig_ctx}.keyId")
    key_id = arguments.safe_int_arg(signature, "keyId", sig_ctx)
    return ts, bytes(proof), int(key_id)


def check_gossiped_cluster_time(
    server: ServerState, conn: ConnectionState, name: str, cmd: Mapping[str, Any]
) -> None:
    """Refuse the command's `$clusterTime` as mongod 8.0 would (see the module's docstring)."""
    if "$clusterTime" not in cmd:
        return
    parsed = _parse(cmd, name)
    if parsed is None:
        return
    ts, proof, key_id = parsed
    guard = server.auth
    if guard is not None and guard.enabled:
        users = guard.of(conn).users
        if not users and name in server_auth.NO_AUTH_COMMANDS and proof == _ZERO_HASH:
            return  # an unauthenticated client's dummy-signed time is not gossiped in
        advance: list[server_auth.Requirement] = [(("cluster",), ("advanceClusterTime",))]
        if not server_auth.is_authorized(users, advance) and ts > server.oplog.cluster_time():
            raise MongoError(
                211, f"No keys found for HMAC that is valid for time: "
                f"{{ ts: Timestamp({ts.time}, {ts.inc}) }} with id: {key_id}",
            )
    wall = int(time.time())
    if ts.time > wall and ts.time - wall > MAX_ACCEPTABLE_LOGICAL_CLOCK_DRIFT_SECS:
        raise MongoError(
            205, f"New $clusterTime, {ts.time}, is too far from this node's wall clock time, "
            f"{wall}.",
        )
