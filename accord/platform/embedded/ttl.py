"""TTL monitor: deletes documents whose indexed date is older than ``expireAfterSeconds``.

Each pass walks the TTL index's date range up to ``now - expireAfterSeconds`` (an
ordered index scan, not a collection scan), and deletes in commits of at most
``CHUNK`` documents, releasing the engine lock between them, so a large expiry never
stalls other clients.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any

from accord.platform.embedded import query
from accord.platform.embedded.bsonkey import DATE, sort_key
from accord.platform.embedded.engine import Collection, CommitFailed, Engine
from accord.platform.embedded.errors import EngineError
from accord.platform.embedded.indexes import Index, ScanStats

log = logging.getLogger("accord.engine")

CHUNK = 500


def _expiry_instant(values: list[Any]) -> dt.datetime | None:
    # mongod uses the earliest date of an array; non-date values never expire.
    dates = [v for v in values if isinstance(v, dt.datetime)]
    if not dates:
        return None
    return min(
        d.replace(tzinfo=None) if d.tzinfo is None else d.astimezone(dt.UTC).replace(tzinfo=None)
        for d in dates
    )


def _cutoff(index: Index, now: dt.datetime) -> dt.datetime | None:
    """The instant before which ``index``'s documents have expired; None when its
    ``expireAfterSeconds`` is no usable number (NaN, which mongod accepts, or a value stored
    by an older version), so one odd index never stops the pass for all the others."""
    seconds = index.expire_after
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    try:
        return now - dt.timedelta(seconds=float(seconds))
    except (OverflowError, ValueError):  # NaN, infinities, past the calendar
        return None


def _expired(engine: Engine, coll: Collection, index: Index, now: dt.datetime) -> list[bytes]:
    """Id keys of documents ``index`` says have expired (lock held)."""
    cutoff = _cutoff(index, now)
    if cutoff is None:
        return []
    # Every date key from the first date up to the cutoff (dates form one type bracket).
    ranges = [(((DATE - 0.5,),), index.after((sort_key(cutoff),)))]
    view = engine.begin(explicit=False)
    try:
        found = index.scan(ranges, snapshot=view.snapshot, stats=ScanStats())
        return list(dict.fromkeys(record.key for record, _ in found))
    finally:
        engine.abort(view, "ttl scan finished")


def expire_once(
    engine: Engine, now: dt.datetime | None = None, *, stopping: threading.Event | None = None
) -> int:
    """One TTL pass; takes the engine lock itself, a chunk at a time. Returns how many
    documents were deleted."""
    now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    deleted = 0
    with engine.locked("ttl"):
        work = [
            (coll, index)
            for coll in engine.collections.values()
            if coll.pending_owner is None
            for index in coll.indexes.values()
            if index.expire_after is not None
        ]
    for coll, index in work:
        with engine.locked("ttl"):
            if coll.dropped or index.name not in coll.indexes:
                continue
            keys = _expired(engine, coll, index, now)
        for start in range(0, len(keys), CHUNK):
            if stopping is not None and stopping.is_set():
                return deleted
            ticket = None
            with engine.locked("ttl"):
                txn = engine.begin(explicit=False)
                try:
                    for key in keys[start : start + CHUNK]:
                        doc = engine.get(txn, coll.ns, key)
                        if doc is None or not _still_expired(index, doc, now):
                            continue
                        try:
                            engine.write(txn, coll, key, None)
                            deleted += 1
                        except EngineError:
                            pass  # held by an open transaction: next pass
                    ticket = engine.commit(txn)
                except BaseException:
                    engine.abort(txn, "ttl pass failed")
                    raise
            if ticket is not None:
                try:
                    engine.wait_durable(ticket)
                except CommitFailed:
                    log.warning("TTL deletes on %s could not be made durable", coll.ns)
                    return deleted
    return deleted


def _still_expired(index: Index, doc: dict[str, Any], now: dt.datetime) -> bool:
    if index.partial is not None and not query.matches(index.partial, doc):
        return False
    instant = _expiry_instant(query.path_values(doc, index.fields[0]))
    cutoff = _cutoff(index, now)
    return instant is not None and cutoff is not None and instant <= cutoff
