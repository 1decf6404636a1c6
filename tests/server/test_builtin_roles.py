"""The built-in roles' actions as mongod's src/mongo/db/auth/builtin_roles.yml grants them
(cdcserver/roles.py), each difference the roles had checked: through a client where a command
shows it, else on the grants themselves."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig
from cdcserver.roles import role_grants
from cdcserver.testing import EmbeddedServer

ITERATIONS = 4096


def _user(name: str, *roles: str) -> UserConfig:
    parsed = [auth.parse_role(r) for r in roles]
    return UserConfig(
        user=name, db="admin", roles=[RoleConfig(role=r, db=d) for r, d in parsed],
        scram_sha_256=auth.derive_credentials(auth.SCRAM_SHA_256, name, "pw",
                                              iterations=ITERATIONS),
    )


USERS = [_user("reader", "read@shop"), _user("writer", "readWrite@shop"),
         _user("any", "readAnyDatabase"), _user("monitor", "clusterMonitor"),
         _user("owner", "dbOwner@shop"), _user("admin", "root")]


@pytest.fixture(scope="module")
def server():
    with EmbeddedServer(config=Config(auth=AuthConfig(enabled=True, users=USERS))) as s:
        with _client(s, "admin") as root:
            root.shop.get_collection("system.js").insert_one({"_id": "f", "value": 1})
        yield s


def _client(server, user: str) -> pymongo.MongoClient:
    return pymongo.MongoClient(server.direct_uri, username=user, password="pw",
                               serverSelectionTimeoutMS=5000)


def _grants(role: str, db: str, resource: tuple[str, ...], action: str) -> bool:
    return any(g.covers(resource, action) for g in role_grants(role, db))


def test_read_reads_system_js(server):
    with _client(server, "reader") as c:
        assert list(c.shop.get_collection("system.js").find()) == [{"_id": "f", "value": 1}]
        with pytest.raises(OperationFailure) as err:
            list(c.other.get_collection("system.js").find())
        assert err.value.code == 13


def test_read_write_writes_system_js(server):
    with _client(server, "writer") as c:
        c.shop.get_collection("system.js").insert_one({"_id": "g", "value": 2})
        c.shop.get_collection("system.js").delete_one({"_id": "g"})


def test_db_owner_writes_system_js(server):
    with _client(server, "owner") as c:
        c.shop.get_collection("system.js").update_one({"_id": "f"}, {"$set": {"value": 1}})


def test_read_any_database_reads_every_system_js(server):
    with _client(server, "any") as c:
        assert c.shop.get_collection("system.js").count_documents({}) >= 1


def test_cluster_monitor_reads_the_replica_set_collections(server):
    with _client(server, "monitor") as c:
        assert isinstance(list(c.local.get_collection("system.replset").find()), list)
        stats = c.config.command("collStats", "system.sessions")
        assert stats["ns"] == "config.system.sessions"


def test_db_admin_has_no_kill_cursors_action():
    assert not _grants("dbAdmin", "shop", ("db", "shop"), "killCursors")
    assert not _grants("dbAdminAnyDatabase", "admin", ("db", "shop"), "killCursors")
    assert _grants("read", "shop", ("db", "shop"), "killCursors")


@pytest.mark.parametrize(("role", "db", "resource", "action"), [
    ("read", "shop", ("db", "shop"), "planCacheRead"),
    ("readWrite", "shop", ("db", "shop"), "compactStructuredEncryptionData"),
    ("readWrite", "shop", ("db", "shop"), "cleanupStructuredEncryptionData"),
    ("dbAdmin", "shop", ("db", "shop"), "bypassDocumentValidation"),
    ("dbAdmin", "shop", ("db", "shop"), "analyze"),
    ("dbAdmin", "shop", ("db", "shop"), "planCacheWrite"),
    ("userAdmin", "shop", ("db", "shop"), "createRole"),
    ("userAdmin", "shop", ("db", "shop"), "viewRole"),
    ("userAdmin", "shop", ("db", "shop"), "changePassword"),
    ("dbOwner", "shop", ("db", "shop"), "dropRole"),
    ("clusterMonitor", "admin", ("cluster",), "getLog"),
    ("clusterMonitor", "admin", ("cluster",), "listShards"),
    ("clusterMonitor", "admin", ("db", "shop"), "getShardVersion"),
    ("hostManager", "admin", ("cluster",), "flushRouterConfig"),
    ("clusterManager", "admin", ("cluster",), "setFeatureCompatibilityVersion"),
    ("clusterManager", "admin", ("db", "shop"), "moveChunk"),
    ("clusterAdmin", "admin", ("db", "shop"), "splitChunk"),
    ("dbAdminAnyDatabase", "admin", ("cluster",), "applyOps"),
    ("userAdminAnyDatabase", "admin", ("db", "local"), "createUser"),
])
def test_actions_mongod_grants(role, db, resource, action):
    assert _grants(role, db, resource, action)
