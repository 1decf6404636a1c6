"""Streams joining a filter group that an idle stream left behind a drop, through pymongo.

A stream nobody reads keeps its group at the place where it was last read. A collection drop
after that place invalidates the group's producer only when someone reads it: a new stream
(or a resumed one that has caught up) catches the group up to its own start, and must not join
it if that catch-up met the invalidate (an invalidated producer ignores every later entry, so
the stream would never get an event).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from cdcserver.testing import EmbeddedServer

# A bound against a hang, not a timing: the event is there long before.
EVENT_BOUND_S = 20.0


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    s = EmbeddedServer()
    yield s
    s.stop()


def next_event(stream: Any) -> dict[str, Any]:
    deadline = time.monotonic() + EVENT_BOUND_S
    while stream.alive:
        event = stream.try_next()
        if event is not None:
            return event
        if time.monotonic() > deadline:
            break
    raise AssertionError("the change stream never returned the event")


def test_a_new_stream_after_a_drop_is_not_joined_to_the_idle_streams_dead_group(
    server: EmbeddedServer,
) -> None:
    client = server.client()
    coll = client.db.c
    client.db.create_collection("c")
    with coll.watch(max_await_time_ms=50) as idle:  # opened, never read until the end
        coll.drop()
        client.db.create_collection("c")
        with coll.watch(max_await_time_ms=50) as stream:
            coll.insert_one({"_id": 1, "a": 1})
            event = next_event(stream)
            assert event["operationType"] == "insert"
            assert event["documentKey"] == {"_id": 1}
            assert "wallTime" in event
        # The idle stream still ends as mongod's does: the drop, then its invalidate.
        assert next_event(idle)["operationType"] == "drop"
        assert next_event(idle)["operationType"] == "invalidate"


def test_after_consecutive_resumes_a_new_stream_gets_its_event(server: EmbeddedServer) -> None:
    """The specification's "Test consecutive resume" then "Test wallTime field is set": the
    connections closed under the getMores leave server cursors behind in the group."""
    admin = server.client()
    client = server.client()
    coll = client.db.c
    admin.db.create_collection("c")
    admin.admin.command({
        "configureFailPoint": "failCommand",
        "mode": {"times": 2},
        "data": {"failCommands": ["getMore"], "closeConnection": True},
    })
    try:
        with coll.watch(batch_size=1, max_await_time_ms=50) as stream:
            for x in (1, 2, 3):
                admin.db.c.insert_one({"x": x})
            assert [next_event(stream)["fullDocument"]["x"] for _ in range(3)] == [1, 2, 3]
    finally:
        admin.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    admin.db.c.drop()
    admin.db.create_collection("c")
    with coll.watch(max_await_time_ms=50) as stream:
        coll.insert_one({"_id": 1, "a": 1})
        event = next_event(stream)
        assert (event["operationType"], event["documentKey"]) == ("insert", {"_id": 1})


def test_a_resumed_stream_does_not_rejoin_a_group_its_catch_up_invalidated(
    server: EmbeddedServer,
) -> None:
    client = server.client()
    coll = client.db.c
    client.db.create_collection("c")
    with coll.watch(max_await_time_ms=50) as idle:  # its group stays before the drop
        coll.drop()
        # Another spec (its own group): the token of the first insert after the drop.
        with coll.watch(full_document="updateLookup", max_await_time_ms=50) as other:
            coll.insert_one({"_id": 1})
            token = next_event(other)["_id"]
        client.db.other.insert_one({"_id": 0})  # an entry past the token, not an event
        # Resumed with the idle stream's spec: once it has read past its token and caught up,
        # it looks for a group (the idle stream's is behind: caught up, it meets the drop).
        with coll.watch(resume_after=token, max_await_time_ms=50) as resumed:
            assert resumed.try_next() is None
            coll.insert_one({"_id": 2})
            event = next_event(resumed)
            assert (event["operationType"], event["documentKey"]) == ("insert", {"_id": 2})
        assert [next_event(idle)["operationType"] for _ in range(2)] == ["drop", "invalidate"]
