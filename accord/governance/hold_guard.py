"""The legal-hold guard: no deletion of a held thread's data commits.

A kernel ``seal`` hook (docs/platform.md, "Hooks"). Every transaction that deletes a
thread's data (the checkpointer's ``delete_thread``, the retention sweep of expired
threads, ``prune`` and ``delete_for_runs``: the operations in :data:`DELETIONS`) reads,
in its own snapshot, the legal holds of its database and, when subject holds exist, the
thread's checkpoints that name a held subject. If a hold covers one of the threads the
transaction deletes, the hook raises :class:`~accord.errors.LegalHoldError` naming the
hold: the transaction is aborted before its deletes are sent, so nothing is deleted.

A hold covers a thread when it names the thread's tenant, the thread, a class of a
thread's data (:data:`THREAD_DATA_CLASSES`: ``checkpoint``, ``short_term_memory``, ...;
whichever collections the transaction deletes from: a prune's first transaction deletes
no messages, yet a hold on ``short_term_memory`` holds every thread, as the sweep and the
retention hook read it), another class the transaction deletes from (pending ``outbox``
events), or a data subject that the thread's checkpoints' metadata names (the
``checkpoint`` class's ``subject_fields``: ``metadata.user_id`` is the field
``meta.user_id`` of a checkpoint document, its plain metadata).

The aggregator's forgetting of a deleted thread's long-term memories (:data:`FORGET`)
leaves the memories a hold covers (``accord.memory.asynchronous.forgetting``); this hook
refuses its transaction if it still writes a memory a hold covers (by tenant, by class
``long_term_memory``, ``memory_history`` or ``memory_vector``, or a subject the memory's
or its history versions' ``subject_fields`` name: read in the snapshot, as for threads):
a hold placed after the forgetter read them; the forgetter then decides again. It writes
the tenant's fence as a deletion does, so that a hold placed meanwhile conflicts.

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
from accord.governance.holds import Hold, value_at
from accord.governance.policy import Policy
from accord.platform.artifacts import (
    CHECKPOINT,
    CLASSES,
    HOLD,
    LONG_TERM_MEMORY,
    MEMORY_HISTORY,
    MEMORY_VECTOR,
    QUEUED_RUN,
    RUN,
)  # fmt: skip
from accord.platform.hooks import SealBatch, SealConflict, SealRead
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "DELETIONS", "EVERY_TENANT", "FENCES", "FORGET", "MEMORY_CLASSES", "THREAD_DATA_CLASSES",
    "HoldGuard", "checkpoint_subject_fields", "covering_hold", "hold_fence_ops",
]  # fmt: skip

#: The operations (a plan context's ``operation``) that delete a thread's data.
DELETIONS = frozenset(
    {"checkpoint.delete_thread", "checkpoint.prune", "checkpoint.delete_for_runs"}
)
#: The aggregator's forgetting of a deleted thread's long-term memories.
FORGET = "memory.forget_thread"
#: The classes of a thread's data (every thread-scoped class but the queue's runs, which
#: expire on their own and go with no thread deletion): a class hold on any of them holds
#: every thread, so every operation of :data:`DELETIONS` is refused at its first
#: transaction, whatever collections that transaction deletes from.
THREAD_DATA_CLASSES = frozenset(
    c.name for c in CLASSES.values() if c.thread_scoped and c.name != QUEUED_RUN.name
)
#: The classes :data:`FORGET` writes (a memory's vectors go with it).
MEMORY_CLASSES = frozenset({LONG_TERM_MEMORY.name, MEMORY_HISTORY.name, MEMORY_VECTOR.name})
_HOLDS = "hold-guard:holds:"
_SUBJECTS = "hold-guard:subjects:"
_FENCES = "hold-guard:fences:"
_MEMORIES = "hold-guard:memories:"
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
    by thread, by a class of a thread's data (:data:`THREAD_DATA_CLASSES`, whatever the
    transaction deletes; not for an audit cut, ``thread_id`` empty) or one of ``classes`` ((artifact, collection) of the data
    deleted), or by a subject among ``held_subjects`` (the subject values the thread's
    checkpoints name)."""
    for hold in holds:
        if hold.kind == "tenant" and hold.value == tenant_id:
            return hold
        if hold.kind == "thread" and (hold.tenant_id, hold.value) == (tenant_id, thread_id):
            return hold
        if hold.kind == "class" and (
            (thread_id and hold.value in THREAD_DATA_CLASSES)
            or any(
                hold.value in (artifact, f"{artifact}:{collection}")
                for artifact, collection in classes
            )
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
        or p.context.operation == FORGET  # a deleted thread's memories (module docstring)
    ]  # fmt: skip


def covering_memory_hold(
    holds: Sequence[Hold], tenant_id: str, plan: Plan, held_subjects: Sequence[str] = ()
) -> Hold | None:
    """The first of ``holds`` that covers what a :data:`FORGET` plan writes to long-term
    memory: by tenant, by class, or by a subject among ``held_subjects`` (the held
    values the written memories and their history name, read in the snapshot)."""
    written = {g.artifact for g in plan.groups if g.ops and g.artifact in MEMORY_CLASSES}
    if LONG_TERM_MEMORY.name in written:
        written.add(MEMORY_VECTOR.name)  # the memories' vectors follow them
    if not written:
        return None
    for hold in holds:
        if hold.kind == "tenant" and hold.value == tenant_id:
            return hold
        if hold.kind == "class" and hold.value in written:
            return hold
        if (
            hold.kind == "subject"
            and hold.value in held_subjects
            and hold.tenant_id in (None, tenant_id)
        ):
            return hold
    return None


def _memory_ids(plan: Plan) -> list[str]:
    """The memories a :data:`FORGET` plan writes (its memory and history groups' ops)."""
    ids: set[str] = set()
    for group in plan.groups:
        for op in group.ops:
            which = op.filter if isinstance(op.filter, Mapping) else {}
            key = "_id" if group.artifact == LONG_TERM_MEMORY.name else "memory_id"
            if group.artifact not in (LONG_TERM_MEMORY.name, MEMORY_HISTORY.name):
                continue
            value = which.get(key)
            for v in value.get("$in", ()) if isinstance(value, Mapping) else [value]:
                if isinstance(v, str):
                    ids.add(v)
    return sorted(ids)


def _named(docs: Sequence[Any], fields: Sequence[str]) -> set[str]:
    """The string values of ``fields`` in ``docs``."""
    values: set[str] = set()
    for doc in docs:
        for field in fields:
            value = value_at(doc, field) if isinstance(doc, Mapping) else None
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str):
                    values.add(v)
    return values


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

    # --- what the aggregator's forgetting asks (it may not import governance) --------

    def hold_collection(self, db: str) -> str:
        """The collection of ``db``'s legal holds under its policy."""
        from accord.governance.holding import holds_collection  # (holding imports this)

        return holds_collection(self.policies(db))

    def memory_hold_filters(
        self, db: str, tenant: str, docs: Sequence[Mapping[str, Any]],
        collections: Mapping[str, str],
    ) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
        """Per memory class (``long_term_memory``, ``memory_history`` -> its collection in
        ``collections``), the filters of the documents of ``tenant`` the holds ``docs``
        (hold documents as stored) cover; ``{}`` among them: every document (a tenant
        hold, a class hold; one on ``memory_vector`` holds the memories whose vectors
        they are). A thread's hold covers its thread's data, not memories."""
        policy = self.policies(db)
        holds = []
        for doc in docs:
            try:
                hold = Hold.from_document(doc)
            except (KeyError, InvalidInputError):
                continue  # malformed: the holds listing reports it
            if hold.kind == "thread" or hold.tenant_id not in (None, tenant):
                continue
            if hold.kind == "tenant" and hold.value != tenant:
                continue
            holds.append(hold)
        out: dict[str, list[dict[str, Any]]] = {}
        for artifact, collection in collections.items():
            cls = policy.of(artifact)
            fields = cls.subject_fields if cls is not None else ()
            which = [f for h in holds if (f := h.filter(artifact, collection, fields)) is not None]
            if artifact == LONG_TERM_MEMORY.name:
                which += [{} for h in holds if h.kind == "class" and h.value == MEMORY_VECTOR.name]
            if which:
                out[artifact] = which
        return out

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
            reads += self._memory_reads(db, policy, plans, subjects)
            if not fields or not subjects:
                continue
            values = sorted({value for _tenant, value in subjects})
            threads: dict[str, set[str]] = {}
            for plan in plans:
                if plan.context.thread_id and plan.context.operation in DELETIONS:
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

    def _memory_reads(
        self, db: str, policy: Policy, plans: Sequence[Plan],
        subjects: frozenset[tuple[str | None, str]],
    ) -> list[SealRead]:  # fmt: skip
        """For the :data:`FORGET` plans: the memories (and history versions) they write
        that name a held subject."""
        values = sorted({value for _tenant, value in subjects})
        reads: list[SealRead] = []
        if not values:
            return reads
        for artifact, link in ((LONG_TERM_MEMORY.name, "_id"), (MEMORY_HISTORY.name, "memory_id")):
            cls = policy.of(artifact)
            fields = cls.subject_fields if cls is not None else ()
            which, collection = [], None
            for plan in plans:
                if plan.context.operation != FORGET or not (ids := _memory_ids(plan)):
                    continue
                which.append({"tenant_id": plan.context.tenant_id, link: {"$in": ids}})
                collection = next((g.collection for g in plan.groups if g.artifact == artifact),
                                  collection)  # fmt: skip
            if not which or not fields or collection is None:
                continue
            reads.append(SealRead(
                f"{_MEMORIES}{artifact}:{db}", db, collection,
                {"$and": [{"$or": which}, {"$or": [{f: {"$in": values}} for f in fields]}]},
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
            self._refuse(db, batch, holds, fields, found.get(_SUBJECTS + db, []),
                         self._memory_subjects(db, found))  # fmt: skip

    def _memory_subjects(
        self, db: str, found: Mapping[str, list[Any]]
    ) -> dict[tuple[str, str], set[str]]:
        """(tenant, memory id) -> the subject values its document or history names, of
        what :meth:`_memory_reads` found."""
        policy = self.policies(db)
        out: dict[tuple[str, str], set[str]] = {}
        for artifact, link in ((LONG_TERM_MEMORY.name, "_id"), (MEMORY_HISTORY.name, "memory_id")):
            cls = policy.of(artifact)
            fields = cls.subject_fields if cls is not None else ()
            for doc in found.get(f"{_MEMORIES}{artifact}:{db}", []):
                key = (doc.get("tenant_id"), doc.get(link))
                out.setdefault(key, set()).update(_named([doc], fields))
        return out

    def _refuse(
        self, db: str, batch: SealBatch, holds: list[Hold], fields: Sequence[str],
        named: list[Any], memories: Mapping[tuple[str, str], set[str]] | None = None,
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
            if plan.context.operation == FORGET:
                subjects = set().union(*[(memories or {}).get((tenant, i), set())
                                         for i in _memory_ids(plan)])  # fmt: skip
                hold = covering_memory_hold(holds, tenant, plan, sorted(subjects))
                if hold is not None:
                    raise LegalHoldError(
                        f"the long-term memories derived from the deleted thread {thread!r} "
                        f"of tenant {tenant!r} are under the legal hold {hold.describe()} "
                        f"({hold.id}, placed by {hold.by or '?'}"
                        f"{': ' + hold.reason if hold.reason else ''}); nothing was "
                        f"forgotten ({FORGET}): the forgetter leaves held memories as they "
                        f"are.",
                        hold=hold.describe(), hold_id=hold.id,
                    )  # fmt: skip
                continue
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
