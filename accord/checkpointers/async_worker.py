"""``AsyncWorker``: the worker of :mod:`accord.checkpointers.worker` on asyncio, for graphs
whose nodes are async (``async def``), which LangGraph's sync ``stream`` cannot run.

It is the same worker, not a twin generated from one source: the sync worker's
concurrency is threads (a thread per run, a heartbeat thread) and this one's is tasks on
one event loop, which ``tools/synchro.py`` does not translate. What it does is the same,
on :class:`~accord.checkpointers.asynchronous.saver.AsyncAccordSaver` and
:class:`~accord.platform.asynchronous.run_queue.AsyncRunQueue`: the same claims (with the
fleet-wide ``tenant_limit``), leases renewed every ``lease / 3`` by a heartbeat task,
cancel requests and lost leases seen there, the same choice of what a claimed run
executes (its input, its own progress, ``Command(resume=...)``, a fork's checkpoint), the
same outcomes (done, waiting, failed, cancelled, given back) and ``stop()`` with a grace::

    async with AsyncAccord() as app:
        worker = AsyncWorker("shop.graphs:checkout", client=app.client, uow=app.uow,
                             db=app.db_name, concurrency=16)
        await worker.run()          # until stop() (or SIGTERM after install_signals())

``accord worker --async`` runs one from a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from typing import Any

from langgraph.types import Command

from accord.checkpointers.asynchronous.saver import AsyncAccordSaver
from accord.checkpointers.worker import (
    BUNDLE_BACKOFF_S,
    BUSY_BACKOFF_S,
    UPDATES_WALKED,
    ActiveRun,
    bind,
    check_graph_name,
    interrupt_value,
    load_graph,
)
from accord.errors import (
    BundleMismatch,
    ConcurrentRunError,
    InvalidInputError,
    LeaseLost,
    NeedsReconciliation,
)
from accord.platform import queued_runs
from accord.platform.asynchronous.run_queue import DEFAULT_LEASE_SECONDS, AsyncRunQueue

logger = logging.getLogger("accord.worker")


class AsyncWorker:
    """Claims and executes the queued runs of one graph on asyncio (module docstring);
    the arguments are :class:`~accord.checkpointers.worker.Worker`'s, with ``client``
    an ``AsyncMongoClient`` and ``uow`` an async kernel (``AsyncAccord``'s)."""

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
        self.saver = AsyncAccordSaver(client, db_name=db, uow=uow, **(saver_kwargs or {}))
        self.queue = AsyncRunQueue(uow, db, codec=self.saver.serde)
        source = graph_object if graph_object is not None else load_graph(self.graph_name)
        self.graph = bind(source, self.saver)
        self._active: dict[str, ActiveRun] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._busy: dict[str, float] = {}
        # held across a claim and across a give-back: a run given back while a claim is
        # under way (its skip list read before the run was busy) is not claimed again
        self._claiming = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self.completed = 0

    # --- the loop ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running runs get ``grace`` seconds, then are given back."""
        self._stopping.set()
        self._wake.set()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully (on the running loop); a second
        one ends it at once."""
        loop = asyncio.get_running_loop()

        def handler(signum: int) -> None:
            logger.info("accord worker: signal %d: finishing or giving back runs", signum)
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_DFL)
            self.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, handler, signum)

    async def run(self, *, until_idle: bool = False, max_runs: int | None = None) -> int:
        """Work until stopped (``until_idle``: until nothing is left for it and nothing
        runs; ``max_runs``: after that many claims). How many claimed runs it handled."""
        await self.saver.setup()
        await self.queue.setup()
        before = self.completed
        heart = asyncio.create_task(self._heartbeat())
        claimed = 0
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                with contextlib.suppress(Exception):
                    await self.queue.expire_waits()
                # idle only when nothing ran while the queue was asked: a run that ends
                # during a claim refused for its tenant's limit leaves work to claim
                ran = len(self._active)
                got = False
                while max_runs is None or claimed < max_runs:
                    doc = await self._claim_one()
                    if doc is None:
                        break
                    claimed, got = claimed + 1, True
                    self._start(doc)
                if until_idle and not got and not ran:
                    break
                if max_runs is not None and claimed >= max_runs and not self._active:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll)
        finally:
            await self._shutdown()
            heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heart
        return self.completed - before

    async def _claim_one(self) -> dict[str, Any] | None:
        async with self._claiming:
            return await self._claim_next()

    async def _claim_next(self) -> dict[str, Any] | None:
        if len(self._active) >= self.concurrency:
            return None
        per_tenant: dict[str, int] = {}
        for active in self._active.values():
            tenant = active.doc["tenant_id"]
            per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
        now = time.monotonic()
        self._busy = {r: t for r, t in self._busy.items() if t > now}
        full = [t for t, n in per_tenant.items() if self.tenant_limit and n >= self.tenant_limit]
        try:
            return await self.queue.claim(
                [self.graph_name], self.name, lease_seconds=self.lease, skip_tenants=full,
                skip_runs=sorted(self._busy), tenant_limit=self.tenant_limit,
            )  # fmt: skip
        except Exception as exc:  # the database is away: try again at the next poll
            logger.warning("accord worker: claiming failed (%s); retrying", exc)
            return None

    def _start(self, doc: dict[str, Any]) -> None:
        active = ActiveRun(doc)
        self._active[doc["_id"]] = active
        self._tasks[doc["_id"]] = asyncio.create_task(
            self._execute(active), name=f"accord-run-{doc['_id']}"
        )

    async def _shutdown(self) -> None:
        """Let running runs finish within ``grace``; stop and give back the rest."""
        deadline = time.monotonic() + self.grace
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for active in list(self._active.values()):
            active.stop = True
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=max(self.lease, 5.0))

    async def _heartbeat(self) -> None:
        """Renew the leases of the runs held here; see cancel requests and lost leases."""
        while True:
            await asyncio.sleep(min(self.lease / 10, 1.0))
            due = time.monotonic() - self.lease / 3
            for active in [a for a in self._active.values() if a.renewed <= due and not a.lost]:
                try:
                    doc = await self.queue.renew(active.doc, lease_seconds=self.lease)
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

    # --- one run (as Worker's; see its methods for the why) ----------------------------

    async def _execute(self, active: ActiveRun) -> None:
        doc = active.doc
        try:
            await self._run(active)
        except Exception as exc:  # the run's outcome was recorded where it could be
            logger.exception("accord worker: run %s: %s", doc["_id"], exc)
        finally:
            self._active.pop(doc["_id"], None)
            self._tasks.pop(doc["_id"], None)
            self.completed += 1
            self._wake.set()

    async def _fork_config(self, doc: dict[str, Any], fork: dict[str, Any]) -> dict[str, Any]:
        """The config a fork runs from; a checkpoint its source thread does not have is
        refused by name (else LangGraph starts from nothing: "Received no input")."""
        config = self._config(doc, fork.get("checkpoint_id"))
        if fork.get("checkpoint_id") and await self.saver.aget_tuple(config) is None:  # type: ignore[arg-type]
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

    async def _head(self, doc: dict[str, Any]) -> tuple[str | None, str | None]:
        found = await self.saver.aget_tuple(self._config(doc))  # type: ignore[arg-type]
        if found is None:
            return None, None
        return found.config["configurable"]["checkpoint_id"], (found.metadata or {}).get("run_id")

    async def _at_wait(self, doc: dict[str, Any], latest: str | None) -> bool:
        waited = (doc.get("wait") or {}).get("checkpoint_id")
        if latest == waited:
            return True
        at = latest
        for _ in range(UPDATES_WALKED):
            if at is None or waited is None:
                return False
            found = await self.saver.aget_tuple(self._config(doc, at))  # type: ignore[arg-type]
            if found is None or (found.metadata or {}).get("source") != "update":
                return False
            parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            if parent == waited:
                return True
            at = parent
        return False

    async def _what_to_run(self, active: ActiveRun) -> tuple[Any, dict[str, Any]] | None:
        doc = active.doc
        fork = doc.get("fork")
        started = doc.get("started")
        if fork and not started:
            # until the run started, its thread is only the copy: a copy cut short (a
            # crash) is finished, document by document as the source has them
            await self.saver.acopy_thread(fork["thread_id"], doc["thread_id"],
                                          tenant_id=doc["tenant_id"], resume=True)  # fmt: skip
        latest, writer = await self._head(doc)
        if not started:
            if not await self.queue.started(doc, latest):
                return None
            if fork:
                return None, await self._fork_config(doc, fork)
            return queued_runs.decode(doc.get("input"), self.saver.serde), self._config(doc)
        resume = doc.get("resume")
        wait = doc.get("wait") or {}
        at_wait = resume is not None and await self._at_wait(doc, latest)
        if at_wait:
            expired = await self.queue.expired_credentials(doc)
            if expired is not None:
                logger.warning("accord worker: %s", expired)
                return None
        if resume is not None and wait.get("kind") != "reconcile":
            if at_wait:
                value = queued_runs.decode(resume.get("value"), self.saver.serde)
                return Command(resume=value), self._config(doc)
            return None, self._config(doc)
        if writer == doc["_id"]:
            return None, self._config(doc)
        if fork:
            return None, await self._fork_config(doc, fork)
        return queued_runs.decode(doc.get("input"), self.saver.serde), self._config(doc)

    async def _run(self, active: ActiveRun) -> None:
        doc = active.doc
        if doc.get("cancel_requested"):  # asked while its last worker was gone
            await self.queue.cancelled(doc, "cancelled on request before it ran again")
            return
        if int(doc.get("attempts") or 0) > self.max_attempts:
            await self.queue.failed(
                doc,
                f"claimed {doc['attempts']} times without ending (max_attempts "
                f"{self.max_attempts}): its workers died or lost it each time; look at "
                f"their logs, then submit it again",
            )
            return
        try:
            planned = await self._what_to_run(active)
            if planned is None:
                return
            inp, config = planned
            stream = self.graph.astream(inp, config, stream_mode="updates")
            async with contextlib.aclosing(stream) as steps:
                async for _ in steps:
                    if active.lost or active.cancel or active.stop:
                        break
        except ConcurrentRunError as exc:
            if active.lost or "lost thread" in str(exc):
                logger.warning("accord worker: run %s: %s", doc["_id"], exc)
                return
            await self._give_back(active, f"its thread is busy: {exc}")
            return
        except LeaseLost:
            return
        except BundleMismatch as exc:
            if not active.lost:
                await self._give_back(active, f"BundleMismatch: {exc}", backoff=BUNDLE_BACKOFF_S)
            return
        except NeedsReconciliation as exc:
            if not active.lost:
                reconcile = {"key": exc.key, "name": exc.name, "reason": str(exc)}
                await self.queue.waiting(doc, [{"reconcile": reconcile}], None, kind="reconcile")
            return
        except Exception as exc:
            if not active.lost:
                await self.queue.failed(doc, f"{type(exc).__name__}: {exc}")
            return
        try:
            await self._settle(active)
        except Exception as exc:  # its outcome cannot be recorded (a result the codec refuses)
            logger.warning(
                "accord worker: run %s: recording its outcome failed: %s", doc["_id"], exc
            )
            if not active.lost:
                await self.queue.failed(
                    doc, f"recording its outcome failed: {type(exc).__name__}: {exc}"
                )

    async def _give_back(
        self, active: ActiveRun, reason: str, *, backoff: float = BUSY_BACKOFF_S
    ) -> None:
        async with self._claiming:
            self._busy[active.doc["_id"]] = time.monotonic() + backoff
            await self.queue.release(active.doc, reason)

    async def _settle(self, active: ActiveRun) -> None:
        doc = active.doc
        if active.lost:
            return
        state = await self.graph.aget_state(self._config(doc))
        if active.cancel and state.next:
            # stopped at a step boundary; a cancel seen during the last step found none
            # left: the graph ended and committed everything, so it is done (below)
            await self.queue.failed(doc, "cancelled on request at a step boundary",
                                    status=queued_runs.CANCELLED)  # fmt: skip
            return
        if active.stop:
            await self._give_back(active, "the worker is shutting down")
            return
        if state.next:
            interrupts = [
                {"id": getattr(i, "id", None), "value": interrupt_value(getattr(i, "value", i))}
                for i in (state.interrupts or ())
            ]
            if interrupts:
                checkpoint = state.config["configurable"].get("checkpoint_id")
                await self.queue.waiting(doc, interrupts, checkpoint)
                return
            await self._give_back(active, "stopped with steps left")
            return
        await self.queue.finished(doc, state.values)


async def serve_async(graph: str, *, db: str = "accord", until_idle: bool = False,
                      **kwargs: Any) -> int:  # fmt: skip
    """``accord worker --async``: an :class:`AsyncWorker` on ``MONGODB_URI`` (or the
    embedded engine) until SIGTERM; how many runs it executed. ``kwargs``: the worker's."""
    from accord import runtime
    from accord.platform import connect_async

    client = connect_async()
    try:
        worker = AsyncWorker(graph, client=client, uow=runtime.kernel(client), db=db, **kwargs)
        worker.install_signals()
        return await worker.run(until_idle=until_idle)
    finally:
        await client.close()
