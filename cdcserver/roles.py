"""MongoDB's built-in roles, as cdcserver grants them: the actions of each role and the
resources they apply to. A leaf module (no cdcserver import): the config checks role names with
it, `cdcserver/auth.py` authorizes commands with it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Resources: ("cluster",), ("any",) = every normal database, ("db", D), ("ns", D, C).
Resource = tuple[str, ...]

# mongod's src/mongo/db/auth/builtin_roles.yml, action for action.
READ = frozenset(
    {"changeStream", "collStats", "dbHash", "dbStats", "find", "killCursors", "listCollections",
     "listIndexes", "listSearchIndexes", "planCacheRead"}
)
READ_WRITE = READ | {
    "cleanupStructuredEncryptionData", "compactStructuredEncryptionData", "convertToCapped",
    "createCollection", "createIndex", "createSearchIndexes", "dropCollection", "dropIndex",
    "dropSearchIndex", "insert", "remove", "renameCollectionSameDB", "update",
    "updateSearchIndex",
}
# No killCursors (read's): a dbAdmin kills only its own cursors, as every user may.
DB_ADMIN = frozenset(
    {"analyze", "bypassDocumentValidation", "collMod", "collStats", "compact",
     "convertToCapped", "createCollection", "dbStats", "dropCollection", "dropDatabase",
     "dropIndex", "dropSearchIndex", "createIndex", "createSearchIndexes", "enableProfiler",
     "listCollections", "listIndexes", "listSearchIndexes", "updateSearchIndex",
     "planCacheIndexFilter", "planCacheRead", "planCacheWrite", "reIndex",
     "renameCollectionSameDB", "storageDetails", "validate", "configureQueryAnalyzer"}
)
USER_ADMIN = frozenset(
    {"changeCustomData", "changePassword", "createUser", "createRole", "dropUser", "dropRole",
     "grantRole", "revokeRole", "setAuthenticationRestriction", "viewUser", "viewRole"}
)
CLUSTER_MONITOR = frozenset(
    {"connPoolStats", "getCmdLineOpts", "getDefaultRWConcern", "getLog", "getParameter",
     "getShardMap", "hostInfo", "listDatabases", "listSampledQueries", "listSessions",
     "listShards", "netstat", "operationMetrics", "replSetGetConfig", "replSetGetStatus",
     "serverStatus", "top", "useUUID", "inprog", "shardingState", "allCollectionStats",
     "shardedDataDistribution"}
)
CLUSTER_MONITOR_DB = frozenset(
    {"collStats", "dbStats", "getDatabaseVersion", "getShardVersion", "indexStats"}
)
# builtin_roles.yml: killing others' cursors, sessions and operations is hostManager's
# (clusterAdmin has it through hostManager), not clusterManager's.
HOST_MANAGER = frozenset(
    {"applicationMessage", "auditConfigure", "connPoolSync", "dropConnections", "logRotate",
     "oidReset", "setParameter", "shutdown", "touch", "unlock", "flushRouterConfig", "fsync",
     "invalidateUserCache", "killAnyCursor", "killAnySession", "killop", "replSetResizeOplog",
     "resync", "trafficRecord", "rotateCertificates", "oidcListKeys", "oidcRefreshKeys"}
)
CLUSTER_MANAGER = frozenset(
    {"appendOplogNote", "applicationMessage", "replSetConfigure", "replSetGetConfig",
     "replSetGetStatus", "replSetStateChange", "resync", "addShard", "removeShard",
     "listSessions", "listShards", "flushRouterConfig", "cleanupOrphaned",
     "getDefaultRWConcern", "runTenantMigration", "setDefaultRWConcern",
     "setFeatureCompatibilityVersion", "setClusterParameter", "getClusterParameter",
     "setChangeStreamState", "getChangeStreamState", "querySettings", "queryStatsRead",
     "queryStatsReadTransformed", "checkMetadataConsistency",
     "transitionFromDedicatedConfigServer", "transitionToDedicatedConfigServer"}
)
CLUSTER_MANAGER_DB = frozenset(
    {"analyzeShardKey", "configureQueryAnalyzer", "clearJumboFlag", "splitChunk", "moveChunk",
     "moveCollection", "enableSharding", "splitVector", "refineCollectionShardKey",
     "reshardCollection"}
)
# <db>.system.profile: dbAdmin may read and recreate it, clusterMonitor read it (everywhere).
PROFILE = "system.profile"
DB_ADMIN_PROFILE = READ | {"convertToCapped", "createCollection", "dropCollection"}
# <db>.system.js: read and readWrite grant their actions on it too (an exact namespace).
SYSTEM_JS = "system.js"


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
    if role in ("read", "readWrite", "dbAdmin", "userAdmin", "dbOwner"):
        return _db_role(role, db)
    if role not in _ADMIN_ROLES:
        raise ValueError(f"unknown role {role!r}")
    if db != "admin":
        raise ValueError(f"role {role}@{db} does not exist (only on admin)")
    if role == "readAnyDatabase":
        return [Grant("any", "", READ), Grant("cluster", "", frozenset({"listDatabases"})),
                Grant("collection", "", READ, SYSTEM_JS)]
    if role == "readWriteAnyDatabase":
        return [*role_grants("readAnyDatabase", db), Grant("any", "", READ_WRITE),
                Grant("collection", "", READ_WRITE, SYSTEM_JS)]
    if role == "userAdminAnyDatabase":
        return [Grant("any", "", USER_ADMIN | {"listCachedAndActiveUsers"}),
                Grant("db", "local", USER_ADMIN), Grant("db", "config", USER_ADMIN),
                Grant("cluster", "", frozenset({"listDatabases", "authSchemaUpgrade",
                                                "invalidateUserCache", "viewUser"}))]
    if role == "dbAdminAnyDatabase":
        return [Grant("cluster", "", frozenset({"listDatabases", "applyOps"})),
                Grant("any", "", DB_ADMIN), Grant("collection", "", DB_ADMIN_PROFILE, PROFILE)]
    if role == "clusterMonitor":
        return _cluster_monitor()
    if role == "clusterManager":
        return _cluster_manager()
    if role == "hostManager":
        return [Grant("cluster", "", HOST_MANAGER), Grant("any", "", frozenset({"killCursors"}))]
    if role == "clusterAdmin":
        return [*_cluster_monitor(), *_cluster_manager(), *role_grants("hostManager", db),
                Grant("any", "", frozenset({"dropDatabase"}))]
    if role == "root":
        return [Grant("anyResource", "", frozenset())]
    raise ValueError(f"unknown role {role!r}")


def _db_role(role: str, db: str) -> list[Grant]:
    if role == "dbOwner":  # readWrite, dbAdmin and userAdmin
        return [*_db_role("readWrite", db), *_db_role("dbAdmin", db), *_db_role("userAdmin", db)]
    if role in ("read", "readWrite"):
        actions = READ if role == "read" else READ_WRITE
        return [Grant("db", db, actions), Grant("exact", db, actions, SYSTEM_JS)]
    if role == "dbAdmin":
        return [Grant("db", db, DB_ADMIN), Grant("exact", db, DB_ADMIN_PROFILE, PROFILE)]
    return [Grant("db", db, USER_ADMIN)]


def _cluster_monitor() -> list[Grant]:
    """clusterMonitor: read on config and local, its cluster actions, its statistics actions
    on every database, and find on the replica set's own collections and on system.profile."""
    replset = frozenset({"find"})
    return [*_db_role("read", "config"), *_db_role("read", "local"),
            Grant("cluster", "", CLUSTER_MONITOR), Grant("any", "", CLUSTER_MONITOR_DB),
            Grant("db", "config", CLUSTER_MONITOR_DB), Grant("db", "local", CLUSTER_MONITOR_DB),
            Grant("exact", "config", CLUSTER_MONITOR_DB, "system.sessions"),
            Grant("exact", "local", replset, "system.replset"),
            Grant("exact", "local", replset, "replset.election"),
            Grant("exact", "local", replset, "replset.minvalid"),
            Grant("collection", "", replset, PROFILE)]


def _cluster_manager() -> list[Grant]:
    """clusterManager: read on config, its cluster actions, the sharding actions on every
    database, writes to config and local, and read on local.system.replset."""
    writes = frozenset({"insert", "update", "remove"})
    return [*_db_role("read", "config"), Grant("cluster", "", CLUSTER_MANAGER),
            Grant("any", "", CLUSTER_MANAGER_DB), Grant("db", "config", CLUSTER_MANAGER_DB),
            Grant("db", "local", CLUSTER_MANAGER_DB), Grant("db", "config", writes),
            Grant("db", "local", writes), Grant("exact", "local", READ, "system.replset"),
            Grant("exact", "local", READ, "system.healthlog"),
            Grant("exact", "local", writes, "replset.election"),
            Grant("exact", "local", writes, "replset.minvalid")]


def parse_role(text: str) -> tuple[str, str]:
    """`read@shop` -> ("read", "shop"); a bare role is on admin (as MongoDB's role docs)."""
    role, _, db = text.partition("@")
    if not role:
        raise ValueError(f"bad role {text!r}: ROLE[@DB]")
    db = db or "admin"
    role_grants(role, db)  # refuses unknown roles, and cluster roles off admin
    return role, db
