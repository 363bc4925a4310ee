"""``accord worker``: claims queued runs and executes them through the accord checkpointer.

A worker process serves one graph (``--graph module:attribute``: a compiled graph, a
``StateGraph`` builder, or a function that takes the saver and returns a compiled graph).
A function returning a :class:`~accord.checkpointers.bundles.PinnedGraph` pins the runs
to the worker's bundle: a run whose thread is pinned to another bundle (and that no
registered migration leads from) is given back to the queue, the reason recorded, and
not claimed again by this worker for ``BUNDLE_BACKOFF_S``: a worker on its bundle takes
it. It loops:

* every ``poll`` seconds (and whenever one of its runs ends) it applies the timeout
  action of waits whose deadline passed, then claims runs while it has room: at most
  ``concurrency`` at once, at most ``tenant_limit`` of one tenant running in the whole
  fleet (counted in the claim's transaction); the queue hands out
  the highest priority first, the oldest first within a priority; a run whose worker died
  (its lease expired, or its process is gone on this machine) is claimed like a queued one;
* each claimed run executes in a thread of the worker: ``graph.stream`` with the thread
  of the run, the run id as LangGraph's run id (so the checkpointer claims the thread for
  this run: a worker that took the run over moves the thread's fence, and the commits of
  the one it replaced are refused), and
  - its input on its first execution; ``None`` on a later one that finds the thread's
    latest checkpoint written by this run (it continues from there);
  - ``Command(resume=value)`` after a human (or a deadline) resumed it;
  - a fork copies its source thread first and runs from the chosen checkpoint;
* a heartbeat renews the leases of its runs every ``lease / 3`` and sees cancel
  requests; a run whose lease was lost (taken over) is dropped without writing more;
* at the end of a run: ``done`` with the final state values, ``waiting`` when the graph
  stopped in ``interrupt()`` (the run no longer holds a worker: a human resumes it with
  ``accord runs approve|reject|resume``), ``failed`` with the error, ``cancelled``;
* SIGTERM (or SIGINT): no more claims; runs still going after ``grace`` seconds stop at
  their next step and are given back to the queue (another worker continues them from
  their last checkpoint); then the process exits.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph.types import Command

from accord.checkpointers.synchronous.saver import AccordSaver
from accord.errors import (
    BundleMismatch,
    ConcurrentRunError,
    ConfigurationError,
    InvalidInputError,
    LeaseLost,
    NeedsReconciliation,
)
from accord.platform import queued_runs
from accord.platform.synchronous.run_queue import DEFAULT_LEASE_SECONDS, RunQueue

logger = logging.getLogger("accord.worker")

#: How long a run given back because its thread was busy is not claimed again here.
BUSY_BACKOFF_S = 2.0
#: How long a run pinned to another bundle than this worker's is not claimed again here
#: (a worker on its bundle, e.g. the previous release during a rolling deploy, takes it).
BUNDLE_BACKOFF_S = 30.0
#: How many state updates (a chain of bundle migrations) a resumed run looks through for
#: the checkpoint it waited at.
UPDATES_WALKED = 32


def load_graph(name: str) -> Any:
    """The object ``module.path:attribute`` names."""
    queued_runs.check_graph(name)
    module_name, _, attr = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--graph {name}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(f"--graph {name}: {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    return target


def check_graph_name(graph: Any) -> str:
    """A worker's ``graph``: the name runs are submitted with; a graph object there is
    refused saying where it goes (the docs showed ``Worker(graph, ...)`` until 2026-12-07)."""
    if not isinstance(graph, str) and (hasattr(graph, "stream") or hasattr(graph, "compile")):
        raise InvalidInputError(
            "a worker's first argument is the graph's name as runs are submitted with it "
            "('module.path:attribute'); give the graph itself as graph_object="
        )
    return queued_runs.check_graph(graph)


def bind(graph: Any, saver: AccordSaver) -> Any:
    """``graph`` running on ``saver``: a builder is compiled with it, a compiled graph
    copied with it, a function called with it."""
    if hasattr(graph, "compile") and hasattr(graph, "add_node"):
        return graph.compile(checkpointer=saver)
    if hasattr(graph, "copy") and hasattr(graph, "stream") and hasattr(graph, "get_state"):
        return graph.copy(update={"checkpointer": saver})
    if callable(graph):
        return graph(saver)
    raise ConfigurationError(
        f"the graph must be a StateGraph, a compiled graph or a function of the saver; got "
        f"{type(graph).__name__}"
    )


@dataclass
class ActiveRun:
    """A run a worker executes now: its claim and the flags its loop sets."""

    doc: dict[str, Any]
    thread: threading.Thread | None = None
    cancel: bool = False
    lost: bool = False
    stop: bool = False  # shutdown: stop at the next step and give the run back
    renewed: float = field(default_factory=time.monotonic)


def interrupt_value(value: Any) -> Any:
    """An interrupt's value as stored for humans to read (``repr`` when not plain)."""
    try:
        queued_runs.encode(value, None, "interrupt")
        return value
    except InvalidInputError:
        return repr(value)


class Worker:
    """Claims and executes the queued runs of one graph (see the module docstring).

    Args:
        graph: ``module:attribute`` of the graph (the name runs are submitted with).
        client: a ``MongoClient``; the saver and the queue share it and ``uow``.
        uow: the kernel (:func:`accord.runtime.kernel`).
        db: the database of the checkpointer and the queue.
        concurrency: runs executed at once by this worker.
        tenant_limit: runs of one tenant executed at once by the fleet, every worker
            together (None: no limit; give every worker the same limit): each claim
            counts the tenant's running runs in its transaction.
        poll: seconds between looks at the queue when idle.
        grace: seconds SIGTERM lets running runs finish before giving them back.
        lease: the lease of a claimed run (renewed every ``lease / 3``); a run whose
            worker died is claimed again after it expires.
        graph_object: the graph itself (else imported from ``graph``).
        max_attempts: claims of one run without an end before it is failed (a run whose
            execution kills its worker, e.g. by exhausting memory, must not take the
            fleet down one worker after another). Give-backs (shutdown, busy thread,
            other bundle) do not count.
    """

    def __init__(
        self,
        graph: str,
        *,
        client: Any,
        uow: Any,
        db: str = "accord",
        concurrency: int = 4,
        tenant_limit: int | None = None,
        poll: float = 0.5,
        grace: float = 30.0,
        lease: float = DEFAULT_LEASE_SECONDS,
        graph_object: Any = None,
        saver_kwargs: dict[str, Any] | None = None,
        max_attempts: int = 5,
    ) -> None:
        self.graph_name = check_graph_name(graph)
        for name, value in (
            ("concurrency", concurrency),
            ("tenant_limit", tenant_limit),
            ("max_attempts", max_attempts),
        ):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        self.concurrency = concurrency
        self.tenant_limit = tenant_limit
        self.max_attempts = max_attempts
        self.poll = queued_runs.check_seconds(poll, "poll") or 0.5
        self.grace = queued_runs.check_grace(grace)
        self.lease = queued_runs.check_seconds(lease, "lease") or DEFAULT_LEASE_SECONDS
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.saver = AccordSaver(client, db_name=db, uow=uow, **(saver_kwargs or {}))
        self.saver.setup()
        self.queue = RunQueue(uow, db, codec=self.saver.serde)
        self.queue.setup()
        source = graph_object if graph_object is not None else load_graph(self.graph_name)
        self.graph = bind(source, self.saver)
        self._active: dict[str, ActiveRun] = {}
        self._busy: dict[str, float] = {}  # run id -> monotonic time it may be claimed again
        self._mutex = threading.Lock()
        # held across a claim and across a give-back: a run given back while a claim is
        # under way (its skip list read before the run was busy) is not claimed again
        self._claiming = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._ended = threading.Event()  # run() returned: the heartbeat stops
        self.completed = 0

    # --- the loop ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running runs get ``grace`` seconds, then are given back."""
        self._stopping.set()
        self._wake.set()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully (a second one ends it at once)."""

        def handler(signum: int, frame: Any) -> None:
            logger.info("accord worker: signal %d: finishing or giving back runs", signum)
            signal.signal(signum, signal.SIG_DFL)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, *, until_idle: bool = False, max_runs: int | None = None) -> int:
        """Work until stopped (``until_idle``: until the queue has nothing for it and
        nothing runs; ``max_runs``: after that many claims). How many claimed runs it
        handled in this call (finished, waiting, failed or given back)."""
        before = self.completed
        self._ended.clear()
        heart = threading.Thread(target=self._heartbeat, name="accord-worker-heartbeat",
                                 daemon=True)  # fmt: skip
        heart.start()
        claimed = 0
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                with contextlib.suppress(Exception):
                    self.queue.expire_waits()
                # idle only when nothing ran while the queue was asked: a run that ends
                # during a claim refused for its tenant's limit leaves work to claim
                ran = self._running()
                got = False
                while max_runs is None or claimed < max_runs:
                    doc = self._claim_one()
                    if doc is None:
                        break
                    claimed, got = claimed + 1, True
                    self._start(doc)
                if until_idle and not got and not ran:
                    break
                if max_runs is not None and claimed >= max_runs and not self._running():
                    break
                self._wake.wait(self.poll)
        finally:
            self._shutdown()
            self._ended.set()
            heart.join(timeout=5)
        return self.completed - before

    def _running(self) -> int:
        with self._mutex:
            return len(self._active)

    def _claim_one(self) -> dict[str, Any] | None:
        with self._claiming:
            return self._claim_next()

    def _claim_next(self) -> dict[str, Any] | None:
        with self._mutex:
            if len(self._active) >= self.concurrency:
                return None
            per_tenant: dict[str, int] = {}
            for active in self._active.values():
                tenant = active.doc["tenant_id"]
                per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
            now = time.monotonic()
            self._busy = {r: t for r, t in self._busy.items() if t > now}
            skip_runs = sorted(self._busy)
        full = [t for t, n in per_tenant.items() if self.tenant_limit and n >= self.tenant_limit]
        try:
            return self.queue.claim([self.graph_name], self.name, lease_seconds=self.lease,
                                    skip_tenants=full, skip_runs=skip_runs,
                                    tenant_limit=self.tenant_limit)  # fmt: skip
        except Exception as exc:  # the database is away: try again at the next poll
            logger.warning("accord worker: claiming failed (%s); retrying", exc)
            return None

    def _start(self, doc: dict[str, Any]) -> None:
        active = ActiveRun(doc)
        active.thread = threading.Thread(target=self._execute, args=(active,),
                                         name=f"accord-run-{doc['_id']}", daemon=True)  # fmt: skip
        with self._mutex:
            self._active[doc["_id"]] = active
        active.thread.start()

    def _shutdown(self) -> None:
        """Let running runs finish within ``grace``; stop and give back the rest."""
        deadline = time.monotonic() + self.grace
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._mutex:
            left = list(self._active.values())
        for active in left:
            active.stop = True
        for active in left:
            if active.thread is not None:
                active.thread.join(timeout=max(self.lease, 5.0))

    def _heartbeat(self) -> None:
        """Renew the leases of the runs held here; see cancel requests and lost leases."""
        while not self._ended.wait(min(self.lease / 10, 1.0)):
            due = time.monotonic() - self.lease / 3
            with self._mutex:
                stale = [a for a in self._active.values() if a.renewed <= due and not a.lost]
            for active in stale:
                try:
                    doc = self.queue.renew(active.doc, lease_seconds=self.lease)
                except Exception as exc:
                    logger.warning("accord worker: renewing run %s failed (%s)",
                                   active.doc["_id"], exc)  # fmt: skip
                    continue
                if doc is None:
                    logger.warning("accord worker: run %s was taken over; dropping it",
                                   active.doc["_id"])  # fmt: skip
                    active.lost = True
                    continue
                active.renewed = time.monotonic()
                if doc.get("cancel_requested"):
                    active.cancel = True

    # --- one run -----------------------------------------------------------------------

    def _execute(self, active: ActiveRun) -> None:
        doc = active.doc
        try:
            self._run(active)
        except Exception as exc:  # the run's outcome was recorded where it could be
            logger.exception("accord worker: run %s: %s", doc["_id"], exc)
        finally:
            with self._mutex:
                self._active.pop(doc["_id"], None)
                self.completed += 1
            self._wake.set()

    def _fork_config(self, doc: dict[str, Any], fork: dict[str, Any]) -> dict[str, Any]:
        """The config a fork runs from; a checkpoint its source thread does not have is
        refused by name (else LangGraph starts from nothing: "Received no input")."""
        config = self._config(doc, fork.get("checkpoint_id"))
        if fork.get("checkpoint_id") and self.saver.get_tuple(config) is None:  # type: ignore[arg-type]
            raise InvalidInputError(
                f"fork of thread {fork['thread_id']!r}: it has no checkpoint "
                f"{fork['checkpoint_id']!r}; nothing was run. List its checkpoints with "
                f"graph.get_state_history(config) and fork again"
            )
        return config

    def _config(self, doc: dict[str, Any], checkpoint_id: str | None = None) -> dict[str, Any]:
        configurable: dict[str, Any] = {"thread_id": doc["thread_id"],
                                        "tenant_id": doc["tenant_id"]}  # fmt: skip
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable,
                "metadata": {"run_id": doc["_id"], "accord_worker": self.name}}  # fmt: skip

    def _head(self, doc: dict[str, Any]) -> tuple[str | None, str | None]:
        """The thread's latest checkpoint and the run that wrote it (its metadata's
        ``run_id``: the worker passes the run id to LangGraph, which records it)."""
        found = self.saver.get_tuple(self._config(doc))  # type: ignore[arg-type]
        if found is None:
            return None, None
        writer = (found.metadata or {}).get("run_id")
        return found.config["configurable"]["checkpoint_id"], writer

    def _at_wait(self, doc: dict[str, Any], latest: str | None) -> bool:
        """Whether the thread is still where the run waited, its resume not applied: its
        latest checkpoint is the wait's, or only state updates were made since (a bundle
        migration's, :class:`~accord.checkpointers.bundles.PinnedGraph`: a worker that
        migrated the thread may have died before it resumed the graph)."""
        waited = (doc.get("wait") or {}).get("checkpoint_id")
        if latest == waited:
            return True
        at = latest
        for _ in range(UPDATES_WALKED):
            if at is None or waited is None:
                return False
            found = self.saver.get_tuple(self._config(doc, at))  # type: ignore[arg-type]
            if found is None or (found.metadata or {}).get("source") != "update":
                return False
            parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            if parent == waited:
                return True
            at = parent
        return False

    def _what_to_run(self, active: ActiveRun) -> tuple[Any, dict[str, Any]] | None:
        """(input, config) of this execution, or None when the claim was lost."""
        doc = active.doc
        fork = doc.get("fork")
        started = doc.get("started")
        if fork and not started:
            # until the run started, its thread is only the copy: a copy cut short (a
            # crash) is finished, document by document as the source has them
            self.saver.copy_thread(fork["thread_id"], doc["thread_id"],
                                   tenant_id=doc["tenant_id"], resume=True)  # fmt: skip
        latest, writer = self._head(doc)
        if not started:
            if not self.queue.started(doc, latest):
                return None
            if fork:
                return None, self._fork_config(doc, fork)
            return queued_runs.decode(doc.get("input"), self.saver.serde), self._config(doc)
        resume = doc.get("resume")
        wait = doc.get("wait") or {}
        at_wait = resume is not None and self._at_wait(doc, latest)
        if at_wait:
            expired = self.queue.expired_credentials(doc)
            if expired is not None:  # back to waiting: a human refreshes them
                logger.warning("accord worker: %s", expired)
                return None
        if resume is not None and wait.get("kind") != "reconcile":
            if at_wait:
                value = queued_runs.decode(resume.get("value"), self.saver.serde)
                return Command(resume=value), self._config(doc)
            return None, self._config(doc)
        if writer == doc["_id"]:
            # it made progress (the latest checkpoint is its own, not another run's on
            # the same thread): continue from it
            return None, self._config(doc)
        if fork:
            return None, self._fork_config(doc, fork)
        return queued_runs.decode(doc.get("input"), self.saver.serde), self._config(doc)

    def _run(self, active: ActiveRun) -> None:
        doc = active.doc
        if doc.get("cancel_requested"):  # asked while its last worker was gone
            self.queue.cancelled(doc, "cancelled on request before it ran again")
            return
        if int(doc.get("attempts") or 0) > self.max_attempts:
            self.queue.failed(
                doc,
                f"claimed {doc['attempts']} times without ending (max_attempts "
                f"{self.max_attempts}): its workers died or lost it each time; look at "
                f"their logs, then submit it again",
            )
            return
        try:
            planned = self._what_to_run(active)
            if planned is None:
                return
            inp, config = planned
            # closed here, not by the garbage collector: LangGraph's loop exits (and its
            # last saves commit or fail) before the outcome is recorded
            with contextlib.closing(self.graph.stream(inp, config, stream_mode="updates")) as steps:
                for _ in steps:
                    if active.lost or active.cancel or active.stop:
                        break
        except ConcurrentRunError as exc:
            if active.lost or "lost thread" in str(exc):
                # fenced out: another worker took the run over; nothing of it was written
                logger.warning("accord worker: run %s: %s", doc["_id"], exc)
                return
            self._give_back(active, f"its thread is busy: {exc}")
            return
        except LeaseLost:
            return
        except BundleMismatch as exc:
            if not active.lost:
                self._give_back(active, f"BundleMismatch: {exc}", backoff=BUNDLE_BACKOFF_S)
            return
        except NeedsReconciliation as exc:
            if not active.lost:
                reconcile = {"key": exc.key, "name": exc.name, "reason": str(exc)}
                self.queue.waiting(doc, [{"reconcile": reconcile}], None, kind="reconcile")
            return
        except Exception as exc:
            if not active.lost:
                self.queue.failed(doc, f"{type(exc).__name__}: {exc}")
            return
        try:
            self._settle(active)
        except Exception as exc:  # its outcome cannot be recorded (a result the codec refuses)
            logger.warning(
                "accord worker: run %s: recording its outcome failed: %s", doc["_id"], exc
            )
            if not active.lost:
                self.queue.failed(doc, f"recording its outcome failed: {type(exc).__name__}: {exc}")

    def _give_back(
        self, active: ActiveRun, reason: str, *, backoff: float = BUSY_BACKOFF_S
    ) -> None:
        with self._claiming:
            with self._mutex:
                self._busy[active.doc["_id"]] = time.monotonic() + backoff
            self.queue.release(active.doc, reason)

    def _settle(self, active: ActiveRun) -> None:
        doc = active.doc
        if active.lost:
            return
        state = self.graph.get_state(self._config(doc))
        if active.cancel and state.next:
            # stopped at a step boundary; a cancel seen during the last step found none
            # left: the graph ended and committed everything, so it is done (below)
            self.queue.failed(doc, "cancelled on request at a step boundary",
                              status=queued_runs.CANCELLED)  # fmt: skip
            return
        if active.stop:
            self._give_back(active, "the worker is shutting down")
            return
        if state.next:
            interrupts = [{"id": getattr(i, "id", None), "value": interrupt_value(getattr(i, "value", i))}
                          for i in (state.interrupts or ())]  # fmt: skip
            if interrupts:
                checkpoint = state.config["configurable"].get("checkpoint_id")
                self.queue.waiting(doc, interrupts, checkpoint)
                return
            # stopped without an interrupt and with work left (it was cut short): again
            self._give_back(active, "stopped with steps left")
            return
        self.queue.finished(doc, state.values)


def serve(
    graph: str,
    *,
    db: str = "accord",
    concurrency: int = 4,
    tenant_limit: int | None = None,
    poll: float = 0.5,
    grace: float = 30.0,
    lease: float = DEFAULT_LEASE_SECONDS,
    until_idle: bool = False,
    max_attempts: int = 5,
    on_ready: Callable[[Worker], None] | None = None,
) -> int:
    """``accord worker``: a worker on ``MONGODB_URI`` (or the embedded engine) until
    SIGTERM; how many runs it executed."""
    from accord import runtime
    from accord.platform import connect

    client = connect()
    try:
        uow = runtime.kernel(client)
        worker = Worker(graph, client=client, uow=uow, db=db, concurrency=concurrency,
                        tenant_limit=tenant_limit, poll=poll, grace=grace, lease=lease,
                        max_attempts=max_attempts)  # fmt: skip
        worker.install_signals()
        if on_ready is not None:
            on_ready(worker)
        return worker.run(until_idle=until_idle)
    finally:
        client.close()
