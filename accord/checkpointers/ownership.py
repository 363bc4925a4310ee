"""Who may write a thread: explicit ownership through the run registry.

A LangGraph invocation (``invoke``/``stream``/``ainvoke``/...) is a *run*. Its first
saver call is the ``get_tuple`` its loop makes on entry (``PregelLoop.__enter__`` /
``__aenter__``), before any node runs. There the saver *claims* the thread in the run
registry (:mod:`accord.platform.runs`): it gets a lease and a fencing number, or
:class:`~accord.errors.ConcurrentRunError` when another live run holds the thread, so a
second worker is refused before it runs anything. The run is identified by LangGraph's
``run_id`` when the caller gave one, else by an id minted for this invocation.

Every later call of the run (its ``put``/``put_writes``, in whatever order LangGraph
makes them, in any namespace: subgraphs, forks, replays, re-rooted subgraphs) is
recognised by the run's *anchor*: the ``RunControl`` object LangGraph creates per
top-level invocation and hands to every nested loop and task through the ``Runtime`` in
``config["configurable"]["__pregel_runtime"]``. Those calls commit with the owner guard
(``runs.owner_guard``): refused at commit if the run was fenced out (its lease expired
and another run took the thread). Nothing is added to the configs LangGraph gets back.

The run ends when its loop exits: the saver registers the release on the loop's exit
stack when it claims, so it runs after LangGraph's background saves have finished. A
run that dies simply stops renewing (the saver renews held leases in the background,
since one step can last longer than a lease) and its lease expires.

Calls that belong to no run (``graph.get_state``/``update_state``, a migration, direct
API use) are *ad hoc*: reads are never refused; a write commits with the free guard,
only while no live run holds the thread.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from accord.checkpointers import langgraph_internals, validation
from accord.errors import ConcurrentRunError
from accord.platform.runs import Holder, Lease

#: What to do about a ConcurrentRunError; every message ends with it.
WHAT_TO_DO = (
    "Only one run may write a thread at a time: wait for the other run to finish (or its "
    "lease to expire, if its worker died), reload the thread's latest state "
    "(graph.get_state(config)) and retry, and make sure a single worker runs this thread."
)


def langgraph_run_id(config: Mapping[str, Any] | None) -> str | None:
    """The run id the caller gave LangGraph (``config["run_id"]`` or metadata), if any;
    InvalidInputError when it is no usable identifier (NUL, over 1,024 characters, a
    lone surrogate): it is written to the run registry and named in errors."""
    config = config or {}
    for where, value in (
        ("config['run_id']", config.get("run_id")),
        ("config['metadata']['run_id']", (config.get("metadata") or {}).get("run_id")),
    ):
        if value is not None and str(value):
            return validation.identifier(str(value), where)
    return None


def mint_run_id() -> str:
    # not uuid4(): applications (and LangGraph's tests) may make uuid4 deterministic, and
    # the saver must not consume their sequence
    return f"accord-{secrets.token_hex(16)}"


class Signal:
    """A condition that threads and coroutines can both wait on.

    LangGraph runs sync nodes and background saves in threads, async ones on the event
    loop; the orderings below (a put waiting for task writes, writes waiting for their
    checkpoint) cross both. ``notify`` wakes every waiter; waiters re-check their
    predicate.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._futures: list[tuple[Any, Any]] = []

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()
            futures, self._futures = self._futures, []
        for loop, fut in futures:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, fut)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    async def await_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                if predicate():
                    return True
                fut = loop.create_future()
                self._futures.append((loop, fut))
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, min(left, 0.5))


def _resolve(fut: Any) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(frozen=True)
class FailedTask:
    """A ``put_writes`` of the run that raised: its task is not recorded."""

    task_id: str
    node: str | None
    error: BaseException


class ActiveRun:
    """What this process knows about one run that holds one thread.

    ``saved``: checkpoints of the thread the run committed or loaded, per namespace
    (bounded); ``inflight``: its puts in progress per namespace; ``failed_puts``: why a
    put failed; ``failed_tasks``: tasks whose writes failed, per (namespace, checkpoint):
    the run must not save a checkpoint on top of them. ``lock`` serializes the run's
    commits (they all update the thread's registry document, and concurrent ones would
    only conflict there).
    """

    _SAVED = 4096

    def __init__(self, lease: Lease, anchor: Any, lock: Any) -> None:
        self.lease = lease
        #: held so that ``id(anchor)`` (part of the saver's key for this run) is not reused
        self.anchor = anchor
        self.lock = lock
        self.signal = Signal()
        self.saved: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.inflight: dict[str, int] = {}
        self.failed_puts: dict[tuple[str, str], BaseException] = {}
        self.failed_tasks: dict[tuple[str, str], dict[str, FailedTask]] = {}
        #: tasks of this run that staged business writes not recorded yet
        self.staged = StagedTasks()
        #: LangGraph's loop of each namespace of the run (root and subgraphs), as seen
        #: when it loaded its checkpoint: its current checkpoint is one whose put is due
        self.loops: dict[str, Any] = {}
        #: set when a heartbeat finds the lease taken over: commits fail fast
        self.lost: Holder | None = None
        self.ended = False
        #: saves accepted but not committed yet ("async" durability): puts and task writes
        #: (with their business writes), committed in order by one drainer at a time
        self.jobs: deque[Any] = deque()
        #: (namespace, checkpoint) of the queued puts not committed yet
        self.queued_puts: set[tuple[str, str]] = set()
        #: queued task writes not committed yet, per namespace
        self.writing: dict[str, int] = {}
        #: the run's loop has exited (no more saves come): the drainer may give the lease
        #: back in the transaction of the run's last queued saves
        self.releasing = False
        #: the lease was given back (by that transaction)
        self.released = False
        #: per namespace, the cache entry of the latest queued put (the next put's base)
        self.queued: dict[str, Any] = {}
        self.draining = False
        #: the first failure of a queued put: later puts of the run are refused with it
        self.failure: BaseException | None = None
        #: whether ``failure`` was raised to LangGraph already (else: at the run's end)
        self.surfaced = False
        self._mutex = threading.Lock()

    def enqueue(self, job: Any) -> bool:
        """Queue a save; True when the caller must start a drainer."""
        with self._mutex:
            self.jobs.append(job)
            start = not self.draining
            self.draining = True
        self.signal.notify()  # whoever waits for a save of the run (``_before_its_put``)
        return start

    def next_job(self) -> Any | None:
        """The next queued save, or None (then the drainer stops)."""
        with self._mutex:
            if self.jobs:
                return self.jobs.popleft()
            self.draining = False
        self.signal.notify()
        return None

    def more_jobs(self, fits: Callable[[Any], bool], limit: int) -> list[Any]:
        """Up to ``limit`` more queued saves, in order, while the next one ``fits`` (the
        drainer commits them with the one it holds). ``fits`` is called without the
        mutex held (it may ask this run about its tasks); only the drainer takes jobs,
        so the head it looked at is still the head when it takes it."""
        out: list[Any] = []
        while len(out) < limit:
            with self._mutex:
                head = self.jobs[0] if self.jobs else None
            if head is None or not fits(head):
                break
            with self._mutex:
                out.append(self.jobs.popleft())
        return out

    def queued_count(self) -> int:
        """How many saves are queued (the drainer's batch in hand not counted)."""
        with self._mutex:
            return len(self.jobs)

    def behind_its_put(self, job: Any) -> bool:
        """Put queued task writes ``job`` right after the queued put of its checkpoint (a
        task's writes can reach the queue before that put: the put is handed over in
        another thread). False when that put is not in the queue."""
        ns, checkpoint_id = job.scope.checkpoint_ns, job.checkpoint_id
        with self._mutex:
            for i, queued in enumerate(self.jobs):
                if (
                    getattr(queued, "task_id", None) is None
                    and queued.checkpoint_id == checkpoint_id
                    and queued.scope.checkpoint_ns == ns
                ):
                    self.jobs.insert(i + 1, job)
                    return True
        return False

    def writes_behind_their_puts(self) -> None:
        """Move queued task writes at the head of the queue right behind the queued put of
        their checkpoint, when that put came after them (it is handed over in another
        thread): otherwise the drainer's batch would stop at writes that cannot commit
        before their put, and the put queued behind them would need a transaction of its
        own."""
        with self._mutex:
            lead = 0
            while lead < len(self.jobs) and getattr(self.jobs[lead], "task_id", None) is not None:
                lead += 1
            rest = list(self.jobs)[lead:]
            behind: dict[int, list[Any]] = {}  # index of a put in rest -> writes moved behind it
            stay: list[Any] = []
            for head in list(self.jobs)[:lead]:
                put_at = next(
                    (
                        i
                        for i, queued in enumerate(rest)
                        if getattr(queued, "task_id", None) is None
                        and queued.checkpoint_id == head.checkpoint_id
                        and queued.scope.checkpoint_ns == head.scope.checkpoint_ns
                    ),
                    None,
                )
                if stay or put_at is None:
                    stay.append(head)  # its put is not queued: it, and what follows, stay first
                else:
                    behind.setdefault(put_at, []).append(head)
            if not behind:
                return
            self.jobs.clear()
            self.jobs.extend(stay)
            for i, queued in enumerate(rest):
                self.jobs.append(queued)
                self.jobs.extend(behind.get(i, ()))

    def take_writes(self, ns: str, checkpoint_id: str) -> list[Any]:
        """Take the queued task writes of ``checkpoint_id`` in ``ns``, wherever they are
        in the queue (the drainer commits them before, or with, the put of the next
        checkpoint, which must never commit before its parent's tasks' business writes)."""
        with self._mutex:
            taken = [
                j
                for j in self.jobs
                if getattr(j, "task_id", None) is not None
                and j.checkpoint_id == checkpoint_id
                and j.scope.checkpoint_ns == ns
            ]
            for j in taken:
                self.jobs.remove(j)
        return taken

    def last_batch(self) -> bool:
        """Whether the drainer's batch in hand is the run's last (the loop exited and
        nothing is queued behind it): its transaction may give the lease back."""
        with self._mutex:
            return self.releasing and not self.jobs

    def writes_queued(self, ns: str) -> None:
        with self._mutex:
            self.writing[ns] = self.writing.get(ns, 0) + 1

    def writes_ended(self, ns: str) -> None:
        with self._mutex:
            self.writing[ns] -= 1
            if not self.writing[ns]:
                del self.writing[ns]
        self.signal.notify()

    def writes_pending(self) -> bool:
        """Whether task writes of the run (any namespace) are queued or being committed."""
        with self._mutex:
            return bool(self.writing)

    def put_queued(self, ns: str, checkpoint_id: str) -> bool:
        """Whether the put of ``checkpoint_id`` is queued or being committed."""
        with self._mutex:
            return (ns, checkpoint_id) in self.queued_puts

    def idle(self) -> bool:
        with self._mutex:
            return not self.draining and not self.jobs

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    def mark_saved(self, ns: str, checkpoint_id: str) -> None:
        with self._mutex:
            self.saved[(ns, checkpoint_id)] = None
            self.saved.move_to_end((ns, checkpoint_id))
            while len(self.saved) > self._SAVED:
                self.saved.popitem(last=False)
        self.signal.notify()

    def is_saved(self, ns: str, checkpoint_id: str) -> bool:
        with self._mutex:
            return (ns, checkpoint_id) in self.saved

    def put_started(self, ns: str, checkpoint_id: str | None = None) -> None:
        """A put began (``checkpoint_id``: it is queued, see :meth:`put_queued`)."""
        with self._mutex:
            self.inflight[ns] = self.inflight.get(ns, 0) + 1
            if checkpoint_id is not None:
                self.queued_puts.add((ns, checkpoint_id))
        if checkpoint_id is not None:
            self.signal.notify()  # task writes may wait for their put to be queued

    def put_ended(self, ns: str, checkpoint_id: str, error: BaseException | None) -> None:
        with self._mutex:
            self.inflight[ns] -= 1
            if not self.inflight[ns]:
                del self.inflight[ns]
            self.queued_puts.discard((ns, checkpoint_id))
            if error is not None:
                self.failed_puts[(ns, checkpoint_id)] = error
        if error is None:
            self.mark_saved(ns, checkpoint_id)
        else:
            self.signal.notify()

    def putting(self, ns: str) -> bool:
        with self._mutex:
            return ns in self.inflight

    def settled(self, ns: str | None) -> bool:
        """Whether no save of the run in ``ns`` (None: any namespace) is pending: no put
        in progress and no queued task writes."""
        with self._mutex:
            if ns is None:
                return not self.inflight and not self.writing
            return ns not in self.inflight and ns not in self.writing

    def expects(self, ns: str, checkpoint_id: str) -> bool:
        """Whether the put of ``checkpoint_id`` is due: LangGraph's loop of ``ns`` has
        reached it (it saves every checkpoint it creates, in order, so one it has reached
        and that is not saved yet is queued behind the previous put: "async"
        durability). Checkpoint ids are time-ordered (uuid6)."""
        current = langgraph_internals.current_checkpoint_id(self.loops.get(ns))
        return current is not None and current >= checkpoint_id

    def delta_channels(self, ns: str) -> bool:
        """Whether the graph of ``ns`` has LangGraph DeltaChannels (its loop's channel
        specs): LangGraph then saves a checkpoint only after its tasks' writes."""
        return langgraph_internals.uses_delta_channels(self.loops.get(ns))

    def put_error(self, ns: str, checkpoint_id: str) -> BaseException | None:
        with self._mutex:
            return self.failed_puts.get((ns, checkpoint_id))

    def task_failed(
        self, ns: str, checkpoint_id: str, failed: FailedTask | None, task_id: str
    ) -> None:
        """Record (``failed``) or clear (None: a later attempt succeeded) a task failure."""
        key = (ns, checkpoint_id)
        with self._mutex:
            if failed is not None:
                self.failed_tasks.setdefault(key, {})[task_id] = failed
            elif key in self.failed_tasks:
                self.failed_tasks[key].pop(task_id, None)
                if not self.failed_tasks[key]:
                    del self.failed_tasks[key]

    def failed_task_of(self, ns: str, checkpoint_id: str) -> FailedTask | None:
        with self._mutex:
            tasks = self.failed_tasks.get((ns, checkpoint_id))
            return next(iter(tasks.values())) if tasks else None


class StagedTasks:
    """Tasks that staged business writes not recorded yet, per (tenant, thread,
    checkpoint). A ``put`` of the next checkpoint waits for them: under LangGraph's
    "async" durability the next checkpoint is saved while the previous step's task
    writes are still being committed, and the checkpoint must never commit before the
    business writes of the tasks it says have run."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str, str], set[str]] = {}
        self._mutex = threading.Lock()
        self.signal = Signal()

    def add(self, key: tuple[str, str, str], task_id: str) -> None:
        with self._mutex:
            self._tasks.setdefault(key, set()).add(task_id)

    def done(self, key: tuple[str, str, str], task_id: str) -> None:
        with self._mutex:
            tasks = self._tasks.get(key)
            if tasks is not None:
                tasks.discard(task_id)
                if not tasks:
                    del self._tasks[key]
        self.signal.notify()

    def pending(self, key: tuple[str, str, str]) -> bool:
        with self._mutex:
            return key in self._tasks

    def noted(self, key: tuple[str, str, str], task_id: str) -> bool:
        """Whether task ``task_id`` staged business writes not recorded yet."""
        with self._mutex:
            return task_id in self._tasks.get(key, ())


# --- errors -----------------------------------------------------------------------------


def held_by_another(thread_id: str, holder: Holder, *, at: datetime) -> ConcurrentRunError:
    """A run (or an ad-hoc write) found the thread held by another live run."""
    return ConcurrentRunError(
        f"Thread {thread_id!r} is being run by {holder.describe()}: this run was refused "
        f"before it ran any node, and nothing of it was written. {WHAT_TO_DO}"
    )


def adhoc_refused(thread_id: str, what: str, holder: Holder) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"Thread {thread_id!r} is being run by {holder.describe()}, so this {what} (which "
        f"belongs to no run) was refused and nothing of it was written. {WHAT_TO_DO}"
    )


def call_contended(call: str) -> ConcurrentRunError:
    """A recorded call's record kept changing under the execution that read it."""
    return ConcurrentRunError(
        f"{call}: its record kept appearing and vanishing while this execution read it "
        f"(another execution of the same task is running?); nothing was called. Make sure "
        f"one run at a time executes the thread, and retry."
    )


def fenced_out(thread_id: str, run_id: str, what: str, holder: Holder | None) -> ConcurrentRunError:
    """A run's commit was refused: its lease was taken over (or the thread deleted)."""
    now_holder = f" It is now held by {holder.describe()}." if holder and holder.run_id else ""
    return ConcurrentRunError(
        f"Run {run_id!r} lost thread {thread_id!r}: its lease expired (the worker paused or "
        f"was cut off longer than the lease) and another run took the thread, or the "
        f"thread was deleted, so this {what} was refused and nothing of it was written."
        f"{now_holder} {WHAT_TO_DO}"
    )


def copied_meanwhile(source: str, target: str) -> ConcurrentRunError:
    """``copy_thread``: the source was written while it was copied."""
    return ConcurrentRunError(
        f"copy_thread: thread {source!r} was written while it was copied; the copy "
        f"stopped: thread {target!r} holds part of it. Copy again with resume=True when no "
        f"run writes the source (or delete the target)."
    )
