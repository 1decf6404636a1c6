"""Image lookups through `--upstream` are awaited, never made on B's event loop.

B (tests/server/test_upstream.py's `UpstreamServer`) tails A (the embedded store). A push whose
events need images says what it needs (pipeline_stages/lookups.py) and runs nothing; B fetches
that from A with AsyncMongoClient and pushes again with the answers. So:

* the events (updateLookup, pre-images, post-images, transactions) equal A's own, byte for
  byte, and B never made a synchronous client to look anything up;
* a lookup that A holds (failCommand blockConnection on `find` of that namespace) does not
  stop B's other streams: they deliver their events while it is held (checked by order);
* a failed lookup fails the stream with the error the fetch records for it.

No wall-clock assertions: every wait has a generous guard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient, errors

from cdcserver.commands.failpoints import fail_points
from tests.server.test_upstream import (
    GUARD_S,
    UpstreamServer,
    a_serves_pre_images,
    drain_until,
    latest_ts,
    mirror_pre_images,
    raw_client,
    raws,
    watch,
)
from tests.support.embedded_support import EmbeddedServer

# How long A holds B's lookup in the stall test: far longer than B needs to serve another
# stream's getMore, so "the other stream got its event first" is an order, not a race.
BLOCK_MS = 5000


@pytest.fixture
def pair() -> Iterator[tuple[EmbeddedServer, UpstreamServer]]:
    a = EmbeddedServer()
    b = None
    try:
        b = UpstreamServer(a.uri, max_await_ms=200, lookup_timeout_ms=GUARD_S * 1000)
        b.wait_ready()
        yield a, b
    finally:
        if b is not None:
            b.stop()
        a.stop()


def configure(a: EmbeddedServer, mode: Any, **data: Any) -> None:
    with a.client() as ca:
        ca.admin.command({"configureFailPoint": "failCommand", "mode": mode, "data": data})


def times_entered(a: EmbeddedServer) -> int:
    return a.call(lambda: fail_points(a.state).points["failCommand"].times_entered)


def sync_client_made(b: UpstreamServer) -> bool:
    """Whether B made its synchronous MongoClient (only `prime`, before serving, may)."""
    return b.call(lambda: b.source._sync_client is not None)


def next_event(stream: Any, guard_s: float = GUARD_S) -> Any:
    deadline = time.monotonic() + guard_s
    while True:
        event = stream.try_next()
        if event is not None:
            return event
        assert time.monotonic() < deadline, "no event"


# ---------------------------------------------------------------------------------------------
# Same events as A's


def workload(ca: MongoClient) -> None:
    shop = ca.shop
    shop.create_collection("audited", changeStreamPreAndPostImages={"enabled": True})
    shop.audited.insert_many([{"_id": i, "v": 0} for i in range(30)])
    shop.audited.update_many({}, {"$inc": {"v": 1}})
    shop.audited.replace_one({"_id": 3}, {"v": "replaced"})
    shop.audited.delete_one({"_id": 4})
    shop.plain.insert_many([{"_id": i} for i in range(5)])
    shop.plain.update_one({"_id": 1}, {"$set": {"a": 1}})
    shop.plain.update_one({"_id": 2}, {"$set": {"a": 2}})
    shop.plain.delete_one({"_id": 2})  # its update's lookup finds nothing: null
    with ca.start_session() as session:
        session.with_transaction(
            lambda s: (
                shop.audited.update_one({"_id": 5}, {"$set": {"t": 1}}, session=s),
                shop.plain.update_one({"_id": 3}, {"$set": {"t": 1}}, session=s),
                shop.audited.delete_one({"_id": 6}, session=s),
                shop.audited.update_one({"_id": 7}, {"$set": {"t": 1}}, session=s),
            )
        )
    shop.recreated.insert_one({"_id": 1})
    shop.recreated.update_one({"_id": 1}, {"$set": {"a": 1}})
    shop.recreated.drop()  # re-created with another UUID: the update's lookup gives null
    shop.recreated.insert_one({"_id": 1, "again": True})
    ca.other.things.insert_one({"_id": "x"})
    ca.other.things.update_one({"_id": "x"}, {"$set": {"a": 1}})


LOOKUP_SPECS = [
    ("shop.plain", {"full_document": "updateLookup"}),
    ("shop", {"full_document": "updateLookup"}),
    ("cluster", {"full_document": "updateLookup", "show_expanded_events": True}),
    ("shop.audited", {"full_document_before_change": "whenAvailable"}),
    ("shop.audited", {"full_document_before_change": "required"}),
    ("shop.audited", {"full_document": "whenAvailable"}),
    ("shop.audited", {"full_document": "required", "full_document_before_change": "required"}),
    ("shop", {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"}),
]


@pytest.mark.parametrize("batch_size", [None, 3])
def test_images_through_b_equal_a_and_none_is_synchronous(pair, batch_size):
    a, b = pair
    ca = raw_client(a.uri)
    start = latest_ts(a)
    workload(ca)
    if not (a_serves_pre_images(ca) or mirror_pre_images(a, ca) > 0):
        pytest.skip("A has no pre-images to serve")
    end = latest_ts(a)
    b.wait_caught_up(end)
    found_images = False
    with raw_client(b.direct_uri) as cb:
        for scope, options in LOOKUP_SPECS:
            opts = {**options, "start_at_operation_time": start}
            if batch_size is not None:
                opts["batch_size"] = batch_size
            with watch(ca, scope, opts) as sa:
                expected = drain_until(sa, end)
            with watch(cb, scope, opts) as sb:
                got = drain_until(sb, end)
            assert raws(got) == raws(expected), (scope, options)
            found_images = found_images or any(
                e.get("fullDocumentBeforeChange") is not None
                or (e["operationType"] == "update" and e.get("fullDocument") is not None)
                for e in expected
            )
    ca.close()
    assert found_images
    assert not sync_client_made(b)  # every lookup was fetched (awaited) before its push


def test_required_pre_image_missing_is_the_same_error_as_a(pair):
    """`fullDocumentBeforeChange: required` on a collection without pre-images: 47, as A."""
    a, b = pair
    ca = a.client()
    start = latest_ts(a)
    ca.shop.bare.insert_one({"_id": 1})
    ca.shop.bare.update_one({"_id": 1}, {"$set": {"a": 1}})
    end = latest_ts(a)
    b.wait_caught_up(end)
    failures = []
    for uri in (a.uri, b.direct_uri):
        with raw_client(uri) as c:
            with pytest.raises(errors.OperationFailure) as failed:
                with watch(c, "shop.bare", {"start_at_operation_time": start,
                                            "full_document_before_change": "required"}) as s:
                    drain_until(s, end)
            failures.append(failed.value.details)
    ca.close()
    assert failures[0]["code"] == 47
    for name in ("ok", "errmsg", "code", "codeName", "errorLabels"):
        assert failures[1].get(name) == failures[0].get(name), name


# ---------------------------------------------------------------------------------------------
# A held lookup does not hold anyone else


class Reader(threading.Thread):
    """Reads one update event from a stream of its own client (the blocked getMore)."""

    def __init__(self, uri: str, ns: str, **options: Any) -> None:
        super().__init__(daemon=True)
        db, _, coll = ns.partition(".")
        self.client = MongoClient(uri)
        self.stream = self.client[db][coll].watch(max_await_time_ms=100, **options)
        self.event: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            deadline = time.monotonic() + GUARD_S * 2
            while self.event is None and time.monotonic() < deadline:
                event = self.stream.try_next()
                if event is not None and event["operationType"] == "update":
                    self.event = event
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            self.done.set()

    def finish(self) -> Any:
        self.join(GUARD_S * 2)
        self.stream.close()
        self.client.close()
        if self.error is not None:
            raise self.error
        return self.event


def test_a_held_lookup_does_not_stop_other_streams(pair):
    a, b = pair
    ca = a.client()
    ca.shop.looked.insert_one({"_id": 1, "v": 0})
    ca.shop.other.insert_one({"_id": 1, "v": 0})
    b.wait_caught_up(latest_ts(a))
    looked = Reader(b.direct_uri, "shop.looked", full_document="updateLookup")
    with b.client() as cb:
        plain = cb.shop.plain.watch(max_await_time_ms=100)
        other = cb.shop.other.watch(max_await_time_ms=100, full_document="updateLookup")
        assert plain.try_next() is None and other.try_next() is None
        configure(a, {"times": 1}, failCommands=["find"], namespace="shop.looked",
                  blockConnection=True, blockTimeMS=BLOCK_MS)
        entered = times_entered(a)
        ca.shop.looked.update_one({"_id": 1}, {"$set": {"v": 1}})
        looked.start()
        deadline = time.monotonic() + GUARD_S
        while times_entered(a) == entered:  # A now holds B's lookup of shop.looked
            assert time.monotonic() < deadline, "B did not look up shop.looked"
            time.sleep(0.01)

        ca.shop.plain.insert_one({"_id": "during"})
        ca.shop.other.update_one({"_id": 1}, {"$set": {"v": 2}})
        event = next_event(plain)
        assert event["documentKey"] == {"_id": "during"}
        event = next_event(other)  # another namespace's lookup goes through meanwhile
        assert event["operationType"] == "update" and event["fullDocument"] == {"_id": 1, "v": 2}
        assert not looked.done.is_set(), "the held lookup's getMore answered first"

        # Once A lets it go, the held stream gets its document (its state at lookup time).
        ca.shop.looked.update_one({"_id": 1}, {"$set": {"w": 1}})
        held = looked.finish()
        assert held is not None
        assert held["fullDocument"] == {"_id": 1, "v": 1, "w": 1}
        plain.close()
        other.close()
    ca.close()
    assert not sync_client_made(b)


# ---------------------------------------------------------------------------------------------
# A failed lookup: the error its fetch records


def _fetched_error(b: UpstreamServer, needs: Any, ask: Any) -> dict[str, Any]:
    """What the stage meets when it asks for `needs` fetched by B (on B's loop), as a reply."""
    from pipeline_stages.lookups import LookupAnswers

    answers = LookupAnswers()
    b.run(b.source.fetch_lookups(needs, answers))

    def run() -> dict[str, Any]:
        try:
            ask(answers)
        except Exception as exc:  # noqa: BLE001 - compared below
            return exc.to_reply()  # type: ignore[attr-defined]
        raise AssertionError("the fetched lookup did not fail")

    return b.call(run)


@pytest.mark.parametrize("kind", ["updateLookup", "preImage"])
def test_a_failed_lookup_is_the_fetchs_resumable_error(pair, kind):
    a, b = pair
    ca = a.client()
    if kind == "updateLookup":
        ns, options, failing = "shop.looked", {"full_document": "updateLookup"}, "shop.looked"
        ca.shop.looked.insert_one({"_id": 1, "v": 0})
    else:
        ns, options = "shop.audited", {"full_document_before_change": "whenAvailable"}
        failing = "config.system.preimages"
        ca.shop.create_collection("audited", changeStreamPreAndPostImages={"enabled": True})
        ca.shop.audited.insert_one({"_id": 1, "v": 0})
    db, _, coll = ns.partition(".")
    b.wait_caught_up(latest_ts(a))  # a new stream on B starts after the insert
    with b.client() as cb:
        stream = cb[db][coll].watch(max_await_time_ms=100, **options)
        assert stream.try_next() is None
        # Three times: the driver resumes once by itself (the error is resumable) and fails
        # again; the third is for the fetch below.
        configure(a, {"times": 3}, failCommands=["find"], namespace=failing, errorCode=234)
        ca[db][coll].update_one({"_id": 1}, {"$set": {"v": 1}})
        with pytest.raises(errors.OperationFailure) as failed:
            next_event(stream)
        stream.close()
    got = failed.value.details
    assert got["code"] == 234 and "ResumableChangeStreamError" in got["errorLabels"]

    # The same lookup fetched by itself (the fail point's third time) fails alike.
    from pipeline_stages.lookups import NeedsLookup

    uuid = ca[db].command("listCollections", filter={"name": coll})["cursor"]["firstBatch"][0]
    uuid = bytes(uuid["info"]["uuid"])
    needs = NeedsLookup()
    if kind == "updateLookup":
        needs.add_document((db, coll, uuid), {"_id": 1})
        expected = _fetched_error(b, needs, lambda answers: answers.current_documents(
            db, coll, uuid, [{"_id": 1}]))
    else:
        from pipeline_stages.image_source import pre_image_id

        entry = next(e for e in a.entries() if e["op"] == "u" and e["ns"] == ns)
        needs.add_pre_image(pre_image_id(uuid, entry["ts"], 0))
        expected = _fetched_error(b, needs, lambda answers: answers.pre_images(
            needs.pre_images))
    for name in ("errmsg", "code", "codeName"):
        assert got[name] == expected[name], name
    ca.close()


def test_a_timed_out_lookup_is_resumable_and_the_stream_resumes(servers_timeout):
    """A holds the lookup past `lookup_timeout_ms`: NetworkTimeout (89), resumable; resuming
    from the last token gets the document once A answers."""
    a, b = servers_timeout
    ca = a.client()
    ca.shop.looked.insert_one({"_id": 1, "v": 0})
    b.wait_caught_up(latest_ts(a))
    # Without retryReads, and held twice: the driver's own resume (one aggregate) fails too,
    # whether it meets the fail point or B's fail-fast after a timed-out lookup.
    with b.client(retryReads=False) as cb:
        stream = cb.shop.looked.watch(max_await_time_ms=100, full_document="updateLookup")
        assert stream.try_next() is None
        token = stream.resume_token
        configure(a, {"times": 2}, failCommands=["find"], namespace="shop.looked",
                  blockConnection=True, blockTimeMS=GUARD_S * 1000)
        ca.shop.looked.update_one({"_id": 1}, {"$set": {"v": 1}})
        with pytest.raises(errors.OperationFailure) as failed:
            next_event(stream)
        assert failed.value.code == 89
        assert failed.value.has_error_label("ResumableChangeStreamError")
        stream.close()
        event = None
        deadline = time.monotonic() + GUARD_S
        while event is None:
            try:
                with cb.shop.looked.watch(resume_after=token, max_await_time_ms=100,
                                          full_document="updateLookup") as again:
                    event = next_event(again)
            except errors.OperationFailure as exc:  # lookups fail fast until B hears from A
                assert exc.has_error_label("ResumableChangeStreamError")
                assert time.monotonic() < deadline, "the stream did not resume"
                time.sleep(0.05)
        assert event["fullDocument"] == {"_id": 1, "v": 1}
    ca.close()


@pytest.fixture
def servers_timeout() -> Iterator[tuple[EmbeddedServer, UpstreamServer]]:
    a = EmbeddedServer()
    b = None
    try:
        b = UpstreamServer(a.uri, max_await_ms=200, lookup_timeout_ms=300)
        b.wait_ready()
        yield a, b
    finally:
        if b is not None:
            b.stop()
        a.stop()


# ---------------------------------------------------------------------------------------------
# Transaction history behind B's window: the push says which entries it needs, B fetches them


def test_a_transaction_chain_behind_the_window_is_fetched_not_read_synchronously():
    """A splits a transaction into a `partialTxn` chain (two ops per applyOps entry) before B
    starts: B's window does not hold it, and a stream starting at the commit entry reads from
    a history segment that starts there. The earlier links are what the push says it needs;
    B fetches them (awaited) and the events equal A's own, byte for byte."""
    a = EmbeddedServer(txn_oplog_entry_ops=2)
    b = None
    try:
        ca = raw_client(a.uri)
        ca.shop.items.insert_one({"_id": "before"})
        with ca.start_session() as session:
            session.with_transaction(
                lambda s: [ca.shop.items.insert_one({"_id": i}, session=s) for i in range(5)]
            )
        entries = a.entries()
        commit = entries[-1]
        assert commit["op"] == "c" and "prevOpTime" in commit  # a chain of several entries
        ca.shop.items.insert_one({"_id": "after"})
        end = latest_ts(a)
        b = UpstreamServer(a.uri, max_await_ms=200, lookup_timeout_ms=GUARD_S * 1000)
        b.wait_ready()
        b.wait_caught_up(end)
        opts = {"start_at_operation_time": commit["ts"]}
        with watch(ca, "shop.items", opts) as sa:
            expected = drain_until(sa, end)
        with raw_client(b.direct_uri) as cb, watch(cb, "shop.items", opts) as sb:
            got = drain_until(sb, end)
        assert [e["documentKey"]["_id"] for e in expected] == [0, 1, 2, 3, 4, "after"]
        assert raws(got) == raws(expected)
        # The two partialTxn links were fetched for the push, not found in memory.
        assert b.call(lambda: b.source.history.entries_fetched) == 2
        assert not sync_client_made(b)
        ca.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


# ---------------------------------------------------------------------------------------------
# A slow lookup holds no other connection


def test_other_connections_are_answered_while_a_lookup_is_held(pair):
    """While A holds B's updateLookup, B answers other connections' commands and getMores:
    each is answered before the held getMore (an order, not a timing)."""
    a, b = pair
    ca = a.client()
    ca.shop.looked.insert_one({"_id": 1, "v": 0})
    b.wait_caught_up(latest_ts(a))
    looked = Reader(b.direct_uri, "shop.looked", full_document="updateLookup")
    configure(a, {"times": 1}, failCommands=["find"], namespace="shop.looked",
              blockConnection=True, blockTimeMS=BLOCK_MS)
    entered = times_entered(a)
    ca.shop.looked.update_one({"_id": 1}, {"$set": {"v": 1}})
    looked.start()
    deadline = time.monotonic() + GUARD_S
    while times_entered(a) == entered:  # A now holds B's lookup
        assert time.monotonic() < deadline, "B did not look up shop.looked"
        time.sleep(0.01)
    answered = 0
    with raw_client(b.direct_uri) as other:
        for _ in range(20):  # new connections' handshakes and commands, one after another
            assert other.admin.command("ping")["ok"] == 1.0
            with other.shop.plain.watch(max_await_time_ms=10) as stream:
                assert stream.try_next() is None  # aggregate + getMore, answered
            answered += 1
            assert not looked.done.is_set(), "the held lookup was answered first"
    assert answered == 20
    held = looked.finish()
    assert held is not None and held["fullDocument"] == {"_id": 1, "v": 1}
    ca.close()
    assert not sync_client_made(b)
