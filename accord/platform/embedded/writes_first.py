"""Writes first: a long read steps aside while a write the server's loop runs is in flight.

Every thread of the engine's process shares Python's interpreter lock (the GIL). A write
that the event loop runs (an ``insert`` from arrival to reply) hands that lock back and
forth many times: after ``select``, around the engine lock, around each SQLite call and
the fsync, before its reply. Each time a heavy read's thread may take it, and on a busy
machine that thread is then often not running (the kernel gave its core to another
process), so the write waits until it is scheduled again: tens of milliseconds per
hand-over, several per write. The engine lock alone cannot prevent that: most of a read's
work is done without it.

So the loop marks a write in flight (``started`` ... ``ended``) and a read, at its pause
points (between slices of its collecting, with the engine lock released) and every few
documents of the work it does without the lock, waits (``give_way``) until no write is in
flight, for at most ``MAX_WAIT_S``: it then blocks instead of wanting the interpreter
lock, and the write runs alone. A read waits at most ``SHARE`` of every ``WINDOW_S``, so
under a constant stream of writes it still runs the rest of the time and always finishes.

One gate per process, not per engine: the interpreter lock is per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Longest a read waits for the writes in flight at one of its pause points.
MAX_WAIT_S = 0.02
# A read waits at most this share of each window of this length, so under a constant
# stream of writes it still runs at least the rest of the time.
WINDOW_S = 0.1
SHARE = 0.8
# Released work (encoding, stages) looks at the gate every this many documents.
CHECK_EVERY = 32

_lock = threading.Lock()
_in_flight = 0
_calm = threading.Event()
_calm.set()
_local = threading.local()
_stats = {"waits": 0, "waitedMillis": 0.0, "timeouts": 0}


def started() -> None:
    """A write began (the loop calls this before running it)."""
    global _in_flight
    with _lock:
        _in_flight += 1
        if _in_flight == 1:
            _calm.clear()


def ended() -> None:
    """A write ``started`` has been answered (or dropped, or handed to a worker)."""
    global _in_flight
    with _lock:
        _in_flight -= 1
        if _in_flight <= 0:
            _in_flight = 0
            _calm.set()


def in_flight() -> bool:
    """Whether a write is in flight (a read that holds the engine lock then pauses at
    once rather than at the end of its slice)."""
    return _in_flight > 0


def give_way() -> None:
    """Wait until no write is in flight, for at most ``MAX_WAIT_S`` and only while this
    thread has waited less than ``SHARE`` of the current ``WINDOW_S``; at once when no
    write is in flight. Never call it holding the engine lock (the write may need it)."""
    if not _in_flight:
        return
    now = time.perf_counter()
    local = _local
    start = getattr(local, "window", 0.0)
    if now - start >= WINDOW_S:
        local.window, local.waited = now, 0.0
    budget = WINDOW_S * SHARE - local.waited
    if budget <= 0:
        return  # it waited its share of this window: it runs, writes or not
    calm = _calm.wait(min(MAX_WAIT_S, budget))
    waited = time.perf_counter() - now
    local.waited += waited
    _stats["waits"] += 1
    _stats["waitedMillis"] += waited * 1000
    if not calm:
        _stats["timeouts"] += 1


@contextmanager
def unlocked() -> Iterator[None]:
    """Mark the block as run by this thread without the engine lock (``Engine.released``),
    so that ``step_aside`` in it may wait."""
    before = getattr(_local, "unlocked", False)
    _local.unlocked = True
    try:
        yield
    finally:
        _local.unlocked = before


def step_aside() -> None:
    """``give_way`` if this thread runs an ``unlocked`` block, else nothing: for work
    that runs with the engine lock released in a read and held elsewhere (encoding
    results, pipeline stages)."""
    if _in_flight and getattr(_local, "unlocked", False):
        give_way()


def stats() -> dict[str, float]:
    """How often reads waited for writes, for how long in all, and how often the wait
    ended at ``MAX_WAIT_S`` (``serverStatus().accordEngine.writesFirst``)."""
    return {**_stats, "waitedMillis": round(_stats["waitedMillis"], 1)}
