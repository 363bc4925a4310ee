"""Placing and releasing legal holds (:mod:`accord.governance.holds`), and listing them:
plans through the kernel, in bounded batches (``accord governance hold | release |
holds``).

``place`` stores the hold, then moves ``expire_at`` to ``held_expire_at`` on every
document it covers in the collections the policy stamps, and removes the thread expiry
of the run-registry documents of the threads it covers. ``release`` removes the hold,
then moves the expiry back (or stamps one from now) on what no other hold covers.
Both are idempotent: run again after a crash, they finish the job.

No filter lists more than :data:`~accord.governance.subjects.PAGE` values (a subject's
10^5 threads or memories in one ``$in`` could pass MongoDB's 16 MB command limit): a
subject hold on the run registry or on a memory's vectors covers its documents through
several filters of a page of ids each (:class:`Cover`), and ``release`` tells what
another such hold still covers apart page by page, in memory, not by a ``$nor`` of every
id. Each batch is its own transaction, as before: the hold's own document is stored (or
removed) first, in one transaction; a ``release`` interrupted after that leaves held
documents no hold covers, which running it again gives their expiry back although the
hold is gone.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import bson

from accord.errors import InvalidInputError
from accord.governance.hold_guard import FENCES, checkpoint_subject_fields, hold_fence_ops
from accord.governance.holds import Hold, Holds, value_at
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
from accord.governance.subjects import chunks, pages
from accord.platform import runs
from accord.platform.artifacts import CHECKPOINT, CLASSES, HOLD, RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan, insert_once

__all__ = [
    "BATCH", "Cover", "Exclusion", "change_in_batches", "hold_covers", "holds_collection",
    "list_holds", "place", "release", "runs_collection", "subject_held_threads",
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
    cls = policy.of(CHECKPOINT.name)
    collection = (cls.collection if cls else None) or str(CHECKPOINT.default_collection)
    among = [None] if threads is None else list(_thread_lists(threads))
    found: set[tuple[str, str]] = set()
    for listed in among:  # one read per page of threads
        rows = uow.aggregate(ReadContext("*", operation="governance.holds"), CHECKPOINT.name, db, collection, [
            {"$match": match if listed is None else {"$and": [match, listed]}},
            {"$group": {"_id": {"tenant": "$tenant_id", "thread": "$thread_id"}}},
        ])  # fmt: skip
        found.update((r["_id"]["tenant"], r["_id"]["thread"]) for r in rows)
    return found


def _thread_lists(threads: Sequence[tuple[str, str]]) -> Iterator[dict[str, Any]]:
    """Filters of ``threads`` (tenant, thread), each naming at most a page of them."""
    for part in chunks(sorted(set(threads))):
        by_tenant: dict[str, list[str]] = defaultdict(list)
        for tenant, thread in part:
            by_tenant[tenant].append(thread)
        yield {"$or": [{"tenant_id": t, "thread_id": {"$in": ids}} for t, ids in by_tenant.items()]}


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


def hold_covers(
    uow: Any, db: str, policy: Policy, holds: Sequence[Hold], artifact: str, collection: str,
    fields: tuple[str, ...],
) -> list[Cover]:  # fmt: skip
    """What each of ``holds`` covers in ``collection`` (a hold covering nothing there is
    left out): to leave it out of a change, :meth:`Exclusion.of` them."""
    return [c for h in holds
            if (c := _covers(uow, db, policy, h, artifact, collection, fields)) is not None]  # fmt: skip


def _filter(hold: Hold, artifact: str, collection: str, fields: tuple[str, ...]) -> Any:
    owner = DEPENDENT.get(artifact)
    if owner is not None and hold.kind == "class" and hold.value == owner:
        return {}  # a memory's vectors are held with their memories
    if artifact == RUN.name and hold.kind == "class":
        return {} if hold.value in THREAD_CLASSES else None
    return hold.filter(artifact, collection, fields)


#: dependent class -> the field naming the document it belongs to
OWNER_LINK = {"memory_vector": "memory_id"}


def _key(value: Any) -> bytes:
    """A hashable, exact key of an id (which may be a document)."""
    return bson.encode({"_": value})


@dataclasses.dataclass(frozen=True)
class Cover:
    """The documents of one collection one hold covers: those matching ``filter`` (a
    tenant, a thread, a class, subject fields: small), or, where the hold reaches them
    through their owners (a subject's threads' run-registry documents, its memories'
    vectors), those whose ``field`` holds one of ``values``: as many as the subject has,
    so never one list (:meth:`filters`, :meth:`covers`)."""

    filter: dict[str, Any] | None = None
    field: str = "_id"
    values: tuple[Any, ...] = ()
    keys: frozenset[bytes] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", frozenset(_key(v) for v in self.values))

    def filters(self) -> list[dict[str, Any]]:
        """Filters whose union is what the hold covers, each listing at most a page of
        values (``[{}]``: everything; ``[]``: nothing)."""
        if self.filter is not None:
            return [self.filter]
        return [{self.field: {"$in": part}} for part in chunks(self.values)]

    def covers(self, doc: Mapping[str, Any]) -> bool:
        """Whether ``doc`` (read with :attr:`field`) is one of the listed documents (a
        cover by ``filter`` is matched by the server instead)."""
        return _key(value_at(doc, self.field)) in self.keys


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """What a change leaves out because holds cover it, never as one ``$nor`` of every id:
    the small filters (tenant, thread, class, subject fields) go to the server in a
    ``$nor`` (:meth:`narrow`), the id-list covers are checked in memory on each document
    read (:meth:`held`, reading :attr:`read`)."""

    plain: tuple[dict[str, Any], ...] = ()
    listed: tuple[Cover, ...] = ()

    @classmethod
    def of(cls, covers: Sequence[Cover]) -> Exclusion:
        """Split ``covers`` into the server's part and the in-memory part."""
        return cls(
            plain=tuple(c.filter for c in covers if c.filter is not None),
            listed=tuple(c for c in covers if c.filter is None),
        )

    @property
    def read(self) -> tuple[str, ...]:
        """The fields :meth:`held` needs of a document besides its ``_id``."""
        return tuple(sorted({c.field for c in self.listed}))

    @property
    def unless(self) -> Callable[[Mapping[str, Any]], bool] | None:
        """:meth:`held`, or None when nothing is checked in memory (no read needed)."""
        return self.held if self.listed else None

    def narrow(self, which: Mapping[str, Any]) -> dict[str, Any]:
        """``which`` without what the plain filters cover."""
        if not self.plain:
            return dict(which)
        nor = {"$nor": list(self.plain)}
        return {"$and": [dict(which), nor]} if which else nor

    def held(self, doc: Mapping[str, Any]) -> bool:
        """Whether a listed cover covers ``doc`` (read with :attr:`read`)."""
        return any(c.covers(doc) for c in self.listed)


def _covers(
    uow: Any, db: str, policy: Policy, hold: Hold, artifact: str, collection: str,
    fields: tuple[str, ...],
) -> Cover | None:  # fmt: skip
    """:func:`_filter`, and for a subject hold on the run registry (a thread whose
    checkpoints' metadata names the subject: its run-registry document) or on a dependent
    class (a memory's vectors, which carry no subject fields: the documents of the
    owners the hold covers), the ids it reaches, read a page at a time."""
    if artifact == RUN.name and hold.kind == "subject":
        threads = subject_held_threads(uow, db, policy, Holds.of([hold]), None)
        return Cover(values=tuple(sorted(runs.run_doc_id(t, h) for t, h in threads)))
    owner, link = DEPENDENT.get(artifact), OWNER_LINK.get(artifact)
    if hold.kind != "subject" or owner is None or link is None:
        which = _filter(hold, artifact, collection, fields)
        return None if which is None else Cover(which)
    owner_class = policy.of(owner)
    if owner_class is None or not owner_class.collection:
        return None
    which = hold.filter(owner, owner_class.collection, owner_class.subject_fields)
    if which is None:
        return None
    ids = [d["_id"] for docs in pages(uow, owner, db, owner_class.collection, which,
                                      projection={"_id": 1}, operation="governance.hold")
           for d in docs]  # fmt: skip
    return Cover(field=link, values=tuple(ids))


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
        cover = _covers(uow, db, policy, hold, artifact, collection, fields)
        for which in cover.filters() if cover is not None else []:
            moved += _move(uow, db, collection, artifact, which,
                           rename=(EXPIRE_AT, HELD_EXPIRE_AT), operation="governance.hold",
                           progress=progress)  # fmt: skip
    return moved


def release(uow: Any, db: str, hold: Hold, policy: Policy, progress: Progress | None = None) -> int:
    """Remove ``hold`` and give back an expiry to what no other hold covers; returns how
    many documents got one back.

    The hold's document goes first, in one transaction; the expiries come back in
    batches after it. So a release interrupted in between leaves held documents that no
    hold covers any more: running it again (the hold is gone) gives them back. Only a
    hold that is not there and left nothing to give back is an error (a typo)."""
    holds = list_holds(uow, db, policy)
    others = [h for h in holds if h.id != hold.id]
    if len(others) < len(holds):
        uow.execute(Plan(WriteContext("*", operation="governance.release"), [
            Group("hold", db, holds_collection(policy), HOLD.name,
                  hold.removal()),
        ]))  # fmt: skip
    back = sum(
        _give_back(uow, db, policy, hold, others, target, progress=progress)
        for target in _targets(policy)
    )
    if len(others) == len(holds) and not back:
        raise InvalidInputError(
            f"no hold {hold.describe()} in {db} (accord governance holds lists them)"
        )
    return back


def _give_back(
    uow: Any, db: str, policy: Policy, hold: Hold, others: list[Hold],
    target: tuple[str, str, TtlRule | None, tuple[str, ...]], *, progress: Progress | None,
) -> int:  # fmt: skip
    """Give an expiry back to what ``hold`` covers in one target and ``others`` do not:
    ``held_expire_at`` back to ``expire_at``, and one from now where neither is (written
    while held)."""
    collection, artifact, rule, fields = target
    cover = _covers(uow, db, policy, hold, artifact, collection, fields)
    if cover is None:
        return 0
    # small filters are left out by the server; listed ids page by page (no $nor of all)
    still = Exclusion.of(hold_covers(uow, db, policy, others, artifact, collection, fields))
    unless, read = still.unless, still.read
    ttl = rule.expire_after if rule is not None else thread_ttl(policy)
    unstamped: dict[str, Any] = {EXPIRE_AT: {"$exists": False},
                                 HELD_EXPIRE_AT: {"$exists": False}}  # fmt: skip
    if rule is not None and rule.event == "done":
        unstamped["status"] = finished_filter(rule)
    now = datetime.now(UTC)
    back = 0
    for part in cover.filters():
        which = still.narrow(part)
        back += _move(uow, db, collection, artifact, which, rename=(HELD_EXPIRE_AT, EXPIRE_AT),
                      operation="governance.release", progress=progress, unless=unless,
                      read=read)  # fmt: skip
        if ttl is not None:  # written while held: stamped from now
            back += _move(uow, db, collection, artifact,
                          {"$and": [which, unstamped]} if which else unstamped,
                          set_to=now + ttl, operation="governance.release",
                          progress=progress, unless=unless, read=read)  # fmt: skip
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
    unless: Callable[[Mapping[str, Any]], bool] | None = None,
    read: tuple[str, ...] = (),
) -> int:
    """Rename ``rename[0]`` to ``rename[1]`` (or set ``expire_at`` to ``set_to``) on the
    documents of ``collection`` matching ``which`` (but ``unless``)."""
    if rename is not None:
        return change_in_batches(
            uow, db, collection, artifact, {"$and": [dict(which), {rename[0]: {"$exists": True}}]},
            {"$rename": {rename[0]: rename[1]}}, operation=operation, progress=progress,
            unless=unless, read=read,
        )  # fmt: skip
    return change_in_batches(uow, db, collection, artifact, which,
                             {"$set": {EXPIRE_AT: set_to}}, operation=operation,
                             progress=progress, unless=unless, read=read)  # fmt: skip


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
    unless: Callable[[Mapping[str, Any]], bool] | None = None,
    read: tuple[str, ...] = (),
) -> int:
    """Apply ``change`` (an update document or pipeline) to the documents of
    ``collection`` matching ``which``, but those ``unless`` (given each read with
    ``_id``, ``tenant_id`` and ``read``) tells to leave: BATCH per transaction, in
    ``_id`` order, one plan per tenant (each plan names whose documents it changes),
    its ids listed a page at a time. Returns how many."""
    done = 0
    last: Any = None
    projection = {"_id": 1, "tenant_id": 1, **dict.fromkeys(read, 1)}
    while True:
        page = {"$and": [dict(which), {"_id": {"$gt": last}}]} if last is not None else dict(which)
        docs = uow.find(ReadContext("*", operation=operation), artifact, db, collection, page,
                        projection=projection, sort=[("_id", 1)], limit=BATCH)  # fmt: skip
        if not docs:
            return done
        last = docs[-1]["_id"]
        by_tenant: dict[Any, list[Any]] = defaultdict(list)
        for d in docs:
            if unless is None or not unless(d):
                by_tenant[d.get("tenant_id")].append(d["_id"])
        for tenant, ids in by_tenant.items():
            ops = [Op("update_many", {"tenant_id": tenant, "_id": {"$in": part}}, change)
                   for part in chunks(ids)]  # fmt: skip
            uow.execute(Plan(WriteContext(tenant if isinstance(tenant, str) else "*",
                                          operation=operation), [
                Group(f"{operation}:{collection}", db, collection, artifact, ops),
            ]))  # fmt: skip
        changed = sum(len(ids) for ids in by_tenant.values())
        done += changed
        if progress is not None and changed:
            progress(collection, changed)
