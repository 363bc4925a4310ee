"""Whether a saver's transactions write outbox events: only when something consumes them.

A checkpointer used alone would otherwise fill its outbox forever (nobody completes the
events, so retention never removes them). A consumer (the memory aggregator) records
itself on the outbox's catalog entry when it sets up (``accord.platform.outbox.CONSUMERS``);
the saver reads that entry at setup and, while it has seen no consumer, again at most
every :data:`RECHECK` seconds before a commit (one indexed read by ``_id``). Once it has
seen one it keeps writing events. ``accord.runtime`` tells the savers it built as soon as
it sets up an aggregator, so in one process no step is missed; a consumer started in
another process is seen within :data:`RECHECK` seconds, and the events of steps committed
before that are not written (docs/checkpointer.md, "The outbox").

``outbox_events=True`` / ``False`` on the saver forces either behaviour.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/outbox_gate.py``
is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from accord.errors import ConfigurationError
from accord.platform import outbox
from accord.platform.artifacts import CATALOG_COLLECTION
from accord.platform.plan import Plan

_IS_SYNC = False

#: Seconds between two reads of the outbox's catalog entry while no consumer was seen.
RECHECK = 5.0


class AsyncOutboxGate:
    """The outbox events of one saver: written, or dropped from its plans."""

    def __init__(self, db: Any, collection: str, mode: bool | None) -> None:
        if mode is not None and not isinstance(mode, bool):
            raise ConfigurationError(
                f"outbox_events must be True, False or None (write them when a consumer "
                f"is registered), got {mode!r}."
            )
        self.db = db
        self.collection = collection
        self.mode = mode
        self._seen = False
        self._next = 0.0

    @property
    def open(self) -> bool:
        """Whether events are written (as last known)."""
        return self.mode if self.mode is not None else self._seen

    def consumer_registered(self) -> None:
        """A consumer of this outbox was set up (told by the composition root)."""
        self._seen = True

    async def refresh(self, *, force: bool = False) -> bool:
        """Whether events are written, reading the catalog if no consumer was seen yet
        and the last read is older than :data:`RECHECK` (or ``force``)."""
        if self.mode is not None or self._seen:
            return self.open
        now = time.monotonic()
        if not force and now < self._next:
            return False
        self._next = now + RECHECK
        entry = await self.db[CATALOG_COLLECTION].find_one(
            {"_id": self.collection}, {outbox.CONSUMERS: 1}
        )
        self._seen = outbox.has_consumers(entry)
        return self._seen

    async def apply(self, plans: Plan | Sequence[Plan]) -> None:
        """Drop the events of ``plans`` unless something consumes them."""
        batch = [plans] if isinstance(plans, Plan) else plans
        if not any(p.events for p in batch) or await self.refresh():
            return
        for plan in batch:
            plan.events = []
