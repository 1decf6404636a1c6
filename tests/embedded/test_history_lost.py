"""No reader of the capped embedded oplog silently skips entries the oplog dropped.

With a 1 MiB oplog, writes a reader has not read yet can be truncated away before it reads
them. mongod then fails the reader's next getMore: a change stream, or a tailable find on
`local.oplog.rs`, whose last seen oplog entry was deleted gets 136 CappedPositionLost from its
collection scan (jstests/change_streams/oplog_rollover.js: "attempting to continue reading an
existing change stream throws CappedPositionLost"); resuming it then gets 286
ChangeStreamHistoryLost. A reader that keeps up loses nothing and sees no error.
"""

from __future__ import annotations

import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo import errors

from cdcserver.testing import EmbeddedServer

OPLOG_BYTES = 1024 * 1024
PAD = "x" * 1000
LOST = "CollectionScan died due to position in capped collection being deleted. "


def record_id(ts: Timestamp) -> int:
    """An oplog entry's RecordId: its timestamp as a 64-bit integer."""
    return (ts.time << 32) | ts.inc


def oldest_ts(client) -> Timestamp:
    return client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]


def latest_ts(client) -> Timestamp:
    return client.local["oplog.rs"].find_one({}, sort=[("$natural", -1)])["ts"]


def write_megabytes(coll, first_id: int, n: int = 2600) -> None:
    """~`n` KB of inserts (2.6 MB: the 1 MiB oplog wraps more than twice)."""
    for start in range(first_id, first_id + n, 100):
        coll.insert_many([{"_id": i, "pad": PAD} for i in range(start, start + 100)])


@pytest.fixture
def capped():
    with EmbeddedServer(oplog_size_bytes=OPLOG_BYTES) as s, s.client() as client:
        yield s, client


def open_stream(client, coll: str) -> int:
    reply = client.db.command(
        {"aggregate": coll, "pipeline": [{"$changeStream": {}}], "cursor": {}}
    )
    assert reply["cursor"]["firstBatch"] == []
    return reply["cursor"]["id"]


def get_more(client, cursor_id: int, coll: str, batch_size: int = 100_000) -> dict:
    return client.db.command(
        {"getMore": Int64(cursor_id), "collection": coll, "batchSize": batch_size,
         "maxTimeMS": 10}
    )["cursor"]


def test_an_open_stream_fails_instead_of_skipping_what_was_truncated(capped):
    """The issue's reproduction: read one insert, write 2.6 MB, the next event must not be
    a later one."""
    _, client = capped
    coll = client.db.c
    with coll.watch(max_await_time_ms=10) as stream:
        coll.insert_one({"_id": 0})
        first = stream.next()
        assert first["documentKey"] == {"_id": 0}
        write_megabytes(coll, 1)
        assert oldest_ts(client) > first["clusterTime"]  # the stream's next events are gone
        with pytest.raises(errors.OperationFailure) as info:
            stream.next()
        assert not stream.alive
    err = info.value
    assert err.code == 136
    assert err.details["codeName"] == "CappedPositionLost"
    # The last entry the stream's scan saw is the insert it returned.
    assert err.details["errmsg"] == (
        f"Executor error during getMore :: caused by :: {LOST}"
        f"Last seen record id: RecordId({record_id(first['clusterTime'])})"
    )
    assert "errorLabels" not in err.details  # neither resumable nor in 286's category
    # Resuming after the last event read is refused as mongod refuses it.
    with pytest.raises(errors.OperationFailure) as info:
        coll.watch(resume_after=first["_id"])
    assert info.value.code == 286
    assert info.value.details["codeName"] == "ChangeStreamHistoryLost"
    assert info.value.details["errorLabels"] == ["NonResumableChangeStreamError"]


def test_every_stream_sharing_the_lost_place_fails_and_is_closed(capped):
    """Identical streams opened at the same place share one reader (the hub): each fails at
    its next getMore, and its cursor is gone afterwards."""
    _, client = capped
    streams = [open_stream(client, "shared") for _ in range(3)]
    client.db.shared.insert_one({"_id": 0})
    for cid in streams:
        assert [e["documentKey"] for e in get_more(client, cid, "shared")["nextBatch"]] == [
            {"_id": 0}
        ]
    last = latest_ts(client)
    write_megabytes(client.db.shared, 1)
    for cid in streams:
        with pytest.raises(errors.OperationFailure) as info:
            get_more(client, cid, "shared")
        assert info.value.code == 136
        assert info.value.details["errmsg"].endswith(f"RecordId({record_id(last)})")
        with pytest.raises(errors.OperationFailure) as info:
            get_more(client, cid, "shared")
        assert info.value.code == 43  # CursorNotFound: the failed cursor was closed


def test_a_stream_that_keeps_up_loses_nothing(capped):
    _, client = capped
    coll = client.db.c
    with coll.watch(max_await_time_ms=10, batch_size=1000) as stream:
        first_ts = None
        for start in range(0, 2600, 100):
            coll.insert_many([{"_id": i, "pad": PAD} for i in range(start, start + 100)])
            ids = []
            for _ in range(100):
                event = stream.next()
                first_ts = first_ts or event["clusterTime"]
                ids.append(event["documentKey"]["_id"])
            assert ids == list(range(start, start + 100))
        assert oldest_ts(client) > first_ts  # the oplog did wrap under it
        coll.insert_one({"_id": "last"})
        assert stream.next()["documentKey"] == {"_id": "last"}


def test_a_tailable_oplog_find_fails_instead_of_skipping(capped):
    """A tailable find on local.oplog.rs positioned after the newest entry (nothing scanned
    yet) whose place is dropped: mongod's CappedPositionLost, not the entries after a gap."""
    _, client = capped
    last = latest_ts(client)
    reply = client.local.command(
        {"find": "oplog.rs", "filter": {"ts": {"$gt": last}}, "tailable": True,
         "awaitData": True}
    )
    cid = reply["cursor"]["id"]
    assert reply["cursor"]["firstBatch"] == [] and cid != 0
    write_megabytes(client.db.tail, 0)
    assert oldest_ts(client) > last
    with pytest.raises(errors.OperationFailure) as info:
        client.local.command({"getMore": cid, "collection": "oplog.rs", "maxTimeMS": 10})
    assert info.value.code == 136
    assert info.value.details["codeName"] == "CappedPositionLost"
    assert info.value.details["errmsg"].endswith(
        f"{LOST}Last seen record id: RecordId({record_id(last)})"
    )


def test_a_tailable_oplog_find_that_keeps_up_loses_nothing(capped):
    _, client = capped
    last = latest_ts(client)
    reply = client.local.command(
        {"find": "oplog.rs", "filter": {"ts": {"$gt": last}, "ns": "db.kept"},
         "tailable": True, "awaitData": True}
    )
    cid = reply["cursor"]["id"]
    seen = []
    for start in range(0, 2600, 100):
        client.db.kept.insert_many([{"_id": i, "pad": PAD} for i in range(start, start + 100)])
        batch = client.local.command(
            {"getMore": cid, "collection": "oplog.rs", "batchSize": 1000, "maxTimeMS": 10}
        )["cursor"]["nextBatch"]
        seen.extend(e["o"]["_id"] for e in batch)
    assert seen == list(range(2600))
    assert oldest_ts(client) > last


def test_a_detached_laggard_gets_the_error_not_a_gap(capped):
    """Two identical streams share a reader; the one that does not read falls more than
    MAX_MEMBER_LAG events behind and is detached to read history on its own, from its last
    token. The oplog has dropped that place by then: it fails; the other one goes on."""
    _, client = capped
    fast, slow = open_stream(client, "lag"), open_stream(client, "lag")
    client.db.lag.insert_one({"_id": -1})
    assert [e["documentKey"]["_id"] for e in get_more(client, fast, "lag")["nextBatch"]] == [-1]
    slow_first = get_more(client, slow, "lag", batch_size=1)["nextBatch"]
    assert [e["documentKey"]["_id"] for e in slow_first] == [-1]
    seen = []
    for start in range(0, 12_000, 1000):  # > hub.MAX_MEMBER_LAG events, ~2 MB of oplog
        client.db.lag.insert_many(
            [{"_id": i, "pad": "y" * 100} for i in range(start, start + 1000)]
        )
        batch = get_more(client, fast, "lag", batch_size=1000)["nextBatch"]
        seen.extend(e["documentKey"]["_id"] for e in batch)
    assert seen == list(range(12_000))
    assert oldest_ts(client) > slow_first[0]["clusterTime"]
    with pytest.raises(errors.OperationFailure) as info:
        get_more(client, slow, "lag")
    assert info.value.code == 136
    assert info.value.details["errmsg"] == (
        f"Executor error during getMore :: caused by :: {LOST}"
        f"Last seen record id: RecordId({record_id(slow_first[0]['clusterTime'])})"
    )
    client.db.lag.insert_one({"_id": "after"})
    after = get_more(client, fast, "lag")["nextBatch"]
    assert [e["documentKey"]["_id"] for e in after] == ["after"]


# -- oplog_min_retention_hours (mongod's oplogMinRetentionHours) -------------------------------


def test_min_retention_keeps_young_entries_past_the_size():
    """Entries younger than the retention stay although the oplog is past its size, so a
    stream that did not read meanwhile still gets every event; once they may go (here: the
    retention is lifted), the next write trims the oplog to its size."""
    with EmbeddedServer(
        oplog_size_bytes=OPLOG_BYTES, oplog_min_retention_hours=1.0
    ) as s, s.client() as client:
        coll = client.db.kept
        with coll.watch(max_await_time_ms=10, batch_size=1000) as stream:
            before = latest_ts(client)
            write_megabytes(coll, 0)
            first = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
            assert first["o"] == {"msg": "initiating set"}  # nothing was dropped
            assert sum(len(raw) for raw in s.call(s.store.oplog_entries)) > 2 * OPLOG_BYTES
            ids = [stream.next()["documentKey"]["_id"] for _ in range(2600)]
            assert ids == list(range(2600))
        s.call(setattr, s.store, "oplog_min_retention_hours", 0.0)
        coll.insert_one({"_id": "trim"})
        assert oldest_ts(client) > before
        assert sum(len(raw) for raw in s.call(s.store.oplog_entries)) <= OPLOG_BYTES


def test_min_retention_is_a_store_option(tmp_path):
    from cdcserver.config import check_config

    path = tmp_path / "c.toml"
    path.write_text("[store]\nin_memory = true\noplog_min_retention_hours = 1.5\n")
    config, errors = check_config(str(path), env={})
    assert errors == [] and config is not None
    assert config.store.oplog_min_retention_hours == 1.5
    path.write_text("[store]\nin_memory = true\noplog_min_retention_hours = -1\n")
    _, errors = check_config(str(path), env={})
    assert errors == ["store.oplog_min_retention_hours: must be at least 0, got -1.0"]
