"""The policy applied to a database, as running processes see it: loaded on the first
operation on that database, and re-read at most every ``interval`` seconds, so a newer
version (``accord governance apply``) is enforced without a restart.

``apply`` stores every version in the ``policy`` class's collection (``accord_policies``):
``v1``, ``v2``, ... and a ``head`` document naming the current version. A process reads
the head and the newest version in one query (sorted by ``version``, two documents), and
parses the version's text only when its hash differs from the one it holds.

No I/O happens here: :class:`StoredPolicies` is the ``refresh`` phase of the policy hook
(docs/platform.md, "Hooks"). The kernel asks it before every operation whether a read is
due, makes the read through its own read path (so the policy's read rules and the audit
apply to it; it acts as the kernel's principal), outside any transaction, and hands the
result back. The hook's checks ask :meth:`StoredPolicies.current`, a dictionary lookup.

What a process enforces when the read fails: what it enforced before (the fallback at
first). A principal the policy refuses the stored policy to (a policy that takes ``find``
on the ``policy`` class from a role; the default grants it to every role) keeps the
fallback and is asked again only every ten minutes; an error of the
database is retried at the next interval. A stored policy this version of accord cannot
parse is reported (logged) and not enforced.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accord.errors import ConfigurationError, PermissionDenied, PolicyError
from accord.governance.loading import parse_policy
from accord.governance.policy import Policy
from accord.platform.artifacts import POLICY
from accord.platform.hooks import RefreshRead

__all__ = ["DEFAULT_INTERVAL", "INTERVAL_ENV", "HEAD", "StoredPolicies", "interval_from_env"]

logger = logging.getLogger("accord.governance")

#: Seconds between two reads of a database's policy head, by default.
DEFAULT_INTERVAL = 5.0
#: The environment variable that changes it, for every kernel of the process.
INTERVAL_ENV = "ACCORD_POLICY_REFRESH"
#: The ``_id`` of the document naming the current version.
HEAD = "head"
#: Seconds before asking again after the policy refused the read itself.
REFUSED_BACKOFF = 600.0
OPERATION = "governance.policy_refresh"


def interval_from_env() -> float:
    """``ACCORD_POLICY_REFRESH`` (seconds, > 0), else :data:`DEFAULT_INTERVAL`."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigurationError(
            f"{INTERVAL_ENV}={raw!r} is not a positive number of seconds (how often a "
            f"process re-reads the policy stored in its database)"
        )
    return value


@dataclass
class _Database:
    """What is known of one database's stored policy."""

    policy: Policy | None = None  # None: none stored (or none readable): the fallback
    version: int = 0
    sha256: str = ""
    due: float = 0.0  # when to read the head again (clock time)
    busy: bool = False  # a read is under way
    warned: bool = False


class StoredPolicies:
    """Per database, the newest policy applied to it (module docstring); ``fallback``
    where none is stored. ``interval``: seconds between two reads of a database's head."""

    def __init__(
        self,
        fallback: Policy,
        interval: float = DEFAULT_INTERVAL,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ConfigurationError(f"the policy refresh interval must be > 0, got {interval!r}")
        self.fallback = fallback
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._dbs: dict[str, _Database] = {}
        fallback_class = fallback.of(POLICY.name)
        self.collection = (
            fallback_class.collection
            if fallback_class is not None and fallback_class.collection
            else POLICY.default_collection or "accord_policies"
        )

    def current(self, db: str) -> Policy:
        """The policy enforced on ``db`` now (no I/O)."""
        state = self._dbs.get(db)
        return state.policy if state is not None and state.policy is not None else self.fallback

    def version(self, db: str) -> int:
        """The stored version enforced on ``db`` (0: none, the fallback)."""
        state = self._dbs.get(db)
        return state.version if state is not None and state.policy is not None else 0

    # -- the kernel's refresh phase -----------------------------------------------------

    def refresh_read(self, db: str) -> RefreshRead | None:
        """The read of ``db``'s head and newest version when it is due, else None."""
        state = self._dbs.get(db)
        now = self._clock()
        if state is not None and (state.busy or now < state.due):
            return None
        with self._lock:
            state = self._dbs.setdefault(db, _Database())
            if state.busy or now < state.due:
                return None
            state.busy = True
        return RefreshRead(
            POLICY.name, self.collection, {}, OPERATION, sort=[("version", -1)], limit=2
        )

    def refreshed(self, db: str, found: list[Any] | None, error: BaseException | None) -> None:
        """Take the result of the read :meth:`refresh_read` asked for."""
        state = self._dbs[db]
        try:
            if error is not None:
                self._failed(db, state, error)
            else:
                self._take(db, state, found or [])
        finally:
            with self._lock:
                state.busy = False

    def _failed(self, db: str, state: _Database, error: BaseException) -> None:
        refused = isinstance(error, PermissionDenied)
        state.due = self._clock() + (
            max(REFUSED_BACKOFF, self.interval) if refused else self.interval
        )
        if not state.warned:
            state.warned = True
            enforced = f"version {state.version}" if state.policy else self.fallback.source
            logger.warning(
                "accord: reading the policy stored in %s.%s failed (%s); enforcing %s",
                db, self.collection, error, enforced,
            )  # fmt: skip

    def _take(self, db: str, state: _Database, found: list[Any]) -> None:
        state.due = self._clock() + self.interval
        head = next((d for d in found if d.get("_id") == HEAD), None)
        if head is None:  # nothing applied (or the head was removed): the fallback
            state.policy, state.version, state.sha256 = None, 0, ""
            return
        if head.get("sha256") == state.sha256 and state.policy is not None:
            return
        version = head.get("version")
        stored = next((d for d in found if d.get("_id") == f"v{version}"), None)
        source = f"{db}.{self.collection} version {version}"
        if stored is None or not isinstance(stored.get("policy"), str):
            logger.error("accord: %s is named by the head but missing; not enforced", source)
            return
        try:
            policy = parse_policy(stored["policy"], source, base=None)
        except PolicyError as exc:
            logger.error("accord: the stored policy %s is refused, not enforced: %s", source, exc)
            return
        if state.policy is not None:
            logger.info("accord: %s replaces version %s", source, state.version)
        state.policy, state.version = policy, int(version)
        state.sha256 = str(head.get("sha256", ""))
