"""Steps as the checkpointer commits them, for the aggregator's tests, crash suite and
benchmark: the step's new ``short_term_memory`` documents and its ``checkpoint`` outbox
event, in one plan through the platform's unit of work. The shapes are the checkpointer's
public event contract (docs/checkpointer.md): messages carry ``key``, ``chunk``,
``message_id``, ``role``, ``text``, ``checkpoint_id``, ``created_at``; the event carries
``thread_id``, ``checkpoint_ns``, ``checkpoint_id`` and the keys in ``messages``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from accord.platform.ids import doc_id
from accord.platform.plan import Group, OutboxEvent, Plan, PlanContext, insert_once
from accord.platform.synchronous.unit_of_work import UnitOfWork


def step_plan(
    db: str,
    tenant: str,
    thread: str,
    checkpoint_id: str,
    messages: Sequence[tuple[str, str]],
    *,
    kind: str = "checkpoint",
) -> Plan:
    now = datetime.now(UTC)
    docs, keys = [], []
    for i, (role, text) in enumerate(messages):
        key = doc_id("msg", tenant, thread, checkpoint_id, i)
        keys.append(key)
        docs.append(
            insert_once({
                "_id": doc_id("stm", tenant, thread, key, 0), "tenant_id": tenant,
                "thread_id": thread, "checkpoint_ns": "", "key": key, "chunk": 0,
                "message_id": f"{thread}/{checkpoint_id}/{i}", "role": role, "text": text,
                "checkpoint_id": checkpoint_id, "created_at": now,
            })
        )  # fmt: skip
    fields = {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    if keys:
        fields["messages"] = keys
    groups = [Group("messages", db, "short_term_memory", "short_term_memory", docs)] if docs else []
    event = OutboxEvent(db, "outbox", kind, tenant, (thread, "", checkpoint_id), fields)
    return Plan(PlanContext(tenant, thread, operation="test.step"), groups, [event])


def commit_step(uow: UnitOfWork, db: str, tenant: str, thread: str, checkpoint_id: str,
                messages: Sequence[tuple[str, str]], *, kind: str = "checkpoint") -> None:  # fmt: skip
    uow.execute(step_plan(db, tenant, thread, checkpoint_id, messages, kind=kind))
