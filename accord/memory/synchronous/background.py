# Generated from accord/memory/asynchronous/background.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The aggregator in the background of an application's process: a thread for the sync
aggregator, a task on the running event loop for the async one (``Accord.background_aggregator()``).

Generated from ``accord/memory/asynchronous/background.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
import time

from accord.memory.aggregation import (
    Outcome,
)
from accord.memory.running import Runner, Stop
from accord.memory.synchronous.aggregator import Aggregator

log = logging.getLogger("accord.memory.aggregator")

_IS_SYNC = True


class BackgroundAggregator:
    """An aggregator running in the background of this process (embedded use, tests, the
    demo): a task on the event loop here, a daemon thread in the sync twin.

    ``async with BackgroundAggregator(aggregator): ...`` starts it and stops it on
    exit; ``wait_idle()`` waits until no event is available (handy in tests and
    notebooks). ``outcomes`` keeps the last 1,000 outcomes.
    """

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self._stop = Stop()
        self._runner = Runner(f"accord-aggregator-{aggregator.worker_id}")
        self.processed = 0
        self.outcomes: list[Outcome] = []

    def start(self) -> BackgroundAggregator:
        """Start it (nothing happens if it runs already)."""
        if not self._runner.running():
            self._stop.clear()
            self._runner.start(self._run)
        return self

    def _run(self) -> None:
        def seen(outcome: Outcome) -> None:
            self.outcomes.append(outcome)
            del self.outcomes[:-1000]

        # run() survives every error of an event or a claim; what could still end it (a bug)
        # is logged, and the runner starts over after a pause.
        while not self._stop.is_set():
            try:
                self.processed += self.aggregator.run(self._stop, on_outcome=seen)
            except Exception as exc:
                log.error("the background aggregator failed (%s: %s); restarting in 1 s",
                          type(exc).__name__, exc)  # fmt: skip
                log.debug("background aggregator failure", exc_info=True)
                self._stop.wait(1.0)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask it to stop after the current event and wait up to ``timeout`` seconds."""
        self._stop.set()
        self._runner.join(timeout)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no event is pending or claimed (dead ones aside); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.aggregator.stats(window=1)
            if stats.backlog == 0:
                return True
            time.sleep(0.05)
        return False

    def __enter__(self) -> BackgroundAggregator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
