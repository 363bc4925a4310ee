"""The undo log of business writes: before-images recorded in the transaction that applies
the writes, so a thread can be rolled back (``saver.rollback``).

A kernel seal hook (:class:`UndoLogHook`). For every group of a batch that holds a task's
business writes (artifact class ``business`` with an ``origin``: the task's thread,
namespace, checkpoint and task id), it reads, INSIDE the transaction attempt and before
the batch's own writes, the record each update / replace / delete will touch (its
before-image; an insert has none: the record did not exist), and inserts one document per
write into :data:`COLLECTION` (artifact class ``business_undo``) in the same transaction:

``tenant_id``, ``thread_id``, ``checkpoint_ns``, ``checkpoint_id``, ``task_id``
    the task that wrote;
``db``, ``collection``, ``record_id``
    the record (``record_id`` None for an upsert that created a record whose ``_id`` the
    server chose: then ``locate`` holds the write's filter);
``before``
    the record before the write, BSON-encoded (None: it did not exist);
``after_version`` / ``after_absent``
    the record's ``_version`` after the write / whether the write removed it: a rollback
    restores only records still in that state (no other writer changed them since);
``seq``
    the thread's sequence number of the transaction (see below);
``at``, ``order``, ``n``
    when (this process's clock, kept in milliseconds), a number that increases with
    every batch this process seals, and the write's position in its batch.
    A rollback reads a thread's entries sorted by (``seq``, ``at``, ``order``, ``n``):
    :data:`SORT`.

The sequence. Each transaction that records writes of a thread gives them one number,
greater than every number the thread's earlier commits gave, so the log's order is the
commits' whatever the writers' clocks say (before 2026-12-07 it was (``at``, ``order``):
after a takeover by a machine whose clock was behind, the new writer's entries sorted
before the old one's and a rollback undid in the wrong order). The thread's last number
lives on its run-registry document (:data:`SEQ_FIELD`), which the transaction's guard
already writes under the run's fence: the hook adds a compare-and-set of it to the same
batch (``{undo_seq < seq}`` -> ``{undo_seq: seq}``), so two commits of a thread conflict
on it as they do on the guard, and one of them sees the other's number. The number is
``max(last + 1, clock in ms)``: ``last`` is what this process's previous commit of the
thread left (a per-process cache) or, on a retried attempt, what the transaction reads.
So the common step needs no read; a cache that is stale (another process wrote the
thread since, its clock ahead) makes the compare-and-set match nothing, the attempt is
retried (:class:`~accord.platform.hooks.SealConflict`) and the retry reads the number.
The clock term keeps the numbers increasing if the registry document is ever recreated
(retention of an idle thread's registry). Entries without ``seq`` (written before
2026-12-07; or a batch without a guard on the thread, which the checkpointer never
sends) sort first, among themselves as before.

Batches without such groups (a plain checkpoint step, a task without business writes)
cost nothing: no read, no write. Each business update / replace / delete costs one read
in the transaction; each business write one more inserted document; each thread of the
batch one more update (in the same ``bulkWrite`` on MongoDB 8.0+; its own command on the
per-collection fallback of older servers).

Limits: the before-image is the first record matching the write's filter (a filter that
matches several records may make the database update another one: name records by
``_id``); only writes staged through ``business`` are recorded (a direct write is not).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from bson import Binary
from pymongo import ASCENDING, IndexModel

from accord.platform.artifacts import BUSINESS, BUSINESS_UNDO, RUN
from accord.platform.hooks import HookCollection, SealBatch, SealConflict, SealRead
from accord.platform.plan import Counts, Expect, Group, Op
from accord.platform.runs import ThreadGuard, run_doc_id

__all__ = [
    "COLLECTION", "INDEXES", "SEQ_FIELD", "SORT", "UndoLogHook", "VERSION_FIELD", "decode",
    "scalar_key",
]  # fmt: skip

#: Where the before-images live (in the database of the business records).
COLLECTION = BUSINESS_UNDO.default_collection or "accord_business_undo"
#: The version every business write keeps on its record.
VERSION_FIELD = "_version"
INDEXES = [
    IndexModel(
        [("tenant_id", ASCENDING), ("thread_id", ASCENDING), ("checkpoint_id", ASCENDING)],
        name="tenant_thread_checkpoint",
    ),
    IndexModel(
        [
            ("tenant_id", ASCENDING),
            ("collection", ASCENDING),
            ("record_id", ASCENDING),
            ("at", ASCENDING),
        ],
        name="tenant_record_at",
    ),  # fmt: skip
]


#: The order of a thread's entries: commit order (module docstring; entries without
#: ``seq`` first, as MongoDB sorts a missing field before numbers).
SORT = [("seq", ASCENDING), ("at", ASCENDING), ("order", ASCENDING), ("n", ASCENDING)]
#: The thread's last undo sequence number, on its run-registry document.
SEQ_FIELD = "undo_seq"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_order_lock = threading.Lock()
_last_order = 0


def next_order() -> int:
    """A number greater than every one this process gave before: the clock in
    nanoseconds, or the last number + 1 when the clock did not move on. (``at`` alone
    ties: BSON keeps milliseconds, and a fast thread commits two steps in one.)"""
    global _last_order
    with _order_lock:
        _last_order = max(time.time_ns(), _last_order + 1)
        return _last_order


def encode(doc: Mapping[str, Any] | None) -> Binary | None:
    """A record or filter as BSON bytes (any field names, exact types)."""
    return None if doc is None else Binary(bson.encode(dict(doc)))


def decode(value: Any) -> dict[str, Any] | None:
    """The inverse of :func:`encode`."""
    return None if value is None else dict(bson.decode(bytes(value)))


def _recorded(batch: SealBatch) -> list[tuple[int, Group]]:
    """The batch's groups whose writes are recorded, numbered in batch order."""
    return [
        (i, g)
        for i, (_, g) in enumerate(batch.groups())
        if g.artifact == BUSINESS.name and g.origin is not None
    ]


#: A thread's registry document: (database, collection, ``_id``).
ThreadKey = tuple[str, str, str]


class _SeqCache:
    """The sequence number this process's last seal left per thread, at most ``size``
    threads (least recently sealed dropped first). Only a hint: a wrong one costs a
    retried attempt, never a wrong number (module docstring)."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._last: OrderedDict[ThreadKey, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: ThreadKey) -> int:
        with self._lock:
            return self._last.get(key, 0)

    def put(self, key: ThreadKey, seq: int) -> None:
        with self._lock:
            self._last[key] = seq
            self._last.move_to_end(key)
            while len(self._last) > self.size:
                self._last.popitem(last=False)


def _guards(batch: SealBatch) -> dict[tuple[str, str], ThreadGuard]:
    """The run-registry guards of the batch by (tenant, thread): a plan of
    ``execute_all`` without one runs behind an earlier plan's."""
    out: dict[tuple[str, str], ThreadGuard] = {}
    for plan in batch.plans:
        guard = plan.context.guard
        if guard is not None:
            out.setdefault((guard.tenant_id, guard.thread_id), guard)
    return out


def _threads(batch: SealBatch, recorded: list[tuple[int, Group]]) -> dict[int, ThreadKey]:
    """The registry document of the thread of each recorded group (by group number), for
    the groups whose thread has a guard in the batch."""
    guards = _guards(batch)
    plans = {id(g): p for p, g in batch.groups()}
    out: dict[int, ThreadKey] = {}
    for i, group in recorded:
        thread = (group.origin or {}).get("thread_id")
        guard = guards.get((plans[id(group)].context.tenant_id, str(thread)))
        if guard is not None:
            out[i] = (guard.db, guard.collection, run_doc_id(guard.tenant_id, guard.thread_id))
    return out


def _millis(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(milliseconds=1)


def _seq_stale(counts: Counts) -> SealConflict:
    return SealConflict("a thread's undo sequence moved on: sealing again on the stored one")


def _seq_group(k: int, key: ThreadKey, seq: int) -> Group:
    """The compare-and-set that takes the thread's sequence to ``seq`` (only from below:
    else the attempt is retried)."""
    db, coll, doc_id = key
    op = Op(
        "update",
        {"_id": doc_id, "$or": [{SEQ_FIELD: {"$lt": seq}}, {SEQ_FIELD: None}]},
        {"$set": {SEQ_FIELD: seq}},
    )
    return Group(f"undo_log:seq:{k}", db, coll, RUN.name, [op],
                 expect=Expect(matched=1, error=_seq_stale))  # fmt: skip


def _record_key(db: str, collection: str, record_id: Any) -> tuple[str, str, Any]:
    """A hashable key naming one record: a compound ``_id`` (a document or an array)
    by its BSON encoding, which tells apart ids that differ in a field, its order or a
    value's type as MongoDB does."""
    if isinstance(record_id, Mapping | list | tuple):
        return (db, collection, ("bson", bson.encode({"_id": record_id})))
    return (db, collection, scalar_key(record_id))


def scalar_key(record_id: Any) -> Any:
    """``record_id`` as a dict key that tells records apart as MongoDB does: Python holds
    ``True == 1`` (and hashes them alike), MongoDB does not; numbers of different types
    (1, 1.0) are one ``_id`` to both."""
    return ("bool", record_id) if isinstance(record_id, bool) else record_id


def _exact_id(value: Any) -> bool:
    """Whether a filter's ``_id`` value names one record by equality (not an operator
    document such as ``{"$in": [...]}``)."""
    if isinstance(value, Mapping):
        return not any(isinstance(k, str) and k.startswith("$") for k in value)
    return value is not None and not isinstance(value, list | tuple)


def _upserted_id(op: Op) -> Any:
    """The ``_id`` an upsert gives a record it creates, when the write names it."""
    filt = op.filter or {}
    if "_id" in filt and _exact_id(filt["_id"]):
        return filt["_id"]
    doc = op.doc
    if isinstance(doc, Mapping):
        if op.kind == "replace" and "_id" in doc:
            return doc["_id"]
        on_insert = doc.get("$setOnInsert")
        if isinstance(on_insert, Mapping) and "_id" in on_insert:
            return on_insert["_id"]
    return None


def _after_version(op: Op, before: Mapping[str, Any] | None) -> int | None:
    """The record's ``_version`` after ``op`` (None when unknown)."""
    doc = op.doc
    if op.kind == "insert" and isinstance(doc, Mapping):
        return doc.get(VERSION_FIELD)  # type: ignore[no-any-return]
    if op.kind == "replace" and isinstance(doc, Mapping):
        return doc.get(VERSION_FIELD)  # type: ignore[no-any-return]
    previous = (before or {}).get(VERSION_FIELD)
    return (previous if isinstance(previous, int) else 0) + 1


class UndoLogHook:
    """Records the before-images of a task's business writes (module docstring)."""

    name = "undo_log"

    def __init__(self) -> None:
        self._seqs = _SeqCache()

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The collection this hook writes, for every component's catalog setup."""
        return {COLLECTION: HookCollection(BUSINESS_UNDO.name, indexes=INDEXES)}

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        recorded = _recorded(batch)
        reads: list[SealRead] = []
        if batch.attempt > 1:  # a retry reads the sequence (the cache may be stale)
            for k, (db, coll, doc_id) in enumerate(sorted(set(_threads(batch, recorded).values()))):
                reads.append(SealRead(f"undo:seq:{k}", db, coll, {"_id": doc_id}, limit=1))
        for i, group in recorded:
            for j, op in enumerate(group.ops):
                if op.kind in ("update", "replace", "delete"):
                    reads.append(
                        SealRead(
                            f"undo:{i}:{j}",
                            group.db,
                            group.collection,
                            dict(op.filter or {}),
                            limit=1,
                        )  # fmt: skip
                    )
        return reads

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        by_db: dict[str, list[Op]] = {}
        at = datetime.now(UTC)
        # a record written twice in one batch: the reads all saw it before the batch, so
        # the second write's before-image is not known (a rollback uses the first's)
        # (keyed by _record_key: a compound _id is a dict, not hashable)
        seen: dict[tuple[str, str, Any], int | None] = {}
        n = 0
        recorded = _recorded(batch)
        order = next_order() if recorded else 0
        threads = _threads(batch, recorded)
        seqs = self._sequence(batch, found, sorted(set(threads.values())), at)
        for i, group in recorded:
            origin = group.origin or {}
            seq = seqs[threads[i]][1] if i in threads else None
            tenant = None
            for j, op in enumerate(group.ops):
                before: Mapping[str, Any] | None = None
                locate = None
                if op.kind == "insert":
                    record_id = op.doc.get("_id") if isinstance(op.doc, Mapping) else None
                    tenant = op.doc.get("tenant_id") if isinstance(op.doc, Mapping) else None
                else:
                    hits = found.get(f"undo:{i}:{j}") or []
                    tenant = (op.filter or {}).get("tenant_id")
                    named = (op.filter or {}).get("_id")
                    earlier = (
                        _record_key(group.db, group.collection, named) if _exact_id(named) else None
                    )
                    if hits:
                        before = hits[0]
                        record_id = before.get("_id")
                    elif earlier is not None and seen.get(earlier) is not None:
                        record_id = named  # created earlier in this batch (not in the read)
                    elif op.upsert:
                        record_id = _upserted_id(op)
                        if record_id is None:
                            locate = encode(op.filter)
                    else:
                        continue  # matches nothing: writes nothing
                key = _record_key(group.db, group.collection, record_id)
                first = record_id is None or key not in seen
                if not first:
                    previous = seen[key]
                    before = {VERSION_FIELD: previous} if previous is not None else None
                after_absent = op.kind == "delete"
                after = None if after_absent else _after_version(op, before)
                if record_id is not None:
                    seen[key] = after
                n += 1
                by_db.setdefault(group.db, []).append(
                    Op(
                        "insert",
                        doc={
                            "_id": "undo:" + secrets.token_hex(12),
                            "tenant_id": tenant,
                            "thread_id": origin.get("thread_id"),
                            "checkpoint_ns": origin.get("checkpoint_ns", ""),
                            "checkpoint_id": origin.get("checkpoint_id"),
                            "task_id": origin.get("task_id"),
                            "db": group.db,
                            "collection": group.collection,
                            "record_id": record_id,
                            "locate": locate,
                            "before": encode(before) if first else None,
                            "before_known": first,
                            "op": op.kind,
                            "after_version": after,
                            "after_absent": after_absent,
                            "seq": seq,
                            "at": at,
                            "order": order,
                            "n": n,
                            "txn": batch.transaction_id,
                        },
                    )  # fmt: skip
                )
        return [
            *(_seq_group(k, key, seq) for key, (k, seq) in sorted(seqs.items())),
            *(
                Group(f"undo_log:{k}", db, COLLECTION, BUSINESS_UNDO.name, ops)
                for k, (db, ops) in enumerate(sorted(by_db.items()))
            ),
        ]

    def _sequence(
        self,
        batch: SealBatch,
        found: Mapping[str, list[Any]],
        keys: list[ThreadKey],
        at: datetime,
    ) -> dict[ThreadKey, tuple[int, int]]:
        """Per thread, (its number in the batch, the sequence number of its entries):
        above the last one known (read on a retry, else this process's cache) and the
        clock (module docstring)."""
        out: dict[ThreadKey, tuple[int, int]] = {}
        for k, key in enumerate(keys):
            if batch.attempt > 1:
                docs = found.get(f"undo:seq:{k}") or []
                stored = docs[0].get(SEQ_FIELD) if docs else None
                last = stored if isinstance(stored, int) else 0
            else:
                last = self._seqs.get(key)
            seq = max(last + 1, _millis(at))
            if batch.attempt > 0:  # (0: the kernel's probe, nothing is written)
                self._seqs.put(key, seq)
            out[key] = (k, seq)
        return out
