"""``$jsonSchema`` validators per artifact class, applied by ``accord governance apply``.

What every document of a tenanted class must be, whoever writes it (a part of accord or a
client connecting directly): ``tenant_id`` a string, ``thread_id`` a string in a
thread's classes, and the retention fields dates when present (``expire_at``, which the
TTL index reads: a string there would never expire; ``held_expire_at``). The shape of
each class's own fields stays its part's (the outbox and the audit trail set their own,
complete validators; they are left alone here).

``validationLevel: moderate``: inserts, and updates of documents that already pass, are
checked; documents written before the validator are not refused when updated.
"""

from __future__ import annotations

from typing import Any

from accord.governance.policy import BUSINESS, UNTENANTED, Policy
from accord.governance.retention import EXPIRE_AT, HELD_EXPIRE_AT
from accord.platform.artifacts import CLASSES

__all__ = ["LEVEL", "validator_commands", "validator_of"]

#: Classes whose parts set complete validators of their own.
OWN_VALIDATORS = frozenset({"outbox", "audit", "audit_digest"})
LEVEL = "moderate"


def validator_of(artifact: str) -> dict[str, Any]:
    """The validator of class ``artifact`` (module docstring)."""
    thread_scoped = artifact in CLASSES and CLASSES[artifact].thread_scoped
    required = ["tenant_id", "thread_id"] if thread_scoped else ["tenant_id"]
    properties: dict[str, Any] = {
        "tenant_id": {"bsonType": "string"},
        EXPIRE_AT: {"bsonType": "date"},
        HELD_EXPIRE_AT: {"bsonType": "date"},
    }
    if thread_scoped:
        properties["thread_id"] = {"bsonType": "string"}
    return {"$jsonSchema": {"bsonType": "object", "required": required,
                            "properties": properties}}  # fmt: skip


def _targets(policy: Policy) -> dict[str, str]:
    """collection -> class of every collection that gets a validator."""
    out: dict[str, str] = {}
    for name, cls in policy.classes.items():
        base, _, named = name.partition(":")
        if base in OWN_VALIDATORS or base in UNTENANTED:
            continue
        collection = named if base == BUSINESS else cls.collection
        if collection:
            out[collection] = base
    return out


def validator_commands(client: Any, db: str, policy: Policy) -> list[tuple[str, dict[str, Any]]]:
    """(collection, ``create`` or ``collMod`` command) for each collection of ``db``
    whose validator is not yet the one its class needs."""
    existing = {info["name"]: info.get("options") or {} for info in client[db].list_collections()}
    out = []
    for collection, artifact in sorted(_targets(policy).items()):
        want = validator_of(artifact)
        options = existing.get(collection)
        if (
            options is not None
            and options.get("validator") == want
            and (options.get("validationLevel") == LEVEL)
        ):
            continue
        verb = "collMod" if options is not None else "create"
        out.append((collection, {verb: collection, "validator": want, "validationLevel": LEVEL}))
    return out
