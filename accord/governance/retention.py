"""Retention: ``expire_at`` stamped on what a plan writes, from the policy, at write time.

Two kinds of rules, because a TTL index deletes documents one by one and knows nothing of
threads:

* **documents that expire on their own** (the classes that belong to no thread: outbox
  events, long-term memories and their history, business records, ...): each gets
  ``expire_at`` = the event + the class's ``expire_after`` (``created``: on insert only;
  ``updated``: on every write; ``done``: when an outbox event is marked done, or a queued
  run finishes: ``done``, ``failed`` or ``cancelled``, see :data:`FINISHED`), and a TTL
  index ``{expire_at: 1}, expireAfterSeconds: 0`` (``accord governance apply`` creates it)
  deletes it then. A memory's vectors get their memory's ``expire_at``: they go together
  (and leave ``$vectorSearch`` together).
* **threads** (checkpoints, their blobs, writes and head, the messages, the run registry):
  a TTL on each document would delete half a thread (a value written once and read by
  every later checkpoint expires first). A thread expires whole: each commit sets the
  thread's ``expire_at`` on its run-registry document (the commit's guard, no extra op) to
  last activity + the shortest ``expire_after`` of ``checkpoint``, ``short_term_memory``
  and ``run`` (messages a kept checkpoint references cannot go before it, and the
  checkpoints cannot be restored without them, so the thread goes at the earliest), and
  ``accord governance sweep`` deletes expired threads with everything they own.

A held document (:mod:`accord.governance.holds`) gets no ``expire_at``, and a held
thread's commits set none. Everything here is pure: :class:`RetentionHook` is a ``derive``
hook (docs/platform.md, "Hooks") that rewrites the ops of a plan's groups before the
transaction; its view of the holds is kept fresh in the kernel's ``refresh`` phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from accord.governance.hold_guard import checkpoint_subject_fields
from accord.governance.holds import Holds, HoldSet
from accord.governance.policy import DEPENDENT, Policy
from accord.platform.artifacts import CHECKPOINT, CLASSES
from accord.platform.plan import Group, Op, Plan

__all__ = [
    "EXPIRE_AT", "FINISHED", "HELD_EXPIRE_AT", "THREAD_CLASSES", "TTL_INDEX", "RetentionHook",
    "TtlRule", "finished_filter",
    "stamp", "thread_ttl", "ttl_rule", "ttl_targets",
]  # fmt: skip

EXPIRE_AT = "expire_at"
#: Where a hold keeps a held document's expiry (restored on release).
HELD_EXPIRE_AT = "held_expire_at"
#: The TTL index's name (the outbox's own index has the same name and shape).
TTL_INDEX = "retention"
#: The classes whose documents go with their thread.
THREAD_CLASSES = ("checkpoint", "short_term_memory", "run")
#: The classes with a ``done`` event, and the statuses that are it: an outbox event is
#: done once handled; a queued run once it ended, however (never while it is queued,
#: running or waiting). A queued run belongs to a thread but expires on its own.
FINISHED: Mapping[str, tuple[str, ...]] = {
    "outbox": ("done",),
    "queued_run": ("done", "failed", "cancelled"),
}


def finished_filter(rule: TtlRule) -> Any:
    """The ``status`` condition of the documents that reached ``rule``'s ``done``."""
    return rule.finished[0] if len(rule.finished) == 1 else {"$in": list(rule.finished)}


class TtlRule:
    """How one class's documents are stamped: ``expire_after`` after ``event``."""

    __slots__ = ("event", "expire_after", "finished")

    def __init__(
        self, expire_after: timedelta, event: str, finished: tuple[str, ...] = ("done",)
    ) -> None:
        self.expire_after = expire_after
        self.event = event
        self.finished = finished  # the statuses that are ``done`` (:data:`FINISHED`)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TtlRule) and (other.expire_after, other.event) == (
            self.expire_after,
            self.event,
        )

    def __repr__(self) -> str:
        return f"TtlRule({self.expire_after}, {self.event!r})"


def ttl_rule(policy: Policy, artifact: str, collection: str | None = None) -> TtlRule | None:
    """The per-document rule of ``artifact`` (None: its documents are not stamped: kept,
    or they go with their thread). A dependent class takes its owner's rule."""
    registry = CLASSES.get(artifact)
    if registry is None or (registry.thread_scoped and artifact not in FINISHED):
        return None
    owner = DEPENDENT.get(artifact)
    cls = policy.of(owner or artifact, None if owner else collection)
    if cls is None or cls.retention.expire_after is None:
        return None
    return TtlRule(cls.retention.expire_after, cls.retention.after or "created",
                   FINISHED.get(artifact, ("done",)))  # fmt: skip


def thread_ttl(policy: Policy) -> timedelta | None:
    """How long after its last commit a thread expires (module docstring); None: never."""
    found = [
        cls.retention.expire_after
        for name in THREAD_CLASSES
        if (cls := policy.classes.get(name)) is not None and cls.retention.expire_after is not None
    ]
    return min(found) if found else None


def ttl_targets(policy: Policy) -> dict[str, tuple[str, TtlRule]]:
    """collection -> (class, rule) of every collection whose documents the policy stamps
    (the TTL indexes ``apply`` creates). A business class counts when the policy names
    its collection."""
    out: dict[str, tuple[str, TtlRule]] = {}
    for name, cls in policy.classes.items():
        if name == "audit":  # expired by cuts (audit_cuts): a TTL index would break chains
            continue
        base = name.partition(":")[0]
        collection = cls.collection or (name.partition(":")[2] if base == "business" else None)
        if not collection:
            continue
        rule = ttl_rule(policy, base, collection)
        if rule is not None:
            out[collection] = (base, rule)
    return out


def stamp(op: Op, rule: TtlRule, now: datetime) -> Op:
    """``op`` with ``expire_at`` set as ``rule`` says (unchanged when the op does not
    reach the rule's event, or already sets ``expire_at`` itself)."""
    at = now + rule.expire_after
    kind, doc = op.kind, op.doc
    if kind in ("insert", "replace"):
        if not isinstance(doc, Mapping) or EXPIRE_AT in doc:
            return op
        if rule.event == "done" and doc.get("status") not in rule.finished:
            return op
        return replace(op, doc={**doc, EXPIRE_AT: at})
    if kind not in ("update", "update_many", "find_one_and_update") or doc is None:
        return op
    if not isinstance(doc, Mapping):  # a pipeline update
        if rule.event in ("created", "done"):
            return op
        return replace(op, doc=[*doc, {"$set": {EXPIRE_AT: at}}])
    sets = doc.get("$set") or {}
    if rule.event == "done" and sets.get("status") in rule.finished:
        own = sets.get(EXPIRE_AT)  # the consumer's own retention: the shorter one wins
        if isinstance(own, datetime) and _aware(own) <= at:
            return op
        return replace(op, doc={**doc, "$set": {**sets, EXPIRE_AT: at}})
    if "$rename" in doc or any(
        EXPIRE_AT in (doc.get(o) or {}) for o in ("$set", "$setOnInsert", "$unset")
    ):
        return op  # it says what becomes of the expiry itself (a hold, a release)
    if rule.event == "created":
        if not op.upsert:
            return op
        return replace(op, doc={**doc, "$setOnInsert": {**(doc.get("$setOnInsert") or {}),
                                                         EXPIRE_AT: at}})  # fmt: skip
    if rule.event == "done":
        return op  # not marked done by this op
    return replace(op, doc={**doc, "$set": {**sets, EXPIRE_AT: at}})


#: The operations of governance's own expiry moves (holding.py, recompute.py).
EXPIRY_OPERATIONS = frozenset({"governance.hold", "governance.release",
                               "governance.apply.retention"})  # fmt: skip


def held_op(op: Op) -> Op:
    """``op`` writing no ``expire_at`` of its own: one it sets (an outbox event marked
    done with its consumer's retention) becomes ``held_expire_at``, as a hold's move
    renames it, so the TTL monitor leaves the document alone until the release (before
    2026-12-07, outbox events done during a class hold expired under it)."""
    doc = op.doc
    if not isinstance(doc, Mapping):
        return op
    if op.kind in ("insert", "replace"):
        if EXPIRE_AT not in doc:
            return op
        moved = {k: v for k, v in doc.items() if k != EXPIRE_AT}
        return replace(op, doc={**moved, HELD_EXPIRE_AT: doc[EXPIRE_AT]})
    if op.kind not in ("update", "update_many", "find_one_and_update"):
        return op
    changed = dict(doc)
    for operator in ("$set", "$setOnInsert"):
        sets = doc.get(operator)
        if isinstance(sets, Mapping) and EXPIRE_AT in sets:
            rest = {k: v for k, v in sets.items() if k != EXPIRE_AT}
            changed[operator] = {**rest, HELD_EXPIRE_AT: sets[EXPIRE_AT]}
    return op if changed == doc else replace(op, doc=changed)


def names_held_subject(plan: Plan, policy: Policy, held: Holds, tenant_id: str) -> bool:
    """Whether a checkpoint ``plan`` writes names, in its metadata, a subject a hold of
    ``held`` names (its thread is then held: its commits set no expiry)."""
    subjects = {
        h.value for h in held.holds if h.kind == "subject" and h.tenant_id in (None, tenant_id)
    }
    if not subjects:
        return False
    fields = [  # paths inside a checkpoint document's plain metadata, ``meta``
        f.removeprefix("meta.").split(".")
        for f in checkpoint_subject_fields(policy)
        if f.startswith("meta.")
    ]
    for group in plan.groups:
        if group.artifact != CHECKPOINT.name:
            continue
        for op in group.ops:
            meta = op.doc.get("meta") if isinstance(op.doc, Mapping) else None
            for path in fields:
                value: Any = meta
                for part in path:
                    value = value.get(part) if isinstance(value, Mapping) else None
                if isinstance(value, str) and value in subjects:
                    return True
    return False


def _writes_checkpoints(plan: Plan) -> bool:
    return any(g.artifact == CHECKPOINT.name and g.ops for g in plan.groups)


def _subject_holds(held: Holds, tenant_id: str) -> bool:
    return any(h.kind == "subject" and h.tenant_id in (None, tenant_id) for h in held.holds)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class RetentionHook:
    """The ``derive`` hook that stamps ``expire_at`` (module docstring). ``policies``:
    the policy of a database (the one the policy hook enforces there); ``holds``: the
    holds of each database, refreshed through the kernel."""

    name = "governance-retention"

    def __init__(
        self,
        policies: Callable[[str], Policy],
        holds: HoldSet,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.policies = policies
        self.holds = holds
        self._clock = clock
        self.refresh_read = holds.refresh_read
        self.refreshed = holds.refreshed
        # per policy object: its thread period and rules, so a step costs dict lookups
        self._thread: dict[int, tuple[Policy, timedelta | None]] = {}
        self._rules: dict[tuple[int, str, str], TtlRule | None] = {}

    def _thread_ttl(self, policy: Policy) -> timedelta | None:
        found = self._thread.get(id(policy))
        if found is None or found[0] is not policy:
            if len(self._thread) > 64:
                self._thread.clear()
                self._rules.clear()
            found = self._thread[id(policy)] = (policy, thread_ttl(policy))
        return found[1]

    def _rule(self, policy: Policy, artifact: str, collection: str) -> TtlRule | None:
        self._thread_ttl(policy)  # keeps the policy alive while its rules are cached
        key = (id(policy), artifact, collection)
        if key in self._rules:
            return self._rules[key]
        rule = self._rules[key] = ttl_rule(policy, artifact, collection)
        return rule

    def derive(self, plan: Plan) -> None:
        """Stamp the plan's groups (and its thread guard) as the policy says."""
        groups = plan.groups
        db = groups[0].db if groups else None
        guard = plan.context.guard
        if db is None and guard is None:
            return
        policy = self.policies(db or guard.db)  # type: ignore[union-attr]
        context = plan.context
        held = self.holds.of(db or guard.db)  # type: ignore[union-attr]
        now = self._clock()
        if guard is not None and guard.kind in ("owner", "free"):
            ttl = self._thread_ttl(policy)
            surely_held = (
                held.holds_thread(guard.tenant_id, guard.thread_id)
                or any(held.holds_class(name, None) for name in THREAD_CLASSES)
                or names_held_subject(plan, policy, held, guard.tenant_id)
            )
            thread_held = surely_held or (
                # a commit without a checkpoint (task writes alone, or before the put
                # of a batch) cannot tell whether a subject hold reaches its thread:
                # it leaves the thread's expiry as it is
                not _writes_checkpoints(plan) and _subject_holds(held, guard.tenant_id)
            )
            if thread_held:
                # a held thread's commit moves its held expiry on, which the release gives
                # back (it gave back the expiry from before the hold: a thread used
                # during the hold was swept at once)
                moved = now + ttl if surely_held and ttl is not None else None
                if guard.expire_at is not None or moved is not None:
                    guard = replace(guard, expire_at=None, held_expire_at=moved)
                    plan.context = replace(context, guard=guard)
            elif ttl is not None:
                at = now + ttl
                if guard.expire_at is None or _aware(guard.expire_at) > at:  # the shorter one
                    plan.context = replace(context, guard=replace(guard, expire_at=at))
        for group in groups:
            if not group.ops:
                continue
            rule = self._rule(policy, group.artifact, group.collection)
            if rule is None and not held.holds and not held.unknown:
                continue
            self._stamp(group, rule, now, held, context, policy)

    def _stamp(
        self,
        group: Group,
        rule: TtlRule | None,
        now: datetime,
        held: Any,
        context: Any,
        policy: Policy,
    ) -> None:
        """Stamp ``group``'s ops as ``rule`` says (None: the policy gives the class no
        period); a held op gets no expiry, and one it sets itself (an outbox consumer's
        retention) is kept as ``held_expire_at``, which a release gives back."""
        if context.operation in EXPIRY_OPERATIONS:
            # a hold, a release, a recompute: they say what becomes of the expiry
            # themselves (a release runs while this process may still see the hold)
            if rule is not None:
                group.ops = [stamp(op, rule, now) for op in group.ops]
            return
        tenant, thread = context.tenant_id, context.thread_id
        owner = DEPENDENT.get(group.artifact, group.artifact)  # a memory's, for its vectors
        cls = policy.of(owner, group.collection)
        subject_fields = cls.subject_fields if cls is not None else ()
        if (
            held.holds_class(group.artifact, group.collection)
            or held.holds_class(owner, None)
            or held.holds_thread(tenant, thread)
        ):
            group.ops = [held_op(op) for op in group.ops]
            return
        subjects = held.subjects_in(subject_fields)
        out = []
        for op in group.ops:
            if subjects and not held.clear_of_subjects(op, subject_fields):
                # possibly a held subject's: no expiry; a document it surely names keeps
                # its own as held (an update's is kept: its release could not find it)
                out.append(held_op(op) if op.kind in ("insert", "replace") else op)
            elif rule is not None:
                out.append(stamp(op, rule, now))
            else:
                out.append(op)
        group.ops = out
