"""Giving leases back when the process ends.

A run holds its thread with a lease. A process that dies without giving it back leaves
the thread held until the lease expires (or, on the same machine, until the next claimer
sees the holder is dead: :mod:`accord.platform.hosts`). So a process that ends *normally*
gives its leases back:

* at interpreter exit (``atexit``), every sync runs service still holding leases releases
  them (async services cannot run once their event loop is gone; their runs are released
  by the loop's own exits, below);
* SIGTERM (a Kubernetes rolling restart, ``docker stop``, systemd) is turned into
  ``SystemExit(143)`` in the main thread, as Python does for SIGINT with
  ``KeyboardInterrupt``: LangGraph's loop exits, ``finally`` blocks and ``async with``
  exits run and release their runs, then ``atexit``. This is installed only when the
  process has no SIGTERM handler of its own (the default action) and only from the main
  thread; ``ACCORD_HANDLE_SIGTERM=0`` turns it off.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import signal
import threading
import weakref
from typing import Any

logger = logging.getLogger("accord.platform")

SIGTERM_ENV = "ACCORD_HANDLE_SIGTERM"

_services: weakref.WeakSet[Any] = weakref.WeakSet()
_mutex = threading.Lock()
_installed = False


def watch(service: Any) -> None:
    """Release ``service``'s held leases at exit (``service.release_all()``, sync only)."""
    global _installed
    with _mutex:
        _services.add(service)
        if _installed:
            return
        _installed = True
    atexit.register(_release_at_exit)
    _handle_sigterm()


def _handle_sigterm() -> None:
    if os.environ.get(SIGTERM_ENV, "1") == "0":
        return
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the application handles SIGTERM itself
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter / no signals here
        return


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process
    logger.info("accord: SIGTERM: exiting, giving back the threads this process holds")
    raise SystemExit(128 + signum)


def _release_at_exit() -> None:
    with _mutex:
        services = list(_services)
    for service in services:
        release_all = getattr(service, "release_all", None)
        if release_all is None or _is_async(release_all):
            continue
        try:
            count = release_all()
        except Exception as exc:  # exiting anyway: the leases expire by themselves
            logger.warning("accord: could not release leases at exit: %s", exc)
            continue
        if count:
            logger.info("accord: released %d lease(s) at exit", count)


def _is_async(function: Any) -> bool:

    return inspect.iscoroutinefunction(function)
