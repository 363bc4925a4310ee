"""Users and roles: stored as mongod stores them, resolved for every privilege check.

Users are documents of ``admin.system.users`` and custom roles of ``admin.system.roles``,
in mongod's shapes (``{_id: "db.name", userId, user, db, credentials, roles, customData}``
and ``{_id: "db.name", role, db, privileges, roles}``). They are ordinary engine documents,
so they are written by ordinary commits: durable like any other data, surviving restarts,
and atomic with the command that changed them.

``AuthCatalog`` keeps an in-memory copy of both collections as a commit observer: it sees
every commit to them when it becomes visible, in commit order (``Engine.commit_observers``),
and bumps ``generation``. A principal (a user with every role it inherits and the union of
their privileges) is resolved once per generation, so a privilege check costs a dictionary
look-up and a change to a user or a role applies to the very next command of every
connection, as mongod's user cache invalidation does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from accord.platform.embedded.auth import builtin_roles
from accord.platform.embedded.auth.privileges import Privileges, privileges_from_docs
from accord.platform.embedded.errors import EngineError

log = logging.getLogger("accord.engine")

Doc = dict[str, Any]
USERS_NS = "admin.system.users"
ROLES_NS = "admin.system.roles"
RoleName = tuple[str, str]  # (role, db)


@dataclass(frozen=True)
class Principal:
    """An authenticated user as a privilege check needs it."""

    user: str
    db: str
    roles: tuple[RoleName, ...]  # granted directly
    all_roles: frozenset[RoleName]  # with every inherited one
    privileges: Privileges = field(compare=False)


@dataclass
class _Resolved:
    roles: set[RoleName]
    privileges: Privileges


class AuthCatalog:
    """The engine's users and roles, kept in step with their collections (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.users: dict[tuple[str, str], Doc] = {}  # (db, user) -> document
        self.roles: dict[tuple[str, str], Doc] = {}  # (db, role) -> document
        self.generation = 0
        self._principals: dict[tuple[str, str], Principal | None] = {}
        self._closures: dict[RoleName, _Resolved] = {}
        self._engine: Any = None

    # -- loading and the commit observer --------------------------------------------------

    def attach(self, engine: Any) -> None:
        """Load both collections and follow their commits (engine lock held or not yet
        serving)."""
        self._engine = engine
        for ns in (USERS_NS, ROLES_NS):
            self._load(engine, ns)
        engine.commit_observers.append(self)

    def _load(self, engine: Any, ns: str) -> None:
        for _key, doc, _ts, _history in engine.latest_documents(ns):
            if doc is not None:
                self._put(ns, doc)
        self._changed()

    def observes(self, ns: str) -> bool:
        return ns in (USERS_NS, ROLES_NS)

    def on_commit(self, ts: int, changes: list[tuple[str, bytes, Doc | None, Doc | None]]) -> None:
        with self._lock:
            for ns, _key, old, new in changes:
                if old is not None:
                    self._remove(ns, old)
                if new is not None:
                    self._put(ns, new)
            self._changed()

    def on_drop(self, ns: str) -> None:
        with self._lock:
            (self.users if ns == USERS_NS else self.roles).clear()
            self._changed()

    def on_rename(self, old: str, new: str) -> None:
        if self.observes(old):
            self.on_drop(old)
        if self.observes(new):  # its documents are now users or roles (lock held)
            with self._lock:
                self._table(new)[0].clear()
                self._load(self._engine, new)

    def _table(self, ns: str) -> tuple[dict[tuple[str, str], Doc], str]:
        return (self.users, "user") if ns == USERS_NS else (self.roles, "role")

    def _put(self, ns: str, doc: Doc) -> None:
        table, name_field = self._table(ns)
        name, db = doc.get(name_field), doc.get("db")
        if isinstance(name, str) and isinstance(db, str):
            table[(db, name)] = doc
        else:
            log.warning("ignoring a malformed document in %s: _id %r", ns, doc.get("_id"))

    def _remove(self, ns: str, doc: Doc) -> None:
        table, name_field = self._table(ns)
        table.pop((doc.get("db"), doc.get(name_field)), None)  # type: ignore[arg-type]

    def _changed(self) -> None:
        self.generation += 1
        self._principals.clear()
        self._closures.clear()

    # -- look-ups -------------------------------------------------------------------------

    def has_any(self) -> bool:
        """Whether any user or custom role exists (the localhost exception closes)."""
        return bool(self.users or self.roles)

    def user(self, name: str, db: str) -> Doc | None:
        return self.users.get((db, name))

    def role_exists(self, role: str, db: str) -> bool:
        return builtin_roles.is_builtin(role, db) or (db, role) in self.roles

    def role(self, role: str, db: str) -> Doc | None:
        return self.roles.get((db, role))

    def principal(self, name: str, db: str) -> Principal | None:
        """The user with its resolved roles and privileges; None if it does not exist."""
        key = (db, name)
        with self._lock:
            if key in self._principals:
                return self._principals[key]
            doc = self.users.get(key)
            principal = None
            if doc is not None:
                direct = tuple(role_names(doc.get("roles")))
                resolved = self._resolve(direct)
                principal = Principal(
                    name, db, direct, frozenset(resolved.roles), resolved.privileges
                )
            self._principals[key] = principal
            return principal

    def resolve(self, roles: Iterable[RoleName]) -> tuple[set[RoleName], Privileges]:
        """Every role ``roles`` reach (themselves included) and their privileges."""
        with self._lock:
            resolved = self._resolve(tuple(roles))
            return set(resolved.roles), resolved.privileges

    def _resolve(self, roles: tuple[RoleName, ...]) -> _Resolved:
        all_roles: set[RoleName] = set()
        privileges: list[Privileges] = []
        for role in roles:
            closure = self._closure(role)
            all_roles |= closure.roles
            privileges.append(closure.privileges)
        return _Resolved(all_roles, Privileges().union(*privileges))

    def _closure(self, role: RoleName) -> _Resolved:
        cached = self._closures.get(role)
        if cached is not None:
            return cached
        seen: set[RoleName] = set()
        parts: list[Privileges] = []
        stack = [role]
        while stack:
            current = stack.pop()
            if current in seen:
                continue  # a cycle written directly into system.roles cannot loop us
            name, db = current
            if builtin_roles.is_builtin(name, db):
                seen.add(current)
                parts.append(builtin_roles.builtin_privileges(name, db))
                stack.extend(builtin_roles.builtin_subroles(name, db))
                continue
            doc = self.roles.get((db, name))
            if doc is None:
                continue  # a role that no longer exists grants nothing (as in mongod)
            seen.add(current)
            try:
                parts.append(privileges_from_docs(doc.get("privileges", []), f"role {name}@{db}"))
            except EngineError as exc:
                log.warning("role %s@%s has privileges the engine cannot read: %s", name, db, exc)
            stack.extend(role_names(doc.get("roles"), db))
        resolved = _Resolved(seen, Privileges().union(*parts))
        self._closures[role] = resolved
        return resolved

    def inherited_roles(self, role: RoleName) -> set[RoleName]:
        """The roles ``role`` reaches, not counting itself."""
        with self._lock:
            return self._closure(role).roles - {role}

    def direct_subroles(self, role: str, db: str) -> list[RoleName]:
        if builtin_roles.is_builtin(role, db):
            return list(builtin_roles.builtin_subroles(role, db))
        doc = self.roles.get((db, role))
        return list(role_names(doc.get("roles"), db)) if doc else []

    def own_privileges(self, role: str, db: str) -> Privileges:
        if builtin_roles.is_builtin(role, db):
            return builtin_roles.builtin_privileges(role, db)
        doc = self.roles.get((db, role))
        if doc is None:
            return Privileges()
        try:
            return privileges_from_docs(doc.get("privileges", []))
        except EngineError:
            return Privileges()


def role_names(value: Any, default_db: str | None = None) -> Iterable[RoleName]:
    """``[{role, db}]`` (as stored) as names; malformed entries are skipped."""
    if not isinstance(value, list):
        return
    for entry in value:
        if isinstance(entry, dict):
            role, db = entry.get("role"), entry.get("db")
            if isinstance(role, str) and isinstance(db, str):
                yield role, db
        elif isinstance(entry, str) and default_db is not None:
            yield entry, default_db
