"""The policy as database roles: one custom role per service role, with collection-level
privileges, as data (``createRole`` / ``updateRole`` documents, and the Atlas CLI's custom
database role JSON).

The role of service role ``R`` in database ``db`` is ``accord_R`` (in ``db`` itself: roles
of a database other than ``admin`` may only hold privileges on their own database). Its
privileges are, per class the policy grants ``R`` something on, the policy's actions on the
class's collection (``find``, ``insert``, ``update``, ``remove`` are MongoDB's own action
names), plus what setting up accord's collections needs on the collections it may write
(``createCollection``, ``createIndex``, ``listIndexes``, ``collMod`` for validators) and
``listCollections`` on the database (the catalog's checks). Business collections get
privileges only when the policy names them (``[classes."business:orders"]``): a role over
every collection of the database would reach checkpoints and audit records too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord.governance.audit_cuts import CUTS
from accord.governance.audit_records import HEADS
from accord.governance.digests import DIGEST_HEADS
from accord.governance.policy import BUSINESS, Policy

__all__ = ["RoleSpec", "atlas_role", "role_name", "role_specs"]

_SETUP = ("createCollection", "createIndex", "listIndexes", "collMod")
_ATLAS = {
    "find": "FIND", "insert": "INSERT", "update": "UPDATE", "remove": "REMOVE",
    "createCollection": "CREATE_COLLECTION", "createIndex": "CREATE_INDEX",
    "listIndexes": "LIST_INDEXES", "collMod": "COLL_MOD", "listCollections": "LIST_COLLECTIONS",
}  # fmt: skip


@dataclass(frozen=True)
class RoleSpec:
    """One custom role: its name, database and privileges (mongod's shape)."""

    name: str
    db: str
    privileges: tuple[Mapping[str, Any], ...]

    def command(self, exists: bool) -> dict[str, Any]:
        """The ``createRole`` (or, when ``exists``, ``updateRole``) command."""
        verb = "updateRole" if exists else "createRole"
        body: dict[str, Any] = {verb: self.name, "privileges": [dict(p) for p in self.privileges]}
        body["roles"] = []
        return body


#: Collections a class keeps beside its own, granted as the class is: a digest's heads
#: and the audit trail's cuts (``audit_digest``), which a verifier reads with the digests.
_COMPANIONS: dict[str, tuple[str, ...]] = {
    "audit": (HEADS,),  # the streams' heads, read by verify with the records
    "audit_digest": (DIGEST_HEADS, CUTS),
}


def role_name(role: str) -> str:
    """The database role of service role ``role`` (``accord_memory-api``)."""
    return f"accord_{role}"


def role_specs(policy: Policy, db: str) -> list[RoleSpec]:
    """Every role of ``policy`` (service and custom), as database roles of ``db``."""
    specs = []
    for role in policy.roles():
        privileges: list[dict[str, Any]] = []
        for name, cls in policy.classes.items():
            actions = cls.roles.get(role, frozenset())
            if not actions or cls.collection is None or name == BUSINESS:
                continue
            granted: list[str] = [a for a in ("find", "insert", "update", "remove") if a in actions]
            if {"insert", "update"} & actions:
                granted += list(_SETUP)
            for collection in (cls.collection, *_COMPANIONS.get(name, ())):
                privileges.append(
                    {"resource": {"db": db, "collection": collection}, "actions": granted}
                )
        if privileges:
            privileges.append(
                {"resource": {"db": db, "collection": ""}, "actions": ["listCollections"]}
            )
        specs.append(RoleSpec(role_name(role), db, tuple(privileges)))
    return specs


def atlas_role(spec: RoleSpec) -> dict[str, Any]:
    """``spec`` as an Atlas custom database role (``atlas customDbRoles create --file``,
    the Admin API's ``customDBRoles`` body): Atlas manages roles through its API, not with
    ``createRole``."""
    actions: dict[str, list[dict[str, str]]] = {}
    for privilege in spec.privileges:
        resource = privilege["resource"]
        for action in privilege["actions"]:
            actions.setdefault(_ATLAS[action], []).append(
                {"db": resource["db"], "collection": resource["collection"]}
            )
    return {
        "roleName": spec.name,
        "actions": [{"action": a, "resources": r} for a, r in sorted(actions.items())],
        "inheritedRoles": [],
    }


def privileges_of(
    roles_info: Sequence[Mapping[str, Any]], name: str
) -> list[dict[str, Any]] | None:
    """The privileges of role ``name`` in a ``rolesInfo`` reply's roles (None: no such role),
    normalised for comparison (actions sorted)."""
    for found in roles_info:
        if found.get("role") == name:
            return normalised(found.get("privileges") or [])
    return None


def normalised(privileges: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Privileges in a canonical order, for comparing what is with what should be."""
    out = [{"resource": dict(p["resource"]), "actions": sorted(p["actions"])} for p in privileges]
    return sorted(out, key=lambda p: (sorted(p["resource"].items()), p["actions"]))
