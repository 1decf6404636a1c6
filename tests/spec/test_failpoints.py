"""configureFailPoint: every mode and data field of failCommand and
failGetMoreAfterCursorCheckout, each observed through pymongo (or a raw connection where pymongo
cannot say it: an internal client)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from pymongo import monitoring
from pymongo.errors import AutoReconnect, NotPrimaryError, OperationFailure

from cdcserver import wire
from cdcserver.commands import failpoints
from cdcserver.config import Config, load_config
from cdcserver.testing import ThreadServer

HEARTBEAT_MS = 50  # with fast_heartbeats: a client finds the server again at once
FAIL_GET_MORE = "failGetMoreAfterCursorCheckout"


class Recorder(monitoring.CommandListener):
    """Command events of one client."""

    def __init__(self) -> None:
        self.events: list[Any] = []  # started, succeeded and failed events

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.events.append(event)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.events.append(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.events.append(event)

    def commands(self, name: str) -> list[dict]:
        return [
            e.command for e in self.events
            if isinstance(e, monitoring.CommandStartedEvent) and e.command_name == name
        ]


@pytest.fixture
def server(spec_server: ThreadServer, heartbeats) -> Iterator[ThreadServer]:
    yield spec_server
    spec_server.call(lambda: failpoints.fail_points(spec_server.state).reset())


@pytest.fixture
def make_client(server: ThreadServer) -> Iterator[Any]:
    clients: list[pymongo.MongoClient] = []

    def make(**options: Any) -> pymongo.MongoClient:
        options.setdefault("heartbeatFrequencyMS", HEARTBEAT_MS)
        client = pymongo.MongoClient(server.uri, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client) -> pymongo.MongoClient:
    return make_client()


def configure(client: pymongo.MongoClient, name: str = "failCommand", **fields: Any) -> dict:
    return client.admin.command({"configureFailPoint": name, **fields})


def fresh(client: pymongo.MongoClient, name: str) -> Any:
    coll = client.failpoints[name]
    coll.drop()
    return coll


# -- the command ----------------------------------------------------------------------------------


def test_configure_reports_the_times_entered_and_validates(client):
    # The count is cumulative over the server's life, as mongod's (jstests wait for count + 1),
    # and the session's server has served other files' fail points before this one.
    before = configure(client, mode="off")["count"]
    assert configure(client, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2})[
        "count"] == before
    for _ in range(3):
        with pytest.raises(OperationFailure):
            client.admin.command("ping")
    assert configure(client, mode="off")["count"] == before + 3
    client.admin.command("ping")

    with pytest.raises(OperationFailure) as err:
        client.test.command({"configureFailPoint": "failCommand", "mode": "off"})
    assert err.value.code == 13
    assert "may only be run against the admin database" in str(err.value)
    with pytest.raises(OperationFailure) as err:
        configure(client, "noSuchFailPoint", mode="off")
    assert (err.value.code, err.value.details["codeName"]) == (266, "FailPointSetFailed")
    for mode, code in [
        ("sometimes", 2), ({"times": -1}, 2), ({"times": "x"}, 14), ({"often": 1}, 2),
        ({"activationProbability": 2}, 2), ({"activationProbability": "x"}, 14), (5, 14),
    ]:
        with pytest.raises(OperationFailure) as err:
            configure(client, mode=mode)
        assert err.value.code == code, mode
    with pytest.raises(OperationFailure) as err:
        configure(client, data={})
    assert err.value.code == 20  # no mode
    with pytest.raises(OperationFailure) as err:
        configure(client, mode="off", data=[1])
    assert err.value.code == 14


def test_disabled_by_config(server, client, tmp_path):
    assert Config().server.enable_fail_points is True  # the default
    path = tmp_path / "cdcserver.toml"
    path.write_text("[server]\nenable_fail_points = false\n")
    assert load_config(str(path)).server.enable_fail_points is False

    configure(client, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2})
    server.call(lambda: failpoints.set_enabled(server.state, False))
    try:
        client.admin.command("ping")  # disabling turns every fail point off
        with pytest.raises(OperationFailure) as err:
            configure(client, mode="off")
        assert (err.value.code, err.value.details["codeName"]) == (59, "CommandNotFound")
        assert "no such command: 'configureFailPoint'" in str(err.value)
    finally:
        server.call(lambda: failpoints.set_enabled(server.state, True))
    configure(client, mode="off")


# -- modes ----------------------------------------------------------------------------------------


def _pings(client: pymongo.MongoClient, n: int) -> list[bool]:
    """Which of n pings failed."""
    out = []
    for _ in range(n):
        try:
            client.admin.command("ping")
            out.append(False)
        except OperationFailure as exc:
            assert exc.code == 2
            out.append(True)
    return out


def test_mode_always_on_and_off(client):
    configure(client, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2})
    assert _pings(client, 4) == [True] * 4
    configure(client, mode="off")
    assert _pings(client, 2) == [False] * 2


def test_mode_times(client):
    configure(client, mode={"times": 2}, data={"failCommands": ["ping"], "errorCode": 2})
    assert _pings(client, 4) == [True, True, False, False]
    configure(client, mode={"times": 0}, data={"failCommands": ["ping"], "errorCode": 2})
    assert _pings(client, 1) == [False]


def test_mode_skip(client):
    configure(client, mode={"skip": 2}, data={"failCommands": ["ping"], "errorCode": 2})
    assert _pings(client, 5) == [False, False, True, True, True]


def test_mode_activation_probability(client):
    data = {"failCommands": ["ping"], "errorCode": 2}
    configure(client, mode={"activationProbability": 0}, data=data)
    assert _pings(client, 20) == [False] * 20
    configure(client, mode={"activationProbability": 1}, data=data)
    assert _pings(client, 20) == [True] * 20
    configure(client, mode={"activationProbability": 0.5}, data=data)
    outcomes = _pings(client, 200)
    assert 40 < sum(outcomes) < 160  # both outcomes (P(failure here) < 1e-15)


# -- failCommand data fields ------------------------------------------------------------------


def test_fail_commands_and_error_code(client):
    coll = fresh(client, "fail_commands")
    configure(client, mode="alwaysOn", data={"failCommands": ["find", "count"],
                                             "errorCode": 1234})
    coll.insert_one({"_id": 1})  # not listed
    for call in (lambda: coll.find_one(), lambda: coll.estimated_document_count()):
        with pytest.raises(OperationFailure) as err:
            call()
        assert err.value.code == 1234
        assert err.value.details["errmsg"] == "Failing command via 'failCommand' failpoint"
        assert err.value.details["codeName"] == "Location1234"
        assert "errorLabels" not in err.value.details
    configure(client, mode="alwaysOn", data={"failCommands": ["isMaster"], "errorCode": 2})
    with pytest.raises(OperationFailure):  # an alias of the same command
        client.admin.command("ismaster")
    configure(client, mode="off")
    configure(client, mode="alwaysOn", data={"failCommands": ["configureFailPoint"],
                                             "errorCode": 2})
    configure(client, mode="off")  # never failed, even when listed


def test_error_labels_replace_the_servers(make_client):
    client = make_client(retryReads=False)
    coll = fresh(client, "labels")
    with coll.watch() as stream:
        configure(client, mode={"times": 1}, data={
            "failCommands": ["getMore"], "errorCode": 2, "errorLabels": ["Custom", "Other"]})
        with pytest.raises(OperationFailure) as err:
            stream.try_next()
        assert err.value.details["errorLabels"] == ["Custom", "Other"]
    # [] suppresses the labels mongod would add (here ResumableChangeStreamError).
    configure(client, mode={"times": 1}, data={
        "failCommands": ["aggregate"], "errorCode": 6, "errorLabels": []})
    with pytest.raises(OperationFailure) as err:
        coll.watch()
    assert "errorLabels" not in err.value.details


def test_server_labels_for_injected_errors(make_client):
    recorder = Recorder()
    client = make_client(event_listeners=[recorder], retryReads=False)
    coll = fresh(client, "server_labels")
    # The aggregate that opens a change stream: resumable codes get ResumableChangeStreamError.
    configure(client, mode={"times": 1}, data={"failCommands": ["aggregate"], "errorCode": 6})
    with pytest.raises(OperationFailure) as err:
        coll.watch()
    assert err.value.details["errorLabels"] == ["ResumableChangeStreamError"]
    # A getMore failed by failCommand does not (mongod has not checked the cursor out), so
    # pymongo does not resume.
    with coll.watch(max_await_time_ms=1) as stream:
        configure(client, mode={"times": 1}, data={"failCommands": ["getMore"], "errorCode": 6})
        with pytest.raises(OperationFailure) as err:
            stream.try_next()
        assert "errorLabels" not in err.value.details
    # 280 / 286 are NonResumableChangeStreamError on any command.
    configure(client, mode={"times": 1}, data={"failCommands": ["ping"], "errorCode": 280})
    with pytest.raises(OperationFailure) as err:
        client.admin.command("ping")
    assert err.value.details["errorLabels"] == ["NonResumableChangeStreamError"]
    assert err.value.details["codeName"] == "ChangeStreamFatalError"
    # A retryable write gets RetryableWriteError and pymongo retries it once.
    configure(client, mode={"times": 1}, data={"failCommands": ["insert"], "errorCode": 91})
    recorder.events.clear()
    coll.insert_one({"_id": 1})
    inserts = recorder.commands("insert")
    assert len(inserts) == 2 and inserts[0]["txnNumber"] == inserts[1]["txnNumber"]
    failed = [e for e in recorder.events if isinstance(e, monitoring.CommandFailedEvent)]
    assert failed[0].failure["errorLabels"] == ["RetryableWriteError"]
    # A statement in a transaction gets TransientTransactionError.
    configure(client, mode={"times": 1}, data={"failCommands": ["insert"], "errorCode": 112})
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as err:
            coll.insert_one({"_id": 2}, session=session)
        assert err.value.has_error_label("TransientTransactionError")
        assert err.value.details["codeName"] == "WriteConflict"
        # mongod evaluates failCommand before it checks the session out, so that first
        # statement never started the transaction: committing it is 251 NoSuchTransaction.
        with pytest.raises(OperationFailure) as commit:
            session.commit_transaction()
        assert commit.value.code == 251
        assert commit.value.has_error_label("TransientTransactionError")
    assert coll.count_documents({}) == 1


def test_not_primary_errors_carry_the_topology_version(client):
    hello = client.admin.command("hello")
    configure(client, mode={"times": 1}, data={"failCommands": ["ping"], "errorCode": 10107})
    with pytest.raises(NotPrimaryError) as err:
        client.admin.command("ping")
    # The same topologyVersion as hello's: pymongo sees a stale error and keeps the server.
    assert err.value.details["topologyVersion"] == hello["topologyVersion"]
    assert err.value.details["codeName"] == "NotWritablePrimary"
    client.admin.command("ping")


def test_close_connection(make_client):
    recorder = Recorder()
    client = make_client(event_listeners=[recorder], retryReads=False)
    coll = fresh(client, "close")
    coll.insert_many([{"_id": i} for i in range(3)])
    configure(client, mode={"times": 1}, data={"failCommands": ["find"], "closeConnection": True})
    with pytest.raises(AutoReconnect):  # a network error: no reply at all
        coll.find_one()
    assert coll.find_one({"_id": 2}) == {"_id": 2}


def test_close_connection_during_get_more_resumes_once_and_delivers_every_event_once(make_client):
    recorder = Recorder()
    client = make_client(event_listeners=[recorder])
    coll = fresh(client, "resume_once")
    with coll.watch(batch_size=2, max_await_time_ms=50) as stream:
        coll.insert_many([{"_id": i} for i in range(3)])
        seen = [stream.next()["documentKey"]["_id"] for _ in range(2)]  # one getMore
        configure(client, mode={"times": 1},
                  data={"failCommands": ["getMore"], "closeConnection": True})
        coll.insert_many([{"_id": i} for i in range(3, 6)])
        while len(seen) < 6:
            seen.append(stream.next()["documentKey"]["_id"])
        assert stream.try_next() is None
    assert seen == list(range(6))
    aggregates = recorder.commands("aggregate")
    assert len(aggregates) == 2  # resumed once...
    resumed = aggregates[1]["pipeline"][0]["$changeStream"]
    assert resumed["resumeAfter"] == {"_data": resumed["resumeAfter"]["_data"]}  # ...after _id 1
    assert "startAtOperationTime" not in resumed


def test_block_connection(make_client, server):
    blocked = make_client(appname="blocked")
    other = make_client()
    coll = fresh(blocked, "block")
    configure(blocked, mode={"times": 1}, data={
        "failCommands": ["insert"], "blockConnection": True, "blockTimeMS": 300})
    timings: dict[str, float] = {}

    def insert() -> None:
        start = time.monotonic()
        coll.insert_one({"_id": 1})  # runs after the block
        timings["insert"] = time.monotonic() - start
        timings["insert done"] = time.monotonic()

    thread = threading.Thread(target=insert)
    thread.start()
    time.sleep(0.05)
    other.admin.command("ping")  # other connections are not blocked
    timings["ping done"] = time.monotonic()
    thread.join()
    assert timings["insert"] >= 0.3
    assert timings["ping done"] < timings["insert done"]
    assert coll.find_one() == {"_id": 1}

    # With errorCode: block, then fail.
    configure(blocked, mode={"times": 1}, data={
        "failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 100, "errorCode": 2})
    start = time.monotonic()
    with pytest.raises(OperationFailure):
        blocked.admin.command("ping")
    assert time.monotonic() - start >= 0.1
    # maxTimeMS interrupts the block (opCtx->sleepFor).
    configure(blocked, mode={"times": 1}, data={
        "failCommands": ["count"], "blockConnection": True, "blockTimeMS": 2000})
    with pytest.raises(OperationFailure) as err:
        coll.estimated_document_count(maxTimeMS=100)
    assert err.value.code == 50
    # blockTimeMS is required.
    configure(blocked, mode={"times": 1}, data={"failCommands": ["ping"], "blockConnection": True})
    with pytest.raises(OperationFailure) as err:
        blocked.admin.command("ping")
    assert err.value.code == 72


def test_write_concern_error(make_client):
    recorder = Recorder()
    client = make_client(event_listeners=[recorder], retryWrites=False)
    coll = fresh(client, "wce")
    wce = {"code": 100, "codeName": "UnsatisfiableWriteConcern", "errmsg": "Not enough data"}
    configure(client, mode={"times": 1}, data={"failCommands": ["insert", "find"],
                                               "writeConcernError": wce})
    coll.find_one()  # a read takes no write concern: untouched, and the fail point stays on
    with pytest.raises(pymongo.errors.WriteConcernError) as err:
        coll.insert_one({"_id": 1})
    assert err.value.details == wce
    assert coll.find_one() == {"_id": 1}  # the write happened
    # A retryable write whose write concern error has a retryable code: RetryableWriteError,
    # and pymongo retries it (the store answers the retry from the session's record).
    retrying_events = Recorder()
    retrying = make_client(event_listeners=[retrying_events])
    configure(client, mode={"times": 1}, data={
        "failCommands": ["insert"], "writeConcernError": {"code": 91, "errmsg": "shutdown"}})
    retrying.failpoints.wce.insert_one({"_id": 2})
    inserts = retrying_events.commands("insert")
    assert len(inserts) == 2 and inserts[0]["txnNumber"] == inserts[1]["txnNumber"]
    replies = [e.reply for e in retrying_events.events
               if isinstance(e, monitoring.CommandSucceededEvent) and e.command_name == "insert"]
    assert replies[0]["errorLabels"] == ["RetryableWriteError"]
    assert replies[0]["writeConcernError"]["code"] == 91
    assert "writeConcernError" not in replies[1]
    assert coll.count_documents({}) == 2
    configure(client, mode={"times": 1}, data={
        "failCommands": ["insert"], "writeConcernError": {"code": 91, "errmsg": "shutdown"},
        "errorLabels": ["Given"]})
    with pytest.raises(pymongo.errors.WriteConcernError) as err:
        coll.insert_one({"_id": 3})
    assert err.value.details["errorLabels"] == ["Given"]


def test_app_name(make_client):
    a = make_client(appname="app-a")
    b = make_client(appname="app-b")
    configure(a, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2,
                                        "appName": "app-b"})
    a.admin.command("ping")
    with pytest.raises(OperationFailure):
        b.admin.command("ping")


def test_namespace(client):
    one, two = fresh(client, "ns_one"), fresh(client, "ns_two")
    configure(client, mode="alwaysOn", data={"failCommands": ["insert"], "errorCode": 2,
                                             "namespace": "failpoints.ns_two"})
    one.insert_one({"_id": 1})
    with pytest.raises(OperationFailure):
        two.insert_one({"_id": 1})


class RawConnection:
    """A connection that says what pymongo cannot: hello {internalClient}."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.request_id = 0

    def command(self, body: dict) -> dict:
        self.request_id += 1
        self.sock.sendall(wire.encode_op_msg({**body, "$db": "admin"},
                                             request_id=self.request_id))
        header = self._read(16)
        length = int.from_bytes(header[:4], "little")
        return wire.parse_op_msg(header + self._read(length - 16)).body

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def test_fail_internal_commands(client, server):
    internal = RawConnection((server.host, server.port))
    try:
        internal.command({"hello": 1, "internalClient": {"minWireVersion": 0,
                                                         "maxWireVersion": 25}})
        configure(client, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2})
        assert internal.command({"ping": 1})["ok"] == 1.0  # internal clients are spared
        with pytest.raises(OperationFailure):
            client.admin.command("ping")
        configure(client, mode="alwaysOn", data={"failCommands": ["ping"], "errorCode": 2,
                                                 "failInternalCommands": True})
        assert internal.command({"ping": 1})["code"] == 2
    finally:
        internal.close()


def test_thread_name_and_fail_all_commands(client):
    me = client.admin.command("hello")["connectionId"]
    configure(client, mode="alwaysOn", data={"failAllCommands": True, "errorCode": 2,
                                             "threadName": f"conn{me + 1000}"})
    client.admin.command("ping")  # another connection's thread
    configure(client, mode={"times": 1}, data={"failAllCommands": True, "errorCode": 2})
    with pytest.raises(OperationFailure):
        client.admin.command("buildInfo")


# -- failGetMoreAfterCursorCheckout --------------------------------------------------------------


def test_fail_get_more_after_cursor_checkout_resumes_a_change_stream(make_client):
    recorder = Recorder()
    client = make_client(event_listeners=[recorder])
    coll = fresh(client, "checkout")
    with coll.watch(max_await_time_ms=50) as stream:
        configure(client, FAIL_GET_MORE, mode={"times": 1}, data={"errorCode": 6})
        coll.insert_one({"_id": 1})
        assert stream.next()["documentKey"] == {"_id": 1}
    failed = [e for e in recorder.events if isinstance(e, monitoring.CommandFailedEvent)]
    assert [e.command_name for e in failed] == ["getMore"]
    assert failed[0].failure["errorLabels"] == ["ResumableChangeStreamError"]
    assert failed[0].failure["errmsg"] == "Hit the 'failGetMoreAfterCursorCheckout' failpoint"
    assert len(recorder.commands("aggregate")) == 2


def test_fail_get_more_after_cursor_checkout_deletes_the_cursor(client, server):
    coll = fresh(client, "checkout_find")
    coll.insert_many([{"_id": i} for i in range(5)])
    cursor = coll.find(batch_size=2)
    assert [next(cursor)["_id"] for _ in range(2)] == [0, 1]
    cursor_id = cursor.cursor_id
    configure(client, FAIL_GET_MORE, mode={"times": 1}, data={"errorCode": 96})
    with pytest.raises(OperationFailure) as err:
        next(cursor)
    assert err.value.code == 96
    assert "errorLabels" not in err.value.details  # not a change stream
    with pytest.raises(OperationFailure) as err:
        client.failpoints.command({"getMore": cursor_id, "collection": "checkout_find"})
    assert err.value.code == 43
    # Default code: InternalError; namespace filter on the cursor's namespace.
    configure(client, FAIL_GET_MORE, mode="alwaysOn",
              data={"namespace": "failpoints.other"})
    assert len(list(coll.find(batch_size=2))) == 5
    configure(client, FAIL_GET_MORE, mode="alwaysOn", data={})
    with pytest.raises(OperationFailure) as err:
        list(coll.find(batch_size=2))
    assert (err.value.code, err.value.details["codeName"]) == (1, "InternalError")


# -- docs/testing.md's example --------------------------------------------------------------------


def test_readme_example_consumer_survives_a_resumable_error(server):
    """The pattern docs/testing.md shows: inject a resumable error into your own consumer."""

    def consume(collection, want: int) -> list[int]:  # "your" consumer
        seen = []
        with collection.watch(max_await_time_ms=100) as stream:
            collection.insert_many([{"_id": i} for i in range(want)])
            for event in stream:
                seen.append(event["documentKey"]["_id"])
                if len(seen) == want:
                    return seen
        return seen

    with pymongo.MongoClient(server.uri, heartbeatFrequencyMS=HEARTBEAT_MS) as client:
        client.admin.command({
            "configureFailPoint": "failGetMoreAfterCursorCheckout",
            "mode": {"times": 1},
            "data": {"errorCode": 91},  # ShutdownInProgress: resumable
        })
        orders = client.shop_readme.orders
        orders.drop()
        try:
            assert consume(orders, 3) == [0, 1, 2]
        finally:
            client.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                                  "mode": "off"})
