# Generated from accord/platform/asynchronous/call_log.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The call log: recorded tool and model calls, read and written through the kernel.

The documents, keys and decisions are pure (:mod:`accord.platform.calls`); this service
runs them: each write is one transaction of the kernel, led by the run's fence when the
call belongs to a run (:func:`accord.platform.calls.fence_group`), so the governance hooks
(policy, audit) see every recorded call like every other write. It knows nothing of
LangGraph: :mod:`accord.checkpointers.recorded` finds the call site in the running task.

Generated from ``accord/platform/asynchronous/call_log.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pymongo import ASCENDING, IndexModel

from accord.errors import ConcurrentRunError, WriteRefused
from accord.platform import calls, codes, queued_runs, runs
from accord.platform.artifacts import RECORDED_CALL, RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Counts, Expect, Group, Op, Plan, insert_once
from accord.platform.synchronous.catalog import Catalog
from accord.platform.synchronous.unit_of_work import UnitOfWork

_IS_SYNC = True

#: Name of the group holding a call's own write.
CALL_GROUP = "call"


def _changed(key: str) -> Any:
    def error(counts: Counts) -> BaseException:
        return ConcurrentRunError(
            f"recorded call {key} was settled by another run while this one made it; "
            f"nothing of this run's result was written. Reload the thread and retry."
        )

    return error


class CallLog:
    """The recorded calls of database ``db`` (collection ``collection``).

    Args:
        uow: the kernel (from :mod:`accord.runtime`).
        db: the database of the collection and of the run registry.
        collection: the ``recorded_call`` collection.
        runs_collection: the run registry, whose documents carry the runs' fences.
    """

    def __init__(
        self,
        uow: UnitOfWork,
        db: str,
        *,
        collection: str | None = None,
        runs_collection: str = "runs",
    ) -> None:
        self.uow = uow
        self.db = db
        self.collection = collection or str(RECORDED_CALL.default_collection)
        self.runs_collection = runs_collection
        self._ready = False

    def setup(self) -> None:
        """Create the collection and its indexes, recorded in the catalog (idempotent)."""
        if self._ready:
            return
        indexes = [
            IndexModel([("tenant_id", ASCENDING), ("status", ASCENDING)], name="status"),
            IndexModel([("tenant_id", ASCENDING), ("thread_id", ASCENDING)], name="thread"),
        ]
        Catalog(self.uow, self.db).setup(
            "durable", {self.collection: RECORDED_CALL.name}, {self.collection: indexes}
        )
        self._ready = True

    # --- reads ------------------------------------------------------------------------

    def get(self, site: calls.CallSite) -> dict[str, Any] | None:
        """The recorded document of ``site``, or None."""
        return self.find_key(site.tenant_id, site.thread_id, site.key)

    def find_key(self, tenant_id: str, thread_id: str | None, key: str) -> Any:
        """The recorded call ``key`` of ``tenant_id``, or None."""
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="calls.read")
        return self.uow.find_one(
            context, RECORDED_CALL.name, self.db, self.collection,
            {"_id": key, "tenant_id": tenant_id},
        )  # fmt: skip

    def unsettled(
        self, tenant_id: str, *, thread_id: str | None = None, parked_only: bool = False
    ) -> list[Any]:
        """Calls of ``tenant_id`` whose effect is unknown (parked ones only:
        ``parked_only``), oldest first: what ``accord runs calls`` lists."""
        statuses = [calls.PARKED] if parked_only else list(calls.UNSETTLED)
        tenant_id = queued_runs.check_id(tenant_id, "tenant_id")
        filt: dict[str, Any] = {"tenant_id": tenant_id, "status": {"$in": statuses}}
        if thread_id is not None:
            thread_id = queued_runs.check_id(thread_id, "thread_id")
            filt["thread_id"] = thread_id
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="calls.list")
        return self.uow.find(
            context, RECORDED_CALL.name, self.db, self.collection, filt,
            projection={"args": 0, "result": 0}, sort=[("intent_at", 1)],
        )  # fmt: skip

    def of_checkpoint(self, tenant_id: str, thread_id: str, checkpoint_id: str) -> list[Any]:
        """The recorded calls of the tasks that run from ``checkpoint_id``."""
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="calls.read")
        return self.uow.find(
            context, RECORDED_CALL.name, self.db, self.collection,
            {"tenant_id": tenant_id, "thread_id": thread_id, "checkpoint_id": checkpoint_id},
            sort=[("checkpoint_ns", 1), ("position", 1)],
        )  # fmt: skip

    def nested(self, tenant_id: str, thread_id: str, task_ns: str) -> int:
        """How many recorded calls were made inside subgraphs of the task ``task_ns``."""
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="calls.read")
        return self.uow.count(
            context, RECORDED_CALL.name, self.db, self.collection,
            {"tenant_id": tenant_id, "thread_id": thread_id,
             "checkpoint_ns": {"$regex": "^" + re.escape(task_ns + "|")}},
        )  # fmt: skip

    # --- writes -----------------------------------------------------------------------

    def carry(self, tenant_id: str, thread_id: str, docs: list[Mapping[str, Any]]) -> None:
        """Record ``docs`` (:func:`calls.carried` copies), once, in one transaction."""
        if not docs:
            return
        plan = Plan(WriteContext(tenant_id=tenant_id, thread_id=thread_id,
                                 operation="calls.carry"))  # fmt: skip
        plan.add(Group(CALL_GROUP, self.db, self.collection, RECORDED_CALL.name,
                       [insert_once(d) for d in docs]))  # fmt: skip
        self.uow.execute(plan)

    def intend(self, doc: Mapping[str, Any], lease: runs.Lease | None) -> bool:
        """Record the intent ``doc`` (:func:`calls.intent_doc`) before the call. False
        when the site has a record already (another execution of the task got there
        first: read it and decide again)."""
        try:
            self._write(doc["tenant_id"], doc["thread_id"], Op("insert", None, doc),
                              lease, "calls.intent")  # fmt: skip
        except WriteRefused as exc:
            if exc.group == CALL_GROUP and exc.code in codes.DUPLICATE_KEY_CODES:
                return False
            raise
        return True

    def finish(
        self, site: calls.CallSite, result: Mapping[str, Any], lease: runs.Lease | None
    ) -> None:
        """Record the result of the call at ``site`` (its serialized value)."""
        at = runs.now()
        self._write(
            site.tenant_id, site.thread_id, calls.result_op(site.key, result, at=at), lease,
            "calls.result", expect=Expect(matched=1, error=_changed(site.key)),
        )  # fmt: skip

    def failed(self, site: calls.CallSite, error: str, lease: runs.Lease | None) -> None:
        """Record that the call at ``site`` raised ``error``."""
        at = runs.now()
        self._write(site.tenant_id, site.thread_id,
                          calls.failure_op(site.key, error, at=at), lease, "calls.failed")  # fmt: skip

    def withdraw(self, site: calls.CallSite, lease: runs.Lease | None) -> None:
        """Remove the intent of the call at ``site`` (it paused with ``interrupt()``)."""
        self._write(site.tenant_id, site.thread_id, calls.withdraw_op(site.key), lease,
                          "calls.withdraw")  # fmt: skip

    def retrying(self, site: calls.CallSite, lease: runs.Lease | None) -> None:
        """The unsettled call at ``site`` is made again with its key."""
        at = runs.now()
        self._write(
            site.tenant_id, site.thread_id, calls.retry_op(site.key, lease=lease, at=at), lease,
            "calls.retry", expect=Expect(matched=1, error=_changed(site.key)),
        )  # fmt: skip

    def park(self, site: calls.CallSite, name: str, reason: str, lease: runs.Lease | None) -> None:
        """Park the unsettled call at ``site`` for a human, and mark the thread's
        run-registry document as parked on it (``parked``), in one transaction."""
        at = runs.now()
        mark = Group("parked", self.db, self.runs_collection, RUN.name,
                     [calls.run_parked_op(site.tenant_id, site.thread_id, site.key, name, at=at)])  # fmt: skip
        self._write(site.tenant_id, site.thread_id,
                          calls.park_op(site.key, reason, at=at), lease, "calls.park",
                          extra=mark)  # fmt: skip

    def diverged(self, site: calls.CallSite, args_digest: str, lease: runs.Lease | None) -> None:
        """Count a re-execution of ``site`` whose arguments differ from the recorded."""
        at = runs.now()
        self._write(site.tenant_id, site.thread_id,
                          calls.divergence_op(site.key, args_digest, at=at), lease,
                          "calls.divergence")  # fmt: skip

    def resolve(
        self,
        tenant_id: str,
        thread_id: str,
        key: str,
        result: Mapping[str, Any],
        *,
        by: str,
    ) -> None:
        """Settle an unsettled call with the result it had (a human checked the provider):
        re-executions of its task replay it. Belongs to no run (no fence)."""
        tenant_id = queued_runs.check_id(tenant_id, "tenant_id")
        thread_id = queued_runs.check_id(thread_id, "thread_id")
        key = queued_runs.check_id(key, "key")  # never an operator: it names one call
        at = runs.now()

        def missing(counts: Counts) -> BaseException:
            return ConcurrentRunError(
                f"recorded call {key} of thread {thread_id!r} (tenant {tenant_id!r}) is not "
                f"unsettled (it was resolved already, or no such call of that thread "
                f"exists); nothing was written."
            )

        unmark = Group("parked", self.db, self.runs_collection, RUN.name,
                       [calls.run_unparked_op(tenant_id, thread_id, key)])  # fmt: skip
        self._write(tenant_id, thread_id, calls.resolve_op(key, result, by=by, at=at, tenant_id=tenant_id,
                                                           thread_id=thread_id),
                          None, "calls.resolve", expect=Expect(matched=1, error=missing),
                          extra=unmark)  # fmt: skip

    def _write(
        self,
        tenant_id: str,
        thread_id: str,
        op: Op,
        lease: runs.Lease | None,
        operation: str,
        *,
        expect: Expect | None = None,
        extra: Group | None = None,
    ) -> None:
        plan = Plan(WriteContext(tenant_id=tenant_id, thread_id=thread_id,
                                 operation=operation, run=lease))  # fmt: skip
        if lease is not None:
            # a result or a failure follows a call that was made: its refusal says so
            after_call = operation in ("calls.result", "calls.failed")
            plan.add(calls.fence_group(self.db, self.runs_collection, lease, at=runs.now(),
                                       after_call=after_call))  # fmt: skip
        plan.add(Group(CALL_GROUP, self.db, self.collection, RECORDED_CALL.name, [op],
                       expect=expect))  # fmt: skip
        if extra is not None:
            plan.add(extra)
        self.uow.execute(plan)
