"""The aggregator: long-term memory derived from committed steps, exactly once.

Every step the checkpointer commits writes an ``outbox`` event in the same transaction
(kind ``checkpoint``, with the keys of the step's new ``short_term_memory`` documents in
``messages``; kind ``writes`` for a task's writes; docs/checkpointer.md). The aggregator
consumes them:

1. **claim** one event with a lease (``accord.platform.outbox.claim_plan``: owner, fence
   ``claim_id``, ``lease_until``; an event whose worker died is claimable again once its
   lease ran out);
2. **read** the event's new messages from ``short_term_memory``;
3. **extract** changes (:mod:`accord.memory.extraction`: the deterministic rules by
   default, or a chat model);
4. **embed** and **consolidate** them against the tenant's memories
   (:mod:`accord.memory.consolidation`: slots, repeated statements, near-duplicates,
   episodes);
5. **commit** in ONE plan through the unit of work: the memories (inserts that exist only
   if absent, replaces and deletes compare-and-set on the version read), their previous
   versions in ``memory_history``, the namespaces' consolidation heads, and the event's
   completion (``complete_group``, which matches only while this worker's claim holds).

So a crash anywhere loses nothing and duplicates nothing: before the commit nothing of
the event's work exists and the event is claimed again when its lease expires; the commit
is atomic; after it the event is done and is never processed again. A worker that lost its
lease commits nothing (``LeaseLost``). A failure (the extractor, the embedder, the
database) releases the event with exponential backoff; after ``max_attempts`` claims it is
dead-lettered (``status: "dead"`` with the error). A commit that finds the memories
changed since it read them (another worker, a store write) decides the event again.

Steps 2-4 run outside any transaction (model and embedding calls never run inside one).
Several aggregator processes may run at once (``accord memory worker``), or one
:class:`BackgroundAggregator` thread in the application's process. Done events keep
``expire_at`` (``retention``); the outbox's TTL index removes them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel, MongoClient

from accord.errors import (
    AccordError,
    ConfigurationError,
    DatabaseError,
    ExtractionError,
    LeaseLost,
    MemoryConflictError,
)
from accord.memory import model
from accord.memory.consolidation import DEFAULT_THRESHOLD, Consolidator, Decisions, Prepared
from accord.memory.embedders import check_dimensions
from accord.memory.extraction import (
    EPISODE,
    Change,
    Conversation,
    Existing,
    Extractor,
    RuleExtractor,
    Turn,
)
from accord.memory.synchronous.service import MemoryService
from accord.memory.writepath import LONG_TERM_MEMORY, MEMORY_HISTORY, Catalog, UnitOfWork
from accord.platform import outbox
from accord.platform.artifacts import OUTBOX
from accord.platform.ids import doc_id
from accord.platform.plan import Expect, Group, Op, Plan, PlanContext, insert_once

log = logging.getLogger("accord.memory.aggregator")

COMPONENT = "memory.aggregator"
#: Where a kind of memory goes by default. Labels are templates: ``{thread_id}``,
#: ``{tenant_id}`` and ``{kind}`` are filled in (``.`` in a value is escaped as ``%2E``,
#: since namespace labels cannot contain dots). ``*`` is every other kind.
DEFAULT_NAMESPACES: Mapping[str, tuple[str, ...]] = {
    EPISODE: ("episodes", "{thread_id}"),
    "*": ("memories",),
}

Stage = Callable[[str, outbox.ClaimedEvent], None]

#: The outbox indexes a consumer needs: claims, retention, backlog per tenant, lag. (The
#: producer's own, e.g. per thread, are the producer's to create.)
CONSUMER_INDEXES = [
    i for i in outbox.INDEXES
    if i.document["name"] in ("status_available", "retention", "tenant_status_created")
] + [IndexModel([("status", ASCENDING), ("done_at", DESCENDING)], name="done")]  # fmt: skip


@dataclass(frozen=True)
class AggregatorConfig:
    """How the aggregator works; every field has a default.

    Args:
        db_name: the database of the outbox, the messages and the memories.
        outbox: the outbox collection (the checkpointer's ``outbox``).
        messages: the short-term memory collection (the checkpointer's ``messages``).
        heads: consolidation heads, one small document per namespace.
        kinds: event kinds consumed (``writes`` events carry no messages: they are
            completed at once, so retention removes them).
        lease: seconds an event stays claimed before another worker may take it over.
        max_attempts: claims before an event is dead-lettered.
        threshold: cosine similarity from which two memories of one kind in one
            namespace are merged.
        namespaces: kind -> namespace template (see :data:`DEFAULT_NAMESPACES`).
        poll_interval: seconds a worker waits when no event is available.
        retention: days a done event is kept before the TTL index removes it.
        conflict_retries: times an event is decided again when its commit found the
            memories changed, before it is released for a later attempt.
    """

    db_name: str = "accord"
    outbox: str = "outbox"
    messages: str = "short_term_memory"
    heads: str = "memory_heads"
    kinds: tuple[str, ...] = ("checkpoint", "writes")
    lease: float = 60.0
    max_attempts: int = 5
    threshold: float = DEFAULT_THRESHOLD
    namespaces: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: DEFAULT_NAMESPACES)
    poll_interval: float = 0.1
    retention: float = 7.0
    conflict_retries: int = 5

    def __post_init__(self) -> None:
        for name in ("db_name", "outbox", "messages", "heads"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "$" in value or "\x00" in value:
                raise ConfigurationError(
                    f"{name} must be a collection/database name, got {value!r}"
                )
        if not self.kinds or not all(isinstance(k, str) and k for k in self.kinds):
            raise ConfigurationError(f"kinds must be non-empty strings, got {self.kinds!r}")
        for name, low in (("lease", 0.01), ("poll_interval", 0.0), ("retention", 0.0)):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < low:
                raise ConfigurationError(f"{name} must be a number >= {low}, got {value!r}")
        for name in ("max_attempts", "conflict_retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.threshold, int | float) or not 0.0 < self.threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if "*" not in self.namespaces:
            raise ConfigurationError("namespaces needs a '*' entry (the default namespace)")
        for kind, template in self.namespaces.items():
            if not isinstance(template, tuple | list) or not template:
                raise ConfigurationError(f"namespace of {kind!r} must be a tuple of labels")
            model.check_namespace(
                [str(label).format(tenant_id="t", thread_id="t", kind="k") for label in template]
            )


@dataclass(frozen=True)
class Outcome:
    """What happened to one claimed event: ``done``, ``retry`` (released with backoff),
    ``dead`` (dead-lettered), or ``lost`` (its lease expired; another worker has it)."""

    event_id: str
    status: str
    memories: int = 0
    error: str | None = None


def label_value(value: str) -> str:
    """``value`` made fit for a namespace label (``%`` and ``.`` escaped)."""
    return value.replace("%", "%25").replace(".", "%2E")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Aggregator:
    """Consumes outbox events into long-term memory (see the module docstring).

    Args:
        client: a pymongo ``MongoClient`` (replica set, Atlas, or the embedded engine).
        embedder, dims: as for :class:`~accord.memory.synchronous.service.MemoryService`
            (default: the deterministic hashing embedder). Use the same as the store that
            searches the memories.
        extractor: an :class:`~accord.memory.extraction.Extractor` (default
            :class:`~accord.memory.extraction.RuleExtractor`).
        config: :class:`AggregatorConfig`.
        service: an existing memory service to share (its client, embedder, collections).
        worker_id: this worker's name in claims (default: host, pid and a random suffix).
        on_stage: called at each stage (``claim``, ``extract``, ``embed``, ``commit``)
            with the event: for tests that crash a worker at a chosen point.
    """

    def __init__(
        self,
        client: MongoClient[Any],
        *,
        embedder: Any = None,
        dims: int | None = None,
        extractor: Extractor | None = None,
        config: AggregatorConfig | None = None,
        service: MemoryService | None = None,
        uow: UnitOfWork | None = None,
        worker_id: str | None = None,
        on_stage: Stage | None = None,
    ) -> None:
        self.config = config or AggregatorConfig()
        self.client = client
        self.uow = uow or (service.uow if service is not None else UnitOfWork(client))
        self.service = service or MemoryService(
            client, db_name=self.config.db_name, embedder=embedder, dims=dims, uow=self.uow
        )
        if self.service.db_name != self.config.db_name:
            raise ConfigurationError(
                f"the memory service uses database {self.service.db_name!r} but the "
                f"aggregator {self.config.db_name!r}; use one database"
            )
        self.extractor: Extractor = extractor or RuleExtractor()
        if not isinstance(self.extractor, Extractor):
            raise ConfigurationError(
                f"extractor {type(self.extractor).__name__} has no name/extract(); see "
                f"accord.memory.extraction.Extractor"
            )
        self.worker_id = worker_id or default_worker_id()
        self.on_stage = on_stage
        self._db = client[self.config.db_name]
        self._next_expired_check = 0.0

    # -- setup ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the memory collections and vector index, the outbox's indexes and the
        consolidation heads (idempotent; safe from several processes at once)."""
        self.service.setup()
        Catalog(self.uow, self.config.db_name).setup(
            COMPONENT,
            {self.config.outbox: OUTBOX.name, self.config.heads: LONG_TERM_MEMORY},
            {
                self.config.outbox: CONSUMER_INDEXES,
                self.config.heads: [IndexModel([("tenant_id", ASCENDING)], name="tenant")],
            },
        )

    # -- the loop ---------------------------------------------------------------------------

    def claim(self) -> outbox.ClaimedEvent | None:
        """Claim an event, or None: one whose worker's lease ran out (looked for at most
        every ``min(1 s, lease / 4)``), else the one available longest. Both claims are
        served in index order, so their cost does not grow with the backlog."""
        now = time.monotonic()
        if now >= self._next_expired_check:
            self._next_expired_check = now + min(1.0, self.config.lease / 4)
            event = self._claim("expired")
            if event is not None:
                return event
        return self._claim("available")

    def _claim(self, which: outbox.ClaimWhich) -> outbox.ClaimedEvent | None:
        plan = outbox.claim_plan(
            self.config.db_name,
            self.config.outbox,
            owner=self.worker_id,
            lease=timedelta(seconds=self.config.lease),
            kinds=self.config.kinds,
            which=which,
        )
        doc = self.uow.execute(plan).found["claim"][0]
        return None if doc is None else outbox.ClaimedEvent.from_document(doc)

    def run_once(self) -> Outcome | None:
        """Claim and process one event; None when no event is available."""
        event = self.claim()
        return None if event is None else self.process(event)

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        max_events: int | None = None,
        until_idle: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> int:
        """Process events until ``stop`` is set, ``max_events`` were processed, or (with
        ``until_idle``) none is available. Returns how many were processed. A database
        that cannot be reached is waited for (with backoff), not fatal."""
        stop = stop or threading.Event()
        processed, pause = 0, self.config.poll_interval
        while not stop.is_set() and (max_events is None or processed < max_events):
            try:
                outcome = self.run_once()
            except DatabaseError as exc:
                log.warning("aggregator %s: cannot claim (%s); retrying", self.worker_id, exc)
                pause = min(5.0, max(pause * 2, 0.1))
                stop.wait(pause)
                continue
            pause = self.config.poll_interval
            if outcome is None:
                if until_idle:
                    break
                stop.wait(self.config.poll_interval)
                continue
            processed += 1
            if on_outcome is not None:
                on_outcome(outcome)
        return processed

    def drain(self, max_events: int | None = None) -> int:
        """Process every event available now (events waiting for a retry are not)."""
        return self.run(until_idle=True, max_events=max_events)

    # -- one event --------------------------------------------------------------------------

    def process(self, event: outbox.ClaimedEvent) -> Outcome:
        """Aggregate a claimed event and commit it with its completion; on failure release
        it (backoff) or dead-letter it. Never raises for a failure of the event itself."""
        try:
            self._stage("claim", event)
            written = self._aggregate(event)
        except LeaseLost as exc:
            log.info("aggregator %s lost event %s: %s", self.worker_id, event.id, exc)
            return Outcome(event.id, "lost", error=str(exc))
        except Exception as exc:  # any failure of the event's work is retried, then dead
            message = f"{type(exc).__name__}: {exc}"
            dead = event.attempts >= self.config.max_attempts
            log.warning(
                "aggregator %s: event %s (%s, attempt %d) failed%s: %s",
                self.worker_id, event.id, event.kind, event.attempts,
                " and is dead-lettered" if dead else "; retrying later", message,
            )  # fmt: skip
            try:
                self.uow.execute(
                    outbox.release_plan(
                        self.config.db_name, self.config.outbox, event, message,
                        max_attempts=self.config.max_attempts,
                    )
                )  # fmt: skip
            except AccordError as release_error:  # its lease runs out; it is claimed again
                log.warning("could not release event %s: %s", event.id, release_error)
            return Outcome(event.id, "dead" if dead else "retry", error=message)
        return Outcome(event.id, "done", memories=written)

    def _stage(self, stage: str, event: outbox.ClaimedEvent) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, event)

    def _aggregate(self, event: outbox.ClaimedEvent) -> int:
        conversation = self.read(event)
        for attempt in range(self.config.conflict_retries):
            self._stage("extract", event)
            changes: list[Change] = []
            if conversation is not None and conversation.turns:
                changes = list(self.extractor.extract(conversation, self._recall(event)))
            plan, written = self.plan(event, conversation, changes)
            self._stage("commit", event)
            try:
                self.uow.execute(plan)
                return written
            except MemoryConflictError:
                if attempt == self.config.conflict_retries - 1:
                    raise
                log.info("event %s: memories changed meanwhile; deciding again", event.id)
        raise AssertionError("unreachable")

    def read(self, event: outbox.ClaimedEvent) -> Conversation | None:
        """The event's new messages (None: an event without messages)."""
        doc = event.document
        keys = doc.get("messages") or []
        if not keys:
            return None
        thread_id = doc.get("thread_id")
        if not isinstance(thread_id, str) or not isinstance(keys, list):
            raise ExtractionError(
                f"outbox event {event.id} has messages but no thread_id string; it was not "
                f"written by accord's checkpointer (see docs/checkpointer.md)"
            )
        found = self._db[self.config.messages].find(
            {"tenant_id": event.tenant_id, "thread_id": thread_id, "key": {"$in": keys}},
            {"key": 1, "chunk": 1, "message_id": 1, "role": 1, "text": 1, "created_at": 1},
        )
        by_key = {d["key"]: d for d in found if d.get("chunk", 0) == 0 and "message_id" in d}
        missing = [k for k in keys if k not in by_key]
        if missing:  # e.g. the thread was deleted or pruned before it was aggregated
            log.info("event %s: %d of %d messages are gone", event.id, len(missing), len(keys))
        turns = [
            Turn(
                message_id=str(d["message_id"]),
                role=str(d.get("role", "")),
                text=d.get("text") if isinstance(d.get("text"), str) else None,
                created_at=model.aware(d.get("created_at")),
                key=k,
            )
            for k in keys
            if (d := by_key.get(k)) is not None
        ]
        checkpoint_id = doc.get("checkpoint_id")
        return Conversation(
            tenant_id=event.tenant_id,
            thread_id=thread_id,
            turns=turns,
            checkpoint_ns=str(doc.get("checkpoint_ns") or ""),
            checkpoint_id=checkpoint_id if isinstance(checkpoint_id, str) else None,
        )

    # -- deciding and planning --------------------------------------------------------------

    def namespace_for(self, change: Change, event: outbox.ClaimedEvent) -> tuple[str, ...]:
        if change.namespace is not None:
            return model.check_namespace(change.namespace)
        template = self.config.namespaces.get(change.kind) or self.config.namespaces["*"]
        values = {
            "tenant_id": label_value(event.tenant_id),
            "thread_id": label_value(str(event.document.get("thread_id") or "")),
            "kind": label_value(change.kind),
        }
        return model.check_namespace([str(label).format(**values) for label in template])

    def plan(
        self,
        event: outbox.ClaimedEvent,
        conversation: Conversation | None,
        changes: Sequence[Change],
    ) -> tuple[Plan, int]:
        """The plan that commits ``changes`` with the event's completion, and how many
        memories it writes. Reads the memories and heads it compares against."""
        tenant = event.tenant_id
        now = model.utcnow()
        prepared = [Prepared(c, self.namespace_for(c, event), c.key) for c in changes]
        compared = {
            p.namespace for p in prepared
            if p.change.action == "add" and p.key is None and p.change.merge
        }  # fmt: skip
        heads = self._read_heads(tenant, compared)  # before the neighbours are read
        provenance = self._provenance(event, conversation)
        decisions = Consolidator(
            tenant,
            load=lambda ids: self._load(tenant, ids),
            similar=lambda ns, kind, vector, k: self._similar(tenant, ns, kind, vector, k, now),
            embed=lambda texts: self._embed(event, texts),
            threshold=self.config.threshold,
            now=now,
            provenance=provenance,
        ).decide(prepared)
        groups = self._memory_groups(decisions, now)
        written_ns = {
            tuple(d["namespace"])
            for i in decisions.changed()
            if (d := decisions.after[i] or decisions.before.get(i)) is not None
        }
        groups += self._head_groups(tenant, heads, decisions.compared & written_ns)
        db, coll = self.config.db_name, self.config.outbox
        groups.append(
            outbox.complete_group(
                db, coll, event, retention=timedelta(days=self.config.retention), at=now
            )
        )
        context = PlanContext(
            tenant,
            thread_id=conversation.thread_id if conversation else None,
            principal=self.worker_id,
            operation="memory.aggregate",
        )
        return Plan(context, groups), len(decisions.changed())

    def _provenance(
        self, event: outbox.ClaimedEvent, conversation: Conversation | None
    ) -> Callable[[Change], model.Provenance]:
        def make(change: Change) -> model.Provenance:
            return model.Provenance(
                source=f"aggregator:{self.extractor.name}",
                tenant_id=event.tenant_id,
                thread_id=conversation.thread_id if conversation else None,
                checkpoint_id=conversation.checkpoint_id if conversation else None,
                message_ids=tuple(change.message_ids),
            )

        return make

    def _load(self, tenant: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        coll = self._db[self.service.memory_collection]
        return {d["_id"]: d for d in coll.find({"_id": {"$in": list(ids)}, "tenant_id": tenant})}

    def _similar(
        self,
        tenant: str,
        namespace: tuple[str, ...],
        kind: str,
        vector: Sequence[float],
        k: int,
        now: datetime,
    ) -> list[dict[str, Any]]:
        path = model.ns_path(namespace)
        found = self.service.for_tenant(tenant).nearest(
            namespace, vector, limit=k, kinds=[kind], projection=None,
            keep=lambda d: d.get("ns_path") == path and model.live(d, now),
        )  # fmt: skip
        return [d for d, _ in found]

    def _embed(self, event: outbox.ClaimedEvent, texts: Sequence[str]) -> list[list[float]]:
        self._stage("embed", event)
        vectors = self.service.embedder.embed_documents(list(texts))
        for v in vectors:
            if len(v) != self.service.dims:
                check_dimensions(_Dims(len(v), self.service.embedder.name), self.service.dims,
                                 f"the vector index of {self.service.memory_collection}")  # fmt: skip
        return vectors

    def _recall(self, event: outbox.ClaimedEvent) -> Any:
        service = self.service.for_tenant(event.tenant_id)

        def recall(
            text: str, *, kinds: Sequence[str] | None = None, limit: int = 5
        ) -> list[Existing]:
            self._stage("embed", event)
            hits = service.search((), query=text, kinds=kinds, limit=limit, include_unscored=False)
            return [Existing(m.namespace, m.key, m.text, m.kind, m.score or 0.0, m.value)
                    for m in hits]  # fmt: skip

        return recall

    def _memory_groups(self, decisions: Decisions, now: datetime) -> list[Group]:
        db, memories = self.config.db_name, self.service.memory_collection
        inserts = Group("memory:insert", db, memories, LONG_TERM_MEMORY)
        replaces = Group("memory:replace", db, memories, LONG_TERM_MEMORY)
        deletes = Group("memory:delete", db, memories, LONG_TERM_MEMORY)
        history = Group("memory:history", db, self.service.history_collection, MEMORY_HISTORY)
        for _id in decisions.changed():
            before, after = decisions.before.get(_id), decisions.after[_id]
            if before is None and after is not None:
                inserts.ops.append(insert_once(after))
                continue
            assert before is not None
            cas = {"_id": _id, "version": before["version"]}
            if after is None:
                deletes.ops.append(Op("delete", cas))
                change = "delete"
            else:
                replaces.ops.append(Op("replace", cas, after))
                change = decisions.label.get(_id, "update")
            history.ops.append(insert_once(model.history_document(before, now, change)))
        inserts.expect = Expect(upserted=len(inserts.ops), error=_conflict)
        replaces.expect = Expect(matched=len(replaces.ops), error=_conflict)
        deletes.expect = Expect(deleted=len(deletes.ops), error=_conflict)
        return [g for g in (inserts, replaces, deletes, history) if g.ops]

    # -- consolidation heads ----------------------------------------------------------------

    def _head_id(self, tenant: str, namespace: tuple[str, ...]) -> str:
        return doc_id("memory-head", tenant, model.ns_path(namespace))

    def _read_heads(
        self, tenant: str, namespaces: set[tuple[str, ...]]
    ) -> dict[tuple[str, ...], int]:
        if not namespaces:
            return {}
        ids = {self._head_id(tenant, ns): ns for ns in namespaces}
        found = self._db[self.config.heads].find({"_id": {"$in": list(ids)}, "tenant_id": tenant})
        return {ids[d["_id"]]: int(d["seq"]) for d in found}

    def _head_groups(
        self, tenant: str, heads: Mapping[tuple[str, ...], int], namespaces: set[tuple[str, ...]]
    ) -> list[Group]:
        """Compare-and-set the heads of the namespaces where this event compared new
        memories with existing ones: two workers that both decided "no near-duplicate
        here" cannot both commit."""
        db, coll = self.config.db_name, self.config.heads
        new = Group("memory:heads:new", db, coll, LONG_TERM_MEMORY)
        bump = Group("memory:heads:bump", db, coll, LONG_TERM_MEMORY)
        for ns in sorted(namespaces):
            _id = self._head_id(tenant, ns)
            if ns in heads:
                bump.ops.append(Op("update", {"_id": _id, "seq": heads[ns]}, {"$inc": {"seq": 1}}))
            else:
                new.ops.append(
                    insert_once({"_id": _id, "tenant_id": tenant, "namespace": list(ns), "seq": 1})
                )
        new.expect = Expect(upserted=len(new.ops), error=_conflict)
        bump.expect = Expect(matched=len(bump.ops), error=_conflict)
        return [g for g in (new, bump) if g.ops]

    # -- observability ----------------------------------------------------------------------

    def stats(self, *, tenant_id: str | None = None, window: int = 500) -> AggregationStats:
        return aggregation_stats(
            self._db[self.config.outbox], tenant_id=tenant_id, kinds=self.config.kinds,
            window=window,
        )  # fmt: skip


def _conflict(_: Any) -> BaseException:
    return MemoryConflictError(
        "long-term memories changed between the aggregator's read and its commit; nothing "
        "was written and the event is decided again"
    )


class _Dims:
    def __init__(self, dims: int, name: str) -> None:
        self.dims, self.name = dims, name


# -- backlog and lag ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AggregationStats:
    """The outbox as the aggregator sees it.

    ``lag_p50``/``lag_p95``/``lag_max``: seconds from an event's creation (its step's
    transaction) to its completion (the memories' commit, from which they are searchable
    on the embedded engine; Atlas Search indexes them asynchronously, usually within a
    second), over the ``lag_samples`` most recently done events.
    """

    pending: int
    claimed: int
    dead: int
    oldest_pending_age: float | None
    lag_p50: float | None
    lag_p95: float | None
    lag_max: float | None
    lag_samples: int

    @property
    def backlog(self) -> int:
        """Events not aggregated yet (pending or being processed)."""
        return self.pending + self.claimed

    def as_dict(self) -> dict[str, Any]:
        return {
            "backlog": self.backlog, "pending": self.pending, "claimed": self.claimed,
            "dead": self.dead, "oldest_pending_age": self.oldest_pending_age,
            "lag_p50": self.lag_p50, "lag_p95": self.lag_p95, "lag_max": self.lag_max,
            "lag_samples": self.lag_samples,
        }  # fmt: skip


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def aggregation_stats(
    collection: Any,
    *,
    tenant_id: str | None = None,
    kinds: Sequence[str] | None = None,
    window: int = 500,
) -> AggregationStats:
    """Backlog and lag of an outbox collection (optionally of one tenant)."""
    base: dict[str, Any] = {}
    if tenant_id is not None:
        base["tenant_id"] = model.check_tenant(tenant_id)
    if kinds:
        base["kind"] = {"$in": list(kinds)}
    count = {
        s: collection.count_documents({**base, "status": s})
        for s in (outbox.PENDING, outbox.CLAIMED, outbox.DEAD)
    }
    now = datetime.now(UTC)
    oldest = collection.find_one(
        {**base, "status": {"$in": [outbox.PENDING, outbox.CLAIMED]}},
        {"created_at": 1},
        sort=[("created_at", ASCENDING)],
    )
    age = (now - model.aware(oldest["created_at"])).total_seconds() if oldest else None  # type: ignore[operator]
    recent = (
        collection.find({**base, "status": outbox.DONE}, {"created_at": 1, "done_at": 1})
        .sort("done_at", DESCENDING)
        .limit(window)
    )
    lags = [
        (model.aware(d["done_at"]) - model.aware(d["created_at"])).total_seconds()  # type: ignore[operator]
        for d in recent
        if d.get("done_at") and d.get("created_at")
    ]
    return AggregationStats(
        pending=count[outbox.PENDING],
        claimed=count[outbox.CLAIMED],
        dead=count[outbox.DEAD],
        oldest_pending_age=age,
        lag_p50=percentile(lags, 0.5),
        lag_p95=percentile(lags, 0.95),
        lag_max=max(lags) if lags else None,
        lag_samples=len(lags),
    )


# -- embedded use -------------------------------------------------------------------------------


class BackgroundAggregator:
    """An aggregator on a daemon thread of this process (embedded use, tests, the demo).

    ``with BackgroundAggregator(aggregator): ...`` starts it and stops it on exit;
    ``wait_idle()`` blocks until no event is available (handy in tests and notebooks).
    """

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.processed = 0
        self.outcomes: list[Outcome] = []

    def start(self) -> BackgroundAggregator:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"accord-aggregator-{self.aggregator.worker_id}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        def seen(outcome: Outcome) -> None:
            self.outcomes.append(outcome)
            del self.outcomes[:-1000]

        try:
            self.processed += self.aggregator.run(self._stop, on_outcome=seen)
        except Exception:  # keep the reason in the log; the application keeps running
            log.exception("the background aggregator stopped")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no event is pending or claimed (dead ones aside); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.aggregator.stats(window=1)
            if stats.backlog == 0:
                return True
            time.sleep(0.05)
        return False

    def __enter__(self) -> BackgroundAggregator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def requeue_plan(db: str, collection: str, event_ids: Sequence[str] | None) -> Plan:
    """A plan that makes dead events available again, attempts from zero (``event_ids``
    None: every dead event). The group is ``outbox:requeue``."""
    filt: dict[str, Any] = {"status": outbox.DEAD}
    if event_ids is not None:
        if not all(isinstance(i, str) and i for i in event_ids):
            raise ConfigurationError(f"event ids are non-empty strings, got {event_ids!r}")
        filt["_id"] = {"$in": list(event_ids)}
    op = Op(
        "update_many",
        filt,
        {
            "$set": {"status": outbox.PENDING, "available_at": outbox.now(), "attempts": 0},
            "$unset": {"error": "", "failed_at": ""},
        },
    )
    return Plan(
        PlanContext(tenant_id="*", operation="memory.requeue"),
        [Group("outbox:requeue", db, collection, OUTBOX.name, [op])],
    )
