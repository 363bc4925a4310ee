"""The transactional outbox: events written with a step, consumed exactly once later.

Producers (the checkpointer) put :class:`~accord.platform.plan.OutboxEvent` s in their
plans; :class:`OutboxHook` turns them into idempotent inserts in the same transaction, so
an event exists if and only if the step committed. Consumers (the memory aggregator)
build plans with the helpers here:

1. :func:`claim_plan`: take the oldest available event with a lease (a
   ``find_one_and_update`` in its own short transaction): ``owner``, ``claim_id`` (a
   fence token new at every claim), ``lease_until``; ``attempts`` counts claims. An event
   whose lease expired (its worker died) is available again.
2. do the work outside any transaction (read, extract, embed: slow calls never run inside
   one);
3. commit the results and :func:`complete_group` in ONE plan: the completion matches only
   while this claim holds (``claim_id``), so a worker that lost its lease commits nothing
   (:class:`~accord.errors.LeaseLost`) and the new owner redoes the work: no event lost,
   no result twice.
4. on failure, :func:`release_plan` makes the event available again after a backoff, or
   moves it to ``status: "dead"`` with the error after ``max_attempts``.

While the work runs, :func:`renew_plan` extends the lease (a heartbeat), so slow work
(a model call) does not lose its event to another worker. ``attempts`` counts claims, so
an event whose workers keep losing it (crashed, stopped, slower than the lease without a
heartbeat) uses up its attempts as failures do: a consumer dead-letters an event claimed
more than ``max_attempts`` times (:func:`exhausted`) instead of working on it again.

What a producer writes cannot stop a consumer: :data:`VALIDATOR` (the collection's
``$jsonSchema``, applied by :func:`validator_command`) refuses malformed events at insert;
a claim only takes events whose ``attempts`` it can count (:data:`UNCLAIMABLE` are the
others; :func:`dead_letter_plan` moves them to ``dead`` with a reason), and
:meth:`ClaimedEvent.from_document` takes any document, :meth:`ClaimedEvent.problems`
saying what is wrong with it, so a consumer can dead-letter it at once.

Done events get ``expire_at`` (retention, a TTL index removes them); dead ones stay until
an operator looks at them.

Event document: ``_id`` (from kind, tenant and the event's natural key), ``tenant_id``,
``kind``, ``status`` (``pending`` | ``claimed`` | ``done`` | ``dead``), ``created_at``,
``available_at``, ``attempts``, and the producer's fields; while claimed ``owner``,
``claim_id``, ``lease_until``; ``error`` after a failure; ``done_at``/``expire_at``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pymongo import ASCENDING, IndexModel

from accord.errors import LeaseLost
from accord.platform.artifacts import CATALOG, CATALOG_COLLECTION, OUTBOX
from accord.platform.ids import doc_id
from accord.platform.plan import (
    Counts,
    Expect,
    Group,
    Op,
    OutboxEvent,
    Plan,
    PlanContext,
    insert_once,
)

PENDING, CLAIMED, DONE, DEAD = "pending", "claimed", "done", "dead"

#: How long a done event is kept before the TTL index removes it.
DEFAULT_RETENTION = timedelta(days=7)

#: Indexes of an outbox collection (``setup`` of any producer or consumer creates them).
INDEXES = [
    IndexModel(
        [("tenant_id", ASCENDING), ("status", ASCENDING), ("created_at", ASCENDING)],
        name="tenant_status_created",
    ),
    IndexModel([("tenant_id", ASCENDING), ("thread_id", ASCENDING)], name="tenant_thread"),
    IndexModel(
        [("status", ASCENDING), ("available_at", ASCENDING), ("created_at", ASCENDING)],
        name="status_available",
    ),
    IndexModel([("expire_at", ASCENDING)], name="retention", expireAfterSeconds=0),
]


#: Field of an outbox collection's catalog entry (``accord_catalog``) naming the
#: components that consume its events. Producers write events only into an outbox that
#: has a consumer, so a checkpointer used alone accumulates none.
CONSUMERS = "consumers"
#: The outbox collection's validator: what an event document must look like. Inserts and
#: updates that do not match are refused by the server (``validationLevel: moderate``:
#: documents that were already there before it was applied can still be dead-lettered).
#: Producers may add fields of their own; the ones listed must have these types.
VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": ["_id", "tenant_id", "kind", "status", "created_at"],
        "properties": {
            "_id": {"bsonType": ["string", "objectId"]},
            "tenant_id": {"bsonType": "string", "minLength": 1},
            "kind": {"bsonType": "string", "minLength": 1},
            "status": {"enum": ["pending", "claimed", "done", "dead"]},
            "created_at": {"bsonType": "date"},
            "available_at": {"bsonType": "date"},
            "attempts": {"bsonType": ["int", "long"], "minimum": 0},
            "owner": {"bsonType": "string"},
            "claim_id": {"bsonType": "string"},
            "lease_until": {"bsonType": "date"},
            "error": {"bsonType": "string"},
            "failed_at": {"bsonType": "date"},
            "done_at": {"bsonType": "date"},
            "expire_at": {"bsonType": "date"},
            "thread_id": {"bsonType": "string"},
            "checkpoint_ns": {"bsonType": "string"},
            "checkpoint_id": {"bsonType": "string"},
            "task_id": {"bsonType": "string"},
            "messages": {"bsonType": "array", "items": {"bsonType": "string"}},
            # a thread_deleted event: memories a legal hold keeps it waiting for
            "held_memories": {"bsonType": ["int", "long"], "minimum": 0},
        },
        # messages are a thread's: the keys of its short-term-memory documents
        "dependencies": {"messages": ["thread_id"]},
    }
}


def validator_command(collection: str) -> dict[str, Any]:
    """The ``collMod`` that applies :data:`VALIDATOR` to an existing outbox collection
    (idempotent)."""
    return {
        "collMod": collection,
        "validator": VALIDATOR,
        "validationLevel": "moderate",
        "validationAction": "error",
    }


#: An ``attempts`` a claim cannot count with ``$inc`` (present, and not a number).
_NOT_A_COUNT: dict[str, Any] = {"$exists": True, "$not": {"$type": "number"}}
#: Open events no claim takes: their ``attempts`` is not a number, or they are claimed with
#: a ``lease_until`` that is not a date (it never runs out). The validator refuses them;
#: they exist only where it was not applied. See :func:`dead_letter_plan`.
UNCLAIMABLE: dict[str, Any] = {
    "$or": [
        {"status": {"$in": ["pending", "claimed"]}, "attempts": _NOT_A_COUNT},
        {"status": "claimed", "lease_until": {"$not": {"$type": "date"}}},
        # a claim takes its kinds by name: an event whose kind is no string is never
        # claimed, nor counted in a status
        {"status": {"$in": ["pending", "claimed"]}, "kind": {"$not": {"$type": "string"}}},
    ]
}


def unclaimable_reason(doc: Mapping[str, Any]) -> str:
    """Why an :data:`UNCLAIMABLE` event cannot be claimed, for its dead letter."""
    attempts = doc.get("attempts")
    kind = doc.get("kind")
    if not isinstance(kind, str):
        what = f"kind is {_describe(kind)}, not a string, so no consumer claims it"
    elif "attempts" in doc and (
        isinstance(attempts, bool) or not isinstance(attempts, int | float)
    ):
        what = f"attempts is {_describe(attempts)}, not a count, so no claim can count it"
    else:
        what = (
            f"it is claimed with lease_until {_describe(doc.get('lease_until'))}, not a date, "
            f"so its lease never runs out"
        )
    return (
        f"malformed outbox event: {what}; dead-lettered without processing (see "
        f"docs/checkpointer.md for the event contract)"
    )


def now() -> datetime:
    return datetime.now(UTC)


def consumer_plan(db: str, collection: str, component: str) -> Plan:
    """Record ``component`` as a consumer of outbox ``db.collection`` in the catalog
    (idempotent; a consumer's setup runs it)."""
    op = Op(
        "update",
        {"_id": collection},
        {
            "$addToSet": {CONSUMERS: component},
            "$setOnInsert": {
                "artifact": OUTBOX.name,
                "component": component,
                "registered_at": now(),
            },
        },
        upsert=True,
    )
    return Plan(
        PlanContext(tenant_id="*", operation=f"{component}.setup"),
        [Group("catalog:consumer", db, CATALOG_COLLECTION, CATALOG.name, [op])],
    )


def has_consumers(entry: Mapping[str, Any] | None) -> bool:
    """Whether an outbox's catalog entry names a consumer."""
    return bool(entry and entry.get(CONSUMERS))


def event_id(event: OutboxEvent) -> str:
    return doc_id("o", event.kind, event.tenant_id, *event.key)


def event_document(event: OutboxEvent, at: datetime) -> dict[str, Any]:
    """The document of a newly enqueued event."""
    return {
        **dict(event.fields),
        "_id": event_id(event),
        "tenant_id": event.tenant_id,
        "kind": event.kind,
        "status": PENDING,
        "created_at": at,
        "available_at": at,
        "attempts": 0,
    }


class OutboxHook:
    """Kernel hook (derive phase): inserts a plan's events, once each, in the plan's
    transaction."""

    name = "outbox"

    def derive(self, plan: Plan) -> None:
        if not plan.events:
            return
        at = now()
        by_namespace: dict[tuple[str, str], list[Op]] = {}
        for event in plan.events:
            by_namespace.setdefault((event.db, event.collection), []).append(
                insert_once(event_document(event, at))
            )
        for (db, collection), ops in by_namespace.items():
            plan.add(Group(f"outbox:{db}.{collection}", db, collection, OUTBOX.name, ops))
        plan.events = []


@dataclass(frozen=True)
class ClaimedEvent:
    """An event this worker holds until ``lease_until``.

    Built from whatever document a claim returned (:meth:`from_document` never raises):
    fields that are missing or of the wrong type are ``None`` (``tenant_id`` "*"), and
    :meth:`problems` lists them, so the consumer can dead-letter the event with a reason
    instead of failing on it at every claim.
    """

    id: Any
    kind: str
    tenant_id: str
    claim_id: str
    attempts: int
    created_at: datetime | None
    document: Mapping[str, Any]
    #: when its first failure of the current streak was recorded (None: none yet)
    failing_since: datetime | None = None

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ClaimedEvent:
        attempts = doc.get("attempts", 0)
        if isinstance(attempts, float) and not math.isfinite(attempts):
            attempts = 0  # not a count: problems() says so
        tenant = doc.get("tenant_id")
        created = doc.get("created_at")
        return cls(
            id=doc.get("_id"),
            kind=str(doc.get("kind")),
            tenant_id=tenant if isinstance(tenant, str) and tenant else "*",
            claim_id=str(doc.get("claim_id")),
            attempts=int(attempts) if isinstance(attempts, int | float) else 0,
            created_at=created if isinstance(created, datetime) else None,
            document=doc,
            failing_since=failing
            if isinstance(failing := doc.get("failing_since"), datetime)
            else None,
        )

    def problems(self) -> list[str]:
        """What makes this document no event (empty: nothing): a reason per field."""
        doc = self.document
        found = []
        for name, kind, ok in (
            ("tenant_id", "a non-empty string", lambda v: isinstance(v, str) and v != ""),
            ("kind", "a non-empty string", lambda v: isinstance(v, str) and v != ""),
            ("created_at", "a date", lambda v: isinstance(v, datetime)),
            (
                "attempts",
                "a count",
                lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            ),
        ):
            if name not in doc:
                if name != "attempts":
                    found.append(f"{name} is missing")
            elif not ok(doc[name]):
                found.append(f"{name} is {_describe(doc[name])}, not {kind}")
        return found


def error_text(error: str) -> str:
    """An error message as the event keeps it: at most 2,000 characters, valid UTF-8 (an
    exception's text may hold lone surrogates, which BSON cannot store)."""
    return error[:2000].encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:40] + "..."
    return f"{type(value).__name__} {text}"


#: What a claim takes: ``available`` (pending events whose backoff has passed, in the
#: order they became available), ``expired`` (claimed events whose worker's lease ran
#: out), or ``any`` (either, oldest first).
ClaimWhich = Literal["any", "available", "expired"]


def claim_plan(
    db: str,
    collection: str,
    *,
    owner: str,
    lease: timedelta,
    kinds: Iterable[str] | None = None,
    at: datetime | None = None,
    which: ClaimWhich = "any",
) -> Plan:
    """A plan that claims one event (of ``kinds``, if given): see :data:`ClaimWhich`.

    ``PlanResult.found["claim"][0]`` is the claimed event's document, or None when no
    event is available. Several workers may claim concurrently: each event goes to one.

    ``available`` and ``expired`` are each served in index order by the ``status_available``
    index, so their cost does not grow with the backlog; ``any`` (an ``$or`` sorted by
    creation) examines every open event. A consumer under load claims ``available``
    events and looks for ``expired`` ones from time to time (the memory aggregator does
    so at least once a second).
    """
    at = at or now()
    # An event without available_at (a producer that writes its own documents, e.g. the
    # checkpointer's documented event shape) is available at once.
    available: dict[str, Any] = {"status": PENDING, "available_at": {"$not": {"$gt": at}}}
    expired: dict[str, Any] = {"status": CLAIMED, "lease_until": {"$lt": at}}
    sort: list[tuple[str, int]]
    if which == "available":
        filt, sort = available, [("available_at", ASCENDING), ("created_at", ASCENDING)]
    elif which == "expired":
        filt, sort = expired, [("lease_until", ASCENDING)]
    elif which == "any":
        # The status condition is redundant with the $or, but bounds the scan to the open
        # events (done ones pile up until retention removes them).
        filt = {"status": {"$in": [PENDING, CLAIMED]}, "$or": [available, expired]}
        sort = [("created_at", ASCENDING)]
    else:
        raise ValueError(f"which is 'any', 'available' or 'expired', not {which!r}")
    if kinds is not None:
        filt = {**filt, "kind": {"$in": sorted(set(kinds))}}
    # An attempts that $inc cannot count (a string, null...) would make the claim fail, for
    # every worker, as long as that event comes first: such events are never claimed
    # (UNCLAIMABLE; dead_letter_plan moves them aside).
    filt = {**filt, "$nor": [{"attempts": _NOT_A_COUNT}]}
    update = {
        "$set": {
            "status": CLAIMED,
            "owner": owner,
            "claim_id": uuid.uuid4().hex,
            "lease_until": at + lease,
        },
        "$inc": {"attempts": 1},
    }
    op = Op("find_one_and_update", filt, update, sort=sort)
    return Plan(
        PlanContext(tenant_id="*", operation="outbox.claim"),
        [Group("claim", db, collection, OUTBOX.name, [op])],
    )


def _lease_lost(event: ClaimedEvent) -> Any:
    def error(counts: Counts) -> LeaseLost:
        return LeaseLost(
            f"The lease on outbox event {event.id!r} ({event.kind}) expired and another "
            f"worker claimed it before this worker committed; nothing of this worker's "
            f"work on it was written (the new owner redoes it). Use a longer lease if "
            f"processing an event takes longer."
        )

    return error


def _held(event: ClaimedEvent) -> dict[str, Any]:
    return {"_id": event.id, "status": CLAIMED, "claim_id": event.claim_id}


def complete_group(
    db: str,
    collection: str,
    event: ClaimedEvent,
    *,
    retention: timedelta = DEFAULT_RETENTION,
    at: datetime | None = None,
    notes: Mapping[str, Any] | None = None,
) -> Group:
    """The group that marks ``event`` done; add it to the plan that commits the results.
    ``notes``: fields to set on the done event (e.g. what its consumer skipped, and why)."""
    at = at or now()
    op = Op(
        "update",
        _held(event),
        {
            "$set": {**(notes or {}), "status": DONE, "done_at": at, "expire_at": at + retention},
            "$unset": {"owner": "", "lease_until": "", "claim_id": ""},
        },
    )
    return Group(
        "outbox:done",
        db,
        collection,
        OUTBOX.name,
        [op],
        expect=Expect(matched=1, error=_lease_lost(event)),
    )


def defer_group(
    db: str,
    collection: str,
    event: ClaimedEvent,
    *,
    until: datetime,
    notes: Mapping[str, Any] | None = None,
) -> Group:
    """The group that gives ``event`` back, pending again from ``until``: its consumer did
    what it could and must come back later (a legal hold keeps part of its work back).
    Not a failure: its attempts start again from 0, so waiting never dead-letters it."""
    op = Op(
        "update",
        _held(event),
        {
            "$set": {**(notes or {}), "status": PENDING, "available_at": until, "attempts": 0},
            "$unset": {"owner": "", "lease_until": "", "claim_id": "", "failing_since": ""},
        },
    )
    return Group(
        "outbox:defer",
        db,
        collection,
        OUTBOX.name,
        [op],
        expect=Expect(matched=1, error=_lease_lost(event)),
    )


def renew_plan(
    db: str, collection: str, event: ClaimedEvent, lease: timedelta, *, at: datetime | None = None
) -> Plan:
    """Extend ``event``'s lease to ``at + lease`` while this claim holds it (a heartbeat).
    ``PlanResult.counts["outbox:renew"].matched`` is 0 when the lease was lost already."""
    at = at or now()
    op = Op("update", _held(event), {"$set": {"lease_until": at + lease}})
    return Plan(
        PlanContext(tenant_id=event.tenant_id, operation="outbox.renew"),
        [Group("outbox:renew", db, collection, OUTBOX.name, [op])],
    )


def exhausted(event: ClaimedEvent, max_attempts: int) -> bool:
    """Whether ``event`` was claimed more than ``max_attempts`` times: each earlier claim
    ended without completing or releasing it (its worker crashed, was stopped, or lost the
    lease), so it is dead-lettered rather than worked on again."""
    return event.attempts > max_attempts


#: How long an event must have been failing before its failures dead-letter it: an outage
#: of the embedder or the model (a minute of HTTP 503) must not dead-letter the backlog.
MIN_FAILING = timedelta(minutes=10)


def given_up(
    event: ClaimedEvent, max_attempts: int, at: datetime, *, min_failing: timedelta = MIN_FAILING
) -> bool:
    """Whether a failure of ``event`` at ``at`` dead-letters it: tried ``max_attempts``
    times, and failing for ``min_failing`` at least (a poison event goes dead after
    about ``min_failing``; one that only met an outage is retried, its backoff capped)."""
    since = event.failing_since or at
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return event.attempts >= max_attempts and at - since >= min_failing


def backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> timedelta:
    """Delay before attempt ``attempts + 1``: exponential, capped."""
    return timedelta(seconds=min(cap, base * 2 ** max(0, attempts - 1)))


def release_plan(
    db: str,
    collection: str,
    event: ClaimedEvent,
    error: str,
    *,
    max_attempts: int,
    at: datetime | None = None,
    dead: bool = False,
    min_failing: timedelta = MIN_FAILING,
) -> Plan:
    """Give ``event`` back after a failure: available again after a backoff, or dead
    (with the error) once it has been tried ``max_attempts`` times over at least
    :data:`MIN_FAILING` (:func:`given_up`), or at once with ``dead`` (an event no retry
    can help: malformed, or exhausted). Tried that often but not failing for that long
    yet, its count stays one short, so the next claim does not take it for a crash loop."""
    at = at or now()
    dead = dead or given_up(event, max_attempts, at, min_failing=min_failing)
    fields: dict[str, Any] = {"error": error_text(error), "failed_at": at}
    if dead:
        fields["status"] = DEAD
    else:
        fields.update(status=PENDING, available_at=at + backoff(event.attempts))
        if event.attempts >= max_attempts:
            fields["attempts"] = max_attempts - 1
    op = Op(
        "update",
        _held(event),
        {
            "$set": fields,
            "$min": {"failing_since": at},
            "$unset": {"owner": "", "lease_until": "", "claim_id": ""},
        },
    )
    return Plan(
        PlanContext(tenant_id=event.tenant_id, operation="outbox.release"),
        [Group("outbox:release", db, collection, OUTBOX.name, [op])],
    )


def dead_letter_plan(
    db: str, collection: str, reasons: Sequence[tuple[Any, str]], *, at: datetime | None = None
) -> Plan:
    """Move unclaimable events (:data:`UNCLAIMABLE`: ``reasons`` pairs their ``_id`` with
    why) to ``dead``. Each update matches only while the event is still unclaimable."""
    at = at or now()
    ops = [
        Op(
            "update",
            {"_id": _id, **UNCLAIMABLE},
            {
                "$set": {"status": DEAD, "error": error_text(reason), "failed_at": at},
                "$unset": {"owner": "", "lease_until": "", "claim_id": ""},
            },
        )  # fmt: skip
        for _id, reason in reasons
    ]
    return Plan(
        PlanContext(tenant_id="*", operation="outbox.dead_letter"),
        [Group("outbox:dead_letter", db, collection, OUTBOX.name, ops)],
    )
