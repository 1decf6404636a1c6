"""Every port of the embedded sharded cluster guarded alike: with [auth] on, each shard's own
port refuses unauthenticated clients as the front does (mongod: members require keyFile
auth), the front logs clients in itself against the cluster's users (as mongos does), the
shards speak TLS when the front does, and they listen on loopback unless told otherwise."""

from __future__ import annotations

import pymongo
import pytest
import trustme
from pymongo.errors import OperationFailure

from cdcserver.config import AuthConfig, Config, ServerConfig, TlsConfig
from cdcserver.deployments.cluster import open_cluster
from cdcserver.sharding.testing import ShardedServer
from tests.server.test_auth import make_user

USERS = [make_user("admin", "root-pass", "root"), make_user("reader", "r-pass", "read@shop")]


@pytest.fixture(scope="module")
def cluster():
    with ShardedServer(shards=2, config=Config(auth=AuthConfig(enabled=True, users=USERS))) as s:
        yield s


def _front(server: ShardedServer, user: str | None = None, password: str | None = None,
           **kwargs) -> pymongo.MongoClient:
    if user is not None:
        kwargs.update(username=user, password=password)
    kwargs.setdefault("serverSelectionTimeoutMS", 5000)
    return pymongo.MongoClient(server.uri, **kwargs)


def _shard(uri: str, user: str | None = None, password: str | None = None,
           **kwargs) -> pymongo.MongoClient:
    if user is not None:
        kwargs.update(username=user, password=password)
    kwargs.setdefault("serverSelectionTimeoutMS", 5000)
    return pymongo.MongoClient(uri, **kwargs)


SHARD_COMMANDS = [
    ("shop", {"insert": "orders", "documents": [{"_id": "intruder"}]}),
    ("shop", {"find": "orders"}),
    ("local", {"find": "oplog.rs"}),
    ("shop", {"aggregate": "orders", "pipeline": [{"$changeStream": {}}], "cursor": {}}),
    ("shop", {"dropDatabase": 1}),
    ("admin", {"listDatabases": 1}),
]


@pytest.mark.parametrize(("db", "cmd"), SHARD_COMMANDS, ids=lambda v: next(iter(v)) if
                         isinstance(v, dict) else v)
def test_each_shard_port_refuses_the_unauthenticated_with_13(cluster, db, cmd):
    for uri in cluster.shard_uris:
        with _shard(uri) as client, pytest.raises(OperationFailure) as excinfo:
            client[db].command(cmd)
        assert excinfo.value.code == 13
        assert excinfo.value.details["errmsg"] == \
            f"Command {next(iter(cmd))} requires authentication"


def test_the_front_logs_users_in_and_checks_their_roles(cluster):
    with _front(cluster, "admin", "root-pass") as admin, \
            _front(cluster, "reader", "r-pass") as reader:
        with reader.shop.orders.watch(max_await_time_ms=50) as stream:
            admin.shop.orders.insert_one({"_id": 1})
            event = None
            for _ in range(100):
                event = stream.try_next()
                if event is not None:
                    break
        assert event is not None and event["documentKey"] == {"_id": 1}
        assert reader.shop.orders.find_one({"_id": 1}) == {"_id": 1}
        with pytest.raises(OperationFailure) as excinfo:
            reader.shop.orders.insert_one({"_id": 2})
        assert excinfo.value.code == 13
    with _front(cluster, "admin", "wrong") as stranger, pytest.raises(OperationFailure) as exc:
        stranger.admin.command("ping")
    assert exc.value.code == 18  # AuthenticationFailed, as from any mongod


def test_a_shard_port_takes_the_clusters_users(cluster):
    with _front(cluster, "admin", "root-pass") as admin:
        admin.shop.orders.insert_one({"_id": "on-a-shard"})
    found = 0
    for uri in cluster.shard_uris:
        with _shard(uri, "admin", "root-pass") as client:
            found += client.shop.orders.count_documents({"_id": "on-a-shard"})
    assert found == 1


def test_the_unauthenticated_front_refuses_with_13(cluster):
    with _front(cluster) as client, pytest.raises(OperationFailure) as excinfo:
        client.shop.orders.find_one()
    assert excinfo.value.code == 13


def test_shards_listen_on_loopback_unless_configured():
    everywhere = Config(server=ServerConfig(host="0.0.0.0", shards=2))  # noqa: S104 (not started)
    deployment = open_cluster(everywhere, 2)
    try:
        assert deployment.shards_host == "127.0.0.1"
    finally:
        deployment.close()
    chosen = Config(server=ServerConfig(shards=2, shards_host="::1"))
    deployment = open_cluster(chosen, 2)
    try:
        assert deployment.shards_host == "::1"
    finally:
        deployment.close()


def test_shards_speak_tls_when_the_front_does(tmp_path):
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    config = Config(tls=TlsConfig(enabled=True, certificate_file=str(tmp_path / "server.pem")))
    with ShardedServer(shards=2, config=config) as server:
        tls = {"tls": True, "tlsCAFile": str(tmp_path / "ca.pem")}
        with _front(server, **tls) as front:
            front.shop.orders.insert_one({"_id": "tls"})
        for uri in server.shard_uris:
            with _shard(uri, **tls) as client:
                client.admin.command("ping")
            with _shard(uri, serverSelectionTimeoutMS=500) as plain, \
                    pytest.raises(pymongo.errors.ServerSelectionTimeoutError):
                plain.admin.command("ping")
