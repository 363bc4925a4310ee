"""``accord governance plan`` and ``apply``: what the policy changes in a database, and
making it so, idempotently.

What is applied today:

* **roles**: one custom role per service role (``accord_runtime``, ``accord_memory-api``,
  ...; :mod:`accord.governance.roles`) with collection-level privileges, created with
  ``createRole`` or brought up to date with ``updateRole``, so the database itself refuses
  what the policy forbids once clients connect with users holding them (the embedded
  engine started with ``--auth``, a self-managed replica set, Atlas Local). For Atlas,
  where roles are managed through its API, :func:`atlas_files` writes the same roles as
  the Atlas CLI's JSON;
* **service users** (optional): ``accord-ROLE`` holding ``accord_ROLE``, created with the
  password given (or granted the role when they exist);
* **the applied policy**, stored and versioned in ``accord_policies`` (the ``policy``
  class): version N's text, its hash, who applied it and when; a head document names the
  current version. Applying the same policy again stores nothing. Running processes pick
  the new version up within seconds (:mod:`accord.governance.stored`).

* **retention**: a TTL index on ``expire_at`` for each collection the policy stamps
  (:mod:`accord.governance.retention`), and, when the stored policy changes, ``expire_at``
  recomputed on what was written before (:mod:`accord.governance.recompute`).

* **validators**: a ``$jsonSchema`` validator per tenanted class
  (:mod:`accord.governance.validators`; the outbox and audit trail keep their own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo.errors import OperationFailure, PyMongoError

from accord.errors import AccordError, ConfigurationError, DatabaseError, InvalidInputError
from accord.governance.loading import parse_policy
from accord.governance.policy import Policy, to_toml
from accord.governance.recompute import (
    BATCH,
    PENDING,
    check_allowed,
    recompute,
    ttl_index_commands,
)
from accord.governance.roles import RoleSpec, atlas_role, normalised, privileges_of, role_specs
from accord.governance.validators import validator_commands
from accord.platform.artifacts import HOLD, POLICY
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Expect, Group, Op, Plan, insert_once
from accord.platform.synchronous.catalog import Catalog

__all__ = ["Change", "GovernancePlan", "apply", "atlas_files", "plan", "user_name"]

POLICIES = POLICY.default_collection or "accord_policies"
HOLDS = HOLD.default_collection or "accord_holds"
COMPONENT = "governance"
HEAD = "head"


def user_name(role: str) -> str:
    """The service user of role ``role`` (``accord-memory-api``)."""
    return f"accord-{role}"


@dataclass(frozen=True)
class Change:
    """One change ``apply`` makes: ``kind`` (``create role``, ``update role``,
    ``create user``, ``grant role``, ``store policy``), its target and what it does."""

    kind: str
    target: str
    detail: str
    command: Mapping[str, Any] | None = None


@dataclass
class GovernancePlan:
    """What applying ``policy`` to database ``db`` changes (empty: nothing)."""

    policy: Policy
    db: str
    changes: list[Change] = field(default_factory=list)
    version: int = 0  # the version the stored policy would get (0: stored already)
    resume: int = 0  # a stored version whose expire_at recompute was interrupted (0: none)
    text: str = ""
    digest: str = ""

    def __bool__(self) -> bool:
        return bool(self.changes)


def digest_of(policy: Policy) -> tuple[str, str]:
    """The policy's canonical text (:func:`~accord.governance.policy.to_toml`, without the
    source line) and its SHA-256: two files saying the same thing are one version."""
    text = to_toml(policy)
    canonical = text.split("\n", 1)[1]
    return text, hashlib.sha256(canonical.encode()).hexdigest()


def plan(
    uow: Any, db: str, policy: Policy, *, users: Mapping[str, str] | None = None
) -> GovernancePlan:
    """What :func:`apply` would change in ``db`` (``uow``: a kernel acting as whoever
    applies, the CLI's operating-system user). ``users``: role -> password of the service
    users to have (none: users are left alone)."""
    client = uow.client
    out = GovernancePlan(policy, db)
    try:
        existing = client[db].command({"rolesInfo": 1, "showPrivileges": True})["roles"]
        specs = role_specs(policy, db)
        for spec in specs:
            have = privileges_of(existing, spec.name)
            if have is None:
                out.changes.append(Change("create role", f"{db}.{spec.name}", _summary(spec),
                                          spec.command(exists=False)))  # fmt: skip
            elif have != normalised(spec.privileges):
                out.changes.append(Change("update role", f"{db}.{spec.name}", _summary(spec),
                                          spec.command(exists=True)))  # fmt: skip
        for role, password in (users or {}).items():
            if role not in policy.roles():
                raise ConfigurationError(
                    f"no role {role!r} in the policy for a service user; the roles are "
                    f"{', '.join(policy.roles())}"
                )
            name, granted = user_name(role), [{"role": f"accord_{role}", "db": db}]
            found = client[db].command({"usersInfo": name})["users"]
            if not found:
                out.changes.append(Change(
                    "create user", f"{db}.{name}", f"holding accord_{role}",
                    {"createUser": name, "pwd": password, "roles": granted},
                ))  # fmt: skip
            elif not any(r.get("role") == f"accord_{role}" for r in found[0].get("roles", [])):
                out.changes.append(Change(
                    "grant role", f"{db}.{name}", f"accord_{role}",
                    {"grantRolesToUser": name, "roles": granted},
                ))  # fmt: skip
    except OperationFailure as exc:
        raise DatabaseError(
            f"reading the roles and users of {db} failed ({exc.code}: "
            f"{exc.details.get('errmsg') if exc.details else exc}); the user applying a "
            f"policy needs userAdmin on {db} (or root)"
        ) from None
    except PyMongoError as exc:
        raise DatabaseError(f"reading the roles and users of {db} failed: {exc}") from None
    try:
        for collection, command in validator_commands(client, db, policy):
            out.changes.append(Change("set validator", f"{db}.{collection}",
                                      "$jsonSchema: tenant_id, thread_id, expiry dates",
                                      command))  # fmt: skip
        for collection, command in ttl_index_commands(client, db, policy):
            out.changes.append(Change("create index", f"{db}.{collection}",
                                      "TTL on expire_at (expireAfterSeconds 0)", command))  # fmt: skip
    except PyMongoError as exc:
        raise DatabaseError(f"reading the indexes of {db} failed: {exc}") from None
    out.text, out.digest = digest_of(policy)
    head = _head(uow, db)
    current = _version_doc(uow, db, int(head["version"])) if head else None
    if current is not None and current.get("retention") == PENDING:
        out.resume = int(current["version"])
        out.changes.append(Change(
            "recompute expiry", f"{db}.{POLICIES}",
            f"finish version {out.resume}'s expire_at recompute (interrupted)",
        ))  # fmt: skip
    if head is None or head.get("sha256") != out.digest:
        out.version = int(head["version"]) + 1 if head else 1
        out.changes.append(Change(
            "store policy", f"{db}.{POLICIES}",
            f"version {out.version} (sha256 {out.digest[:12]}, from {policy.source})",
        ))  # fmt: skip
    return out


def apply(
    uow: Any,
    changes: GovernancePlan,
    progress: Callable[[str, int], None] | None = None,
    *,
    batch: int = BATCH,
) -> list[Change]:
    """Make ``changes`` (a :func:`plan`); returns what was done. Idempotent: a plan made
    again afterwards is empty. When the stored policy changes, ``expire_at`` of the
    documents written under the previous one is recomputed (``batch`` documents per
    transaction; ``progress(collection, n)`` after each), resumably: the stored version
    is marked ``retention = "pending"`` until it is finished, and an apply run again after
    a crash finishes it first (from where it stopped)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
        raise InvalidInputError(f"apply batch must be a whole number 1 to 100000, got {batch!r}")
    # before any change: a recompute the principal may not finish would leave the stored
    # version pending and every later apply failing
    if changes.version:
        check_allowed(uow, changes.db, _stored(uow, changes.db, changes.version - 1),
                      changes.policy)  # fmt: skip
    done: list[Change] = []
    client = uow.client
    for change in changes.changes:
        if change.command is None:
            continue
        try:
            client[changes.db].command(dict(change.command))
        except OperationFailure as exc:
            raise DatabaseError(
                f"{change.kind} {change.target} failed ({exc.code}: "
                f"{exc.details.get('errmsg') if exc.details else exc}); nothing after it "
                f"was applied, and what was is kept: run apply again"
            ) from None
        done.append(change)
    if changes.resume:  # an interrupted recompute first: the next version starts from it
        doc = _version_doc(uow, changes.db, changes.resume) or {}
        recompute(uow, changes.db, _stored(uow, changes.db, changes.resume - 1),
                  _stored(uow, changes.db, changes.resume) or changes.policy, progress,
                  version=changes.resume, cursor=doc.get("recompute"), batch=batch)  # fmt: skip
        done.extend(c for c in changes.changes if c.kind == "recompute expiry")
    if changes.version:
        # accord's collection, recorded as such: no tenant input may target it
        Catalog(uow, changes.db).setup(COMPONENT, {POLICIES: POLICY.name, HOLDS: HOLD.name})
        previous = _stored(uow, changes.db, changes.version - 1)
        _store(uow, changes)
        done.extend(c for c in changes.changes if c.kind == "store policy")
        recompute(uow, changes.db, previous, changes.policy, progress,
                  version=changes.version, batch=batch)  # fmt: skip
    return done


def _version_doc(uow: Any, db: str, version: int) -> dict[str, Any] | None:
    found = uow.find(ReadContext("*", operation="governance.plan"), "policy", db, POLICIES,
                     {"_id": f"v{version}"}, limit=1)  # fmt: skip
    return found[0] if found else None


def _stored(uow: Any, db: str, version: int) -> Policy | None:
    """Stored version ``version`` of ``db``'s policy (None: none)."""
    if version < 1:
        return None
    found = uow.find(ReadContext("*", operation="governance.apply"), "policy", db, POLICIES,
                     {"_id": f"v{version}"}, limit=1)  # fmt: skip
    if not found:
        return None
    return parse_policy(found[0]["policy"], f"{db}.{POLICIES} version {version}", base=None)


def _head(uow: Any, db: str) -> dict[str, Any] | None:
    found = uow.find(ReadContext("*", operation="governance.plan"), "policy", db, POLICIES,
                     {"_id": HEAD}, limit=1)  # fmt: skip
    return found[0] if found else None


def _store(uow: Any, changes: GovernancePlan) -> None:
    """Version ``changes.version`` of the policy and the head naming it, in one
    transaction; the head moves only from the version the plan saw (another apply in
    between: refused, plan again)."""
    now = datetime.now(UTC)
    who = uow.principal.name
    version = changes.version
    record = insert_once({
        "_id": f"v{version}", "version": version, "sha256": changes.digest,
        "policy": changes.text, "source": changes.policy.source, "applied_at": now,
        "applied_by": who, "retention": PENDING,  # until expire_at is recomputed
    })  # fmt: skip
    head_filter: dict[str, Any] = {"_id": HEAD, "version": version - 1}
    move = Op("update", head_filter, {"$set": {"version": version, "sha256": changes.digest,
                                                "applied_at": now, "applied_by": who}},
              upsert=version == 1)  # fmt: skip

    def raced(_: Any) -> AccordError:
        return AccordError(
            f"another apply stored a policy in {changes.db}.{POLICIES} meanwhile; run "
            f"`accord governance plan` again"
        )

    uow.execute(Plan(WriteContext("*", operation="governance.apply"), [
        Group("policy:version", changes.db, POLICIES, "policy", [record]),
        Group("policy:head", changes.db, POLICIES, "policy", [move], expect=Expect(raced, touched=1)),
    ]))  # fmt: skip


def _summary(spec: RoleSpec) -> str:
    parts = []
    for privilege in spec.privileges:
        collection = privilege["resource"]["collection"] or "*"
        actions = [a for a in privilege["actions"] if a in ("find", "insert", "update", "remove")]
        if actions:
            parts.append(f"{collection}: {','.join(actions)}")
    return "; ".join(parts) or "no privileges"


def atlas_files(policy: Policy, db: str, directory: str | Path) -> list[Path]:
    """The policy's roles as Atlas custom database roles, one JSON file per role in
    ``directory`` (``atlas customDbRoles create ROLE --file FILE``, or the Admin API's
    ``customDBRoles/roles``). Returns the files written."""
    target = Path(directory)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(
            f"cannot write the role files into {target}: {exc.strerror}"
        ) from None
    written = []
    for spec in role_specs(policy, db):
        path = target / f"{spec.name}.json"
        path.write_text(json.dumps(atlas_role(spec), indent=2) + "\n")
        written.append(path)
    return written
