"""Placing and releasing legal holds (:mod:`accord.governance.holds`), and listing them:
plans through the kernel, in bounded batches (``accord governance hold | release |
holds``).

``place`` stores the hold, then moves ``expire_at`` to ``held_expire_at`` on every
document it covers in the collections the policy stamps, and removes the thread expiry
of the run-registry documents of the threads it covers. ``release`` removes the hold,
then moves the expiry back (or stamps one from now) on what no other hold covers.
Both are idempotent: run again after a crash, they finish the job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from accord.errors import InvalidInputError
from accord.governance.hold_guard import FENCES, checkpoint_subject_fields, hold_fence_ops
from accord.governance.holds import Hold, Holds
from accord.governance.policy import DEPENDENT, Policy, check_collection_name
from accord.governance.retention import (
    EXPIRE_AT,
    HELD_EXPIRE_AT,
    THREAD_CLASSES,
    TtlRule,
    finished_filter,
    thread_ttl,
    ttl_targets,
)
from accord.platform import runs
from accord.platform.artifacts import CHECKPOINT, CLASSES, HOLD, RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan, insert_once

__all__ = [
    "BATCH", "change_in_batches", "hold_filters", "holds_collection", "list_holds", "place",
    "release", "runs_collection", "subject_held_threads",
]  # fmt: skip

#: Documents changed per transaction.
BATCH = 1000
Progress = Callable[[str, int], None]


def holds_collection(policy: Policy) -> str:
    cls = policy.of(HOLD.name)
    return (
        (cls.collection if cls is not None else None) or HOLD.default_collection or "accord_holds"
    )


def runs_collection(policy: Policy) -> str:
    cls = policy.of(RUN.name)
    return (cls.collection if cls is not None else None) or RUN.default_collection or "runs"


def list_holds(uow: Any, db: str, policy: Policy) -> list[Hold]:
    """The holds of ``db``, oldest first."""
    docs = uow.find(ReadContext("*", operation="governance.holds"), HOLD.name, db,
                    holds_collection(policy), {}, sort=[("at", 1)])  # fmt: skip
    return [Hold.from_document(d) for d in docs]


def subject_held_threads(
    uow: Any, db: str, policy: Policy, holds: Holds, threads: Sequence[tuple[str, str]] | None
) -> set[tuple[str, str]]:
    """The (tenant, thread) pairs, among ``threads`` (None: all), whose checkpoints'
    metadata names a subject a hold of ``holds`` names."""
    fields = checkpoint_subject_fields(policy)
    subject_holds = [h for h in holds.holds if h.kind == "subject"]
    if not fields or not subject_holds or threads == []:
        return set()
    named: list[dict[str, Any]] = []
    for hold in subject_holds:
        clause: dict[str, Any] = {"$or": [{f: hold.value} for f in fields]}
        if hold.tenant_id:
            clause = {"tenant_id": hold.tenant_id, **clause}
        named.append(clause)
    match: dict[str, Any] = {"$or": named}
    if threads is not None:
        by_tenant: dict[str, list[str]] = {}
        for tenant, thread in threads:
            by_tenant.setdefault(tenant, []).append(thread)
        match = {"$and": [match, {"$or": [
            {"tenant_id": t, "thread_id": {"$in": sorted(ids)}} for t, ids in by_tenant.items()
        ]}]}  # fmt: skip
    cls = policy.of(CHECKPOINT.name)
    collection = (cls.collection if cls else None) or str(CHECKPOINT.default_collection)
    rows = uow.aggregate(ReadContext("*", operation="governance.holds"), CHECKPOINT.name, db, collection, [
        {"$match": match},
        {"$group": {"_id": {"tenant": "$tenant_id", "thread": "$thread_id"}}},
    ])  # fmt: skip
    return {(r["_id"]["tenant"], r["_id"]["thread"]) for r in rows}


def _targets(policy: Policy) -> list[tuple[str, str, TtlRule | None, tuple[str, ...]]]:
    """(collection, class, rule, subject fields) of everything a hold changes: the
    stamped collections, and the run registry (a thread's expiry; rule None)."""
    out: list[tuple[str, str, TtlRule | None, tuple[str, ...]]] = []
    for collection, (artifact, rule) in ttl_targets(policy).items():
        cls = policy.of(artifact, collection)
        out.append((collection, artifact, rule, cls.subject_fields if cls else ()))
    if thread_ttl(policy) is not None:
        out.append((runs_collection(policy), RUN.name, None, ()))
    return out


def hold_filters(
    uow: Any, db: str, policy: Policy, holds: list[Hold], artifact: str, collection: str,
    fields: tuple[str, ...],
) -> list[Any]:  # fmt: skip
    """The filters of the documents of ``collection`` that ``holds`` cover."""
    return [
        f for h in holds
        if (f := _covers(uow, db, policy, h, artifact, collection, fields)) is not None
    ]  # fmt: skip


def _filter(hold: Hold, artifact: str, collection: str, fields: tuple[str, ...]) -> Any:
    owner = DEPENDENT.get(artifact)
    if owner is not None and hold.kind == "class" and hold.value == owner:
        return {}  # a memory's vectors are held with their memories
    if artifact == RUN.name and hold.kind == "class":
        return {} if hold.value in THREAD_CLASSES else None
    return hold.filter(artifact, collection, fields)


#: dependent class -> the field naming the document it belongs to
OWNER_LINK = {"memory_vector": "memory_id"}


def _covers(
    uow: Any, db: str, policy: Policy, hold: Hold, artifact: str, collection: str,
    fields: tuple[str, ...],
) -> Any:  # fmt: skip
    """:func:`_filter`, and for a subject hold on a dependent class (a memory's vectors,
    which carry no subject fields): the documents of the owners the hold covers."""
    if artifact == RUN.name and hold.kind == "subject":
        # a thread whose checkpoints' metadata names the subject: its run-registry document
        threads = subject_held_threads(uow, db, policy, Holds.of([hold]), None)
        return {"_id": {"$in": sorted(runs.run_doc_id(t, h) for t, h in threads)}}
    owner, link = DEPENDENT.get(artifact), OWNER_LINK.get(artifact)
    if hold.kind != "subject" or owner is None or link is None:
        return _filter(hold, artifact, collection, fields)
    owner_class = policy.of(owner)
    if owner_class is None or not owner_class.collection:
        return None
    which = hold.filter(owner, owner_class.collection, owner_class.subject_fields)
    if which is None:
        return None
    ids = [d["_id"] for d in uow.find(ReadContext("*", operation="governance.hold"), owner, db,
                                      owner_class.collection, which, projection={"_id": 1})]  # fmt: skip
    return {link: {"$in": ids}}


def _known_class(policy: Policy, name: str) -> bool:
    if name in CLASSES or name in policy.classes:
        return True
    if name.startswith("business:"):
        try:
            check_collection_name(name.split(":", 1)[1])
        except ValueError:
            return False
        return True
    return False


def place(uow: Any, db: str, hold: Hold, policy: Policy, progress: Progress | None = None) -> int:
    """Store ``hold`` and take the expiry off what it covers; returns how many documents
    it took it off (0 the second time). A class hold must name a class (a typo held
    nothing, and said nothing)."""
    if hold.kind == "class" and not _known_class(policy, hold.value):
        known = sorted({*CLASSES, *policy.classes})
        raise InvalidInputError(
            f"{hold.value!r} is no artifact class: a class hold names one of "
            f"{', '.join(known)}, or business:COLLECTION; nothing was held"
        )
    doc = hold.document()
    doc["at"] = doc["at"] or datetime.now(UTC)
    doc["by"] = doc["by"] or uow.principal.name
    uow.execute(Plan(WriteContext("*", operation="governance.hold"), [
        Group("hold", db, holds_collection(policy), HOLD.name, [insert_once(doc)]),
        # a deletion running meanwhile conflicts with this (hold_guard.py, fences)
        Group("hold:fences", db, FENCES, HOLD.name, hold_fence_ops(hold)),
    ]))  # fmt: skip
    moved = 0
    for collection, artifact, _rule, fields in _targets(policy):
        which = _covers(uow, db, policy, hold, artifact, collection, fields)
        if which is None:
            continue
        moved += _move(uow, db, collection, artifact, which, rename=(EXPIRE_AT, HELD_EXPIRE_AT),
                       operation="governance.hold", progress=progress)  # fmt: skip
    return moved


def release(uow: Any, db: str, hold: Hold, policy: Policy, progress: Progress | None = None) -> int:
    """Remove ``hold`` and give back an expiry to what no other hold covers; returns how
    many documents got one back."""
    others = [h for h in list_holds(uow, db, policy) if h.id != hold.id]
    if not any(h.id == hold.id for h in list_holds(uow, db, policy)):
        raise InvalidInputError(
            f"no hold {hold.describe()} in {db} (accord governance holds lists them)"
        )
    uow.execute(Plan(WriteContext("*", operation="governance.release"), [
        Group("hold", db, holds_collection(policy), HOLD.name,
              hold.removal()),
    ]))  # fmt: skip
    now = datetime.now(UTC)
    back = 0
    for collection, artifact, rule, fields in _targets(policy):
        which = _covers(uow, db, policy, hold, artifact, collection, fields)
        if which is None:
            continue
        still = [
            f for h in others
            if (f := _covers(uow, db, policy, h, artifact, collection, fields)) is not None
        ]  # fmt: skip
        if still:
            which = {"$and": [which, {"$nor": still}]} if which else {"$nor": still}
        back += _move(uow, db, collection, artifact, which, rename=(HELD_EXPIRE_AT, EXPIRE_AT),
                      operation="governance.release", progress=progress)  # fmt: skip
        # written while held: stamped from now
        ttl = rule.expire_after if rule is not None else thread_ttl(policy)
        if ttl is None:
            continue
        unstamped: dict[str, Any] = {EXPIRE_AT: {"$exists": False},
                                     HELD_EXPIRE_AT: {"$exists": False}}  # fmt: skip
        if rule is not None and rule.event == "done":
            unstamped["status"] = finished_filter(rule)
        back += _move(uow, db, collection, artifact, {"$and": [which, unstamped]} if which
                      else unstamped, set_to=now + ttl, operation="governance.release",
                      progress=progress)  # fmt: skip
    return back


def _move(
    uow: Any,
    db: str,
    collection: str,
    artifact: str,
    which: Mapping[str, Any],
    *,
    operation: str,
    rename: tuple[str, str] | None = None,
    set_to: datetime | None = None,
    progress: Progress | None = None,
) -> int:
    """Rename ``rename[0]`` to ``rename[1]`` (or set ``expire_at`` to ``set_to``) on the
    documents of ``collection`` matching ``which``."""
    if rename is not None:
        return change_in_batches(
            uow, db, collection, artifact, {"$and": [dict(which), {rename[0]: {"$exists": True}}]},
            {"$rename": {rename[0]: rename[1]}}, operation=operation, progress=progress,
        )  # fmt: skip
    return change_in_batches(uow, db, collection, artifact, which,
                             {"$set": {EXPIRE_AT: set_to}}, operation=operation,
                             progress=progress)  # fmt: skip


def change_in_batches(
    uow: Any,
    db: str,
    collection: str,
    artifact: str,
    which: Mapping[str, Any],
    change: Any,
    *,
    operation: str,
    progress: Progress | None = None,
) -> int:
    """Apply ``change`` (an update document or pipeline) to the documents of
    ``collection`` matching ``which``: BATCH per transaction, in ``_id`` order, one plan
    per tenant (each plan names whose documents it changes). Returns how many."""
    done = 0
    last: Any = None
    while True:
        page = {"$and": [dict(which), {"_id": {"$gt": last}}]} if last is not None else dict(which)
        docs = uow.find(ReadContext("*", operation=operation), artifact, db, collection, page,
                        projection={"_id": 1, "tenant_id": 1}, sort=[("_id", 1)],
                        limit=BATCH)  # fmt: skip
        if not docs:
            return done
        last = docs[-1]["_id"]
        by_tenant: dict[Any, list[Any]] = defaultdict(list)
        for d in docs:
            by_tenant[d.get("tenant_id")].append(d["_id"])
        for tenant, ids in by_tenant.items():
            pinned: dict[str, Any] = {"tenant_id": tenant, "_id": {"$in": ids}}
            uow.execute(Plan(WriteContext(tenant if isinstance(tenant, str) else "*",
                                          operation=operation), [
                Group(f"{operation}:{collection}", db, collection, artifact,
                      [Op("update_many", pinned, change)]),
            ]))  # fmt: skip
        done += len(docs)
        if progress is not None:
            progress(collection, len(docs))
