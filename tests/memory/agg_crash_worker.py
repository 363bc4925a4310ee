"""A memory aggregator worker that SIGKILLs itself at a chosen point (the crash suite's
child process; see test_aggregator_crash.py).

``ACCORD_KILL_AT`` names the point, ``ACCORD_KILL_NTH`` the occurrence to die at:

- ``claim``, ``extract``, ``embed``, ``commit``: the aggregator's stages (``on_stage``),
  after the claim committed, before the extractor runs, before texts are embedded, before
  the commit's plan is executed;
- ``txn-write``: inside the commit transaction, when its ``bulkWrite`` is sent (the
  memories, history, heads and completion written but not committed);
- ``txn-commit``: when its ``commitTransaction`` is sent;
- ``txn-after``: after ``commitTransaction`` succeeded, before the worker records it.

``ACCORD_AGG_FLAVOR`` is ``sync`` (``Aggregator`` on ``MongoClient``, the default) or
``async`` (``AsyncAggregator`` on ``AsyncMongoClient`` under ``asyncio.run``; its sync
extractor runs in a worker thread, as the async aggregator runs any extractor without
``aextract``).

Only events claimed at most twice are killed at, so every good event is eventually
aggregated within ``max_attempts``; events whose text holds ``POISON`` make the extractor
fail every time (they must be dead-lettered).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from pymongo import AsyncMongoClient, MongoClient, monitoring

from accord.memory.aggregator import Aggregator, AggregatorConfig, AsyncAggregator
from accord.memory.extraction import Change, Conversation, Recall, RuleExtractor

STAGES = ("claim", "extract", "embed", "commit")
TXN_POINTS = ("txn-write", "txn-commit", "txn-after")
KILL_POINTS = STAGES + TXN_POINTS
MAX_KILLED_ATTEMPT = 2
LEASE = 3.0
MAX_ATTEMPTS = 5
DIMS = 256


class PoisonAware:
    """The rule extractor, except that a conversation saying POISON fails it."""

    name = "rules"

    def __init__(self) -> None:
        self.inner = RuleExtractor()

    def extract(self, conversation: Conversation, recall: Recall) -> list[Change]:
        if any(t.text and "POISON" in t.text for t in conversation.turns):
            raise RuntimeError("POISON: this conversation always fails extraction")
        return self.inner.extract(conversation, recall)


class Killer(monitoring.CommandListener):
    def __init__(self, point: str, nth: int) -> None:
        self.point, self.nth, self.seen = point, nth, 0
        self.armed = False  # inside a commit of an event we may kill at

    def hit(self) -> None:
        self.seen += 1
        if self.seen >= self.nth:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def on_stage(self, stage: str, event: Any) -> None:
        self.armed = stage == "commit" and event.attempts <= MAX_KILLED_ATTEMPT
        if stage == self.point and event.attempts <= MAX_KILLED_ATTEMPT:
            self.hit()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.armed:
            return
        if (
            self.point == "txn-write" and event.command_name in ("bulkWrite", "update", "insert")
        ) or (self.point == "txn-commit" and event.command_name == "commitTransaction"):
            self.hit()

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if self.armed and event.command_name in ("commitTransaction", "abortTransaction"):
            if self.point == "txn-after" and event.command_name == "commitTransaction":
                self.hit()
            self.armed = False  # the next transaction is the next claim's

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        if event.command_name in ("commitTransaction", "abortTransaction"):
            self.armed = False


def main() -> int:
    uri, db = sys.argv[1], sys.argv[2]
    point = os.environ.get("ACCORD_KILL_AT", "")
    killer = Killer(point, int(os.environ.get("ACCORD_KILL_NTH", "1")))
    listeners = [killer] if point else []
    options: dict[str, Any] = {
        "dims": DIMS,
        "extractor": PoisonAware(),
        "config": AggregatorConfig(
            db_name=db,
            lease=LEASE,
            max_attempts=MAX_ATTEMPTS,
            poll_interval=0.05,
            failing_for=0,  # POISON events go dead after max_attempts, not minutes later
        ),
        "on_stage": killer.on_stage if point else None,
    }
    if os.environ.get("ACCORD_AGG_FLAVOR", "sync") == "async":

        async def run() -> None:
            aclient: AsyncMongoClient[Any] = AsyncMongoClient(uri, event_listeners=listeners)
            agg = AsyncAggregator(aclient, **options)
            print("ready", flush=True)
            await agg.run()  # until the parent stops it

        asyncio.run(run())
        return 0
    client: MongoClient[Any] = MongoClient(uri, event_listeners=listeners)
    agg = Aggregator(client, **options)
    print("ready", flush=True)
    agg.run()  # until the parent stops it
    return 0


if __name__ == "__main__":
    sys.exit(main())
