"""AsyncAccordSaver: the transactional LangGraph checkpointer on pymongo's ``AsyncMongoClient``.

Each ``put``/``put_writes`` is a plan (:mod:`accord.checkpointers.plans`) run by the
platform's unit of work in one transaction, led by the run-registry guard
(:mod:`accord.checkpointers.ownership`); a run claims its thread when LangGraph's loop
loads it, and releases it when the loop exits. The saver keeps the state it last
committed per thread (:mod:`accord.checkpointers.cache`) and serves reads from it while
it is current. See docs/checkpointer.md.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver.py``
(``AccordSaver``) is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pymongo
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from accord.checkpointers import (
    bridges,
    cache,
    failures,
    maintenance,
    ownership,
    plans,
    reads,
    schema,
    storage,
    validation,
)
from accord.checkpointers.base import AccordBase, validate_writes
from accord.checkpointers.ownership import ActiveRun, FailedTask
from accord.checkpointers.storage import BUSINESS_CHANNEL, Scope
from accord.errors import (
    AccordError,
    BusinessWriteError,
    ConcurrentRunError,
    ConfigurationError,
    DatabaseError,
    InvalidInputError,
    TaskWriteError,
    WriteRefused,
)
from accord.platform import codes, runs
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.logs import log_failure
from accord.platform.plan import Counts, Group, Op, Plan, PlanContext

_IS_SYNC = False

logger = logging.getLogger("accord.checkpointers")

# What differs between the twins (serving the other calling convention, locks, the lease
# heartbeat's thread or task) lives in accord.checkpointers.bridges, which is not generated.
_Bridge = bridges.AnswersAsyncCalls if _IS_SYNC else bridges.AnswersSyncCalls
_Ticker = bridges.ThreadTicker if _IS_SYNC else bridges.LoopTicker

#: Checkpoints per page of ``list`` (each page is hydrated with a constant number of queries).
_PAGE = 100
#: Cursor batch size of hydration reads: one round trip per query up to 16 MB of results.
_BATCH = 10_000
#: Attempts of one put_writes (a task recorded before is re-recorded without its business
#: writes; a checkpoint still being saved is waited for once).
_ATTEMPTS = 3
#: Queued saves of a run committed in one transaction, at most.
_BATCH_JOBS = 8
#: Driver sessions created at setup (see ``_warm_sessions``).
_WARM_SESSIONS = 4
#: How long task writes wait for the put of their checkpoint when none is in flight
#: (LangGraph submits a checkpoint's put before its tasks run, behind the previous put).
_GRACE = 2.0


class _NotSaved(AccordError):
    """Internal: the checkpoint of a task's writes is not stored (yet)."""


class AsyncAccordSaver(_Bridge, AccordBase):  # type: ignore[misc,valid-type]
    """The transactional LangGraph checkpointer: ``AsyncAccordSaver`` on pymongo's
    ``AsyncMongoClient`` (this source), ``AccordSaver`` on ``MongoClient`` (generated).

    Both answer LangGraph's sync and async methods: ``AsyncAccordSaver`` serves the sync
    ones from other threads on its event loop (a sync subgraph inside a node,
    ``asyncio.to_thread(graph.get_state, ...)``), ``AccordSaver`` the async ones in worker
    threads. Each ``put`` and ``put_writes`` is one MongoDB transaction (write concern
    majority, retried on transient errors, bounded by ``timeout``). See
    :class:`~accord.checkpointers.base.AccordBase` for the keyword arguments and
    docs/checkpointer.md for the storage model, ownership and guarantees, and the
    README for examples.
    """

    def __init__(
        self,
        client: AsyncMongoClient[Any],
        db_name: str = "accord",
        checkpoint_collection_name: str | None = None,
        writes_collection_name: str | None = None,
        ttl: int | float | None = None,
        serde: SerializerProtocol | None = None,
        *,
        uow: AsyncUnitOfWork | None = None,
        **kwargs: Any,
    ) -> None:
        # positional arguments in MongoDBSaver's order, so a call written for it works
        super().__init__(
            db_name=db_name,
            checkpoint_collection_name=checkpoint_collection_name,
            writes_collection_name=writes_collection_name,
            ttl=ttl,
            serde=serde,
            **kwargs,
        )
        self.client = client
        self.db = client[self.db_name]
        self.uow = uow or AsyncUnitOfWork(
            client, client_bulk=self._client_bulk, timeout=self.timeout
        )
        self.loop = bridges.running_loop()
        self._setup_done = False
        self._setup_lock = bridges.new_async_lock()
        self._next_sweep = 0.0
        self._heartbeat = _Ticker(
            lambda: self._renew_leases(), self.lease_seconds / 6, self._holds_runs
        )

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        db_name: str = "accord",
        checkpoint_collection_name: str | None = None,
        writes_collection_name: str | None = None,
        ttl: int | float | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AsyncAccordSaver]:
        """Connect, run :meth:`setup`, yield the saver, close the client on exit. The
        arguments are MongoDBSaver.from_conn_string's, in its order, plus the saver's
        keywords."""
        client: AsyncMongoClient[Any] = AsyncMongoClient(conn_string)
        try:
            saver = cls(
                client,
                db_name,
                checkpoint_collection_name,
                writes_collection_name,
                ttl,
                **kwargs,
            )
            await saver.setup()
            yield saver
        finally:
            await client.close()

    # --- setup -------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create the collections and indexes and record them in the catalog (idempotent,
        safe when several processes set up at once)."""
        self._capture_loop()
        names = self.collections
        indexes = {
            getattr(names, key): models for key, models in schema.index_models(names).items()
        }
        try:
            # bounded like every call (the catalog's own collection listing has no bound)
            with pymongo.timeout(self.timeout):
                await AsyncCatalog(self.uow, self.db_name).setup(
                    "checkpointer", names.owned(), indexes
                )
                await self._refresh_reserved()
                await self._warm_sessions()
        except PyMongoError as exc:
            raise failures.read_failed(exc, self.db_name, self.timeout) from exc
        self._setup_done = True
        if self.ttl is not None:
            self._heartbeat.ensure()  # sweeps expired threads

    async def _warm_sessions(self) -> None:
        """Fill the driver's session pool now: pymongo names every new server session
        with ``uuid.uuid4()``, and an application (or LangGraph's tests) that makes uuid4
        deterministic must see the same sequence with this saver as without it."""
        sessions = [self.client.start_session() for _ in range(_WARM_SESSIONS)]
        try:
            for session in sessions:
                await self.client.admin.command("ping", session=session)
        finally:
            for session in sessions:
                await session.end_session()

    async def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        async with self._setup_lock:
            if not self._setup_done:
                await self.setup()

    async def _refresh_reserved(self) -> None:
        catalog = AsyncCatalog(self.uow, self.business_db)
        self._set_reserved(await catalog.reserved())

    def _capture_loop(self) -> None:
        if not _IS_SYNC and self.loop is None:
            self.loop = bridges.running_loop()

    # --- reads -------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest when ``config`` has no ``checkpoint_id``).

        Served from memory when this saver knows it is current (its own run holds the
        thread, or the thread's registry version is the one it last wrote); otherwise a
        constant number of indexed queries, however long the thread. When LangGraph's
        loop calls it on entry, the run claims the thread first.
        """
        caller = ownership.calling_loop()
        return await self._get_tuple(config, caller)

    async def _get_tuple(self, config: RunnableConfig, caller: Any) -> CheckpointTuple | None:
        self._capture_loop()
        scope = self._scope(config)
        checkpoint_id = validation.optional_identifier(
            validation.configurable(config).get("checkpoint_id"), "checkpoint_id"
        )
        run = self._run_of(scope, config)
        if run is None and caller is not None and not getattr(caller, "is_nested", True):
            run = await self._claim(scope, config, caller)
        if run is not None and caller is not None:
            run.loops[scope.checkpoint_ns] = caller
        await self._settle(scope, scope.checkpoint_ns)
        if run is not None:
            current = run.lost is None
        else:
            current = await self._cache_is_current(scope, checkpoint_id)
        if current:
            entry = self.cache.lookup(
                scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id
            )
            if entry is not None:
                tup = cache.build_tuple(
                    entry,
                    thread_id=scope.thread_id,
                    ns=scope.checkpoint_ns,
                    serde=self.serde,
                    config_extra=self._config_extra(scope.tenant_id),
                    remember=self._remember if run is not None else None,
                )
                if tup is not None:
                    if run is not None:
                        run.mark_saved(scope.checkpoint_ns, entry.checkpoint_id)
                    return tup
        epoch = self.cache.epoch(scope.tenant_id, scope.thread_id) if current else None
        tup, entry = await self._read_checkpoint(
            scope, checkpoint_id, keep=self.cache.enabled, remember=run is not None
        )
        if tup is None:
            return None
        if run is not None:
            run.mark_saved(scope.checkpoint_ns, tup.checkpoint["id"])
        if entry is not None:
            # the registry version was read before the checkpoint: nothing newer hides
            self.cache.store_read(
                scope.tenant_id, scope.thread_id, scope.checkpoint_ns, entry, epoch
            )
        return tup

    async def _settle(self, scope: Scope, ns: str | None) -> None:
        """Read your own writes: wait for this saver's queued puts on the thread (in
        ``ns``, or any namespace) to commit before reading it. A subgraph called again
        loads the state its previous call saved; ``get_state`` after a step sees it."""
        for run in self._runs_on(scope):

            def settled(r: ActiveRun = run) -> bool:
                return r.settled(ns)

            if not settled():
                await run.signal.await_for(settled, self.timeout)

    async def _cache_is_current(self, scope: Scope, checkpoint_id: str | None) -> bool:
        """For a read that belongs to no run: whether the cached thread is current (one
        small read of the registry version, which also makes what is read next current
        at that version)."""
        if not self.cache.enabled:
            return False
        if checkpoint_id is not None and not self.cache.knows(scope.tenant_id, scope.thread_id):
            return False  # an addressed read of a thread this saver does not know
        filt, projection = runs.version_filter(scope.tenant_id, scope.thread_id)
        doc = await self._find_one(self.collections.runs, filt, projection=projection)
        version = doc.get("version") if doc is not None else None
        if self.cache.validate(scope.tenant_id, scope.thread_id, version):
            return True
        return version is not None

    async def _read_checkpoint(
        self, scope: Scope, checkpoint_id: str | None, *, keep: bool, remember: bool = False
    ) -> tuple[CheckpointTuple | None, cache.Entry | None]:
        """Read one checkpoint. ``remember``: the messages go to a run's loop, which never
        mutates them (LangGraph's rule): the next put need not hash them again. Messages
        handed to anyone else (``get_state``) are hashed again if they come back."""
        coll = self.collections.checkpoints
        if checkpoint_id is not None:
            doc = await self._find_one(
                coll, {"_id": scope.checkpoint_doc_id(checkpoint_id), "tenant_id": scope.tenant_id}
            )
        else:
            doc = await self._find_one(coll, scope.ns_filter, sort=[("checkpoint_id", -1)])
        if doc is None:
            return None, None
        batch = reads.ReadBatch(scope.tenant_id, [doc], self.serde)
        blob_docs, write_docs, message_docs = await self._fetch(batch)
        [(tup, entry)] = batch.assemble(
            blob_docs,
            write_docs,
            message_docs,
            lambda d: self._config_extra(d["tenant_id"]),
            keep=keep and checkpoint_id is None,
            remember=self._remember if remember else None,
        )
        return tup, entry

    async def _fetch(self, batch: reads.ReadBatch) -> tuple[list[Any], list[Any], list[Any]]:
        names = self.collections
        bf = batch.blobs_filter()
        blob_docs = await self._find_all(names.blobs, bf) if bf else []
        wf = batch.writes_filter()
        write_docs = await self._find_all(names.writes, wf) if wf else []
        cf = batch.chains_filter()
        if cf:
            blob_docs = reads.merge_docs(blob_docs, await self._find_all(names.blobs, cf))
        basef = batch.bases_filter(blob_docs)
        if basef:
            blob_docs = reads.merge_docs(blob_docs, await self._find_all(names.blobs, basef))
        mf = batch.messages_filter(blob_docs)
        message_docs = await self._find_all(names.messages, mf) if mf else []
        return blob_docs, write_docs, message_docs

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """List checkpoints, newest first, in pages of 100 (each page one query for the
        checkpoints and a constant number for their values, writes and messages)."""
        tenant = self.tenant_of(config)
        query = reads.list_query(tenant, config, filter, before)
        if isinstance(query.get("thread_id"), str):
            await self._settle(Scope(tenant, query["thread_id"], ""), None)
        remaining = validation.limit(limit)
        last: tuple[str, str] | None = None
        while remaining is None or remaining > 0:
            size = _PAGE if remaining is None else min(_PAGE, remaining)
            page = await self._find_all(
                self.collections.checkpoints,
                reads.after(query, last),
                sort=[("checkpoint_id", -1), ("_id", -1)],
                limit=size,
            )
            if not page:
                return
            batch = reads.ReadBatch(tenant, page, self.serde)
            blob_docs, write_docs, message_docs = await self._fetch(batch)
            for tup, _ in batch.assemble(
                blob_docs, write_docs, message_docs, lambda d: self._config_extra(d["tenant_id"])
            ):
                yield tup
            if len(page) < size:
                return
            last = (page[-1]["checkpoint_id"], page[-1]["_id"])
            if remaining is not None:
                remaining -= len(page)

    async def _find_one(self, collection: str, filt: Mapping[str, Any], **kwargs: Any) -> Any:
        try:
            with pymongo.timeout(self.timeout):
                return await self.db[collection].find_one(dict(filt), **kwargs)
        except PyMongoError as exc:
            raise failures.read_failed(exc, collection, self.timeout) from exc

    async def _find_all(
        self, collection: str, filt: Mapping[str, Any], **kwargs: Any
    ) -> builtins.list[Any]:
        try:
            with pymongo.timeout(self.timeout):
                cursor = self.db[collection].find(dict(filt), batch_size=_BATCH, **kwargs)
                return await cursor.to_list(None)
        except PyMongoError as exc:
            raise failures.read_failed(exc, collection, self.timeout) from exc

    # --- runs --------------------------------------------------------------------------

    async def _claim(self, scope: Scope, config: RunnableConfig, caller: Any) -> ActiveRun | None:
        """Claim the thread for the run LangGraph's loop is starting (see ownership)."""
        anchor = ownership.anchor_of(config)
        if anchor is None:
            return None  # a loop without a runtime: its calls are ad hoc
        await self._ensure_setup()
        run_id = (
            ownership.langgraph_run_id(getattr(caller, "config", None)) or ownership.mint_run_id()
        )
        at = runs.now()
        filt, update = runs.claim(
            scope.tenant_id,
            scope.thread_id,
            run_id,
            holder=self.holder,
            at=at,
            lease_seconds=self.lease_seconds,
            also_replace=self._ended_runs(scope),
        )
        plan = Plan(
            PlanContext(scope.tenant_id, scope.thread_id, operation="run.claim"),
            [
                self.target.group(
                    "claim", "runs", [Op("find_one_and_update", filt, update, upsert=True)]
                )
            ],
        )
        try:
            result = await self.uow.execute(plan, transaction=False)
        except WriteRefused as err:
            if err.code not in codes.DUPLICATE_KEY_CODES:
                raise
            holder = await self._holder(scope)
            raise ownership.held_by_another(scope.thread_id, holder, at=at) from None
        lease = runs.lease_from(result.found["claim"][0])
        run = ActiveRun(lease, anchor, bridges.new_async_lock())
        self._register(scope, run)
        self.cache.validate(scope.tenant_id, scope.thread_id, lease.version)
        bridges.on_loop_exit(caller, self._release, run, self._release_bridge())
        self._heartbeat.ensure()
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
                filt, update = runs.release(run.lease, at=runs.now())
                async with run.lock:
                    await self.uow.execute(
                        Plan(
                            PlanContext(
                                run.lease.tenant_id, run.lease.thread_id, operation="run.release"
                            ),
                            [self.target.group("release", "runs", [Op("update", filt, update)])],
                        ),
                        transaction=False,
                    )
                released = True
        except Exception as exc:
            log_failure(
                logger, logging.WARNING,
                "accord: could not release run %s on thread %s; its lease expires by itself",
                run.run_id, run.lease.thread_id, exc=exc,
            )  # fmt: skip
        finally:
            self._unregister(run, released=released)
        if run.failure is not None and not run.surfaced:
            run.surfaced = True
            raise _again(run.failure)

    def _holds_runs(self) -> bool:
        return self.ttl is not None or bool(self._held_runs())

    async def _renew_leases(self) -> None:
        """Heartbeat: renew the leases of held runs that did not commit for a while; with
        ``ttl``, sweep expired threads now and then."""
        if self.ttl is not None and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + min(self.ttl / 2, 60.0)
            await self.asweep()
        for run in self._held_runs():
            if run.ended or run.released or run.lost is not None:
                continue
            if time.monotonic() - run.renewed < self.lease_seconds / 3:
                continue
            filt, update = runs.renew(run.lease, at=runs.now(), lease_seconds=self.lease_seconds)
            plan = Plan(
                PlanContext(run.lease.tenant_id, run.lease.thread_id, operation="run.renew"),
                [self.target.group("renew", "runs", [Op("update", filt, update)])],
            )
            async with run.lock:
                if run.ended or run.released:
                    continue  # a renewal now would take the lease back
                result = await self.uow.execute(plan, transaction=False)
                if result["renew"].matched == 1:
                    run.renewed = time.monotonic()
                else:
                    scope = Scope(run.lease.tenant_id, run.lease.thread_id, "")
                    run.lost = await self._holder(scope)

    async def _holder(self, scope: Scope) -> runs.Holder:
        filt, projection = runs.version_filter(scope.tenant_id, scope.thread_id)
        return runs.holder_of(
            await self._find_one(self.collections.runs, filt, projection=projection)
        )

    def _guard(
        self,
        scope: Scope,
        run: ActiveRun | None,
        version: str,
        what: str,
        *,
        release: bool = False,
    ) -> Group:
        """The registry guard leading a commit (``release``: the run's last commit, which
        gives its lease back)."""
        at = runs.now()
        expire_at = at + timedelta(seconds=self.ttl) if self.ttl is not None else None
        if run is not None:
            lost = run

            def fenced(counts: Counts) -> BaseException:
                lost.lost = lost.lost or runs.Holder(None, None, 0, None)
                return ownership.fenced_out(scope.thread_id, lost.run_id, what, None)

            return plans.owner_guard(
                self.target,
                run.lease,
                version,
                at=at,
                lease_seconds=self.lease_seconds,
                refused=fenced,
                expire_at=expire_at,
                release=release,
            )

        def held(counts: Counts) -> BaseException:
            return ownership.adhoc_refused(scope.thread_id, what, runs.Holder(None, None, 0, None))

        return plans.free_guard(
            self.target, scope, version, at=at, refused=held, expire_at=expire_at
        )

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
            run.renewed = time.monotonic()

    # --- writes ------------------------------------------------------------------------

    async def aput(
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
        return await self._put(config, checkpoint, metadata, new_versions)

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._capture_loop()
        return await self._save_put(self._prepare_put(config, checkpoint, metadata, new_versions))

    def _prepare_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[_PutJob, ActiveRun | None, bool]:
        """Validate and serialize a put, on the caller's thread and before anything waits:
        LangGraph keeps changing the objects it handed over (a fan-in barrier's set of
        seen nodes) once it moves on. The bridges call it before handing the save to the
        saver's loop or to a thread. Returns the job, the run it belongs to, and whether
        it is saved in the background ("async" durability)."""
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
            raise _again(run.failure)
        parent = None
        if parent_id is not None:
            queued = run.queued.get(ns) if run is not None else None
            if deferred and queued is not None and queued.checkpoint_id == parent_id:
                parent = queued  # committed before this one, or this one is refused
            else:
                parent = self.cache.base(scope.tenant_id, scope.thread_id, ns, parent_id)
            if deferred and parent is not None and not parent.current:
                parent = None  # a queued put cannot be rebuilt later: no unsure base
        job = _PutJob(
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

    async def _save_put(self, prepared: tuple[_PutJob, ActiveRun | None, bool]) -> RunnableConfig:
        """Commit a put made by :meth:`_prepare_put`, or queue it ("async" durability)."""
        job, run, deferred = prepared
        if deferred and run is not None:
            if self._queue_put(job, run):
                bridges.in_background(self._drain, run)
            return self._returned_config(job.scope, job.checkpoint_id)
        if run is not None:
            run.put_started(job.scope.checkpoint_ns)
        await self._commit_put(run, job)
        return self._returned_config(job.scope, job.checkpoint_id)

    def _queue_put(self, job: _PutJob, run: ActiveRun) -> bool:
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
        return getattr(run.loops.get(ns), "durability", None) == "async"

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
                if isinstance(job, _PutJob) and _unsure(job):
                    job.done = True  # _commit_put ends it
                    await self._commit_put(run, job)
                    continue
                await self._ensure_setup()
                if isinstance(job, _PutJob) and job.parent_id is not None:
                    await self._check_parent(run, job)
                batch += run.more_jobs(lambda j: self._joins(run, j), _BATCH_JOBS - 1)
                await self._commit_queued(run, batch)
            except BaseException as exc:  # kept for the run's next put and its end
                run.failure = run.failure or exc
                for one in batch:
                    self._job_done(run, one, run.failure)

    def _joins(self, run: ActiveRun, job: _PutJob | _WritesJob) -> bool:
        """Whether a queued save may share the transaction of the saves before it: task
        writes always; a put unless it must wait for (or stop at) its parent's tasks."""
        if isinstance(job, _WritesJob) or job.parent_id is None:
            return True
        if _unsure(job):
            return False
        scope = job.scope
        key = (scope.tenant_id, scope.thread_id, job.parent_id)
        return not self._staged_of(run).pending(key) and (
            run.failed_task_of(scope.checkpoint_ns, job.parent_id) is None
        )

    async def _check_parent(self, run: ActiveRun | None, job: _PutJob) -> None:
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
        try:
            await self._commit_jobs(run, batch, release=run.last_batch())
        except (ConcurrentRunError, DatabaseError):
            raise  # the same for each one alone
        except Exception:
            if len(batch) == 1:
                raise
            for one in batch:
                await self._commit_jobs(run, [one], release=False)

    async def _commit_jobs(
        self, run: ActiveRun, batch: builtins.list[Any], *, release: bool
    ) -> None:
        scope = batch[0].scope
        version = runs.new_version()
        what = _what(batch)
        guard: Group | None = self._guard(scope, run, version, what, release=release)
        parts: builtins.list[Plan] = []
        for j in batch:  # the first one leads with the guard; hooks see each one
            if isinstance(j, _PutJob):
                parts.append(plans.put_plan(self.target, j.scope, guard, j.docs, j.checkpoint_id))
            else:
                parts.append(
                    plans.writes_plan(
                        self.target, j.scope, guard, j.docs, j.checkpoint_id, j.task_id
                    )
                )
            guard = None
        async with run.lock:
            await self._commit(parts, scope, run, what)
            if release:
                run.released = True
            for j in batch:
                ns = j.scope.checkpoint_ns
                if isinstance(j, _WritesJob):
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
    def _job_done(run: ActiveRun, job: _PutJob | _WritesJob, error: BaseException | None) -> None:
        """A queued save is committed (``error`` None) or never will be (once per job)."""
        if job.done:
            return
        job.done = True
        if isinstance(job, _PutJob):
            run.put_ended(job.scope.checkpoint_ns, job.checkpoint_id, error)
        else:
            run.writes_ended(job.scope.checkpoint_ns)

    async def _commit_put(self, run: ActiveRun | None, job: _PutJob) -> None:
        scope, checkpoint_id, parent_id = job.scope, job.checkpoint_id, job.parent_id
        ns = scope.checkpoint_ns
        docs, parent = job.docs, job.parent
        what = f"save of checkpoint {checkpoint_id!r}"
        error: BaseException | None = None
        try:
            await self._ensure_setup()
            if parent_id is not None:
                await self._check_parent(run, job)
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
                    parent=plans.saved_guard(self.target, scope, parent_id, _not_saved)
                    if unsure and parent_id is not None
                    else None,
                )
                try:
                    async with run.lock if run is not None else contextlib.nullcontext():
                        await self._commit(plan, scope, run, what)
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
                except _NotSaved:
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

    async def aput_writes(
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
        await self._put_writes(config, writes, task_id, task_path)

    async def _put_writes(
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
            and not staged
            and not failed_task
            and await self._queues_writes(run, scope, checkpoint_id, task_id)
        ):
            run.writes_queued(ns)
            run.task_failed(ns, checkpoint_id, None, task_id)
            if run.enqueue(_WritesJob(scope, checkpoint_id, task_id, docs)):
                bridges.in_background(self._drain, run)
            return
        error: BaseException | None = None
        try:
            await self._ensure_setup()
            if staged:
                await self._check_business(staged)
            await self._record_writes(scope, run, docs, checkpoint_id, task_id, staged, node)
        except BaseException as exc:
            error = exc
            raise
        finally:
            # a failure is recorded before the put waiting for this task wakes up
            if run is not None:
                failure = FailedTask(task_id, node, error) if error is not None else None
                run.task_failed(ns, checkpoint_id, failure, task_id)
            self._staged_of(run).done((scope.tenant_id, scope.thread_id, checkpoint_id), task_id)

    async def _queues_writes(
        self, run: ActiveRun, scope: Scope, checkpoint_id: str, task_id: str
    ) -> bool:
        """ "async" durability: whether a task's writes (without business writes) go
        behind the run's queued saves instead of committing now. LangGraph does not wait
        for them; they must commit after the put of their checkpoint (they are queued
        only once it is queued or saved) and before the run ends (its release waits for
        the queue). Not for graphs with DeltaChannels (LangGraph records their writes
        before their checkpoint), nor after a failed save (the direct path reports it),
        nor for a task that staged business writes."""
        ns = scope.checkpoint_ns
        if (
            not self._deferred(run, ns)
            or run.failure is not None
            or run.delta_channels(ns)
            or run.staged.noted((scope.tenant_id, scope.thread_id, checkpoint_id), task_id)
        ):
            return False

        def ready() -> bool:
            return run.is_saved(ns, checkpoint_id) or run.put_queued(ns, checkpoint_id)

        if ready():
            return True
        if not run.expects(ns, checkpoint_id):
            return False
        # LangGraph has made the put and hands it over in another thread: wait for it
        return await run.signal.await_for(ready, _GRACE)

    async def _check_business(self, staged: Sequence[Mapping[str, Any]]) -> None:
        if self._reserved_stale([str(s.get("collection")) for s in staged]):
            await self._refresh_reserved()
        self._check_business_targets(staged)

    async def _record_writes(
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
                await self._wait_for_put(scope, run, checkpoint_id, task_id, expected=expected)
        business = list(staged)
        for attempt in range(_ATTEMPTS):
            # Business writes commit only with their checkpoint stored, so that a crash can
            # never leave business writes of a task whose checkpoint a resume redoes (the
            # wait above makes that the usual order for every task write).
            saved = None
            if business and (run is None or not run.is_saved(ns, checkpoint_id)):
                saved = plans.saved_guard(self.target, scope, checkpoint_id, _not_saved)
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
            )
            try:
                async with run.lock if run is not None else contextlib.nullcontext():
                    await self._commit(plan, scope, run, what)
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
            except _NotSaved:
                if run is None or attempt == _ATTEMPTS - 1:
                    raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None) from None
                await self._wait_for_put(scope, run, checkpoint_id, task_id, expected=True)

    async def _wait_for_put(
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
            elif now - idle_since > _GRACE:
                raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None)
            if now > deadline:
                raise failures.unsaved_checkpoint(scope, checkpoint_id, task_id, None)
            await run.signal.await_for(lambda: run.is_saved(ns, checkpoint_id), 0.05)

    # --- maintenance -------------------------------------------------------------------

    async def adelete_thread(self, thread_id: str, *, tenant_id: str | None = None) -> None:
        """Delete every document of a thread (all namespaces). A run still working on the
        thread loses it (its next commit is refused). One transaction when the thread fits
        one; else the checkpoints go first (the thread reads as empty), then the rest in
        batches: re-running it after a crash finishes the job."""
        await self._delete_thread(self._scope_for(thread_id, tenant_id), expired_only=False)

    async def asweep(self) -> int:
        """With ``ttl``: delete the threads whose data expired (no write for ``ttl``
        seconds) and that no live run holds; returns how many. Savers with ``ttl`` run it
        in the background; call it to sweep now."""
        if self.ttl is None:
            return 0
        await self._ensure_setup()
        at = runs.now()
        expired = await self._find_all(
            self.collections.runs,
            runs.expired(at),
            projection={"tenant_id": 1, "thread_id": 1},
            limit=maintenance.BATCH,
        )
        swept = 0
        for doc in expired:
            scope = Scope(doc["tenant_id"], doc["thread_id"], "")
            try:
                await self._delete_thread(scope, expired_only=True)
                swept += 1
            except (plans.StillInUse, WriteRefused):
                continue  # written or claimed since: not expired any more
        return swept

    async def _delete_thread(self, scope: Scope, *, expired_only: bool) -> None:
        await self._ensure_setup()
        names = self.collections
        f = scope.thread_filter
        small = True
        for key in maintenance.THREAD_DATA:
            ids = await self._find_all(
                getattr(names, key), f, projection={"_id": 1}, limit=maintenance.BATCH + 1
            )
            small = small and len(ids) <= maintenance.BATCH
        deletes: list[tuple[str, dict[str, Any]]] = [
            ("checkpoints", f),
            ("outbox", {**f, "status": "pending"}),
        ]
        if small:
            deletes += [(key, f) for key in maintenance.THREAD_DATA[1:]]
        guard = plans.takeover_guard(
            self.target, scope, runs.new_version(), at=runs.now(), expired_only=expired_only
        )
        await self.uow.execute(
            plans.maintenance_plan(self.target, scope, guard, deletes, "checkpoint.delete_thread")
        )
        self.cache.drop(scope.tenant_id, scope.thread_id)
        if not small:
            for key in maintenance.THREAD_DATA[1:]:
                await self._delete_in_batches(
                    scope, key, f, "checkpoint.delete_thread", takeover=True
                )

    async def _delete_in_batches(
        self, scope: Scope, key: str, filt: dict[str, Any], operation: str, *, takeover: bool
    ) -> None:
        coll = getattr(self.collections, key)
        while True:
            docs = await self._find_all(coll, filt, projection={"_id": 1}, limit=maintenance.BATCH)
            if not docs:
                return
            ids = [d["_id"] for d in docs]
            version = runs.new_version()
            guard = (
                plans.takeover_guard(self.target, scope, version, at=runs.now())
                if takeover
                else self._guard(scope, None, version, operation)
            )
            plan = plans.maintenance_plan(
                self.target, scope, guard, [(key, {**filt, "_id": {"$in": ids}})], operation
            )
            if takeover:
                await self.uow.execute(plan)
            else:
                await self._commit(plan, scope, None, operation)
            self.cache.drop(scope.tenant_id, scope.thread_id)

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, *, tenant_id: str | None = None
    ) -> None:
        """Copy a thread's checkpoints, writes, values and messages to a new thread id
        (values first, checkpoints last, in batches: a checkpoint of the target is
        readable as soon as it exists). Refused if the target has checkpoints, or a run
        holds it."""
        src = self._scope_for(source_thread_id, tenant_id)
        dst = self._scope_for(target_thread_id, tenant_id)
        await self._ensure_setup()
        if await self._find_one(
            self.collections.checkpoints, dst.thread_filter, projection={"_id": 1}
        ):
            raise InvalidInputError(
                f"copy_thread: target thread {dst.thread_id!r} already has checkpoints; "
                f"delete it first."
            )
        what = f"copy of thread {src.thread_id!r}"
        for key in maintenance.COPY_ORDER:
            coll = getattr(self.collections, key)
            last: Any = None
            while True:
                filt = dict(src.thread_filter)
                if last is not None:
                    filt["_id"] = {"$gt": last}
                docs = await self._find_all(coll, filt, sort=[("_id", 1)], limit=maintenance.BATCH)
                if not docs:
                    break
                last = docs[-1]["_id"]
                copies = [maintenance.rekey(key, d, dst.thread_id) for d in docs]
                guard = self._guard(dst, None, runs.new_version(), what)
                plan = plans.maintenance_plan(
                    self.target, dst, guard, [], "checkpoint.copy_thread",
                    inserts=[(key, maintenance.replace_ops(copies))],
                )  # fmt: skip
                await self._commit(plan, dst, None, what)
        self.cache.drop(dst.tenant_id, dst.thread_id)

    async def adelete_for_runs(
        self, run_ids: Sequence[str], *, tenant_id: str | None = None
    ) -> None:
        """Delete the checkpoints (and their writes) created by the given runs, then the
        values and messages no remaining checkpoint of those threads references. Refused
        (ConcurrentRunError) for a thread a live run holds."""
        ids = validation.thread_ids(run_ids, "run_ids")
        tenant = (
            self.tenant_id if tenant_id is None else validation.identifier(tenant_id, "tenant_id")
        )
        if not ids:
            return
        await self._ensure_setup()
        doomed = await self._find_all(
            self.collections.checkpoints,
            {"tenant_id": tenant, "run_id": {"$in": ids}},
            projection={"thread_id": 1, "checkpoint_ns": 1, "checkpoint_id": 1},
        )
        for (thread_id, ns), cids in maintenance.by_scope(doomed).items():
            scope = Scope(tenant, thread_id, ns)
            await self._drop_checkpoints(scope, {"$in": sorted(cids)}, "checkpoint.delete_for_runs")

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        tenant_id: str | None = None,
    ) -> None:
        """Prune threads: ``"keep_latest"`` keeps the newest checkpoint per namespace (and
        its writes, values and messages); ``"delete"`` deletes the threads. Threads that
        use LangGraph ``DeltaChannel`` are skipped by ``keep_latest`` (their state needs
        the ancestors). Refused (ConcurrentRunError) for a thread a live run holds."""
        threads = validation.thread_ids(thread_ids)
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"prune strategy must be 'keep_latest' or 'delete', got {strategy!r}."
            )
        await self._ensure_setup()
        for thread_id in threads:
            if strategy == "delete":
                await self._delete_thread(self._scope_for(thread_id, tenant_id), expired_only=False)
                continue
            scope0 = self._scope_for(thread_id, tenant_id)
            docs = await self._find_all(
                self.collections.checkpoints, scope0.thread_filter, projection={"checkpoint_ns": 1}
            )
            for ns in sorted({d["checkpoint_ns"] for d in docs}):
                scope = Scope(scope0.tenant_id, thread_id, ns)
                latest = await self._find_one(
                    self.collections.checkpoints, scope.ns_filter, sort=[("checkpoint_id", -1)]
                )
                if latest is None or maintenance.uses_delta_channels(latest, self.serde):
                    continue
                await self._drop_checkpoints(
                    scope, {"$lt": latest["checkpoint_id"]}, "checkpoint.prune"
                )

    async def _drop_checkpoints(self, scope: Scope, which: dict[str, Any], operation: str) -> None:
        """Delete a namespace's checkpoints matching ``which`` (a ``checkpoint_id``
        condition) and their writes in one transaction, then collect what no remaining
        checkpoint references."""
        started = maintenance.gc_cutoff()
        deletes: list[tuple[str, dict[str, Any]]] = [
            ("writes", {**scope.ns_filter, "checkpoint_id": which}),
            ("checkpoints", {**scope.ns_filter, "checkpoint_id": which}),
        ]
        guard = self._guard(scope, None, runs.new_version(), operation)
        await self._commit(
            plans.maintenance_plan(self.target, scope, guard, deletes, operation),
            scope,
            None,
            operation,
        )
        names = self.collections
        remaining = await self._find_all(
            names.checkpoints, scope.ns_filter, projection={"blobs": 1}
        )
        links = {
            b["key"]: b.get("prev") or b.get("base")
            for b in await self._find_all(
                names.blobs,
                {**scope.ns_filter, "type": schema.MSGREFS_TYPE, "chunk": 0},
                projection={"key": 1, "prev": 1, "base": 1},
            )
        }
        keep_blobs = maintenance.referenced_blobs(remaining, links)
        refs: set[str] = set()
        for b in await self._find_all(
            names.blobs,
            {**scope.thread_filter, "type": schema.MSGREFS_TYPE},
            projection={"key": 1, "refs": 1, "checkpoint_ns": 1},
        ):
            if b.get("checkpoint_ns") != scope.checkpoint_ns or b["key"] in keep_blobs:
                refs.update(b.get("refs") or ())
        guard = self._guard(scope, None, runs.new_version(), operation)
        garbage = maintenance.garbage(scope, keep_blobs, refs, started)
        await self._commit(
            plans.maintenance_plan(self.target, scope, guard, garbage, operation),
            scope,
            None,
            operation,
        )
        self.cache.drop(scope.tenant_id, scope.thread_id)


def _not_saved(counts: Counts) -> BaseException:
    return _NotSaved()


class _WritesJob:
    """A task's writes (no business writes), serialized and queued ("async" durability)."""

    __slots__ = ("scope", "checkpoint_id", "task_id", "docs", "done")

    def __init__(
        self, scope: Scope, checkpoint_id: str, task_id: str, docs: storage.WriteDocs
    ) -> None:
        self.scope = scope
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.docs = docs
        self.done = False


class _PutJob:
    """A put, serialized: what committing it needs (and what to rebuild it from)."""

    __slots__ = ("scope", "checkpoint_id", "parent_id", "docs", "source", "parent", "done")

    def __init__(
        self,
        scope: Scope,
        checkpoint_id: str,
        parent_id: str | None,
        docs: storage.PutDocs,
        source: tuple[Checkpoint, CheckpointMetadata, ChannelVersions],
        parent: cache.Entry | None,
    ) -> None:
        self.scope = scope
        self.checkpoint_id = checkpoint_id
        self.parent_id = parent_id
        self.docs = docs
        self.source = source
        self.parent = parent
        self.done = False


def _unsure(job: _PutJob) -> bool:
    """A queued put whose base stopped being known current after it was queued (the
    cache lost track of the thread): committed alone, with its parent checked."""
    return job.parent is not None and not job.parent.current


def _what(batch: Sequence[_PutJob | _WritesJob]) -> str:
    """What queued saves are, for an error message."""
    checkpoints = [repr(j.checkpoint_id) for j in batch if isinstance(j, _PutJob)]
    tasks = [repr(j.task_id) for j in batch if isinstance(j, _WritesJob)]
    parts = []
    if checkpoints:
        parts.append(f"save of checkpoint{'s' * (len(checkpoints) > 1)} {', '.join(checkpoints)}")
    if tasks:
        parts.append(f"record of task{'s' * (len(tasks) > 1)} {', '.join(tasks)}")
    return " and ".join(parts)


def _again(error: BaseException) -> BaseException:
    """The failure of a queued put, raised again from a later call (a fresh exception
    of the same accord class when possible, chained to the original)."""
    if isinstance(error, BusinessWriteError):
        out: BaseException = error.copy()
    elif isinstance(error, AccordError):
        try:
            out = type(error)(str(error))
        except TypeError:
            out = error
    else:
        out = TaskWriteError(
            f"An earlier save of this run failed with {type(error).__name__}: {error}. Nothing "
            f"after the last saved checkpoint was written; resume the thread "
            f"(graph.invoke(None, config))."
        )
    if out is not error:
        out.__cause__ = error
    return out
