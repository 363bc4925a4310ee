"""Staged business operations checked again where they arrive: ``put_writes``.

``business.*`` checks each operation in the node, but what ``put_writes`` applies is
whatever its ``writes`` carry on :data:`~accord.checkpointers.storage.BUSINESS_CHANNEL`,
and ``put_writes`` is public (a direct call, a migration replaying another saver's pending
writes). So the saver checks every staged operation again before anything is written, with
the same rules and the run's tenant (:func:`check_staged`):

* it is one of the operations ``business`` stages, with fields of the right types;
* an application write targets a valid business collection name (not ``system.*``, no
  ``$``, not one of accord's own collections), keeps ``_version`` to accord and passes the
  tenancy rules (:func:`accord.platform.tenancy.op_problem`);
* a workflow event goes to the workflow log only, as ``business.append_event`` builds it,
  for the run's tenant (another tenant's log is another tenant's data);
* an artifact commit names the artifact collection and a string id.

A refusal raises :class:`~accord.errors.InvalidInputError`; nothing of the task is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from datetime import datetime
from typing import Any

from accord.checkpointers import validation
from accord.checkpointers.plans import (
    APPEND_EVENT,
    COMMIT_ARTIFACT,
    bookkeeping_problem,
    business_op,
)
from accord.checkpointers.storage import BUSINESS_CHANNEL
from accord.errors import InvalidInputError
from accord.platform import gridfs_layout, workflow_log
from accord.platform.plan import Op
from accord.platform.tenancy import op_problem

#: The application writes ``business`` stages, and the fields each may carry.
_WRITES = {
    "insert_one": {"document"},
    "update_one": {"filter", "update", "upsert", "expect_version"},
    "replace_one": {"filter", "document", "upsert", "expect_version"},
    "delete_one": {"filter", "expect_version"},
}
_COMMON = {"op", "collection", "node"}
#: Fields of an event document (``workflow_log.event_doc``).
_EVENT_FIELDS = {"_id", "tenant_id", "workflow", "seq", "event", "thread_id", "node", "at"}


def check_staged(staged: Sequence[Any], tenant: str, thread_id: str, reserved: Set[str]) -> None:
    """Refuse (``InvalidInputError``) the first staged operation that ``business`` could
    not have staged for ``tenant``'s run on ``thread_id`` (module docstring)."""
    for index, spec in enumerate(staged):
        problem = _problem(spec, tenant, thread_id, reserved)
        if problem is not None:
            raise InvalidInputError(
                f"staged business write #{index} on channel {BUSINESS_CHANNEL!r} refused: "
                f"{problem}. Nothing of the task was written. Stage business writes with "
                f"accord.checkpointers.business inside a node; they may only touch the "
                f"run's tenant's ({tenant!r}) documents in the application's collections."
            )


def _problem(spec: Any, tenant: str, thread_id: str, reserved: Set[str]) -> str | None:
    if not isinstance(spec, Mapping):
        return f"it must be a staged operation (a dict), got {type(spec).__name__}"
    kind = spec.get("op")
    node = spec.get("node")
    if node is not None and not isinstance(node, str):
        return f"'node' must be a string, got {type(node).__name__}"
    if kind == APPEND_EVENT:
        return _event_problem(spec, tenant, thread_id, node)
    if kind == COMMIT_ARTIFACT:
        if spec.get("collection") != gridfs_layout.FILES:
            return f"an artifact commit targets {gridfs_layout.FILES!r} only"
        art = spec.get("artifact_id")
        if not isinstance(art, str) or not art or "\x00" in art:
            return "an artifact commit names its artifact by a non-empty string id"
        return None
    if kind not in _WRITES:
        return f"unknown operation {kind!r:.60} (expected one of {sorted(_WRITES)})"
    extra = set(spec) - _COMMON - _WRITES[kind]
    if extra:
        return f"unexpected fields {sorted(map(str, extra))} for {kind}"
    try:
        validation.collection_name(spec.get("collection"), reserved)
    except InvalidInputError as exc:
        return f"collection: {str(exc).rstrip('.')}"
    return _write_problem(spec, kind, tenant)


def _write_problem(spec: Mapping[str, Any], kind: str, tenant: str) -> str | None:
    for name in ("document", "filter"):
        if name in _WRITES[kind] and not isinstance(spec.get(name), Mapping):
            return f"{kind} needs a {name!r} dict"
    if kind == "update_one":
        update = spec.get("update")
        if isinstance(update, Mapping):
            if not update:
                return "the update is empty"
        elif not isinstance(update, Sequence) or isinstance(update, str | bytes):
            return "the update must be an operator document or a pipeline list"
    if kind == "replace_one" and any(str(k).startswith("$") for k in spec["document"]):
        return "a replacement is a document, not an update with operators"
    if not isinstance(spec.get("upsert", False), bool):
        return "'upsert' must be a bool"
    version = spec.get("expect_version")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 0
    ):
        return "'expect_version' must be a non-negative int"
    if version is not None and spec.get("upsert"):
        return "expect_version and upsert=True do not go together"
    problem = bookkeeping_problem(spec)
    if problem is not None:
        return f"{problem} ('_version' and 'held_expire_at' are kept by accord)"
    return tenancy_problem(spec, tenant)


def tenancy_problem(spec: Mapping[str, Any], tenant: str) -> str | None:
    """Why a staged application write could cross tenants or is not a valid write
    (:func:`accord.platform.tenancy.op_problem`), checked on the update as staged, then
    on the op accord runs (with its ``_version`` bump): the second alone would not see
    an operator of the staged update that is not a document (``{"$inc": 5}``), which the
    bump replaces, so the write would commit without it."""
    update = spec.get("update")
    if spec.get("op") == "update_one" and isinstance(update, Mapping):
        raw = Op("update", spec.get("filter"), update, upsert=bool(spec.get("upsert")))
        problem = op_problem(raw, tenant)
        if problem is not None:
            return problem
    return op_problem(business_op(spec), tenant)


def _event_problem(
    spec: Mapping[str, Any], tenant: str, thread_id: str, node: str | None
) -> str | None:
    if spec.get("collection") != workflow_log.COLLECTION:
        return f"a workflow event goes to {workflow_log.COLLECTION!r} only"
    if set(spec) - _COMMON - {"document"}:
        return "a workflow event carries only its document"
    doc = spec.get("document")
    if not isinstance(doc, Mapping) or set(doc) != _EVENT_FIELDS:
        return "a workflow event's document must be as business.append_event builds it"
    if doc.get("tenant_id") != tenant:
        return f"the event's tenant_id {doc.get('tenant_id')!r:.60} is not the run's tenant"
    try:
        workflow_log.workflow_name(doc.get("workflow"))
    except InvalidInputError as exc:
        return str(exc)
    if doc.get("seq") is not None:
        return "an event's seq is given by accord when the task commits, not staged"
    # who wrote it and when, as business.append_event records them: before 2026-12-07 a
    # put_writes caller could log an event without its thread (None), under any node
    # label of any type, at any "time"
    if doc.get("thread_id") != thread_id:
        return f"the event's thread_id {doc.get('thread_id')!r:.60} is not the run's thread"
    label = doc.get("node")
    if not isinstance(label, str | None) or (node is not None and label != node):
        return f"the event's node {label!r:.60} is not the staging node"
    if not isinstance(doc.get("at"), datetime):
        return f"the event's 'at' must be the time it was staged, got {doc.get('at')!r:.60}"
    event_id = doc.get("_id")
    if not isinstance(event_id, str) or not event_id.startswith("event:"):
        return "an event's _id is given by business.append_event"
    event = doc.get("event")
    if not isinstance(event, Mapping):
        return "the event must be a dict"
    try:
        workflow_log.event_doc(tenant, doc["workflow"], event)  # its size limit
    except InvalidInputError as exc:
        return str(exc)
    return None
