"""The run registry: which run may write a thread now (leases and fencing).

One document per (tenant, thread) in the ``run`` artifact collection:

``{_id, tenant_id, thread_id, run_id, holder, fence, lease_expires, version, claimed_at,
renewed_at, released_at}``

* A run *claims* the thread before it does anything (one atomic ``findAndModify``): it
  gets the lease when nobody holds it, when the holder's lease expired, or when the
  holder is the same run (a re-entry: e.g. a worker retrying a run after a crash). Each
  claim increments ``fence``. A claim while another run's lease is live is refused.
* Every commit of the holder carries a *guard*: an update of this document matching
  ``{run_id, fence}``, executed first inside the commit's transaction. A run whose lease
  was taken over (paused past its lease, partitioned) finds a larger fence: its guard
  fails and its commit is refused, so a stale worker can never write after a takeover.
  Because the guard *writes* the document (it renews the lease and sets ``version``), a
  takeover and a stale commit that overlap conflict on it: one of them is retried or
  refused, never both committed.
* A write that belongs to no run (an administrative ``update_state``, a migration, a
  direct API call) carries the *free guard*: it commits only while no live run holds
  the thread.
* ``version`` changes with every commit on the thread, whoever makes it: a process that
  remembers the version of its own last commit knows, from one small read (or from its
  claim), whether anyone else wrote the thread since, so it can serve the thread's state
  from memory.
* With a time to live, every commit also sets ``expire_at`` (last write + ttl):
  :func:`expired` finds the threads to delete.
* A run *renews* its lease while it works (a heartbeat, since one step can run longer
  than a lease) and *releases* it when it ends; a run that dies simply stops renewing,
  and its lease expires.

Everything here is pure (documents, filters, updates, write ops); the callers run them
with their own client. It is generic: the checkpointer uses it for LangGraph runs, and
durable execution's run workers extend it (takeover of expired leases, status) without
changing the guard every commit already carries.

Leases compare the writer's clock with the expiry written by another process's clock:
on one machine they agree; across machines keep the lease much longer than the clock
skew (NTP keeps it to milliseconds; the default lease is 10 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from accord.errors import ConcurrentRunError
from accord.platform.artifacts import RUN
from accord.platform.hosts import ProcessId
from accord.platform.plan import Counts, Expect, Group, Op

#: Default lease: how long a run holds a thread without renewing it. Short, because a
#: holder that died on another machine is only noticed when its lease expires; a live one
#: renews it every ``lease / 3`` (the heartbeat: one small update).
DEFAULT_LEASE_SECONDS = 10.0


def now() -> datetime:
    return datetime.now(UTC)


def run_doc_id(tenant_id: str, thread_id: str) -> str:
    """``_id`` of the registry document of (tenant, thread)."""
    raw = json.dumps(["run", tenant_id, thread_id], separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()


def holder_name() -> str:
    """Who holds a lease, for humans reading an error: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def new_version() -> str:
    """A fresh value for ``version`` (unique; only compared for equality)."""
    # not uuid4(): an application may make uuid4 deterministic; do not consume it
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Lease:
    """A run's hold on one thread, as its claim returned it."""

    tenant_id: str
    thread_id: str
    run_id: str
    fence: int
    holder: str
    expires_at: datetime
    #: ``version`` of the thread when the lease was claimed
    version: str | None

    @property
    def doc_id(self) -> str:
        return run_doc_id(self.tenant_id, self.thread_id)


@dataclass(frozen=True)
class Holder:
    """Who holds a thread according to its registry document (for error messages, and to
    judge whether the holding process is dead: ``process``)."""

    run_id: str | None
    holder: str | None
    fence: int
    expires_at: datetime | None
    process: ProcessId | None = None

    def live(self, at: datetime) -> bool:
        return self.run_id is not None and self.expires_at is not None and self.expires_at > at

    def describe(self) -> str:
        if self.run_id is None:
            return "no run"
        until = self.expires_at.isoformat(timespec="seconds") if self.expires_at else "?"
        return f"run {self.run_id!r} (held by process {self.holder or '?'}, lease until {until})"


def _aware(value: Any) -> datetime | None:
    """BSON datetimes come back naive (UTC) unless the client is tz-aware."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def holder_of(doc: Mapping[str, Any] | None) -> Holder:
    if doc is None:
        return Holder(None, None, 0, None)
    released = doc.get("lease_expires") is None
    fence = doc.get("fence")
    return Holder(
        None if released else doc.get("run_id"),
        doc.get("holder"),
        fence if isinstance(fence, int) and not isinstance(fence, bool) else 0,
        _aware(doc.get("lease_expires")),
        ProcessId.of_document(dict(doc)),
    )


def _free(at: datetime, run_ids: list[str]) -> list[dict[str, Any]]:
    """Clauses under which a claim may take the thread."""
    clauses: list[dict[str, Any]] = [
        {"lease_expires": None},
        {"lease_expires": {"$lte": at}},
    ]
    if run_ids:
        clauses.append({"run_id": {"$in": run_ids}})
    return clauses


def claim(
    tenant_id: str,
    thread_id: str,
    run_id: str,
    *,
    holder: ProcessId,
    at: datetime,
    lease_seconds: float,
    also_replace: list[str] | None = None,
    dead: Holder | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) of a claim: ``find_one_and_update(filter, update, upsert=True,
    return_document=AFTER)``. A ``DuplicateKeyError`` means another run holds a live lease
    (read the document for :func:`holder_of`). ``also_replace``: run ids this caller knows
    have ended (e.g. its own run whose release failed), which it may take over at once.
    ``dead``: a holder the caller found dead (:func:`accord.platform.hosts.is_dead`): the
    claim takes the thread from exactly that run and fence, whatever its lease says.
    """
    doc_id = run_doc_id(tenant_id, thread_id)
    if dead is not None:
        filt: dict[str, Any] = {"_id": doc_id, "run_id": dead.run_id, "fence": dead.fence}
    else:
        filt = {"_id": doc_id, "$or": _free(at, [run_id, *(also_replace or [])])}
    update = {
        "$set": {
            "run_id": run_id,
            **holder.fields(),
            "lease_expires": at + timedelta(seconds=lease_seconds),
            "claimed_at": at,
            "renewed_at": at,
        },
        "$inc": {"fence": 1},
        "$setOnInsert": {"tenant_id": tenant_id, "thread_id": thread_id},
    }
    return filt, update


def lease_from(doc: Mapping[str, Any]) -> Lease:
    """The lease a successful claim returned (the document after the update)."""
    expires = _aware(doc.get("lease_expires"))
    assert expires is not None
    return Lease(
        tenant_id=doc["tenant_id"],
        thread_id=doc["thread_id"],
        run_id=doc["run_id"],
        fence=int(doc["fence"]),
        holder=doc.get("holder") or "",
        expires_at=expires,
        version=doc.get("version"),
    )


def _mine(lease: Lease) -> dict[str, Any]:
    return {"_id": lease.doc_id, "run_id": lease.run_id, "fence": lease.fence}


def renew(
    lease: Lease, *, at: datetime, lease_seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) of a heartbeat: ``update_one``; matched 0 means the lease is lost
    (taken over) or was given back (a renewal never takes a released lease back)."""
    return {**_mine(lease), "lease_expires": {"$ne": None}}, {
        "$set": {"lease_expires": at + timedelta(seconds=lease_seconds), "renewed_at": at}
    }


def release(lease: Lease, *, at: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) of the end of a run: ``update_one``; a no-op once taken over."""
    return _mine(lease), {"$set": {"lease_expires": None, "released_at": at}}


def owner_guard(
    lease: Lease,
    version: str,
    *,
    at: datetime,
    lease_seconds: float,
    expire_at: datetime | None = None,
    release: bool = False,
    held_expire_at: datetime | None = None,
) -> Op:
    """The guard of a commit by the lease's run: first op of the transaction.

    It matches only while the run still holds the thread (same run, same fence), and
    renews the lease and sets ``version`` as part of the commit (``release``: gives the
    lease back instead, as :func:`release` does: the run's last commit). Expect
    ``matched == 1``.
    When the run was fenced out the upsert collides with the existing document
    (``DuplicateKey`` on the registry collection), which stops an ordered bulk write
    before any other op of the transaction runs; when the document is gone (the thread
    was deleted) the upsert creates one and ``matched`` is 0.
    """
    fields: dict[str, Any] = {"version": version}
    if release:
        fields.update(lease_expires=None, released_at=at)
    else:
        fields.update(lease_expires=at + timedelta(seconds=lease_seconds), renewed_at=at)
    if expire_at is not None:
        fields["expire_at"] = expire_at
    if held_expire_at is not None:  # a held thread's expiry, given back at its release
        fields["held_expire_at"] = held_expire_at
    return Op(
        "update",
        _mine(lease),
        {
            "$set": fields,
            "$setOnInsert": {"tenant_id": lease.tenant_id, "thread_id": lease.thread_id},
        },
        upsert=True,
    )


def free_guard(
    tenant_id: str,
    thread_id: str,
    version: str,
    *,
    at: datetime,
    expire_at: datetime | None = None,
    held_expire_at: datetime | None = None,
) -> Op:
    """The guard of a commit that belongs to no run: it commits only while no live run
    holds the thread (then the upsert collides: ``DuplicateKey`` on the registry
    collection). Expect ``matched + upserted == 1``."""
    fields: dict[str, Any] = {"version": version}
    if expire_at is not None:
        fields["expire_at"] = expire_at
    if held_expire_at is not None:
        fields["held_expire_at"] = held_expire_at
    return Op(
        "update",
        {"_id": run_doc_id(tenant_id, thread_id), "$or": _free(at, [])},
        {
            "$set": fields,
            "$setOnInsert": {"tenant_id": tenant_id, "thread_id": thread_id, "fence": 0},
        },
        upsert=True,
    )


def takeover(tenant_id: str, thread_id: str, version: str, *, at: datetime) -> Op:
    """An administrative write that ends whatever run holds the thread (e.g. deleting
    the thread): the lease is released and the fence moves on, so a run still working
    on the thread is refused at its next commit. Expect ``matched + upserted == 1``."""
    return Op(
        "update",
        {"_id": run_doc_id(tenant_id, thread_id)},
        {
            "$set": {"version": version, "lease_expires": None, "released_at": at},
            "$inc": {"fence": 1},
            "$setOnInsert": {"tenant_id": tenant_id, "thread_id": thread_id},
        },
        upsert=True,
    )


def expired(at: datetime) -> dict[str, Any]:
    """Filter of threads whose data expired (``expire_at``, set by commits when the
    writer has a time to live) and that no live run holds."""
    return {"expire_at": {"$lt": at}, "$or": _free(at, [])}


def expired_guard(
    tenant_id: str, thread_id: str, version: str, *, at: datetime, keep_expiry: bool = False
) -> Op:
    """The guard of the deletion of an expired thread: it commits only while the thread
    is still expired (``expire_at`` passed: no commit since) and no live run holds it;
    else the upsert collides (``DuplicateKey``). Expect ``matched == 1``.

    It takes ``expire_at`` off (the thread is gone: no later sweep finds it again), but
    not with ``keep_expiry``: a transaction of a thread deleted in several that is not
    its last, so that a deletion killed half-way leaves the thread expired, and the next
    sweep finds it and finishes the job."""
    change: dict[str, Any] = {
        "$set": {"version": version, "lease_expires": None, "released_at": at},
        "$inc": {"fence": 1},
    }
    if not keep_expiry:
        change["$unset"] = {"expire_at": ""}
    return Op("update", {"_id": run_doc_id(tenant_id, thread_id), **expired(at)}, change,
              upsert=True)  # fmt: skip


def version_filter(tenant_id: str, thread_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, projection) reading a thread's ``version`` (and its holder)."""
    return {"_id": run_doc_id(tenant_id, thread_id)}, {
        "version": 1,
        "run_id": 1,
        "holder": 1,
        "holder_host": 1,
        "holder_pid": 1,
        "holder_started": 1,
        "holder_machine": 1,
        "fence": 1,
        "lease_expires": 1,
    }


#: Name of the guard group the kernel puts first in a guarded transaction.
GUARD_GROUP = "run"

GuardKind = Literal["owner", "free", "takeover", "expired"]


@dataclass(frozen=True)
class ThreadGuard:
    """The run-registry guard of one commit on a thread, as data: a
    :class:`~accord.platform.context.WriteContext` carries it and the kernel puts its
    group (:meth:`group`, named :data:`GUARD_GROUP`) first in the transaction, so no writer
    can commit to a thread without it.

    ``kind``: ``owner`` (:func:`owner_guard`: the run holding ``lease``; ``release`` gives
    the lease back with this commit), ``free`` (:func:`free_guard`: a write of no run),
    ``takeover`` (:func:`takeover`: an administrative write that ends any run) or
    ``expired`` (:func:`expired_guard`: deleting an expired thread). ``db``/``collection``
    locate the registry. ``refused(counts)`` is the error when the guard's counts say the
    thread is not the writer's (the owner guard matched nothing, ...).
    """

    db: str
    collection: str
    kind: GuardKind
    tenant_id: str
    thread_id: str
    version: str
    at: datetime
    lease: Lease | None = None
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    expire_at: datetime | None = None
    release: bool = False
    refused: Callable[[Counts], BaseException] | None = None
    #: a held thread's commit: its expiry as it would be, kept for the hold's release
    held_expire_at: datetime | None = None
    #: an ``expired`` guard that leaves ``expire_at`` (:func:`expired_guard`)
    keep_expiry: bool = False

    def op(self) -> Op:
        if self.kind == "owner":
            if self.lease is None:
                raise ValueError("an owner guard needs the run's lease")
            return owner_guard(
                self.lease,
                self.version,
                at=self.at,
                lease_seconds=self.lease_seconds,
                expire_at=self.expire_at,
                release=self.release,
                held_expire_at=self.held_expire_at,
            )
        if self.kind == "free":
            return free_guard(
                self.tenant_id, self.thread_id, self.version, at=self.at,
                expire_at=self.expire_at, held_expire_at=self.held_expire_at,
            )  # fmt: skip
        if self.kind == "expired":
            return expired_guard(self.tenant_id, self.thread_id, self.version, at=self.at,
                                 keep_expiry=self.keep_expiry)  # fmt: skip
        return takeover(self.tenant_id, self.thread_id, self.version, at=self.at)

    def expect(self) -> Expect | None:
        refused = self.refused or _not_the_writer(self)
        if self.kind in ("owner", "expired"):
            return Expect(matched=1, error=refused)
        if self.kind == "free":
            return Expect(touched=1, error=refused)
        return None

    def group(self) -> Group:
        """The guard as the first group of a transaction."""
        return Group(GUARD_GROUP, self.db, self.collection, RUN.name, [self.op()],
                     expect=self.expect())  # fmt: skip


def _not_the_writer(guard: ThreadGuard) -> Callable[[Counts], BaseException]:
    def error(counts: Counts) -> BaseException:
        return ConcurrentRunError(
            f"the {guard.kind} guard of thread {guard.thread_id!r} did not match: another "
            f"run holds the thread or took it over; nothing was written. Reload the "
            f"thread's state and retry."
        )

    return error
