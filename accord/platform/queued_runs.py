"""The queue of runs: documents, statuses and the filters and updates that move them.

One document per run in the ``queued_run`` artifact collection (``accord_run_queue``):

``{_id (the run id), tenant_id, thread_id, graph, input, status, priority, attempts,
owner (holder fields), lease_expires, fence, bundle, idempotency_key, resume, result,
error, wait, events, submitted_at, updated_at, ...}``

Statuses: ``queued`` (waiting for a worker) -> ``running`` (a worker holds its lease) ->
``done`` / ``failed`` / ``cancelled``, or ``waiting`` (the graph called LangGraph's
``interrupt()``: no worker holds it) -> ``queued`` again when a human resumes it
(approve, reject, resume) or its wait's deadline acts.

* A worker *claims* a run with one ``findAndModify``: a queued run, or a running one whose
  lease expired (its worker died; or, same machine, whose worker process is gone). Each
  claim increments ``fence`` and ``attempts``; every later write of the worker on the run
  (heartbeat, waiting, done, failed, released) matches ``{_id, fence}``, so a worker that
  lost its lease (paused past it) changes nothing once another took the run over. The
  run's checkpoints are fenced by the run registry (:mod:`accord.platform.runs`): the
  worker runs the graph with the run id as LangGraph's ``run_id``, so the new worker's
  claim of the thread moves the thread's fence too and a zombie's commits are refused.
* Submission with an ``idempotency_key``: the run id is derived from (tenant, key), and
  the insert is an insert-once, so the same key submitted twice makes one run.
* Values the graph gets and returns (input, resume values, result) are stored encoded by
  a *codec* (``dumps_typed``/``loads_typed``, e.g. LangGraph's serializer), or as plain
  BSON when there is none.

Everything here is pure (documents, filters, updates); :mod:`.asynchronous.run_queue`
runs them through the kernel.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import bson

from accord.errors import InvalidInputError
from accord.platform.hosts import ProcessId
from accord.platform.text import surrogate_at

QUEUED = "queued"
RUNNING = "running"
WAITING = "waiting"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (QUEUED, RUNNING, WAITING, DONE, FAILED, CANCELLED)
#: Statuses a run never leaves.
FINAL = frozenset({DONE, FAILED, CANCELLED})

#: What a wait whose deadline passed does.
ON_TIMEOUT = ("fail", "cancel", "resume")

#: ``module.path:attribute`` (the graph a worker imports).
_GRAPH_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: How many events (claims, waits, decisions) a run keeps.
MAX_EVENTS = 50
#: Upper bound of an idempotency key's length.
MAX_KEY = 512


class Codec(Protocol):
    """How values are stored: LangGraph's serializers have this shape."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]: ...

    def loads_typed(self, data: tuple[str, bytes]) -> Any: ...


def now() -> datetime:
    return datetime.now(UTC)


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# --- validation --------------------------------------------------------------------------


def check_id(value: Any, name: str) -> str:
    """An identifier (run id, thread id, tenant id) as given by a caller: a non-empty
    string (never an operator document), at most 1024 characters, without NUL."""
    if not isinstance(value, str) or not value or len(value) > 1024 or "\x00" in value:
        raise InvalidInputError(
            f"{name} must be a non-empty string of at most 1024 characters without NUL, "
            f"got {type(value).__name__} ({value!r:.80})"
        )
    if surrogate_at(value) is not None:  # (pymongo's traceback, after the queue's first read)
        raise InvalidInputError(
            f"{name} is not valid Unicode text (a lone surrogate), got {value!r:.80}"
        )
    return value


def check_graph(graph: Any) -> str:
    if not isinstance(graph, str) or not _GRAPH_NAME.match(graph) or len(graph) > 300:
        raise InvalidInputError(
            f"graph must name a graph as 'module.path:attribute' (what `accord worker "
            f"--graph` imports), got {graph!r}"
        )
    return graph


def check_priority(priority: Any) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 1_000_000:
        raise InvalidInputError(
            f"priority must be an integer between -1000000 and 1000000 (higher runs first), "
            f"got {priority!r}"
        )
    return priority


#: The longest wait a run may be given (ten years): a deadline must be a date.
MAX_WAIT_SECONDS = 10 * 365 * 24 * 3600


def check_seconds(
    value: Any, name: str, *, allow_none: bool = True, at_most: float | None = None
) -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {value!r}")
    if at_most is not None and value > at_most:
        raise InvalidInputError(f"{name} must be at most {at_most:g} seconds, got {value!r}")
    return float(value)


def check_grace(value: Any) -> float:
    """A worker's ``grace``: seconds (0 allowed: give running runs back at once)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidInputError(f"grace must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_timeout_action(timeout: float | None, action: str, value: Any) -> None:
    """Refuse a deadline setting that would do nothing (a typo the run would pay for)."""
    if timeout is None and action != "fail":
        raise InvalidInputError(
            f"on_timeout={action!r} acts only when a wait passes its deadline: give "
            f"wait_timeout too"
        )
    if value is not None and action != "resume":
        raise InvalidInputError(
            f"timeout_value is what a run is resumed with when on_timeout='resume'; "
            f"on_timeout is {action!r}"
        )


def check_key(key: Any) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or "\x00" in key:
        raise InvalidInputError(
            f"idempotency_key must be a non-empty string of at most {MAX_KEY} characters "
            f"without NUL, got {key!r}"
        )
    return key


def check_on_timeout(action: Any) -> str:
    if action not in ON_TIMEOUT:
        raise InvalidInputError(
            f"on_timeout must be one of {list(ON_TIMEOUT)} (what a wait whose deadline "
            f"passed does), got {action!r}"
        )
    return str(action)


def check_status(status: Any) -> str:
    if status not in STATUSES:
        raise InvalidInputError(f"status must be one of {list(STATUSES)}, got {status!r}")
    return str(status)


_CREDENTIAL = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")


def check_credentials(credentials: Any) -> dict[str, datetime] | None:
    """Credentials a run holds, as name -> expiry (timezone-aware datetimes; the tokens
    themselves stay with the application: only when they expire is stored)."""
    if credentials is None:
        return None
    if not isinstance(credentials, Mapping) or len(credentials) > 50:
        raise InvalidInputError(
            f"credentials must be a mapping of at most 50 names to expiry datetimes, got "
            f"{credentials!r:.80}"
        )
    checked: dict[str, datetime] = {}
    for name, expires in credentials.items():
        if not isinstance(name, str) or not _CREDENTIAL.match(name):
            raise InvalidInputError(
                f"credential name {name!r} must be letters, digits, '_' or '-' (at most 100, "
                f"starting with a letter or '_')"
            )
        if not isinstance(expires, datetime) or expires.tzinfo is None:
            raise InvalidInputError(
                f"credential {name!r}: its expiry must be a timezone-aware datetime, got "
                f"{expires!r}"
            )
        checked[name] = expires.astimezone(UTC)
    return checked


def expired_credentials(doc: Mapping[str, Any], at: datetime) -> dict[str, datetime]:
    """The credentials of the run ``doc`` whose expiry is at or before ``at``."""
    found: dict[str, datetime] = {}
    for name, expires in (doc.get("credentials") or {}).items():
        when = _aware(expires)
        if when is not None and when <= at:
            found[name] = when
    return found


def credentials_update(credentials: dict[str, datetime], at: datetime, by: str | None) -> Any:
    return {
        "$set": {**{f"credentials.{n}": e for n, e in credentials.items()}, "updated_at": at},
        "$push": _push(event("credentials_refreshed", at, by=by, names=sorted(credentials))),
    }


def rewait_update(expired: dict[str, datetime], at: datetime) -> dict[str, Any]:
    """A resumed run whose credentials expired during its pause waits again (nothing of
    it ran) for a human: the resume and the wait's deadline are dropped."""
    names = sorted(expired)
    return {
        # no deadline any more: a deadline's resume would only find them expired again
        "$set": {"status": WAITING, "lease_expires": None, "resume": None, "updated_at": at,
                 "wait.expired": names, "wait.deadline": None},
        "$inc": {"attempts": -1},
        "$push": _push(event("credentials_expired", at, names=names)),
    }  # fmt: skip


# --- values ------------------------------------------------------------------------------


def encode(value: Any, codec: Codec | None, what: str) -> dict[str, Any]:
    """``value`` as stored: ``{type, data}`` by ``codec``, else ``{plain: value}`` (which
    must be BSON: dicts with string keys, lists, strings, numbers, ...)."""
    if codec is not None:
        kind, data = codec.dumps_typed(value)
        return {"type": kind, "data": data}
    try:
        bson.encode({"v": value})
    except Exception as exc:
        raise InvalidInputError(
            f"{what} cannot be stored without a codec ({exc}); pass plain data (dicts, "
            f"lists, strings, numbers) or give the queue a codec (LangGraph's serializer)"
        ) from None
    return {"plain": value}


def decode(stored: Mapping[str, Any] | None, codec: Codec | None) -> Any:
    """The value :func:`encode` stored."""
    if not stored:
        return None
    if "plain" in stored:
        return stored["plain"]
    if codec is None:
        raise InvalidInputError(
            "this value was stored by a codec (LangGraph's serializer); read it through a "
            "queue that has one (accord.runtime.Accord.runs() gives one)"
        )
    return codec.loads_typed((stored["type"], stored["data"]))


# --- documents ---------------------------------------------------------------------------


def run_id_for_key(tenant_id: str, key: str) -> str:
    """The run id of the submission with idempotency ``key``: the same key, the same run."""
    raw = json.dumps(["queued_run", tenant_id, key], separators=(",", ":"), ensure_ascii=False)
    return "run-" + hashlib.blake2b(raw.encode("utf-8"), digest_size=12).hexdigest()


def new_run_id() -> str:
    # not uuid4(): an application may make uuid4 deterministic; do not consume it
    return "run-" + secrets.token_hex(12)


def event(kind: str, at: datetime, **details: Any) -> dict[str, Any]:
    return {"event": kind, "at": at, **{k: v for k, v in details.items() if v is not None}}


def _push(*events: dict[str, Any]) -> dict[str, Any]:
    return {"events": {"$each": list(events), "$slice": -MAX_EVENTS}}


def submit_doc(
    *,
    run_id: str,
    tenant_id: str,
    thread_id: str,
    graph: str,
    input: dict[str, Any],
    priority: int,
    idempotency_key: str | None,
    bundle: Mapping[str, Any] | None,
    wait_timeout: float | None,
    on_timeout: str,
    timeout_value: dict[str, Any] | None,
    fork: Mapping[str, Any] | None,
    at: datetime,
    credentials: Mapping[str, datetime] | None = None,
) -> dict[str, Any]:
    return {
        "_id": run_id,
        "tenant_id": tenant_id,
        "thread_id": thread_id,
        "graph": graph,
        "input": input,
        "status": QUEUED,
        "priority": priority,
        "attempts": 0,
        "fence": 0,
        "lease_expires": None,
        "idempotency_key": idempotency_key,
        "bundle": dict(bundle) if bundle else None,
        "wait_timeout": wait_timeout,
        "on_timeout": on_timeout,
        "timeout_value": timeout_value,
        "fork": dict(fork) if fork else None,
        "credentials": dict(credentials) if credentials else None,
        "resume": None,
        "result": None,
        "error": None,
        "wait": None,
        "cancel_requested": False,
        "submitted_at": at,
        "updated_at": at,
        "events": [event("submitted", at)],
    }


def claim_filter(
    at: datetime, graphs: list[str], *, skip_tenants: list[str], skip_runs: list[str]
) -> dict[str, Any]:
    """Runs a worker of ``graphs`` may claim: queued ones, and running ones whose lease
    expired (their worker died), except ``skip_tenants`` (at their limit in this worker)
    and ``skip_runs`` (just given back: their thread is busy)."""
    filt: dict[str, Any] = {
        "graph": {"$in": graphs},
        "$or": [
            {"status": QUEUED},
            {"status": RUNNING, "lease_expires": {"$lte": at}},
        ],
    }
    if skip_tenants:
        filt["tenant_id"] = {"$nin": skip_tenants}
    if skip_runs:
        filt["_id"] = {"$nin": skip_runs}
    return filt


#: Which claimable run first: higher priority, then the oldest.
CLAIM_ORDER = [("priority", -1), ("submitted_at", 1)]

#: The ``thread_id`` of a tenant's claims document (it belongs to no thread).
CLAIMS_THREAD = "(tenant claims)"


def claims_id(tenant_id: str) -> dict[str, str]:
    """The ``_id`` of ``tenant_id``'s claims document: every claim of a worker with a
    tenant limit writes it in its transaction, so two claims for one tenant conflict (one
    is retried and sees the other's run). A subdocument: no run id (a string) is it."""
    return {"tenant_claims": tenant_id}


def claims_update(tenant_id: str, at: datetime) -> dict[str, Any]:
    return {
        "$inc": {"claims": 1},
        "$set": {"claimed_at": at},
        "$setOnInsert": {"tenant_id": tenant_id, "thread_id": CLAIMS_THREAD},
    }


def live_runs(tenant_id: str, at: datetime, other_than: str) -> dict[str, Any]:
    """The runs of ``tenant_id`` that a worker executes now (running, lease not expired),
    but ``other_than`` (the run being claimed: a takeover replaces its dead holder)."""
    return {
        "tenant_id": tenant_id, "status": RUNNING, "lease_expires": {"$gt": at},
        "_id": {"$ne": other_than},
    }  # fmt: skip


def claim_update(holder: ProcessId, worker: str, at: datetime, lease_seconds: float) -> Any:
    return {
        "$set": {
            "status": RUNNING,
            "owner": {**holder.fields(), "worker": worker},
            "lease_expires": at + timedelta(seconds=lease_seconds),
            "claimed_at": at,
            "updated_at": at,
        },
        "$inc": {"fence": 1, "attempts": 1},
        "$push": _push(event("claimed", at, worker=worker)),
    }


def dead_claim_filter(run_id: str, fence: int) -> dict[str, Any]:
    """Take over exactly the run ``run_id`` at ``fence`` (its worker process is dead)."""
    return {"_id": run_id, "fence": fence, "status": RUNNING}


def mine(run_id: str, fence: int) -> dict[str, Any]:
    """The run while this claim still holds it."""
    return {"_id": run_id, "fence": fence, "status": RUNNING}


def renew_update(at: datetime, lease_seconds: float) -> dict[str, Any]:
    return {"$set": {"lease_expires": at + timedelta(seconds=lease_seconds), "renewed_at": at}}


def started_update(base: str | None, at: datetime) -> dict[str, Any]:
    """The first execution records the checkpoint the run started from (None: a new
    thread): a later attempt that finds a newer one continues instead of starting over."""
    return {"$set": {"started": {"from": base, "at": at}, "updated_at": at}}


def done_update(result: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "$set": {"status": DONE, "result": result, "lease_expires": None, "finished_at": at,
                 "updated_at": at, "resume": None},
        "$push": _push(event("done", at)),
    }  # fmt: skip


def failed_update(error: str, at: datetime, *, status: str = FAILED) -> dict[str, Any]:
    return {
        "$set": {"status": status, "error": error, "lease_expires": None, "finished_at": at,
                 "updated_at": at},
        "$push": _push(event(status, at, error=error)),
    }  # fmt: skip


def waiting_update(
    interrupts: list[dict[str, Any]],
    checkpoint_id: str | None,
    at: datetime,
    wait_timeout: float | None,
    *,
    kind: str = "interrupt",
) -> dict[str, Any]:
    deadline = at + timedelta(seconds=wait_timeout) if wait_timeout else None
    return {
        "$set": {
            "status": WAITING,
            "lease_expires": None,
            "wait": {"kind": kind, "interrupts": interrupts, "since": at, "deadline": deadline,
                     "checkpoint_id": checkpoint_id},
            "resume": None,
            "updated_at": at,
            # a wait ends an execution: the claims that led to it were not workers dying
            "attempts": 0,
        },
        "$push": _push(event("waiting", at)),
    }  # fmt: skip


def released_update(at: datetime, reason: str) -> dict[str, Any]:
    """Given back by its worker (shutdown, its thread busy): queued again, this claim not
    counted as an attempt."""
    return {
        "$set": {"status": QUEUED, "lease_expires": None, "updated_at": at},
        "$inc": {"attempts": -1},
        "$push": _push(event("released", at, reason=reason)),
    }


def resume_update(
    value: dict[str, Any], at: datetime, *, decision: str, by: str | None
) -> dict[str, Any]:
    """A waiting run queued again with ``Command(resume=value)``."""
    return {
        "$set": {"status": QUEUED, "resume": {"value": value, "decision": decision, "by": by,
                                             "at": at}, "updated_at": at},
        "$push": _push(event(decision, at, by=by)),
    }  # fmt: skip


def waiting_filter(run_id: str) -> dict[str, Any]:
    return {"_id": run_id, "status": WAITING}


def expired_waits(at: datetime) -> dict[str, Any]:
    return {"status": WAITING, "wait.deadline": {"$lte": at}}


def cancel_update(at: datetime, by: str | None) -> dict[str, Any]:
    return {
        "$set": {"status": CANCELLED, "lease_expires": None, "finished_at": at, "updated_at": at,
                 "error": f"cancelled by {by or 'a caller'}"},
        "$push": _push(event("cancelled", at, by=by)),
    }  # fmt: skip


def cancel_request_update(at: datetime, by: str | None) -> dict[str, Any]:
    return {
        "$set": {"cancel_requested": True, "updated_at": at},
        "$push": _push(event("cancel_requested", at, by=by)),
    }


# --- views -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """A queued run as read (no input or result: :meth:`RunQueue.result` decodes those)."""

    run_id: str
    tenant_id: str
    thread_id: str
    graph: str
    status: str
    priority: int
    attempts: int
    fence: int
    owner: str | None
    lease_expires: datetime | None
    idempotency_key: str | None
    error: str | None
    wait: dict[str, Any] | None
    submitted_at: datetime | None
    updated_at: datetime | None
    cancel_requested: bool
    events: list[dict[str, Any]]
    document: dict[str, Any]

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Run:
        owner = doc.get("owner") or {}
        return cls(
            run_id=str(doc["_id"]),
            tenant_id=str(doc.get("tenant_id")),
            thread_id=str(doc.get("thread_id")),
            graph=str(doc.get("graph")),
            status=str(doc.get("status")),
            priority=int(doc.get("priority") or 0),
            attempts=int(doc.get("attempts") or 0),
            fence=int(doc.get("fence") or 0),
            owner=owner.get("worker") or owner.get("holder"),
            lease_expires=_aware(doc.get("lease_expires")),
            idempotency_key=doc.get("idempotency_key"),
            error=doc.get("error"),
            wait=doc.get("wait"),
            submitted_at=_aware(doc.get("submitted_at")),
            updated_at=_aware(doc.get("updated_at")),
            cancel_requested=bool(doc.get("cancel_requested")),
            events=list(doc.get("events") or []),
            document=dict(doc),
        )

    @property
    def ended(self) -> bool:
        return self.status in FINAL
