"""The aggregator's data, shared by its two twins: configuration, outcomes, statistics,
and the plans that need no I/O.

The aggregator itself (claim, read, extract, consolidate, commit; the module docstring of
:mod:`accord.memory.asynchronous.aggregator` says how) is written once, async
(``AsyncAggregator``), and its sync twin ``Aggregator``
(:mod:`accord.memory.synchronous.aggregator`) is generated from it by
``tools/synchro.py``. :mod:`accord.memory.aggregator` gathers both for import.
"""

from __future__ import annotations

import math
import os
import socket
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel

from accord.checkpointers import events
from accord.errors import ConfigurationError, MemoryConflictError
from accord.memory import model
from accord.memory.consolidation import DEFAULT_THRESHOLD, Decisions
from accord.memory.extraction import EPISODE
from accord.memory.writepath import LONG_TERM_MEMORY, MEMORY_HISTORY
from accord.platform import outbox
from accord.platform.artifacts import OUTBOX
from accord.platform.ids import doc_id
from accord.platform.plan import Expect, Group, Op, Plan, PlanContext, insert_once

COMPONENT = "memory.aggregator"
#: Where a kind of memory goes by default. Labels are templates filled from the event:
#: ``{tenant_id}``, ``{thread_id}``, ``{kind}``, and any plain string value of the run's
#: ``config["configurable"]`` (``{user_id}``, ``{assistant_id}``...; the checkpointer's
#: events carry them). ``.`` in a value is escaped as ``%2E`` (namespace labels cannot
#: contain dots). A label naming a value the run did not give is left out, so the default
#: keeps each user's memories under ``("memories", "<user_id>")`` and, for runs without a
#: ``user_id``, under ``("memories",)``. ``*`` is every other kind.
DEFAULT_NAMESPACES: Mapping[str, tuple[str, ...]] = {
    EPISODE: ("episodes", "{thread_id}"),
    "*": ("memories", "{user_id}"),
}
#: Template values every event has (the others come from the run's configuration).
ALWAYS = frozenset({"tenant_id", "thread_id", "kind"})

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
        max_attempts: claims before an event is dead-lettered (a failing event: once it
            has also been failing for ``failing_for`` seconds).
        failing_for: seconds an event must have been failing before its failures
            dead-letter it (600): an outage of the embedder or the model is retried.
        threshold: cosine similarity from which two memories of one kind in one
            namespace are merged.
        namespaces: kind -> namespace template (see :data:`DEFAULT_NAMESPACES`).
        poll_interval: seconds a worker waits when no event is available.
        retention: days a done event is kept before the TTL index removes it.
        conflict_retries: times an event is decided again when its commit found the
            memories changed, before it is released for a later attempt.
        hold_recheck: seconds a ``thread_deleted`` event waits, when a legal hold keeps
            some of the thread's memories, before they are decided again (3600): they are
            forgotten at the first recheck after the hold is released.
    """

    db_name: str = "accord"
    outbox: str = "outbox"
    messages: str = "short_term_memory"
    heads: str = "memory_heads"
    kinds: tuple[str, ...] = (events.CHECKPOINT, events.WRITES, events.THREAD_DELETED)
    lease: float = 60.0
    max_attempts: int = 5
    failing_for: float = 600.0
    threshold: float = DEFAULT_THRESHOLD
    namespaces: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: DEFAULT_NAMESPACES)
    poll_interval: float = 0.1
    retention: float = 7.0
    conflict_retries: int = 5
    hold_recheck: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("db_name", "outbox", "messages", "heads"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "$" in value or "\x00" in value:
                raise ConfigurationError(
                    f"{name} must be a collection/database name, got {value!r}"
                )
        if (
            not isinstance(self.kinds, tuple | list)
            or not self.kinds
            or not all(isinstance(k, str) and k for k in self.kinds)
        ):  # (a string would be taken letter by letter)
            raise ConfigurationError(
                f"kinds must be a list of non-empty strings, got {self.kinds!r}"
            )
        for name, low, high in (
            ("lease", 0.01, 86_400.0),
            ("poll_interval", 0.0, 3_600.0),
            ("retention", 0.0, 36_500.0),
            ("failing_for", 0.0, 30 * 86_400.0),
            ("hold_recheck", 1.0, 30 * 86_400.0),  # (0: a drain would never end)
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not low <= value <= high
            ):
                raise ConfigurationError(
                    f"{name} must be a number from {low:g} to {high:g}, got {value!r}"
                )
        for name in ("max_attempts", "conflict_retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.threshold, int | float) or not 0.0 < self.threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if "*" not in self.namespaces:
            raise ConfigurationError("namespaces needs a '*' entry (the default namespace)")
        for kind, template in self.namespaces.items():
            check_template(kind, template)


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


def _pieces(label: str) -> list[tuple[str, str | None]]:
    """A template label as (literal text, field name or None) pieces."""
    try:
        parsed = list(string.Formatter().parse(label))
    except ValueError as exc:
        raise ConfigurationError(f"namespace label {label!r} is not a template: {exc}") from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (not name.isidentifier() or spec or conversion):
            raise ConfigurationError(
                f"namespace label {label!r}: placeholders are plain names such as "
                f"{{user_id}} (no attributes, indexes, formats or conversions)"
            )
        out.append((literal, name))
    return out


def check_template(kind: str, template: Any) -> None:
    """A namespace template: labels that are valid once filled, at least one of them
    filled only from values every event has (so no event is left without a namespace)."""
    if not isinstance(template, tuple | list) or not template:
        raise ConfigurationError(f"namespace of {kind!r} must be a tuple of labels")
    labels = [str(label) for label in template]
    filled = [
        "".join(lit + ("x" if name else "") for lit, name in _pieces(label)) for label in labels
    ]
    model.check_namespace(filled)
    if not any(all(n is None or n in ALWAYS for _, n in _pieces(label)) for label in labels):
        raise ConfigurationError(
            f"namespace of {kind!r} {tuple(labels)} needs a label that every event fills "
            f"(plain text, or only {{tenant_id}}, {{thread_id}}, {{kind}}): labels naming "
            f"a value the run did not give are left out"
        )


def template_values(event: Mapping[str, Any], tenant_id: str, kind: str) -> dict[str, str]:
    """What a namespace template is filled from: the run's plain configuration values the
    checkpointer's event carries, then the event's tenant and thread and the kind (which
    a configuration value never overrides)."""
    given = event.get(events.CONFIGURABLE)
    values = {
        str(k): v for k, v in (given.items() if isinstance(given, Mapping) else ())
        if isinstance(v, str) and v
    }  # fmt: skip
    values.update(tenant_id=tenant_id, thread_id=str(event.get("thread_id") or ""), kind=kind)
    return values


def fill_namespace(
    template: Sequence[str], values: Mapping[str, str], *, stop_at: str | None = None
) -> tuple[str, ...]:
    """``template`` filled from ``values``; a label naming a missing (or empty) value is
    left out. ``stop_at``: end the namespace before the first label naming that value
    (the prefix a recall searches, before ``{kind}``)."""
    out: list[str] = []
    for label in template:
        pieces = _pieces(str(label))
        names = [n for _, n in pieces if n is not None]
        if stop_at is not None and stop_at in names:
            break
        if any(not values.get(n) for n in names):
            continue
        out.append("".join(lit + (label_value(values[n]) if n else "") for lit, n in pieces))
    return model.check_namespace(out, allow_empty=stop_at is not None)


def default_worker_id() -> str:
    """A worker's name in its claims: host, process id and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def memory_conflict(_: Any) -> BaseException:
    """The error of a commit whose guard found the memories or a head changed."""
    return MemoryConflictError(
        "long-term memories changed between the aggregator's read and its commit; nothing "
        "was written and the event is decided again"
    )


class VectorDims:
    """Vectors already computed, described as check_dimensions reads an embedder."""

    def __init__(self, dims: int, name: str) -> None:
        self.dims, self.name = dims, name


# -- the commit's groups (plans as data; the twins read what they compare against) ----------


def memory_groups(
    decisions: Decisions, now: datetime, db: str, memories: str, history_collection: str
) -> list[Group]:
    """The writes of ``decisions``: inserts that exist only if absent, replaces and deletes
    compare-and-set on the version read, and each replaced or deleted version in
    ``history_collection``."""
    inserts = Group("memory:insert", db, memories, LONG_TERM_MEMORY)
    replaces = Group("memory:replace", db, memories, LONG_TERM_MEMORY)
    deletes = Group("memory:delete", db, memories, LONG_TERM_MEMORY)
    history = Group("memory:history", db, history_collection, MEMORY_HISTORY)
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
    inserts.expect = Expect(upserted=len(inserts.ops), error=memory_conflict)
    replaces.expect = Expect(matched=len(replaces.ops), error=memory_conflict)
    deletes.expect = Expect(deleted=len(deletes.ops), error=memory_conflict)
    return [g for g in (inserts, replaces, deletes, history) if g.ops]


def head_id(tenant: str, namespace: tuple[str, ...]) -> str:
    """The ``_id`` of a namespace's consolidation head."""
    return doc_id("memory-head", tenant, model.ns_path(namespace))


def head_groups(
    db: str,
    collection: str,
    tenant: str,
    heads: Mapping[tuple[str, ...], int],
    namespaces: set[tuple[str, ...]],
) -> list[Group]:
    """Compare-and-set the heads (``heads``: the sequence numbers read) of the namespaces
    where an event compared new memories with existing ones: two workers that both
    decided "no near-duplicate here" cannot both commit."""
    new = Group("memory:heads:new", db, collection, LONG_TERM_MEMORY)
    bump = Group("memory:heads:bump", db, collection, LONG_TERM_MEMORY)
    for ns in sorted(namespaces):
        _id = head_id(tenant, ns)
        if ns in heads:
            bump.ops.append(Op("update", {"_id": _id, "seq": heads[ns]}, {"$inc": {"seq": 1}}))
        else:
            new.ops.append(
                insert_once({"_id": _id, "tenant_id": tenant, "namespace": list(ns), "seq": 1})
            )
    new.expect = Expect(upserted=len(new.ops), error=memory_conflict)
    bump.expect = Expect(matched=len(bump.ops), error=memory_conflict)
    return [g for g in (new, bump) if g.ops]


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
