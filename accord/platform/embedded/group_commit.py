"""Group commit: many waiting commits, one SQLite transaction, one fsync.

A commit is installed in memory under the engine lock (invisible to readers) and
``submit``ted here, in timestamp order. Outside the engine lock, its caller writes the
queue itself if no write is in progress (``wait``, ``on_durable``), or queues first and
writes later (``on_durable(write=False)``, then ``write_queued``: the server's event
loop, once per round, which leaves a write that would not be quick to the writer
thread); the writer thread also takes what queued during a write as soon as it ends. A
write puts every queued batch in one SQLite transaction with one fsync and then, under
the engine lock, finalizes them in order (they become visible, observers run). Readers
never wait for any of this: they read at ``engine.visible``.

A commit's caller either ``wait``s for it or registers a callback (``on_durable``) that
the thread finalizing it runs once it is done, outside every lock: the server sends a
write's reply that way, so its event loop goes back to reading sockets instead of
waiting for the commit.

If a write fails (disk full, I/O error), nothing of that batch is on disk; every commit
not yet durable (that batch, and everything queued behind it, whose uniqueness checks
may have relied on it) is rolled back in memory, newest first, and each waiter gets
``CommitFailed`` naming the cause. No further batch is written until that is done, so
memory and disk never disagree. The engine serves again as soon as a write succeeds.

``flush`` (lock held) writes and finalizes everything queued in the calling thread:
catalog changes use it so they reach disk in order with the commits before them.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accord.platform.embedded.errors import Code, EngineError
from accord.platform.embedded.storage import COMPACT_ROWS, CommitBatch

if TYPE_CHECKING:
    from accord.platform.embedded.engine import Collection, Engine
    from accord.platform.embedded.versions import Record

log = logging.getLogger("accord.engine")

# ``write_queued`` writes in its caller's thread only a group of at most this many bytes
# of documents, on a disk whose recent writes took at most QUICK_WRITE_S on average.
QUICK_WRITE_BYTES = 256 * 1024
QUICK_WRITE_S = 0.002
# The weight of the newest write in that average.
RECENT_WRITE_WEIGHT = 0.25


class CommitFailed(EngineError):
    """A commit could not be made durable; nothing of it was applied."""

    def __init__(self, cause: BaseException) -> None:
        if _disk_full(cause):
            code = Code.OutOfDiskSpace
            msg = (
                f"the commit could not be made durable because the disk is full ({cause}); "
                "nothing was applied: free space on the data directory's disk and retry"
            )
        else:
            code = Code.InternalError
            msg = (
                f"the commit could not be made durable ({type(cause).__name__}: {cause}); "
                "nothing was applied: check the data directory's disk and retry"
            )
        super().__init__(code, msg)
        self.cause = cause


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return False


@dataclass(eq=False)
class PendingCommit:
    """One commit on its way to disk, and what undoing it in memory takes."""

    ts: int
    batch: CommitBatch
    # (collection, record, created) per installed version, in install order.
    undo: list[tuple[Collection, Record, bool]] = field(default_factory=list)
    # (collection, key, old BSON, new BSON) for commit observers.
    changes: list[tuple[Collection, bytes, bytes | None, bytes | None]] = field(
        default_factory=list
    )
    # Collections whose creation this commit makes durable.
    created: list[Collection] = field(default_factory=list)
    # Session bookkeeping to undo if the commit fails (set by the dispatcher).
    on_failure: list[Callable[[], None]] = field(default_factory=list)
    state: str = "queued"  # queued | written | done | failed
    error: CommitFailed | None = None
    # Run by the thread that finalizes it, outside every lock, once done or failed.
    callbacks: list[Callable[[], None]] = field(default_factory=list)

    def forget(self) -> None:
        """Drop what only an undo needed (and the callbacks' reference cycles)."""
        self.undo, self.changes, self.created, self.on_failure = [], [], [], []
        self.batch = CommitBatch(ts=self.batch.ts)


class GroupCommitter:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        lock = threading.Lock()
        # Commits' waiters (and flush, compact) wait on _cv; the writer thread on _work.
        self._cv = threading.Condition(lock)
        self._work = threading.Condition(lock)
        self._queue: list[PendingCommit] = []
        self._queued_bytes = 0  # of the documents in _queue
        self._recent_write_s = 0.0  # moving average of a write's duration
        self._written: list[PendingCommit] = []
        # Done or failed commits whose callbacks the writer thread has yet to run.
        self._due: list[PendingCommit] = []
        self._writing = False
        # The writer role is held by storage upkeep (``_as_writer``), not by commits.
        self._upkeep = False
        self._broken = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stats = {"batches": 0, "commits": 0, "largestBatch": 0, "failedBatches": 0,
                       "writeMillis": 0.0}  # fmt: skip

    def pending(self) -> bool:
        """Whether commits are on their way to visibility (storage upkeep holding the
        writer role is not one: nothing becomes visible when it ends)."""
        with self._cv:
            return bool(self._queue or self._written or (self._writing and not self._upkeep))

    def submit(self, item: PendingCommit) -> None:
        """Queue an installed commit (engine lock held, so queue order is ts order)."""
        size = sum(len(data) for _, _, data in item.batch.puts)
        with self._cv:
            self._queue.append(item)
            self._queued_bytes += size
            # Its caller writes it (``wait``, ``on_durable``) unless a write is in progress;
            # then the writer thread takes it when that write ends.

    def wait(self, item: PendingCommit) -> None:
        """Return once ``item`` is durable and visible (engine lock NOT held); raise
        ``CommitFailed`` if it was rolled back."""
        self._write_if_idle()
        with self._cv:
            while item.state not in ("done", "failed"):
                self._cv.wait()
        if item.state == "failed":
            assert item.error is not None
            raise item.error

    def on_durable(
        self, item: PendingCommit, callback: Callable[[], None], *, write: bool = True
    ) -> bool:
        """Have ``callback`` run (outside every lock) once ``item`` is done or failed;
        False if it already is (the caller runs it then). With ``write``, this thread
        writes the queue if no write is in progress; without, the caller ``kick``s the
        writer thread later (once it has queued what else it has). Engine lock NOT held."""
        with self._cv:
            if item.state in ("done", "failed"):
                return False
            item.callbacks.append(callback)
        if write:
            self._write_if_idle()
        return True

    def write_queued(self) -> None:
        """Have what is queued written, unless a write in progress takes it when it ends:
        in this thread (with the callbacks due) when that is quick, a group of at most
        ``QUICK_WRITE_BYTES`` on a disk whose recent writes took at most
        ``QUICK_WRITE_S``; else by the writer thread (``kick``), so a slow write never
        holds up a caller that serves others (the server's event loop, once per round,
        so its connections' commits form one group). Engine lock NOT held."""
        self._write_if_idle(quick_only=True)

    def kick(self) -> None:
        """Have the writer thread write what is queued, unless a write in progress will
        take it when it ends: for a caller that must not write itself and waits for a
        commit the server's event loop queued but has not written yet (its round writes
        that at the end). Any lock but the committer's own may be held."""
        with self._cv:
            if self._queue and not self._writing and not self._broken:
                self._wake_writer()

    def _write_if_idle(self, quick_only: bool = False) -> None:
        """With no write in progress, write and finalize the queue in this thread and run
        the callbacks due: the writer thread's step, which a commit's own caller takes
        too, so a lone commit costs no hand-over to that thread. ``quick_only``: a write
        that would not be quick is left to the writer thread."""
        with self._cv:
            if self._writing or self._broken or not self._queue:
                return
            if quick_only and (
                self._queued_bytes > QUICK_WRITE_BYTES or self._recent_write_s > QUICK_WRITE_S
            ):
                self._wake_writer()
                return
            batch, self._queue = self._queue, []
            self._queued_bytes = 0
            self._writing = True
        self._write(batch)
        with self.engine.locked("commit"):
            self._finalize()
        self._run_due()

    def close(self) -> None:
        """Let the writer thread end once its current work is done (the caller may hold
        the engine lock, which that work can need: this does not wait for it)."""
        with self._cv:
            self._closed = True
            self._work.notify()

    def _run(self) -> None:
        """The writer thread: run the callbacks of what was finalized (their replies let
        clients go on), then write and finalize the group queued meanwhile."""
        while True:
            with self._cv:
                while not self._due and (self._writing or self._broken or not self._queue):
                    if self._closed:
                        return
                    self._work.wait()
            self._run_due()
            self._write_if_idle()

    def _run_due(self) -> None:
        """Run the callbacks of finalized commits (no lock held)."""
        with self._cv:
            due, self._due = self._due, []
        for item in due:
            callbacks, item.callbacks = item.callbacks, []
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # one connection's reply must not stop the writer
                    log.exception("a commit's completion callback failed")

    def flush(self) -> None:
        """Write and finalize everything queued (engine lock held)."""
        while True:
            with self._cv:
                while self._writing:
                    self._cv.wait()
                if self._queue and not self._broken:
                    batch: list[PendingCommit] | None
                    batch, self._queue = self._queue, []
                    self._queued_bytes = 0
                    self._writing = True
                elif self._written:
                    batch = None
                else:
                    return
            if batch is not None:
                self._write(batch)
            self._finalize(by_writer=False)

    def compact(self, rows: int = COMPACT_ROWS) -> int:
        """Move a slice of the storage's journal into its tables (``Storage.compact``) as
        the writer, so nothing else writes meanwhile; commits that arrive queue and form
        the next group. Returns the journal rows moved. Engine lock NOT held."""
        with self._as_writer():
            return self.engine.storage.compact(rows)

    def vacuum(self) -> tuple[int, int]:
        """Rebuild the storage's files with nothing deleted left in them
        (``Storage.vacuum``: the ``compact`` command) as the writer; commits that arrive
        meanwhile queue and form the next group. Returns the files' bytes (before, after).
        The engine lock may be held (the writer's work never needs it)."""
        with self._as_writer():
            return self.engine.storage.vacuum()

    def checkpoint(self) -> tuple[int, int]:
        """Copy the storage's WAL into its database file so that its next write starts
        the WAL over (``Storage.checkpoint``); returns SQLite's (frames, copied) of the
        last copy.

        The copy runs alongside commits, and SQLite starts a WAL over only once all of it
        is copied: under steady commits the frames appended during the copy were never
        all copied, and the WAL grew without end (300 MB after a minute of inserts). An
        fsync that extends a file costs ext4 more than one that rewrites it (3,000
        single-row SQLite commits/s instead of 5,000 here). So what was written while the first copy ran is copied
        again as the writer, which holds commits back for that short copy only (the
        first copy's own count cannot tell: it counts the frames as of its start).
        Engine lock NOT held."""
        result = self.engine.storage.checkpoint()
        if result != (0, 0):
            with self._as_writer():
                rest = self.engine.storage.checkpoint()
            if rest != (0, 0):
                result = rest
        return result

    @contextmanager
    def _as_writer(self) -> Iterator[None]:
        """Hold the writer role for storage work that is not a group of commits; commits
        that arrive meanwhile queue and form the next group."""
        with self._cv:
            while self._writing or self._broken:
                self._cv.wait()
            self._writing = self._upkeep = True
        try:
            yield
        finally:
            with self._cv:
                self._writing = self._upkeep = False
                self._cv.notify_all()
                if self._queue:
                    self._wake_writer()

    def _write(self, batch: list[PendingCommit]) -> None:
        """Write one group (we hold the writer role, not the engine lock)."""
        started = time.perf_counter()
        error: CommitFailed | None = None
        try:
            self.engine.storage.apply([item.batch for item in batch])
        except Exception as exc:
            error = CommitFailed(exc)
        elapsed = time.perf_counter() - started
        with self._cv:
            self._writing = False
            self._recent_write_s += (elapsed - self._recent_write_s) * RECENT_WRITE_WEIGHT
            for item in batch:
                item.state = "written"
                item.error = error
            if error is not None:
                self._broken = True
                self._stats["failedBatches"] += 1
            else:
                self._stats["batches"] += 1
                self._stats["commits"] += len(batch)
                self._stats["largestBatch"] = max(self._stats["largestBatch"], len(batch))
            self._stats["writeMillis"] += elapsed * 1000
            self._written.extend(batch)
            self._cv.notify_all()
            if self._queue:  # a group formed during this write: the writer thread's
                self._wake_writer()

    def _wake_writer(self) -> None:
        """Have the writer thread look for work (``_cv`` held); started on first use."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name="accord-engine-writer", daemon=True
            )
            self._thread.start()
        self._work.notify()

    def _finalize(self, by_writer: bool = True) -> None:
        """Make written commits visible, in order; roll back everything after a failed
        write (engine lock held). ``by_writer``: the caller runs the callbacks due next
        (``_run_due``); otherwise the writer thread is woken for them."""
        with self._cv:
            written, self._written = self._written, []
            failed: list[PendingCommit] = []
            durable: list[PendingCommit] = []
            for i, item in enumerate(written):
                if item.error is not None:
                    failed = written[i:]
                    break
                durable.append(item)
            if failed:
                cause = failed[0].error
                failed += self._queue
                self._queue = []
                self._queued_bytes = 0
        for item in durable:
            self.engine.finalize(item)
        if failed:
            assert cause is not None
            for item in reversed(failed):
                self.engine.rollback(item)
        with self._cv:
            for item in durable:
                item.state = "done"
            for item in failed:
                item.state = "failed"
                item.error = item.error or cause
            for item in durable + failed:
                item.forget()
                if item.callbacks:
                    self._due.append(item)
            if failed:
                self._broken = False
            self._cv.notify_all()
            if self._due and not by_writer:
                self._wake_writer()

    def stats(self) -> dict[str, Any]:
        with self._cv:
            out = dict(self._stats)
        out["writeMillis"] = round(out["writeMillis"], 1)
        out["commitsPerBatch"] = (
            round(out["commits"] / out["batches"], 2) if out["batches"] else 0.0
        )
        return out
