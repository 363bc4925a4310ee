"""What the sync and async savers do differently (not generated).

* ``AsyncAccordSaver`` answers LangGraph's *sync* methods too (``get_tuple``, ``put``...):
  a sync subgraph invoked inside a node, or ``asyncio.to_thread(graph.get_state, ...)``,
  calls them from another thread. They run on the saver's own event loop
  (``asyncio.run_coroutine_threadsafe``, as langgraph-checkpoint-postgres's ``aio.py``
  does); called from that loop's own thread they would deadlock, so they refuse with an
  error that says to use the async methods.
* ``AccordSaver`` answers the *async* methods (``aget_tuple``, ``aput``...) by running
  the sync ones in a worker thread, as MongoDBSaver does.
* Locks, the lease heartbeat, and the release at the end of a run, each the twin's way:
  asyncio objects for the async saver, threads for the sync one.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from accord.checkpointers import jobs, langgraph_internals
from accord.errors import AccordError, DatabaseError
from accord.platform.logs import describe, log_failure

logger = logging.getLogger("accord.checkpointers")


def new_async_lock() -> asyncio.Lock:
    """A lock for the async saver (its commits all run on its event loop)."""
    return asyncio.Lock()


def new_thread_lock() -> threading.Lock:
    """A lock for the sync saver (LangGraph calls it from several threads)."""
    return threading.Lock()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AnswersSyncCalls:
    """Mixin of ``AsyncAccordSaver``: LangGraph's sync methods, run on the saver's loop."""

    loop: asyncio.AbstractEventLoop | None
    timeout: float

    def _on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            loop = self._serving_loop()
        except AccordError:
            coro.close()
            raise
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            # every coroutine bounds itself; this bound only catches a loop that stalls
            return fut.result(timeout=self.timeout * 4)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise DatabaseError(
                f"A synchronous call to AsyncAccordSaver did not complete within "
                f"{self.timeout * 4:g}s: its event loop is blocked or overloaded. Nothing "
                f"more is known about the call's outcome; retry, or use the async methods."
            ) from None

    def _serving_loop(self) -> asyncio.AbstractEventLoop:
        """The saver's loop, if a sync call from this thread can be served on it."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            raise AccordError(
                "AsyncAccordSaver runs on the event loop it was created (or set up) on, and "
                "that loop is not running, so this synchronous call cannot be served. Use "
                "the async methods (graph.ainvoke / astream / aget_state), or AccordSaver "
                "for synchronous code."
            )
        if running_loop() is loop:
            raise AccordError(
                "Synchronous calls to AsyncAccordSaver (get_tuple, put, graph.invoke, "
                "graph.get_state...) are served from other threads only: this one runs the "
                "saver's event loop, which the call would block. Use the async methods here "
                "(await graph.ainvoke(...), await graph.aget_state(...)), or run the sync "
                "call in a thread (asyncio.to_thread)."
            )
        return loop

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        caller = langgraph_internals.calling_loop()
        return self._on_loop(self._get_tuple(config, caller))  # type: ignore[attr-defined,no-any-return]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        aiter = self.alist(config, filter=filter, before=before, limit=limit)  # type: ignore[attr-defined]
        return iter(self._on_loop(_collect(aiter)))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # Serialized on this thread, now, and under "async" durability queued from here
        # too: LangGraph calls the next put only when this one returns, and meanwhile keeps
        # changing the objects it handed over for it (a fan-in barrier's set), so no hop
        # to the loop before returning.
        loop = self._serving_loop()
        prepared = self._prepare_put(config, checkpoint, metadata, new_versions)  # type: ignore[attr-defined]
        job, run, deferred = prepared
        if deferred and run is not None:
            if self._queue_put(job, run):  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(in_background, self._drain, run)  # type: ignore[attr-defined]
            return self._returned_config(job.scope, job.checkpoint_id)  # type: ignore[attr-defined,no-any-return]
        return self._on_loop(self._save_put(prepared))  # type: ignore[attr-defined,no-any-return]

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._on_loop(self._put_writes(config, writes, task_id, task_path))  # type: ignore[attr-defined]

    def delete_thread(self, thread_id: str, **kwargs: Any) -> None:
        self._on_loop(self.adelete_thread(thread_id, **kwargs))  # type: ignore[attr-defined]

    def copy_thread(self, source_thread_id: str, target_thread_id: str, **kwargs: Any) -> None:
        self._on_loop(self.acopy_thread(source_thread_id, target_thread_id, **kwargs))  # type: ignore[attr-defined]

    def prune(self, thread_ids: Sequence[str], **kwargs: Any) -> None:
        self._on_loop(self.aprune(thread_ids, **kwargs))  # type: ignore[attr-defined]

    def delete_for_runs(self, run_ids: Sequence[str], **kwargs: Any) -> None:
        self._on_loop(self.adelete_for_runs(run_ids, **kwargs))  # type: ignore[attr-defined]

    def read_workflow_events(
        self, config: RunnableConfig, workflow: str, *, after: int = 0, limit: int = 100
    ) -> builtins.list[dict[str, Any]]:
        return self._on_loop(  # type: ignore[no-any-return]
            self.aread_workflow_events(config, workflow, after=after, limit=limit)  # type: ignore[attr-defined]
        )

    def sweep(self) -> int:
        return self._on_loop(self.asweep())  # type: ignore[attr-defined,no-any-return]

    def delete_expired(self, threads: Sequence[tuple[str, str]], **kwargs: Any) -> tuple[int, int]:
        return self._on_loop(self.adelete_expired(threads, **kwargs))  # type: ignore[attr-defined,no-any-return]

    def collect_garbage(self, thread_ids: Sequence[str], **kwargs: Any) -> int:
        return self._on_loop(self.acollect_garbage(thread_ids, **kwargs))  # type: ignore[attr-defined,no-any-return]

    def pending_collection(self, **kwargs: Any) -> builtins.list[tuple[str, str]]:
        return self._on_loop(self.apending_collection(**kwargs))  # type: ignore[attr-defined,no-any-return]

    def put_artifact(self, config: RunnableConfig, data: Any, **kwargs: Any) -> Any:
        return self._on_loop(self.aput_artifact(config, data, **kwargs))  # type: ignore[attr-defined]

    def get_artifact(self, ref: Any, **kwargs: Any) -> bytes:
        return self._on_loop(self.aget_artifact(ref, **kwargs))  # type: ignore[attr-defined,no-any-return]

    def gc_artifacts(self, **kwargs: Any) -> int:
        return self._on_loop(self.agc_artifacts(**kwargs))  # type: ignore[attr-defined,no-any-return]

    def rollback(self, config: RunnableConfig, **kwargs: Any) -> Any:
        return self._on_loop(self.arollback(config, **kwargs))  # type: ignore[attr-defined]


async def _collect(aiter: AsyncIterator[Any]) -> builtins.list[Any]:
    return [item async for item in aiter]


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)`` in a thread of its own (not the loop's bounded default executor: a
    graph's parallel tasks may each wait there for the checkpoint their writes belong to,
    and the put of that checkpoint must still find a thread)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, fut, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, fut, result, None)

    threading.Thread(target=run, name="accord-call", daemon=True).start()
    return await fut


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class AnswersAsyncCalls:
    """Mixin of ``AccordSaver``: LangGraph's async methods, each in a thread of its own."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        caller = langgraph_internals.calling_loop()
        return await in_thread(self._get_tuple, config, caller)  # type: ignore[attr-defined]

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def run() -> builtins.list[CheckpointTuple]:
            return builtins.list(self.list(config, filter=filter, before=before, limit=limit))  # type: ignore[attr-defined]

        for item in await in_thread(run):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # Serialized on the loop, now: it moves on (and changes the objects it handed over)
        # while a thread starts. Under "async" durability the save is only queued, which
        # does not block, so it is done here too and the put returns at once (LangGraph
        # calls the next put only then).
        prepared = self._prepare_put(config, checkpoint, metadata, new_versions)  # type: ignore[attr-defined]
        if prepared[2] and prepared[1] is not None:
            return self._save_put(prepared)  # type: ignore[attr-defined,no-any-return]
        return await in_thread(self._save_put, prepared)  # type: ignore[attr-defined,no-any-return]

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await in_thread(self._put_writes, config, writes, task_id, task_path)  # type: ignore[attr-defined]

    async def adelete_thread(self, thread_id: str, **kwargs: Any) -> None:
        await in_thread(self.delete_thread, thread_id, **kwargs)  # type: ignore[attr-defined]

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, **kwargs: Any
    ) -> None:
        await in_thread(self.copy_thread, source_thread_id, target_thread_id, **kwargs)  # type: ignore[attr-defined]

    async def aprune(self, thread_ids: Sequence[str], **kwargs: Any) -> None:
        await in_thread(self.prune, thread_ids, **kwargs)  # type: ignore[attr-defined]

    async def adelete_for_runs(self, run_ids: Sequence[str], **kwargs: Any) -> None:
        await in_thread(self.delete_for_runs, run_ids, **kwargs)  # type: ignore[attr-defined]

    async def aread_workflow_events(
        self, config: RunnableConfig, workflow: str, *, after: int = 0, limit: int = 100
    ) -> builtins.list[dict[str, Any]]:
        read = self.read_workflow_events  # type: ignore[attr-defined]
        return await in_thread(read, config, workflow, after=after, limit=limit)  # type: ignore[no-any-return]

    async def asweep(self) -> int:
        return await in_thread(self.sweep)  # type: ignore[attr-defined,no-any-return]

    async def adelete_expired(
        self, threads: Sequence[tuple[str, str]], **kwargs: Any
    ) -> tuple[int, int]:
        return await in_thread(self.delete_expired, threads, **kwargs)  # type: ignore[attr-defined,no-any-return]

    async def acollect_garbage(self, thread_ids: Sequence[str], **kwargs: Any) -> int:
        return await in_thread(self.collect_garbage, thread_ids, **kwargs)  # type: ignore[attr-defined,no-any-return]

    async def apending_collection(self, **kwargs: Any) -> builtins.list[tuple[str, str]]:
        return await in_thread(self.pending_collection, **kwargs)  # type: ignore[attr-defined,no-any-return]

    async def aput_artifact(self, config: RunnableConfig, data: Any, **kwargs: Any) -> Any:
        return await in_thread(self.put_artifact, config, data, **kwargs)  # type: ignore[attr-defined]

    async def aget_artifact(self, ref: Any, **kwargs: Any) -> bytes:
        return await in_thread(self.get_artifact, ref, **kwargs)  # type: ignore[attr-defined,no-any-return]

    async def agc_artifacts(self, **kwargs: Any) -> int:
        return await in_thread(self.gc_artifacts, **kwargs)  # type: ignore[attr-defined,no-any-return]

    async def arollback(self, config: RunnableConfig, **kwargs: Any) -> Any:
        return await in_thread(self.rollback, config, **kwargs)  # type: ignore[attr-defined]


#: background tasks (kept so they are not collected before they finish)
_PENDING: set[asyncio.Task[Any]] = set()


def in_background(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` in the background: a task on the running loop for a coroutine
    function (the async saver), else a daemon thread (the sync saver)."""
    if inspect.iscoroutinefunction(fn):
        task = asyncio.get_running_loop().create_task(fn(*args))
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)
    else:
        _WORKERS.submit(fn, args)


class _Workers:
    """Daemon threads that run the sync saver's background saves, kept for reuse.

    Starting a thread per save made the ``put`` wait until the new thread was scheduled
    (1.5 ms median on the benchmark's busy machine, on every invoke's path). Every job
    gets a thread at once, as before: an idle worker when there is one, else a new
    thread (no bound, so a save never waits behind another thread's save). A worker idle
    for ``IDLE_SECONDS`` ends. Each job runs in a fresh ``contextvars.Context``, as a new
    thread would.
    """

    IDLE_SECONDS = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        # workers waiting for a job, minus the jobs queued for them
        self._idle = 0

    def reset(self) -> None:
        """After ``fork``: the child has none of the parent's threads."""
        self._lock = threading.Lock()
        self._jobs = queue.SimpleQueue()
        self._idle = 0

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with self._lock:
            self._jobs.put((fn, args))
            if self._idle > 0:
                self._idle -= 1
                return
        threading.Thread(target=self._work, name="accord-commit", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                fn, args = self._jobs.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._idle -= 1
                        return
                continue  # a job came in as the wait ended: take it
            try:
                contextvars.Context().run(fn, *args)
            except BaseException as exc:  # what a thread of its own would have printed
                log_failure(logger, logging.ERROR, "accord: a background save raised", exc=exc)
            finally:
                del fn, args
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKERS.reset)


# --- the end of a run ----------------------------------------------------------------


def on_loop_exit(
    pregel_loop: Any,
    release: Callable[[Any], Any],
    run: Any,
    on_saver_loop: Callable[[Coroutine[Any, Any, Any]], Any] | None = None,
) -> None:
    """Run ``release(run)`` when LangGraph's loop exits (after its background saves have
    finished: the loop's executor was entered after this and exits before it), or at
    once if the loop fails to start after loading the thread (its ``__enter__`` raises,
    e.g. a refused ``Command(resume=...)``; Python then never calls its ``__exit__``).
    What the release raises (a queued save that failed) is raised from the loop, unless
    the loop is already raising its own error, which stands.

    ``release`` is a coroutine function for the async saver (then ``on_saver_loop`` runs
    it from a sync loop's thread) or a plain function for the sync one.
    """
    stack = langgraph_internals.exit_stack(pregel_loop)
    is_coro = inspect.iscoroutinefunction(release)
    if isinstance(stack, contextlib.AsyncExitStack):

        async def aexit(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            try:
                if is_coro:
                    await release(run)
                else:
                    await in_thread(release, run)
            except Exception as failed:
                if exc is None:
                    raise  # the run's outcome: a queued save failed
                _ending_after(exc, failed)
            return False

        stack.push_async_exit(aexit)
    else:

        def exit_(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            try:
                if is_coro:
                    _from_thread(release, run, on_saver_loop)
                else:
                    release(run)
            except Exception as failed:
                if exc is None:
                    raise
                _ending_after(exc, failed)
            return False

        stack.push(exit_)
    _release_if_start_fails(pregel_loop, release, run, on_saver_loop)
    langgraph_internals.before_first(
        pregel_loop,
        lambda: langgraph_internals.detach_handed_checkpoints(pregel_loop, jobs.detached),
    )


def _ending_after(exc: BaseException, failed: BaseException) -> None:
    """Releasing a run failed while the run was already raising ``exc`` to the caller
    (who handles it: a ``BusinessWriteError`` caught by the application): one line."""
    if describe(failed) == describe(exc):  # the same failure, surfaced by the release
        logger.warning("accord: the run ended after %s", describe(exc))
        logger.debug("traceback of the run's failure", exc_info=failed)
        return
    log_failure(
        logger, logging.WARNING, "accord: the run ended after %s; releasing it also failed",
        describe(exc), exc=failed,
    )  # fmt: skip


def _from_thread(
    release: Callable[[Any], Any],
    run: Any,
    on_saver_loop: Callable[[Coroutine[Any, Any, Any]], Any] | None,
) -> None:
    assert on_saver_loop is not None
    on_saver_loop(release(run))  # raises what the release raises: the run's outcome


def _release_if_start_fails(
    pregel_loop: Any,
    release: Callable[[Any], Any],
    run: Any,
    on_saver_loop: Callable[[Coroutine[Any, Any, Any]], Any] | None,
) -> None:
    """Release the run at once if the loop fails to start after loading the thread."""

    def now() -> None:
        try:
            if not inspect.iscoroutinefunction(release):
                release(run)
            elif running_loop() is not None:  # the async saver in an async loop
                in_background(release, run)
            else:
                _from_thread(release, run, on_saver_loop)
        except Exception as exc:  # the loop's own error is what the caller must see
            logger.warning(
                "accord: releasing run %s failed (%s); its lease expires by itself",
                getattr(run, "run_id", "?"), exc,
            )  # fmt: skip
            logger.debug("releasing the run failed", exc_info=True)

    langgraph_internals.on_start_failure(pregel_loop, now)
