"""A stream resumed from before a drop whose `$match` filters the invalidate out still ends at
the invalidate through the front, as on a replica set: the cursor closes with the invalidate's
token, and the driver's resume from it is refused (260 InvalidResumeToken)."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import EmbeddedServer

HANG_GUARD = 100  # try_next rounds of 50 ms: a guard, never a performance expectation


def _filtered_stream_after_drop(uri: str, sharded: bool) -> OperationFailure:
    """The stream ends (closed by the server, or its driver's resume refused); a resume from
    its last token is refused: the token is the invalidate's."""
    with pymongo.MongoClient(uri) as client:
        if sharded:
            client.admin.command("enableSharding", "shop", primaryShard="shard0")
            client.admin.command("shardCollection", "shop.t", key={"_id": 1})
        client.shop.t.insert_one({"_id": 1})
        start = client.admin.command("ping")["operationTime"]
        client.shop.t.drop()
        client.shop.t.insert_one({"_id": 2})  # after the drop: never reached
        token = None
        with client.shop.t.watch([{"$match": {"operationType": "update"}}],
                                 start_at_operation_time=start,
                                 max_await_time_ms=50) as stream:
            for _ in range(HANG_GUARD):
                try:
                    assert stream.try_next() is None
                except OperationFailure as exc:
                    return exc  # the driver resumed from the invalidate's token: refused
                token = stream.resume_token
                if not stream.alive:
                    break
            else:
                raise AssertionError("the stream never ended")
        with pytest.raises(OperationFailure) as excinfo:
            client.shop.t.watch([{"$match": {"operationType": "update"}}], resume_after=token)
        return excinfo.value


@pytest.mark.parametrize("mode", ["replica set", "sharded front"])
def test_filtered_invalidate_ends_the_stream(mode):
    if mode == "replica set":
        with EmbeddedServer() as server:
            exc = _filtered_stream_after_drop(server.uri, sharded=False)
    else:
        with ShardedServer(2) as server:
            exc = _filtered_stream_after_drop(server.uri, sharded=True)
    assert exc.code == 260
    assert exc.details["errmsg"] == ("Attempting to resume a change stream using 'resumeAfter' "
                                     "is not allowed from an invalidate notification")
