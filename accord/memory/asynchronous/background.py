"""The aggregator in the background of an application's process: a thread for the sync
aggregator, a task on the running event loop for the async one (``Accord.background_aggregator()``).

This module is the async source; its sync twin ``accord/memory/synchronous/background.py`` is
generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from accord.memory.aggregation import (
    Outcome,
)
from accord.memory.asynchronous.aggregator import AsyncAggregator
from accord.memory.running import AsyncRunner, AsyncStop

log = logging.getLogger("accord.memory.aggregator")

_IS_SYNC = False


class AsyncBackgroundAggregator:
    """An aggregator running in the background of this process (embedded use, tests, the
    demo): a task on the event loop here, a daemon thread in the sync twin.

    ``async with AsyncBackgroundAggregator(aggregator): ...`` starts it and stops it on
    exit; ``wait_idle()`` waits until no event is available (handy in tests and
    notebooks). ``outcomes`` keeps the last 1,000 outcomes.
    """

    def __init__(self, aggregator: AsyncAggregator) -> None:
        self.aggregator = aggregator
        self._stop = AsyncStop()
        self._runner = AsyncRunner(f"accord-aggregator-{aggregator.worker_id}")
        self.processed = 0
        self.outcomes: list[Outcome] = []

    def start(self) -> AsyncBackgroundAggregator:
        """Start it (nothing happens if it runs already)."""
        if not self._runner.running():
            self._stop.clear()
            self._runner.start(self._run)
        return self

    async def _run(self) -> None:
        def seen(outcome: Outcome) -> None:
            self.outcomes.append(outcome)
            del self.outcomes[:-1000]

        # run() survives every error of an event or a claim; what could still end it (a bug)
        # is logged, and the runner starts over after a pause.
        while not self._stop.is_set():
            try:
                self.processed += await self.aggregator.run(self._stop, on_outcome=seen)
            except Exception as exc:
                log.error("the background aggregator failed (%s: %s); restarting in 1 s",
                          type(exc).__name__, exc)  # fmt: skip
                log.debug("background aggregator failure", exc_info=True)
                await self._stop.wait(1.0)

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask it to stop after the current event and wait up to ``timeout`` seconds."""
        self._stop.set()
        await self._runner.join(timeout)

    async def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no event is pending or claimed (dead ones aside); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = await self.aggregator.stats(window=1)
            if stats.backlog == 0:
                return True
            await asyncio.sleep(0.05)
        return False

    async def __aenter__(self) -> AsyncBackgroundAggregator:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
