"""Authentication (SCRAM-SHA-256, SCRAM-SHA-1) and authorization by roles, with real pymongo
clients (sync and async) against an embedded-store cdcserver with `[auth] enabled = true`.

Users are made the way an operator makes them: `cdcserver hash-password` prints the config
block (checked once, end to end); the other users' credentials come from the same function.
Some tests speak SASL themselves (a small SCRAM client below) to see the conversation mongod
has: hello's speculativeAuthenticate, the empty last round, garbage payloads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import socket
import struct
import subprocess
import sys

import bson
import msgspec
import pymongo
import pytest
from pymongo.errors import OperationFailure
from pymongo.operations import SearchIndexModel

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig
from cdcserver.testing import EmbeddedServer

ITERATIONS = 4096  # the RFC minimum keeps the suite fast; the bench uses mongod's defaults


def make_user(name: str, password: str, *roles: str, db: str = "admin") -> UserConfig:
    parsed = [auth.parse_role(r) for r in roles]
    return UserConfig(
        user=name,
        db=db,
        roles=[RoleConfig(role=r, db=d) for r, d in parsed],
        scram_sha_256=auth.derive_credentials(
            auth.SCRAM_SHA_256, name, password, iterations=ITERATIONS
        ),
        scram_sha_1=auth.derive_credentials(
            auth.SCRAM_SHA_1, name, password, iterations=ITERATIONS
        ),
    )


USERS = [
    make_user("reader", "r-pass", "read@shop"),
    make_user("writer", "w-pass", "readWrite@shop"),
    make_user("any", "a-pass", "readAnyDatabase"),
    make_user("admin", "root-pass", "root"),
    make_user("sha1only", "s-pass", "read@shop"),
    make_user("local", "l-pass", "read@shop", db="shop"),  # authenticates on shop
    make_user("dba", "d-pass", "dbAdmin@shop"),
]
USERS[4].scram_sha_256 = None


@pytest.fixture(scope="module")
def server():
    config = Config(auth=AuthConfig(enabled=True, users=USERS))
    with EmbeddedServer(config=config) as server:
        yield server


def client_for(server, user=None, password=None, **kwargs) -> pymongo.MongoClient:
    kwargs.setdefault("serverSelectionTimeoutMS", 5000)
    if user is not None:
        kwargs.update(username=user, password=password)
    return pymongo.MongoClient(server.direct_uri, **kwargs)


def assert_unauthorized(excinfo, prefix: str) -> None:
    err = excinfo.value
    assert err.code == 13
    assert err.details["codeName"] == "Unauthorized"
    assert err.details["errmsg"].startswith(prefix), err.details["errmsg"]


# -- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_right_credentials_authenticate_and_watch(server, mechanism):
    with (
        client_for(server, "reader", "r-pass", authMechanism=mechanism) as reader,
        client_for(server, "writer", "w-pass", authMechanism=mechanism) as writer,
    ):
        status = reader.admin.command("connectionStatus")["authInfo"]
        assert status == {
            "authenticatedUsers": [{"user": "reader", "db": "admin"}],
            "authenticatedUserRoles": [{"role": "read", "db": "shop"}],
        }
        with reader.shop.orders.watch(max_await_time_ms=50) as stream:
            writer.shop.orders.insert_one({"_id": mechanism, "qty": 1})
            event = stream.next()
        assert event["operationType"] == "insert"
        assert event["documentKey"] == {"_id": mechanism}
        assert reader.shop.orders.find_one({"_id": mechanism}) == {"_id": mechanism, "qty": 1}


def test_authentication_database_other_than_admin(server):
    with client_for(server, "local", "l-pass", authSource="shop") as client:
        assert client.shop.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [
            {"user": "local", "db": "shop"}
        ]
        client.shop.orders.find_one()
    with client_for(server, "local", "l-pass") as client:  # authSource admin: no such user
        with pytest.raises(OperationFailure) as excinfo:
            client.shop.orders.find_one()
        assert excinfo.value.code == 18


@pytest.mark.parametrize(
    ("user", "password", "mechanism"),
    [
        ("reader", "wrong", "SCRAM-SHA-256"),
        ("reader", "wrong", "SCRAM-SHA-1"),
        ("nobody", "r-pass", "SCRAM-SHA-256"),
        ("sha1only", "s-pass", "SCRAM-SHA-256"),  # no SCRAM-SHA-256 credentials
    ],
)
def test_wrong_credentials_fail_with_18(server, user, password, mechanism):
    with client_for(server, user, password, authMechanism=mechanism) as client:
        with pytest.raises(OperationFailure) as excinfo:
            client.shop.orders.find_one()
    assert excinfo.value.code == 18
    assert excinfo.value.details["errmsg"] == "Authentication failed."
    assert excinfo.value.details["codeName"] == "AuthenticationFailed"


def test_mechanism_negotiation_uses_sasl_supported_mechs(server):
    with client_for(server) as client:
        hello = client.admin.command("hello", saslSupportedMechs="admin.sha1only")
        assert hello["saslSupportedMechs"] == ["SCRAM-SHA-1"]
        hello = client.admin.command("hello", saslSupportedMechs="admin.reader")
        assert hello["saslSupportedMechs"] == ["SCRAM-SHA-256", "SCRAM-SHA-1"]
        assert "saslSupportedMechs" not in client.admin.command(
            "hello", saslSupportedMechs="admin.nobody"
        )
    # pymongo picks SCRAM-SHA-1 for this user from hello's answer.
    with client_for(server, "sha1only", "s-pass") as client:
        assert client.shop.orders.find_one({"_id": "none"}) is None


def test_pymongo_takes_the_speculative_path(server, caplog):
    caplog.set_level(logging.INFO, logger="cdcserver")
    with client_for(server, "reader", "r-pass") as client:
        client.shop.orders.find_one()
    assert any(
        "authenticated as reader@admin (SCRAM-SHA-256, speculative)" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


async def test_async_pymongo(server):
    client = pymongo.AsyncMongoClient(
        server.direct_uri, username="writer", password="w-pass", serverSelectionTimeoutMS=5000
    )
    try:
        async with await client.shop.orders.watch(max_await_time_ms=50) as stream:
            await client.shop.orders.insert_one({"_id": "async"})
            event = await stream.next()
        assert event["documentKey"] == {"_id": "async"}
        bad = pymongo.AsyncMongoClient(
            server.direct_uri, username="writer", password="nope", serverSelectionTimeoutMS=5000
        )
        try:
            with pytest.raises(OperationFailure) as excinfo:
                await bad.shop.orders.find_one()
            assert excinfo.value.code == 18
        finally:
            await bad.close()
    finally:
        await client.close()


def test_hash_password_cli_output_authenticates(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "hash-password", "--user", "ops",
         "--role", "read@shop", "--role", "clusterMonitor", "--iterations-sha256", "4096",
         "--iterations-sha1", "4096"],
        input="p@ss wörd\n", capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert "p@ss" not in out
    path = tmp_path / "cdcserver.toml"
    path.write_text("[auth]\nenabled = true\n" + out)
    config = msgspec.toml.decode(path.read_bytes(), type=Config)
    assert [(r.role, r.db) for r in config.auth.users[0].roles] == [
        ("read", "shop"), ("clusterMonitor", "admin")
    ]
    with EmbeddedServer(config=config) as server:
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-1"):
            with client_for(server, "ops", "p@ss wörd", authMechanism=mechanism) as client:
                assert client.admin.command("serverStatus")["ok"] == 1.0
                client.shop.orders.find_one()


# -- authorization -----------------------------------------------------------------------------


def test_unauthenticated_commands_fail_with_13(server):
    with client_for(server) as client:
        # The handshake and the commands mongod runs without authentication.
        assert client.admin.command("hello")["isWritablePrimary"] is True
        assert client.admin.command("ping")["ok"] == 1.0
        assert client.admin.command("buildInfo")["version"]
        assert client.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == []
        for run, name in [
            (lambda: client.shop.orders.find_one(), "find"),
            (lambda: client.shop.orders.insert_one({}), "insert"),
            (lambda: client.shop.orders.watch(), "aggregate"),
            (lambda: client.list_database_names(), "listDatabases"),
            (lambda: client.admin.command("serverStatus"), "serverStatus"),
            (lambda: client.admin.command("configureFailPoint", "failCommand", mode="off"),
             "configureFailPoint"),
        ]:
            with pytest.raises(OperationFailure) as excinfo:
                run()
            assert excinfo.value.details["errmsg"] == f"Command {name} requires authentication"
            assert excinfo.value.code == 13
        with pytest.raises(OperationFailure) as excinfo:  # unknown stays unknown
            client.admin.command("noSuchCommand")
        assert excinfo.value.code == 59


def test_streams_outside_the_roles_fail_with_13(server):
    with client_for(server, "reader", "r-pass") as reader:
        reader.shop.orders.watch().close()  # the collection, in its database: allowed
        reader.shop.watch().close()  # the database
        with pytest.raises(OperationFailure) as excinfo:
            reader.other.orders.watch()
        assert_unauthorized(excinfo, 'not authorized on other to execute command { aggregate: '
                                     '"orders", pipeline: [ { $changeStream: {} } ]')
        with pytest.raises(OperationFailure) as excinfo:
            reader.other.watch()
        assert_unauthorized(excinfo, "not authorized on other to execute command { aggregate: 1")
        with pytest.raises(OperationFailure) as excinfo:
            reader.watch()
        assert_unauthorized(excinfo, "not authorized on admin to execute command { aggregate: 1, "
                                     "pipeline: [ { $changeStream: { allChangesForCluster: true")
        with pytest.raises(OperationFailure) as excinfo:
            reader.shop.orders.insert_one({"x": 1})
        assert_unauthorized(excinfo, 'not authorized on shop to execute command { insert: "orders"')
    with client_for(server, "any", "a-pass") as anyone:
        anyone.watch().close()  # readAnyDatabase: the whole cluster
        anyone.other.orders.watch().close()
        with pytest.raises(OperationFailure) as excinfo:
            anyone.local["oplog.rs"].find_one()  # not a normal database
        assert excinfo.value.code == 13
    with client_for(server, "admin", "root-pass") as root:
        root.local["oplog.rs"].find_one()
        root.watch().close()


def test_read_write_role_allows_writes_and_ddl(server):
    with client_for(server, "writer", "w-pass") as writer:
        writer.shop.create_collection("made_by_writer")
        writer.shop.made_by_writer.insert_one({"_id": 1})
        writer.shop.made_by_writer.update_one({"_id": 1}, {"$set": {"a": 1}})
        writer.shop.made_by_writer.create_index("a")
        writer.shop.made_by_writer.delete_one({"_id": 1})
        writer.shop.made_by_writer.drop()
        with pytest.raises(OperationFailure) as excinfo:
            writer.other.c.insert_one({})
        assert excinfo.value.code == 13
        with pytest.raises(OperationFailure) as excinfo:
            writer.drop_database("shop")  # dropDatabase is dbAdmin's
        assert excinfo.value.code == 13


SEARCH_NOT_ENABLED = 31082  # past the authorization check: the command itself refuses


def _code(run) -> int:
    with pytest.raises(OperationFailure) as excinfo:
        run()
    return excinfo.value.code


def test_dbstats_alias_needs_the_db_stats_action(server):
    """dbStats and its alias dbstats are one command in mongod: the dbStats action on the
    database (read and dbAdmin grant it), not root."""
    with client_for(server, "reader", "r-pass") as reader, \
            client_for(server, "dba", "d-pass") as dba:
        for client in (reader, dba):
            for name in ("dbStats", "dbstats"):
                assert client.shop.command(name)["db"] == "shop"
        with pytest.raises(OperationFailure) as excinfo:
            reader.other.command("dbstats")
        assert_unauthorized(excinfo, "not authorized on other to execute command { dbstats: 1")


def test_search_index_commands_need_their_actions(server):
    """createSearchIndexes / updateSearchIndex / dropSearchIndex are readWrite's and
    dbAdmin's, listSearchIndexes (and the $listSearchIndexes stage, an action on the database,
    no find) read's too (builtin_roles.yml); authorized, the command answers 31082."""
    model = SearchIndexModel(definition={"mappings": {"dynamic": True}}, name="default")
    with client_for(server, "writer", "w-pass") as writer, \
            client_for(server, "dba", "d-pass") as dba, \
            client_for(server, "reader", "r-pass") as reader:
        for client in (writer, dba):
            coll = client.shop.orders
            assert _code(lambda c=coll: c.create_search_index(model)) == SEARCH_NOT_ENABLED
            assert _code(lambda c=coll: c.update_search_index("default", {})) == (
                SEARCH_NOT_ENABLED)
            assert _code(lambda c=coll: c.drop_search_index("default")) == SEARCH_NOT_ENABLED
        for client in (writer, dba, reader):
            coll = client.shop.orders
            assert _code(lambda c=coll: list(c.list_search_indexes())) == SEARCH_NOT_ENABLED
            assert _code(lambda c=client: c.shop.command("listSearchIndexes", "orders")) == (
                SEARCH_NOT_ENABLED)
        with pytest.raises(OperationFailure) as excinfo:
            reader.shop.orders.create_search_index(model)
        assert_unauthorized(excinfo, 'not authorized on shop to execute command '
                                     '{ createSearchIndexes: "orders"')
        for run in (lambda: reader.shop.orders.update_search_index("default", {}),
                    lambda: reader.shop.orders.drop_search_index("default"),
                    lambda: writer.other.orders.create_search_index(model),
                    lambda: list(dba.other.orders.list_search_indexes())):
            assert _code(run) == 13
        # dbAdmin may list search indexes but not read the documents
        assert _code(lambda: dba.shop.orders.find_one()) == 13


def test_list_databases_shows_only_the_users_databases(server):
    with client_for(server, "admin", "root-pass") as root:
        root.other.c.insert_one({"_id": "x"})
        root.shop.c.insert_one({"_id": "x"})
        assert {"other", "shop"} <= set(root.list_database_names())
    with client_for(server, "reader", "r-pass") as reader:
        assert reader.list_database_names() == ["shop"]


def test_only_the_owner_may_get_more_or_kill_a_cursor(server):
    with (
        client_for(server, "reader", "r-pass", maxPoolSize=1) as owner,
        client_for(server, "writer", "w-pass") as other,
        client_for(server, "any", "a-pass") as any_reader,
    ):
        reply = owner.shop.command(
            "aggregate", "orders", pipeline=[{"$changeStream": {}}], cursor={}
        )
        cursor_id = reply["cursor"]["id"]
        assert cursor_id
        with pytest.raises(OperationFailure) as excinfo:
            other.shop.command("getMore", cursor_id, collection="orders", maxTimeMS=10)
        assert excinfo.value.code == 13
        assert excinfo.value.details["errmsg"] == (
            f"cursor id {cursor_id} was not created by the authenticated user"
        )
        with pytest.raises(OperationFailure) as excinfo:
            any_reader.shop.command("killCursors", "orders", cursors=[cursor_id])
        assert_unauthorized(excinfo, 'not authorized on shop to execute command { killCursors: ')
        more = owner.shop.command("getMore", cursor_id, collection="orders", maxTimeMS=10)
        assert more["cursor"]["id"] == cursor_id
        killed = owner.shop.command("killCursors", "orders", cursors=[cursor_id])
        assert killed["cursorsKilled"] == [cursor_id]


def test_fail_points_need_root_with_auth_on(server):
    with client_for(server, "any", "a-pass") as reader:
        with pytest.raises(OperationFailure) as excinfo:
            reader.admin.command("configureFailPoint", "failCommand", mode="off")
        assert_unauthorized(excinfo, "not authorized on admin to execute command "
                                     '{ configureFailPoint: "failCommand", mode: "off"')
    with client_for(server, "admin", "root-pass") as root:
        assert root.admin.command("configureFailPoint", "failCommand", mode="off")["ok"] == 1.0


def test_logout_and_one_user_per_connection(server):
    with client_for(server, maxPoolSize=1) as client:
        convo = Scram(client.admin, "reader", "r-pass", "SCRAM-SHA-256")
        convo.run_all()
        assert client.shop.orders.find_one({"_id": "none"}) is None
        other = Scram(client.admin, "writer", "w-pass", "SCRAM-SHA-256")
        with pytest.raises(OperationFailure) as excinfo:
            other.run_all()
        assert excinfo.value.code == 5626701
        assert "Previously authenticated as: reader@admin" in excinfo.value.details["errmsg"]
        assert client.admin.command("logout") == {"ok": 1.0, **_times(client)}
        with pytest.raises(OperationFailure) as excinfo:
            client.shop.orders.find_one()
        assert excinfo.value.code == 13


def _times(client):
    reply = client.admin.command("ping")
    return {"$clusterTime": reply["$clusterTime"], "operationTime": reply["operationTime"]}


# -- the SASL conversation itself --------------------------------------------------------------


class Scram:
    """A minimal SCRAM client over `db.command` (pymongo's connection pool of 1 keeps the
    conversation on one connection)."""

    def __init__(self, db, user, password, mechanism):
        self.db, self.user, self.mechanism = db, user, mechanism
        self.hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha1"
        self.password = auth.scram_password(mechanism, user, password)
        self.nonce = base64.b64encode(os.urandom(24)).decode()
        self.first_bare = f"n={user},r={self.nonce}"

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(kv.split("=", 1) for kv in server_first.decode().split(","))
        assert fields["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac(
            self.hash, self.password, base64.b64decode(fields["s"]), int(fields["i"])
        )
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self.hash)
        signature = hmac.digest(hashlib.new(self.hash, client_key).digest(), message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.hash)
        self.expected_v = base64.b64encode(hmac.digest(server_key, message, self.hash))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def run_all(self, skip_empty_exchange: bool = False) -> list[dict]:
        options = {"skipEmptyExchange": True} if skip_empty_exchange else {}
        replies = [self.db.command("saslStart", 1, mechanism=self.mechanism,
                                   payload=self.first(), options=options)]
        replies.append(self.db.command("saslContinue", 1, conversationId=1,
                                       payload=self.final(replies[0]["payload"])))
        if not replies[-1]["done"]:
            replies.append(self.db.command("saslContinue", 1, conversationId=1, payload=b""))
        return replies


def test_conversation_shape_and_empty_last_round(server):
    with client_for(server, maxPoolSize=1) as client:
        convo = Scram(client.admin, "reader", "r-pass", "SCRAM-SHA-256")
        replies = convo.run_all()
        assert [list(r)[:3] for r in replies] == [["conversationId", "done", "payload"]] * 3
        assert [r["done"] for r in replies] == [False, False, True]
        assert replies[1]["payload"] == b"v=" + convo.expected_v
        assert replies[2]["payload"] == b""
        client.admin.command("logout")
        convo = Scram(client.admin, "reader", "r-pass", "SCRAM-SHA-1")
        replies = convo.run_all(skip_empty_exchange=True)
        assert [r["done"] for r in replies] == [False, True]
        assert replies[1]["payload"] == b"v=" + convo.expected_v


def test_speculative_authenticate_in_hello(server):
    with client_for(server, maxPoolSize=1) as client:
        convo = Scram(client.admin, "writer", "w-pass", "SCRAM-SHA-256")
        hello = client.admin.command("hello", speculativeAuthenticate={
            "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": convo.first(),
            "options": {"skipEmptyExchange": True}, "db": "admin",
        })
        spec = hello["speculativeAuthenticate"]
        assert list(spec) == ["conversationId", "done", "payload"]
        assert spec["done"] is False
        final = client.admin.command("saslContinue", 1, conversationId=1,
                                     payload=convo.final(spec["payload"]))
        assert final["done"] is True
        assert final["payload"] == b"v=" + convo.expected_v
        client.shop.orders.insert_one({"_id": "speculative"})
        # A failed speculative start is as if none was sent: hello still answers.
        hello = client.admin.command("hello", speculativeAuthenticate={
            "saslStart": 1, "mechanism": "PLAIN", "payload": b"x", "db": "admin"})
        assert "speculativeAuthenticate" not in hello and hello["isWritablePrimary"]


@pytest.mark.parametrize(
    "payload",
    [b"", b"garbage", b"p=tls-unique,,n=reader,r=abcdefgh", b"n,,n=reader", b"\xff\xfe\x00",
     b"n,a=other,n=reader,r=abcdefgh", b"n,,m=ext,n=reader,r=abcdefgh"],
)
def test_garbage_sasl_payloads_fail_with_18_and_the_server_goes_on(server, payload):
    with client_for(server, maxPoolSize=1) as client:
        with pytest.raises(OperationFailure) as excinfo:
            client.admin.command("saslStart", 1, mechanism="SCRAM-SHA-256", payload=payload)
        assert excinfo.value.code == 18
        with pytest.raises(OperationFailure) as excinfo:  # the session ended with it
            client.admin.command("saslContinue", 1, conversationId=1, payload=b"x")
        assert excinfo.value.code == 17
        assert excinfo.value.details["codeName"] == "ProtocolError"
        assert excinfo.value.details["errmsg"] == "No SASL session state found"
    with client_for(server, "reader", "r-pass") as client:
        client.shop.orders.find_one()


def test_bad_second_message_and_protocol_errors(server):
    with client_for(server, maxPoolSize=1) as client:
        convo = Scram(client.admin, "reader", "r-pass", "SCRAM-SHA-256")
        start = client.admin.command("saslStart", 1, mechanism="SCRAM-SHA-256",
                                     payload=convo.first())
        with pytest.raises(OperationFailure) as excinfo:
            client.admin.command("saslContinue", 1, conversationId=2, payload=b"x")
        assert excinfo.value.details["errmsg"] == "sasl: Mismatched conversation id"
        tampered = convo.final(start["payload"]).replace(b"c=biws,r=", b"c=biws,r=X")
        with pytest.raises(OperationFailure) as excinfo:
            client.admin.command("saslContinue", 1, conversationId=1, payload=tampered)
        assert excinfo.value.code == 18
        with pytest.raises(OperationFailure) as excinfo:
            client.admin.command("saslStart", 1, mechanism="PLAIN", payload=b"\x00u\x00p")
        assert excinfo.value.code == 334
        assert excinfo.value.details["codeName"] == "MechanismUnavailable"
        assert excinfo.value.details["errmsg"] == (
            "Unsupported mechanism 'PLAIN' on authentication database 'admin'"
        )
        with pytest.raises(OperationFailure) as excinfo:
            client.admin.command("authenticate", 1, mechanism="MONGODB-X509", user="CN=x")
        assert excinfo.value.code == 18


def test_oversized_message_closes_only_that_connection(tmp_path):
    config = Config(auth=AuthConfig(enabled=True, users=USERS))
    config.server.max_message_bytes = 64 * 1024
    with EmbeddedServer(config=config) as server:
        with client_for(server) as client:
            assert client.admin.command("hello")["maxMessageSizeBytes"] == 64 * 1024
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            body = bson.encode({"ping": 1, "pad": "x" * (70 * 1024), "$db": "admin"})
            header = struct.pack("<iiii", 16 + 5 + len(body), 1, 0, 2013)
            # Closed with no reply: an orderly EOF, or a reset when the server closed with the
            # rest of the oversized message still unread (the kernel then sends RST).
            try:
                sock.sendall(header + struct.pack("<iB", 0, 0) + body)
                assert sock.recv(1024) == b""
            except (ConnectionResetError, BrokenPipeError):
                pass
        with client_for(server, "reader", "r-pass") as client:
            assert client.shop.orders.find_one({"_id": "none"}) is None


def test_idle_connections_are_closed(tmp_path):
    config = Config()
    config.server.idle_connection_timeout_s = 0.2
    with EmbeddedServer(config=config) as server:
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            assert sock.recv(1024) == b""  # the server hung up on a silent client
        with client_for(server) as client:  # pymongo's pool reconnects as needed
            assert client.admin.command("ping")["ok"] == 1.0


def test_bad_users_are_refused_at_start():
    def with_role(role: str, db: str) -> UserConfig:
        user = make_user("x", "p")
        user.roles = [RoleConfig(role=role, db=db)]
        return user

    for user, message in [
        (with_role("readAnyDatabase", "shop"), "does not exist (only on admin)"),
        (with_role("wizard", "shop"), "unknown role 'wizard'"),
        (UserConfig(user="x", roles=[]), "no scram_sha_256 or scram_sha_1 credentials"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            auth.ServerAuth(AuthConfig(enabled=True, users=[user]))


def test_upstream_mode_checks_roles_before_forwarding():
    """`serve --upstream`: forwarded commands run on the upstream as the URI's user, so
    cdcserver checks its own client's roles first."""
    from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
    from cdcserver.testing import ThreadServer

    with EmbeddedServer() as upstream:
        config = Config(auth=AuthConfig(enabled=True, users=USERS))
        options = UpstreamOptions(uri=upstream.direct_uri, max_await_ms=200)
        with ThreadServer(make_log=lambda: UpstreamOplog(options), config=config) as sidecar:
            sidecar.run(sidecar.log.wait_ready(30), timeout=35)
            with client_for(sidecar) as anonymous:
                with pytest.raises(OperationFailure) as excinfo:
                    anonymous.shop.orders.insert_one({"_id": 1})
                assert excinfo.value.details["errmsg"] == "Command insert requires authentication"
            with client_for(sidecar, "reader", "r-pass") as reader:
                with pytest.raises(OperationFailure) as excinfo:
                    reader.shop.orders.insert_one({"_id": 1})  # forwarded only if allowed
                assert_unauthorized(excinfo, "not authorized on shop to execute command")
                with pytest.raises(OperationFailure) as excinfo:
                    reader.admin.command("replSetGetStatus")  # clusterMonitor's
                assert excinfo.value.code == 13
            with client_for(sidecar, "writer", "w-pass") as writer:
                writer.shop.orders.insert_one({"_id": 2})  # forwarded, as the upstream's user
            with upstream.client() as direct:
                assert direct.shop.orders.find_one({"_id": 1}) is None
                assert direct.shop.orders.find_one({"_id": 2}) == {"_id": 2}
