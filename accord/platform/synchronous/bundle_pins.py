# Generated from accord/platform/asynchronous/bundle_pins.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Bundle pins: read and move the bundle a thread is pinned to, through the kernel.

The documents and rules are pure (:mod:`accord.platform.bundles`); this service runs them
on the thread's run-registry document. A pin is written with the free guard (it belongs
to no run: it is made before a run starts, or by a migration between runs), and only
while the pin is still the one its writer read, so two processes moving one pin at the
same time do not both succeed.

Generated from ``accord/platform/asynchronous/bundle_pins.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accord.errors import ConcurrentRunError
from accord.platform import bundles, runs
from accord.platform.artifacts import RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Counts, Expect, Group, Plan
from accord.platform.synchronous.unit_of_work import UnitOfWork

_IS_SYNC = True


class BundlePins:
    """The bundle pins of the run registry ``db.runs_collection``."""

    def __init__(self, uow: UnitOfWork, db: str, *, runs_collection: str = "runs") -> None:
        self.uow = uow
        self.db = db
        self.runs_collection = runs_collection

    def get(self, tenant_id: str, thread_id: str) -> tuple[bundles.Bundle | None, list[Any]]:
        """The bundle (tenant, thread) is pinned to (None: not pinned) and its history."""
        context = ReadContext(tenant_id=tenant_id, thread_id=thread_id, operation="bundle.read")
        doc = self.uow.find_one(
            context, RUN.name, self.db, self.runs_collection,
            {"_id": runs.run_doc_id(tenant_id, thread_id)},
            projection={"bundle": 1, "bundle_history": 1},
        )  # fmt: skip
        if doc is None or not doc.get("bundle"):
            return None, list((doc or {}).get("bundle_history") or [])
        return bundles.Bundle.of_document(doc["bundle"]), list(doc.get("bundle_history") or [])

    def pin(
        self,
        tenant_id: str,
        thread_id: str,
        bundle: bundles.Bundle,
        entry: Mapping[str, Any],
        *,
        expected: str | None,
    ) -> None:
        """Pin the thread to ``bundle`` (recording ``entry``), if its pin is still
        ``expected`` (a digest, None: unpinned); else ConcurrentRunError."""
        at = runs.now()
        guard = runs.ThreadGuard(
            self.db, self.runs_collection, "free", tenant_id, thread_id, runs.new_version(),
            at,
        )  # fmt: skip

        def moved(counts: Counts) -> BaseException:
            return ConcurrentRunError(
                f"the bundle pin of thread {thread_id!r} changed while it was being moved to "
                f"{bundle.version!r} (another process pinned or migrated it); nothing was "
                f"written. Run again: the thread's pin is checked anew."
            )

        plan = Plan(WriteContext(tenant_id=tenant_id, thread_id=thread_id,
                                 operation="bundle.pin", guard=guard, bundle=bundle.document()))  # fmt: skip
        plan.add(Group("bundle", self.db, self.runs_collection, RUN.name,
                       [bundles.pin_op(tenant_id, thread_id, bundle, entry, expected=expected)],
                       expect=Expect(matched=1, error=moved)))  # fmt: skip
        self.uow.execute(plan)
