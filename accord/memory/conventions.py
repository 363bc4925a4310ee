"""What the sync and async BaseStore twins do differently (not generated).

The async store (``AsyncAccordStore``) serves sync calls (``store.get(...)`` from sync code,
or a sync node in a thread) on the event loop it serves, from other threads; on that loop's
own thread, or before it ran on any loop, through a sync twin on a client of its own. The
sync store (``AccordStore``) serves async calls by running its batch in a worker thread. Each runs its TTL sweeper its
own way: a daemon thread for the sync store, an asyncio task for the async one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from langgraph.store.base import Op, Result

from accord.errors import InvalidInputError

log = logging.getLogger("accord.memory.store")
DEFAULT_SWEEP_MINUTES = 5.0


def _interval(store: Any, minutes: float | None) -> float:
    return float(minutes or (store.ttl_config or {}).get("sweep_interval_minutes")
                 or DEFAULT_SWEEP_MINUTES)  # fmt: skip


class RunTenants:
    """Which tenant a store call serves: the run's, when the call is made in a run (a
    node's ``get_store()``; LangGraph's config context variable, which the checkpointer
    reads the same key from), else the store's own. A store pinned to a tenant refuses a
    run of another one. One service view per tenant, sharing the store's client,
    embedder and unit of work."""

    def __init__(self, own: Any, *, pinned: bool) -> None:
        self.own = own
        self.pinned = pinned
        self._views: dict[str, Any] = {}

    def current(self) -> Any:
        tenant = run_tenant()
        if tenant is None or tenant == self.own.tenant_id:
            return self.own
        if self.pinned:
            raise InvalidInputError(
                f"this store serves tenant {self.own.tenant_id!r} only, and the run's config "
                f"names tenant {tenant!r}: build the store without tenant_id= to serve each "
                f"run's tenant, or one store per tenant"
            )
        view = self._views.get(tenant)
        if view is None:
            view = self._views[tenant] = self.own.for_tenant(tenant)
        return view


def run_tenant() -> str | None:
    """The tenant of the LangGraph run this code runs in (``configurable.tenant_id``), or
    None outside runs or when the run names none."""
    from langgraph.config import get_config

    try:
        config = get_config()
    except RuntimeError:  # not in a runnable context
        return None
    tenant = (config.get("configurable") or {}).get("tenant_id")
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not tenant:
        raise InvalidInputError(
            f"configurable tenant_id must be a non-empty string, got {tenant!r}"
        )
    return tenant


class ServesSyncCalls:
    """Mixin for the async store: sync ``batch`` and an asyncio TTL sweeper."""

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Sync calls on the async store: from another thread, run on the event loop the
        store serves (its client is bound to it), as LangGraph's AsyncPostgresStore does.
        On that loop's own thread (which they block), and before the store has run on
        any loop, they are served by a sync twin on a client of its own (for stores
        given ``conn_string``, as ``from_conn_string`` does)."""
        store: Any = self
        loop = store.loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                future = asyncio.run_coroutine_threadsafe(store.abatch(list(ops)), loop)
                return future.result()  # type: ignore[no-any-return]
        return self._sync_twin().batch(ops)  # type: ignore[no-any-return]

    def _sync_twin(self) -> Any:
        twin = getattr(self, "_twin", None)
        if twin is None:
            from pymongo import MongoClient

            from accord.memory.synchronous.service import MemoryService
            from accord.memory.synchronous.store import AccordStore

            store: Any = self
            if store.conn_string is None:
                raise InvalidInputError(
                    "this AsyncAccordStore cannot serve sync calls: create it with "
                    "from_conn_string() or pass conn_string=, or use the async methods"
                )
            client: MongoClient[Any] = MongoClient(store.conn_string)
            own = store.own_service
            service = MemoryService(
                client, tenant_id=own.tenant_id, db_name=own.db_name,
                embedder=own.embedder, dims=own.dims,
            )  # fmt: skip
            twin = AccordStore(client, index=store.index_config, ttl=store.ttl_config,
                               service=service,
                               tenant_id=own.tenant_id if store.pinned else None)  # fmt: skip
            store._twin = twin
        return twin

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> asyncio.Task[None]:
        """Sweep expired items every ``sweep_interval_minutes`` (default
        ``ttl.sweep_interval_minutes`` or 5) in a task on the running loop."""
        store: Any = self
        interval = _interval(store, sweep_interval_minutes)
        if store._sweeper is not None and not store._sweeper.done():
            return store._sweeper  # type: ignore[no-any-return]

        async def loop() -> None:
            while True:
                try:
                    removed = await store.sweep_ttl()
                    if removed:
                        log.info("TTL sweep removed %d expired memories", removed)
                except Exception:  # keep sweeping; the next round retries
                    log.exception("TTL sweep failed")
                await asyncio.sleep(interval * 60)

        store._sweeper = asyncio.ensure_future(loop())
        return store._sweeper  # type: ignore[no-any-return]

    def stop_ttl_sweeper(self) -> None:
        store: Any = self
        if store._sweeper is not None:
            store._sweeper.cancel()
            store._sweeper = None
        twin = getattr(self, "_twin", None)
        if twin is not None:
            with suppress(Exception):
                twin.client.close()
            store._twin = None


class ServesAsyncCalls:
    """Mixin for the sync store: async ``abatch`` in a thread, a thread TTL sweeper."""

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async calls on the sync store run the sync batch in a worker thread."""
        store: Any = self
        # to_thread copies the context: the batch serves the run's tenant (RunTenants)
        return await asyncio.to_thread(store.batch, list(ops))  # type: ignore[no-any-return]

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> threading.Thread:
        """Sweep expired items every ``sweep_interval_minutes`` (default
        ``ttl.sweep_interval_minutes`` or 5) in a daemon thread."""
        store: Any = self
        interval = _interval(store, sweep_interval_minutes)
        if store._sweeper is not None and store._sweeper.is_alive():
            return store._sweeper  # type: ignore[no-any-return]
        stop = store._sweep_stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    removed = store.sweep_ttl()
                    if removed:
                        log.info("TTL sweep removed %d expired memories", removed)
                except Exception:  # keep sweeping; the next round retries
                    log.exception("TTL sweep failed")
                stop.wait(interval * 60)

        store._sweeper = threading.Thread(target=loop, name="accord-ttl-sweeper", daemon=True)
        store._sweeper.start()
        return store._sweeper  # type: ignore[no-any-return]

    def stop_ttl_sweeper(self, timeout: float | None = None) -> None:
        store: Any = self
        if store._sweeper is not None:
            store._sweep_stop.set()
            store._sweeper.join(timeout)
            store._sweeper = None
