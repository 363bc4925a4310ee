# Generated from accord/checkpointers/asynchronous/saver_writes.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The checkpointer's writes: ``put`` (a checkpoint, its changed channel values and new
messages) and ``put_writes`` (a task's writes and the business writes it staged), each one
transaction through the kernel.

Generated from ``accord/checkpointers/asynchronous/saver_writes.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)

from accord.checkpointers import bridges, cache, failures, jobs, plans, storage, validation
from accord.checkpointers.base import validate_writes
from accord.checkpointers.ownership import ActiveRun, FailedTask
from accord.checkpointers.storage import BUSINESS_CHANNEL, Scope
from accord.checkpointers.synchronous.saver_queue import SaverQueue
from accord.errors import ConfigurationError, InvalidInputError, WriteRefused
from accord.platform import codes, runs

_IS_SYNC = True

#: Attempts of one put_writes (a task recorded before is re-recorded without its business
#: writes; a checkpoint still being saved is waited for once).
_ATTEMPTS = 3


class SaverWrites(SaverQueue):
    """``put`` and ``put_writes`` (see the module docstring)."""

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, its changed channel values and new messages in one
        transaction.

        Raises:
            ConcurrentRunError: another run holds the thread (or took it over from this
                one); nothing was written.
        """
        return self._put(config, checkpoint, metadata, new_versions)

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._capture_loop()
        return self._save_put(self._prepare_put(config, checkpoint, metadata, new_versions))

    def _prepare_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[jobs.PutJob, ActiveRun | None, bool]:
        """Validate and serialize a put, on the caller's thread and before anything waits:
        LangGraph keeps changing the objects it handed over (a fan-in barrier's set of
        seen nodes) once it moves on. The bridges call it before handing the save to the
        saver's loop or to a thread. Returns the job, the run it belongs to, and whether
        it is saved in the background ("async" durability)."""
        if isinstance(checkpoint, Mapping):
            checkpoint = jobs.detached(checkpoint)
        scope = self._scope(config)
        conf = validation.configurable(config)
        parent_id = validation.optional_identifier(conf.get("checkpoint_id"), "checkpoint_id")
        if not isinstance(checkpoint, Mapping):
            raise InvalidInputError("checkpoint must be a LangGraph Checkpoint (a dict).")
        checkpoint_id = validation.identifier(checkpoint.get("id"), "checkpoint['id']")
        metadata = get_serializable_checkpoint_metadata(config, metadata)
        run = self._run_of(scope, config)
        ns = scope.checkpoint_ns
        deferred = run is not None and self._deferred(run, ns)
        if deferred and run is not None and run.failure is not None:
            run.surfaced = True
            raise jobs.again(run.failure)
        parent = None
        if parent_id is not None:
            queued = run.queued.get(ns) if run is not None else None
            if deferred and queued is not None and queued.checkpoint_id == parent_id:
                parent = queued  # committed before this one, or this one is refused
            else:
                parent = self.cache.base(scope.tenant_id, scope.thread_id, ns, parent_id)
            if deferred and parent is not None and not parent.current:
                parent = None  # a queued put cannot be rebuilt later: no unsure base
        job = jobs.PutJob(
            scope,
            checkpoint_id,
            parent_id,
            self._build_put(
                scope, checkpoint, metadata, new_versions, parent_id, parent, share=run is not None
            ),
            (checkpoint, metadata, new_versions),
            parent,
        )
        return job, run, deferred

    def _save_put(self, prepared: tuple[jobs.PutJob, ActiveRun | None, bool]) -> RunnableConfig:
        """Commit a put made by :meth:`_prepare_put`, or queue it ("async" durability)."""
        job, run, deferred = prepared
        if deferred and run is not None:
            if self._queue_put(job, run):
                bridges.in_background(self._drain, run)
            return self._returned_config(job.scope, job.checkpoint_id)
        if run is not None:
            run.put_started(job.scope.checkpoint_ns)
        self._commit_put(run, job)
        return self._returned_config(job.scope, job.checkpoint_id)

    def _commit_put(self, run: ActiveRun | None, job: jobs.PutJob) -> None:
        scope, checkpoint_id, parent_id = job.scope, job.checkpoint_id, job.parent_id
        ns = scope.checkpoint_ns
        docs, parent = job.docs, job.parent
        what = f"save of checkpoint {checkpoint_id!r}"
        error: BaseException | None = None
        try:
            self._ensure_setup()
            if parent_id is not None:
                self._check_parent(run, job)
            for attempt in range(2):
                # a base this saver is not sure still exists (it does not hold the
                # thread): the put only commits with the parent stored, else it is
                # built again without the base
                unsure = parent is not None and (run is None or not parent.current)
                version = runs.new_version()
                plan = plans.put_plan(
                    self.target,
                    scope,
                    self._guard(scope, run, version, what),
                    docs,
                    checkpoint_id,
                    parent=plans.saved_guard(self.target, scope, parent_id, jobs.not_saved)
                    if unsure and parent_id is not None
                    else None,
                    run=run.lease if run is not None else None,
                )
                try:
                    with run.lock if run is not None else contextlib.nullcontext():
                        self._commit(plan, scope, run, what)
                        if docs.entry is not None:
                            self.cache.store(
                                scope.tenant_id,
                                scope.thread_id,
                                ns,
                                docs.entry,
                                version if run is not None else None,
                            )
                        elif run is not None:
                            self.cache.stamp(scope.tenant_id, scope.thread_id, version)
                        else:
                            self.cache.invalidate(scope.tenant_id, scope.thread_id)
                    break
                except jobs.NotSaved:
                    if attempt:
                        raise
                    parent = None
                    self.cache.invalidate(scope.tenant_id, scope.thread_id)
                    checkpoint, metadata, new_versions = job.source
                    docs = self._build_put(
                        scope, checkpoint, metadata, new_versions, parent_id, None, share=False
                    )
        except BaseException as exc:
            error = exc
            raise
        finally:
            if run is not None:
                run.put_ended(ns, checkpoint_id, error)

    def _build_put(
        self,
        scope: Scope,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        parent_id: str | None,
        parent: cache.Entry | None,
        *,
        share: bool,
    ) -> storage.PutDocs:
        return storage.build_put(
            scope,
            checkpoint,
            metadata,
            new_versions,
            parent_id,
            serde=self.serde,
            chunk_size=self.chunk_size,
            message_channels=self.message_channels,
            parent=parent,
            revisions=self._revisions,
            keep=self.cache.enabled,
            share=share,
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes, and apply the business writes it staged, in one
        transaction.

        Raises:
            BusinessWriteError: the database refused a staged business write; nothing of
                the task was committed.
            ConcurrentRunError: another run holds the thread; nothing was written.
        """
        self._put_writes(config, writes, task_id, task_path)

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._capture_loop()
        scope = self._scope(config)
        conf = validation.configurable(config)
        checkpoint_id = validation.identifier(conf.get("checkpoint_id"), "checkpoint_id")
        task_id = validation.identifier(task_id, "task_id")
        task_path = validation.identifier(task_path, "task_path", allow_empty=True)
        pairs = validate_writes(writes)
        if not pairs:
            return
        run = self._run_of(scope, config)
        ns = scope.checkpoint_ns
        failed_task = self._task_failed(pairs)
        docs = storage.build_writes(
            scope,
            checkpoint_id,
            pairs,
            task_id,
            task_path,
            serde=self.serde,
            chunk_size=self.chunk_size,
            failed=failed_task,
        )
        staged = [] if failed_task else [v for c, v in pairs if c == BUSINESS_CHANNEL]
        node = failures.node_of(pairs)
        if (
            run is not None
            and not failed_task
            and self._queues_writes(run, scope, checkpoint_id, task_id)
        ):
            self._queue_writes(run, scope, docs, checkpoint_id, task_id, staged, node)
            return
        error: BaseException | None = None
        try:
            self._ensure_setup()
            if staged:
                self._check_business(staged, scope)
            self._record_writes(scope, run, docs, checkpoint_id, task_id, staged, node)
        except BaseException as exc:
            error = exc
            raise
        finally:
            # a failure is recorded before the put waiting for this task wakes up
            if run is not None:
                failure = FailedTask(task_id, node, error) if error is not None else None
                run.task_failed(ns, checkpoint_id, failure, task_id)
            self._staged_of(run).done((scope.tenant_id, scope.thread_id, checkpoint_id), task_id)

    def _queue_writes(
        self,
        run: ActiveRun,
        scope: Scope,
        docs: storage.WriteDocs,
        checkpoint_id: str,
        task_id: str,
        staged: Sequence[Mapping[str, Any]],
        node: str | None,
    ) -> None:
        """ "async" durability: queue a task's writes, with the business writes it staged,
        behind the run's saves (see :meth:`_queues_writes`). Business writes are checked
        now (a refused target fails the task here); the put of the next checkpoint takes
        them before itself, so it never commits before them."""
        ns = scope.checkpoint_ns
        key = (scope.tenant_id, scope.thread_id, checkpoint_id)
        try:
            if staged:
                self._ensure_setup()
                self._check_business(staged, scope)
        except BaseException as exc:
            run.task_failed(ns, checkpoint_id, FailedTask(task_id, node, exc), task_id)
            self._staged_of(run).done(key, task_id)
            raise
        run.writes_queued(ns)
        run.task_failed(ns, checkpoint_id, None, task_id)
        job = jobs.WritesJob(scope, checkpoint_id, task_id, docs, staged, node)
        if run.enqueue(job):
            bridges.in_background(self._drain, run)
        self._staged_of(run).done(key, task_id)  # queued: the next put takes it first

    def _check_business(self, staged: Sequence[Any], scope: Scope) -> None:
        own = (plans.APPEND_EVENT, plans.COMMIT_ARTIFACT)  # accord's, not the application's
        names = [
            str(s.get("collection"))
            for s in staged
            if isinstance(s, Mapping) and s.get("op") not in own
        ]
        if self._reserved_stale(names):
            self._refresh_reserved()
        self._check_business_targets(staged, scope.tenant_id, scope.thread_id)

    def _record_writes(
        self,
        scope: Scope,
        run: ActiveRun | None,
        docs: storage.WriteDocs,
        checkpoint_id: str,
        task_id: str,
        staged: Sequence[Mapping[str, Any]],
        node: str | None,
    ) -> None:
        ns = scope.checkpoint_ns
        what = f"record of task {task_id!r}"
        # With DeltaChannels LangGraph saves a checkpoint only once its tasks' writes are
        # recorded, so those writes cannot wait for it.
        delta = run is not None and run.delta_channels(ns)
        if staged and delta:
            raise ConfigurationError(
                f"Task {task_id!r} of thread {scope.thread_id!r} staged business writes in a "
                f"graph with DeltaChannels: LangGraph records such a graph's task writes "
                f"before their checkpoint is saved, so business writes could be applied twice "
                f"after a crash. Nothing of the task was committed; stage business writes in "
                f"graphs without DeltaChannel."
            )
        if run is not None and not run.is_saved(ns, checkpoint_id):
            # "async" durability: the put of this checkpoint may still be in flight here,
            # or due (LangGraph's loop is running its tasks)
            expected = run.expects(ns, checkpoint_id) and not delta
            if expected or run.putting(ns):
                self._wait_for_put(scope, run, checkpoint_id, task_id, expected=expected)
        business = list(staged)
        for attempt in range(_ATTEMPTS):
            # Business writes commit only with their checkpoint stored, so that a crash can
            # never leave business writes of a task whose checkpoint a resume redoes (the
            # wait above makes that the usual order for every task write).
            saved = None
            if business and (run is None or not run.is_saved(ns, checkpoint_id)):
                saved = plans.saved_guard(self.target, scope, checkpoint_id, jobs.not_saved)
            version = runs.new_version()
            plan = plans.writes_plan(
                self.target,
                scope,
                self._guard(scope, run, version, what),
                docs,
                checkpoint_id,
                task_id,
                business=business,
                saved=saved,
                run=run.lease if run is not None else None,
            )
            try:
                with run.lock if run is not None else contextlib.nullcontext():
                    self._commit(plan, scope, run, what)
                    if run is not None:
                        run.mark_saved(ns, checkpoint_id)
                        self.cache.add_writes(
                            scope.tenant_id,
                            scope.thread_id,
                            ns,
                            checkpoint_id,
                            docs.kept,
                            overwrite=docs.overwrite,
                            version=version,
                        )
                    else:
                        self.cache.add_writes(
                            scope.tenant_id,
                            scope.thread_id,
                            ns,
                            checkpoint_id,
                            docs.kept,
                            overwrite=docs.overwrite,
                            version=None,
                        )
                return
            except WriteRefused as err:
                if err.group == plans.MARKS and err.code in codes.DUPLICATE_KEY_CODES:
                    # The task was recorded before (a replayed put_writes, a resumed run):
                    # its business writes were applied then. Exactly once: not again.
                    business = []
                    continue
                if err.group.startswith(plans.BUSINESS_PREFIX):
                    count = next((len(g.ops) for g in plan.groups if g.name == err.group), 1)
                    raise failures.business_error(
                        scope, checkpoint_id, task_id, err, count
                    ) from err
                raise
            except InvalidInputError as err:
                if business:
                    raise failures.invalid_business_write(scope, task_id, node, err) from err
                raise
            except jobs.NotSaved:
                if run is None or attempt == _ATTEMPTS - 1:
                    raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None) from None
                self._wait_for_put(scope, run, checkpoint_id, task_id, expected=True)

    def _wait_for_put(
        self,
        scope: Scope,
        run: ActiveRun,
        checkpoint_id: str,
        task_id: str,
        *,
        expected: bool = False,
    ) -> None:
        """Wait until ``run`` saved ``checkpoint_id`` (raising its put's error if that
        failed). Without ``expected``, stop waiting once no put of the run is in flight in
        the namespace; with it (the checkpoint is known missing), allow a short grace for
        a put LangGraph has submitted but not started (it chains saves one after the
        other), then raise."""
        ns = scope.checkpoint_ns
        deadline = time.monotonic() + self.timeout
        idle_since: float | None = None
        while True:
            if run.is_saved(ns, checkpoint_id):
                return
            put_error = run.put_error(ns, checkpoint_id)
            if put_error is not None:
                raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, put_error)
            now = time.monotonic()
            if run.putting(ns):
                idle_since = None
            elif not expected:
                return
            elif idle_since is None:
                idle_since = now
            elif now - idle_since > jobs.GRACE:
                raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None)
            if now > deadline:
                raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None)
            run.signal.wait_for(lambda: run.is_saved(ns, checkpoint_id), 0.05)
