"""Small differences from mongod 8.0 found by the Node.js driver's integration tests (v7.5.0)
and PyMongo's test files (issue 27 item 7), each through pymongo against the embedded store:

- a `failCommand` fail point with `appName` applies to the handshake `hello` of a connection
  whose client metadata names that application (mongod reads the metadata of the first hello
  before it evaluates the fail point: ExecCommandDatabase::_initiateCommand);
- `$clusterTime` is parsed as mongod 8.0's IDL `ClusterTime` parses it (vector_clock.idl): a
  `clusterTime` that is not a Timestamp is refused; a missing `signature` counts as the dummy
  one (keyId 0), which a server without authorization accepts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig
from cdcserver.testing import EmbeddedServer

# -- failCommand on the handshake -------------------------------------------------------------


def test_fail_command_with_app_name_fails_that_applications_handshake(server, client):
    client.admin.command({
        "configureFailPoint": "failCommand", "mode": "alwaysOn",
        "data": {"failCommands": ["hello", "isMaster"], "appName": "handshakeApp",
                 "errorCode": 10107},
    })
    try:
        # Another application's handshake is not failed (and the fail point is on: the
        # timeout below only bounds how long the driver retries).
        with pymongo.MongoClient(server.direct_uri, appname="otherApp",
                                 serverSelectionTimeoutMS=10_000) as other:
            assert other.admin.command("ping")["ok"] == 1.0
        with pymongo.MongoClient(server.direct_uri, appname="handshakeApp",
                                 serverSelectionTimeoutMS=1_000) as failed:
            with pytest.raises(ServerSelectionTimeoutError) as excinfo:
                failed.admin.command("ping")
        assert "Failing command via 'failCommand' failpoint" in str(excinfo.value)
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")


# -- $clusterTime -----------------------------------------------------------------------------


@pytest.fixture
def gossip(server) -> Iterator[pymongo.MongoClient]:
    """A pymongo client that sends a command's own `$clusterTime` as it is (pymongo replaces it
    by the latest one it heard, in MongoClient._send_cluster_time: that step is skipped)."""
    c = server.client()
    c._send_cluster_time = lambda command, session: None
    yield c
    c.close()


def _run(client: pymongo.MongoClient, cmd: dict) -> OperationFailure:
    with pytest.raises(OperationFailure) as excinfo:
        client.admin_tests.command(cmd)
    return excinfo.value


def test_cluster_time_that_is_not_a_timestamp_is_refused(gossip):
    # The Node.js driver's sessions test sends `$clusterTime: {clusterTime: {}}` (a session
    # whose clusterTime it replaced by an object) and expects a server error.
    err = _run(gossip, {"find": "c", "$clusterTime": {"clusterTime": {}}})
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
        14, "TypeMismatch",
        "BSON field 'find.$clusterTime.clusterTime' is the wrong type 'object', expected type "
        "'timestamp'")
    err = _run(gossip, {"ping": 1, "$clusterTime": {"signature": {}}})
    assert (err.code, err.details["errmsg"]) == (
        40414, "BSON field 'ping.$clusterTime.clusterTime' is missing but a required field")
    err = _run(gossip, {"ping": 1, "$clusterTime": "now"})
    assert (err.code, err.details["errmsg"]) == (
        14, "BSON field 'ping.$clusterTime' is the wrong type 'string', expected type 'object'")
    err = _run(gossip, {"ping": 1, "$clusterTime": {"clusterTime": Timestamp(1, 1),
                                                    "signature": {"hash": b"x" * 20}}})
    assert (err.code, err.details["errmsg"]) == (
        40414, "BSON field 'ping.$clusterTime.signature.keyId' is missing but a required field")
    # No signature is the dummy one, which a server without authorization takes (mongod 8.0;
    # 7.0 refused it: 4 NoSuchKey).
    now = gossip.admin.command("ping")["$clusterTime"]["clusterTime"]
    reply = gossip.admin_tests.command({"find": "c", "$clusterTime": {"clusterTime": now}})
    assert reply["ok"] == 1.0


def test_cluster_time_far_past_the_wall_clock_is_refused(gossip):
    far = Timestamp(int(time.time()) + 2 * 365 * 24 * 3600, 1)
    err = _run(gossip, {"ping": 1, "$clusterTime": {"clusterTime": far}})
    assert (err.code, err.details["codeName"]) == (205, "ClusterTimeFailsRateLimiter")
    assert err.details["errmsg"].startswith(
        f"New $clusterTime, {far.time}, is too far from this node's wall clock time, ")


@pytest.fixture(scope="module")
def auth_server() -> Iterator[EmbeddedServer]:
    users = [_user("reader", "r-pass", "read@shop"), _user("admin", "root-pass", "root")]
    with EmbeddedServer(config=Config(auth=AuthConfig(enabled=True, users=users))) as s:
        yield s


def _user(name: str, password: str, role: str) -> UserConfig:
    role_name, db = auth.parse_role(role)
    return UserConfig(
        user=name, db="admin", roles=[RoleConfig(role=role_name, db=db)],
        scram_sha_256=auth.derive_credentials(auth.SCRAM_SHA_256, name, password,
                                              iterations=4096),
    )


def _gossiping(server: EmbeddedServer, **kwargs: object) -> pymongo.MongoClient:
    c = pymongo.MongoClient(server.direct_uri, serverSelectionTimeoutMS=5000, **kwargs)
    c._send_cluster_time = lambda command, session: None
    return c


def test_cluster_time_past_the_servers_needs_advance_cluster_time_with_authorization(
        auth_server):
    with _gossiping(auth_server, username="reader", password="r-pass") as reader, \
            _gossiping(auth_server, username="admin", password="root-pass") as admin, \
            _gossiping(auth_server) as nobody:
        now = reader.shop.command("ping")["$clusterTime"]["clusterTime"]
        ahead = Timestamp(now.time + 1000, 0)
        # the server's own time (or an earlier one) is valid whoever sends it, unsigned
        assert reader.shop.command({"find": "c", "$clusterTime": {"clusterTime": now}})["ok"]
        # a later one needs a key's signature, or the advanceClusterTime privilege (root)
        err = _run_on(reader.shop, {"find": "c", "$clusterTime": {"clusterTime": ahead}})
        assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
            211, "KeyNotFound",
            f"No keys found for HMAC that is valid for time: {{ ts: Timestamp({ahead.time}, 0) "
            "} with id: 0")
        assert admin.shop.command({"find": "c", "$clusterTime": {"clusterTime": ahead}})["ok"]
        # an unauthenticated client's dummy-signed time on hello is ignored, not refused
        assert nobody.admin.command({"hello": 1, "$clusterTime": {"clusterTime": ahead}})["ok"]


def _run_on(db: pymongo.database.Database, cmd: dict) -> OperationFailure:
    with pytest.raises(OperationFailure) as excinfo:
        db.command(cmd)
    return excinfo.value


# -- currentOp: idle sessions and idle cursors ---------------------------------------------------


def _idle(client: pymongo.MongoClient, kind: str, **spec: bool) -> list[dict]:
    return [op for op in client.admin.aggregate([{"$currentOp": spec}])
            if op.get("type") == kind]


def test_current_op_lists_a_transaction_between_its_commands_as_an_idle_session(server, client):
    # The Node.js driver's client_close test: a transaction left open is an idleSession in
    # currentOp; ended (the client closes), it is not.
    client.admin_tests.drop_collection("idle_txn")
    client.admin_tests.create_collection("idle_txn")
    with pymongo.MongoClient(server.direct_uri, appname="idleTxnApp") as other:
        session = other.start_session()
        session.start_transaction()
        other.admin_tests.idle_txn.insert_one({"x": 1}, session=session)
        ops = [op for op in client.admin.command("currentOp")["inprog"]
               if op.get("type") == "idleSession"]
        assert len(ops) == 1, ops
        op = ops[0]
        assert list(op) == [
            "type", "host", "desc", "client", "connectionId", "appName", "clientMetadata",
            "lsid", "transaction", "waitingForLock", "active", "locks", "lockStats"]
        assert (op["desc"], op["appName"], op["active"]) == (
            "inactive transaction", "idleTxnApp", False)
        assert op["clientMetadata"]["application"] == {"name": "idleTxnApp"}
        assert op["lsid"]["id"] == session.session_id["id"]
        txn = op["transaction"]
        assert list(txn) == ["parameters", "readTimestamp", "startWallClockTime",
                             "timeOpenMicros", "timeActiveMicros", "timeInactiveMicros",
                             "expiryTime"]
        assert txn["parameters"]["txnNumber"] == 1
        assert txn["parameters"]["autocommit"] is False
        assert txn["timeOpenMicros"] == txn["timeActiveMicros"] + txn["timeInactiveMicros"]
        # the stage's idleSessions (on by default) says whether they are listed
        assert len(_idle(client, "idleSession")) == 1
        assert _idle(client, "idleSession", idleSessions=False) == []
        session.abort_transaction()
        assert _idle(client, "idleSession") == []
        session.end_session()


def test_current_op_lists_idle_cursors_with_mongods_fields(client):
    coll = client.admin_tests.idle_cursors
    coll.drop()
    coll.insert_many([{"v": i} for i in range(5)])
    cursor = coll.find({}, batch_size=2)
    next(cursor)
    cursor_id = cursor.cursor_id

    def listed(**spec: bool) -> list[dict]:
        return [op for op in _idle(client, "idleCursor", **spec)
                if op["cursor"]["cursorId"] == cursor_id]

    (op,) = listed(idleCursors=True)
    assert list(op) == ["type", "host", "ns", "lsid", "planSummary", "cursor"]
    assert (op["ns"], op["planSummary"]) == ("admin_tests.idle_cursors", "COLLSCAN")
    assert set(op["lsid"]) == {"id", "uid"}
    idle = op["cursor"]
    assert list(idle) == [
        "cursorId", "createdDate", "lastAccessDate", "nDocsReturned", "nBatchesReturned",
        "noCursorTimeout", "tailable", "awaitData", "originatingCommand"]
    assert (idle["nDocsReturned"], idle["nBatchesReturned"]) == (2, 1)
    assert (idle["tailable"], idle["awaitData"], idle["noCursorTimeout"]) == (
        False, False, False)
    assert idle["originatingCommand"]["find"] == "idle_cursors"
    assert idle["originatingCommand"]["batchSize"] == 2
    assert idle["createdDate"] <= idle["lastAccessDate"]
    for _ in range(2):  # the third document comes with a getMore
        next(cursor)
    idle = listed(idleCursors=True)[0]["cursor"]
    assert (idle["nDocsReturned"], idle["nBatchesReturned"]) == (4, 2)
    assert listed(idleCursors=False) == [] and listed() == []
    cursor.close()
    assert listed(idleCursors=True) == []
