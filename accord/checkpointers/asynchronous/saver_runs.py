"""The checkpointer's run lifecycle, as a client of the platform's runs service
(:mod:`accord.platform.asynchronous.leases`): a LangGraph run claims its thread when its loop
loads it, and releases it when the loop exits (:mod:`accord.checkpointers.ownership`); every
commit carries the registry guard of its run (or the free guard) in its plan's context.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver_runs.py`` is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import builtins
from datetime import timedelta
from typing import Any

from langchain_core.runnables import RunnableConfig

from accord.checkpointers import bridges, jobs, langgraph_internals, ownership, plans
from accord.checkpointers.asynchronous.saver_core import AsyncSaverCore
from accord.checkpointers.ownership import ActiveRun
from accord.checkpointers.storage import Scope
from accord.errors import WriteRefused
from accord.platform import runs
from accord.platform.plan import Counts, Plan

_IS_SYNC = False


class AsyncSaverRuns(AsyncSaverCore):
    """Claims and releases runs; guards and commits the saver's plans."""

    async def _claim(self, scope: Scope, config: RunnableConfig, caller: Any) -> ActiveRun | None:
        """Claim the thread for the run LangGraph's loop is starting (see ownership)."""
        anchor = langgraph_internals.anchor_of(config)
        if anchor is None:
            return None  # a loop without a runtime: its calls are ad hoc
        await self._ensure_setup()
        run_id = (
            ownership.langgraph_run_id(langgraph_internals.loop_config(caller))
            or ownership.mint_run_id()
        )
        lease = await self.leases.claim(
            scope.tenant_id,
            scope.thread_id,
            run_id,
            refused=lambda holder: ownership.held_by_another(
                scope.thread_id, holder, at=runs.now()
            ),
        )
        run = ActiveRun(lease, anchor, bridges.new_async_lock())
        self._register(scope, run)
        self.cache.validate(scope.tenant_id, scope.thread_id, lease.version)
        bridges.on_loop_exit(caller, self._release, run, self._release_bridge())

        def lost(holder: runs.Holder, run: ActiveRun = run) -> None:
            if not (run.ended or run.released):
                run.lost = run.lost or holder

        self.leases.track(lease, lost)
        return run

    def _release_bridge(self) -> Any:
        return None if _IS_SYNC else getattr(self, "_on_loop", None)

    async def _release(self, run: ActiveRun) -> None:
        """End ``run``: wait for its queued puts, give its lease back, then raise the
        failure of a queued put LangGraph has not seen yet (the run's outcome)."""
        if run.ended:
            return
        run.releasing = True  # the drainer may give the lease back with the last saves
        while not run.idle():
            await run.signal.await_for(run.idle, self.timeout)
        run.ended = True
        released = run.released  # by the transaction of the run's last queued saves
        try:
            if not released:
                async with run.lock:
                    released = await self.leases.release(run.lease)
            else:
                self.leases.untrack(run.lease)
        finally:
            self._unregister(run)
        if run.failure is not None and not run.surfaced:
            run.surfaced = True
            raise jobs.again(run.failure)

    async def _holder(self, scope: Scope) -> runs.Holder:
        return await self.leases.holder(scope.tenant_id, scope.thread_id)

    def _guard(
        self,
        scope: Scope,
        run: ActiveRun | None,
        version: str,
        what: str,
        *,
        release: bool = False,
    ) -> runs.ThreadGuard:
        """The registry guard leading a commit (``release``: the run's last commit, which
        gives its lease back)."""
        at = runs.now()
        expire_at = at + timedelta(seconds=self.ttl) if self.ttl is not None else None
        if run is not None:
            lost = run

            def fenced(counts: Counts) -> BaseException:
                lost.lost = lost.lost or runs.Holder(None, None, 0, None)
                return ownership.fenced_out(scope.thread_id, lost.run_id, what, None)

            return self.leases.guard(
                "owner", scope.tenant_id, scope.thread_id, version, lease=run.lease, at=at,
                expire_at=expire_at, release=release, refused=fenced,
            )  # fmt: skip

        def held(counts: Counts) -> BaseException:
            return ownership.adhoc_refused(scope.thread_id, what, runs.Holder(None, None, 0, None))

        return self.leases.guard(
            "free", scope.tenant_id, scope.thread_id, version, at=at, expire_at=expire_at,
            refused=held,
        )  # fmt: skip

    async def _commit(
        self,
        plan: Plan | builtins.list[Plan],
        scope: Scope,
        run: ActiveRun | None,
        what: str,
    ) -> None:
        """Run ``plan`` (a list: in one transaction, the first one leading with the
        guard); a refused guard becomes ConcurrentRunError naming the holder."""
        if run is not None and run.lost is not None:
            raise ownership.fenced_out(scope.thread_id, run.run_id, what, run.lost)
        try:
            if isinstance(plan, Plan):
                await self.uow.execute(plan)
            else:
                await self.uow.execute_all(plan)
        except WriteRefused as err:
            if err.group != plans.GUARD:
                raise
            holder = await self._holder(scope)
            if run is not None:
                run.lost = holder
                raise ownership.fenced_out(scope.thread_id, run.run_id, what, holder) from None
            raise ownership.adhoc_refused(scope.thread_id, what, holder) from None
        if run is not None:
            self.leases.renewed(run.lease)
