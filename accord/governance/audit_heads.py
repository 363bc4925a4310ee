"""The audit hook's cache of stream heads: a seal without a read.

Reading a stream's head inside the transaction costs one round trip per transaction.
Within one process the head is usually known already: this process wrote it last. So
:class:`HeadCache` remembers, per (database, stream), the head this process's last seal
left, and the seal uses it without reading; the head update then becomes a
compare-and-set (its filter names the ``seq`` and ``hash`` the records were chained
from) with a guard whose error is :class:`~accord.platform.hooks.SealConflict`. When the
cache was wrong (another process advanced the stream, or the transaction that advanced it
aborted) the update matches nothing, the attempt is retried, and a retried attempt always
reads the heads. So the cache decides only how many round trips a seal costs, never what
it writes: a record is chained from the head that the transaction's own snapshot holds,
or the transaction does not commit.

The kernel may call ``seal`` once before the transaction to learn whether a single-op
plan needs one (``UnitOfWork._seals``) and again in attempt 1: both are the same
transaction id, so the second uses the head the first started from (:meth:`HeadCache.base`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["HeadCache"]

Key = tuple[str, str]  # (database, stream)
Head = tuple[int, str]  # (seq, hash)


@dataclass(frozen=True)
class _Entry:
    """What the last seal of a stream in this process did: chained from ``base``, left
    ``head``, in transaction ``txn`` (whose commit is assumed until a guard says not)."""

    txn: str
    base: Head
    head: Head


class HeadCache:
    """Heads this process's seals left (module docstring), at most ``size`` streams
    (least recently sealed dropped first: a dropped stream is read again)."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._asked: dict[tuple[str, int], set[Key]] = {}
        self._lock = threading.Lock()

    def to_read(self, txn: str, attempt: int, keys: Iterable[Key]) -> set[Key]:
        """The heads attempt ``attempt`` of ``txn`` must read: all of them on a retry,
        else those this process has not sealed."""
        with self._lock:
            wanted = set(keys) if attempt > 1 else {k for k in keys if k not in self._entries}
            if len(self._asked) > 10_000:  # attempts whose seal never ran (a failed read)
                self._asked.clear()
            self._asked[txn, attempt] = wanted
            return wanted

    def unknown(self, keys: Iterable[Key]) -> set[Key]:
        """The heads of ``keys`` this process has not sealed (what a first attempt reads),
        without noting an attempt."""
        with self._lock:
            return {k for k in keys if k not in self._entries}

    def read_for(self, txn: str, attempt: int) -> set[Key]:
        """The heads :meth:`to_read` chose for this attempt (none: a seal called without
        its reads, the kernel's probe of a single-op plan, which asks only when every
        head is cached)."""
        with self._lock:
            return self._asked.pop((txn, attempt), set())

    def base(self, txn: str, key: Key) -> Head | None:
        """The head to chain ``key`` from without reading, or None when unknown."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return None
        return entry.base if entry.txn == txn else entry.head

    def sealed(self, txn: str, key: Key, base: Head, head: Head) -> None:
        """``txn`` chained ``key`` from ``base`` to ``head``."""
        with self._lock:
            self._entries[key] = _Entry(txn, base, head)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def forget(self) -> None:
        """Drop every cached head (the next seals read)."""
        with self._lock:
            self._entries.clear()
