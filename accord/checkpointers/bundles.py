"""Runs pinned to their bundle, for LangGraph graphs (docs/durable-execution.md).

::

    from accord.checkpointers.bundles import PinnedGraph, fingerprint
    from accord.platform.bundles import Bundle, Migrations, Override

    graph = builder.compile(checkpointer=saver)
    bundle = Bundle("v2", code=fingerprint(graph), prompts={"system": SYSTEM_PROMPT},
                    models={"chat": "claude-sonnet-4-5"})
    migrations = Migrations()

    @migrations.register("v1", "v2")
    def split_name(values):
        first, _, last = values["name"].partition(" ")
        return {"first": first, "last": last}

    app = PinnedGraph(graph, bundle, migrations=migrations)
    app.invoke(None, config)     # BundleMismatch if the thread is pinned to another
                                 # bundle with no migration to this one
    app.invoke(None, config, override=Override("CVE fix", by="user:ops"))

A thread is pinned to the bundle of its first run (on the thread's run-registry
document, :mod:`accord.platform.bundles`); every run through :class:`PinnedGraph` checks
the pin first. A migration is applied as a LangGraph state update
(``graph.update_state``), so it writes a new checkpoint (the history keeps the old one)
before the pin moves on.

:func:`fingerprint` digests what a compiled graph is made of: its nodes, edges and
branches, and the code of each node's and branch's function (bytecode, constants and
names, not file names or line numbers: moving code does not change it). It does not see
code a node calls (a tool, a prompt loaded at run time): declare those in the bundle.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import AsyncIterator, Iterator
from types import CodeType
from typing import Any, Literal, cast

from accord.errors import ConfigurationError
from accord.platform import bundles, runs
from accord.platform.asynchronous.bundle_pins import AsyncBundlePins
from accord.platform.bundles import Bundle, Migrations, Override
from accord.platform.synchronous.bundle_pins import BundlePins

__all__ = ["PinnedGraph", "fingerprint"]

Outcome = Literal["same", "pinned", "migrated", "override"]


# --- fingerprints ---------------------------------------------------------------------


def _code_parts(code: CodeType) -> list[Any]:
    consts = [_code_parts(c) if isinstance(c, CodeType) else repr(c) for c in code.co_consts]
    return [code.co_name, code.co_code.hex(), consts, list(code.co_names)]


def _callable_digest(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: the code of its class's call method
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    if code is None:
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    return _code_parts(code)


def _runnable_digest(runnable: Any) -> Any:
    if hasattr(runnable, "builder") and hasattr(runnable, "get_graph"):
        return {"subgraph": fingerprint(runnable)}
    for attr in ("func", "afunc"):
        fn = getattr(runnable, attr, None)
        if fn is not None:
            return _callable_digest(fn)
    return f"{type(runnable).__module__}.{type(runnable).__qualname__}"


def fingerprint(graph: Any) -> str:
    """A digest of a compiled LangGraph ``StateGraph`` (module docstring): ``graph:`` +
    16 hex digits. Equal for two compilations of the same code; different when a node,
    an edge, a branch or a node's function changes."""
    builder = getattr(graph, "builder", None)
    if builder is None or not hasattr(builder, "nodes"):
        raise ConfigurationError(
            f"fingerprint needs a compiled StateGraph (graph.builder), got {type(graph).__name__}"
        )
    parts: dict[str, Any] = {
        "nodes": {name: _runnable_digest(spec.runnable) for name, spec in builder.nodes.items()},
        "edges": sorted([list(e) for e in getattr(builder, "edges", set())]),
        "waiting": sorted(
            [sorted(starts), end] for starts, end in getattr(builder, "waiting_edges", set())
        ),
        "branches": {
            f"{start}:{name}": [_callable_digest(branch.path),
                                sorted((branch.ends or {}).items()) if branch.ends else None]
            for start, named in getattr(builder, "branches", {}).items()
            for name, branch in named.items()
        },
    }  # fmt: skip
    raw = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=repr)
    return "graph:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


# --- pinned runs ------------------------------------------------------------------------


class PinnedGraph:
    """A compiled graph whose runs are pinned to ``bundle`` (module docstring).

    ``invoke``/``stream`` (and ``ainvoke``/``astream``) check the thread's pin first
    (:meth:`prepare`), then run the graph as it is; anything else is the graph's own
    (``get_state``...). ``override``: an :class:`~accord.platform.bundles.Override` to
    move a thread pinned to another bundle to this one without a migration (recorded).
    """

    def __init__(self, graph: Any, bundle: Bundle, *, migrations: Migrations | None = None):
        from accord.checkpointers.base import AccordBase

        saver = getattr(graph, "checkpointer", None)
        if not isinstance(saver, AccordBase):
            raise ConfigurationError(
                "PinnedGraph needs a graph compiled with accord's AccordSaver / "
                "AsyncAccordSaver: the pin lives beside the thread's run registry."
            )
        self.graph = graph
        self.bundle = bundle
        self.migrations = migrations or Migrations()
        self.saver: Any = saver
        from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork

        uow = cast(Any, saver).uow  # both savers have one; AccordBase does not declare it
        kind = AsyncBundlePins if isinstance(uow, AsyncUnitOfWork) else BundlePins
        self.pins: Any = kind(uow, saver.db_name, runs_collection=saver.collections.runs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)

    def _where(self, config: Any) -> tuple[str, str]:
        conf = (config or {}).get("configurable") or {}
        thread = conf.get("thread_id")
        if not isinstance(thread, str) or not thread:
            raise ConfigurationError("a pinned run needs config['configurable']['thread_id']")
        return self.saver.tenant_of(config), thread

    def _route(self, thread: str, pinned: Bundle) -> list[tuple[str, str, Any]]:
        route = self.migrations.path(pinned.version, self.bundle.version)
        if not route:
            raise bundles.mismatch(thread, pinned, self.bundle)
        return route

    def prepare(self, config: Any, *, override: Override | None = None) -> Outcome:
        """Check (and pin, migrate or override) the thread of ``config`` against this
        bundle; raise :class:`~accord.errors.BundleMismatch` when it may not run."""
        if isinstance(self.pins, AsyncBundlePins):
            raise ConfigurationError("the graph's saver is async: use ainvoke / aprepare")
        tenant, thread = self._where(config)
        pinned, _ = self.pins.get(tenant, thread)
        at = runs.now()
        if pinned is None:
            entry = bundles.history_entry("pinned", at=at, old=None, new=self.bundle)
            self.pins.pin(tenant, thread, self.bundle, entry, expected=None)
            return "pinned"
        if pinned.digest == self.bundle.digest:
            return "same"
        if override is not None:
            entry = bundles.history_entry("override", at=at, old=pinned, new=self.bundle,
                                          by=override.by, reason=override.reason)  # fmt: skip
            self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
            return "override"
        route = self._route(thread, pinned)
        for _, _, migrate in route:
            updates = migrate(dict(self.graph.get_state(config).values))
            if updates:
                self.graph.update_state(config, dict(updates))
        entry = bundles.history_entry("migrated", at=runs.now(), old=pinned, new=self.bundle,
                                      steps=[f"{a}->{b}" for a, b, _ in route])  # fmt: skip
        self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
        return "migrated"

    async def aprepare(self, config: Any, *, override: Override | None = None) -> Outcome:
        """:meth:`prepare` for an async saver."""
        if not isinstance(self.pins, AsyncBundlePins):
            return self.prepare(config, override=override)
        tenant, thread = self._where(config)
        pinned, _ = await self.pins.get(tenant, thread)
        at = runs.now()
        if pinned is None:
            entry = bundles.history_entry("pinned", at=at, old=None, new=self.bundle)
            await self.pins.pin(tenant, thread, self.bundle, entry, expected=None)
            return "pinned"
        if pinned.digest == self.bundle.digest:
            return "same"
        if override is not None:
            entry = bundles.history_entry("override", at=at, old=pinned, new=self.bundle,
                                          by=override.by, reason=override.reason)  # fmt: skip
            await self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
            return "override"
        route = self._route(thread, pinned)
        for _, _, migrate in route:
            updates = migrate(dict((await self.graph.aget_state(config)).values))
            if updates:
                await self.graph.aupdate_state(config, dict(updates))
        entry = bundles.history_entry("migrated", at=runs.now(), old=pinned, new=self.bundle,
                                      steps=[f"{a}->{b}" for a, b, _ in route])  # fmt: skip
        await self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
        return "migrated"

    def history(self, config: Any) -> list[Any]:
        """The thread's pins, migrations and overrides, oldest first."""
        tenant, thread = self._where(config)
        return list(self.pins.get(tenant, thread)[1])

    def invoke(
        self, input: Any, config: Any, *, override: Override | None = None, **kwargs: Any
    ) -> Any:
        self.prepare(config, override=override)
        return self.graph.invoke(input, config, **kwargs)

    def stream(
        self, input: Any, config: Any, *, override: Override | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        self.prepare(config, override=override)
        yield from self.graph.stream(input, config, **kwargs)

    async def ainvoke(
        self, input: Any, config: Any, *, override: Override | None = None, **kwargs: Any
    ) -> Any:
        await self.aprepare(config, override=override)
        return await self.graph.ainvoke(input, config, **kwargs)

    async def astream(
        self, input: Any, config: Any, *, override: Override | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        await self.aprepare(config, override=override)
        async for chunk in self.graph.astream(input, config, **kwargs):
            yield chunk
