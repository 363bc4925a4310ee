""" "async" durability: the queue of a run's saves. LangGraph does not wait for a put made
with ``durability="async"``; the saver queues it (serialized at once) and commits the run's
queued saves in order in the background, several in one transaction, and surfaces a
failure at the run's next put and at its end.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver_queue.py`` is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import builtins
import functools
import logging
import time
from typing import Any

from accord.checkpointers import failures, jobs, langgraph_internals, plans
from accord.checkpointers.asynchronous.saver_reads import AsyncSaverReads
from accord.checkpointers.ownership import ActiveRun, FailedTask
from accord.checkpointers.storage import Scope
from accord.errors import (
    ConcurrentRunError,
    DatabaseError,
    InvalidInputError,
    TaskWriteError,
    TransactionTimeout,
    WriteRefused,
)
from accord.platform import codes, runs
from accord.platform.plan import Plan

_IS_SYNC = False

logger = logging.getLogger("accord.checkpointers")

#: Queued saves of a run committed in one transaction, at most.
_BATCH_JOBS = 8
#: While the run's loop runs tasks, how long the drainer waits for the run's next save
#: before committing what it holds (again after each save that comes meanwhile): a
#: quick step's saves then share one transaction instead of queueing behind it.
_LINGER = 0.002
#: The most a save waits that way, in all.
_LINGER_MAX = 0.02


class AsyncSaverQueue(AsyncSaverReads):
    """Queues and drains a run's saves (see the module docstring)."""

    def _queue_put(self, job: jobs.PutJob, run: ActiveRun) -> bool:
        """ "async" durability: LangGraph does not wait for this put, and calls the next one
        only when this one returns, with a checkpoint it made earlier whose live objects
        (a fan-in barrier's set of seen nodes) it keeps changing meanwhile. So the put is
        queued, serialized, and returns at once; the run's saves commit in order in the
        background, and failures surface at the next put and at the run's end.
        Thread-safe: the bridges call it on the caller's thread, with no hop to the
        saver's loop or to a thread before the put returns. True when the caller must
        start the run's drainer."""
        ns = job.scope.checkpoint_ns
        run.put_started(ns, job.checkpoint_id)
        if job.docs.entry is not None:
            run.queued[ns] = job.docs.entry
        return run.enqueue(job)

    def _deferred(self, run: ActiveRun, ns: str) -> bool:
        """Whether the run's loop of ``ns`` does not wait for its puts ("async")."""
        return langgraph_internals.saves_in_background(run.loops.get(ns))

    async def _drain(self, run: ActiveRun) -> None:
        """Commit a run's queued saves, in order (one drainer per run at a time). The
        saves queued behind the one in hand share its transaction (one guard, one round
        trip), up to a put that must first wait for business writes of its parent's
        tasks; the run's last transaction gives its lease back once its loop exited."""
        while True:
            job = run.next_job()
            if job is None:
                return
            if run.failure is not None:
                self._job_done(run, job, run.failure)
                continue
            batch = [job]
            try:
                if isinstance(job, jobs.WritesJob) and await self._before_its_put(run, job):
                    continue  # back in the queue, behind the put of its checkpoint
                if isinstance(job, jobs.PutJob) and jobs.unsure(job):
                    job.done = True  # _commit_put ends it
                    await self._commit_put(run, job)
                    continue
                await self._ensure_setup()
                if isinstance(job, jobs.PutJob) and job.parent_id is not None:
                    await self._check_parent(run, job)
                batch = await self._fill(run, self._with_parents_writes(run, [job]))
                await self._commit_queued(run, batch)
            except BaseException as exc:  # kept for the run's next put and its end
                logger.debug(
                    "queued saves of run %s failed; raised at its next put or its end",
                    run.run_id,
                    exc_info=True,
                )
                run.failure = run.failure or exc
                for one in batch:
                    self._job_done(run, one, run.failure)

    async def _fill(self, run: ActiveRun, batch: builtins.list[Any]) -> builtins.list[Any]:
        """``batch`` with the queued saves that may share its transaction; while the run's
        loop still runs tasks, also those that come within ``_LINGER`` of the last one
        (at most ``_LINGER_MAX`` in all). The loop's exit ends the wait at once: its last
        saves then commit with the lease's release, in one transaction. Lingering never
        loses what "async" durability keeps: LangGraph does not wait for these saves, and
        a crash may lose the latest steps' saves either way, never part of one."""
        deadline = time.monotonic() + _LINGER_MAX
        while True:
            while len(batch) < _BATCH_JOBS:
                run.writes_behind_their_puts()
                more = run.more_jobs(functools.partial(self._joins, run, batch=batch), 1)
                if not more:
                    break
                batch = self._with_parents_writes(run, batch + more)
            remaining = deadline - time.monotonic()
            if len(batch) >= _BATCH_JOBS or run.releasing or run.failure or remaining <= 0:
                return batch
            seen = run.queued_count()

            def moved(seen: int = seen) -> bool:
                return run.queued_count() != seen or run.releasing

            if not await run.signal.await_for(moved, min(_LINGER, remaining)):
                return batch

    async def _before_its_put(self, run: ActiveRun, job: jobs.WritesJob) -> bool:
        """Task writes whose checkpoint is not saved yet never commit before it (business
        writes committed for a checkpoint that a crash then loses would be applied again
        by the task's re-run): they go back in the queue behind its put, waited for here
        (LangGraph hands it over in another thread, later under load), never in
        LangGraph's threads. True when the job went back in the queue; raises when the
        put (or another save of the run) failed, or the put did not come within the
        saver's timeout."""
        ns, checkpoint_id = job.scope.checkpoint_ns, job.checkpoint_id

        def queued_or_saved() -> bool:
            return run.is_saved(ns, checkpoint_id) or run.put_queued(ns, checkpoint_id)

        deadline = time.monotonic() + self.timeout
        while not run.is_saved(ns, checkpoint_id):
            if run.behind_its_put(job):
                return True
            # a failed save of the run stops it: the put may never come
            error = run.put_error(ns, checkpoint_id) or run.failure
            if error is not None or time.monotonic() > deadline:
                raise failures.unsaved_checkpoint(job.scope, checkpoint_id, job.task_id, error)
            await run.signal.await_for(queued_or_saved, 0.05)
        return False

    @staticmethod
    def _with_parents_writes(run: ActiveRun, batch: builtins.list[Any]) -> builtins.list[Any]:
        """``batch`` with the queued task writes of its last put's parent taken from the
        queue and put before that put: a checkpoint never commits before the business
        writes of the tasks it says have run (they may have been queued after it)."""
        last = batch[-1]
        if not isinstance(last, jobs.PutJob) or last.parent_id is None:
            return batch
        parents = run.take_writes(last.scope.checkpoint_ns, last.parent_id)
        return [*batch[:-1], *parents, last]

    def _joins(
        self, run: ActiveRun, job: jobs.PutJob | jobs.WritesJob, batch: builtins.list[Any]
    ) -> bool:
        """Whether a queued save may share the transaction of the saves before it
        (``batch``): task writes once their checkpoint is saved or its put is in the
        batch (they can be queued before that put: see ``_before_its_put``, which the
        drainer applies when they come first); a put unless it must wait for (or stop at)
        its parent's tasks."""
        if isinstance(job, jobs.WritesJob):
            ns, checkpoint_id = job.scope.checkpoint_ns, job.checkpoint_id
            return run.is_saved(ns, checkpoint_id) or any(
                isinstance(one, jobs.PutJob)
                and one.checkpoint_id == checkpoint_id
                and one.scope.checkpoint_ns == ns
                for one in batch
            )
        if job.parent_id is None:
            return True
        if jobs.unsure(job):
            return False
        scope = job.scope
        key = (scope.tenant_id, scope.thread_id, job.parent_id)
        return not self._staged_of(run).pending(key) and (
            run.failed_task_of(scope.checkpoint_ns, job.parent_id) is None
        )

    async def _check_parent(self, run: ActiveRun | None, job: jobs.PutJob) -> None:
        """A put commits only after the business writes of its parent's tasks, and never
        on top of a task whose writes failed."""
        scope, parent_id = job.scope, job.parent_id
        assert parent_id is not None
        await self._wait_staged(scope, run, parent_id, job.checkpoint_id)
        failed = run.failed_task_of(scope.checkpoint_ns, parent_id) if run is not None else None
        if failed is not None:
            raise failures.step_not_saved(scope, job.checkpoint_id, parent_id, failed)

    async def _commit_queued(self, run: ActiveRun, batch: builtins.list[Any]) -> None:
        """Commit queued saves in one transaction; if it fails with more than one save
        in it, commit them one at a time, so the saves before a failing one commit (as
        they would have alone)."""
        if len(batch) == 1:
            await self._commit_alone(run, batch[0], release=run.last_batch())
            return
        try:
            await self._commit_jobs(run, batch, release=run.last_batch())
        except (ConcurrentRunError, TransactionTimeout):
            raise  # the same for each one alone
        except DatabaseError:
            # a refused write the driver reported without saying which (a top-level
            # error of the command) can only be told apart one save at a time
            if not any(isinstance(j, jobs.WritesJob) and j.business for j in batch):
                raise
            await self._commit_one_by_one(run, batch)
        except Exception:
            await self._commit_one_by_one(run, batch)

    async def _commit_one_by_one(self, run: ActiveRun, batch: builtins.list[Any]) -> None:
        """After a batch failed: its saves one at a time, in order, as they would have
        committed alone. A task whose writes fail is recorded as failed; its sibling
        tasks (writes of the same checkpoint) still commit, as they would have each in
        its own transaction; nothing after them does (no checkpoint on top of a failed
        task). The first failure is raised."""
        failed: tuple[Any, BaseException] | None = None
        for one in batch:
            if failed is not None and not (
                isinstance(one, jobs.WritesJob)
                and one.checkpoint_id == failed[0].checkpoint_id
                and one.scope.checkpoint_ns == failed[0].scope.checkpoint_ns
            ):
                break
            try:
                await self._commit_alone(run, one, release=False)
            except (ConcurrentRunError, DatabaseError):
                raise
            except Exception as exc:
                if not isinstance(one, jobs.WritesJob):
                    raise
                failure = FailedTask(one.task_id, one.node, exc)
                run.task_failed(one.scope.checkpoint_ns, one.checkpoint_id, failure, one.task_id)
                self._job_done(run, one, exc)
                failed = failed or (one, exc)
        if failed is not None:
            raise failed[1]

    async def _commit_alone(self, run: ActiveRun, job: Any, *, release: bool) -> None:
        """Commit one queued save; for task writes with business writes, as the direct
        path does: a task recorded before (a replayed task) is recorded again without
        its business writes (exactly once), and a refused business write becomes the
        task's BusinessWriteError."""
        try:
            await self._commit_jobs(run, [job], release=release)
        except WriteRefused as err:
            if not (isinstance(job, jobs.WritesJob) and job.business):
                raise
            if err.group == plans.MARKS and err.code in codes.DUPLICATE_KEY_CODES:
                job.business = []
                await self._commit_jobs(run, [job], release=release)
                return
            if err.group.startswith(plans.BUSINESS_PREFIX):
                count = len(job.business)
                raise failures.business_error(
                    job.scope, job.checkpoint_id, job.task_id, err, count
                ) from err
            raise
        except InvalidInputError as err:
            if isinstance(job, jobs.WritesJob) and job.business:
                raise failures.invalid_business_write(
                    job.scope, job.task_id, job.node, err
                ) from err
            raise

    async def _commit_jobs(
        self, run: ActiveRun, batch: builtins.list[Any], *, release: bool
    ) -> None:
        scope = batch[0].scope
        version = runs.new_version()
        what = jobs.describe(batch)
        guard: runs.ThreadGuard | None = self._guard(scope, run, version, what, release=release)
        parts: builtins.list[Plan] = []
        for j in batch:  # the first one leads with the guard; hooks see each one
            if isinstance(j, jobs.PutJob):
                parts.append(
                    plans.put_plan(
                        self.target, j.scope, guard, j.docs, j.checkpoint_id, run=run.lease
                    )
                )
            else:
                parts.append(
                    plans.writes_plan(
                        self.target,
                        j.scope,
                        guard,
                        j.docs,
                        j.checkpoint_id,
                        j.task_id,
                        business=j.business,
                        run=run.lease,
                    )  # fmt: skip
                )
            guard = None
        async with run.lock:
            await self._commit(parts, scope, run, what)
            if release:
                run.released = True
                self.leases.untrack(run.lease)
            for j in batch:
                ns = j.scope.checkpoint_ns
                if isinstance(j, jobs.WritesJob):
                    self.cache.add_writes(
                        scope.tenant_id,
                        scope.thread_id,
                        ns,
                        j.checkpoint_id,
                        j.docs.kept,
                        overwrite=j.docs.overwrite,
                        version=version,
                    )
                elif j.docs.entry is not None:
                    self.cache.store(scope.tenant_id, scope.thread_id, ns, j.docs.entry, version)
                else:
                    self.cache.stamp(scope.tenant_id, scope.thread_id, version)
                self._job_done(run, j, None)

    @staticmethod
    def _job_done(
        run: ActiveRun, job: jobs.PutJob | jobs.WritesJob, error: BaseException | None
    ) -> None:
        """A queued save is committed (``error`` None) or never will be (once per job)."""
        if job.done:
            return
        job.done = True
        if isinstance(job, jobs.PutJob):
            run.put_ended(job.scope.checkpoint_ns, job.checkpoint_id, error)
        else:
            run.writes_ended(job.scope.checkpoint_ns)

    async def _wait_staged(
        self, scope: Scope, run: ActiveRun | None, parent_id: str, checkpoint_id: str
    ) -> None:
        """Wait until the parent's tasks that staged business writes are recorded."""
        staged = self._staged_of(run)
        key = (scope.tenant_id, scope.thread_id, parent_id)
        if not staged.pending(key):
            return
        if not await staged.signal.await_for(lambda: not staged.pending(key), self.timeout):
            raise TaskWriteError(
                f"Checkpoint {checkpoint_id!r} of thread {scope.thread_id!r} was not saved: the "
                f"writes of tasks of its parent {parent_id!r} that staged business writes were "
                f"not recorded within {self.timeout:g}s, and a checkpoint never commits before "
                f"the business writes of the tasks it includes. Nothing was written; resume the "
                f"thread (graph.invoke(None, config))."
            )

    async def _queues_writes(
        self, run: ActiveRun, scope: Scope, checkpoint_id: str, task_id: str
    ) -> bool:
        """ "async" durability: whether a task's writes (and the business writes it
        staged) go behind the run's queued saves instead of committing now. LangGraph
        does not wait for them; they must commit after the put of their checkpoint (they
        are queued once it is queued, saved, or made: the drainer orders them behind it),
        before (or with) the put of the next
        checkpoint (which takes them first), and before the run ends (its release waits
        for the queue). Not for graphs with DeltaChannels (LangGraph records their writes
        before their checkpoint), nor after a failed save (the direct path reports it)."""
        ns = scope.checkpoint_ns
        if not self._deferred(run, ns) or run.failure is not None or run.delta_channels(ns):
            return False

        def ready() -> bool:
            return run.is_saved(ns, checkpoint_id) or run.put_queued(ns, checkpoint_id)

        # LangGraph has made the put and hands it over in another thread: the drainer puts
        # the writes behind it (never waited for here, in LangGraph's thread)
        return ready() or run.expects(ns, checkpoint_id)

    async def _commit_put(self, run: ActiveRun | None, job: jobs.PutJob) -> None:  # writes'
        raise NotImplementedError
