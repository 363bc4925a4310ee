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

While an event is worked on, its lease is renewed every ``lease / 3`` seconds (a
heartbeat), so a slow extraction (a model call) keeps its event instead of losing it to
another worker that would redo it. Claims count as attempts, so an event whose workers
keep dying or losing it is dead-lettered once it has been claimed ``max_attempts`` times.

Nothing a producer writes stops the aggregator or holds up other events: the outbox gets a
``$jsonSchema`` validator at setup (malformed events are refused at insert); an event that
is malformed all the same (written before the validator, or where the aggregator may not
apply it) is dead-lettered at once with what is wrong with it, or, when a claim cannot even
count its attempts, moved aside while the worker is idle; a message of an event that cannot
be read (a bad key, a bad ``created_at``) is skipped with its reason recorded on the done
event (``skipped``); and the worker loop survives any error, backing off.

Steps 2-4 run outside any transaction (model and embedding calls never run inside one).
Several aggregator processes may run at once (``accord memory worker``), or one
background runner in the application's process (:class:`AsyncBackgroundAggregator`, a task
on the event loop; ``BackgroundAggregator``, a thread). Done events keep ``expire_at``
(``retention``); the outbox's TTL index removes them.

Nothing CPU-bound runs on the event loop: an extractor without ``aextract`` runs in a
worker thread (:func:`~accord.memory.extraction.arun_extractor`), and the embedders' async
methods run the hashing and local models in threads too (Voyage's is a native async
client).

This module is the async source; :mod:`accord.memory.synchronous.aggregator` is generated
from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.errors import OperationFailure, PyMongoError

from accord.checkpointers import events
from accord.errors import (
    ConfigurationError,
    DatabaseError,
    LeaseLost,
    MemoryConflictError,
)
from accord.memory import conversations, model
from accord.memory.aggregation import (
    COMPONENT,
    CONSUMER_INDEXES,
    AggregationStats,
    AggregatorConfig,
    Outcome,
    Stage,
    VectorDims,
    default_worker_id,
    fill_namespace,
    head_groups,
    head_id,
    memory_groups,
    template_values,
)
from accord.memory.asynchronous.consolidation import AsyncConsolidator
from accord.memory.asynchronous.forgetting import AsyncThreadForgetter
from accord.memory.asynchronous.outbox_stats import aggregation_stats
from accord.memory.asynchronous.service import AsyncMemoryService
from accord.memory.consolidation import Prepared
from accord.memory.embedders import check_dimensions
from accord.memory.extraction import (
    AsyncRecall,
    Change,
    Conversation,
    Existing,
    Extractor,
    RuleExtractor,
    arun_extractor,
)
from accord.memory.running import AsyncHeartbeat, AsyncStop
from accord.memory.writepath import LONG_TERM_MEMORY, AsyncCatalog, AsyncUnitOfWork
from accord.platform import codes, outbox
from accord.platform.artifacts import OUTBOX, SHORT_TERM_MEMORY
from accord.platform.context import AGGREGATOR, Principal, ReadContext
from accord.platform.plan import Plan, PlanContext

log = logging.getLogger("accord.memory.aggregator")
_IS_SYNC = False
#: How often, at most, an idle worker looks for events no claim can take (seconds).
DEAD_LETTER_EVERY = 5.0
#: Skipped messages recorded on a done event.
MAX_SKIPPED = 20


class AsyncAggregator:
    """Consumes outbox events into long-term memory (see the module docstring).

    Args:
        client: a pymongo ``AsyncMongoClient`` (replica set, Atlas, or the embedded engine).
        embedder, dims: as for :class:`~accord.memory.asynchronous.service.AsyncMemoryService`
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
        client: AsyncMongoClient[Any],
        *,
        embedder: Any = None,
        dims: int | None = None,
        extractor: Extractor | None = None,
        config: AggregatorConfig | None = None,
        service: AsyncMemoryService | None = None,
        uow: AsyncUnitOfWork | None = None,
        worker_id: str | None = None,
        on_stage: Stage | None = None,
    ) -> None:
        self.config = config or AggregatorConfig()
        self.client = client
        if uow is None and service is not None:
            uow = service.uow
        if uow is None:  # built alone: the runtime's kernel, with its hooks
            from accord import runtime

            uow = runtime.kernel(client)
        # the aggregator's reads and writes are the aggregator service principal's
        self.uow: AsyncUnitOfWork = uow.acting_as(Principal.service(AGGREGATOR))
        self.service = service or AsyncMemoryService(
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
        self._forgetter = AsyncThreadForgetter(
            self.service, self.config, self.uow, self.worker_id, self._stage
        )
        self._next_dead_letter = 0.0

    # -- setup ------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create the memory collections and vector index, the outbox's indexes and the
        consolidation heads (idempotent; safe from several processes at once)."""
        await self.service.setup()
        await AsyncCatalog(self.uow, self.config.db_name).setup(
            COMPONENT,
            {self.config.outbox: OUTBOX.name, self.config.heads: LONG_TERM_MEMORY},
            {
                self.config.outbox: CONSUMER_INDEXES,
                self.config.heads: [IndexModel([("tenant_id", ASCENDING)], name="tenant")],
            },
        )
        # the checkpointer writes outbox events only while something consumes them
        await self.uow.execute(
            outbox.consumer_plan(self.config.db_name, self.config.outbox, COMPONENT)
        )
        await self._apply_validator()

    async def _apply_validator(self) -> None:
        """Give the outbox its ``$jsonSchema`` validator (``outbox.VALIDATOR``), so that a
        malformed event is refused when a producer inserts it. A database user without
        the ``collMod`` privilege (``readWrite`` lacks it) cannot: then malformed events
        are still dead-lettered when claimed, and the log says how to apply it."""
        try:
            await self._db.command(outbox.validator_command(self.config.outbox))
        except OperationFailure as exc:
            if exc.code != codes.UNAUTHORIZED:
                raise DatabaseError(
                    f"could not apply the outbox validator to {self.config.db_name}."
                    f"{self.config.outbox}: {exc}"
                ) from exc
            log.warning(
                "aggregator %s: no privilege to apply the outbox validator (collMod) on "
                "%s.%s; malformed events will be dead-lettered when claimed instead of "
                "refused at insert. Run setup once as a user with dbAdmin to apply it.",
                self.worker_id, self.config.db_name, self.config.outbox,
            )  # fmt: skip
        except PyMongoError as exc:
            raise DatabaseError(f"could not apply the outbox validator: {exc}") from exc

    # -- the loop ---------------------------------------------------------------------------

    async def claim(self) -> outbox.ClaimedEvent | None:
        """Claim an event, or None: one whose worker's lease ran out (looked for at most
        every ``min(1 s, lease / 4)``), else the one available longest. Both claims are
        served in index order, so their cost does not grow with the backlog."""
        now = time.monotonic()
        if now >= self._next_expired_check:
            self._next_expired_check = now + min(1.0, self.config.lease / 4)
            event = await self._claim("expired")
            if event is not None:
                return event
        return await self._claim("available")

    async def _claim(self, which: outbox.ClaimWhich) -> outbox.ClaimedEvent | None:
        plan = outbox.claim_plan(
            self.config.db_name,
            self.config.outbox,
            owner=self.worker_id,
            lease=timedelta(seconds=self.config.lease),
            kinds=self.config.kinds,
            which=which,
        )
        result = await self.uow.execute(plan)
        doc = result.found["claim"][0]
        return None if doc is None else outbox.ClaimedEvent.from_document(doc)

    async def run_once(self) -> Outcome | None:
        """Claim and process one event; None when no event is available."""
        event = await self.claim()
        return None if event is None else await self.process(event)

    async def dead_letter_unclaimable(self) -> int:
        """Move open events no claim can take (``attempts`` that is not a number, so a
        claim's ``$inc`` would fail; a claim whose ``lease_until`` is not a date, so it
        never expires) to ``dead``, each with its reason. Returns how many.
        The outbox validator refuses such events at insert; this handles those written
        before it was applied."""
        found = await self.uow.find(
            ReadContext("*", operation="outbox.dead_letter"), OUTBOX.name, self.config.db_name,
            self.config.outbox, outbox.UNCLAIMABLE,
            projection={"attempts": 1, "lease_until": 1, "kind": 1},
            limit=100,
        )  # fmt: skip
        if not found:
            return 0
        reasons = [(d["_id"], outbox.unclaimable_reason(d)) for d in found]
        result = await self.uow.execute(
            outbox.dead_letter_plan(self.config.db_name, self.config.outbox, reasons)
        )
        for _id, reason in reasons:
            log.warning("aggregator %s: event %r dead-lettered: %s", self.worker_id, _id, reason)
        return result["outbox:dead_letter"].modified

    async def run(
        self,
        stop: AsyncStop | None = None,
        *,
        max_events: int | None = None,
        until_idle: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> int:
        """Process events until ``stop`` is set, ``max_events`` were processed, or (with
        ``until_idle``) none is available. Returns how many were processed. A database
        that cannot be reached is waited for (with backoff), not fatal."""
        stop = stop or AsyncStop()
        processed, pause = 0, self.config.poll_interval
        while not stop.is_set() and (max_events is None or processed < max_events):
            try:
                outcome = await self.run_once()
                if outcome is None and until_idle:
                    # idle only once no expired claim is left either (claim() looks for
                    # those at most every second)
                    expired = await self._claim("expired")
                    if expired is not None:
                        outcome = await self.process(expired)
                if outcome is None and await self._idle_dead_letter(force=until_idle):
                    continue
            except Exception as exc:  # nothing an event holds may stop the worker
                pause = min(5.0, max(pause * 2, 0.1))
                log.warning("aggregator %s: cannot claim (%s: %s); retrying in %.1f s",
                            self.worker_id, type(exc).__name__, exc, pause)  # fmt: skip
                log.debug("aggregator %s: claim failed", self.worker_id, exc_info=True)
                await stop.wait(pause)
                continue
            pause = self.config.poll_interval
            if outcome is None:
                if until_idle:
                    break
                await stop.wait(self.config.poll_interval)
                continue
            processed += 1
            if on_outcome is not None:
                on_outcome(outcome)
        return processed

    async def _idle_dead_letter(self, force: bool = False) -> bool:
        """When idle: dead-letter unclaimable events (at most every
        :data:`DEAD_LETTER_EVERY` seconds, or now with ``force``); True if it moved any."""
        now = time.monotonic()
        if not force and now < self._next_dead_letter:
            return False
        self._next_dead_letter = now + DEAD_LETTER_EVERY
        return await self.dead_letter_unclaimable() > 0

    async def drain(self, max_events: int | None = None) -> int:
        """Process every event available now (events waiting for a retry are not)."""
        return await self.run(until_idle=True, max_events=max_events)

    # -- one event --------------------------------------------------------------------------

    async def process(self, event: outbox.ClaimedEvent) -> Outcome:
        """Aggregate a claimed event and commit it with its completion; on failure release
        it (backoff) or dead-letter it. Never raises for a failure of the event itself.

        A malformed event (see :meth:`problems`) and an event claimed more than
        ``max_attempts`` times (its earlier workers crashed or lost it) are dead-lettered
        at once, without being worked on. The lease is renewed while the work runs."""
        try:
            self._stage("claim", event)
            problems = self.problems(event)
            if problems:
                return await self._release(event, (
                    f"malformed outbox event: {'; '.join(problems)}; dead-lettered without "
                    f"processing (see docs/checkpointer.md for the event contract)"
                ), dead=True)  # fmt: skip
            if outbox.exhausted(event, self.config.max_attempts):
                return await self._release(event, (
                    f"claimed {event.attempts} times (max_attempts {self.config.max_attempts}) "
                    f"without completing: the workers that claimed it crashed, were stopped, "
                    f"or lost its lease; dead-lettered without processing it again"
                ), dead=True)  # fmt: skip
            async with AsyncHeartbeat(lambda: self._renew(event), self.config.lease / 3):
                written = await self._aggregate(event)
        except LeaseLost as exc:
            log.info("aggregator %s lost event %r: %s", self.worker_id, event.id, exc)
            return Outcome(str(event.id), "lost", error=str(exc))
        except Exception as exc:  # any failure of the event's work is retried, then dead
            log.debug("aggregator %s: event %r failed", self.worker_id, event.id, exc_info=True)
            return await self._release(event, f"{type(exc).__name__}: {exc}")
        return Outcome(str(event.id), "done", memories=written)

    async def _release(self, event: outbox.ClaimedEvent, message: str,
                       dead: bool = False) -> Outcome:  # fmt: skip
        """Give the event back (backoff) or dead-letter it, with ``message``."""
        message = outbox.error_text(message)  # what is logged is what is stored
        at = outbox.now()
        failing = timedelta(seconds=self.config.failing_for)
        dead = dead or outbox.given_up(event, self.config.max_attempts, at, min_failing=failing)
        log.warning(
            "aggregator %s: event %r (%s, attempt %d) failed%s: %s",
            self.worker_id, event.id, event.kind, event.attempts,
            " and is dead-lettered" if dead else "; retrying later", message,
        )  # fmt: skip
        try:
            await self.uow.execute(
                outbox.release_plan(
                    self.config.db_name, self.config.outbox, event, message,
                    max_attempts=self.config.max_attempts, dead=dead, at=at,
                    min_failing=failing,
                )
            )  # fmt: skip
        except Exception as release_error:  # its lease runs out; it is claimed again
            log.warning("could not release event %r: %s", event.id, release_error)
        return Outcome(str(event.id), "dead" if dead else "retry", error=message)

    async def _renew(self, event: outbox.ClaimedEvent) -> bool:
        """Extend the event's lease (the heartbeat); False once it is lost."""
        plan = outbox.renew_plan(self.config.db_name, self.config.outbox, event,
                                 timedelta(seconds=self.config.lease))  # fmt: skip
        result = await self.uow.execute(plan)
        return result["outbox:renew"].matched == 1

    def problems(self, event: outbox.ClaimedEvent) -> list[str]:
        """What makes ``event`` unprocessable (empty: nothing): the outbox's own fields
        (``ClaimedEvent.problems``) and the event contract this aggregator reads
        (``messages`` a list, with a ``thread_id`` string)."""
        found = event.problems()
        doc = event.document
        messages = doc.get("messages")
        if messages is not None and not isinstance(messages, list):
            found.append(f"messages is a {type(messages).__name__}, not a list of message keys")
        elif messages and not isinstance(doc.get("thread_id"), str):
            found.append("it has messages but no thread_id string")
        if event.kind == events.THREAD_DELETED and not isinstance(doc.get("thread_id"), str):
            found.append("it deletes a thread but names no thread_id string")
        return found

    def _stage(self, stage: str, event: outbox.ClaimedEvent) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, event)

    async def _aggregate(self, event: outbox.ClaimedEvent) -> int:
        if event.kind == events.THREAD_DELETED:  # forget what the thread gave (forgetting)
            return await self._forgetter.forget(event)
        conversation, skipped = await self._read(event)
        for attempt in range(self.config.conflict_retries):
            self._stage("extract", event)
            changes: list[Change] = []
            if conversation is not None and conversation.turns:
                changes = await arun_extractor(self.extractor, conversation, self._recall(event))
            plan, written = await self.plan(event, conversation, changes, skipped=skipped)
            self._stage("commit", event)
            try:
                await self.uow.execute(plan)
                return written
            except MemoryConflictError:
                if attempt == self.config.conflict_retries - 1:
                    raise
                log.info("event %s: memories changed meanwhile; deciding again", event.id)
        raise AssertionError("unreachable")

    async def read(self, event: outbox.ClaimedEvent) -> Conversation | None:
        """The event's new messages (None: an event without messages). Messages that
        cannot be read are left out (:meth:`_read` says why)."""
        return (await self._read(event))[0]

    async def _read(self, event: outbox.ClaimedEvent) -> tuple[Conversation | None, list[str]]:
        """The event's conversation, and why messages were skipped: a key that is not a
        string, a stored message whose ``created_at`` is not a date. (A malformed event
        never gets here: :meth:`problems`.)"""
        doc = event.document
        if not doc.get("messages"):
            return None, []
        thread_id = str(doc.get("thread_id"))
        keys, skipped = conversations.message_keys(doc.get("messages"))
        found = await self.uow.find(
            ReadContext(event.tenant_id, thread_id, operation="memory.read_messages"),
            SHORT_TERM_MEMORY.name, self.config.db_name, self.config.messages,
            {"tenant_id": event.tenant_id, "thread_id": thread_id, "key": {"$in": keys}},
            projection=conversations.MESSAGE_FIELDS,
        )  # fmt: skip
        conversation, missing = conversations.conversation_of(
            event.tenant_id, doc, keys, found, skipped
        )
        if missing:  # e.g. the thread was deleted or pruned before it was aggregated
            log.info("event %s: %d of %d messages are gone", event.id, missing, len(keys))
        for reason in skipped:
            log.warning("aggregator %s: event %r: skipped %s", self.worker_id, event.id, reason)
        return conversation, skipped

    # -- deciding and planning --------------------------------------------------------------

    def namespace_for(self, change: Change, event: outbox.ClaimedEvent) -> tuple[str, ...]:
        if change.namespace is not None:
            return model.check_namespace(change.namespace)
        template = self.config.namespaces.get(change.kind) or self.config.namespaces["*"]
        return fill_namespace(
            template, template_values(event.document, event.tenant_id, change.kind)
        )

    async def plan(
        self,
        event: outbox.ClaimedEvent,
        conversation: Conversation | None,
        changes: Sequence[Change],
        *,
        skipped: Sequence[str] = (),
    ) -> tuple[Plan, int]:
        """The plan that commits ``changes`` with the event's completion (recording the
        ``skipped`` messages' reasons on it), and how many memories it writes. Reads the
        memories and heads it compares against."""
        tenant = event.tenant_id
        now = model.utcnow()
        prepared = [Prepared(c, self.namespace_for(c, event), c.key) for c in changes]
        compared = {
            p.namespace for p in prepared
            if p.change.action == "add" and p.key is None and p.change.merge
        }  # fmt: skip
        heads = await self._read_heads(tenant, compared)  # before the neighbours are read
        provenance = self._provenance(event, conversation)
        decisions = await AsyncConsolidator(
            tenant,
            load=lambda ids: self._load(tenant, ids),
            similar=lambda ns, kind, vector, k: self._similar(tenant, ns, kind, vector, k, now),
            embed=lambda texts: self._embed(event, texts),
            threshold=self.config.threshold,
            now=now,
            provenance=provenance,
        ).decide(prepared)
        groups = memory_groups(
            decisions, now, self.config.db_name, self.service.memory_collection,
            self.service.history_collection,
        )  # fmt: skip
        written_ns = {
            tuple(d["namespace"])
            for i in decisions.changed()
            if (d := decisions.after[i] or decisions.before.get(i)) is not None
        }
        groups += head_groups(
            self.config.db_name, self.config.heads, tenant, heads,
            decisions.compared & written_ns,
        )  # fmt: skip
        db, coll = self.config.db_name, self.config.outbox
        groups.append(
            outbox.complete_group(
                db,
                coll,
                event,
                retention=timedelta(days=self.config.retention),
                at=now,
                notes={"skipped": list(skipped[:MAX_SKIPPED])} if skipped else None,
            )
        )
        context = PlanContext(
            tenant,
            thread_id=conversation.thread_id if conversation else None,
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

    async def _load(self, tenant: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        found = await self.uow.find(
            ReadContext(tenant, operation="memory.aggregate"), LONG_TERM_MEMORY,
            self.config.db_name, self.service.memory_collection,
            {"_id": {"$in": list(ids)}, "tenant_id": tenant},
        )  # fmt: skip
        return {d["_id"]: d for d in found}

    async def _similar(
        self,
        tenant: str,
        namespace: tuple[str, ...],
        kind: str,
        vector: Sequence[float],
        k: int,
        now: datetime,
    ) -> list[dict[str, Any]]:
        path = model.ns_path(namespace)
        found = await self.service.for_tenant(tenant).nearest(
            namespace, vector, limit=k, kinds=[kind], projection=None,
            keep=lambda d: d.get("ns_path") == path and model.live(d, now),
        )  # fmt: skip
        return [d for d, _ in found]

    async def _embed(self, event: outbox.ClaimedEvent, texts: Sequence[str]) -> list[list[float]]:
        self._stage("embed", event)
        vectors = await self.service.embedder.aembed_documents(list(texts))
        for v in vectors:
            if len(v) != self.service.dims:
                check_dimensions(VectorDims(len(v), self.service.embedder.name), self.service.dims,
                                 f"the vector index of {self.service.memory_collection}")  # fmt: skip
        return vectors

    def _recall(self, event: outbox.ClaimedEvent) -> AsyncRecall:
        service = self.service.for_tenant(event.tenant_id)
        # what the event's run may see: its namespace of every other kind (a user's own
        # memories when the template names {user_id}), up to a {kind} label
        values = template_values(event.document, event.tenant_id, "*")
        scope = fill_namespace(self.config.namespaces["*"], values, stop_at="kind")

        async def recall(
            text: str, *, kinds: Sequence[str] | None = None, limit: int = 5
        ) -> list[Existing]:
            self._stage("embed", event)
            hits = await service.search(
                scope, query=text, kinds=kinds, limit=limit, include_unscored=False
            )
            return [Existing(m.namespace, m.key, m.text, m.kind, m.score or 0.0, m.value)
                    for m in hits]  # fmt: skip

        return recall

    # -- consolidation heads ----------------------------------------------------------------

    async def _read_heads(
        self, tenant: str, namespaces: set[tuple[str, ...]]
    ) -> dict[tuple[str, ...], int]:
        if not namespaces:
            return {}
        ids = {head_id(tenant, ns): ns for ns in namespaces}
        found = await self.uow.find(
            ReadContext(tenant, operation="memory.aggregate"), LONG_TERM_MEMORY,
            self.config.db_name, self.config.heads,
            {"_id": {"$in": list(ids)}, "tenant_id": tenant},
        )  # fmt: skip
        return {ids[d["_id"]]: int(d["seq"]) for d in found}

    # -- observability ----------------------------------------------------------------------

    async def stats(self, *, tenant_id: str | None = None, window: int = 500) -> AggregationStats:
        return await aggregation_stats(
            self.uow, self.config.db_name, self.config.outbox, tenant_id=tenant_id,
            kinds=self.config.kinds, window=window,
        )  # fmt: skip
