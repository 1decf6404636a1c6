"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_error_label.js` @
3c86964f0f9dd44d8264f1f9ada8e3275fa93fe0, its first part: with the mongos's
`failGetMoreAfterCursorCheckout` fail point set to a resumable code (ShutdownInProgress), a
change stream's getMore fails with it and the `ResumableChangeStreamError` label; with a
non-resumable one (FailedToParse), without any label.

Its outage part runs through a second mongos, a sidecar of the front (`ShardedSidecar`, `serve
--upstream`), cut off from shard0 by closing shard0's listener (`ShardedServer.restart_shard`)
where the jstest stops shard0 (`st.rs0.stopSet()`): the stream's getMore fails with one of the
jstest's expected codes and the `ResumableChangeStreamError` label, and so does a new stream's
first getMore or aggregate, with FailedToSatisfyReadPreference (133). Left out of it: the
`find` and non-stream `aggregate` cursors (no label expected): a sidecar forwards them to the
front, which reaches its shards in process, so there is no outage for them."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedSidecar

NAME = "change_stream_error_label"


@pytest.mark.parametrize(("code", "expected_label"), [(91, True), (9, False)],
                         ids=["ShutdownInProgress", "FailedToParse"])
def test_fail_get_more_after_cursor_checkout(st, code, expected_label):
    db = st.s[NAME]
    db.command({"create": "test"})
    st.s.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                        "mode": "alwaysOn", "data": {"errorCode": code}})
    try:
        reply = db.command({"aggregate": "test", "pipeline": [{"$changeStream": {}}],
                            "cursor": {}})
        # The raw reply (pymongo would raise ShutdownInProgress as a NotPrimaryError).
        details = db.command({"getMore": reply["cursor"]["id"], "collection": "test"},
                             check=False)
        assert details["ok"] == 0 and details["code"] == code, details
        assert ("errorLabels" in details) == expected_label, details
        assert ("ResumableChangeStreamError" in details.get("errorLabels", [])) == \
            expected_label, details
    finally:
        st.s.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                            "mode": "off"})


# The codes the jstest accepts from a getMore once shard0 is stopped.
EXPECTED_STOP_SHARD_ERRORS = {6, 7, 89, 9001, 91, 189, 10107, 11600, 11602, 13435, 13436}
HANG_GUARD_S = 90  # a failure's budget, never an expectation of speed


@pytest.fixture
def s1(st) -> Iterator[pymongo.MongoClient]:
    with ShardedSidecar(st.server.uri) as sidecar, pymongo.MongoClient(sidecar.uri) as client:
        yield client
        _recovered(st, client)


def _recovered(st, s1) -> None:
    """Once shard0 listens again, wait until a stream through the sidecar delivers an event
    (its tail of shard0 has reconnected) before the sidecar stops: stopping it while that
    tail is still reconnecting can outlast ThreadServer's 30 s stop guard (a sidecar shutdown
    defect, see README.md)."""
    start = time.monotonic()
    while time.monotonic() - start < HANG_GUARD_S:
        reply = s1[NAME].command({"aggregate": "test", "pipeline": [{"$changeStream": {}}],
                                  "cursor": {}}, check=False)
        if reply["ok"] == 1:
            st.s[NAME].test.insert_one({"_id": -100})
            st.s[NAME].test.delete_one({"_id": -100})
            for _ in range(50):
                more = s1[NAME].command({"getMore": reply["cursor"]["id"], "collection": "test",
                                         "maxTimeMS": 200}, check=False)
                if more["ok"] != 1:
                    break
                if more["cursor"]["nextBatch"]:
                    s1[NAME].command({"killCursors": "test",
                                      "cursors": [reply["cursor"]["id"]]})
                    return
        time.sleep(0.2)


def _until_error(db, cursor_id: int) -> dict:
    start = time.monotonic()
    while time.monotonic() - start < HANG_GUARD_S:
        reply = db.command({"getMore": cursor_id, "collection": "test", "maxTimeMS": 500},
                           check=False)
        if reply["ok"] != 1:
            return reply
    raise AssertionError("the getMore never failed")


def _setup(st, s1):
    st.s.admin.command({"enableSharding": NAME, "primaryShard": st.shard0})
    st.shard_coll(st.s[NAME].test, {"_id": 1}, {"_id": 0}, {"_id": 0})
    cs = s1[NAME].command({"aggregate": "test", "pipeline": [{"$changeStream": {}}],
                           "cursor": {}})["cursor"]
    for i in range(1, 11):
        st.s[NAME].test.insert_many([{"_id": -i}, {"_id": i}])
    seen = []
    for _ in range(200):
        batch = s1[NAME].command({"getMore": cs["id"], "collection": "test",
                                  "maxTimeMS": 100})["cursor"]["nextBatch"]
        seen += [e["documentKey"]["_id"] for e in batch]
        if 10 in seen:
            break
    assert 10 in seen, seen
    return cs["id"]


def test_outage_fails_the_stream_with_the_label(st, s1):
    cursor_id = _setup(st, s1)
    replies = {}
    st.server.restart_shard(0, lambda: replies.update(
        running=_until_error(s1[NAME], cursor_id)))
    reply = replies["running"]
    assert reply["code"] in EXPECTED_STOP_SHARD_ERRORS, reply
    assert "ResumableChangeStreamError" in reply.get("errorLabels", []), reply


def test_outage_fails_a_new_stream_with_133(st, s1):
    cursor_id = _setup(st, s1)
    replies = {}

    def while_down() -> None:
        _until_error(s1[NAME], cursor_id)
        reply = s1[NAME].command({"aggregate": "test", "pipeline": [{"$changeStream": {}}],
                                  "cursor": {}}, check=False)
        if reply["ok"] == 1:
            reply = _until_error(s1[NAME], reply["cursor"]["id"])
        replies["new"] = reply

    st.server.restart_shard(0, while_down)
    reply = replies["new"]
    assert reply["code"] == 133, reply
    assert "ResumableChangeStreamError" in reply.get("errorLabels", []), reply
