"""The queue of runs: submit, read, wait for, cancel and resume runs; claim them (workers).

The documents and updates are pure (:mod:`accord.platform.queued_runs`); this service runs
them through the kernel, so the governance hooks (policy, audit) see every change of a
run like every other write. Workers (``accord worker``,
:mod:`accord.checkpointers.worker`) claim runs here and execute them; applications and
``accord runs`` submit, read, wait for, cancel and resume them::

    queue = app.runs()                                  # accord.runtime.Accord
    run = queue.submit("shop.graphs:checkout", {"cart": "c-1"}, idempotency_key="c-1")
    result = queue.wait(run.run_id, timeout=60)         # or RunFailed / RunTimeout
    queue.approve(run_id, True, by="user:ops")          # a run waiting in interrupt()

This module is the async source; its sync twin is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel

from accord.errors import (
    CredentialsExpired,
    InvalidInputError,
    RunFailed,
    RunStateError,
    RunTimeout,
    WriteRefused,
)
from accord.platform import codes, hosts, queued_runs
from accord.platform.artifacts import QUEUED_RUN
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Counts, Expect, Group, Op, Plan, insert_once
from accord.platform.queued_runs import Run

_IS_SYNC = False

#: Default lease of a claimed run: a worker renews it every ``lease / 3``.
DEFAULT_LEASE_SECONDS = 10.0
#: The tenant of runs submitted without one.
DEFAULT_TENANT = "default"

_GROUP = "queue"
#: Candidates one claim with a tenant limit looks at (each of another tenant, or taken
#: by another worker meanwhile) before it gives up until the next poll.
_CANDIDATES = 16
#: A claim's answer when the candidate's tenant is at its limit.
_FULL = object()


class _TenantFull(Exception):
    """Raised inside a claim's transaction (aborting it) when the tenant is at its limit;
    never leaves this module."""

    @classmethod
    def of(cls, counts: Counts) -> _TenantFull:
        return cls(f"{counts.matched} runs of the tenant running")


class AsyncRunQueue:
    """The runs of database ``db`` (collection ``collection``, default
    ``accord_run_queue``).

    Args:
        uow: the kernel (from :mod:`accord.runtime`).
        db: the database of the queue (and of the checkpointer the workers use).
        collection: the ``queued_run`` collection.
        codec: how inputs, resume values and results are stored (``dumps_typed`` /
            ``loads_typed``: LangGraph's serializer; :meth:`accord.runtime.Accord.runs`
            passes one). Without one they must be plain BSON data.
    """

    def __init__(
        self,
        uow: AsyncUnitOfWork,
        db: str,
        *,
        collection: str | None = None,
        codec: queued_runs.Codec | None = None,
    ) -> None:
        self.uow = uow
        self.db = db
        self.collection = collection or str(QUEUED_RUN.default_collection)
        self.codec = codec
        self._ready = False
        self._claims_docs: set[str] = set()  # tenants whose claims document exists

    async def setup(self) -> None:
        """Create the collection and its indexes, recorded in the catalog (idempotent)."""
        if self._ready:
            return
        indexes = [
            IndexModel(
                [
                    ("status", ASCENDING),
                    ("graph", ASCENDING),
                    ("priority", DESCENDING),
                    ("submitted_at", ASCENDING),
                ],
                name="claim",
            ),  # fmt: skip
            IndexModel(
                [("tenant_id", ASCENDING), ("status", ASCENDING), ("submitted_at", DESCENDING)],
                name="tenant_status",
            ),  # fmt: skip
            IndexModel([("tenant_id", ASCENDING), ("thread_id", ASCENDING)], name="thread"),
            IndexModel([("status", ASCENDING), ("wait.deadline", ASCENDING)], name="deadline"),
            # ended runs get ``expire_at`` from the policy's retention (kernel's retention
            # hook); the same index ``accord governance apply`` makes (name and shape)
            IndexModel([("expire_at", ASCENDING)], name="retention", expireAfterSeconds=0),
        ]
        await AsyncCatalog(self.uow, self.db).setup(
            "durable", {self.collection: QUEUED_RUN.name}, {self.collection: indexes}
        )
        self._ready = True

    # --- submitting --------------------------------------------------------------------

    async def submit(
        self,
        graph: str,
        input: Any = None,
        *,
        tenant_id: str = DEFAULT_TENANT,
        thread_id: str | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        bundle: Mapping[str, Any] | None = None,
        wait_timeout: float | None = None,
        on_timeout: str = "fail",
        timeout_value: Any = None,
        run_id: str | None = None,
        credentials: Mapping[str, datetime] | None = None,
    ) -> Run:
        """Queue a run of ``graph`` (``module:attribute``, what ``accord worker --graph``
        runs) with ``input`` on ``thread_id`` (default: a new thread named after the run).

        ``priority``: higher runs first. ``idempotency_key``: submitting the same key again
        (same tenant) returns the run the first submission made, whatever else differs,
        and starts nothing. ``wait_timeout``: how long a wait in ``interrupt()`` may last
        before ``on_timeout`` acts: ``fail`` (the run fails), ``cancel``, or ``resume``
        (resumed with ``timeout_value``). ``bundle``: recorded with the run (what it was
        submitted for). ``credentials``: name -> expiry (aware datetimes) of tokens the run
        holds: a run waiting for a human is not resumed once one expired, until it is
        refreshed (:meth:`refresh_credentials`). Returns the run (already queued,
        running or ended when the key was seen before)."""
        tenant_id = queued_runs.check_id(tenant_id, "tenant_id")
        graph = queued_runs.check_graph(graph)
        priority = queued_runs.check_priority(priority)
        key = queued_runs.check_key(idempotency_key)
        timeout = queued_runs.check_seconds(
            wait_timeout, "wait_timeout", at_most=queued_runs.MAX_WAIT_SECONDS
        )
        action = queued_runs.check_on_timeout(on_timeout)
        queued_runs.check_timeout_action(timeout, action, timeout_value)
        held = queued_runs.check_credentials(credentials)
        if bundle is not None and not isinstance(bundle, Mapping):
            raise InvalidInputError(
                f"bundle must be a mapping (a Bundle's document), got {bundle!r}"
            )
        if run_id is not None and key is not None:
            raise InvalidInputError(
                "give run_id or idempotency_key, not both (a key names its run)"
            )
        if key is not None:
            run_id = queued_runs.run_id_for_key(tenant_id, key)
        elif run_id is not None:
            run_id = queued_runs.check_id(run_id, "run_id")
        else:
            run_id = queued_runs.new_run_id()
        thread_id = queued_runs.check_id(
            thread_id if thread_id is not None else run_id, "thread_id"
        )
        return await self._insert(
            tenant_id, run_id, thread_id, graph, input, priority, key, bundle, timeout, action,
            timeout_value, None, held,
        )  # fmt: skip

    async def _insert(
        self,
        tenant_id: str,
        run_id: str,
        thread_id: str,
        graph: str,
        input: Any,
        priority: int,
        key: str | None,
        bundle: Mapping[str, Any] | None,
        timeout: float | None,
        action: str,
        timeout_value: Any,
        fork: Mapping[str, Any] | None,
        credentials: Mapping[str, datetime] | None = None,
    ) -> Run:
        await self.setup()
        doc = queued_runs.submit_doc(
            run_id=run_id, tenant_id=tenant_id, thread_id=thread_id, graph=graph,
            input=queued_runs.encode(input, self.codec, "the run's input"), priority=priority,
            idempotency_key=key, bundle=bundle, wait_timeout=timeout, on_timeout=action,
            timeout_value=queued_runs.encode(timeout_value, self.codec, "timeout_value")
            if action == "resume" else None,
            fork=fork, at=queued_runs.now(), credentials=credentials,
        )  # fmt: skip
        op = insert_once(doc) if key is not None else Op("insert", None, doc)
        try:
            await self._write(tenant_id, thread_id, "queue.submit", op)
        except WriteRefused as exc:
            if exc.code in codes.DUPLICATE_KEY_CODES:
                raise RunStateError(
                    f"a run with id {run_id!r} exists already; nothing was queued. Use another "
                    f"run id, or an idempotency key to submit a run at most once.",
                    run_id=run_id,
                    status=None,
                ) from None
            raise
        return await self.get(run_id, tenant_id=tenant_id)

    async def fork(
        self,
        run_id: str,
        *,
        tenant_id: str = DEFAULT_TENANT,
        checkpoint_id: str | None = None,
        thread_id: str | None = None,
        priority: int | None = None,
    ) -> Run:
        """A new run on a new thread (``thread_id``, default named after the new run)
        that continues run ``run_id``'s thread from ``checkpoint_id`` (default its latest
        checkpoint): the worker copies the thread's history to the new thread and runs
        from that checkpoint; the original thread and its history stay as they are."""
        source = await self.get(run_id, tenant_id=tenant_id)
        if checkpoint_id is not None:
            checkpoint_id = queued_runs.check_id(checkpoint_id, "checkpoint_id")
        new_id = queued_runs.new_run_id()
        thread = queued_runs.check_id(thread_id if thread_id is not None else new_id, "thread_id")
        if thread == source.thread_id:
            raise InvalidInputError("a fork runs on a new thread; give another thread_id")
        fork = {"run_id": source.run_id, "thread_id": source.thread_id,
                "checkpoint_id": checkpoint_id}  # fmt: skip
        doc = source.document
        return await self._insert(
            tenant_id, new_id, thread, source.graph, None,
            queued_runs.check_priority(priority) if priority is not None else source.priority,
            None, doc.get("bundle"), doc.get("wait_timeout"), doc.get("on_timeout") or "fail",
            queued_runs.decode(doc.get("timeout_value"), self.codec), fork,
        )  # fmt: skip

    # --- reading -----------------------------------------------------------------------

    async def get(self, run_id: str, *, tenant_id: str = DEFAULT_TENANT) -> Run:
        """The run ``run_id`` of ``tenant_id``; RunStateError when there is none."""
        doc = await self._find(tenant_id, queued_runs.check_id(run_id, "run_id"))
        if doc is None:
            raise RunStateError(
                f"no run {run_id!r} for tenant {tenant_id!r}; `accord runs ls` lists them",
                run_id=run_id, status=None,
            )  # fmt: skip
        return Run.of(doc)

    async def _find(self, tenant_id: str, run_id: str) -> Any:
        tenant_id = queued_runs.check_id(tenant_id, "tenant_id")
        context = ReadContext(tenant_id=tenant_id, operation="queue.read")
        return await self.uow.find_one(
            context, QUEUED_RUN.name, self.db, self.collection,
            {"_id": run_id, "tenant_id": tenant_id},
        )  # fmt: skip

    async def list(
        self,
        *,
        tenant_id: str = DEFAULT_TENANT,
        status: str | None = None,
        thread_id: str | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """The runs of ``tenant_id`` (of ``status``, of ``thread_id``), newest first."""
        tenant_id = queued_runs.check_id(tenant_id, "tenant_id")
        filt: dict[str, Any] = {"tenant_id": tenant_id}
        # the statuses of runs (not the tenant's claims document)
        filt["status"] = {"$in": builtins.list(queued_runs.STATUSES)}
        if status is not None:
            filt["status"] = queued_runs.check_status(status)
        if thread_id is not None:
            filt["thread_id"] = queued_runs.check_id(thread_id, "thread_id")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= 10_000:
            raise InvalidInputError(f"limit must be an integer from 1 to 10000, got {limit!r}")
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="queue.list")
        docs = await self.uow.find(
            context, QUEUED_RUN.name, self.db, self.collection, filt,
            projection={"input": 0, "result": 0, "timeout_value": 0},
            sort=[("submitted_at", -1)], limit=limit,
        )  # fmt: skip
        return [Run.of(d) for d in docs]

    async def result(self, run_id: str, *, tenant_id: str = DEFAULT_TENANT) -> Any:
        """The result of an ended run (the graph's final state values); RunFailed when it
        failed or was cancelled, RunStateError while it has not ended."""
        doc = await self._find(tenant_id, queued_runs.check_id(run_id, "run_id"))
        if doc is None:
            raise RunStateError(f"no run {run_id!r} for tenant {tenant_id!r}", run_id=run_id,
                                status=None)  # fmt: skip
        return self._outcome(doc)

    def _outcome(self, doc: Mapping[str, Any]) -> Any:
        status = doc.get("status")
        if status == queued_runs.DONE:
            return queued_runs.decode(doc.get("result"), self.codec)
        if status in (queued_runs.FAILED, queued_runs.CANCELLED):
            raise RunFailed(
                f"run {doc['_id']!r} {status}: {doc.get('error') or 'no reason recorded'}",
                run_id=str(doc["_id"]), status=str(status), error=doc.get("error"),
            )  # fmt: skip
        raise RunStateError(
            f"run {doc['_id']!r} has not ended (status {status!r}); wait for it",
            run_id=str(doc["_id"]), status=status,
        )  # fmt: skip

    async def wait(
        self,
        run_id: str,
        *,
        tenant_id: str = DEFAULT_TENANT,
        timeout: float | None = None,
        poll: float = 0.05,
    ) -> Any:
        """Wait until the run ends and return its result (RunFailed when it failed or was
        cancelled). ``timeout`` seconds (None: no bound): RunTimeout, the run goes on. A
        run waiting in ``interrupt()`` has not ended: the wait goes on until someone
        resumes it (or its deadline acts)."""
        run_id = queued_runs.check_id(run_id, "run_id")
        bound = queued_runs.check_seconds(timeout, "timeout")
        pause = queued_runs.check_seconds(poll, "poll") or 0.05
        deadline = None if bound is None else time.monotonic() + bound
        while True:
            doc = await self._find(tenant_id, run_id)
            if doc is None:
                raise RunStateError(f"no run {run_id!r} for tenant {tenant_id!r}",
                                    run_id=run_id, status=None)  # fmt: skip
            if doc.get("status") in queued_runs.FINAL:
                return self._outcome(doc)
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(
                    f"run {run_id!r} did not end within {bound:g} s (status "
                    f"{doc.get('status')!r}); it goes on: wait again, or cancel it",
                    run_id=run_id, status=doc.get("status"),
                )  # fmt: skip
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    # --- changing a run from outside ---------------------------------------------------

    async def cancel(
        self, run_id: str, *, tenant_id: str = DEFAULT_TENANT, by: str | None = None
    ) -> Run:
        """Cancel a run: a queued or waiting one at once; a running one at its next step
        (its worker stops it and records ``cancelled``). RunStateError once it ended."""
        run = await self.get(run_id, tenant_id=tenant_id)
        at = queued_runs.now()
        if run.status in (queued_runs.QUEUED, queued_runs.WAITING):
            filt = {"_id": run.run_id, "tenant_id": run.tenant_id, "status": run.status}
            if await self._change(run, filt, queued_runs.cancel_update(at, by), "queue.cancel"):
                return await self.get(run_id, tenant_id=tenant_id)
            return await self.cancel(run_id, tenant_id=tenant_id, by=by)  # it moved on: again
        if run.status == queued_runs.RUNNING:
            filt = {"_id": run.run_id, "tenant_id": run.tenant_id, "status": queued_runs.RUNNING}
            if await self._change(run, filt, queued_runs.cancel_request_update(at, by),
                                  "queue.cancel"):  # fmt: skip
                return await self.get(run_id, tenant_id=tenant_id)
            return await self.cancel(run_id, tenant_id=tenant_id, by=by)
        raise RunStateError(
            f"run {run_id!r} already ended ({run.status}); nothing to cancel",
            run_id=run_id, status=run.status,
        )  # fmt: skip

    async def resume(
        self,
        run_id: str,
        value: Any = None,
        *,
        tenant_id: str = DEFAULT_TENANT,
        by: str | None = None,
        decision: str = "resumed",
    ) -> Run:
        """Queue a run waiting in ``interrupt()`` again: a worker resumes it with
        ``Command(resume=value)``. RunStateError when the run is not waiting."""
        if decision not in ("resumed", "approved", "rejected"):
            raise InvalidInputError(
                f"decision must be resumed, approved or rejected, got {decision!r}"
            )
        if by is not None and not isinstance(by, str):
            raise InvalidInputError(f"by must be a string naming who decided, got {by!r}")
        run = await self.get(run_id, tenant_id=tenant_id)
        expired = queued_runs.expired_credentials(run.document, queued_runs.now())
        if expired and run.status == queued_runs.WAITING:
            raise self._expired(run, expired)
        stored = queued_runs.encode(value, self.codec, "the resume value")
        at = queued_runs.now()
        update = queued_runs.resume_update(stored, at, decision=decision, by=by)
        # a decision after the deadline is too late: the run's on_timeout has the last word
        filt = {**queued_runs.waiting_filter(run.run_id), "tenant_id": run.tenant_id,
                "$or": [{"wait.deadline": None}, {"wait.deadline": {"$gt": at}}]}  # fmt: skip
        if not await self._change(run, filt, update, f"queue.{decision}"):
            now = await self.get(run_id, tenant_id=tenant_id)
            deadline = (now.wait or {}).get("deadline")
            if now.status == queued_runs.WAITING and deadline is not None:
                await self._time_out(now.document, at)
                now = await self.get(run_id, tenant_id=tenant_id)
                raise RunStateError(
                    f"run {run_id!r} waited past its deadline ({deadline:%Y-%m-%d %H:%M:%S} "
                    f"UTC); nothing was {decision}: its on_timeout "
                    f"({now.document.get('on_timeout') or 'fail'}) applied, it is {now.status}",
                    run_id=run_id, status=now.status,
                )  # fmt: skip
            raise RunStateError(
                f"run {run_id!r} is {now.status}, not waiting; nothing was {decision}",
                run_id=run_id, status=now.status,
            )  # fmt: skip
        return await self.get(run_id, tenant_id=tenant_id)

    async def approve(
        self,
        run_id: str,
        value: Any = True,
        *,
        tenant_id: str = DEFAULT_TENANT,
        by: str | None = None,
    ) -> Run:
        """Approve a waiting run: resumed with ``value`` (default True)."""
        return await self.resume(run_id, value, tenant_id=tenant_id, by=by, decision="approved")

    async def reject(
        self,
        run_id: str,
        value: Any = False,
        *,
        tenant_id: str = DEFAULT_TENANT,
        by: str | None = None,
    ) -> Run:
        """Reject a waiting run: resumed with ``value`` (default False); the graph decides
        what a rejection does."""
        return await self.resume(run_id, value, tenant_id=tenant_id, by=by, decision="rejected")

    async def refresh_credentials(
        self,
        run_id: str,
        credentials: Mapping[str, datetime],
        *,
        tenant_id: str = DEFAULT_TENANT,
        by: str | None = None,
    ) -> Run:
        """Record new expiries of the run's credentials (the application refreshed the
        tokens); a run that waits can then be resumed. Only credentials the run was
        submitted with can be refreshed (InvalidInputError names the others)."""
        fresh = queued_runs.check_credentials(credentials) or {}
        if not fresh:
            raise InvalidInputError("give at least one credential to refresh")
        run = await self.get(run_id, tenant_id=tenant_id)
        if run.ended:
            raise RunStateError(f"run {run_id!r} already ended ({run.status})", run_id=run_id,
                                status=run.status)  # fmt: skip
        held = run.document.get("credentials") or {}
        unknown = sorted(set(fresh) - set(held))
        if unknown:  # a typo would leave the real credential expired and the run stuck
            raise InvalidInputError(
                f"run {run_id!r} holds no credential named {', '.join(unknown)} (it holds: "
                f"{', '.join(sorted(held)) or 'none'}); nothing was changed. Credentials are "
                f"declared when the run is submitted (credentials=, --credential)."
            )
        filt = {"_id": run.run_id, "tenant_id": run.tenant_id,
                "status": {"$nin": sorted(queued_runs.FINAL)}}  # fmt: skip
        update = queued_runs.credentials_update(fresh, queued_runs.now(), by)
        if not await self._change(run, filt, update, "queue.credentials"):
            return await self.refresh_credentials(run_id, credentials, tenant_id=tenant_id, by=by)
        return await self.get(run_id, tenant_id=tenant_id)

    @staticmethod
    def _expired(run: Run, expired: Mapping[str, datetime]) -> CredentialsExpired:
        named = ", ".join(f"{n} (expired {e.isoformat(timespec='seconds')})"
                          for n, e in sorted(expired.items()))  # fmt: skip
        return CredentialsExpired(
            f"run {run.run_id!r} holds credentials that expired while it waited: {named}; "
            f"nothing was resumed. Refresh them (RunQueue.refresh_credentials, `accord runs "
            f"refresh {run.run_id} --credential NAME=EXPIRY`), then resume it.",
            run_id=run.run_id, status=run.status, expired=dict(expired),
        )  # fmt: skip

    async def expire_waits(self, *, limit: int = 100) -> int:
        """Apply the timeout action of the waits whose deadline passed (workers call this
        as they poll); how many runs it moved."""
        at = queued_runs.now()
        context = ReadContext(tenant_id="*", operation="queue.deadlines")
        due = await self.uow.find(
            context, QUEUED_RUN.name, self.db, self.collection, queued_runs.expired_waits(at),
            projection={"input": 0, "result": 0}, limit=limit,
        )  # fmt: skip
        moved = 0
        for doc in due:
            moved += await self._time_out(doc, at)
        return moved

    async def _time_out(self, doc: Mapping[str, Any], at: datetime) -> bool:
        """Apply the run's ``on_timeout`` to its wait, whose deadline passed at ``at``."""
        run = Run.of(doc)
        action = doc.get("on_timeout") or "fail"
        since = (run.wait or {}).get("since")
        waited = f"the wait (since {since}) passed its deadline"
        if action == "resume":
            stored = doc.get("timeout_value") or queued_runs.encode(None, None, "")
            update = queued_runs.resume_update(stored, at, decision="resumed", by="deadline")
        elif action == "cancel":
            update = queued_runs.cancel_update(at, "deadline")
            update["$set"]["error"] = f"cancelled: {waited}"
        else:
            update = queued_runs.failed_update(f"{waited}", at)
        filt = {**queued_runs.waiting_filter(run.run_id), "wait.deadline": {"$lte": at}}
        return await self._change(run, filt, update, "queue.deadline")

    # --- workers -----------------------------------------------------------------------

    async def claim(
        self,
        graphs: builtins.list[str],
        worker: str,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        skip_tenants: builtins.list[str] | None = None,
        skip_runs: builtins.list[str] | None = None,
        tenant_limit: int | None = None,
    ) -> dict[str, Any] | None:
        """Claim the next run of ``graphs`` for ``worker``: a running run whose worker
        process is certainly dead (same machine) first, then the best queued run or
        running run whose lease expired. The claimed document (its ``fence`` fences
        every later write of this claim), or None.

        ``tenant_limit``: at most that many runs of one tenant running at once across
        every worker (the fleet): the claim is a transaction that counts the tenant's
        running runs (live leases) and writes the tenant's claims document, so two
        claims for one tenant conflict and the second sees the first's run; a tenant at
        its limit is skipped."""
        await self.setup()
        if tenant_limit is not None and (
            not isinstance(tenant_limit, int) or isinstance(tenant_limit, bool) or tenant_limit < 1
        ):
            raise InvalidInputError(
                f"tenant_limit must be a positive integer, got {tenant_limit!r}"
            )
        at = queued_runs.now()
        process = hosts.current()
        update = queued_runs.claim_update(process, worker, at, lease_seconds)
        full = builtins.list(skip_tenants or [])
        skip = builtins.list(skip_runs or [])
        dead = await self._dead_holder(graphs, at, full, skip)
        if dead is not None:
            filt = queued_runs.dead_claim_filter(dead["_id"], int(dead.get("fence") or 0))
            doc = await self._claim_one(filt, update, str(dead["tenant_id"]), tenant_limit, at)
            if doc is not None and doc is not _FULL:
                return doc  # type: ignore[return-value]
        if tenant_limit is None:
            filt = queued_runs.claim_filter(at, graphs, skip_tenants=full, skip_runs=skip)
            return await self._claim(filt, update, queued_runs.CLAIM_ORDER)
        context = ReadContext(tenant_id="*", operation="queue.claim")
        for _ in range(_CANDIDATES):
            filt = queued_runs.claim_filter(at, graphs, skip_tenants=full, skip_runs=skip)
            found = await self.uow.find(
                context, QUEUED_RUN.name, self.db, self.collection, filt,
                projection={"tenant_id": 1}, sort=queued_runs.CLAIM_ORDER, limit=1,
            )  # fmt: skip
            if not found:
                return None
            tenant = str(found[0]["tenant_id"])
            doc = await self._claim_one(
                {**filt, "_id": found[0]["_id"]}, update, tenant, tenant_limit, at
            )
            if doc is _FULL:
                full.append(tenant)
            elif doc is not None:
                return doc  # type: ignore[return-value]
            # else another worker took it first: the next candidate
        return None

    async def _claim_one(
        self,
        filt: dict[str, Any],
        update: dict[str, Any],
        tenant_id: str,
        limit: int | None,
        at: datetime,
    ) -> dict[str, Any] | object | None:
        """Claim the one run ``filt`` names; with a tenant ``limit``, in a transaction
        that counts the tenant's other live runs (``_FULL`` when it is at its limit)."""
        if limit is None:
            return await self._claim(filt, update, None)
        if tenant_id not in self._claims_docs:  # created outside the claims' transactions
            op = insert_once({"_id": queued_runs.claims_id(tenant_id),
                              **queued_runs.claims_update(tenant_id, at)["$setOnInsert"]})  # fmt: skip
            await self._write(tenant_id, queued_runs.CLAIMS_THREAD, "queue.claim", op)
            self._claims_docs.add(tenant_id)
        run_id = filt["_id"]
        claim = Op("find_one_and_update", filt, update)
        bump = Op("update", {"_id": queued_runs.claims_id(tenant_id)},
                  queued_runs.claims_update(tenant_id, at), upsert=True)  # fmt: skip
        # a count by a write that changes nothing (no conflict with the heartbeats)
        count = Op("update_many", queued_runs.live_runs(tenant_id, at, run_id),
                   {"$set": {"tenant_id": tenant_id}})  # fmt: skip
        plan = Plan(WriteContext(tenant_id="*", operation="queue.claim"), [
            Group(_GROUP, self.db, self.collection, QUEUED_RUN.name, [claim]),
            Group("tenant_claims", self.db, self.collection, QUEUED_RUN.name, [bump]),
            Group("tenant_running", self.db, self.collection, QUEUED_RUN.name, [count],
                  expect=Expect(_TenantFull.of, matched_at_most=limit - 1)),
        ])  # fmt: skip
        try:
            result = await self.uow.execute(plan)
        except _TenantFull:
            return _FULL
        found = result.found.get(_GROUP) or [None]
        return dict(found[0]) if found[0] is not None else None

    async def _dead_holder(
        self,
        graphs: builtins.list[str],
        at: Any,
        skip_tenants: builtins.list[str],
        skip_runs: builtins.list[str],
    ) -> Any:
        """A running run (live lease) held by a process of this machine that is gone."""
        machine = hosts.current().machine
        if machine is None:
            return None
        filt: dict[str, Any] = {
            "status": queued_runs.RUNNING, "graph": {"$in": graphs},
            "lease_expires": {"$gt": at}, "owner.holder_machine": machine,
        }  # fmt: skip
        if skip_tenants:
            filt["tenant_id"] = {"$nin": skip_tenants}
        if skip_runs:
            filt["_id"] = {"$nin": skip_runs}
        context = ReadContext(tenant_id="*", operation="queue.claim")
        held = await self.uow.find(
            context, QUEUED_RUN.name, self.db, self.collection, filt,
            projection={"owner": 1, "fence": 1, "tenant_id": 1}, limit=200,
        )  # fmt: skip
        for doc in held:
            owner = hosts.ProcessId.of_document(doc.get("owner"))
            if owner is not None and hosts.is_dead(owner):
                return doc
        return None

    async def _claim(
        self, filt: dict[str, Any], update: dict[str, Any], sort: Any
    ) -> dict[str, Any] | None:
        op = Op("find_one_and_update", filt, update, sort=sort)
        plan = Plan(WriteContext(tenant_id="*", operation="queue.claim"),
                    [Group(_GROUP, self.db, self.collection, QUEUED_RUN.name, [op])])  # fmt: skip
        result = await self.uow.execute(plan, transaction=False)
        found = result.found.get(_GROUP) or [None]
        return dict(found[0]) if found[0] is not None else None

    async def renew(
        self, doc: Mapping[str, Any], *, lease_seconds: float = DEFAULT_LEASE_SECONDS
    ) -> dict[str, Any] | None:
        """Extend the lease of the claim ``doc``; the run's document (to see a cancel
        request), or None when the claim was lost (taken over, cancelled)."""
        at = queued_runs.now()
        op = Op("find_one_and_update", queued_runs.mine(doc["_id"], int(doc["fence"])),
                queued_runs.renew_update(at, lease_seconds))  # fmt: skip
        plan = Plan(
            WriteContext(tenant_id=doc["tenant_id"], thread_id=doc["thread_id"],
                         operation="queue.renew"),
            [Group(_GROUP, self.db, self.collection, QUEUED_RUN.name, [op])],
        )  # fmt: skip
        result = await self.uow.execute(plan, transaction=False)
        found = result.found.get(_GROUP) or [None]
        return dict(found[0]) if found[0] is not None else None

    async def started(self, doc: Mapping[str, Any], base: str | None) -> bool:
        """Record the checkpoint the claim's first execution starts from."""
        return await self._mine(doc, queued_runs.started_update(base, queued_runs.now()))

    async def finished(self, doc: Mapping[str, Any], result: Any) -> bool:
        """The run ended with ``result`` (False: this claim no longer holds it)."""
        stored = queued_runs.encode(result, self.codec, "the run's result")
        return await self._mine(doc, queued_runs.done_update(stored, queued_runs.now()))

    async def failed(
        self, doc: Mapping[str, Any], error: str, *, status: str = queued_runs.FAILED
    ) -> bool:
        """The run failed (or, ``status="cancelled"``, was stopped on request)."""
        return await self._mine(doc, queued_runs.failed_update(error, queued_runs.now(),
                                                               status=status))  # fmt: skip

    async def waiting(
        self,
        doc: Mapping[str, Any],
        interrupts: builtins.list[dict[str, Any]],
        checkpoint_id: str | None,
        *,
        kind: str = "interrupt",
    ) -> bool:
        """The run waits in ``interrupt()`` (``kind="reconcile"``: for a human to settle a
        recorded call; resuming it runs it again): no worker holds it until it is resumed."""
        at = queued_runs.now()
        update = queued_runs.waiting_update(
            interrupts, checkpoint_id, at, doc.get("wait_timeout"), kind=kind
        )
        # a cancel asked for while it ran ends it here (a wait is a step boundary), not
        # after a human resumed it
        filt = {
            **queued_runs.mine(doc["_id"], int(doc["fence"])),
            "cancel_requested": {"$ne": True},
        }
        if await self._change(Run.of(doc), filt, update, "queue.worker"):
            return True
        return await self.cancelled(doc, "cancelled on request when it came to wait")

    async def cancelled(self, doc: Mapping[str, Any], reason: str) -> bool:
        """Record that the claimed run stopped on a cancel request (False: not this claim's)."""
        return await self.failed(doc, reason, status=queued_runs.CANCELLED)

    async def expired_credentials(self, doc: Mapping[str, Any]) -> CredentialsExpired | None:
        """A claimed run being resumed whose credentials expired during its pause goes
        back to waiting (nothing of it ran): the error saying so, else None."""
        expired = queued_runs.expired_credentials(doc, queued_runs.now())
        if not expired or doc.get("resume") is None:
            return None
        await self._mine(doc, queued_runs.rewait_update(expired, queued_runs.now()))
        return self._expired(Run.of(doc), expired)

    async def release(self, doc: Mapping[str, Any], reason: str) -> bool:
        """Give the claimed run back to the queue (not counted as an attempt)."""
        return await self._mine(doc, queued_runs.released_update(queued_runs.now(), reason))

    # --- helpers -----------------------------------------------------------------------

    async def _mine(self, doc: Mapping[str, Any], update: dict[str, Any]) -> bool:
        filt = queued_runs.mine(doc["_id"], int(doc["fence"]))
        return await self._change(Run.of(doc), filt, update, "queue.worker")

    async def _change(
        self, run: Run, filt: dict[str, Any], update: dict[str, Any], operation: str
    ) -> bool:
        """Apply ``update`` to the run if ``filt`` still matches; whether it did."""
        result = await self._write(run.tenant_id, run.thread_id, operation,
                                   Op("update", filt, update))  # fmt: skip
        return result[_GROUP].matched == 1

    async def _write(self, tenant_id: str, thread_id: str, operation: str, op: Op) -> Any:
        plan = Plan(
            WriteContext(tenant_id=tenant_id, thread_id=thread_id, operation=operation),
            [Group(_GROUP, self.db, self.collection, QUEUED_RUN.name, [op])],
        )
        return await self.uow.execute(plan, transaction=False)
