# Generated from accord/memory/asynchronous/outbox_stats.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Backlog and lag of an outbox: what ``accord memory status`` and ``Aggregator.stats()``
print. Read through the kernel (the read hooks see it as the ``outbox.stats`` operation).

Generated from ``accord/memory/asynchronous/outbox_stats.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING

from accord.memory import model
from accord.memory.aggregation import (
    AggregationStats,
    percentile,
)
from accord.memory.writepath import UnitOfWork
from accord.platform import outbox
from accord.platform.artifacts import OUTBOX
from accord.platform.context import ReadContext

log = logging.getLogger("accord.memory.aggregator")
_IS_SYNC = True


def aggregation_stats(
    uow: UnitOfWork,
    db: str,
    collection: str,
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
    ctx = ReadContext(tenant_id or "*", operation="outbox.stats")
    # events whose kind is no string belong to no consumer's kinds: counted here (dead
    # letters, once the aggregator found them) so that they are not invisible
    counted = dict(base)
    if kinds:
        del counted["kind"]
        counted["$or"] = [{"kind": {"$in": list(kinds)}}, {"kind": {"$not": {"$type": "string"}}}]
    count = {
        s: uow.count(ctx, OUTBOX.name, db, collection, {**counted, "status": s})
        for s in (outbox.PENDING, outbox.CLAIMED, outbox.DEAD)
    }
    now = datetime.now(UTC)
    # Only dates count (a malformed event's created_at may be anything: it is dead-lettered,
    # and must not break the statistics meanwhile).
    oldest = uow.find_one(
        ctx, OUTBOX.name, db, collection,
        {**base, "status": {"$in": [outbox.PENDING, outbox.CLAIMED]},
         "created_at": {"$type": "date"}},
        projection={"created_at": 1},
        sort=[("created_at", ASCENDING)],
    )  # fmt: skip
    age = (now - model.aware(oldest["created_at"])).total_seconds() if oldest else None  # type: ignore[operator]
    recent = uow.find(
        ctx, OUTBOX.name, db, collection, {**base, "status": outbox.DONE},
        projection={"created_at": 1, "done_at": 1}, sort=[("done_at", DESCENDING)], limit=window,
    )  # fmt: skip
    lags = [
        (model.aware(d["done_at"]) - model.aware(d["created_at"])).total_seconds()  # type: ignore[operator]
        for d in recent
        if isinstance(d.get("done_at"), datetime) and isinstance(d.get("created_at"), datetime)
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
