"""Rollback with compensation, planned: what ``saver.rollback(config, to=CHECKPOINT)``
restores and removes, and when it refuses (pure; the saver reads and commits).

The thread is rewound to checkpoint ``to``: its checkpoints created after ``to`` (every
namespace) and the task writes recorded from ``to`` on are removed, so the thread's latest
state is ``to``'s and resuming it runs ``to``'s next tasks again. The business writes of
those tasks (the undo log's entries from ``to`` on: :mod:`accord.platform.undo_log`) are
undone: each record they touched gets back its before-image from before the first of them
(a record they created is deleted, one they deleted is inserted again). The artifacts those
tasks committed become pending again (``gc_artifacts`` collects them). All of it in ONE
transaction, led by the thread's free guard (refused while a live run holds the thread).

A record is restored only if nobody changed it since the thread's last write to it: its
``_version`` is still the one that write left (or it is still absent, after a delete), and
no other thread's write to it was logged after the thread's first one. Otherwise the
rollback is refused with :class:`~accord.errors.RollbackRefused` naming the record; the
transaction's writes also match on the expected version, so a writer that slips in between
the check and the commit makes the transaction refuse rather than overwrite it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.errors import RollbackRefused
from accord.platform import undo_log
from accord.platform.artifacts import BUSINESS
from accord.platform.plan import Counts, Expect, Group, Op

VERSION = undo_log.VERSION_FIELD


@dataclass(frozen=True)
class RolledBack:
    """What a rollback did: the checkpoint the thread is back at, how many checkpoints
    were removed, how many business records were restored (from how many undone
    writes)."""

    checkpoint_id: str
    checkpoints_removed: int
    records_restored: int
    writes_undone: int


@dataclass
class Record:
    """One business record the undone writes touched: its first before-image and the
    state the last of them left."""

    collection: str
    record_id: Any
    before: dict[str, Any] | None
    after_absent: bool
    after_version: int | None
    first_at: Any
    before_known: bool = True
    entries: list[str] = field(default_factory=list)


def records(entries: Sequence[Mapping[str, Any]]) -> list[Record]:
    """The records of ``entries`` (undo documents sorted by :data:`undo_log.SORT`), in order of
    first write. Entries whose record could not be named (``record_id`` None) must have
    been resolved by the caller (see :func:`unresolved`)."""
    found: dict[tuple[str, Any], Record] = {}
    for e in entries:
        key = record_key(str(e["collection"]), e["record_id"])
        rec = found.get(key)
        if rec is None:
            rec = found[key] = Record(
                str(e["collection"]), e["record_id"], undo_log.decode(e.get("before")),
                bool(e.get("after_absent")), e.get("after_version"), e.get("at"),
                bool(e.get("before_known", True)),
            )  # fmt: skip
        rec.after_absent = bool(e.get("after_absent"))
        rec.after_version = e.get("after_version")
        rec.entries.append(str(e["_id"]))
    return list(found.values())


def record_key(collection: str, record_id: Any) -> tuple[str, Any]:
    """A record's key in the maps the saver builds (``_id`` values that are documents
    or arrays are keyed by their repr, booleans apart from the numbers Python takes them
    for: :func:`accord.platform.undo_log.scalar_key`)."""
    if isinstance(record_id, dict | list):
        return (collection, repr(record_id))
    return (collection, undo_log.scalar_key(record_id))


def unresolved(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries of upserts that created a record whose ``_id`` the server chose."""
    return [e for e in entries if e.get("record_id") is None]


def refusal(
    rec: Record,
    current: Mapping[str, Any] | None,
    others: Sequence[Mapping[str, Any]],
    thread_id: str,
) -> RollbackRefused | None:
    """Why ``rec`` may not be restored (``current``: the record now; ``others``: other
    threads' undo entries on it since the thread's first write), or None."""
    name = f"record {rec.record_id!r} of {rec.collection!r}"
    if not rec.before_known:
        return RollbackRefused(
            f"rollback of thread {thread_id!r} refused: {name} was written by a task before "
            f"the target checkpoint and again after it in one transaction (queued saves), "
            f"so its state at the target was never recorded. Nothing was changed; roll "
            f"back to an earlier checkpoint.",
            collection=rec.collection, record_id=rec.record_id,
        )  # fmt: skip
    if others:
        who = sorted({str(o.get("thread_id")) for o in others})
        return RollbackRefused(
            f"rollback of thread {thread_id!r} refused: {name} was written since by "
            f"thread(s) {who}; restoring it would undo their change. Nothing was changed. "
            f"Roll those threads back first, or compensate by hand.",
            collection=rec.collection, record_id=rec.record_id,
        )  # fmt: skip
    if rec.after_absent:
        if current is not None:
            return RollbackRefused(
                f"rollback of thread {thread_id!r} refused: {name} was deleted by the "
                f"thread and has been created again since by another writer. Nothing was "
                f"changed.",
                collection=rec.collection, record_id=rec.record_id,
            )  # fmt: skip
        return None
    if current is None or current.get(VERSION) != rec.after_version:
        now = "deleted" if current is None else f"at version {current.get(VERSION)!r}"
        return RollbackRefused(
            f"rollback of thread {thread_id!r} refused: {name} was changed since by "
            f"another writer (the thread left it at version {rec.after_version!r}, it is "
            f"{now}). Nothing was changed.",
            collection=rec.collection, record_id=rec.record_id,
        )  # fmt: skip
    return None


def restore_group(db: str, tenant_id: str, index: int, rec: Record, thread_id: str) -> Group | None:
    """The write that gives ``rec`` back its before-image, matching only the state the
    thread left it in (else the transaction is refused naming it); None when there is
    nothing to do (created and deleted by the undone writes)."""
    name = f"record {rec.record_id!r} of {rec.collection!r}"

    def changed(counts: Counts) -> BaseException:
        return RollbackRefused(
            f"rollback of thread {thread_id!r} refused: {name} was changed by another "
            f"writer while the rollback ran. Nothing was changed.",
            collection=rec.collection, record_id=rec.record_id,
        )  # fmt: skip

    left = {"_id": rec.record_id, "tenant_id": tenant_id, VERSION: rec.after_version}
    if rec.before is None:
        if rec.after_absent:
            return None
        op, expect = Op("delete", left), Expect(deleted=1, error=changed)
    elif rec.after_absent:
        op, expect = Op("insert", doc=rec.before), Expect(inserted=1, error=changed)
    else:
        op, expect = Op("replace", left, rec.before), Expect(matched=1, error=changed)
    return Group(
        f"restore:{index}", db, rec.collection, BUSINESS.name, [op], expect=expect,
        sources=[{"op": "rollback", "collection": rec.collection, "record_id": rec.record_id}],
    )  # fmt: skip
