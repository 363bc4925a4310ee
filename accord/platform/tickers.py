"""Calling a function at intervals in the background: a daemon thread (sync code) or a task
on the running event loop (async code). The generated sync twins of async sources pick
:class:`ThreadTicker`, their sources :class:`LoopTicker` (by ``_IS_SYNC``).

A tick that fails is logged (one line; the traceback at DEBUG) and the ticking goes on,
except when the client it uses was closed by the application: then there is nothing left to
keep alive and the ticker stops quietly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from pymongo.errors import InvalidOperation

logger = logging.getLogger("accord.platform")


class ThreadTicker:
    """Calls ``tick()`` every ``interval`` seconds in a daemon thread while ``alive()``."""

    def __init__(
        self,
        tick: Callable[[], Any],
        interval: float,
        alive: Callable[[], bool],
        name: str = "accord-lease",
    ) -> None:
        self._name = name
        self._tick = tick
        self._interval = interval
        self._alive = alive
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()

    def ensure(self) -> None:
        with self._mutex:
            if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name=self._name, daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop ticking now (a later :meth:`ensure` starts again)."""
        with self._mutex:
            self._stop.set()

    def _run(self, stop: threading.Event) -> None:
        while self._alive() and not stop.wait(self._interval):
            try:
                self._tick()
            except Exception as exc:
                if _client_closed(exc):
                    return
                _failed(self._name, exc)


class LoopTicker:
    """Awaits ``tick()`` every ``interval`` seconds in a task on the running loop while
    ``alive()``."""

    def __init__(
        self,
        tick: Callable[[], Any],
        interval: float,
        alive: Callable[[], bool],
        name: str = "accord-lease",
    ) -> None:
        self._name = name
        self._tick = tick
        self._interval = interval
        self._alive = alive
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    def stop(self) -> None:
        """Stop ticking now (from any thread; a later :meth:`ensure` starts again)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            loop = task.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

    async def _run(self) -> None:
        while self._alive():
            await asyncio.sleep(self._interval)
            try:
                await self._tick()
            except Exception as exc:
                if _client_closed(exc):
                    return
                _failed(self._name, exc)


def _client_closed(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is pymongo's refusal of a closed client: the
    application closed the saver's client, so there is no lease left to keep alive (a
    heartbeat that kept trying would log the same traceback forever)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, InvalidOperation) and "after close" in str(seen):
            return True
        seen = seen.__cause__
    return False


def _failed(name: str, exc: BaseException) -> None:
    logger.warning("accord: %s failed (%s: %s); trying again at the next tick", name,
                   type(exc).__name__, exc)  # fmt: skip
    logger.debug("%s failed", name, exc_info=True)
