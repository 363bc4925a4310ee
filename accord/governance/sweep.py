"""``accord governance sweep``: the retention rules a TTL index cannot express.

* **keep the latest N checkpoints per thread** (``[classes.checkpoint] retention.keep_latest``):
  for each thread namespace with more than N checkpoints, the older ones are deleted with
  their pending writes, and then the values and messages no remaining checkpoint
  references (the checkpointer's ``prune(keep=N)``: a kept checkpoint keeps everything it
  needs to be restored, whatever was written when);
* **expired threads** (the thread period of :mod:`accord.governance.retention`): threads
  whose run-registry ``expire_at`` passed (no commit since) and that no live run holds are
  deleted whole, with their recorded calls (the checkpointer's ``delete_expired``: each
  thread's deletion guarded so a commit that lands meanwhile wins);
* **expired audit records** (``[classes.audit] retention.expire_after``): each stream's
  prefix older than the period, up to what the newest digest committed to, is cut
  (:mod:`accord.governance.audit_cuts`).

Crash safety: each transaction is whole; a pass killed anywhere is finished by the next
(a prune interrupted before its values were collected is marked on the thread, and
collected first: :func:`_unfinished`). An expired thread is not pruned before it is
deleted (the prune's commit would stamp its expiry again).

Held threads (:mod:`accord.governance.holds`: the thread, its tenant, a thread class, or a
data subject their checkpoints' metadata names) are skipped; the kernel's hold guard
(:mod:`accord.governance.hold_guard`) refuses, inside the deleting transaction, any
deletion a hold placed meanwhile covers.

Bounded and paced, like LangGraph Platform's ``sweep_limit`` / ``sweep_interval_minutes``:
at most ``limit`` threads per rule per pass, at most ``batch`` documents per transaction
(several small threads share one), ``pause`` seconds between transactions so the runs
going on meanwhile keep their step latency. As a worker (``--interval``), a pass every
``interval`` seconds.

Everything is read and written through the kernel; the checkpointer is handed in by the
composition root (:func:`accord.runtime.sweep`), so this module does not import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from accord.errors import AccordError, InvalidInputError
from accord.governance.audit_cuts import cut_expired
from accord.governance.holding import list_holds, runs_collection, subject_held_threads
from accord.governance.holds import Holds
from accord.governance.policy import Policy
from accord.governance.retention import THREAD_CLASSES
from accord.platform import runs
from accord.platform.artifacts import CHECKPOINT, RUN
from accord.platform.context import Principal, ReadContext

__all__ = ["SweepReport", "sweep_once"]

OPERATION = "governance.sweep"
Progress = Callable[[str, int], None]


@dataclass
class SweepReport:
    """What one pass did."""

    pruned_threads: int = 0
    pruned_checkpoints: int = 0
    expired_threads: int = 0
    documents: int = 0
    held_skipped: int = 0
    #: threads whose interrupted prune left values to collect, collected now
    collected_threads: int = 0
    audit_streams: int = 0
    audit_records: int = 0
    #: audit streams whose expired prefix does not link: not cut (``accord audit verify``)
    audit_broken: list[str] = field(default_factory=list)
    #: cuts the kernel refused as not justified by the digests (each its message)
    audit_refused: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"kept the latest checkpoints of {self.pruned_threads} threads "
            f"({self.pruned_checkpoints} checkpoints removed), deleted {self.expired_threads} "
            f"expired threads ({self.documents} documents), cut {self.audit_records} expired "
            f"audit records from {self.audit_streams} streams, skipped {self.held_skipped} "
            f"held, in {self.seconds:.2f} s"
            + (
                f"; finished collecting the values of {self.collected_threads} threads "
                f"whose prune was interrupted"
                if self.collected_threads
                else ""
            )
            + (
                f"; {len(self.audit_broken)} audit streams were not cut because their chain "
                f"breaks (run `accord audit verify --live`)"
                if self.audit_broken
                else ""
            )
            + (
                f"; {len(self.audit_refused)} audit cuts were refused by the kernel: "
                f"{self.audit_refused[0]}"
                if self.audit_refused
                else ""
            )
        )


def _check(limit: int, batch: int, pause: float) -> None:
    for name, value in (("limit", limit), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"sweep {name} must be a whole number >= 1, got {value!r}")
    if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= 3600:
        raise InvalidInputError(f"sweep pause must be 0 to 3600 seconds, got {pause!r}")


def sweep_once(
    uow: Any,
    db: str,
    policy: Policy,
    saver: Any,
    *,
    limit: int = 1000,
    batch: int = 1000,
    pause: float = 0.0,
    progress: Progress | None = None,
    audit: Any = None,
    principal: Principal | None = None,
) -> SweepReport:
    """One pass over ``db`` (module docstring). ``saver``: a checkpointer on ``uow``'s
    database (``prune(threads, keep=N, tenant_id=T)``, ``delete_expired(pairs, batch=,
    pause=)``, ``pending_collection(limit=)`` and ``collect_garbage(threads,
    tenant_id=T)``: a prune killed after its checkpoints went, finished). ``audit``: a kernel with the audit hook on, acting as
    ``principal`` (an admin), that cuts the expired audit records (``audit_cuts.py``);
    None: the audit trail is not swept."""
    _check(limit, batch, pause)
    started = time.monotonic()
    report = SweepReport()
    held = Holds.of(list_holds(uow, db, policy))
    if not any(held.holds_class(c, None) for c in THREAD_CLASSES):  # else every thread is held
        _unfinished(uow, db, policy, saver, held, report, limit)
        _keep_latest(uow, db, policy, saver, held, report, limit, pause, progress)
        _expired(uow, db, policy, saver, held, report, limit, batch, pause, progress)
    if audit is not None and principal is not None:
        cut = cut_expired(
            audit, db, policy, held, principal=principal, limit=limit, batch=batch,
            progress=progress,
            pause=(lambda: time.sleep(pause)) if pause else None,
        )  # fmt: skip
        report.audit_streams, report.audit_records = cut.streams, cut.records
        report.audit_broken, report.audit_refused = cut.broken, cut.refused
        report.held_skipped += cut.held
    report.seconds = time.monotonic() - started
    return report


def _unfinished(
    uow: Any, db: str, policy: Policy, saver: Any, held: Holds, report: SweepReport, limit: int
) -> None:
    """Threads whose prune (or ``delete_for_runs``) was interrupted after some of their
    checkpoints went and before the values only those referenced were collected: the
    saver marked them, and collects now (a rerun of the prune would not: the thread has
    no more than N checkpoints left)."""
    marked = saver.pending_collection(limit=limit)
    by_subject = subject_held_threads(uow, db, policy, held, marked)
    for tenant, thread in marked:
        if held.holds_thread(tenant, thread) or (tenant, thread) in by_subject:
            continue
        try:
            report.collected_threads += saver.collect_garbage([thread], tenant_id=tenant)
        except AccordError:
            continue  # a hold placed since: the next pass


def _keep_latest(
    uow: Any, db: str, policy: Policy, saver: Any, held: Holds, report: SweepReport,
    limit: int, pause: float, progress: Progress | None,
) -> None:  # fmt: skip
    checkpoint = policy.of(CHECKPOINT.name)
    keep = checkpoint.retention.keep_latest if checkpoint is not None else None
    if keep is None:
        return
    collection = (checkpoint.collection if checkpoint else None) or str(
        CHECKPOINT.default_collection
    )
    over = uow.aggregate(ReadContext("*", operation=OPERATION), CHECKPOINT.name, db,
                         collection, [
        {"$group": {"_id": {"tenant": "$tenant_id", "thread": "$thread_id",
                            "ns": "$checkpoint_ns"}, "n": {"$sum": 1}}},
        {"$match": {"n": {"$gt": keep}}},
        {"$sort": {"n": -1}},
        {"$limit": limit},
    ])  # fmt: skip
    threads: dict[tuple[str, str], int] = {}
    for row in over:
        key = (row["_id"]["tenant"], row["_id"]["thread"])
        threads[key] = threads.get(key, 0) + int(row["n"]) - keep
    by_subject = subject_held_threads(uow, db, policy, held, list(threads))
    expired = _expired_among(uow, db, policy, list(threads))
    for (tenant, thread), extra in sorted(threads.items()):
        if held.holds_thread(tenant, thread) or (tenant, thread) in by_subject:
            report.held_skipped += 1
            continue
        if (tenant, thread) in expired:
            # deleted whole by the next rule; pruning it first would be a commit on the
            # thread, which stamps its expiry again: it would outlive its period
            continue
        if report.pruned_threads and pause:
            time.sleep(pause)
        try:
            saver.prune([thread], keep=keep, tenant_id=tenant)
        except AccordError:
            continue  # a live run holds it (or a hold placed since): the next pass
        report.pruned_threads += 1
        report.pruned_checkpoints += extra
        if progress is not None:
            progress("keep latest", 1)


def _expired_among(
    uow: Any, db: str, policy: Policy, threads: list[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The (tenant, thread) pairs among ``threads`` whose run-registry ``expire_at``
    passed and that no live run holds (what :func:`_expired` deletes)."""
    if not threads:
        return set()
    by_tenant: dict[str, list[str]] = {}
    for tenant, thread in threads:
        by_tenant.setdefault(tenant, []).append(thread)
    which = {"$and": [runs.expired(runs.now()), {"$or": [
        {"tenant_id": t, "thread_id": {"$in": sorted(ids)}} for t, ids in sorted(by_tenant.items())
    ]}]}  # fmt: skip
    found = uow.find(ReadContext("*", operation=OPERATION), RUN.name, db, runs_collection(policy),
                     which, projection={"tenant_id": 1, "thread_id": 1})  # fmt: skip
    return {(d["tenant_id"], d["thread_id"]) for d in found}


def _expired(
    uow: Any, db: str, policy: Policy, saver: Any, held: Holds, report: SweepReport,
    limit: int, batch: int, pause: float, progress: Progress | None,
) -> None:  # fmt: skip
    """Expired threads, in ``_id`` order of their run-registry documents, a page of at
    most ``batch`` threads at a time (a page's threads share transactions up to ``batch``
    documents)."""
    collection = runs_collection(policy)
    last: Any = None
    while report.expired_threads < limit:
        which: dict[str, Any] = runs.expired(runs.now())
        if last is not None:
            which = {"$and": [which, {"_id": {"$gt": last}}]}
        page = uow.find(ReadContext("*", operation=OPERATION), RUN.name, db, collection, which,
                        projection={"tenant_id": 1, "thread_id": 1}, sort=[("_id", 1)],
                        limit=min(batch, limit - report.expired_threads))  # fmt: skip
        if not page:
            return
        last = page[-1]["_id"]
        pairs = [(d["tenant_id"], d["thread_id"]) for d in page]
        by_subject = subject_held_threads(uow, db, policy, held, pairs)
        free = [p for p in pairs if not held.holds_thread(*p) and p not in by_subject]
        report.held_skipped += len(pairs) - len(free)
        if report.expired_threads and pause:
            time.sleep(pause)
        deleted, docs = saver.delete_expired(free, batch=batch, pause=pause)
        report.expired_threads += deleted
        report.documents += docs
        if progress is not None and deleted:
            progress("expired threads", deleted)
