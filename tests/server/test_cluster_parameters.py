"""setClusterParameter / getClusterParameter on the embedded replica set, as mongod 8.0 answers
them (set_cluster_parameter_*.cpp, get_cluster_parameter_*.cpp, change_stream_options*.cpp):
the `changeStreamOptions` parameter's replies and errors, its document in
`config.clusterParameters` (durable with `--data-dir`), and `expireAfterSeconds` applied by the
store's pre-image remover (one pass run with a given `now`, and the periodic job)."""

from __future__ import annotations

import datetime
import time

import pymongo
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from cdcserver.config import AuthConfig, Config
from cdcserver.embedded import images
from cdcserver.testing import EmbeddedServer
from tests.server.test_auth import make_user

OFF = {"_id": "changeStreamOptions", "clusterParameterTime": Timestamp(0, 0),
       "preAndPostImages": {"expireAfterSeconds": "off"}}
GUARD_S = 30.0  # a hang guard for the periodic remover, never a timing expectation


def _set(client: pymongo.MongoClient, expire: object) -> dict:
    return client.admin.command(
        "setClusterParameter", {"changeStreamOptions": {"preAndPostImages": {
            "expireAfterSeconds": expire}}})


def _get(client: pymongo.MongoClient, arg: object = "changeStreamOptions") -> list[dict]:
    return client.admin.command("getClusterParameter", arg)["clusterParameters"]


@pytest.fixture
def server():
    s = EmbeddedServer()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


@pytest.mark.parametrize("arg", ["changeStreamOptions", ["changeStreamOptions"], "*"])
def test_a_parameter_never_set_answers_its_default(client, arg):
    assert _get(client, arg) == [OFF]


def test_set_then_get_answers_the_value_as_a_long_with_its_time(client):
    before = client.admin.command("ping")["operationTime"]
    reply = _set(client, 30)
    assert reply["ok"] == 1.0
    assert set(reply) == {"ok", "$clusterTime", "operationTime"}
    (param,) = _get(client)
    assert list(param) == ["_id", "clusterParameterTime", "preAndPostImages"]
    assert param["preAndPostImages"] == {"expireAfterSeconds": 30}
    assert type(param["preAndPostImages"]["expireAfterSeconds"]) is Int64  # safeInt64
    # The cluster time when it was set, before the write that records it.
    assert before <= param["clusterParameterTime"] < reply["operationTime"]
    assert _get(client, "*") == [param]
    _set(client, "off")
    (param,) = _get(client)
    assert param["preAndPostImages"] == {"expireAfterSeconds": "off"}


def test_the_parameter_is_a_document_of_config_cluster_parameters(server, client):
    _set(client, 45.9)
    (doc,) = client.config.clusterParameters.find()
    (param,) = _get(client)
    # Stored as given (a double), answered as the long the IDL parses it to.
    assert doc == {"_id": "changeStreamOptions",
                   "clusterParameterTime": param["clusterParameterTime"],
                   "preAndPostImages": {"expireAfterSeconds": 45.9}}
    assert param["preAndPostImages"]["expireAfterSeconds"] == Int64(45)
    _set(client, 7)
    # An upsert as any: the collection created by the first, then an insert, an update.
    entries = [(e["op"], e["ns"], e["o"].get("create")) for e in server.entries()]
    assert entries[-3:] == [("c", "config.$cmd", "clusterParameters"),
                            ("i", "config.clusterParameters", None),
                            ("u", "config.clusterParameters", None)]
    assert client.config.clusterParameters.find_one()["preAndPostImages"] == {
        "expireAfterSeconds": 7}


SET_ERRORS = [
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": 0}}}, 2,
     "Numeric value of 'expireAfterSeconds' should be positive"),
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": -5}}}, 2,
     "Numeric value of 'expireAfterSeconds' should be positive"),
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": "on"}}}, 2,
     "Non-numeric value of 'expireAfterSeconds' should be 'off'"),
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": True}}}, 2,
     "Failed parsing new changeStreamOptions valueBSON field "
     "'changeStreamOptions.preAndPostImages.expireAfterSeconds' is the wrong type 'bool', "
     "expected types '[string, long, int, decimal, double']"),
    ({"changeStreamOptions": {"preAndPostImages": {}}}, 2,
     "Failed parsing new changeStreamOptions valueBSON field "
     "'changeStreamOptions.expireAfterSeconds' is missing but a required field"),
    ({"changeStreamOptions": {}}, 2,
     "Failed parsing new changeStreamOptions valueBSON field "
     "'changeStreamOptions.preAndPostImages' is missing but a required field"),
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": 5, "x": 1}}}, 2,
     "Failed parsing new changeStreamOptions valueBSON field "
     "'changeStreamOptions.preAndPostImages.x' is an unknown field."),
    ({"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": 5}, "x": 1}}, 2,
     "Failed parsing new changeStreamOptions valueBSON field 'changeStreamOptions.x' is an "
     "unknown field."),
    ({"changeStreamOptions": 5}, 2, "Cluster parameter value must be an object"),
    ({"nonexistentParam": {"intData": 5}}, 4, "Unknown server parameter: nonexistentParam"),
    ({"querySettings": {}}, 4, "Unknown server parameter: querySettings"),
    ({}, 4, "No cluster parameter provided"),
    ({"changeStreamOptions": {}, "other": {}}, 72,
     "setClusterParameter only supports setting exactly one parameter"),
    (5, 14, "BSON field 'setClusterParameter.setClusterParameter' is the wrong type 'int', "
     "expected type 'object'"),
]


@pytest.mark.parametrize(("arg", "code", "message"), SET_ERRORS)
def test_set_errors(client, arg, code, message):
    with pytest.raises(OperationFailure) as excinfo:
        client.admin.command("setClusterParameter", arg)
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (code, message)
    assert _get(client) == [OFF]  # nothing was set


GET_ERRORS = [
    ("nonexistentParam", 4, "Unknown server parameter: nonexistentParam"),
    (["nonexistentParam"], 4, "Unknown server parameter: nonexistentParam"),
    (["changeStreamOptions", "nonexistentParam"], 4,
     "Unknown server parameter: nonexistentParam"),
    ("querySettings", 4, "Unknown server parameter: querySettings"),
    ([], 2, "Must supply at least one cluster server parameter name to getClusterParameter"),
    (5, 14, "BSON field 'getClusterParameter.getClusterParameter' is the wrong type 'int', "
     "expected types '[string, array']"),
    (["changeStreamOptions", 3], 14, "BSON field 'getClusterParameter.getClusterParameter.1' "
     "is the wrong type 'int', expected type 'string'"),
]


@pytest.mark.parametrize(("arg", "code", "message"), GET_ERRORS)
def test_get_errors(client, arg, code, message):
    with pytest.raises(OperationFailure) as excinfo:
        client.admin.command("getClusterParameter", arg)
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (code, message)


@pytest.mark.parametrize("name", ["setClusterParameter", "getClusterParameter"])
def test_admin_only(client, name):
    arg = {"changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": 5}}} \
        if name == "setClusterParameter" else "*"
    with pytest.raises(OperationFailure) as excinfo:
        client.shop.command(name, arg)
    assert excinfo.value.code == 13
    assert excinfo.value.details["errmsg"] == \
        f"{name} may only be run against the admin database."


def test_with_auth_a_user_without_the_privilege_gets_13():
    users = [make_user("admin", "root-pass", "root"), make_user("reader", "r-pass", "read@shop")]
    with EmbeddedServer(config=Config(auth=AuthConfig(enabled=True, users=users))) as server:
        with server.client(username="reader", password="r-pass", authSource="admin") as c:
            for name, arg in [("setClusterParameter", {"changeStreamOptions": {
                    "preAndPostImages": {"expireAfterSeconds": 5}}}),
                    ("getClusterParameter", "*")]:
                with pytest.raises(OperationFailure) as excinfo:
                    c.admin.command(name, arg)
                assert excinfo.value.code == 13
        with server.client(username="admin", password="root-pass", authSource="admin") as c:
            _set(c, 5)
            assert _get(c)[0]["preAndPostImages"] == {"expireAfterSeconds": 5}


def test_the_parameter_survives_a_restart_of_a_durable_store(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as server, server.client() as client:
        _set(client, 600)
        (before,) = _get(client)
    with EmbeddedServer(data) as server, server.client() as client:
        assert _get(client) == [before]
        assert before["preAndPostImages"] == {"expireAfterSeconds": 600}


# -- expireAfterSeconds applied: the pre-image remover --------------------------------------------


def _pre_images(client: pymongo.MongoClient) -> list[dict]:
    return list(client.config["system.preimages"].find())


def _with_pre_images(client: pymongo.MongoClient) -> tuple[list[dict], Timestamp]:
    """Two updates of a collection with pre-images; the time of the first."""
    db = client.shop
    db.create_collection("orders", changeStreamPreAndPostImages={"enabled": True})
    db.orders.insert_one({"_id": 1, "n": 0})
    last = client.admin.command("ping")["operationTime"]  # the insert's
    start = Timestamp(last.time, last.inc + 1)
    db.orders.update_one({"_id": 1}, {"$set": {"n": 1}})
    db.orders.update_one({"_id": 1}, {"$set": {"n": 2}})
    docs = _pre_images(client)
    assert [d["preImage"] for d in docs] == [{"_id": 1, "n": 0}, {"_id": 1, "n": 1}]
    return docs, start


def _remove(server: EmbeddedServer, now: datetime.datetime) -> int:
    return server.call(server.store.remove_expired_pre_images, now)


def _before_change(client: pymongo.MongoClient, start: Timestamp, mode: str) -> list:
    with client.shop.orders.watch(start_at_operation_time=start,
                                  full_document_before_change=mode) as stream:
        events = [stream.next() for _ in range(2)]
    assert [e["operationType"] for e in events] == ["update", "update"]
    return [e.get("fullDocumentBeforeChange") for e in events]


def test_pre_images_older_than_expire_after_seconds_are_removed(server, client):
    docs, start = _with_pre_images(client)
    newest = max(d["operationTime"] for d in docs)
    _set(client, 3600)
    # An hour after the newest less a second: none is old enough.
    assert _remove(server, newest + datetime.timedelta(seconds=3599)) == 0
    assert len(_pre_images(client)) == 2
    assert _remove(server, newest + datetime.timedelta(seconds=3600)) == 2
    assert _pre_images(client) == []
    assert _before_change(client, start, "whenAvailable") == [None, None]
    with pytest.raises(OperationFailure) as excinfo:
        _before_change(client, start, "required")
    assert excinfo.value.code == 47  # NoMatchingDocument: the pre-image is gone


def test_with_expiry_off_only_the_oplog_removes_pre_images(server, client):
    docs, start = _with_pre_images(client)
    far = max(d["operationTime"] for d in docs) + datetime.timedelta(days=365)
    assert _remove(server, far) == 0  # never set: "off"
    _set(client, 60)
    _set(client, "off")
    assert _remove(server, far) == 0
    assert _before_change(client, start, "required") == [{"_id": 1, "n": 0}, {"_id": 1, "n": 1}]


def test_removed_pre_images_stay_removed_after_a_restart(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as server, server.client() as client:
        docs, _ = _with_pre_images(client)
        _set(client, 10)
        assert _remove(server, max(d["operationTime"] for d in docs)
                       + datetime.timedelta(seconds=10)) == 2
    with EmbeddedServer(data) as server, server.client() as client:
        assert _pre_images(client) == []


def test_the_periodic_remover_applies_expire_after_seconds(monkeypatch):
    monkeypatch.setattr(images.ImagesMixin, "pre_image_removal_sleep_secs", 0.05)
    with EmbeddedServer() as server, server.client() as client:
        _with_pre_images(client)
        _set(client, 1)
        deadline = time.monotonic() + GUARD_S
        while _pre_images(client) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pre_images(client) == []
