"""Write plans: what one transaction writes, as plain data.

Every write of every part of accord (a checkpoint, a task's business writes, the
aggregator's memories, a retention sweep, an erasure) is a :class:`Plan`: groups of
operations per collection, plus the outbox events the transaction must enqueue. Plans are
built once by pure code; the unit of work
(:class:`~accord.platform.synchronous.unit_of_work.UnitOfWork` and its async twin) only
runs them, with its hooks, in one transaction. So governance can inspect and extend every
write without knowing who made it, and every component gets the same retries and errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne

from accord.platform.context import PlanContext, WriteContext

__all__ = [
    "COMMAND_KINDS", "Counts", "Expect", "Group", "Op", "OpKind", "OutboxEvent", "Plan",
    "PlanContext", "PlanResult", "WriteContext", "insert_once",
]  # fmt: skip

OpKind = Literal[
    "insert", "update", "update_many", "replace", "delete", "delete_many", "find_one_and_update"
]
_KINDS = frozenset(
    {"insert", "update", "update_many", "replace", "delete", "delete_many", "find_one_and_update"}
)
#: Kinds sent as one command each (they return a document), before the plan's bulk write.
COMMAND_KINDS = frozenset({"find_one_and_update"})


@dataclass(frozen=True)
class Op:
    """One write.

    ``doc`` is the document (``insert``), the replacement (``replace``), or the update
    (``update``/``update_many``/``find_one_and_update``: an operator document or a
    pipeline list). ``filter`` selects the target of everything but ``insert``.

    ``find_one_and_update`` (a claim: take one document, e.g. an outbox event, and get
    it back) runs as its own command inside the plan's transaction, before the bulk
    write; ``sort`` picks which matching document, and the result holds the document
    after the update (``PlanResult.found``).
    """

    kind: OpKind
    filter: Mapping[str, Any] | None = None
    doc: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    upsert: bool = False
    sort: Sequence[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown op kind {self.kind!r}; one of {sorted(_KINDS)}")

    def model(self, namespace: str | None = None) -> Any:
        """The pymongo write model (with ``namespace`` for a client-level bulkWrite)."""
        doc: Any
        if isinstance(self.doc, Mapping) or self.doc is None:
            doc = dict(self.doc or {})
        else:
            doc = [dict(stage) for stage in self.doc]  # a pipeline update
        filt = dict(self.filter or {})
        if self.kind == "insert":
            return InsertOne(doc, namespace=namespace)
        if self.kind == "update":
            return UpdateOne(filt, doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "update_many":
            return UpdateMany(filt, doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "replace":
            return ReplaceOne(filt, doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "delete":
            return DeleteOne(filt, namespace=namespace)
        if self.kind == "delete_many":
            return DeleteMany(filt, namespace=namespace)
        raise ValueError(f"{self.kind} is a command of its own, not a bulk write model")


def insert_once(doc: Mapping[str, Any]) -> Op:
    """Insert ``doc`` unless a document with its ``_id`` exists: an idempotent insert.

    A retried transaction or a replayed call writes the same document again without a
    duplicate-key error; ``Counts.matched`` tells that it existed.
    """
    body = {k: v for k, v in doc.items() if k != "_id"}
    return Op("update", {"_id": doc["_id"]}, {"$setOnInsert": body}, upsert=True)


@dataclass
class Counts:
    """What the writes of one group did."""

    inserted: int = 0
    matched: int = 0
    modified: int = 0
    upserted: int = 0
    deleted: int = 0

    def add(self, other: Counts) -> None:
        self.inserted += other.inserted
        self.matched += other.matched
        self.modified += other.modified
        self.upserted += other.upserted
        self.deleted += other.deleted


@dataclass(frozen=True)
class Expect:
    """A guard on the counts of one group, checked inside the transaction.

    Each field that is not None must equal the group's count (``matched_at_most``: bound
    it). When one does not, the
    transaction is aborted and ``error(counts)`` is raised to the caller (not retried):
    e.g. a compare-and-set on a head or a lease document that matched nothing means
    another writer got there first.
    """

    error: Callable[[Counts], BaseException]
    inserted: int | None = None
    matched: int | None = None
    upserted: int | None = None
    deleted: int | None = None
    #: ``matched + upserted`` (an upsert that either found or created its document)
    touched: int | None = None
    #: an upper bound on ``matched`` (a count made by a write in the transaction: e.g. a
    #: tenant's running runs when a worker claims one more)
    matched_at_most: int | None = None

    def violated(self, counts: Counts) -> bool:
        return (
            (self.inserted is not None and counts.inserted != self.inserted)
            or (self.matched is not None and counts.matched != self.matched)
            or (self.upserted is not None and counts.upserted != self.upserted)
            or (self.deleted is not None and counts.deleted != self.deleted)
            or (self.touched is not None and counts.matched + counts.upserted != self.touched)
            or (self.matched_at_most is not None and counts.matched > self.matched_at_most)
        )


@dataclass
class Group:
    """Writes to one collection, executed in order.

    ``artifact`` names the artifact class of the collection
    (:mod:`accord.platform.artifacts`): hooks such as governance's policy check and audit
    key on it. ``sources`` records, per op, what the op came from (e.g. the staged
    business operation), so an error can name it. ``origin`` says where the group's
    writes come from, for seal hooks (a task's business writes: its thread, namespace,
    checkpoint and task id; the undo log records them).
    """

    name: str
    db: str
    collection: str
    artifact: str
    ops: list[Op] = field(default_factory=list)
    sources: list[Any] | None = None
    expect: Expect | None = None
    origin: Mapping[str, Any] | None = None

    @property
    def namespace(self) -> str:
        return f"{self.db}.{self.collection}"

    def source(self, index: int | None) -> Any:
        """What op ``index`` came from (the only op's source when ``index`` is None)."""
        if self.sources is None:
            return None
        if index is None:
            return self.sources[0] if len(self.sources) == 1 else None
        return self.sources[index] if 0 <= index < len(self.sources) else None


@dataclass(frozen=True)
class OutboxEvent:
    """An event for asynchronous work, inserted in the same transaction as the plan.

    ``key`` is the event's natural key (e.g. thread, namespace, checkpoint): the event's
    ``_id`` is derived from (kind, tenant, key), so a retried or replayed transaction
    enqueues it once. ``fields`` are stored as they are (plain BSON values).
    """

    db: str
    collection: str
    kind: str
    tenant_id: str
    key: tuple[str, ...]
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """Everything one transaction writes, and its :class:`WriteContext` (who, for whom,
    why; the run and its guard)."""

    context: WriteContext
    groups: list[Group] = field(default_factory=list)
    events: list[OutboxEvent] = field(default_factory=list)
    #: the run guard the kernel put first (from ``context.guard``), once it did
    guard_group: Group | None = field(default=None, repr=False)

    def add(self, group: Group) -> Group:
        if any(g.name == group.name for g in self.groups):
            raise ValueError(f"plan already has a group named {group.name!r}")
        self.groups.append(group)
        return group

    def writes(self) -> Iterator[Group]:
        """The groups that have something to write."""
        return (g for g in self.groups if g.ops)

    def op_count(self) -> int:
        return sum(len(g.ops) for g in self.groups)


@dataclass
class PlanResult:
    """Counts per group name, the documents ``find_one_and_update`` ops returned (per
    group name, in op order; None where nothing matched), and how many attempts the
    transaction took."""

    counts: dict[str, Counts]
    found: dict[str, list[Any]] = field(default_factory=dict)
    attempts: int = 1

    def __getitem__(self, group: str) -> Counts:
        return self.counts.get(group) or Counts()
