"""One connection's authentication state, and what it may do.

A connection starts unauthenticated; a successful SCRAM exchange (``saslStart`` /
``saslContinue``, or the ``speculativeAuthenticate`` of the handshake) makes it one user's.
As in mongod since 5.0 a connection authenticates at most once (again as the same user is
allowed); ``logout`` ends it. Privileges are looked up on every command through the
catalog, so a role granted or revoked, or the user dropped, applies to the next command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accord.platform.embedded.auth.privileges import (
    CLUSTER,
    Privileges,
    Resource,
)

if TYPE_CHECKING:
    from accord.platform.embedded.auth.catalog import AuthCatalog, Principal, RoleName
    from accord.platform.embedded.auth.scram import Conversation

# mongod's default privileges under the localhost exception (no user and no role exists
# yet, connection from the loopback interface): enough to create the first user.
LOCALHOST_PRIVILEGES = Privileges(
    [
        (Resource.database("admin"), {"createUser", "grantRole"}),
        (Resource.database("$external"), {"createUser"}),
        (
            CLUSTER,
            {"addShard", "replSetConfigure", "replSetGetStatus", "issueDirectShardOperations"},
        ),
    ]
)


@dataclass
class AuthSession:
    """Authentication state of one connection (``enforced``: the engine runs with --auth;
    ``internal``: the engine's own work, never checked)."""

    local: bool = True
    enforced: bool = False
    internal: bool = False
    catalog: AuthCatalog | None = None
    user: tuple[str, str] | None = None  # (name, db)
    conversation: Conversation | None = None
    _cached: tuple[int, Principal | None] | None = field(default=None, repr=False)

    # -- who ------------------------------------------------------------------------------

    def principal(self) -> Principal | None:
        """The authenticated user as of now; a dropped user logs the connection out."""
        if self.user is None or self.catalog is None:
            return None
        generation = self.catalog.generation
        if self._cached is not None and self._cached[0] == generation:
            return self._cached[1]
        principal = self.catalog.principal(*self.user)
        if principal is None:
            self.user = None  # the user was dropped: as mongod, the connection loses it
        self._cached = (generation, principal)
        return principal

    @property
    def authenticated(self) -> bool:
        return self.principal() is not None

    def localhost_bypass(self) -> bool:
        """mongod's localhost exception: auth on, loopback connection, no user or role."""
        return (
            self.enforced and self.local and self.catalog is not None and not self.catalog.has_any()
        )

    def login(self, name: str, db: str) -> None:
        self.user = (name, db)
        self._cached = None

    def logout(self) -> None:
        self.user = None
        self._cached = None

    # -- what -----------------------------------------------------------------------------

    @property
    def unchecked(self) -> bool:
        return self.internal or not self.enforced

    def privileges(self) -> Privileges:
        principal = self.principal()
        own = principal.privileges if principal is not None else Privileges()
        return own.union(LOCALHOST_PRIVILEGES) if self.localhost_bypass() else own

    def allows(self, target: Resource, actions: set[str] | frozenset[str]) -> bool:
        return self.unchecked or self.privileges().allows(target, actions)

    def allows_ns(self, ns: str, *actions: str) -> bool:
        return self.allows(Resource.exact(ns), set(actions))

    def allows_db(self, db: str, *actions: str) -> bool:
        return self.allows(Resource.database(db), set(actions))

    def may_see_collection(self, ns: str) -> bool:
        """listCollections' ``authorizedCollections``: any action on the collection."""
        return self.unchecked or self.privileges().any_action_on(Resource.exact(ns))

    def may_see_database(self, db: str) -> bool:
        """listDatabases' filter: any action on anything in the database."""
        return self.unchecked or self.privileges().any_action_in_db(db)

    def is_user(self, name: str, db: str) -> bool:
        return self.user == (name, db) and self.principal() is not None

    def has_role(self, role: RoleName) -> bool:
        principal = self.principal()
        return principal is not None and role in principal.all_roles

    def owner(self) -> tuple[str, str] | None:
        """Who owns what this connection creates (cursors): the user, or None."""
        return self.user if self.principal() is not None else None
