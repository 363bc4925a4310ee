"""Resources, actions and privilege sets: MongoDB's authorization model as data.

A privilege is a resource pattern and a set of actions. Patterns are mongod's
``ResourcePattern`` kinds (``{db, collection}`` with empty strings as wildcards,
``{cluster: true}``, ``{anyResource: true}``). Whether a set of privileges allows an action
on a target follows mongod's ``ResourcePatternSearchList``: a collection is matched by its
exact namespace, by ``{db: "", collection: NAME}`` and by ``anyResource``; a *normal*
collection (not ``system.*``) also by its database's pattern and, outside ``local`` and
``config``, by ``{db: "", collection: ""}`` (any normal resource). System collections
therefore need privileges that name them, as in mongod.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from accord.platform.embedded.errors import Code, EngineError

Doc = dict[str, Any]

# Databases "any normal resource" does not reach (mongod's internal databases; admin is
# reached, as the documentation of readAnyDatabase and userAdminAnyDatabase says).
INTERNAL_DBS = frozenset({"local", "config"})


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource pattern. ``kind`` is ``exact`` (db and coll), ``database`` (db),
    ``collection`` (coll in any database), ``any_normal``, ``cluster`` or ``any``."""

    kind: str
    db: str = ""
    coll: str = ""

    @staticmethod
    def exact(ns: str) -> Resource:
        db, _, coll = ns.partition(".")
        return Resource("exact", db, coll)

    @staticmethod
    def database(db: str) -> Resource:
        return Resource("database", db)

    def to_doc(self) -> Doc:
        """The pattern as ``rolesInfo`` and ``usersInfo`` print it."""
        if self.kind == "cluster":
            return {"cluster": True}
        if self.kind == "any":
            return {"anyResource": True}
        return {"db": self.db, "collection": self.coll}

    def targets_db(self) -> str | None:
        """The one database this pattern is about (None: several, or the cluster)."""
        return self.db if self.kind in ("exact", "database") else None

    def __str__(self) -> str:
        doc = self.to_doc()
        return ", ".join(f"{k}: {v!r}" for k, v in doc.items())


CLUSTER = Resource("cluster")
ANY = Resource("any")
ANY_NORMAL = Resource("any_normal")


def is_normal_collection(coll: str) -> bool:
    return not coll.startswith("system.")


def search_list(target: Resource) -> list[Resource]:
    """Every pattern that matches ``target`` (mongod's ResourcePatternSearchList)."""
    found = [ANY]
    if target.kind == "exact":
        if is_normal_collection(target.coll):
            if target.db not in INTERNAL_DBS:
                found.append(ANY_NORMAL)
            found.append(Resource.database(target.db))
        found.append(Resource("collection", "", target.coll))
    elif target.kind == "database" and target.db not in INTERNAL_DBS:
        found.append(ANY_NORMAL)
    if target.kind != "any":
        found.append(target)
    return found


def parse_resource(doc: Any, where: str = "resource") -> Resource:
    """A privilege's ``resource`` document as a pattern; refuses what mongod refuses."""
    if not isinstance(doc, dict):
        raise EngineError(Code.FailedToParse, f"{where} must be an object, not {_type(doc)}")
    if "cluster" in doc:
        if doc.get("cluster") is not True or len(doc) != 1:
            raise EngineError(
                Code.FailedToParse, f"{where}: 'cluster' must be true and stand alone"
            )
        return CLUSTER
    if "anyResource" in doc:
        if doc.get("anyResource") is not True or len(doc) != 1:
            raise EngineError(
                Code.FailedToParse, f"{where}: 'anyResource' must be true and stand alone"
            )
        return ANY
    unknown = sorted(set(doc) - {"db", "collection"})
    if unknown:
        raise EngineError(
            Code.FailedToParse,
            f"{where}: unknown field '{unknown[0]}' (a resource is {{db, collection}}, "
            "{cluster: true} or {anyResource: true})",
        )
    if "db" not in doc or "collection" not in doc:
        raise EngineError(
            Code.FailedToParse,
            f"{where} must name both 'db' and 'collection' (an empty string matches any)",
        )
    db, coll = doc["db"], doc["collection"]
    if not isinstance(db, str) or not isinstance(coll, str):
        raise EngineError(Code.FailedToParse, f"{where}: 'db' and 'collection' must be strings")
    if db and coll:
        return Resource("exact", db, coll)
    if db:
        return Resource("database", db)
    if coll:
        return Resource("collection", "", coll)
    return ANY_NORMAL


def _type(value: Any) -> str:
    return type(value).__name__


# Every action a privilege may name (mongod's action_types.txt, the ones a user can grant).
ACTIONS = frozenset(
    [
        "addShard",
        "advanceClusterTime",
        "allCollectionStats",
        "analyze",
        "analyzeShardKey",
        "anyAction",
        "appendOplogNote",
        "applicationMessage",
        "applyOps",
        "auditConfigure",
        "authCheck",
        "authSchemaUpgrade",
        "bypassDefaultMaxTimeMS",
        "bypassDocumentValidation",
        "bypassWriteBlockingMode",
        "changeCustomData",
        "changeOwnCustomData",
        "changeOwnPassword",
        "changePassword",
        "changeStream",
        "checkFreeMonitoringStatus",
        "checkMetadataConsistency",
        "cleanupOrphaned",
        "cleanupStructuredEncryptionData",
        "clearJumboFlag",
        "closeAllDatabases",
        "collMod",
        "collStats",
        "compact",
        "compactStructuredEncryptionData",
        "configureQueryAnalyzer",
        "connPoolStats",
        "connPoolSync",
        "convertToCapped",
        "cpuProfiler",
        "createCollection",
        "createDatabase",
        "createIndex",
        "createRole",
        "createSearchIndexes",
        "createUser",
        "dbCheck",
        "dbHash",
        "dbStats",
        "dropAllRolesFromDatabase",
        "dropAllUsersFromDatabase",
        "dropCollection",
        "dropConnections",
        "dropDatabase",
        "dropIndex",
        "dropRole",
        "dropSearchIndex",
        "dropUser",
        "enableProfiler",
        "enableSharding",
        "exportCollection",
        "find",
        "flushRouterConfig",
        "forceUUID",
        "fsync",
        "getClusterParameter",
        "getCmdLineOpts",
        "getDatabaseVersion",
        "getDefaultRWConcern",
        "getLog",
        "getParameter",
        "getShardMap",
        "getShardVersion",
        "grantRole",
        "hostInfo",
        "impersonate",
        "importCollection",
        "indexStats",
        "inprog",
        "insert",
        "internal",
        "invalidateUserCache",
        "issueDirectShardOperations",
        "killAnyCursor",
        "killAnySession",
        "killCursors",
        "killop",
        "listCachedAndActiveUsers",
        "listCollections",
        "listDatabases",
        "listIndexes",
        "listSampledQueries",
        "listSearchIndexes",
        "listSessions",
        "listShards",
        "logRotate",
        "moveChunk",
        "moveCollection",
        "netstat",
        "oidReset",
        "oidcListKeys",
        "oidcRefreshKeys",
        "operationMetrics",
        "planCacheIndexFilter",
        "planCacheRead",
        "planCacheWrite",
        "querySettings",
        "queryStatsRead",
        "queryStatsReadTransformed",
        "reIndex",
        "refineCollectionShardKey",
        "remove",
        "removeShard",
        "renameCollection",
        "renameCollectionSameDB",
        "replSetConfigure",
        "replSetGetConfig",
        "replSetGetStatus",
        "replSetHeartbeat",
        "replSetResizeOplog",
        "replSetStateChange",
        "reshardCollection",
        "resync",
        "revokeRole",
        "rotateCertificates",
        "runTenantMigration",
        "serverStatus",
        "setAuthenticationRestriction",
        "setChangeStreamState",
        "setClusterParameter",
        "setDefaultRWConcern",
        "setFeatureCompatibilityVersion",
        "setParameter",
        "setUserWriteBlockMode",
        "shardCollection",
        "shardedDataDistribution",
        "shardingState",
        "shutdown",
        "splitChunk",
        "splitVector",
        "storageDetails",
        "top",
        "touch",
        "trafficRecord",
        "transitionFromDedicatedConfigServer",
        "transitionToDedicatedConfigServer",
        "unlock",
        "update",
        "updateSearchIndex",
        "useTenant",
        "useUUID",
        "validate",
        "viewRole",
        "viewUser",
    ]
)


def parse_actions(value: Any, where: str = "actions") -> frozenset[str]:
    if not isinstance(value, list):
        raise EngineError(Code.FailedToParse, f"{where} must be an array of action names")
    actions = set()
    for name in value:
        if not isinstance(name, str):
            raise EngineError(Code.FailedToParse, f"{where} must be an array of strings")
        if name not in ACTIONS:
            raise EngineError(Code.FailedToParse, f"Unrecognized action privilege string: {name}")
        actions.add(name)
    return frozenset(actions)


class Privileges:
    """A set of privileges: resource pattern -> actions. Immutable once built."""

    __slots__ = ("_map",)

    def __init__(self, items: Iterable[tuple[Resource, Iterable[str]]] = ()) -> None:
        merged: dict[Resource, set[str]] = {}
        for resource, actions in items:
            merged.setdefault(resource, set()).update(actions)
        self._map: dict[Resource, frozenset[str]] = {r: frozenset(a) for r, a in merged.items()}

    def __iter__(self) -> Iterator[tuple[Resource, frozenset[str]]]:
        return iter(self._map.items())

    def __bool__(self) -> bool:
        return bool(self._map)

    def union(self, *others: Privileges) -> Privileges:
        return Privileges([*self, *(item for other in others for item in other)])

    def actions_on(self, pattern: Resource) -> frozenset[str]:
        return self._map.get(pattern, frozenset())

    def allows(self, target: Resource, actions: Iterable[str]) -> bool:
        """Whether every one of ``actions`` is allowed on ``target`` (patterns combine, as
        in mongod: find from one pattern and insert from another is enough)."""
        unmet = set(actions)
        for pattern in search_list(target):
            unmet -= self._map.get(pattern, frozenset())
            if not unmet:
                return True
        return not unmet

    def any_action_on(self, target: Resource) -> bool:
        return any(self._map.get(p) for p in search_list(target))

    def any_action_in_db(self, db: str) -> bool:
        """mongod's isAuthorizedForAnyActionOnAnyResourceInDB."""
        m = self._map
        if m.get(Resource.database(db)) or m.get(ANY):
            return True
        if db not in INTERNAL_DBS and m.get(ANY_NORMAL):
            return True
        for pattern, actions in m.items():
            if not actions:
                continue
            if pattern.kind == "collection" or (pattern.kind == "exact" and pattern.db == db):
                return True
        return False

    def to_docs(self) -> list[Doc]:
        """``[{resource, actions}]`` as ``rolesInfo`` prints privileges (actions sorted)."""
        return [
            {"resource": r.to_doc(), "actions": sorted(a)}
            for r, a in sorted(self._map.items(), key=lambda kv: _order(kv[0]))
            if a
        ]


def _order(r: Resource) -> tuple[int, str, str]:
    rank = {"cluster": 0, "any": 1, "any_normal": 2, "database": 3, "collection": 4, "exact": 5}
    return rank[r.kind], r.db, r.coll


def privileges_from_docs(docs: Any, where: str = "privileges") -> Privileges:
    """``[{resource, actions}]`` (a role document's or a command's) as a privilege set."""
    if not isinstance(docs, list):
        raise EngineError(Code.FailedToParse, f"{where} must be an array")
    items = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise EngineError(Code.FailedToParse, f"{where}.{i} must be an object")
        unknown = sorted(set(doc) - {"resource", "actions"})
        if unknown:
            raise EngineError(Code.FailedToParse, f"{where}.{i}: unknown field '{unknown[0]}'")
        if "resource" not in doc or "actions" not in doc:
            raise EngineError(
                Code.FailedToParse, f"{where}.{i} must have both 'resource' and 'actions'"
            )
        resource = parse_resource(doc["resource"], f"{where}.{i}.resource")
        items.append((resource, parse_actions(doc["actions"], f"{where}.{i}.actions")))
    return Privileges(items)
