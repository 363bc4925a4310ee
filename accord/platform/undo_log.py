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
``at``, ``order``, ``n``
    when (this process's clock, kept in milliseconds), a number that increases with
    every batch this process seals (it orders two batches of one millisecond: a thread's
    steps are written by one process at a time) and the write's position in its batch.
    A rollback reads a thread's entries sorted by (``at``, ``order``, ``n``).

Batches without such groups (a plain checkpoint step, a task without business writes)
cost nothing: no read, no write. Each business update / replace / delete costs one read
in the transaction; each business write one more inserted document.

Limits: the before-image is the first record matching the write's filter (a filter that
matches several records may make the database update another one: name records by
``_id``); only writes staged through ``business`` are recorded (a direct write is not).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import bson
from bson import Binary
from pymongo import ASCENDING, IndexModel

from accord.platform.artifacts import BUSINESS, BUSINESS_UNDO
from accord.platform.hooks import HookCollection, SealBatch, SealRead
from accord.platform.plan import Group, Op

__all__ = [
    "COLLECTION", "INDEXES", "SORT", "UndoLogHook", "VERSION_FIELD", "decode", "scalar_key",
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


#: The order of a thread's entries: write order (module docstring).
SORT = [("at", ASCENDING), ("order", ASCENDING), ("n", ASCENDING)]

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

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The collection this hook writes, for every component's catalog setup."""
        return {COLLECTION: HookCollection(BUSINESS_UNDO.name, indexes=INDEXES)}

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        reads: list[SealRead] = []
        for i, group in _recorded(batch):
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
        for i, group in recorded:
            origin = group.origin or {}
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
                            "at": at,
                            "order": order,
                            "n": n,
                            "txn": batch.transaction_id,
                        },
                    )  # fmt: skip
                )
        return [
            Group(f"undo_log:{k}", db, COLLECTION, BUSINESS_UNDO.name, ops)
            for k, (db, ops) in enumerate(sorted(by_db.items()))
        ]
