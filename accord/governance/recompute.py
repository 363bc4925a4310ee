"""``apply`` and retention: the TTL indexes a policy needs, and ``expire_at`` recomputed
on the documents already written when the policy's periods change.

Documents keep their expiry as a date, not their period, so a changed period moves each
date by the difference (``expire_at + new - old``: the same event, a new period), in
bounded batches through the kernel; a class that starts expiring gets ``now + period``
(what was written before has no better event time); one that stops loses ``expire_at``.
Held documents (``held_expire_at``) move too, and nothing a hold covers gets a new
expiry. The run registry's thread expiry moves with the thread period. What a hold
covers is left out as :func:`~accord.governance.holding.release` leaves it out
(:class:`~accord.governance.holding.Exclusion`): small filters in a ``$nor``, a subject's
id lists checked in memory on each batch, so no filter grows with the subject.

Crash safety: each batch commits with the position reached, on the stored version's
document, and the version says ``retention = "pending"`` until the last batch; ``apply``
run again after a crash resumes from there (:func:`recompute`), so every document moves
exactly once and no version is taken as applied before its documents are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from accord.errors import PermissionDenied
from accord.governance.holding import BATCH, Exclusion, hold_covers, list_holds, runs_collection
from accord.governance.policy import Policy
from accord.governance.retention import (
    EXPIRE_AT,
    HELD_EXPIRE_AT,
    THREAD_CLASSES,
    TTL_INDEX,
    TtlRule,
    finished_filter,
    thread_ttl,
    ttl_targets,
)
from accord.governance.subjects import chunks
from accord.platform.artifacts import POLICY, RUN
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Group, Op, Plan

__all__ = ["DONE", "PENDING", "check_allowed", "recompute", "ttl_index_commands"]

POLICIES = POLICY.default_collection or "accord_policies"

OPERATION = "governance.apply.retention"
Progress = Callable[[str, int], None]


def ttl_index_commands(client: Any, db: str, policy: Policy) -> list[tuple[str, dict[str, Any]]]:
    """(collection, ``createIndexes`` command) of each TTL index ``policy`` needs and
    ``db`` lacks: ``{expire_at: 1}``, ``expireAfterSeconds: 0``, named ``retention``."""
    out = []
    for collection in sorted(ttl_targets(policy)):
        have = (
            client[db][collection].index_information()
            if collection in set(client[db].list_collection_names())
            else {}
        )
        if any(spec.get("key") == [(EXPIRE_AT, 1)] for spec in have.values()):
            continue
        out.append((collection, {"createIndexes": collection, "indexes": [
            {"key": {EXPIRE_AT: 1}, "name": TTL_INDEX, "expireAfterSeconds": 0},
        ]}))  # fmt: skip
    return out


def _shift(field: str, delta: timedelta) -> list[dict[str, Any]]:
    ms = int(delta.total_seconds() * 1000)
    return [{"$set": {field: {"$add": [f"${field}", ms]}}}]


class Step(NamedTuple):
    """One step of a recompute: the documents of ``collection`` matching ``which`` but
    those ``leave`` holds (checked on each batch), and the change made to them."""

    collection: str
    artifact: str
    which: dict[str, Any]
    change: Any
    leave: Exclusion = Exclusion()


def _steps(uow: Any, db: str, old: Policy | None, new: Policy) -> list[Step]:
    """The steps bringing ``expire_at`` from ``old`` to ``new``, always in the same order
    (a resumed recompute names its step by position)."""
    before = ttl_targets(old) if old is not None else {}
    after = ttl_targets(new)
    holds = list_holds(uow, db, new)
    now = datetime.now(UTC)
    jobs: list[tuple[str, str, TtlRule | None, TtlRule | None, tuple[str, ...]]] = []
    for collection in sorted(set(before) | set(after)):
        was = before.get(collection, (None, None))[1]
        rule = after.get(collection, (None, None))[1]
        artifact = (after.get(collection) or before[collection])[0]
        if was == rule:
            continue
        cls = new.of(artifact, collection)
        jobs.append((collection, artifact, was, rule, cls.subject_fields if cls else ()))
    old_thread = thread_ttl(old) if old is not None else None
    new_thread = thread_ttl(new)
    if old_thread != new_thread:
        was_rule = TtlRule(old_thread, "last_activity") if old_thread is not None else None
        rule = TtlRule(new_thread, "last_activity") if new_thread is not None else None
        jobs.append((runs_collection(new), RUN.name, was_rule, rule, ()))
    steps: list[Step] = []
    for collection, artifact, was, rule, fields in jobs:
        if rule is None:  # stops expiring
            steps.append(Step(collection, artifact, {EXPIRE_AT: {"$exists": True}},
                              {"$unset": {EXPIRE_AT: ""}}))  # fmt: skip
            steps.append(Step(collection, artifact, {HELD_EXPIRE_AT: {"$exists": True}},
                              {"$unset": {HELD_EXPIRE_AT: ""}}))  # fmt: skip
        elif was is None or was.event != rule.event:  # starts, or from another event
            at = now + rule.expire_after
            if was is not None:
                # from another event: the dates counted from the old one are no longer
                # the document's (created+20s kept deleting orders now "30d after
                # updated"); the new event's time is not known, so from now, as a class
                # that starts expiring; not finished under "done": not yet
                for field in (EXPIRE_AT, HELD_EXPIRE_AT):
                    stamped: dict[str, Any] = {field: {"$exists": True}}
                    if rule.event == "done":
                        steps.append(Step(collection, artifact,
                                          {**stamped, "status": {"$nin": list(rule.finished)}},
                                          {"$unset": {field: ""}}))  # fmt: skip
                        stamped["status"] = finished_filter(rule)
                    steps.append(Step(collection, artifact, stamped, {"$set": {field: at}}))
            if artifact == RUN.name and any(
                h.kind == "class" and h.value in THREAD_CLASSES for h in holds
            ):
                continue  # every thread is held: each gets its expiry at the release
            unstamped: dict[str, Any] = {EXPIRE_AT: {"$exists": False},
                                         HELD_EXPIRE_AT: {"$exists": False}}  # fmt: skip
            if rule.event == "done":
                unstamped["status"] = finished_filter(rule)
            # held: left alone, stamped at the release (no $nor of a subject's every id)
            held = Exclusion.of(hold_covers(uow, db, new, holds, artifact, collection, fields))
            # (threads too: one idle since, with no next commit, was never swept)
            steps.append(Step(collection, artifact, held.narrow(unstamped),
                              {"$set": {EXPIRE_AT: at}}, held))  # fmt: skip
        else:  # the same event, another period: NOT idempotent, so done exactly once
            delta = rule.expire_after - was.expire_after
            steps.append(Step(collection, artifact, {EXPIRE_AT: {"$exists": True}},
                              _shift(EXPIRE_AT, delta)))  # fmt: skip
            steps.append(Step(collection, artifact, {HELD_EXPIRE_AT: {"$exists": True}},
                              _shift(HELD_EXPIRE_AT, delta)))  # fmt: skip
    return steps


def check_allowed(uow: Any, db: str, old: Policy | None, new: Policy) -> None:
    """Refuse, before anything is written, a recompute the principal of ``uow`` could
    not finish under ``new``: it reads and updates each class whose expiry changes (a
    policy granting the admin ``find`` only on ``business:orders`` stored its version,
    then failed at the first batch, and every apply after it failed the same way)."""
    principal = uow.principal
    for step in _steps(uow, db, old, new):
        collection, artifact = step.collection, step.artifact
        cls = new.of(artifact, collection)
        granted = frozenset() if cls is None else cls.allowed(principal.role, principal.name)
        missing = sorted({"find", "update"} - granted)
        if missing == ["update"] and not _any_to_change(uow, db, step):
            continue  # nothing to update
        if missing:
            name = cls.name if cls is not None else artifact
            raise PermissionDenied(
                f"this policy changes the expiry of {name} ({db}.{collection}), which apply "
                f"recomputes as {principal.name} (role {principal.role}), but it does not "
                f"grant that role {' and '.join(repr(m) for m in missing)} on {name}: add "
                f"them to [classes.{_quoted(name)}] roles.{principal.role}; nothing was "
                f"applied"
            )


def _quoted(name: str) -> str:
    return f'"{name}"' if ":" in name else name


def _any_to_change(uow: Any, db: str, step: Step) -> bool:
    """Whether ``step`` changes any document: one read, or, where ids a hold lists are
    checked in memory, batches until one is not held."""
    last: Any = None
    while docs := _read(uow, db, step, last, 1 if step.leave.unless is None else BATCH):
        if _to_change(step, docs):
            return True
        last = docs[-1]["_id"]
    return False


def _read(uow: Any, db: str, step: Step, after: Any, limit: int) -> list[dict[str, Any]]:
    """The next ``limit`` documents of ``step`` past ``_id`` ``after`` (None: from the
    first), in ``_id`` order, with what :attr:`Step.leave` checks."""
    which = step.which
    page = {"$and": [dict(which), {"_id": {"$gt": after}}]} if after is not None else dict(which)
    projection = {"_id": 1, "tenant_id": 1, **dict.fromkeys(step.leave.read, 1)}
    return list(uow.find(ReadContext("*", operation=OPERATION), step.artifact, db,
                         step.collection, page, projection=projection, sort=[("_id", 1)],
                         limit=limit))  # fmt: skip


def _to_change(step: Step, docs: list[dict[str, Any]]) -> dict[Any, list[Any]]:
    """Per tenant, the ids of ``docs`` that ``step`` changes (no hold covers them)."""
    by_tenant: dict[Any, list[Any]] = defaultdict(list)
    for d in docs:
        if not step.leave.held(d):
            by_tenant[d.get("tenant_id")].append(d["_id"])
    return by_tenant


def recompute(
    uow: Any,
    db: str,
    old: Policy | None,
    new: Policy,
    progress: Progress | None = None,
    *,
    version: int,
    cursor: Mapping[str, Any] | None = None,
    batch: int = BATCH,
) -> int:
    """Bring ``expire_at`` of ``db``'s documents from policy ``old`` (None: nothing was
    stamped) to ``new``, stored as version ``version``; returns how many documents
    changed.

    Each batch (``batch`` documents of one step, in ``_id`` order) commits in one
    transaction with the position reached, recorded on the version's document
    (``recompute``: step and last ``_id``); the last one marks the version's retention
    ``done``. So a recompute killed anywhere is resumed from ``cursor`` (that position)
    by the next ``apply``, and no document is moved twice (a shift is not idempotent)."""
    steps = _steps(uow, db, old, new)
    step = int(cursor["step"]) if cursor else 0
    last: Any = cursor.get("after") if cursor else None
    changed = 0
    while step < len(steps):
        collection = steps[step].collection
        docs = _read(uow, db, steps[step], last, batch)
        if not docs:
            step, last = step + 1, None
            continue
        # the position passes the held documents too: left alone, as the $nor left them
        last = docs[-1]["_id"]
        by_tenant = _to_change(steps[step], docs)
        plans = _updates(db, steps[step], by_tenant)
        plans.append(_position(db, version, {"recompute": {"step": step, "after": last}}))
        uow.execute_all(plans)
        moved = sum(len(ids) for ids in by_tenant.values())
        changed += moved
        if progress is not None and moved:
            progress(collection, moved)
    uow.execute(_position(db, version, {"retention": DONE}, unset="recompute"))
    return changed


def _updates(db: str, step: Step, by_tenant: Mapping[Any, list[Any]]) -> list[Plan]:
    """``step``'s change of ``by_tenant``'s ids: one plan per tenant (each plan names whose
    documents it changes), its ids a page per operation."""
    return [
        Plan(WriteContext(tenant if isinstance(tenant, str) else "*", operation=OPERATION), [
            Group(f"{OPERATION}:{step.collection}", db, step.collection, step.artifact, [
                Op("update_many", {"tenant_id": tenant, "_id": {"$in": part}}, step.change)
                for part in chunks(ids)
            ]),
        ])
        for tenant, ids in by_tenant.items()
    ]  # fmt: skip


#: ``retention`` of a stored version whose ``expire_at`` recompute finished (or that
#: needed none); ``PENDING`` until then.
DONE, PENDING = "done", "pending"


def _position(db: str, version: int, values: Mapping[str, Any], unset: str | None = None) -> Plan:
    change: dict[str, Any] = {"$set": dict(values)}
    if unset is not None:
        change["$unset"] = {unset: ""}
    return Plan(WriteContext("*", operation=OPERATION), [
        Group("policy:recompute", db, POLICIES, POLICY.name,
              [Op("update", {"_id": f"v{version}"}, change)]),
    ])  # fmt: skip
