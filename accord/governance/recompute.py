"""``apply`` and retention: the TTL indexes a policy needs, and ``expire_at`` recomputed
on the documents already written when the policy's periods change.

Documents keep their expiry as a date, not their period, so a changed period moves each
date by the difference (``expire_at + new - old``: the same event, a new period), in
bounded batches through the kernel; a class that starts expiring gets ``now + period``
(what was written before has no better event time); one that stops loses ``expire_at``.
Held documents (``held_expire_at``) move too, and nothing a hold covers gets a new
expiry. The run registry's thread expiry moves with the thread period.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from accord.governance.holding import (
    change_in_batches,
    hold_filters,
    list_holds,
    runs_collection,
)
from accord.governance.policy import Policy
from accord.governance.retention import (
    EXPIRE_AT,
    HELD_EXPIRE_AT,
    TTL_INDEX,
    TtlRule,
    finished_filter,
    thread_ttl,
    ttl_targets,
)
from accord.platform.artifacts import RUN

__all__ = ["recompute", "ttl_index_commands"]

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


def recompute(
    uow: Any,
    db: str,
    old: Policy | None,
    new: Policy,
    progress: Progress | None = None,
) -> int:
    """Bring ``expire_at`` of ``db``'s documents from policy ``old`` (None: nothing was
    stamped) to ``new``; returns how many documents changed."""
    before = ttl_targets(old) if old is not None else {}
    after = ttl_targets(new)
    holds = list_holds(uow, db, new)
    changed = 0
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
    for collection, artifact, was, rule, fields in jobs:

        def run(
            which: dict[str, Any],
            change: Any,
            collection: str = collection,
            artifact: str = artifact,
        ) -> int:
            return change_in_batches(uow, db, collection, artifact, which, change,
                                     operation=OPERATION, progress=progress)  # fmt: skip

        if rule is None:  # stops expiring
            changed += run({EXPIRE_AT: {"$exists": True}}, {"$unset": {EXPIRE_AT: ""}})
            changed += run({HELD_EXPIRE_AT: {"$exists": True}}, {"$unset": {HELD_EXPIRE_AT: ""}})
        elif was is None or was.event != rule.event:  # starts, or from another event
            if artifact == RUN.name:
                continue  # threads get theirs at their next commit
            unstamped: dict[str, Any] = {EXPIRE_AT: {"$exists": False},
                                         HELD_EXPIRE_AT: {"$exists": False}}  # fmt: skip
            if rule.event == "done":
                unstamped["status"] = finished_filter(rule)
            held = hold_filters(uow, db, new, holds, artifact, collection, fields)
            which = {"$and": [unstamped, {"$nor": held}]} if held else unstamped
            changed += run(which, {"$set": {EXPIRE_AT: now + rule.expire_after}})
        else:  # the same event, another period
            delta = rule.expire_after - was.expire_after
            changed += run({EXPIRE_AT: {"$exists": True}}, _shift(EXPIRE_AT, delta))
            changed += run({HELD_EXPIRE_AT: {"$exists": True}}, _shift(HELD_EXPIRE_AT, delta))
    return changed
