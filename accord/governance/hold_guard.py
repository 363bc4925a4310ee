"""The legal-hold guard: no deletion of a held thread's data commits.

A kernel ``seal`` hook (docs/platform.md, "Hooks"). Every transaction that deletes a
thread's data (the checkpointer's ``delete_thread``, the retention sweep of expired
threads, ``prune`` and ``delete_for_runs``: the operations in :data:`DELETIONS`) reads,
in its own snapshot, the legal holds of its database and, when subject holds exist, the
thread's checkpoints that name a held subject. If a hold covers one of the threads the
transaction deletes, the hook raises :class:`~accord.errors.LegalHoldError` naming the
hold: the transaction is aborted before its deletes are sent, so nothing is deleted.

A hold covers a thread when it names the thread's tenant, the thread, a class of the
data the transaction deletes (``checkpoint``, ``short_term_memory``, ...), or a data
subject that the thread's checkpoints' metadata names (the ``checkpoint`` class's
``subject_fields``: ``metadata.user_id`` is the field ``meta.user_id`` of a checkpoint
document, its plain metadata).

Reading the holds inside the transaction (not the process's view of them, refreshed every
few seconds) is what makes the refusal exact: a hold committed before the deletion's
snapshot is always seen. A hold committed while the deletion's transaction runs is not in
its snapshot, so the two are made to **write-conflict** through fence documents
(:data:`FENCES`, one per tenant, ``_id`` the tenant, and one for the database, ``_id``
``"*"``): the deletion upserts its tenants' fences, and the database's when a tenant's
fence is not in its snapshot yet (the first deletion of that tenant); placing a hold
(:func:`hold_fence_ops`) upserts the database's fence and its tenant's (a hold by
tenant, thread, or a subject within a tenant), or every tenant's fence (a hold by class,
or a subject in every tenant). Whichever commits second meets a write conflict and is
retried; a retried deletion reads the hold and is refused. Deletions of one tenant
write one document, so concurrent ones are retried one after another. The subject values to look for are those of the holds read: a
hold the previous attempt did not know yet makes the attempt run again with it
(:class:`~accord.platform.hooks.SealConflict`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from accord.errors import InvalidInputError, LegalHoldError
from accord.governance.audit_cuts import CUT_ACTION
from accord.governance.holds import Hold
from accord.governance.policy import Policy
from accord.platform.artifacts import CHECKPOINT, HOLD, RUN
from accord.platform.hooks import SealBatch, SealConflict, SealRead
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "DELETIONS", "EVERY_TENANT", "FENCES", "HoldGuard", "checkpoint_subject_fields",
    "covering_hold", "hold_fence_ops",
]  # fmt: skip

#: The operations (a plan context's ``operation``) that delete a thread's data.
DELETIONS = frozenset(
    {"checkpoint.delete_thread", "checkpoint.prune", "checkpoint.delete_for_runs"}
)
_HOLDS = "hold-guard:holds:"
_SUBJECTS = "hold-guard:subjects:"
_FENCES = "hold-guard:fences:"
#: The fence documents (module docstring), of the ``hold`` class.
FENCES = "accord_hold_fences"
#: The ``_id`` of the database's fence.
EVERY_TENANT = "*"


def _touch(which: Any, *, many: bool = False) -> Op:
    change = {"$inc": {"n": 1}}
    return Op("update_many", which, change) if many else Op("update", which, change, upsert=True)


def hold_fence_ops(hold: Hold) -> list[Op]:
    """What placing ``hold`` writes to :data:`FENCES` in the same transaction (module
    docstring): a deletion running meanwhile that the hold covers then conflicts with it."""
    tenant = hold.value if hold.kind == "tenant" else hold.tenant_id
    ops = [_touch({"_id": EVERY_TENANT})]
    if hold.kind != "class" and tenant is not None:
        return [*ops, _touch({"_id": tenant})]
    return [*ops, _touch({"_id": {"$ne": EVERY_TENANT}}, many=True)]


def checkpoint_subject_fields(policy: Policy) -> tuple[str, ...]:
    """The fields of a checkpoint document that name a data subject: the ``checkpoint``
    class's ``subject_fields``, ``metadata.X`` being the plain metadata ``meta.X``."""
    cls = policy.of(CHECKPOINT.name)
    fields = cls.subject_fields if cls is not None else ()
    return tuple(
        "meta." + f.removeprefix("metadata.") if f.startswith("metadata.") else f for f in fields
    )


def covering_hold(
    holds: Sequence[Hold],
    tenant_id: str,
    thread_id: str,
    classes: Sequence[tuple[str, str]] = (),
    held_subjects: Sequence[str] = (),
) -> Hold | None:
    """The first of ``holds`` that covers thread ``thread_id`` of ``tenant_id``: by tenant,
    by thread, by one of ``classes`` ((artifact, collection) of the data deleted), or by a
    subject among ``held_subjects`` (the subject values the thread's checkpoints name)."""
    for hold in holds:
        if hold.kind == "tenant" and hold.value == tenant_id:
            return hold
        if hold.kind == "thread" and (hold.tenant_id, hold.value) == (tenant_id, thread_id):
            return hold
        if hold.kind == "class" and any(
            hold.value in (artifact, f"{artifact}:{collection}") for artifact, collection in classes
        ):
            return hold
        if (
            hold.kind == "subject"
            and hold.value in held_subjects
            and hold.tenant_id in (None, tenant_id)
        ):
            return hold
    return None


def _deletions(batch: SealBatch) -> list[Plan]:
    return [
        p for p in batch.plans
        if (p.context.operation in DELETIONS and p.context.thread_id)
        or p.context.operation == CUT_ACTION  # an audit stream's cut (audit_cuts.py)
    ]  # fmt: skip


def _db(plan: Plan) -> str | None:
    if plan.groups:
        return plan.groups[0].db
    guard = plan.context.guard
    return guard.db if guard is not None else None


class HoldGuard:
    """The seal hook (module docstring). ``policies``: the policy of a database (the one
    the policy hook enforces there), for the holds' collection and the subject fields."""

    name = "governance-hold-guard"

    def __init__(self, policies: Callable[[str], Policy]) -> None:
        self.policies = policies
        self._lock = threading.Lock()
        #: per database, the subject holds (tenant, value) the last attempt knew of
        self._subjects: dict[str, frozenset[tuple[str | None, str]]] = {}

    def _checkpoints(self, policy: Policy, plans: Sequence[Plan]) -> str:
        for plan in plans:
            for group in plan.groups:
                if group.artifact == CHECKPOINT.name:
                    return group.collection
        cls = policy.of(CHECKPOINT.name)
        return (cls.collection if cls is not None else None) or str(CHECKPOINT.default_collection)

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        by_db: dict[str, list[Plan]] = {}
        for plan in _deletions(batch):
            db = _db(plan)
            if db is not None:
                by_db.setdefault(db, []).append(plan)
        reads: list[SealRead] = []
        for db, plans in sorted(by_db.items()):
            policy = self.policies(db)
            cls = policy.of(HOLD.name)
            holds = (cls.collection if cls is not None else None) or str(HOLD.default_collection)
            reads.append(SealRead(_HOLDS + db, db, holds, {}))
            tenants = sorted({p.context.tenant_id for p in plans})
            reads.append(SealRead(_FENCES + db, db, FENCES, {"_id": {"$in": tenants}}))
            fields = checkpoint_subject_fields(policy)
            subjects = self._subjects.get(db, frozenset())
            if not fields or not subjects:
                continue
            values = sorted({value for _tenant, value in subjects})
            threads: dict[str, set[str]] = {}
            for plan in plans:
                if plan.context.thread_id:
                    threads.setdefault(plan.context.tenant_id, set()).add(plan.context.thread_id)
            if not threads:
                continue
            which = [
                {"tenant_id": tenant, "thread_id": {"$in": sorted(ids)}}
                for tenant, ids in sorted(threads.items())
            ]
            named = [{f: {"$in": values}} for f in fields]
            reads.append(SealRead(
                _SUBJECTS + db, db, self._checkpoints(policy, plans),
                {"$and": [{"$or": which}, {"$or": named}]},
            ))  # fmt: skip
        return reads

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        self._check(batch, found)
        fences: list[Group] = []
        by_db: dict[str, set[str]] = {}
        for plan in _deletions(batch):
            db = _db(plan)
            if db is not None:
                by_db.setdefault(db, set()).add(plan.context.tenant_id)
        for db, of_db in sorted(by_db.items()):
            tenants = sorted(of_db)
            present = {d.get("_id") for d in found.get(_FENCES + db, [])}
            ops = [_touch({"_id": t}) for t in tenants]
            if not set(tenants) <= present:  # a tenant's first fence: the database's too
                ops.append(_touch({"_id": EVERY_TENANT}))
            fences.append(Group(f"hold-guard:fences:{db}", db, FENCES, HOLD.name, ops))
        return fences

    def _check(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> None:
        for key, docs in found.items():
            if not key.startswith(_HOLDS):
                continue
            db = key[len(_HOLDS) :]
            holds = []
            for doc in docs:
                try:
                    holds.append(Hold.from_document(doc))
                except (KeyError, InvalidInputError):
                    continue  # malformed: the holds listing reports it
            subjects = frozenset((h.tenant_id, h.value) for h in holds if h.kind == "subject")
            with self._lock:
                known = self._subjects.get(db, frozenset())
                if not subjects <= known:
                    self._subjects[db] = known | subjects
            fields = checkpoint_subject_fields(self.policies(db))
            if fields and not subjects <= known:
                raise SealConflict("a subject hold this attempt did not look for")
            self._refuse(db, batch, holds, fields, found.get(_SUBJECTS + db, []))

    def _refuse(
        self, db: str, batch: SealBatch, holds: list[Hold], fields: Sequence[str],
        named: list[Any],
    ) -> None:  # fmt: skip
        if not holds:
            return
        by_thread: dict[tuple[str, str], set[str]] = {}
        for doc in named:
            values = by_thread.setdefault((doc.get("tenant_id"), doc.get("thread_id")), set())
            for field in fields:
                value: Any = doc
                for part in field.split("."):
                    value = value.get(part) if isinstance(value, Mapping) else None
                for v in value if isinstance(value, list) else [value]:
                    if isinstance(v, str):
                        values.add(v)
        for plan in _deletions(batch):
            if _db(plan) != db:
                continue
            tenant, thread = plan.context.tenant_id, plan.context.thread_id or ""
            classes = [(g.artifact, g.collection) for g in plan.groups if g.ops]
            guard = plan.context.guard
            if guard is not None:  # the thread's run-registry document goes too
                classes.append((RUN.name, guard.collection))
            hold = covering_hold(holds, tenant, thread, classes,
                                 sorted(by_thread.get((tenant, thread), ())))  # fmt: skip
            if hold is not None:
                what = f"thread {thread!r}" if thread else "the audit stream"
                raise LegalHoldError(
                    f"{what} of tenant {tenant!r} is under the legal hold "
                    f"{hold.describe()} ({hold.id}, placed by {hold.by or '?'}"
                    f"{': ' + hold.reason if hold.reason else ''}); nothing was deleted "
                    f"({plan.context.operation}). Release the hold first (accord governance "
                    f"release) if the deletion is lawful.",
                    hold=hold.describe(), hold_id=hold.id,
                )  # fmt: skip
