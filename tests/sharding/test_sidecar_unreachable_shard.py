"""A sharded sidecar (`serve --upstream <mongos>`) with a shard unreachable, as a mongos
answers: a running stream's getMore fails with 6 HostUnreachable; a new stream's aggregate
with 133 FailedToSatisfyReadPreference, its replica set monitor's message (mongos cannot
establish the stream's cursor on the shard); both labeled ResumableChangeStreamError.
(change_stream_error_label.js checks the codes and labels, through `tests/jstests/sharding`.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer, ShardedSidecar

HANG_GUARD_S = 60  # a failure's budget, never an expectation of speed
STREAM = {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}}


@pytest.fixture
def clusters() -> Iterator[tuple[ShardedServer, ShardedSidecar, pymongo.MongoClient]]:
    with ShardedServer(2) as server, ShardedSidecar(server.uri) as sidecar, \
            pymongo.MongoClient(sidecar.uri) as side:
        sidecar.upstream.down_grace_s = 0.0  # fail at once (5 s by default)
        with pymongo.MongoClient(server.uri) as front:
            front.admin.command({"enableSharding": "app",
                                 "primaryShard": server.cluster.shards[0].name})
            front.app.create_collection("c")
        yield server, sidecar, side


def _until_error(db: Any, cursor_id: int) -> dict[str, Any]:
    start = time.monotonic()
    while time.monotonic() - start < HANG_GUARD_S:
        reply = db.command({"getMore": cursor_id, "collection": "c", "maxTimeMS": 100},
                           check=False)
        if reply["ok"] != 1:
            return reply
    raise AssertionError("the getMore never failed")


def test_a_new_stream_is_133_for_the_shards_set_a_running_one_6(clusters):
    server, _, side = clusters
    db = side.app
    running = db.command(STREAM)["cursor"]["id"]
    replies: dict[str, Any] = {}

    def while_down() -> None:
        replies["running"] = _until_error(db, running)
        replies["new"] = db.command(STREAM, check=False)

    server.restart_shard(1, while_down)
    running_reply, new = replies["running"], replies["new"]
    assert running_reply["code"] == 6, running_reply
    assert "ResumableChangeStreamError" in running_reply["errorLabels"], running_reply
    assert (new["ok"], new["code"], new["codeName"]) == (0, 133, "FailedToSatisfyReadPreference")
    assert new["errmsg"] == ('Could not find host matching read preference { mode: "primary" } '
                             f"for set {server.cluster.shards[1].name}"), new
    assert new["errorLabels"] == ["ResumableChangeStreamError"], new
