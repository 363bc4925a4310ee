"""Erasing a data subject (GDPR Art. 17): ``accord governance erase ID``.

What :func:`erase_subject` does, in this order (what it finds: :mod:`accord.governance.subjects`):

1. **legal holds**: if any hold covers what it would erase (a subject hold on the ID, a
   tenant, thread or class hold on data of the subject, or on a thread deleted before
   whose data key the erasure would destroy: :func:`key_holds`), it raises
   :class:`~accord.errors.SubjectHeld` naming each hold, before anything is written;
   then the subject's data keys are destroyed and the audit images of what was found
   erased (step 4's first pass);
2. **outbox events**, **memories** (with their vectors and history), **workflow events**
   and **business records**: deleted by ``_id``, per tenant, in batches (before the
   threads, through which some of them were found);
3. **threads**, whole: a thread in one transaction when each of its classes has fewer
   than :data:`~accord.governance.subjects.PAGE` documents of it, else class by class in
   batches of PAGE documents, one transaction each, its checkpoints last (they are what
   finds the thread again after a crash);
4. **audit images**: ``full``-mode audit records of the threads and documents found
   (a first time before anything is deleted, so that a rerun after a crash does not miss
   the records of a document it no longer finds; again at the end, for what was written
   meanwhile), and any whose images mention the ID (the erasure's own among them), keep
   only the hashes of their images (:mod:`accord.governance.redaction`); the chain still
   verifies;
5. the caller (``accord.runtime.erase_subject``) then compacts the storage, so that on
   the embedded engine nothing erased is left in its data files.

Every write is a plan through the kernel with operation ``governance.erase`` and the
caller's principal (the CLI's operating-system user, role admin): with the audit trail
on, each deletion is recorded in its stream, by whom and when. No plan filters on the
subject's identifier itself (documents are deleted by ``_id`` or by thread); where an id
or a thread id holds it, the last pass of step 4 erases the images of that record, whose
hashes stay. Idempotent: run it again after a crash and it finishes the job (a run that
writes the subject's thread meanwhile can leave documents behind: stop its runs first).

No filter grows with the subject's size: every list of ids or threads in one holds at
most :data:`~accord.governance.subjects.PAGE` values. ``ErasureReport.deleted`` counts
what the deletes deleted (the kernel's counts), not what was found.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from accord.errors import InvalidInputError, SubjectHeld
from accord.governance.audit_records import RECORDS, stream_of
from accord.governance.canonical import canonical
from accord.governance.holding import list_holds
from accord.governance.holds import Hold
from accord.governance.policy import Policy
from accord.governance.redaction import ERASE_OPERATION, erase_images
from accord.governance.shredding import destroy_subject_keys, thread_keys_naming
from accord.governance.subjects import (
    PAGE,
    THREAD_CLASSES,
    SubjectData,
    chunks,
    find_subject,
    same_subject,
    subject_hash,
)
from accord.platform.artifacts import (
    AUDIT,
    CHECKPOINT,
    ENCRYPTION_KEY,
    LONG_TERM_MEMORY,
    MEMORY_HISTORY,
    MEMORY_VECTOR,
    OUTBOX,
    RUN,
)
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "ErasureReport", "covering_holds", "erase_subject", "key_holds", "overlap",
    "redact_audit_images",
]  # fmt: skip

Progress = Callable[[str, int], None]

#: A thread's classes in the order a large thread's pages are deleted: its checkpoints
#: last, because they are what finds the thread (their metadata names the subject), so an
#: erasure interrupted half-way through the thread still finds the rest when run again.
_THREAD_ORDER = tuple(c for c in THREAD_CLASSES if c not in (CHECKPOINT.name, RUN.name)) + (
    RUN.name,
    CHECKPOINT.name,
)
#: Other classes in the order they are deleted: outbox events first (no aggregator turns
#: one into a memory again), then a memory's vectors and history, then the memory.
_FIRST = (OUTBOX.name, MEMORY_VECTOR.name, MEMORY_HISTORY.name, LONG_TERM_MEMORY.name)


@dataclass
class ErasureReport:
    """What one erasure did."""

    subject_sha256: str
    db: str
    threads: int = 0
    #: class -> documents the erasure's deletes deleted (the kernel's counts: a document
    #: found, then deleted by someone else before the erasure got to it, is not counted)
    deleted: dict[str, int] = field(default_factory=dict)
    audit_images_erased: int = 0
    #: data keys destroyed (crypto-shredding: copies made before are unreadable)
    keys_destroyed: int = 0
    compacted: str | None = None
    seconds: float = 0.0

    def describe(self) -> str:
        classes = ", ".join(f"{n} {c}" for c, n in sorted(self.deleted.items()) if n) or "nothing"
        return (
            f"erased {self.threads} thread(s) and deleted {classes}; "
            f"{self.audit_images_erased} audit record(s) keep only the hashes of their images; "
            f"{self.keys_destroyed} data key(s) destroyed"
            f"{'; ' + self.compacted if self.compacted else ''} ({self.seconds:.2f} s)"
        )


def covering_holds(holds: Iterable[Hold], found: SubjectData) -> list[Hold]:
    """The holds that cover anything of ``found``."""
    tenants = found.tenants()
    out = []
    for hold in holds:
        if hold.kind == "subject":
            hit = same_subject(hold.value, found.subject) and (
                hold.tenant_id is None or found.tenant_id in (None, hold.tenant_id)
            )
        elif hold.kind == "tenant":
            hit = hold.value in tenants
        elif hold.kind == "thread":
            hit = (hold.tenant_id, hold.value) in found.threads
        elif hold.value in (AUDIT.name, ENCRYPTION_KEY.name):
            hit = True  # every erasure erases audit images and destroys data keys
        else:
            hit = (bool(found.threads) and hold.value in THREAD_CLASSES) or any(
                t.count() and hold.value in (t.name, t.artifact, f"{t.artifact}:{t.collection}")
                for t in found.targets.values()
            )
        if hit:
            out.append(hold)
    return out


def key_holds(holds: Iterable[Hold], subject: str,
              gone: Mapping[tuple[str, str], Iterable[Any]]) -> list[Hold]:  # fmt: skip
    """The holds that cover the data key of a thread deleted before (``gone``: (tenant,
    thread) -> the subjects its key names; :func:`~accord.governance.shredding.
    thread_keys_naming`), which the erasure would destroy: a hold keeps what is left of
    its thread, the key too, so that backups stay readable for the case. A hold on the
    thread, on its tenant, on a class of a thread's data, or on another subject its key
    names (a thread both were in)."""
    out = []
    for hold in holds:
        if hold.kind == "thread":
            hit = (hold.tenant_id, hold.value) in gone
        elif hold.kind == "tenant":
            hit = any(tenant == hold.value for tenant, _ in gone)
        elif hold.kind == "class":
            hit = bool(gone) and hold.value in THREAD_CLASSES
        else:
            hit = not same_subject(hold.value, subject) and any(
                hold.tenant_id in (None, tenant) and any(same_subject(hold.value, str(v))
                                                         for v in names)
                for (tenant, _), names in gone.items()
            )  # fmt: skip
        if hit:
            out.append(hold)
    return out


def overlap(a: SubjectData, b: SubjectData) -> bool:
    """Whether two subjects' data share a thread or a document."""
    if a.threads & b.threads:
        return True
    for name, target in a.targets.items():
        other = b.targets.get(name)
        if other is None:
            continue
        for tenant, ids in target.ids.items():
            theirs = {repr(i) for i in other.ids.get(tenant, ())}  # (ids may be documents)
            if any(repr(i) in theirs for i in ids):
                return True
    return False


def _shares(uow: Any, db: str, policy: Policy, hold: Hold, found: SubjectData) -> bool:
    """Whether the data of subject ``hold`` holds shares a thread or document with
    ``found`` (a value that is no identifier any more counts as shared: refused)."""
    try:
        theirs = find_subject(uow, db, policy, hold.value, hold.tenant_id)
    except InvalidInputError:
        return True
    return overlap(theirs, found)


def _refuse(held: list[Hold], db: str, keys: Iterable[Hold] = ()) -> SubjectHeld:
    """The error naming each hold of ``held`` (those of ``keys`` hold the data key of a
    thread deleted before: said, since no document of it is left to see)."""
    of_keys = {h.id for h in keys}
    named = "; ".join(
        f"{h.describe()}"
        + (f" (reason {h.reason!r})" if h.reason else "")
        + (f", placed by {h.by}" if h.by else "")
        + (f" at {h.at:%Y-%m-%d %H:%M}" if h.at else "")
        + (", which keeps the data key of a thread deleted before" if h.id in of_keys else "")
        for h in held
    )
    return SubjectHeld(
        f"the data subject is under legal hold in {db}: {named}. Nothing was erased; "
        f"release the hold when the case allows (accord governance release VALUE --by "
        f"KIND --db {db}) and erase again"
    )


def _context(uow: Any, tenant: str, thread: str | None = None) -> WriteContext:
    return WriteContext(tenant, thread_id=thread, principal=uow.principal,
                        operation=ERASE_OPERATION)  # fmt: skip


def _delete_thread(uow: Any, db: str, found: SubjectData, tenant: str, thread: str,
                   report: ErasureReport, progress: Progress | None) -> None:  # fmt: skip
    """Delete one thread: in one transaction when each of its classes has fewer than
    PAGE documents (the usual case), else class by class in pages, checkpoints last."""
    where = {"tenant_id": tenant, "thread_id": thread}
    collections = [(n, found.thread_collections[n]) for n in _THREAD_ORDER
                   if n in found.thread_collections]  # fmt: skip

    def ids_of(name: str, coll: str) -> list[Any]:
        docs = uow.find(ReadContext("*", operation=ERASE_OPERATION), name, db, coll, where,
                        projection={"_id": 1}, sort=[("_id", 1)], limit=PAGE)  # fmt: skip
        return [d["_id"] for d in docs]

    def group(name: str, coll: str, ids: list[Any]) -> Group:
        return Group(f"erase:{name}", db, coll, name,
                     [Op("delete_many", {**where, "_id": {"$in": ids}})])  # fmt: skip

    def done(name: str, n: int) -> None:
        report.deleted[name] = report.deleted.get(name, 0) + n
        if progress is not None and n:
            progress(name, n)

    first = {name: ids_of(name, coll) for name, coll in collections}
    if all(len(ids) < PAGE for ids in first.values()):
        groups = [group(name, coll, first[name]) for name, coll in collections if first[name]]
        result = uow.execute(Plan(_context(uow, tenant, thread), groups)) if groups else None
        for name, _ in collections:
            done(name, result[f"erase:{name}"].deleted if result is not None else 0)
        return
    for name, coll in collections:
        while ids := ids_of(name, coll):
            one = group(name, coll, ids)
            result = uow.execute(Plan(_context(uow, tenant, thread), [one]))
            done(name, result[one.name].deleted)


def _delete_targets(uow: Any, db: str, found: SubjectData, report: ErasureReport,
                    progress: Progress | None) -> None:  # fmt: skip
    order = sorted(found.targets, key=lambda n: (_FIRST.index(n) if n in _FIRST else 9, n))
    for name in order:
        target = found.targets[name]
        for tenant, ids in sorted(target.ids.items()):
            for batch in chunks(ids, PAGE):
                ops = [Op("delete_many", {"tenant_id": tenant, "_id": {"$in": batch}})]
                group = Group(f"erase:{name}", db, target.collection, target.artifact, ops)
                result = uow.execute(Plan(_context(uow, tenant), [group]))
                # what was deleted (found, then deleted by another meanwhile: not counted)
                deleted = result[group.name].deleted
                report.deleted[name] = report.deleted.get(name, 0) + deleted
                if progress is not None:
                    progress(name, deleted)


def _field_text(name: str, value: Any) -> str:
    """``"name":value`` as an image's canonical JSON writes a field."""
    return f"{canonical(name).decode()}:{canonical(value).decode()}"


def _mention(found: SubjectData) -> str:
    """A regular expression matching the canonical JSON of an image that holds the
    subject as a whole value: any of its strings (quoted, escaped), and a numeric
    identifier as the value of a subject field (``"user_id":42``; a bare number is too
    common to erase every record that holds it)."""
    texts = [v for v in found.values or (found.subject,) if isinstance(v, str)]
    either = [re.escape(canonical(v).decode()) for v in texts]
    numbers = [v for v in found.values if isinstance(v, int)]
    for number in numbers:
        spelled = re.escape(canonical(number).decode())
        long = re.escape(canonical({"$numberLong": str(number)}).decode())
        for leaf in sorted(found.leaves):
            either.append(f"{re.escape(canonical(leaf).decode())}:(?:{spelled}|{long})[,}}\\]]")
    return "|".join(either)


def redact_audit_images(uow: Any, db: str, found: SubjectData, *, records: str = RECORDS,
                        progress: Progress | None = None, of_found: bool = True,
                        mentions: bool = True) -> int:  # fmt: skip
    """Erase the images of the ``full``-mode audit records that held the subject's data:
    (``of_found``) those of its threads' streams and of the documents ``found`` names, and
    (``mentions``: a scan of the records' images) any whose images mention the subject's
    identifier (within ``found``'s tenant, when the erasure names one). Returns how many
    records changed."""
    either: list[dict[str, Any]] = []
    streams = sorted({stream_of(t, th, CHECKPOINT.name, "") for t, th in found.threads})
    for start in range(0, len(streams) if of_found else 0, PAGE):
        either.append({"stream": {"$in": streams[start : start + PAGE]}})
    for target in found.targets.values() if of_found else ():
        for tenant, ids in target.ids.items():
            for start in range(0, len(ids), PAGE):
                either.append({"tenant_id": tenant, "collection": target.collection,
                               "ops.doc_id": {"$in": ids[start : start + PAGE]}})  # fmt: skip
    if mentions:
        # the identifier as a whole string value, as the images' canonical JSON writes it
        # (quoted and escaped): subjects are found by equality, and a substring erased
        # "u-42"'s records for "u-4" (and every record for "e"), and missed "CORP\\alice"
        mention = {"$regex": _mention(found)}
        naming: dict[str, Any] = {
            "$or": [{f"images.{name}": mention} for name in ("filter", "change", "image")]
            # and the erasures' own records, whose filters list ids that may hold the
            # identifier inside them ("order-u-7-1")
            + [{"action": ERASE_OPERATION}]
        }
        if found.tenant_id is not None:  # a tenant's erasure: other tenants' are theirs;
            # of accord's own work across tenants (outbox and run-queue claims, tenant "*")
            # the records of this tenant's documents, whose images name it (another
            # tenant's claims of the same identifier's events are that tenant's evidence)
            theirs = {"$regex": re.escape(_field_text("tenant_id", found.tenant_id))}
            naming = {"$and": [naming, {"$or": [
                {"tenant_id": found.tenant_id},
                {"tenant_id": "*", "$or": [{f"images.{name}": theirs}
                                           for name in ("filter", "change", "image")]},
            ]}]}  # fmt: skip
        either.append(naming)
    at = datetime.now(UTC)
    return sum(erase_images(uow, db, records, part, at, progress) for part in either)


def erase_subject(uow: Any, db: str, policy: Policy, subject: str, *,
                  tenant_id: str | None = None, records: str = RECORDS,
                  progress: Progress | None = None) -> ErasureReport:  # fmt: skip
    """Erase everything ``db`` holds about ``subject`` (module docstring), through
    ``uow`` (a sync kernel acting as an admin). Raises :class:`~accord.errors.SubjectHeld`
    (nothing erased) when a legal hold covers any of it."""
    started = time.monotonic()
    found = find_subject(uow, db, policy, subject, tenant_id)
    holds = list_holds(uow, db, policy)
    held = covering_holds(holds, found)
    # another subject's hold covers what this erasure would delete with it: a thread
    # both are in (it goes whole), a memory derived from it (delete_thread refuses such
    # a thread; erasing the other subject must too)
    held += [h for h in holds if h.kind == "subject" and h not in held
             and _shares(uow, db, policy, h, found)]  # fmt: skip
    # a thread deleted before, whose key the erasure destroys by the subjects it names:
    # a hold on it keeps its key (no document of it is left for the checks above)
    gone = {pair: names for pair, names in
            thread_keys_naming(uow, db, policy, found.subject, tenant_id).items()
            if pair not in found.threads}  # fmt: skip
    kept = [h for h in key_holds(holds, found.subject, gone) if h not in held]
    if held or kept:
        raise _refuse(held + kept, db, kept)
    report = ErasureReport(subject_hash(found.subject), db, threads=len(found.threads))
    # keys first: a run interrupted after this still finds the threads (by their
    # checkpoints) and deletes them; their copies elsewhere are unreadable from here on
    report.keys_destroyed = destroy_subject_keys(
        uow, db, policy, found.subject, found.threads, tenant_id
    )
    # the audit images of what was found, while it can be found: a run interrupted after
    # a deletion would no longer find that document, nor its records
    report.audit_images_erased = redact_audit_images(
        uow, db, found, records=records, progress=progress, mentions=False
    )
    # what was found through the threads (their memories, outbox events) before the
    # threads: a run interrupted in between finds the threads, and through them the rest
    _delete_targets(uow, db, found, report, progress)
    for tenant, thread in sorted(found.threads):
        _delete_thread(uow, db, found, tenant, thread, report, progress)
    # then again (what was written since the first pass), and any record whose images
    # name the subject (the erasure's own among them: ids may hold the identifier)
    report.audit_images_erased += redact_audit_images(
        uow, db, found, records=records, progress=progress
    )
    report.seconds = time.monotonic() - started
    return report
