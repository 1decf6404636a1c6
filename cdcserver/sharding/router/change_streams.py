"""A change stream through a front: one stream per shard, merged as mongos merges them
(`sharding/streams.py`, `pipeline_stages/merge.py`). Shared by every mode that is a mongos to
its clients: the embedded cluster, a sidecar of a real one, recorded shard oplogs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cdcserver.commands.registry import int_arg
from cdcserver.context import ServerState
from cdcserver.cursors import cursor_reply
from cdcserver.sharding.streams import MergedChangeStream, MergedCluster
from pipeline_stages.errors import MongoError
from pipeline_stages.release import DEFAULT_RELEASE, Release
from pipeline_stages.spec import ChangeStreamSpec, parse_aggregate

# What mongod's `assertIsLegalSpecification` checks after its namespace checks (both
# resume options, a resume option with startAtOperationTime, the tokens' own checks): a
# router's refusals come before these.
_CHECKED_AFTER_NAMESPACE = frozenset({50865, 40674, 260, 280, 7182803})
ShardsCheck = Callable[[], Awaitable[None]]


async def open_change_stream(server: ServerState, cluster: MergedCluster, cmd: Mapping[str, Any],
                             db: str, shards_check: ShardsCheck | None = None
                             ) -> dict[str, Any]:
    """aggregate with $changeStream through a front: one stream per shard of `cluster` (the
    embedded cluster, a sidecar's shards, recorded shard oplogs), merged. `shards_check`
    raises what the shards would when their streams open (their catalogs' refusals), after
    the router's own checks of the spec, as mongos parses it before it targets them."""
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, dict):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    batch_size = int_arg(cursor_doc, "batchSize", "aggregate.cursor")
    if batch_size is not None and batch_size < 0:
        raise MongoError(51024, "BSON field 'batchSize' value must be >= 0, actual value "
                         f"'{batch_size}'")
    spec = parse_for_router(cmd, db, server.release)
    if shards_check is not None:
        await shards_check()
    start = spec.requested_start()
    if start is None:
        start = cluster.start_for_new_stream()
    ns = f"{db}.{spec.coll}" if spec.scope == "collection" else f"{db}.$cmd.aggregate"
    stream = MergedChangeStream(server.cursors.new_id(), ns, cluster, spec, start)
    try:
        batch = await stream.first_batch(batch_size)
    except MongoError:
        stream.close()
        raise
    if batch.invalidated:
        stream.close()
    else:
        server.cursors.add(stream)
    return {"cursor": cursor_reply(stream.id, ns, batch, first=True)}


def parse_for_router(
    cmd: Mapping[str, Any], db: str, release: Release = DEFAULT_RELEASE
) -> ChangeStreamSpec:
    """The spec of a $changeStream opened through a router, with what mongod refuses only
    there (`DocumentSourceChangeStream::assertIsLegalSpecification` with `inMongos`): a
    stream on a `system.*` collection even with `allowToRunOnSystemNS` (73
    InvalidNamespace), and `showMigrationEvents` (31123), in that order, after the
    namespace checks every mongod does and before the resume options' checks."""
    try:
        spec = parse_aggregate(cmd, db, release)
    except MongoError as exc:
        if exc.code in _CHECKED_AFTER_NAMESPACE:
            _refuse_router_options(cmd, db)
        raise
    _refuse_router_options(cmd, db)
    return spec


def _refuse_router_options(cmd: Mapping[str, Any], db: str) -> None:
    options = cmd["pipeline"][0]["$changeStream"]
    coll = cmd.get("aggregate")
    if (isinstance(coll, str) and coll.startswith("system.")
            and options.get("allowToRunOnSystemNS") is True):
        raise MongoError(73, f"$changeStream may not be opened on the internal {db}.{coll} "
                         "collection through mongos")
    if options.get("showMigrationEvents") is True:
        raise MongoError(31123, "Change streams from mongos may not show migration events")
