# Generated from accord/platform/asynchronous/leases.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The runs service: which run may write a thread now (claim, renew, heartbeat, release,
fence), for the checkpointer and for workers alike.

The registry's documents and the guards every commit carries are pure builders in
:mod:`accord.platform.runs`; this service runs them through the kernel and keeps the
leases this process holds alive:

* :meth:`RunLeases.claim` takes a thread for a run (a lease and a fencing number), or
  raises the caller's error when another live run holds it. A holder that the claimer can
  see is dead (same machine: its pid is gone or reused, :mod:`accord.platform.hosts`) is
  taken over at once, fenced; a holder elsewhere is waited out (its lease expires, at most
  ``lease_seconds`` after its last renewal).
* :meth:`track` puts a lease under the heartbeat: renewed every ``lease_seconds / 3``
  while it is held (one small update), and reported lost (``on_lost``) when another run
  took it over. A commit of the run renews the lease too (its guard does): :meth:`renewed`.
* :meth:`release` gives a lease back. Leases still held when the interpreter exits are
  given back (sync code: by ``atexit``; SIGTERM is turned into ``SystemExit`` so that
  ``finally`` blocks and LangGraph's loop exits run: :mod:`accord.platform.exits`).
* :meth:`guard` builds the :class:`~accord.platform.runs.ThreadGuard` a commit's
  :class:`~accord.platform.context.WriteContext` carries; the kernel puts it first in the
  transaction.
* :meth:`take_over` ends whatever run holds a thread (``accord threads release``): the
  fence moves on, so that run's next commit is refused.

Generated from ``accord/platform/asynchronous/leases.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from accord.errors import ConcurrentRunError, WriteRefused
from accord.platform import codes, exits, hosts, runs
from accord.platform.artifacts import RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Counts, Group, Op, Plan
from accord.platform.synchronous.unit_of_work import UnitOfWork
from accord.platform.tickers import LoopTicker, ThreadTicker

_IS_SYNC = True

logger = logging.getLogger("accord.platform")

_Ticker = ThreadTicker if _IS_SYNC else LoopTicker

#: What a claim refused by a live holder raises, built by the caller from the holder.
Refused = Callable[[runs.Holder], BaseException]


@dataclass
class _Held:
    lease: runs.Lease
    renewed: float
    on_lost: Callable[[runs.Holder], None] | None


def default_refusal(holder: runs.Holder, thread_id: str) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"Thread {thread_id!r} is being run by {holder.describe()}; nothing was written. "
        f"Wait for that run to end (or, if its worker died on another machine, for its "
        f"lease to expire), or take the thread over with `accord threads release "
        f"{thread_id}`."
    )


class RunLeases:
    """Leases on the threads of one registry collection (see the module docstring).

    Args:
        uow: the kernel (from :mod:`accord.runtime`).
        db, collection: where the registry lives.
        lease_seconds: how long a lease lasts without renewal.
    """

    def __init__(
        self,
        uow: UnitOfWork,
        db: str,
        collection: str = RUN.default_collection or "runs",
        *,
        lease_seconds: float = runs.DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.uow = uow
        self.db = db
        self.collection = collection
        self.lease_seconds = float(lease_seconds)
        self.process = hosts.current()
        self._held: dict[tuple[str, str, str], _Held] = {}
        # runs of this process whose release failed: the next claim may replace them
        self._unreleased: dict[tuple[str, str], set[str]] = {}
        self._mutex = threading.Lock()
        self._ticker = _Ticker(
            lambda: self.heartbeat(), self.lease_seconds / 10, self.holds_any, "accord-lease"
        )

    # --- claim / release ---------------------------------------------------------------

    def claim(
        self,
        tenant_id: str,
        thread_id: str,
        run_id: str,
        *,
        refused: Refused | None = None,
        context: WriteContext | None = None,
    ) -> runs.Lease:
        """Take ``thread_id`` for ``run_id`` (a re-entry of the same run takes it again,
        fence + 1). Raises ``refused(holder)`` (default :class:`ConcurrentRunError`)
        while another live run holds it."""
        at = runs.now()
        with self._mutex:
            ended = sorted(self._unreleased.get((tenant_id, thread_id), ()))
        filt, update = runs.claim(
            tenant_id, thread_id, run_id, holder=self.process, at=at,
            lease_seconds=self.lease_seconds, also_replace=ended,
        )  # fmt: skip
        doc = self._claim(tenant_id, thread_id, filt, update, context)
        if doc is None:
            holder = self.holder(tenant_id, thread_id)
            if holder.live(at) and holder.process is not None and hosts.is_dead(holder.process):
                logger.info(
                    "accord: thread %r was held by dead process %s (run %r); taking it over",
                    thread_id, holder.holder, holder.run_id,
                )  # fmt: skip
                filt, update = runs.claim(
                    tenant_id, thread_id, run_id, holder=self.process, at=at,
                    lease_seconds=self.lease_seconds, dead=holder,
                )  # fmt: skip
                doc = self._claim(tenant_id, thread_id, filt, update, context)
                if doc is None:
                    holder = self.holder(tenant_id, thread_id)
            if doc is None:
                raise (refused or (lambda h: default_refusal(h, thread_id)))(holder)
        with self._mutex:
            self._unreleased.pop((tenant_id, thread_id), None)
        exits.watch(self)
        return runs.lease_from(doc)

    def _claim(
        self,
        tenant_id: str,
        thread_id: str,
        filt: dict[str, Any],
        update: dict[str, Any],
        context: WriteContext | None,
    ) -> Any:
        """The document after a claim, or None when a live holder refused it."""
        plan = Plan(
            self._context(context, tenant_id, thread_id, "run.claim"),
            [self._group("claim", [Op("find_one_and_update", filt, update, upsert=True)])],
        )
        try:
            result = self.uow.execute(plan, transaction=False)
        except WriteRefused as err:
            if err.code not in codes.DUPLICATE_KEY_CODES:
                raise
            return None
        return result.found["claim"][0]

    def release(self, lease: runs.Lease, *, context: WriteContext | None = None) -> bool:
        """Give ``lease`` back (a no-op once taken over). False, and logged, when the
        database could not be reached: the lease then expires by itself."""
        self.untrack(lease)
        filt, update = runs.release(lease, at=runs.now())
        plan = Plan(
            self._context(context, lease.tenant_id, lease.thread_id, "run.release"),
            [self._group("release", [Op("update", filt, update)])],
        )
        try:
            self.uow.execute(plan, transaction=False)
        except Exception as exc:
            with self._mutex:
                self._unreleased.setdefault((lease.tenant_id, lease.thread_id), set()).add(
                    lease.run_id
                )
            logger.warning(
                "accord: could not release run %s on thread %r (%s); its lease expires "
                "by itself within %gs",
                lease.run_id, lease.thread_id, exc, self.lease_seconds,
            )  # fmt: skip
            logger.debug("releasing the lease failed", exc_info=True)
            return False
        return True

    def take_over(
        self, tenant_id: str, thread_id: str, *, context: WriteContext | None = None
    ) -> runs.Holder:
        """End whatever run holds the thread (its next commit is refused) and return who
        held it. The thread is free for the next claim at once."""
        before = self.holder(tenant_id, thread_id)
        op = runs.takeover(tenant_id, thread_id, runs.new_version(), at=runs.now())
        plan = Plan(self._context(context, tenant_id, thread_id, "run.takeover"),
                    [self._group("takeover", [op])])  # fmt: skip
        self.uow.execute(plan, transaction=False)
        return before

    def holder(
        self, tenant_id: str, thread_id: str, *, context: ReadContext | None = None
    ) -> runs.Holder:
        """Who holds the thread according to its registry document."""
        filt, projection = runs.version_filter(tenant_id, thread_id)
        ctx = context or ReadContext(tenant_id, thread_id, operation="run.holder")
        doc = self.uow.find_one(
            ctx, RUN.name, self.db, self.collection, filt, projection=projection
        )
        return runs.holder_of(doc)

    def version(
        self, tenant_id: str, thread_id: str, *, context: ReadContext | None = None
    ) -> str | None:
        """The thread's registry ``version`` (changes with every commit), or None."""
        filt, projection = runs.version_filter(tenant_id, thread_id)
        ctx = context or ReadContext(tenant_id, thread_id, operation="run.version")
        doc = self.uow.find_one(
            ctx, RUN.name, self.db, self.collection, filt, projection=projection
        )
        return doc.get("version") if doc is not None else None

    # --- the heartbeat -----------------------------------------------------------------

    def track(
        self, lease: runs.Lease, on_lost: Callable[[runs.Holder], None] | None = None
    ) -> None:
        """Renew ``lease`` in the background while it is held; ``on_lost(holder)`` when a
        renewal finds it taken over."""
        with self._mutex:
            self._held[_key(lease)] = _Held(lease, time.monotonic(), on_lost)
        self._ticker.ensure()

    def untrack(self, lease: runs.Lease) -> None:
        with self._mutex:
            self._held.pop(_key(lease), None)
            idle = not self._held
        if idle:
            self._ticker.stop()

    def renewed(self, lease: runs.Lease) -> None:
        """A commit of the run renewed its lease (its guard does): no heartbeat needed yet."""
        with self._mutex:
            held = self._held.get(_key(lease))
            if held is not None:
                held.renewed = time.monotonic()

    def holds_any(self) -> bool:
        with self._mutex:
            return bool(self._held)

    def held(self) -> list[runs.Lease]:
        """The leases this service keeps alive now."""
        with self._mutex:
            return [h.lease for h in self._held.values()]

    def heartbeat(self) -> None:
        """Renew the tracked leases not renewed for ``lease_seconds / 3``."""
        due = time.monotonic() - self.lease_seconds / 3
        with self._mutex:
            stale = [h for h in self._held.values() if h.renewed <= due]
        for held in stale:
            if not self.renew(held.lease):
                self.untrack(held.lease)
                if held.on_lost is not None:
                    held.on_lost(self.holder(held.lease.tenant_id, held.lease.thread_id))

    def renew(self, lease: runs.Lease) -> bool:
        """Extend ``lease``; False when it was taken over or given back."""
        filt, update = runs.renew(lease, at=runs.now(), lease_seconds=self.lease_seconds)
        plan = Plan(
            self._context(None, lease.tenant_id, lease.thread_id, "run.renew"),
            [self._group("renew", [Op("update", filt, update)])],
        )
        result = self.uow.execute(plan, transaction=False)
        if result["renew"].matched != 1:
            return False
        self.renewed(lease)
        return True

    def release_all(self) -> int:
        """Give back every lease this service holds (at exit); how many were released."""
        released = 0
        for lease in self.held():
            released += self.release(lease)
        return released

    # --- guards ------------------------------------------------------------------------

    def guard(
        self,
        kind: runs.GuardKind,
        tenant_id: str,
        thread_id: str,
        version: str,
        *,
        lease: runs.Lease | None = None,
        at: datetime | None = None,
        expire_at: datetime | None = None,
        release: bool = False,
        refused: Callable[[Counts], BaseException] | None = None,
    ) -> runs.ThreadGuard:
        """The registry guard of one commit (put it in the plan's context)."""
        return runs.ThreadGuard(
            self.db, self.collection, kind, tenant_id, thread_id, version,
            at or runs.now(), lease=lease, lease_seconds=self.lease_seconds,
            expire_at=expire_at, release=release, refused=refused,
        )  # fmt: skip

    # --- helpers -----------------------------------------------------------------------

    def _group(self, name: str, ops: list[Op]) -> Group:
        return Group(name, self.db, self.collection, RUN.name, ops)

    @staticmethod
    def _context(
        context: WriteContext | None, tenant_id: str, thread_id: str, operation: str
    ) -> WriteContext:
        if context is not None:
            return replace(context, tenant_id=tenant_id, thread_id=thread_id, operation=operation)
        return WriteContext(tenant_id, thread_id, operation=operation)


def _key(lease: runs.Lease) -> tuple[str, str, str]:
    return (lease.tenant_id, lease.thread_id, lease.run_id)
