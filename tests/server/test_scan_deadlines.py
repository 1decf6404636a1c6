"""`maxTimeMS` and the loop's fairness hold on the long scans outside the query engine: `find`,
`count` and `aggregate` on `local.oplog.rs`, tailable finds on capped collections and `find` on
`config.system.preimages`; a change stream's read of old history lets other connections run
(issue 28 item 3).

Every such scan counts the documents it examines in a `ScanBudget` (cdcserver/scan_deadline.py),
which reads its clock once per `CHECK_EVERY` of them. These tests replace that clock by one that
moves a fixed step at each reading, so a scan's time is a count of what it examined: a scan
that examines a few thousand entries passes a 300 ms deadline, one that examines a few dozen
does not, whatever the machine's speed. The fairness tests hold a scan at one of its pauses
(`scan_deadline.pause_hook`) and check what another connection gets meanwhile: the order of
events, never durations. GUARD_S only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo.errors import ExecutionTimeout

from cdcserver import scan_deadline
from tests.support.embedded_support import Outside

GUARD_S = 30.0
N = 5000  # entries / records: ~78 interrupt checks for a scan of all of them
STEP_S = 0.010  # how far the budget's clock moves per interrupt check
MAX_TIME_MS = 300  # passed after ~30 checks (~1 900 documents examined)
NOTHING = {"op": "no such op"}  # matches no entry: a scan of the whole range


class CountingClock:
    """Time as the budget sees it: `STEP_S` more at every reading."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += STEP_S
        return self.now


@pytest.fixture
def counting_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_deadline, "clock", CountingClock())


def _examined() -> int:
    return scan_deadline.stats["examined"]


@pytest.fixture(scope="module")
def oplog_range(server: Any) -> tuple[Timestamp, Timestamp]:
    """The `ts` of the first and last of N insert entries."""
    client = server.client()
    try:
        coll = client.scan_deadlines.filler
        coll.drop()
        coll.insert_many([{"_id": i} for i in range(N)])
        oplog = client.local["oplog.rs"]
        inserts = {"ns": "scan_deadlines.filler", "op": "i"}
        first = oplog.find(inserts).limit(1).next()["ts"]
        last = oplog.find(inserts).sort("$natural", -1).limit(1).next()["ts"]
        assert oplog.count_documents({**inserts, "ts": {"$gte": first, "$lte": last}}) == N
        return first, last
    finally:
        client.close()


@pytest.fixture(scope="module")
def capped(server: Any) -> Iterator[str]:
    client = server.client()
    db = client.scan_deadlines
    db.drop_collection("capped")
    db.create_collection("capped", capped=True, size=64 * 1024 * 1024)
    db.capped.insert_many([{"_id": i, "n": i} for i in range(N)])
    client.close()
    yield "capped"


# --------------------------------------------------------------------------------------------
# local.oplog.rs


def _oplog_find(client: Any, first: Timestamp, **extra: Any) -> dict[str, Any]:
    return client.local.command({
        "find": "oplog.rs", "filter": {"ts": {"$gte": first}, **NOTHING}, **extra,
    })


def test_oplog_find_ends_with_50_at_its_deadline(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    first, _ = oplog_range
    before = _examined()
    with pytest.raises(ExecutionTimeout) as err:
        _oplog_find(client, first, maxTimeMS=MAX_TIME_MS)
    assert err.value.code == 50
    assert err.value.details is not None
    assert err.value.details["errmsg"] == "operation exceeded time limit"
    assert err.value.details["codeName"] == "MaxTimeMSExpired"
    assert _examined() - before < N  # it stopped part-way
    # Without maxTimeMS the same scan reads every entry and finds nothing.
    reply = _oplog_find(client, first)
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] == 0


def test_oplog_find_that_examines_little_answers_within_its_deadline(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    first, _ = oplog_range
    few = list(client.local["oplog.rs"].find({"ts": {"$gte": first}, "op": "i"}).limit(500))
    last = few[-1]["ts"]
    reply = client.local.command({
        "find": "oplog.rs", "filter": {"ts": {"$gte": first, "$lte": last}, **NOTHING},
        "maxTimeMS": MAX_TIME_MS,
    })
    assert reply["cursor"]["firstBatch"] == []
    # The same deadline over every entry is passed: it is what was examined that counts.
    with pytest.raises(ExecutionTimeout):
        _oplog_find(client, first, maxTimeMS=MAX_TIME_MS)


def test_oplog_reverse_find_ends_with_50_at_its_deadline(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    first, last = oplog_range
    with pytest.raises(ExecutionTimeout):
        client.local.command({
            "find": "oplog.rs", "filter": {"ts": {"$gte": first, "$lte": last}, **NOTHING},
            "sort": {"$natural": -1}, "maxTimeMS": MAX_TIME_MS,
        })


def test_oplog_get_more_has_what_the_find_left(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    first, _ = oplog_range
    reply = client.local.command({
        "find": "oplog.rs", "filter": {"ts": {"$gte": first}, "op": {"$in": ["i", "x"]}},
        "batchSize": 10, "maxTimeMS": MAX_TIME_MS,
    })
    cursor_id = reply["cursor"]["id"]
    assert len(reply["cursor"]["firstBatch"]) == 10 and cursor_id != 0
    with pytest.raises(ExecutionTimeout) as err:
        client.local.command({"getMore": cursor_id, "collection": "oplog.rs"})
    assert err.value.code == 50
    # The failed getMore closed the cursor, as mongod's does.
    killed = client.local.command({"killCursors": "oplog.rs", "cursors": [cursor_id]})
    assert killed["cursorsNotFound"] == [cursor_id]


def test_oplog_await_data_get_more_waits_and_answers(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    """An awaitData getMore's maxTimeMS is its wait, not a deadline: its long scan answers
    (an empty batch), as its find's deadline is the find's alone."""
    first, last = oplog_range
    reply = client.local.command({
        "find": "oplog.rs", "filter": {"ts": {"$gt": last}, **NOTHING}, "tailable": True,
        "awaitData": True, "maxTimeMS": MAX_TIME_MS,
    })
    cursor_id = reply["cursor"]["id"]
    assert reply["cursor"]["firstBatch"] == [] and cursor_id != 0
    client.local.command({"killCursors": "oplog.rs", "cursors": [cursor_id]})
    # A tailable awaitData find over every entry: its own deadline holds.
    with pytest.raises(ExecutionTimeout):
        client.local.command({
            "find": "oplog.rs", "filter": {"ts": {"$gte": first}, **NOTHING},
            "tailable": True, "awaitData": True, "maxTimeMS": MAX_TIME_MS,
        })


def test_oplog_count_and_aggregate_end_with_50_at_their_deadline(
    client: Any, oplog_range: tuple[Timestamp, Timestamp], counting_clock: None
) -> None:
    first, _ = oplog_range
    match = {"ts": {"$gte": first}, **NOTHING}
    for cmd in (
        {"count": "oplog.rs", "query": match},
        {"aggregate": "oplog.rs", "pipeline": [{"$match": match}], "cursor": {}},
    ):
        with pytest.raises(ExecutionTimeout) as err:
            client.local.command({**cmd, "maxTimeMS": MAX_TIME_MS})
        assert err.value.code == 50
    assert client.local.command({"count": "oplog.rs", "query": match})["n"] == 0
    assert client.local.command({"aggregate": "oplog.rs", "pipeline": [{"$match": match}],
                                 "cursor": {}})["cursor"]["firstBatch"] == []


# --------------------------------------------------------------------------------------------
# config.system.preimages


@pytest.fixture(scope="module")
def pre_images(server: Any) -> None:
    """N pre-images (one update of each of N documents)."""
    client = server.client()
    db = client.scan_deadlines
    db.drop_collection("imaged")
    db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    db.imaged.insert_many([{"_id": i, "n": i} for i in range(N)])
    assert db.imaged.update_many({}, {"$inc": {"n": 1}}).modified_count == N
    client.close()


def test_pre_images_find_ends_with_50_at_its_deadline(
    client: Any, pre_images: None, counting_clock: None
) -> None:
    config = client.config
    no_match = {"preImage.n": -1}
    before = _examined()
    with pytest.raises(ExecutionTimeout) as err:
        config.command({"find": "system.preimages", "filter": no_match,
                        "maxTimeMS": MAX_TIME_MS})
    assert err.value.code == 50
    assert _examined() - before < N
    reply = config.command({"find": "system.preimages", "filter": no_match})
    assert reply["cursor"]["firstBatch"] == []


# --------------------------------------------------------------------------------------------
# Tailable finds on a capped collection


def test_capped_tailable_find_ends_with_50_at_its_deadline(
    client: Any, capped: str, counting_clock: None
) -> None:
    db = client.scan_deadlines
    before = _examined()
    for await_data in (False, True):
        with pytest.raises(ExecutionTimeout) as err:
            db.command({"find": capped, "filter": {"n": -1}, "tailable": True,
                        "awaitData": await_data, "maxTimeMS": MAX_TIME_MS})
        assert err.value.code == 50
    assert _examined() - before < 2 * N  # each stopped part-way
    reply = db.command({"find": capped, "filter": {"n": -1}, "tailable": True})
    assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
    db.command({"killCursors": capped, "cursors": [reply["cursor"]["id"]]})


def test_capped_tailable_get_more_has_what_the_find_left(
    client: Any, capped: str, counting_clock: None
) -> None:
    db = client.scan_deadlines
    reply = db.command({"find": capped, "filter": {"n": {"$gte": 0}}, "tailable": True,
                        "batchSize": 10, "maxTimeMS": MAX_TIME_MS})
    cursor_id = reply["cursor"]["id"]
    assert len(reply["cursor"]["firstBatch"]) == 10 and cursor_id != 0
    with pytest.raises(ExecutionTimeout) as err:
        db.command({"getMore": cursor_id, "collection": capped})
    assert err.value.code == 50
    # Without maxTimeMS, the getMore returns the rest.
    reply = db.command({"find": capped, "filter": {"n": {"$gte": 0}}, "tailable": True,
                        "batchSize": 10})
    rest = db.command({"getMore": reply["cursor"]["id"], "collection": capped})
    assert len(rest["cursor"]["nextBatch"]) == N - 10
    db.command({"killCursors": capped, "cursors": [reply["cursor"]["id"]]})


# --------------------------------------------------------------------------------------------
# Fairness: another connection is served while a long scan runs


class Gate:
    """Holds the first scan that pauses, at its pauses, until released (other commands go
    on meanwhile)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self.holding: asyncio.Task[Any] | None = None

    async def __call__(self) -> None:
        task = asyncio.current_task()
        if self.holding is None:
            self.holding = task
        if task is not self.holding:
            return
        self.reached.set()
        while not self.released.is_set():
            await asyncio.sleep(0.001)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    g = Gate()
    monkeypatch.setattr(scan_deadline, "YIELD_AFTER_S", 0.0)  # a pause at every check
    monkeypatch.setattr(scan_deadline, "pause_hook", g)
    return g


def _served_while_held(server: Any, gate: Gate, slow: Outside) -> None:
    other = server.client()
    slow.start()
    try:
        assert gate.reached.wait(GUARD_S), "the scan never paused"
        assert other.admin.command("ping")["ok"] == 1.0
        assert slow.is_alive()  # the ping was answered while the scan was part-way
    finally:
        gate.released.set()
        slow.join(GUARD_S)
        other.close()
    assert not slow.is_alive()
    assert slow.error is None, slow.error


def test_a_long_oplog_scan_does_not_hold_other_connections(
    server: Any, client: Any, oplog_range: tuple[Timestamp, Timestamp], gate: Gate
) -> None:
    first, _ = oplog_range
    slow = Outside(lambda: _oplog_find(client, first)["cursor"]["firstBatch"])
    _served_while_held(server, gate, slow)
    assert slow.result == []


def test_a_long_capped_tailable_find_does_not_hold_other_connections(
    server: Any, client: Any, capped: str, gate: Gate
) -> None:
    db = client.scan_deadlines
    slow = Outside(lambda: db.command({"find": capped, "filter": {"n": -1}, "tailable": True}))
    _served_while_held(server, gate, slow)
    assert slow.result["cursor"]["firstBatch"] == []
    db.command({"killCursors": capped, "cursors": [slow.result["cursor"]["id"]]})


def test_a_long_pre_images_find_does_not_hold_other_connections(
    server: Any, client: Any, pre_images: None, gate: Gate
) -> None:
    config = client.config
    slow = Outside(lambda: config.command({"find": "system.preimages",
                                           "filter": {"preImage.n": -1}}))
    _served_while_held(server, gate, slow)
    assert slow.result["cursor"]["firstBatch"] == []


def test_a_long_change_stream_read_does_not_hold_other_connections(
    server: Any, client: Any, oplog_range: tuple[Timestamp, Timestamp], gate: Gate
) -> None:
    """A stream opened at an old point reads all the history its filter drops (on a sidecar:
    the retained log) before it answers; other connections are served meanwhile."""
    first, _ = oplog_range
    db = client.scan_deadlines
    slow = Outside(lambda: db.command({
        "aggregate": "filler", "cursor": {"batchSize": 5},
        "pipeline": [{"$changeStream": {"startAtOperationTime": first}},
                     {"$match": {"operationType": "delete"}}],
    }))
    _served_while_held(server, gate, slow)
    assert slow.result["cursor"]["firstBatch"] == []
    db.command({"killCursors": "filler", "cursors": [slow.result["cursor"]["id"]]})


def test_a_long_capped_get_more_does_not_hold_other_connections(
    server: Any, client: Any, capped: str, gate: Gate
) -> None:
    db = client.scan_deadlines
    reply = db.command({"find": capped, "filter": {"n": {"$gte": 0}}, "tailable": True,
                        "batchSize": 1})
    cursor_id = reply["cursor"]["id"]
    slow = Outside(lambda: db.command({"getMore": cursor_id, "collection": capped}))
    _served_while_held(server, gate, slow)
    assert len(slow.result["cursor"]["nextBatch"]) == N - 1
    db.command({"killCursors": capped, "cursors": [cursor_id]})
