"""How the two aggregator twins wait and run in the background (not generated).

The aggregator is written once, async (:mod:`accord.memory.asynchronous.aggregator`), and
its sync twin is generated from it; what must differ between them is here, in pairs the
generator maps by name (``AsyncX`` -> ``X``, as pymongo's ``lock.py`` does for its
primitives):

- the stop signal a worker loop waits on between polls: :class:`AsyncStop` (an
  ``asyncio.Event`` with a bounded wait) and :data:`Stop` (``threading.Event``);
- the background runner: :class:`AsyncRunner` (an asyncio task on the running loop) and
  :class:`Runner` (a daemon thread);
- a lease kept alive while slow work runs: :class:`AsyncHeartbeat` (a task) and
  :class:`Heartbeat` (a daemon thread);
- CPU-bound checks: :class:`AsyncOffload` runs them in a worker thread, so a large input
  never holds the event loop; :class:`Offload` runs them where it is called.

The memory service uses :class:`AsyncOffload` too (its sync twin, :class:`Offload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("accord.memory.aggregator")
T = TypeVar("T")

#: The sync twin's stop signal: ``wait(timeout)`` returns whether it was set.
Stop = threading.Event


class AsyncStop:
    """``threading.Event``'s interface for coroutines: ``await stop.wait(timeout)`` returns
    whether the stop was set (False when the time ran out). Set it from the loop's thread
    (e.g. a handler installed with ``loop.add_signal_handler``)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


class Runner:
    """Runs ``target()`` on a daemon thread of this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, target: Callable[[], Any]) -> None:
        self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for ``target`` to return (a thread cannot be
        interrupted: one still running after that finishes its current work alone)."""
        if self._thread is not None:
            self._thread.join(timeout)


class AsyncRunner:
    """Runs ``await target()`` as a task on the running event loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[Any] | None = None

    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, target: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self._task = asyncio.get_running_loop().create_task(target(), name=self.name)

    async def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for ``target`` to return, then cancel it (what
        it had not committed is redone by the next worker to claim the event)."""
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Offload:
    """Runs a CPU-bound function in the calling thread (the sync twins)."""

    @staticmethod
    def run(fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


class AsyncOffload:
    """Runs a CPU-bound function in a worker thread, so the event loop stays free."""

    @staticmethod
    async def run(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)


class Heartbeat:
    """Calls ``beat()`` every ``interval`` seconds on a daemon thread while the ``with``
    block runs (the sync twin of :class:`AsyncHeartbeat`). ``beat`` returns False when
    there is nothing left to keep alive, which ends the beating; an exception it raises
    is logged and the next beat tries again."""

    def __init__(self, beat: Callable[[], bool], interval: float) -> None:
        self.beat = beat
        self.interval = interval
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beats += 1
                if not self.beat():
                    return
            except Exception as exc:  # the lease may still be held: try again
                log.warning("heartbeat failed (%s); trying again", exc)

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._loop, name="accord-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 10.0)


class AsyncHeartbeat:
    """Awaits ``beat()`` every ``interval`` seconds in a task on the running loop while
    the ``async with`` block runs (see :class:`Heartbeat`)."""

    def __init__(self, beat: Callable[[], Awaitable[bool]], interval: float) -> None:
        self.beat = beat
        self.interval = interval
        self.beats = 0
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.beats += 1
                if not await self.beat():
                    return
            except Exception as exc:  # the lease may still be held: try again
                log.warning("heartbeat failed (%s); trying again", exc)

    async def __aenter__(self) -> AsyncHeartbeat:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="accord-heartbeat")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
