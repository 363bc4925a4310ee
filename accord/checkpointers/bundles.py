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
before the pin moves on. The recorded calls of the tasks paused under it are carried over
to the tasks LangGraph runs again from the new checkpoint; a process that dies between the
update and the carry leaves checkpoints marked as a migration's (:data:`MIGRATION_KEY`),
and the next prepare, whatever it does, carries the calls from behind them again.

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
import secrets
from collections.abc import AsyncIterator, Iterator
from types import CodeType
from typing import Any, Literal, cast

from accord.checkpointers.recorded import call_log
from accord.errors import ConfigurationError
from accord.platform import bundles, calls, runs
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


def _checkpoint_id(snapshot: Any) -> str:
    return str(snapshot.config["configurable"]["checkpoint_id"])


#: The metadata key marking a checkpoint written by a migration's state update (its
#: value: the step, ``"v1->v2"``). A thread whose latest checkpoints carry it was
#: migrated, and the calls of the checkpoints behind them are carried to it again
#: (idempotent) until the thread moves on: a process that died between a migration's
#: update and its carry-over left the calls behind.
MIGRATION_KEY = "accord_migration"

#: At most this many migration checkpoints walked back (a chain of crashed migrations).
MIGRATIONS_WALKED = 32


def _migrated_from(snapshot: Any) -> str | None:
    """The checkpoint ``snapshot`` migrated (its parent), when it is a migration's."""
    metadata = getattr(snapshot, "metadata", None) or {}
    if not metadata.get(MIGRATION_KEY) or metadata.get("source") != "update":
        return None
    parent = (getattr(snapshot, "parent_config", None) or {}).get("configurable") or {}
    found = parent.get("checkpoint_id")
    return str(found) if found else None


def _at_checkpoint(config: Any, checkpoint_id: str) -> Any:
    """``config`` (its tenant, thread and namespace) at checkpoint ``checkpoint_id``."""
    configurable = {**(config.get("configurable") or {}), "checkpoint_id": checkpoint_id}
    return {**config, "configurable": configurable}


def _carried(held: list[tuple[Any, list[Any]]], after: Any) -> list[dict[str, Any]]:
    """The recorded calls of the tasks due at the checkpoints of ``held`` (pairs of a
    checkpoint a migration updated and its calls, nearest first), moved to the same
    tasks at ``after`` (the migration's checkpoint, where LangGraph runs them again
    under new ids): the resumed task replays them. A task is the same when its node and
    path are. A call found at several of them (carried before) is taken from the nearest,
    whose record is the latest (retried, settled); a call already at ``after`` is left."""
    new = {(t.name, tuple(t.path)): t.id for t in after.tasks}
    checkpoint_id = _checkpoint_id(after)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for before, docs in held:
        old = {t.id: (t.name, tuple(t.path)) for t in before.tasks}
        for doc in docs:
            task_id = new.get(old.get(doc["task_id"], ("", ())))
            ns = str(doc["checkpoint_ns"])
            if task_id is None or not ns.endswith(":" + doc["task_id"]):
                continue  # the task is no longer due after the migration
            new_ns = ns[: -len(doc["task_id"])] + task_id
            copy = calls.carried(doc, checkpoint_ns=new_ns, checkpoint_id=checkpoint_id,
                                 task_id=task_id)  # fmt: skip
            if copy["_id"] in seen or copy["_id"] == doc["_id"]:
                continue
            seen.add(copy["_id"])
            out.append(copy)
    return out


def _migration_config(config: Any, before: Any, step: str) -> Any:
    """``config`` for a migration's state update ``step`` (``"v1->v2"``, recorded in the
    checkpoint's metadata as :data:`MIGRATION_KEY`): the checkpoints they write are the
    work of the run that wrote the checkpoint they migrate (its metadata's ``run_id``),
    not of the run about to start. A queue worker passes its run's id as LangGraph's
    ``run_id`` and takes a latest checkpoint of that run for the run's own progress
    (it continues from it without the input): a migration checkpoint marked as the new
    run's, left by a worker that died before its input was saved, made the next worker
    skip the input (the run ended without running it)."""
    writer = (getattr(before, "metadata", None) or {}).get("run_id")
    metadata = {k: v for k, v in (config.get("metadata") or {}).items() if k != "run_id"}
    if writer is not None:
        metadata["run_id"] = writer
    metadata[MIGRATION_KEY] = step
    configurable = {k: v for k, v in (config.get("configurable") or {}).items() if k != "run_id"}
    return {**config, "configurable": configurable, "metadata": metadata}


def _subgraph_in_flight(thread: str, pinned: Bundle, current: Bundle, node: str) -> Any:
    error = bundles.mismatch(thread, pinned, current)
    error.args = (
        f"{error}; besides, node {node!r} of the paused step made recorded calls inside a "
        f"subgraph, which a migration cannot carry over: resume the step on bundle "
        f"{pinned.version!r} first, or pass an Override.",
    )
    return error


def _mover() -> str:
    """The run id of a pin's move (it holds the thread for an instant)."""
    return f"accord-bundle-{secrets.token_hex(8)}"


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
            self._finish_carry(config, tenant, thread)
            return "same"
        if override is None:
            route = self._route(thread, pinned)
        # a pin moves (and state migrates) only while no run holds the thread: a run
        # that died (its worker was killed) is taken over here, as its next run would
        self.saver.leases.release(self.saver.leases.claim(tenant, thread, _mover()))
        if override is not None:
            self._finish_carry(config, tenant, thread)
            entry = bundles.history_entry("override", at=at, old=pinned, new=self.bundle,
                                          by=override.by, reason=override.reason)  # fmt: skip
            self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
            return "override"
        before = self.graph.get_state(config)
        log = call_log(self.saver)
        log.setup()
        held = self._held(log, tenant, thread, self._behind(config, before), pinned)
        for step_from, step_to, migrate in route:
            updates = migrate(dict(self.graph.get_state(config).values))
            if updates:
                step = _migration_config(config, before, f"{step_from}->{step_to}")
                self.graph.update_state(step, dict(updates))
        log.carry(tenant, thread, _carried(held, self.graph.get_state(config)))
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
            await self._afinish_carry(config, tenant, thread)
            return "same"
        if override is None:
            route = self._route(thread, pinned)
        leases = self.saver.leases
        await leases.release(await leases.claim(tenant, thread, _mover()))
        if override is not None:
            await self._afinish_carry(config, tenant, thread)
            entry = bundles.history_entry("override", at=at, old=pinned, new=self.bundle,
                                          by=override.by, reason=override.reason)  # fmt: skip
            await self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
            return "override"
        before = await self.graph.aget_state(config)
        log = call_log(self.saver)
        await log.setup()
        held = await self._aheld(log, tenant, thread, await self._abehind(config, before), pinned)
        for step_from, step_to, migrate in route:
            updates = migrate(dict((await self.graph.aget_state(config)).values))
            if updates:
                step = _migration_config(config, before, f"{step_from}->{step_to}")
                await self.graph.aupdate_state(step, dict(updates))
        after = await self.graph.aget_state(config)
        await log.carry(tenant, thread, _carried(held, after))
        entry = bundles.history_entry("migrated", at=runs.now(), old=pinned, new=self.bundle,
                                      steps=[f"{a}->{b}" for a, b, _ in route])  # fmt: skip
        await self.pins.pin(tenant, thread, self.bundle, entry, expected=pinned.digest)
        return "migrated"

    # --- the carry-over of recorded calls, crash-safe ------------------------------------
    #
    # A migration's state updates and the carry-over of the paused tasks' calls are
    # separate transactions (LangGraph commits the updates; the new task ids exist only
    # once they are). A process that dies between them leaves the thread at migration
    # checkpoints (metadata MIGRATION_KEY) with no calls: the next prepare walks back
    # from the thread's latest checkpoint through them to the checkpoints behind and
    # carries those calls again (insert-once: a carry that was made changes nothing),
    # whether it migrates again (a worker on the new bundle), runs the thread on its
    # pin (the old bundle) or overrides it.

    def _behind(self, config: Any, snapshot: Any) -> list[Any]:
        """``snapshot`` and, while it is a migration's checkpoint, the ones behind it."""
        chain = [snapshot]
        for _ in range(MIGRATIONS_WALKED):
            parent = _migrated_from(chain[-1])
            if parent is None:
                break
            chain.append(self.graph.get_state(_at_checkpoint(config, parent)))
        return chain

    def _held(
        self, log: Any, tenant: str, thread: str, chain: list[Any], pinned: Bundle | None = None
    ) -> list[tuple[Any, list[Any]]]:
        """The recorded calls of each checkpoint of ``chain``; with ``pinned`` (a
        migration is about to run), refused when a due task made calls in a subgraph."""
        held = []
        for snapshot in chain:
            for task in snapshot.tasks if pinned is not None else ():
                if log.nested(tenant, thread, f"{task.name}:{task.id}"):
                    raise _subgraph_in_flight(thread, cast(Bundle, pinned), self.bundle, task.name)
            held.append((snapshot, log.of_checkpoint(tenant, thread, _checkpoint_id(snapshot))))
        return held

    def _finish_carry(self, config: Any, tenant: str, thread: str) -> None:
        """Before a run that does not migrate: when the checkpoint it runs from is a
        migration's (one read tells), carry the calls behind it over to it again."""
        found = self.saver.get_tuple(config)
        if found is None or _migrated_from(found) is None:
            return
        latest = self.graph.get_state(config)
        log = call_log(self.saver)
        log.setup()
        held = self._held(log, tenant, thread, self._behind(config, latest))
        log.carry(tenant, thread, _carried(held, latest))

    async def _abehind(self, config: Any, snapshot: Any) -> list[Any]:
        """:meth:`_behind` for an async saver."""
        chain = [snapshot]
        for _ in range(MIGRATIONS_WALKED):
            parent = _migrated_from(chain[-1])
            if parent is None:
                break
            chain.append(await self.graph.aget_state(_at_checkpoint(config, parent)))
        return chain

    async def _aheld(
        self, log: Any, tenant: str, thread: str, chain: list[Any], pinned: Bundle | None = None
    ) -> list[tuple[Any, list[Any]]]:
        """:meth:`_held` for an async saver."""
        held = []
        for snapshot in chain:
            for task in snapshot.tasks if pinned is not None else ():
                if await log.nested(tenant, thread, f"{task.name}:{task.id}"):
                    raise _subgraph_in_flight(thread, cast(Bundle, pinned), self.bundle, task.name)
            docs = await log.of_checkpoint(tenant, thread, _checkpoint_id(snapshot))
            held.append((snapshot, docs))
        return held

    async def _afinish_carry(self, config: Any, tenant: str, thread: str) -> None:
        """:meth:`_finish_carry` for an async saver."""
        found = await self.saver.aget_tuple(config)
        if found is None or _migrated_from(found) is None:
            return
        latest = await self.graph.aget_state(config)
        log = call_log(self.saver)
        await log.setup()
        held = await self._aheld(log, tenant, thread, await self._abehind(config, latest))
        await log.carry(tenant, thread, _carried(held, latest))

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
