# Generated from accord/memory/asynchronous/forgetting.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The aggregator's ``thread_deleted`` events: long-term memory forgets a deleted thread.

:mod:`accord.memory.forgetting` decides what each memory the thread reached becomes
(deleted, re-derived from the other threads that stated it, or pruned of the thread's
history); this module reads what that needs, embeds the re-derived texts (outside any
transaction), and commits everything in ONE plan with the event's completion:

* the memories (compare-and-set on their versions) and their history; their vectors follow
  through the memory service's vectors hook;
* the thread's other outbox events up to the deletion are deleted: one still claimed by a
  worker can then not commit (its completion finds no claim), and a guard fails this
  commit if one of them completed since the memories were read (its memories were not
  seen): the event is decided again.

A memory a **legal hold** covers is left as it is, with its history and vectors: a hold
by its tenant, on the class ``long_term_memory``, ``memory_history`` or ``memory_vector``,
or on a subject the memory's (or one of its history versions') ``subject_fields`` name
(docs/governance.md, "Legal holds"). The holds are read with the memories; governance's
hold guard reads them again in the commit's transaction and refuses (``LegalHoldError``)
a plan that writes a memory a hold covers, one placed since the read: the event is then
decided again with it. While a hold keeps some of the thread's memories the event is not
done: it is given back, pending again after ``AggregatorConfig.hold_recheck`` seconds
(``held_memories`` on it says how many wait), and decided again then; once the holds
are released, the memories they kept are forgotten and the event is done. Until
2026-12-07 the event was done at once and the held memories stayed after the release.

So when the event is done nothing derived only from the thread is left, and nothing can appear later from the thread's steps before its deletion. Guarantee: eventual, like the
aggregation itself: ``delete_thread`` returns when the thread is deleted; its memories go
when the aggregator processes the event (``accord memory status`` shows the backlog).

No ``$in`` list of its reads or of the plan holds more than
:data:`accord.memory.forgetting.PAGE` memory or event ids (a thread may have derived very
many memories): the memories, their history versions and the holds' reach are read a page
at a time.

Generated from ``accord/memory/asynchronous/forgetting.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from accord.errors import ExtractionError, LegalHoldError, MemoryConflictError
from accord.memory import forgetting, model
from accord.memory.aggregation import AggregatorConfig, Stage
from accord.memory.synchronous.service import MemoryService
from accord.memory.writepath import UnitOfWork
from accord.platform import outbox
from accord.platform.artifacts import HOLD, LONG_TERM_MEMORY, MEMORY_HISTORY, OUTBOX
from accord.platform.context import ReadContext
from accord.platform.plan import Plan, PlanContext

log = logging.getLogger("accord.memory.aggregator")
_IS_SYNC = True

#: Outbox events of the thread that may still write memories (not done yet).
_OPEN = [outbox.PENDING, outbox.CLAIMED, outbox.DEAD]


class ThreadForgetter:
    """Processes ``thread_deleted`` events for an aggregator (same service, config and
    unit of work)."""

    def __init__(
        self,
        service: MemoryService,
        config: AggregatorConfig,
        uow: UnitOfWork,
        worker_id: str,
        stage: Stage | None = None,
    ) -> None:
        self.service = service
        self.config = config
        self.uow = uow
        self.worker_id = worker_id
        self.stage = stage

    def forget(self, event: outbox.ClaimedEvent) -> int:
        """Forget the event's thread and complete the event; returns the memories changed."""
        thread_id = event.document.get("thread_id")
        if not isinstance(thread_id, str) or not thread_id:
            raise ValueError(f"thread_deleted event {event.id} names no thread_id")
        for attempt in range(self.config.conflict_retries):
            self._stage("extract", event)  # (the aggregator's stages, for crash tests)
            plan, changed = self.plan(event, thread_id)
            self._stage("commit", event)
            try:
                self.uow.execute(plan)
            except (MemoryConflictError, LegalHoldError) as err:
                if attempt == self.config.conflict_retries - 1:
                    raise
                what = "a hold placed" if isinstance(err, LegalHoldError) else "memories changed"
                log.info("event %s: %s meanwhile; deciding again", event.id, what)
                continue
            if changed:
                log.info(
                    "thread %s deleted: %d memories forgotten or re-derived", thread_id, changed
                )
            return changed
        raise AssertionError("unreachable")

    def plan(self, event: outbox.ClaimedEvent, thread_id: str) -> tuple[Plan, int]:
        """The plan that forgets ``thread_id`` and completes ``event``."""
        tenant = event.tenant_id
        db, box = self.config.db_name, self.config.outbox
        # events that may still write memories of the thread: read before the memories
        open_ids = [
            d["_id"]
            for d in self.uow.find(
                self._context(tenant, thread_id), OUTBOX.name, db, box,
                {"tenant_id": tenant, "thread_id": thread_id, "status": {"$in": _OPEN},
                 "_id": {"$ne": event.id}},
                projection={"_id": 1},
            )
        ]  # fmt: skip
        holds = self._holds(tenant, thread_id)
        decided, held = self._decide(tenant, thread_id, holds)
        texts = {
            doc["_id"]: str(version["text"])
            for doc, version in decided.restore
            if version.get("text")
        }
        vectors: dict[str, Any] = {}
        if texts:
            self._stage("embed", event)
            embedded = self.service.embedder.embed_documents(list(texts.values()))
            vectors = dict(zip(texts, embedded, strict=True))
        groups = []
        if open_ids:
            groups.append(forgetting.not_yet_done_guard(db, box, open_ids))
        groups += forgetting.groups(
            thread_id, tenant, decided, vectors, db=db,
            memories=self.service.memory_collection, history=self.service.history_collection,
        )  # fmt: skip
        if event.created_at is None:  # malformed events are dead-lettered before this
            raise ExtractionError("a thread_deleted event without created_at cannot be applied")
        groups.append(forgetting.events_of_thread(db, box, tenant, thread_id, event.document,
                                                  event.created_at))  # fmt: skip
        if held:  # back when the holds may have been released: they are forgotten then
            until = outbox.now() + timedelta(seconds=self.config.hold_recheck)
            groups.append(outbox.defer_group(db, box, event, until=until,
                                             notes={"held_memories": held}))  # fmt: skip
        else:
            notes = {"held_memories": 0} if event.document.get("held_memories") else None
            groups.append(outbox.complete_group(
                db, box, event, retention=timedelta(days=self.config.retention), notes=notes,
            ))  # fmt: skip
        context = PlanContext(tenant, thread_id=thread_id, operation="memory.forget_thread")
        return Plan(context, groups), len(decided)

    @staticmethod
    def _context(tenant: str, thread_id: str) -> ReadContext:
        return ReadContext(tenant, thread_id, operation="memory.forget_thread")

    def _stage(self, name: str, event: outbox.ClaimedEvent) -> None:
        if self.stage is not None:
            self.stage(name, event)

    def _hold_guard(self) -> Any:
        """The kernel's legal-hold guard (governance's, which the runtime registers:
        memory does not import governance), or None: no hold is honoured on this kernel."""
        for hook in self.uow.hooks.seal:
            if hasattr(hook, "memory_hold_filters"):
                return hook
        return None

    def _holds(self, tenant: str, thread_id: str) -> dict[str, list[dict[str, Any]]]:
        """Per memory class, the filters of the tenant's documents a hold covers (the
        hold guard re-reads the holds in the commit's transaction and refuses a plan that
        writes a memory one placed since covers: then the event is decided again)."""
        guard = self._hold_guard()
        if guard is None:
            return {}
        ctx, db = self._context(tenant, thread_id), self.config.db_name
        docs = self.uow.find(ctx, HOLD.name, db, guard.hold_collection(db), {})
        collections = {LONG_TERM_MEMORY.name: self.service.memory_collection,
                       MEMORY_HISTORY.name: self.service.history_collection}  # fmt: skip
        return dict(guard.memory_hold_filters(db, tenant, docs, collections))

    def _held(self, tenant: str, thread_id: str, ids: list[str],
                    holds: dict[str, list[dict[str, Any]]]) -> set[str]:  # fmt: skip
        """The memories among ``ids`` a hold covers: the memory, one of its history
        versions, or its vectors (a class hold on ``memory_vector``; a subject hold on
        its vectors is one on the memory)."""
        if not holds or not ids:
            return set()
        ctx, db = self._context(tenant, thread_id), self.config.db_name
        held: set[str] = set()
        for artifact, coll, link in (
            (LONG_TERM_MEMORY.name, self.service.memory_collection, "_id"),
            (MEMORY_HISTORY.name, self.service.history_collection, "memory_id"),
        ):
            which = holds.get(artifact)
            if not which:
                continue
            if any(not f for f in which):
                return set(ids)  # a hold on every memory of the tenant
            for part in forgetting.chunks(ids):  # (a page of ids a read: bounded commands)
                found = self.uow.find(
                    ctx, artifact, db, coll,
                    {"tenant_id": tenant, link: {"$in": part}, "$or": which},
                    projection={link: 1},
                )  # fmt: skip
                held |= {d[link] for d in found}
        return held

    def _decide(
        self, tenant: str, thread_id: str, holds: dict[str, list[dict[str, Any]]] | None = None
    ) -> tuple[forgetting.Forgetting, int]:
        """What forgetting the thread changes, without the memories a hold covers; and
        how many those are."""
        decided = self._decide_all(tenant, thread_id)
        ids = [d["_id"] for d in decided.delete] + [d["_id"] for d, _ in decided.restore]
        held = self._held(tenant, thread_id, sorted({*ids, *decided.prune}), holds or {})
        if not held:
            return decided, 0
        log.info("thread %s deleted: %d memories derived from it are under a legal hold; "
                 "decided again in %g s", thread_id, len(held),
                 self.config.hold_recheck)  # fmt: skip
        return forgetting.Forgetting(
            delete=[d for d in decided.delete if d["_id"] not in held],
            restore=[(d, v) for d, v in decided.restore if d["_id"] not in held],
            prune=[i for i in decided.prune if i not in held],
        ), len(held)

    def _decide_all(self, tenant: str, thread_id: str) -> forgetting.Forgetting:
        ctx = self._context(tenant, thread_id)
        db = self.config.db_name
        memories, history = self.service.memory_collection, self.service.history_collection
        mine = {"tenant_id": tenant, "provenance.thread_id": thread_id}
        found = self.uow.find(ctx, LONG_TERM_MEMORY.name, db, memories, mine,
                                    projection={"_id": 1})  # fmt: skip
        ids = {d["_id"] for d in found}
        older = self.uow.find(ctx, MEMORY_HISTORY.name, db, history, mine,
                                    projection={"memory_id": 1})  # fmt: skip
        ids |= {d["memory_id"] for d in older}
        if not ids:
            return forgetting.Forgetting()
        docs: list[model.Doc] = []
        versions: dict[str, list[model.Doc]] = {}
        for part in forgetting.chunks(sorted(ids)):  # a page of memories at a time
            page = self.uow.find(ctx, LONG_TERM_MEMORY.name, db, memories,
                                       {"_id": {"$in": part}, "tenant_id": tenant})  # fmt: skip
            docs += page
            if not page:
                continue
            for h in self.uow.find(
                ctx, MEMORY_HISTORY.name, db, history,
                {"tenant_id": tenant, "memory_id": {"$in": [d["_id"] for d in page]}},
            ):  # fmt: skip
                versions.setdefault(h["memory_id"], []).append(h)
        return forgetting.decide(thread_id, docs, versions)
