"""TTL monitor: deletes documents whose indexed date is older than ``expireAfterSeconds``."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from accord.platform.embedded import query
from accord.platform.embedded.engine import Engine
from accord.platform.embedded.errors import EngineError

log = logging.getLogger("accord.engine")


def _expiry_instant(values: list[Any]) -> dt.datetime | None:
    # mongod uses the earliest date of an array; non-date values never expire.
    dates = [v for v in values if isinstance(v, dt.datetime)]
    if not dates:
        return None
    return min(
        d.replace(tzinfo=None) if d.tzinfo is None else d.astimezone(dt.UTC).replace(tzinfo=None)
        for d in dates
    )


def expire_once(engine: Engine, now: dt.datetime | None = None) -> int:
    """One TTL pass. Returns how many documents were deleted. Call with the lock held."""
    now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    deleted = 0
    for coll in list(engine.collections.values()):
        ttl_indexes = [i for i in coll.indexes.values() if i.expire_after is not None]
        if not ttl_indexes:
            continue
        txn = engine.begin(explicit=False)
        try:
            for key, doc in list(engine.scan(txn, coll.ns)):
                for index in ttl_indexes:
                    if index.partial is not None and not query.matches(index.partial, doc):
                        continue
                    instant = _expiry_instant(query.path_values(doc, index.fields[0]))
                    if instant is None:
                        continue
                    assert index.expire_after is not None
                    if instant + dt.timedelta(seconds=float(index.expire_after)) <= now:
                        try:
                            engine.write(txn, coll, key, None)
                            deleted += 1
                        except EngineError:
                            pass  # held by an open transaction: next pass
                        break
            engine.commit(txn)
        except BaseException:
            engine.abort(txn, "ttl pass failed")
            raise
    return deleted
