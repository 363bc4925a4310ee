"""``accord governance sweep``: the retention rules a TTL index cannot express.

* **keep the latest N checkpoints per thread** (``[classes.checkpoint] retention.keep_latest``):
  for each thread namespace with more than N checkpoints, the older ones are deleted with
  their pending writes, and then the values and messages no remaining checkpoint
  references (the checkpointer's ``prune(keep=N)``: a kept checkpoint keeps everything it
  needs to be restored, whatever was written when);
* **expired threads** (the thread period of :mod:`accord.governance.retention`): threads
  whose run-registry ``expire_at`` passed (no commit since) and that no live run holds are
  deleted whole (the checkpointer's ``sweep``, one transaction per thread, guarded so a
  commit that lands meanwhile wins).

Held threads (:mod:`accord.governance.holds`: the thread, its tenant, or a thread class)
are skipped: a hold took their expiry off, and keep-latest-N leaves them alone.

Everything is read and written through the kernel; the checkpointer is handed in by the
composition root (:func:`accord.runtime.sweep`), so this module does not import it.
Bounded: at most ``limit`` threads per kind of rule per pass. As a worker
(``--interval``), it runs a pass every ``interval`` seconds, like LangGraph Platform's
``sweep_interval_minutes`` / ``sweep_limit``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accord.errors import AccordError
from accord.governance.holding import list_holds
from accord.governance.holds import Holds
from accord.governance.policy import Policy
from accord.governance.retention import THREAD_CLASSES
from accord.platform.artifacts import CHECKPOINT
from accord.platform.context import ReadContext

__all__ = ["SweepReport", "sweep_once"]

OPERATION = "governance.sweep"


@dataclass
class SweepReport:
    """What one pass did."""

    pruned_threads: int = 0
    pruned_checkpoints: int = 0
    expired_threads: int = 0
    held_skipped: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"kept the latest checkpoints of {self.pruned_threads} threads "
            f"({self.pruned_checkpoints} checkpoints removed), deleted {self.expired_threads} "
            f"expired threads, skipped {self.held_skipped} held, in {self.seconds:.2f} s"
        )


def sweep_once(
    uow: Any,
    db: str,
    policy: Policy,
    saver: Any,
    *,
    limit: int = 1000,
    progress: Callable[[str, int], None] | None = None,
) -> SweepReport:
    """One pass over ``db`` (module docstring). ``saver``: a checkpointer on ``uow``'s
    database (``prune(threads, keep=N, tenant_id=T)`` and ``sweep()``)."""
    started = time.monotonic()
    report = SweepReport()
    held = Holds.of(list_holds(uow, db, policy))
    thread_classes_held = any(held.holds_class(c, None) for c in THREAD_CLASSES)
    checkpoint = policy.of(CHECKPOINT.name)
    keep = checkpoint.retention.keep_latest if checkpoint is not None else None
    collection = (checkpoint.collection if checkpoint else None) or str(
        CHECKPOINT.default_collection
    )
    if keep is not None and not thread_classes_held:
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
        for (tenant, thread), extra in sorted(threads.items()):
            if held.holds_thread(tenant, thread):
                report.held_skipped += 1
                continue
            try:
                saver.prune([thread], keep=keep, tenant_id=tenant)
            except AccordError:
                continue  # a live run holds it: the next pass
            report.pruned_threads += 1
            report.pruned_checkpoints += extra
            if progress is not None:
                progress("keep latest", 1)
    if not thread_classes_held:
        while report.expired_threads < limit:
            swept = saver.sweep()
            report.expired_threads += swept
            if progress is not None and swept:
                progress("expired threads", swept)
            if swept == 0:
                break
    report.seconds = time.monotonic() - started
    return report
