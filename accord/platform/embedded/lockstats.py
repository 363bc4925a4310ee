"""How long the engine lock is held: the longest hold, and a histogram.

The engine lock serialises commands; a long hold is a stall for every other client, so
the engine measures it (``serverStatus().accordEngine.lock``, and the lock-hold
benchmark). A condition wait, a read's pause and a read's released stretch give the lock
up: ``suspend`` ends the hold and hands the count of nested holds back, ``restore`` starts
the next hold with it. Only the lock's owner calls these methods; ``owner`` names it.

Each hold is measured in wall time and in the holding thread's CPU time: on a busy
machine a hold can be long because the process was not scheduled, which the CPU time
tells apart from work done under the lock.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

BUCKETS_MS = (1, 5, 10, 50, 100, 1000)


class LockStats:
    def __init__(self) -> None:
        self._depth = 0
        # The thread holding the lock (0: none), so code can tell that it holds it.
        self.owner = 0
        self._start = 0.0
        self._cpu_start = 0.0
        self._what = ""
        self.reset()

    def reset(self) -> None:
        self.max_ms = 0.0
        self.max_what = ""
        self.max_cpu_ms = 0.0
        self.max_cpu_what = ""
        self.holds = 0
        self.total_ms = 0.0
        self.histogram = [0] * (len(BUCKETS_MS) + 1)
        # The longest hold of each kind (command name, "gc", "commit", "ttl" ...), so a
        # garbage-collection pass can be told apart from a long query: kind -> [wall, CPU].
        self.by_kind: dict[str, list[float]] = {}

    def enter(self, what: str = "") -> int:
        self._depth += 1
        if self._depth == 1:
            self.owner = threading.get_ident()
            self._start = time.perf_counter()
            self._cpu_start = time.thread_time()
            self._what = what
        return self._depth

    def exit(self, token: int, what: str = "") -> None:
        if what and token == 1:
            self._what = what
        self._depth -= 1
        if self._depth == 0:
            self.owner = 0
            self._record(time.perf_counter() - self._start, time.thread_time() - self._cpu_start)

    def suspend(self) -> int:
        """The owner is about to give the lock up (all its nested holds): end the current
        hold and return how deep it was held, for ``restore``. Whoever takes the lock
        meanwhile starts its own holds from depth 0 (before, it found the depth of the
        thread that gave the lock up: its holds went unrecorded and a read could not
        pause, since pausing needs a depth of 1)."""
        depth = self._depth
        if depth:
            self._record(time.perf_counter() - self._start, time.thread_time() - self._cpu_start)
        self._depth = 0
        self.owner = 0
        return depth

    def restore(self, depth: int) -> None:
        """The thread that called ``suspend`` holds the lock again, ``depth`` deep."""
        self._depth = depth
        if depth:
            self.owner = threading.get_ident()
            self._start = time.perf_counter()
            self._cpu_start = time.thread_time()

    @property
    def depth(self) -> int:
        """How many times the owner holds the lock (0: not held)."""
        return self._depth

    def held_seconds(self) -> float:
        """How long the current hold has lasted (0 when the lock is not held)."""
        return time.perf_counter() - self._start if self._depth else 0.0

    def note(self, what: str) -> None:
        """Name the current hold (shown with the longest one)."""
        self._what = what

    def _record(self, seconds: float, cpu_seconds: float) -> None:
        # Every outer hold passes here (two per autocommitted write): plain comparisons.
        ms = seconds * 1000.0
        cpu_ms = cpu_seconds * 1000.0
        what = self._what
        self.holds += 1
        self.total_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms
            self.max_what = what
        if cpu_ms > self.max_cpu_ms:
            self.max_cpu_ms = cpu_ms
            self.max_cpu_what = what
        longest = self.by_kind.get(what or "other")
        if longest is None:
            longest = self.by_kind[what or "other"] = [0.0, 0.0]
        if ms > longest[0]:
            longest[0] = ms
        if cpu_ms > longest[1]:
            longest[1] = cpu_ms
        self.histogram[bisect.bisect_left(BUCKETS_MS, ms)] += 1

    def report(self) -> dict[str, Any]:
        labels = [f"le{b}ms" for b in BUCKETS_MS] + [f"gt{BUCKETS_MS[-1]}ms"]
        return {
            "holds": self.holds,
            "maxHoldMillis": round(self.max_ms, 3),
            "maxHoldBy": self.max_what,
            "maxHoldCpuMillis": round(self.max_cpu_ms, 3),
            "maxHoldCpuBy": self.max_cpu_what,
            "totalHeldMillis": round(self.total_ms, 1),
            "histogram": dict(zip(labels, self.histogram, strict=True)),
            "maxHoldByKind": {
                kind: {"wallMillis": round(wall, 3), "cpuMillis": round(cpu, 3)}
                for kind, (wall, cpu) in sorted(self.by_kind.items())
            },
        }
