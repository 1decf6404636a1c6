"""MongoDB's built-in roles, as cdcserver grants them: the actions of each role and the
resources they apply to. A leaf module (no cdcserver import): the config checks role names with
it, `cdcserver/auth.py` authorizes commands with it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Resources: ("cluster",), ("any",) = every normal database, ("db", D), ("ns", D, C).
Resource = tuple[str, ...]

READ = frozenset(
    {"find", "changeStream", "listCollections", "listIndexes", "collStats", "dbStats",
     "dbHash", "killCursors", "listSearchIndexes"}
)
READ_WRITE = READ | {
    "insert", "update", "remove", "createCollection", "dropCollection", "createIndex",
    "dropIndex", "renameCollectionSameDB", "convertToCapped", "createSearchIndexes",
    "updateSearchIndex", "dropSearchIndex",
}
DB_ADMIN = frozenset(
    {"collMod", "createCollection", "dropCollection", "createIndex", "dropIndex",
     "listCollections", "listIndexes", "dbStats", "collStats", "renameCollectionSameDB",
     "dropDatabase", "enableProfiler", "compact", "validate", "reIndex", "killCursors",
     "createSearchIndexes", "updateSearchIndex", "dropSearchIndex", "listSearchIndexes"}
)
USER_ADMIN = frozenset({"createUser", "dropUser", "grantRole", "revokeRole", "viewUser"})
CLUSTER_MONITOR = frozenset(
    {"serverStatus", "listDatabases", "getParameter", "connPoolStats", "replSetGetStatus",
     "top", "hostInfo", "getCmdLineOpts", "inprog", "listSessions", "replSetGetConfig"}
)
# mongod's builtin_roles.yml: killing others' cursors, sessions and operations is hostManager's
# (clusterAdmin has it through hostManager), not clusterManager's.
HOST_MANAGER = frozenset(
    {"killAnyCursor", "killop", "killAnySession", "setParameter", "fsync", "logRotate",
     "dropConnections", "shutdown"}
)
CLUSTER_MANAGER = frozenset({"listSessions", "replSetGetConfig", "replSetGetStatus"})
# <db>.system.profile: dbAdmin may read and recreate it, clusterMonitor read it (everywhere).
PROFILE = "system.profile"
DB_ADMIN_PROFILE = READ | {"convertToCapped", "createCollection", "dropCollection"}


@dataclass(frozen=True)
class Grant:
    # "any" (normal databases), "db", "cluster", "anyResource" (root), "exact" (db.coll),
    # "collection" (coll in every database)
    kind: str
    db: str
    actions: frozenset[str]
    coll: str = ""

    def covers(self, resource: Resource, action: str) -> bool:
        if self.kind == "anyResource":
            return True
        if action not in self.actions:
            return False
        what = resource[0]
        if self.kind in ("exact", "collection"):
            return what == "ns" and resource[2] == self.coll and (
                self.kind == "collection" or resource[1] == self.db)
        if self.kind == "cluster":
            return what == "cluster"
        if what in ("cluster", "any"):
            return what == "any" and self.kind == "any"
        db = resource[1]
        coll = resource[2] if what == "ns" else ""
        if coll.startswith("system."):
            return False  # system collections need explicit privileges in MongoDB
        if self.kind == "any":
            return db not in ("local", "config")
        return db == self.db


_ADMIN_ROLES = frozenset(
    {"readAnyDatabase", "readWriteAnyDatabase", "dbAdminAnyDatabase", "userAdminAnyDatabase",
     "clusterMonitor", "clusterManager", "hostManager", "clusterAdmin", "root"}
)


def role_grants(role: str, db: str) -> list[Grant]:
    """What a built-in role grants; ValueError for an unknown role or a cluster role off admin."""
    on_db = {
        "read": READ,
        "readWrite": READ_WRITE,
        "dbAdmin": DB_ADMIN,
        "userAdmin": USER_ADMIN,
        "dbOwner": READ_WRITE | DB_ADMIN | USER_ADMIN,
    }
    if role in on_db:
        grants = [Grant("db", db, on_db[role])]
        if role in ("dbAdmin", "dbOwner"):
            grants.append(Grant("exact", db, DB_ADMIN_PROFILE, PROFILE))
        return grants
    if role not in _ADMIN_ROLES:
        raise ValueError(f"unknown role {role!r}")
    if db != "admin":
        raise ValueError(f"role {role}@{db} does not exist (only on admin)")
    any_db = {
        "readAnyDatabase": READ,
        "readWriteAnyDatabase": READ_WRITE,
        "dbAdminAnyDatabase": DB_ADMIN,
        "userAdminAnyDatabase": USER_ADMIN,
    }
    if role in any_db:
        grants = [Grant("any", "", any_db[role]),
                  Grant("cluster", "", frozenset({"listDatabases"}))]
        if role == "dbAdminAnyDatabase":
            grants.append(Grant("collection", "", DB_ADMIN_PROFILE, PROFILE))
        return grants
    if role == "clusterMonitor":
        return _cluster_monitor()
    if role == "clusterManager":
        return [Grant("cluster", "", CLUSTER_MANAGER), Grant("db", "config", READ)]
    if role == "hostManager":
        return [Grant("cluster", "", HOST_MANAGER), Grant("any", "", frozenset({"killCursors"}))]
    if role == "clusterAdmin":
        return [*_cluster_monitor(), Grant("cluster", "", CLUSTER_MANAGER | HOST_MANAGER),
                Grant("any", "", frozenset({"killCursors", "dropDatabase"}))]
    if role == "root":
        return [Grant("anyResource", "", frozenset())]
    raise ValueError(f"unknown role {role!r}")


def _cluster_monitor() -> list[Grant]:
    stats = frozenset({"collStats", "dbStats", "indexStats"})
    return [Grant("cluster", "", CLUSTER_MONITOR), Grant("any", "", stats),
            Grant("db", "config", READ | stats), Grant("db", "local", READ | stats),
            Grant("collection", "", frozenset({"find"}), PROFILE)]


def parse_role(text: str) -> tuple[str, str]:
    """`read@shop` -> ("read", "shop"); a bare role is on admin (as MongoDB's role docs)."""
    role, _, db = text.partition("@")
    if not role:
        raise ValueError(f"bad role {text!r}: ROLE[@DB]")
    db = db or "admin"
    role_grants(role, db)  # refuses unknown roles, and cluster roles off admin
    return role, db
