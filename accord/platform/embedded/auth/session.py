"""One connection's authentication state, and what it may do.

A connection starts unauthenticated; a successful SCRAM exchange (``saslStart`` /
``saslContinue``, or the ``speculativeAuthenticate`` of the handshake) makes it one user's.
As in mongod since 5.0 a connection authenticates at most once (again as the same user is
allowed); ``logout`` ends it. Privileges are looked up on every command through the
catalog, so a role granted or revoked, or the user dropped, applies to the next command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


# Most distinct privilege questions a connection remembers before starting over.
MEMO_SIZE = 1024


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
    # Answers of ``allows`` for the catalog generation ``_memo_generation`` (a connection
    # asks the same few questions over and over: one dictionary look-up each).
    _memo: dict[tuple[object, ...], bool] = field(default_factory=dict, repr=False)
    _memo_generation: int = field(default=-1, repr=False)

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
        self._memo.clear()

    def logout(self) -> None:
        self.user = None
        self._cached = None
        self._memo.clear()

    # -- what -----------------------------------------------------------------------------

    @property
    def unchecked(self) -> bool:
        return self.internal or not self.enforced

    def privileges(self) -> Privileges:
        principal = self.principal()
        own = principal.privileges if principal is not None else Privileges()
        return own.union(LOCALHOST_PRIVILEGES) if self.localhost_bypass() else own

    def allows(self, target: Resource, actions: set[str] | frozenset[str]) -> bool:
        if self.unchecked:
            return True
        return self._remember((target, *sorted(actions)), lambda: target, actions)

    def allows_ns(self, ns: str, *actions: str) -> bool:
        if self.unchecked:
            return True
        return self._remember(("ns", ns, *actions), lambda: Resource.exact(ns), actions)

    def allows_db(self, db: str, *actions: str) -> bool:
        if self.unchecked:
            return True
        return self._remember(("db", db, *actions), lambda: Resource.database(db), actions)

    def _remember(
        self, key: tuple[object, ...], target: Callable[[], Resource], actions: Iterable[str]
    ) -> bool:
        generation = self.catalog.generation if self.catalog is not None else 0
        if generation != self._memo_generation or len(self._memo) > MEMO_SIZE:
            self._memo.clear()
            self._memo_generation = generation
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.privileges().allows(target(), set(actions))
        return found

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
