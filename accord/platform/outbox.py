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

Done events get ``expire_at`` (retention, a TTL index removes them); dead ones stay until
an operator looks at them.

Event document: ``_id`` (from kind, tenant and the event's natural key), ``tenant_id``,
``kind``, ``status`` (``pending`` | ``claimed`` | ``done`` | ``dead``), ``created_at``,
``available_at``, ``attempts``, and the producer's fields; while claimed ``owner``,
``claim_id``, ``lease_until``; ``error`` after a failure; ``done_at``/``expire_at``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
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
    """An event this worker holds until ``lease_until``."""

    id: str
    kind: str
    tenant_id: str
    claim_id: str
    attempts: int
    created_at: datetime
    document: Mapping[str, Any]

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ClaimedEvent:
        return cls(
            id=doc["_id"],
            kind=doc["kind"],
            tenant_id=doc["tenant_id"],
            claim_id=doc["claim_id"],
            attempts=int(doc.get("attempts", 0)),
            created_at=doc["created_at"],
            document=doc,
        )


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
) -> Group:
    """The group that marks ``event`` done; add it to the plan that commits the results."""
    at = at or now()
    op = Op(
        "update",
        _held(event),
        {
            "$set": {"status": DONE, "done_at": at, "expire_at": at + retention},
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
) -> Plan:
    """Give ``event`` back after a failure: available again after a backoff, or dead
    (with the error) once it has been tried ``max_attempts`` times."""
    at = at or now()
    dead = event.attempts >= max_attempts
    fields: dict[str, Any] = {"error": error[:2000], "failed_at": at}
    if dead:
        fields["status"] = DEAD
    else:
        fields.update(status=PENDING, available_at=at + backoff(event.attempts))
    op = Op(
        "update",
        _held(event),
        {"$set": fields, "$unset": {"owner": "", "lease_until": "", "claim_id": ""}},
    )
    return Plan(
        PlanContext(tenant_id=event.tenant_id, operation="outbox.release"),
        [Group("outbox:release", db, collection, OUTBOX.name, [op])],
    )
