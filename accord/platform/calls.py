"""Recorded calls: the documents and writes that make a tool or model call replayable.

A checkpoint is saved after a task, not inside it: a task that called a bank and then
died is re-executed from its start, and calling the bank again would charge twice; asking
the model again would get another decision (a new transfer id: ACRFence's double charge).
So each call a task makes is recorded in the ``recorded_call`` collection, one document
per call site:

``{_id: key, tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, position, name,
run_id, fence, status, idempotent, args_digest, args, result, error, attempts,
divergences, intent_at, finished_at, parked_at, reason, resolved_by}``

* The *call site* is where in a run the call happens: the thread, the task's namespace
  and the checkpoint it runs from (which together name the task: LangGraph's task ids are
  derived from them, so a re-executed task has the same ones), and the call's
  *position* within the task (0, 1, 2... in the order the task makes its calls). The
  ``_id`` is the *idempotency key*, a digest of the call site: stable across
  re-executions and processes, and never derived from the arguments (a model that
  re-synthesizes a call gives other arguments, never another key). The run is recorded
  (``run_id``, ``fence``), not keyed: a crashed run is resumed by another run.
* Before the call an *intent* is committed (``status: intent``) with the canonical digest
  of the arguments and their serialized value; after it, the result (``done``). A failed
  call records its error (``failed``).
* When the task is re-executed, :func:`decide` tells what to do at each position:
  replay a recorded result, call (nothing recorded), retry with the same key (an intent
  without a result, for a call declared idempotent) or park (the same, not idempotent:
  ``needs_reconciliation``, until a human resolves it with the result the call had).

Every write also carries the *fence* of the run that makes it (:func:`fence_group`), the
same check the run's commits carry: a worker that lost its lease (paused past it, then
woke up) cannot record an intent or a result after another worker took the run over.

Everything here is pure (documents, filters, updates, groups); the call log
(:mod:`accord.platform.asynchronous.call_log`) runs them through the kernel.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from accord.errors import LeaseLost
from accord.platform.artifacts import RUN
from accord.platform.plan import Counts, Expect, Group, Op
from accord.platform.runs import Lease, run_doc_id

INTENT = "intent"
DONE = "done"
FAILED = "failed"
PARKED = "needs_reconciliation"
#: statuses of a call that may have taken effect without its result being recorded
UNSETTLED = (INTENT, FAILED, PARKED)

Decision = Literal["call", "replay", "retry", "park"]


@dataclass(frozen=True)
class CallSite:
    """Where in a run one call happens (see the module docstring)."""

    tenant_id: str
    thread_id: str
    #: the task's namespace (LangGraph's ``checkpoint_ns`` of the running task, ending
    #: with ``node:task_id``)
    checkpoint_ns: str
    #: the checkpoint the task runs from
    checkpoint_id: str
    task_id: str
    position: int

    @property
    def key(self) -> str:
        """The idempotency key: a digest of the call site, never of the arguments."""
        raw = json.dumps(
            ["call", self.tenant_id, self.thread_id, self.checkpoint_ns, self.checkpoint_id,
             self.task_id, self.position],
            separators=(",", ":"), ensure_ascii=False,
        )  # fmt: skip
        return "call-" + hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()

    def describe(self, name: str) -> str:
        return (
            f"call {name!r} at position {self.position} of task {self.task_id} "
            f"(thread {self.thread_id!r}, checkpoint {self.checkpoint_id})"
        )


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data whose encoding does not depend on dict order or on
    object identity: mappings sorted by key, tuples and sets as lists (sets sorted),
    pydantic models and dataclasses as their fields, anything else by ``repr``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value else "NaN"
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, _dt.datetime | _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, set | frozenset):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model (a LangChain message, a tool's input)
        return {"$type": type(value).__name__, **canonical(dump())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"$type": type(value).__name__, **canonical(dataclasses.asdict(value))}
    return {"$repr": repr(value)}


def digest(value: Any) -> str:
    """SHA-256 of the canonical JSON of ``value`` (the arguments of a call)."""
    text = json.dumps(canonical(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def decide(doc: Mapping[str, Any] | None, *, idempotent: bool) -> Decision:
    """What a task at a call site does, given the site's recorded document (None:
    nothing recorded)."""
    if doc is None:
        return "call"
    if doc.get("status") == DONE:
        return "replay"
    return "retry" if idempotent else "park"


def intent_doc(
    site: CallSite,
    *,
    name: str,
    lease: Lease | None,
    args_digest: str,
    args: Mapping[str, Any] | None,
    idempotent: bool,
    at: _dt.datetime,
) -> dict[str, Any]:
    """The document recorded before a call (``args``: the serialized arguments)."""
    return {
        "_id": site.key,
        "tenant_id": site.tenant_id,
        "thread_id": site.thread_id,
        "checkpoint_ns": site.checkpoint_ns,
        "checkpoint_id": site.checkpoint_id,
        "task_id": site.task_id,
        "position": site.position,
        "name": name,
        "run_id": lease.run_id if lease is not None else None,
        "fence": lease.fence if lease is not None else None,
        "status": INTENT,
        "idempotent": idempotent,
        "args_digest": args_digest,
        "args": dict(args) if args is not None else None,
        "attempts": 1,
        "divergences": 0,
        "intent_at": at,
    }


def carried(
    doc: Mapping[str, Any], *, checkpoint_ns: str, checkpoint_id: str, task_id: str
) -> dict[str, Any]:
    """``doc`` (a recorded call of a task) moved to the same task of another checkpoint:
    a bundle migration writes a new checkpoint under a paused or crashed task, which
    LangGraph then runs again under a new task id. The copy has the new site's key as
    ``_id`` and keeps the provider-facing ``idempotency_key`` of the original, so a
    retried idempotent call is still deduplicated by its provider."""
    site = CallSite(doc["tenant_id"], doc["thread_id"], checkpoint_ns, checkpoint_id,
                    task_id, int(doc["position"]))  # fmt: skip
    return {
        **dict(doc),
        "_id": site.key,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        "task_id": task_id,
        "idempotency_key": doc.get("idempotency_key") or doc["_id"],
        "carried_from": doc["_id"],
    }


def _unsettled(key: str) -> dict[str, Any]:
    return {"_id": key, "status": {"$in": list(UNSETTLED)}}


def result_op(key: str, result: Mapping[str, Any], *, at: _dt.datetime) -> Op:
    """Record the result of a call whose intent is recorded (expect ``matched == 1``)."""
    return Op(
        "update",
        _unsettled(key),
        {"$set": {"status": DONE, "result": dict(result), "finished_at": at},
         "$unset": {"error": ""}},
    )  # fmt: skip


def failure_op(key: str, error: str, *, at: _dt.datetime) -> Op:
    """Record that a call raised ``error`` (its effect is unknown: it stays unsettled)."""
    return Op(
        "update",
        {"_id": key, "status": {"$in": [INTENT, FAILED]}},
        {"$set": {"status": FAILED, "error": error[:2000], "finished_at": at}},
    )


def withdraw_op(key: str) -> Op:
    """Remove the intent of a call that did not end but handed control back to LangGraph
    (it called ``interrupt()``): LangGraph runs it again from its start on resume, as it
    runs every node that interrupts."""
    return Op("delete", {"_id": key, "status": INTENT})


def retry_op(key: str, *, lease: Lease | None, at: _dt.datetime) -> Op:
    """An unsettled call is made again, with the same key (an idempotent call)."""
    return Op(
        "update",
        _unsettled(key),
        {"$set": {"status": INTENT, "retried_at": at,
                  "run_id": lease.run_id if lease is not None else None,
                  "fence": lease.fence if lease is not None else None},
         "$inc": {"attempts": 1}},
    )  # fmt: skip


def park_op(key: str, reason: str, *, at: _dt.datetime) -> Op:
    """Park an unsettled call for a human (``needs_reconciliation``)."""
    return Op(
        "update",
        _unsettled(key),
        {"$set": {"status": PARKED, "reason": reason, "parked_at": at}},
    )


def run_parked_op(tenant_id: str, thread_id: str, key: str, name: str, *, at: _dt.datetime) -> Op:
    """Mark the thread's run-registry document as parked on call ``key`` (what ``accord
    runs`` shows as waiting for a human). Never creates the document."""
    return Op(
        "update",
        {"_id": run_doc_id(tenant_id, thread_id)},
        {"$set": {"parked": {"call": key, "name": name, "at": at}}},
    )


def run_unparked_op(tenant_id: str, thread_id: str, key: str) -> Op:
    """Clear the parked mark of call ``key`` (it was settled)."""
    return Op(
        "update",
        {"_id": run_doc_id(tenant_id, thread_id), "parked.call": key},
        {"$unset": {"parked": ""}},
    )


def resolve_op(
    key: str,
    result: Mapping[str, Any],
    *,
    by: str,
    at: _dt.datetime,
    tenant_id: str,
    thread_id: str,
) -> Op:
    """A human settles an unsettled call of ``tenant_id``'s thread ``thread_id`` with the
    result it had (re-executions replay it). Expect ``matched == 1``. The key comes from
    the caller (an error message, a form): the filter pins the tenant and the thread, so
    a key of another tenant's (or thread's) call matches nothing."""
    return Op(
        "update",
        {**_unsettled(key), "tenant_id": tenant_id, "thread_id": thread_id},
        {"$set": {"status": DONE, "result": dict(result), "resolved_by": by,
                  "finished_at": at}},
    )  # fmt: skip


def divergence_op(key: str, args_digest: str, *, at: _dt.datetime) -> Op:
    """Count a re-execution whose arguments differ from the recorded ones."""
    return Op(
        "update",
        {"_id": key},
        {"$inc": {"divergences": 1},
         "$set": {"divergent_digest": args_digest, "diverged_at": at}},
    )  # fmt: skip


def fence_group(
    db: str,
    runs_collection: str,
    lease: Lease,
    *,
    at: _dt.datetime,
    lost: Callable[[Counts], BaseException] | None = None,
    after_call: bool = False,
) -> Group:
    """The run's fence as the first group of a call's write: it matches only while the
    run still holds its thread (same run, same fence, lease not given back), so a worker
    that lost its lease cannot record a call. It sets ``calls_at`` only, never the
    thread's ``version``: a recorded call changes no checkpoint, and a process's cache
    of the thread's state stays valid. ``after_call``: the write records the outcome of a
    call that was made (its refusal says so)."""

    def refused(counts: Counts) -> BaseException:
        return LeaseLost(
            f"run {lease.run_id!r} no longer holds thread {lease.thread_id!r} (another "
            f"worker took it over, or the run ended): its recorded call was not written "
            f"and the call was not made. The run that holds the thread now replays or "
            f"reconciles it."
        )

    def refused_after_call(counts: Counts) -> BaseException:
        return LeaseLost(
            f"run {lease.run_id!r} no longer holds thread {lease.thread_id!r} (another "
            f"worker took it over, or the run ended) while its call was under way: the "
            f"call's outcome was not recorded by this run. The run that holds the thread "
            f"now retries the call with the same idempotency key (an idempotent call) or "
            f"parks it for reconciliation."
        )

    return Group(
        "fence",
        db,
        runs_collection,
        RUN.name,
        [Op("update",
            {"_id": run_doc_id(lease.tenant_id, lease.thread_id), "run_id": lease.run_id,
             "fence": lease.fence, "lease_expires": {"$ne": None}},
            {"$set": {"calls_at": at}})],
        expect=Expect(matched=1, error=lost or (refused_after_call if after_call else refused)),
    )  # fmt: skip
