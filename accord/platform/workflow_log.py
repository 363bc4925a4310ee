"""Shared workflow event logs: ordered, append-only events that agents of one workflow
(several threads working on one business object) write in their step's transaction and
read to coordinate.

One collection (:data:`COLLECTION`, artifact class ``workflow_event``) holds every
workflow's events and, per (tenant, workflow), one head document with the last ``seq``.
An event is written by a plan like any other write (an ``insert`` of :func:`event_doc`,
checked by the policy and recorded by the audit trail) with ``seq`` unset; the kernel's
``seal`` phase (:class:`WorkflowLogHook`) then reads the workflow's head INSIDE the same
transaction attempt, gives the batch's events the next numbers in the order the plans
staged them, and moves the head. Two transactions appending to one workflow both write
its head: one of them is retried (a write conflict, or the head's compare-and-set), and
seals again on the head the other committed. So each workflow's ``seq`` runs 1, 2, 3...
with neither gaps nor duplicates, in commit order, and an event is visible exactly when
the step that wrote it committed (an aborted step leaves neither event nor number).

Readers ask for ``seq > after`` (:func:`read_filter`, sorted by ``seq``): an agent that
remembers the last ``seq`` it handled reads only what is new.

Pure builders and the hook; the kernel does the I/O. No LangGraph here: the checkpointer's
``business.append_event`` / ``business.read_events`` are the node-side doors.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, IndexModel

from accord.errors import InvalidInputError
from accord.platform.artifacts import WORKFLOW_EVENT
from accord.platform.hooks import HookCollection, SealBatch, SealConflict, SealRead
from accord.platform.plan import Counts, Expect, Group, Op
from accord.platform.text import surrogate_at

__all__ = [
    "COLLECTION", "INDEXES", "MAX_EVENT_BYTES", "WorkflowLogHook", "event_doc", "head_id",
    "read_filter", "workflow_name",
]  # fmt: skip

#: Where every workflow's events and heads live (the class's default collection).
COLLECTION = WORKFLOW_EVENT.default_collection or "accord_workflow_events"
#: Readers' index: a workflow's events in order (heads have no ``workflow`` field).
INDEXES = [IndexModel([("tenant_id", ASCENDING), ("workflow", ASCENDING), ("seq", ASCENDING)],
                      name="tenant_workflow_seq")]  # fmt: skip
#: An event's payload, at most (BSON bytes): a log is for coordination, not for files.
MAX_EVENT_BYTES = 64 * 1024
_MAX_NAME = 200


def workflow_name(value: Any) -> str:
    """``value`` if it names a workflow (a non-empty string of at most 200 characters,
    without NUL, valid Unicode), else ``InvalidInputError`` naming the problem."""
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME or "\x00" in value:
        raise InvalidInputError(
            f"workflow must be a non-empty string of at most {_MAX_NAME} characters without "
            f"NUL, got {value!r:.80}"
        )
    at = surrogate_at(value)
    if at is not None:
        raise InvalidInputError(
            f"workflow holds a lone surrogate at character {at}; names must be valid "
            f"Unicode, got {value!r:.80}"
        )
    return value


def head_id(tenant_id: str, workflow: str) -> str:
    """``_id`` of the head document of (tenant, workflow)."""
    raw = json.dumps(["workflow", tenant_id, workflow], separators=(",", ":"), ensure_ascii=False)
    return "head:" + hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()


def event_doc(
    tenant_id: str,
    workflow: str,
    event: Mapping[str, Any],
    *,
    thread_id: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The document a step inserts for one event (``seq`` is given by the seal)."""
    import bson  # local: only for the size check

    payload = dict(event)
    size = len(bson.encode(payload))
    if size > MAX_EVENT_BYTES:
        raise InvalidInputError(
            f"a workflow event is at most {MAX_EVENT_BYTES} bytes of BSON, this one is {size}: "
            f"store large data elsewhere (a business record, an artifact) and log its id"
        )
    return {
        # a string, not an ObjectId: the staged op is kept in the task's writes (serde)
        "_id": "event:" + secrets.token_hex(12),
        "tenant_id": tenant_id,
        "workflow": workflow,
        "seq": None,
        "event": payload,
        "thread_id": thread_id,
        "node": node,
        "at": datetime.now(UTC),
    }


def read_filter(tenant_id: str, workflow: str, after: int = 0) -> dict[str, Any]:
    """Filter of a workflow's events after ``seq`` ``after`` (sort by ``seq``)."""
    if isinstance(after, bool) or not isinstance(after, int):
        raise InvalidInputError(f"after must be a non-negative int (a seq), got {after!r:.80}")
    if not 0 <= after < 2**63:  # a seq is a 64-bit int; the driver raised OverflowError
        # (named by its size: repr() of a huge int raises ValueError)
        got = "a negative int" if after < 0 else f"an int of {after.bit_length()} bits"
        raise InvalidInputError(
            f"after must be a non-negative int of at most 64 bits (a seq), got {got}"
        )
    return {"tenant_id": tenant_id, "workflow": workflow, "seq": {"$gt": after}}


def _stale(counts: Counts) -> SealConflict:
    return SealConflict("a workflow log's head moved while sealing: sealing again")


def _pending(batch: SealBatch) -> dict[tuple[str, str, str, str], list[Any]]:
    """The batch's unnumbered events by (db, collection, tenant, workflow), in order."""
    found: dict[tuple[str, str, str, str], list[Any]] = defaultdict(list)
    for _, group in batch.groups():
        if group.artifact != WORKFLOW_EVENT.name:
            continue
        for op in group.ops:
            doc = op.doc
            if (
                op.kind == "insert"
                and isinstance(doc, Mapping)
                and "seq" in doc
                and doc["seq"] is None
                and isinstance(doc.get("workflow"), str)
                and isinstance(doc.get("tenant_id"), str)
            ):  # an event as event_doc builds it (an administrator's own insert is left be)
                key = (group.db, group.collection, doc["tenant_id"], doc["workflow"])
                found[key].append(doc["_id"])
    return found


class WorkflowLogHook:
    """Numbers a batch's workflow events inside its transaction (module docstring)."""

    name = "workflow_log"

    def collections(self, db: str) -> Mapping[str, HookCollection]:
        """The collection this hook sequences, for every component's catalog setup."""
        return {COLLECTION: HookCollection(WORKFLOW_EVENT.name, indexes=INDEXES)}

    def seal_reads(self, batch: SealBatch) -> Sequence[SealRead]:
        keys = sorted(_pending(batch))
        return [
            SealRead(f"workflow:{i}", db, coll, {"_id": head_id(tenant, workflow)}, limit=1)
            for i, (db, coll, tenant, workflow) in enumerate(keys)
        ]

    def seal(self, batch: SealBatch, found: Mapping[str, list[Any]]) -> Sequence[Group]:
        groups: list[Group] = []
        for i, (key, ids) in enumerate(sorted(_pending(batch).items())):
            db, coll, tenant, workflow = key
            heads = found.get(f"workflow:{i}") or []
            last = int(heads[0].get("seq") or 0) if heads else 0
            ops = [
                Op("update", {"_id": _id, "seq": None}, {"$set": {"seq": last + n}})
                for n, _id in enumerate(ids, start=1)
            ]
            groups.append(
                Group(
                    f"workflow:events:{i}",
                    db,
                    coll,
                    WORKFLOW_EVENT.name,
                    ops,
                    expect=Expect(matched=len(ops), error=_stale),
                )  # fmt: skip
            )
            hid = head_id(tenant, workflow)
            move = Op(
                "update",
                {"_id": hid, "seq": last} if heads else {"_id": hid},
                {"$set": {"seq": last + len(ids), "tenant_id": tenant, "of": workflow}},
                upsert=not heads,
            )
            groups.append(
                Group(
                    f"workflow:head:{i}",
                    db,
                    coll,
                    WORKFLOW_EVENT.name,
                    [move],
                    expect=Expect(touched=1, error=_stale),
                )  # fmt: skip
            )
        return groups
