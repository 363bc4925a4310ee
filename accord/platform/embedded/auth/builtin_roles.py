"""MongoDB's built-in roles (mongod's builtin_roles.yml), as the engine grants them.

Database roles (``read``, ``readWrite``, ``dbAdmin``, ``userAdmin``, ``dbOwner``) exist in
every database and act on it; the cluster-wide ones (``readAnyDatabase``, ``root`` ...)
exist only in ``admin``. The privileges are mongod's; actions for features the engine
does not have (sharding, encryption, search index management ...) are kept anyway so that
``rolesInfo`` prints what a real server prints and a custom role that names them is valid.
"""

from __future__ import annotations

from accord.platform.embedded.auth.privileges import (
    ANY,
    ANY_NORMAL,
    CLUSTER,
    Privileges,
    Resource,
)

_READ = frozenset(
    [
        "changeStream",
        "collStats",
        "dbHash",
        "dbStats",
        "find",
        "killCursors",
        "listCollections",
        "listIndexes",
        "listSearchIndexes",
        "planCacheRead",
    ]
)
_READ_WRITE = _READ | frozenset(
    [
        "cleanupStructuredEncryptionData",
        "compactStructuredEncryptionData",
        "convertToCapped",
        "createCollection",
        "createIndex",
        "createSearchIndexes",
        "dropCollection",
        "dropIndex",
        "dropSearchIndex",
        "insert",
        "remove",
        "renameCollectionSameDB",
        "update",
        "updateSearchIndex",
    ]
)
_USER_ADMIN = frozenset(
    [
        "changeCustomData",
        "changePassword",
        "createUser",
        "createRole",
        "dropUser",
        "dropRole",
        "grantRole",
        "revokeRole",
        "setAuthenticationRestriction",
        "viewUser",
        "viewRole",
    ]
)
_DB_ADMIN = frozenset(
    [
        "analyze",
        "bypassDocumentValidation",
        "collMod",
        "collStats",
        "compact",
        "convertToCapped",
        "createCollection",
        "dbStats",
        "dropCollection",
        "dropDatabase",
        "dropIndex",
        "dropSearchIndex",
        "createIndex",
        "createSearchIndexes",
        "enableProfiler",
        "listCollections",
        "listIndexes",
        "listSearchIndexes",
        "updateSearchIndex",
        "planCacheIndexFilter",
        "planCacheRead",
        "planCacheWrite",
        "reIndex",
        "renameCollectionSameDB",
        "storageDetails",
        "validate",
        "configureQueryAnalyzer",
    ]
)
_PROFILE = _READ | frozenset({"convertToCapped", "createCollection", "dropCollection"})
_READ_AND_INDEX = _READ | frozenset(
    {"createIndex", "createSearchIndexes", "dropIndex", "dropSearchIndex"}
)
_RESTORE_WRITE = frozenset(
    [
        "bypassDocumentValidation",
        "collMod",
        "convertToCapped",
        "createCollection",
        "createIndex",
        "createSearchIndexes",
        "dropCollection",
        "insert",
        "updateSearchIndex",
    ]
)


def _db_role(name: str, db: str) -> Privileges:
    d = Resource.database(db)
    js = Resource("exact", db, "system.js")
    if name == "read":
        return Privileges([(d, _READ), (js, _READ)])
    if name == "readWrite":
        return Privileges([(d, _READ_WRITE), (js, _READ_WRITE)])
    if name == "userAdmin":
        return Privileges([(d, _USER_ADMIN)])
    if name == "dbAdmin":
        return Privileges([(d, _DB_ADMIN), (Resource("exact", db, "system.profile"), _PROFILE)])
    raise KeyError(name)


def _exact(db: str, coll: str) -> Resource:
    return Resource("exact", db, coll)


def _any_coll(coll: str) -> Resource:
    return Resource("collection", "", coll)


_CLUSTER_MONITOR_CLUSTER = frozenset(
    [
        "connPoolStats",
        "getCmdLineOpts",
        "getDefaultRWConcern",
        "getLog",
        "getParameter",
        "getShardMap",
        "hostInfo",
        "listDatabases",
        "listSampledQueries",
        "listSessions",
        "listShards",
        "netstat",
        "operationMetrics",
        "replSetGetConfig",
        "replSetGetStatus",
        "serverStatus",
        "top",
        "useUUID",
        "inprog",
        "shardingState",
        "allCollectionStats",
        "shardedDataDistribution",
    ]
)
_CLUSTER_MONITOR_DB = frozenset(
    ["collStats", "dbStats", "getDatabaseVersion", "getShardVersion", "indexStats"]
)
_HOST_MANAGER_CLUSTER = frozenset(
    [
        "applicationMessage",
        "auditConfigure",
        "connPoolSync",
        "dropConnections",
        "logRotate",
        "oidReset",
        "setParameter",
        "shutdown",
        "touch",
        "unlock",
        "flushRouterConfig",
        "fsync",
        "invalidateUserCache",
        "killAnyCursor",
        "killAnySession",
        "killop",
        "replSetResizeOplog",
        "resync",
        "trafficRecord",
        "rotateCertificates",
        "oidcListKeys",
        "oidcRefreshKeys",
    ]
)
_CLUSTER_MANAGER_CLUSTER = frozenset(
    [
        "appendOplogNote",
        "applicationMessage",
        "replSetConfigure",
        "replSetGetConfig",
        "replSetGetStatus",
        "replSetStateChange",
        "resync",
        "addShard",
        "removeShard",
        "listSessions",
        "listShards",
        "flushRouterConfig",
        "cleanupOrphaned",
        "getDefaultRWConcern",
        "runTenantMigration",
        "setDefaultRWConcern",
        "setFeatureCompatibilityVersion",
        "setClusterParameter",
        "getClusterParameter",
        "setChangeStreamState",
        "getChangeStreamState",
        "querySettings",
        "queryStatsRead",
        "queryStatsReadTransformed",
        "checkMetadataConsistency",
        "transitionFromDedicatedConfigServer",
        "transitionToDedicatedConfigServer",
    ]
)
_CLUSTER_MANAGER_DB = frozenset(
    [
        "analyzeShardKey",
        "configureQueryAnalyzer",
        "clearJumboFlag",
        "splitChunk",
        "moveChunk",
        "moveCollection",
        "enableSharding",
        "splitVector",
        "refineCollectionShardKey",
        "reshardCollection",
    ]
)
_WRITE = frozenset({"insert", "update", "remove"})

# Admin-only roles: (privileges, inherited roles of admin).
_ADMIN_ROLES: dict[str, tuple[Privileges, tuple[tuple[str, str], ...]]] = {
    "readAnyDatabase": (
        Privileges(
            [(ANY_NORMAL, _READ), (CLUSTER, {"listDatabases"}), (_any_coll("system.js"), _READ)]
        ),
        (),
    ),
    "readWriteAnyDatabase": (
        Privileges([(ANY_NORMAL, _READ_WRITE), (_any_coll("system.js"), _READ_WRITE)]),
        (("readAnyDatabase", "admin"),),
    ),
    "userAdminAnyDatabase": (
        Privileges(
            [
                (ANY_NORMAL, _USER_ADMIN | {"listCachedAndActiveUsers"}),
                (Resource.database("local"), _USER_ADMIN),
                (Resource.database("config"), _USER_ADMIN),
                (
                    CLUSTER,
                    {"listDatabases", "authSchemaUpgrade", "invalidateUserCache", "viewUser"},
                ),
                (_exact("admin", "system.users"), _READ_AND_INDEX),
                (_exact("admin", "system.roles"), _READ_AND_INDEX),
                (_any_coll("system.users"), _READ),
                (_exact("admin", "system.version"), _READ),
                (_exact("admin", "system.backup_users"), _READ),
            ]
        ),
        (),
    ),
    "dbAdminAnyDatabase": (
        Privileges(
            [
                (CLUSTER, {"listDatabases", "applyOps"}),
                (ANY_NORMAL, _DB_ADMIN),
                (_any_coll("system.profile"), _PROFILE),
            ]
        ),
        (),
    ),
    "clusterMonitor": (
        Privileges(
            [
                (CLUSTER, _CLUSTER_MONITOR_CLUSTER),
                (ANY_NORMAL, _CLUSTER_MONITOR_DB),
                (Resource.database("config"), _CLUSTER_MONITOR_DB),
                (Resource.database("local"), _CLUSTER_MONITOR_DB),
                (_any_coll("system.profile"), {"find"}),
            ]
        ),
        (("read", "config"), ("read", "local")),
    ),
    "hostManager": (
        Privileges([(CLUSTER, _HOST_MANAGER_CLUSTER), (ANY_NORMAL, {"killCursors"})]),
        (),
    ),
    "clusterManager": (
        Privileges(
            [
                (CLUSTER, _CLUSTER_MANAGER_CLUSTER),
                (ANY_NORMAL, _CLUSTER_MANAGER_DB),
                (Resource.database("config"), _CLUSTER_MANAGER_DB | _WRITE),
                (Resource.database("local"), _CLUSTER_MANAGER_DB | _WRITE),
                (ANY, {"dbCheck"}),
            ]
        ),
        (("read", "config"),),
    ),
    "clusterAdmin": (
        Privileges(
            [(ANY_NORMAL, {"dropDatabase"}), (ANY, {"importCollection", "exportCollection"})]
        ),
        (("clusterMonitor", "admin"), ("hostManager", "admin"), ("clusterManager", "admin")),
    ),
    "backup": (
        Privileges(
            [
                (ANY, {"collStats", "listCollections", "listIndexes", "listSearchIndexes"}),
                (ANY_NORMAL, {"find"}),
                (
                    CLUSTER,
                    {
                        "getParameter",
                        "listDatabases",
                        "useUUID",
                        "appendOplogNote",
                        "serverStatus",
                        "setUserWriteBlockMode",
                    },
                ),
                (Resource.database("config"), {"find"}),
                (Resource.database("local"), {"find"}),
                (_any_coll("system.js"), {"find"}),
                (_any_coll("system.users"), {"find"}),
                (_any_coll("system.profile"), {"find"}),
                (_exact("admin", "system.roles"), {"find"}),
                (_exact("admin", "system.version"), {"find"}),
            ]
        ),
        (),
    ),
    "restore": (
        Privileges(
            [
                (
                    CLUSTER,
                    {
                        "getParameter",
                        "forceUUID",
                        "useUUID",
                        "bypassWriteBlockingMode",
                        "setUserWriteBlockMode",
                        "applyOps",
                    },
                ),
                (Resource.database("local"), _RESTORE_WRITE),
                (Resource.database("config"), _RESTORE_WRITE),
                (ANY, {"listCollections"}),
                (ANY_NORMAL, _RESTORE_WRITE | _USER_ADMIN),
                (_any_coll("system.js"), _RESTORE_WRITE),
                (_exact("admin", "system.version"), _RESTORE_WRITE | {"find"}),
                (_any_coll("system.users"), _RESTORE_WRITE | {"find", "update", "remove"}),
                (_exact("admin", "system.roles"), {"createIndex"}),
            ]
        ),
        (),
    ),
    "root": (
        Privileges([(ANY, {"validate"}), (CLUSTER, {"useTenant"})]),
        (
            ("clusterAdmin", "admin"),
            ("userAdminAnyDatabase", "admin"),
            ("dbAdminAnyDatabase", "admin"),
            ("readWriteAnyDatabase", "admin"),
            ("backup", "admin"),
            ("restore", "admin"),
        ),
    ),
}

DB_ROLES = ("read", "readWrite", "dbAdmin", "userAdmin", "dbOwner")
_DB_OWNER_PARTS = ("readWrite", "dbAdmin", "userAdmin")


def is_builtin(role: str, db: str) -> bool:
    """Whether ``role@db`` names a built-in role."""
    return role in DB_ROLES or (db == "admin" and role in _ADMIN_ROLES)


def reserved_name(role: str) -> bool:
    """A custom role may not take a built-in role's name, in any database."""
    return role in DB_ROLES or role in _ADMIN_ROLES or role == "__system"


def builtin_privileges(role: str, db: str) -> Privileges:
    """The privileges ``role@db`` grants by itself (not through the roles it inherits)."""
    if role == "dbOwner":
        return Privileges()
    if role in DB_ROLES:
        return _db_role(role, db)
    return _ADMIN_ROLES[role][0]


def builtin_subroles(role: str, db: str) -> tuple[tuple[str, str], ...]:
    """The roles ``role@db`` inherits directly."""
    if role == "dbOwner":
        return tuple((r, db) for r in _DB_OWNER_PARTS)
    if role in DB_ROLES:
        return ()
    return _ADMIN_ROLES[role][1]


def builtin_names(db: str) -> list[str]:
    """The built-in roles of ``db`` (``rolesInfo`` with ``showBuiltinRoles``)."""
    return sorted([*DB_ROLES, *(_ADMIN_ROLES if db == "admin" else ())])
