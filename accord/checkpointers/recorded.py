"""Recorded calls: tool and model calls that a re-executed task replays instead of making
again (durable execution, docs/durable-execution.md).

Inside a LangGraph node of a graph compiled with an accord saver::

    from accord.checkpointers.recorded import recorded

    @recorded(idempotent=True)            # the provider dedupes on the key it is given
    def charge(account: str, cents: int, *, idempotency_key: str) -> str:
        return bank.charge(account, cents, idempotency_key=idempotency_key)

    @recorded                             # not idempotent: never made twice blindly
    async def decide(messages):
        return await model.ainvoke(messages)

    async def pay(state):
        decision = await decide(state["messages"])    # replayed after a crash
        receipt = charge("acme", decision.cents)      # made once
        ...

or, without a decorator, ``recorded_call(fn, *args, **kwargs)`` /
``await arecorded_call(fn, *args, **kwargs)``.

Each call is committed twice through the kernel (:mod:`accord.platform.calls`): its
*intent* before it (the call site, the idempotency key, the arguments' digest and value),
its result after it. When the task is executed again (its process died after the call and
before the task's writes were saved; a retry policy; a resume after ``interrupt()``), each
call at the same position returns the recorded result without being made; an intent with
no result is retried with the same key if the call is declared idempotent, else the call
is parked and :class:`~accord.errors.NeedsReconciliation` is raised.

Where the position counter lives. A call's position is its index among the recorded calls
of one *execution* of its task: the counter must start at 0 whenever the task runs its
body again, and be shared by everything that body calls (nested runnables, tools). It is
kept in this module, keyed by two things of the running task's config:

* LangGraph's per-preparation state reader (``langgraph_internals.task_token``): a new
  object each time a task is prepared (a resume after an interrupt, a re-execution in a
  new process), shared by every config derived inside the task, and weakly referenceable,
  so an entry is dropped when its task is;
* the attempt number (``execution_info.node_attempt``): a retry of the same preparation
  starts again at 0.

Positions are taken when a call starts, so calls must start in a deterministic order:
sequential calls, or ``asyncio.gather`` of coroutines created in a fixed order (each
takes its position before its first ``await``). Calls started from threads racing each
other get positions in whatever order they start, which a re-execution may not repeat.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp

from accord.checkpointers import langgraph_internals, ownership, schema
from accord.errors import (
    ConcurrentRunError,
    ConfigurationError,
    NeedsReconciliation,
    TaskWriteError,
)
from accord.platform import calls, runs
from accord.platform.asynchronous.call_log import AsyncCallLog
from accord.platform.synchronous.call_log import CallLog

__all__ = [
    "DIVERGENCES", "KEY_ARGUMENT", "aresolve_call", "arecorded_call", "recorded", "recorded_call",
    "resolve_call", "unsettled_calls",
]  # fmt: skip

logger = logging.getLogger("accord.durable")

P = ParamSpec("P")
R = TypeVar("R")

#: The keyword argument an idempotent call is given its idempotency key as (when its
#: function accepts it).
KEY_ARGUMENT = "idempotency_key"

#: Re-executions whose arguments differed from the recorded ones, per call name, in this
#: process (each is also logged once and counted on the call's document).
DIVERGENCES: Counter[str] = Counter()


# --- the position counter --------------------------------------------------------------


class _Positions:
    """Position counters per (task preparation, attempt); see the module docstring."""

    def __init__(self) -> None:
        # reentrant: a garbage collection inside ``next`` may run ``_drop`` on this thread
        self._mutex = threading.RLock()
        self._counters: dict[int, tuple[weakref.ref[Any], dict[int, itertools.count[int]]]] = {}

    def next(self, token: Any, attempt: int) -> int:
        key = id(token)
        with self._mutex:
            entry = self._counters.get(key)
            if entry is None or entry[0]() is not token:
                ref = weakref.ref(token, functools.partial(self._drop, key))
                entry = self._counters[key] = (ref, {})
            counter = entry[1].setdefault(attempt, itertools.count())
            return next(counter)

    def _drop(self, key: int, ref: weakref.ref[Any]) -> None:
        with self._mutex:
            entry = self._counters.get(key)
            if entry is not None and entry[0] is ref:
                del self._counters[key]


_POSITIONS = _Positions()


# --- the call site of the running task ------------------------------------------------


@dataclass(frozen=True)
class _Here:
    """The running task's call site, with what recording a call there needs."""

    site: calls.CallSite
    saver: Any
    config: Any
    lease: runs.Lease | None
    #: the namespace of the checkpoint the task runs from (the task's without its last part)
    parent_ns: str


def _here(name: str) -> _Here:
    try:
        config = get_config()
    except RuntimeError:
        raise ConfigurationError(
            f"recorded call {name!r} was made outside a running LangGraph node (no "
            f"runnable config in this context); call it from a node or a tool a node runs."
        ) from None
    conf = config.get("configurable") or {}
    saver = conf.get(langgraph_internals.CONFIG_CHECKPOINTER)
    from accord.checkpointers.base import AccordBase  # local import: base imports storage

    if not isinstance(saver, AccordBase):
        raise ConfigurationError(
            f"recorded call {name!r} needs the graph compiled with accord's AccordSaver / "
            f"AsyncAccordSaver (got "
            f"{type(saver).__name__ if saver is not None else 'no checkpointer'}): its "
            f"intent and result are committed beside the run's checkpoints."
        )
    if conf.get(langgraph_internals.CONFIG_DURABILITY, "async") == "exit":
        raise ConfigurationError(
            f"recorded call {name!r} needs durability='sync' or 'async': with "
            f"durability='exit' LangGraph saves no checkpoint until the run ends, so a "
            f"crash would re-create the task under another id and its calls would not be "
            f"found."
        )
    runtime = langgraph_internals.runtime_of(config)
    info = getattr(runtime, "execution_info", None)
    token = langgraph_internals.task_token(config)
    if info is None or token is None or not isinstance(conf.get("thread_id"), str):
        raise ConfigurationError(
            f"recorded call {name!r}: the running task has no LangGraph execution info "
            f"(thread, checkpoint, task id); run the graph with a thread_id in its config."
        )
    ns = str(info.checkpoint_ns or "")
    site = calls.CallSite(
        tenant_id=saver.tenant_of(config),
        thread_id=conf["thread_id"],
        checkpoint_ns=ns,
        checkpoint_id=str(info.checkpoint_id),
        task_id=str(info.task_id),
        position=_POSITIONS.next(token, int(getattr(info, "node_attempt", 1) or 1)),
    )
    parent_ns = ns.rpartition("|")[0] if "|" in ns else ""
    return _Here(site, saver, config, saver.run_lease(config), parent_ns)


_LOGS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOGS_MUTEX = threading.Lock()


def call_log(saver: Any) -> Any:
    """The call log (:class:`~accord.platform.synchronous.call_log.CallLog`, or the async
    one for an :class:`~accord.checkpointers.AsyncAccordSaver`) on ``saver``'s kernel."""
    return _log_of(saver)


def _log_of(saver: Any) -> Any:
    """The call log on ``saver``'s kernel and database (one per saver)."""
    with _LOGS_MUTEX:
        log = _LOGS.get(saver)
        if log is None:
            from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork

            kind = AsyncCallLog if isinstance(saver.uow, AsyncUnitOfWork) else CallLog
            log = kind(saver.uow, saver.db_name, collection=saver.collections.calls,
                       runs_collection=saver.collections.runs)  # fmt: skip
            _LOGS[saver] = log
        return log


# --- what both flavours share ------------------------------------------------------------


def _arguments(
    here: _Here, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[str, dict[str, Any] | None]:
    """(digest, serialized value) of a call's arguments (the value is None when the
    saver's serializer cannot encode them: the digest still detects divergence)."""
    plain = {k: v for k, v in kwargs.items() if k != KEY_ARGUMENT}
    digest = calls.digest([list(args), plain])
    try:
        kind, data = here.saver.serde.dumps_typed((list(args), plain))
    except Exception:  # an argument the serializer does not know (a client object)
        return digest, None
    return digest, {"type": kind, "data": data}


def _result_value(here: _Here, doc: Mapping[str, Any]) -> Any:
    result = doc["result"]
    return here.saver.serde.loads_typed((result["type"], bytes(result["data"])))


def _serialized(here: _Here, name: str, value: Any) -> dict[str, Any]:
    try:
        kind, data = here.saver.serde.dumps_typed(value)
    except Exception as exc:
        raise ConfigurationError(
            f"recorded call {name!r} returned a {type(value).__name__}, which the saver's "
            f"serializer cannot encode ({exc}); return plain data or a LangChain object."
        ) from exc
    return {"type": kind, "data": data}


def _divergent(here: _Here, name: str, doc: Mapping[str, Any], digest: str) -> bool:
    """Whether this execution's call differs from the recorded one (logged once)."""
    if doc.get("args_digest") == digest and doc.get("name") == name:
        return False
    DIVERGENCES[name] += 1
    logger.warning(
        "accord: recorded call diverged: %s was recorded as %r with arguments %s and is "
        "now %r with arguments %s; the recorded result is used",
        here.site.describe(name), doc.get("name"), str(doc.get("args_digest"))[:12],
        name, digest[:12],
    )  # fmt: skip
    return True


def _parked(here: _Here, name: str, doc: Mapping[str, Any]) -> NeedsReconciliation:
    site = here.site
    state = doc.get("status")
    what = "raised" if state == calls.FAILED else "was in flight when its process stopped"
    # the command must name the call's tenant: without it, it looks in the default one
    # and answers that no such call exists
    tenant = "" if site.tenant_id == schema.DEFAULT_TENANT else f" --tenant {site.tenant_id}"
    return NeedsReconciliation(
        f"{site.describe(name)} {what} and has no recorded result (idempotency key "
        f"{site.key}); it is not declared idempotent, so it was not made again. Check "
        f"with the provider whether it took effect, then settle it: `accord runs "
        f"resolve {site.thread_id} {site.key} --result JSON{tenant}` (or resolve_call), or "
        f"declare the call idempotent if the provider dedupes on the key.",
        key=site.key, name=name, thread_id=site.thread_id, task_id=site.task_id,
        position=site.position,
    )  # fmt: skip


def _with_key(fn: Callable[..., Any], kwargs: dict[str, Any], key: str) -> dict[str, Any]:
    """``kwargs`` plus the idempotency key, when ``fn`` takes it."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    takes = KEY_ARGUMENT in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )
    return {**kwargs, KEY_ARGUMENT: key} if takes else kwargs


def _key_of(doc: Mapping[str, Any]) -> str:
    """The provider-facing idempotency key of a record (a carried record keeps its
    original's: :func:`accord.platform.calls.carried`)."""
    return str(doc.get("idempotency_key") or doc["_id"])


def _contended(here: _Here, name: str) -> ConcurrentRunError:
    return ownership.call_contended(here.site.describe(name))


def _not_saved(here: _Here) -> TaskWriteError:
    return TaskWriteError(
        f"checkpoint {here.site.checkpoint_id} that task {here.site.task_id} runs from was "
        f"not saved (its save failed or took longer than the saver's timeout), so its "
        f"calls cannot be recorded against it; nothing was called. Resume the thread."
    )


# --- sync ---------------------------------------------------------------------------------


def recorded_call(
    fn: Callable[..., R],
    /,
    *args: Any,
    _name: str | None = None,
    _idempotent: bool = False,
    **kwargs: Any,
) -> R:
    """Make the call ``fn(*args, **kwargs)`` recorded (module docstring), from a sync
    node of a graph compiled with :class:`~accord.checkpointers.AccordSaver`."""
    name = _name or str(getattr(fn, "__qualname__", None) or repr(fn))
    here = _here(name)
    log = _log_of(here.saver)
    if isinstance(log, AsyncCallLog):
        raise ConfigurationError(
            f"recorded call {name!r} is sync but the graph's saver is AsyncAccordSaver: "
            f"make the call async (``async def`` with @recorded, or arecorded_call) or "
            f"compile the graph with AccordSaver."
        )
    log.setup()
    if not here.saver.wait_checkpoint_saved(here.config, here.parent_ns, here.site.checkpoint_id):
        raise _not_saved(here)
    digest, value = _arguments(here, args, kwargs)
    for _ in range(3):
        doc = log.get(here.site)
        decision = calls.decide(doc, idempotent=_idempotent)
        if decision != "call":
            break
        intent = calls.intent_doc(here.site, name=name, lease=here.lease, args_digest=digest,
                                  args=value, idempotent=_idempotent, at=runs.now())  # fmt: skip
        if log.intend(intent, here.lease):
            return _make_sync(log, here, name, fn, args, kwargs, _idempotent)
    if doc is None:
        raise _contended(here, name)
    if _divergent(here, name, doc, digest):
        log.diverged(here.site, digest, here.lease)
    if decision == "replay":
        return _result_value(here, doc)  # type: ignore[no-any-return]
    if decision == "retry":
        log.retrying(here.site, here.lease)
        return _make_sync(log, here, name, fn, args, kwargs, _idempotent, _key_of(doc))
    if doc.get("status") != calls.PARKED:
        log.park(here.site, name, "intent without result; not idempotent", here.lease)
    raise _parked(here, name, doc)


def _make_sync(
    log: CallLog,
    here: _Here,
    name: str,
    fn: Callable[..., R],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    idempotent: bool,
    key: str | None = None,
) -> R:
    call_kwargs = _with_key(fn, kwargs, key or here.site.key) if idempotent else kwargs
    try:
        result = fn(*args, **call_kwargs)
    except GraphBubbleUp:  # interrupt(), a Command to the parent: not a failure
        log.withdraw(here.site, here.lease)
        raise
    except Exception as exc:
        log.failed(here.site, f"{type(exc).__name__}: {exc}", here.lease)
        raise
    log.finish(here.site, _serialized(here, name, result), here.lease)
    return result


# --- async --------------------------------------------------------------------------------


async def arecorded_call(
    fn: Callable[..., Awaitable[R]],
    /,
    *args: Any,
    _name: str | None = None,
    _idempotent: bool = False,
    **kwargs: Any,
) -> R:
    """Make the call ``await fn(*args, **kwargs)`` recorded (module docstring), from an
    async node (with either saver)."""
    name = _name or str(getattr(fn, "__qualname__", None) or repr(fn))
    here = _here(name)  # before the first await: the position follows the call order
    log = _log_of(here.saver)

    async def run(method: Callable[..., Any], *a: Any) -> Any:
        if isinstance(log, AsyncCallLog):
            return await method(*a)
        return await asyncio.to_thread(method, *a)

    await run(log.setup)
    saved = (
        await here.saver.await_checkpoint_saved(
            here.config, here.parent_ns, here.site.checkpoint_id
        )  # fmt: skip
    )
    if not saved:
        raise _not_saved(here)
    digest, value = _arguments(here, args, kwargs)
    doc: Any = None
    decision: calls.Decision = "call"
    for _ in range(3):
        doc = await run(log.get, here.site)
        decision = calls.decide(doc, idempotent=_idempotent)
        if decision != "call":
            break
        intent = calls.intent_doc(here.site, name=name, lease=here.lease, args_digest=digest,
                                  args=value, idempotent=_idempotent, at=runs.now())  # fmt: skip
        if await run(log.intend, intent, here.lease):
            return await _make_async(run, log, here, name, fn, args, kwargs, _idempotent)
    if doc is None:
        raise _contended(here, name)
    if _divergent(here, name, doc, digest):
        await run(log.diverged, here.site, digest, here.lease)
    if decision == "replay":
        return _result_value(here, doc)  # type: ignore[no-any-return]
    if decision == "retry":
        await run(log.retrying, here.site, here.lease)
        return await _make_async(run, log, here, name, fn, args, kwargs, _idempotent, _key_of(doc))
    if doc.get("status") != calls.PARKED:
        await run(log.park, here.site, name, "intent without result; not idempotent", here.lease)
    raise _parked(here, name, doc)


async def _make_async(
    run: Callable[..., Awaitable[Any]],
    log: Any,
    here: _Here,
    name: str,
    fn: Callable[..., Awaitable[R]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    idempotent: bool,
    key: str | None = None,
) -> R:
    call_kwargs = _with_key(fn, kwargs, key or here.site.key) if idempotent else kwargs
    try:
        result = await fn(*args, **call_kwargs)
    except GraphBubbleUp:  # interrupt(), a Command to the parent: not a failure
        await run(log.withdraw, here.site, here.lease)
        raise
    except Exception as exc:
        await run(log.failed, here.site, f"{type(exc).__name__}: {exc}", here.lease)
        raise
    await run(log.finish, here.site, _serialized(here, name, result), here.lease)
    return result


# --- the decorator ------------------------------------------------------------------------


@overload
def recorded(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def recorded(
    *, name: str | None = None, idempotent: bool = False
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def recorded(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    idempotent: bool = False,
) -> Any:
    """Make every call of ``fn`` (sync or async) a recorded call (module docstring).

    ``name``: the call's name in its record and errors (default ``fn.__qualname__``).
    ``idempotent``: the provider dedupes on the key it is given (``fn`` gets it as the
    keyword argument ``idempotency_key`` when it takes one), so a call whose process died
    mid-call is made again with the same key; otherwise such a call is parked and raises
    :class:`~accord.errors.NeedsReconciliation`.
    """

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        label = name or getattr(func, "__qualname__", repr(func))
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await arecorded_call(
                    func, *args, _name=label, _idempotent=idempotent, **kwargs
                )  # type: ignore[arg-type]

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return recorded_call(func, *args, _name=label, _idempotent=idempotent, **kwargs)

        return wrapper

    return wrap(fn) if fn is not None else wrap


# --- settling parked calls -----------------------------------------------------------------


def resolve_call(
    saver: Any, thread_id: str, key: str, result: Any, *, by: str, tenant_id: str | None = None
) -> None:
    """Settle the unsettled call ``key`` of ``thread_id`` with the ``result`` it had (a
    human checked with the provider): the next execution of its task replays ``result``
    instead of raising :class:`~accord.errors.NeedsReconciliation`. ``by`` names who
    settled it (recorded). On an :class:`~accord.checkpointers.AccordSaver`."""
    log = _log_of(saver)
    if isinstance(log, AsyncCallLog):
        raise ConfigurationError("resolve_call needs AccordSaver; use aresolve_call")
    log.setup()
    tenant = saver.tenant_named(tenant_id)
    log.resolve(tenant, thread_id, key, _encoded(saver, result), by=by)


async def aresolve_call(
    saver: Any, thread_id: str, key: str, result: Any, *, by: str, tenant_id: str | None = None
) -> None:
    """:func:`resolve_call` on an :class:`~accord.checkpointers.AsyncAccordSaver`."""
    log = _log_of(saver)
    if not isinstance(log, AsyncCallLog):
        raise ConfigurationError("aresolve_call needs AsyncAccordSaver; use resolve_call")
    await log.setup()
    tenant = saver.tenant_named(tenant_id)
    await log.resolve(tenant, thread_id, key, _encoded(saver, result), by=by)


def unsettled_calls(
    saver: Any, *, tenant_id: str | None = None, thread_id: str | None = None
) -> list[dict[str, Any]]:
    """The calls whose effect is unknown (intent without result, raised, parked) of a
    tenant (default the saver's), oldest first, without their arguments and results. On
    an :class:`~accord.checkpointers.AccordSaver`."""
    log = _log_of(saver)
    if isinstance(log, AsyncCallLog):
        raise ConfigurationError("unsettled_calls needs AccordSaver")
    log.setup()
    found: list[dict[str, Any]] = log.unsettled(saver.tenant_named(tenant_id), thread_id=thread_id)
    return found


def _encoded(saver: Any, value: Any) -> dict[str, Any]:
    kind, data = saver.serde.dumps_typed(value)
    return {"type": kind, "data": data}
