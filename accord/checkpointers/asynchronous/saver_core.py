"""The checkpointer's core: its client, its kernel (unit of work), its runs service, setup,
and its reads through the kernel.

The saver is one class made of layers, one module each, every layer using the ones below
it: this core; the run lifecycle (:mod:`.saver_runs`); reads and the fast-step cache
(:mod:`.saver_reads`); "async" durability's queue of saves (:mod:`.saver_queue`); writes
(:mod:`.saver_writes`); maintenance (:mod:`.saver_maintenance`); and the public class
(:mod:`.saver`).

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver_core.py`` is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Mapping
from typing import Any

import pymongo
from langgraph.checkpoint.serde.base import SerializerProtocol
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from accord.checkpointers import bridges, failures, schema
from accord.checkpointers.asynchronous import layout_check
from accord.checkpointers.asynchronous.outbox_gate import AsyncOutboxGate
from accord.checkpointers.base import AccordBase
from accord.errors import DatabaseError
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.asynchronous.leases import AsyncRunLeases
from accord.platform.asynchronous.reachability import ensure_reachable
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork
from accord.platform.tickers import LoopTicker, ThreadTicker

_IS_SYNC = False

logger = logging.getLogger("accord.checkpointers")

_Ticker = ThreadTicker if _IS_SYNC else LoopTicker

#: Cursor batch size of hydration reads: one round trip per query up to 16 MB of results.
_BATCH = 10_000
#: Driver sessions created at setup (see ``_warm_sessions``).
_WARM_SESSIONS = 4


class AsyncSaverCore(AccordBase):
    """The saver's client, kernel, runs service, setup and reads (see the module docstring;
    keyword arguments: :class:`~accord.checkpointers.base.AccordBase`)."""

    def __init__(
        self,
        client: AsyncMongoClient[Any],
        db_name: str = "accord",
        checkpoint_collection_name: str | None = None,
        writes_collection_name: str | None = None,
        ttl: int | float | None = None,
        serde: SerializerProtocol | None = None,
        *,
        uow: AsyncUnitOfWork | None = None,
        **kwargs: Any,
    ) -> None:
        # positional arguments in MongoDBSaver's order, so a call written for it works
        super().__init__(
            db_name=db_name,
            checkpoint_collection_name=checkpoint_collection_name,
            writes_collection_name=writes_collection_name,
            ttl=ttl,
            serde=serde,
            **kwargs,
        )
        self.client = client
        self.db = client[self.db_name]
        if uow is None:  # the drop-in form: the runtime's kernel, with its hooks
            from accord import runtime

            uow = runtime.kernel(client, client_bulk=self._client_bulk)
        self.uow = uow if uow.timeout == self.timeout else uow.with_timeout(self.timeout)
        self._artifacts = self.collections.artifacts()
        self.leases = AsyncRunLeases(
            self.uow, self.db_name, self.collections.runs, lease_seconds=self.lease_seconds
        )
        self.loop = bridges.running_loop()
        # outbox events only when something consumes them (outbox_gate)
        self.outbox_gate = AsyncOutboxGate(self.db, self.collections.outbox, self._outbox_events)
        self._setup_done = False
        self._setup_lock = bridges.new_async_lock()
        # with ttl, sweeps expired threads every ttl/2 (5 s to a minute)
        self._sweeper = _Ticker(
            lambda: self._sweep_now_and_then(),
            min(max((self.ttl or 0) / 2, 5.0), 60.0),
            lambda: self.ttl is not None,
            "accord-sweep",
        )

    async def setup(self) -> None:
        """Create the collections and indexes and record them in the catalog (idempotent,
        safe when several processes set up at once).

        Raises:
            ForeignDataError: another saver's documents are in a collection this saver
                would write, or MongoDBSaver threads beside it were not migrated (with
                ``unmigrated="refuse"``); nothing was written.
        """
        self._capture_loop()
        await self._ensure_layout(force=True)
        names = self.collections
        indexes = {
            getattr(names, key): models for key, models in schema.index_models(names).items()
        }
        try:
            # bounded like every call (the catalog's own collection listing has no bound)
            with pymongo.timeout(self.timeout):
                await AsyncCatalog(self.uow, self.db_name).setup(
                    "checkpointer", names.owned(), indexes
                )
                await self._refresh_reserved()
                await self.outbox_gate.refresh(force=True)
                await self._warm_sessions()
        except PyMongoError as exc:
            raise failures.read_failed(exc, self.db_name, self.timeout) from exc
        self._setup_done = True
        if self.ttl is not None:
            self._sweeper.ensure()  # sweeps expired threads

    async def _ensure_layout(self, *, force: bool = False) -> None:
        """Resolve the collection names and refuse another saver's data (once, before the
        first read or write; accord.checkpointers.layout)."""
        if self._layout_done and not force:
            return
        await ensure_reachable(self.client, self.timeout)
        try:
            with pymongo.timeout(self.timeout):
                names = await layout_check.check(
                    self.uow, self.db, self.collections, unmigrated=self.unmigrated
                )
        except PyMongoError as exc:
            raise failures.read_failed(exc, self.db_name, self.timeout) from exc
        self._use_collections(names)

    def _use_collections(self, names: schema.CollectionNames) -> None:
        super()._use_collections(names)
        # what addresses the collections by name follows
        self._artifacts = self.collections.artifacts()
        self.leases.collection = self.collections.runs
        self.outbox_gate.collection = self.collections.outbox

    async def _warm_sessions(self) -> None:
        """Fill the driver's session pool now: pymongo names every new server session
        with ``uuid.uuid4()``, and an application (or LangGraph's tests) that makes uuid4
        deterministic must see the same sequence with this saver as without it."""
        sessions = [self.client.start_session() for _ in range(_WARM_SESSIONS)]
        try:
            for session in sessions:
                await self.client.admin.command("ping", session=session)
        finally:
            for session in sessions:
                await session.end_session()

    async def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        async with self._setup_lock:
            if not self._setup_done:
                await self.setup()

    async def _refresh_reserved(self) -> None:
        catalog = AsyncCatalog(self.uow, self.business_db)
        self._set_reserved(await catalog.reserved())

    def _capture_loop(self) -> None:
        if not _IS_SYNC and self.loop is None:
            self.loop = bridges.running_loop()

    async def _find_one(self, collection: str, filt: Mapping[str, Any], **kwargs: Any) -> Any:
        found = await self._find_all(collection, filt, limit=1, **kwargs)
        return found[0] if found else None

    async def _find_all(
        self, collection: str, filt: Mapping[str, Any], **kwargs: Any
    ) -> builtins.list[Any]:
        """A read of one of the saver's collections, through the kernel (its read hooks
        see the tenant and thread the filter names)."""
        try:
            return await self.uow.find(
                self._read_context(filt), self._artifacts[collection], self.db_name,
                collection, filt, batch_size=_BATCH, **kwargs,
            )  # fmt: skip
        except DatabaseError as exc:
            raise failures.read_failed(exc.__cause__ or exc, collection, self.timeout) from exc

    async def _sweep_now_and_then(self) -> None:
        """The sweeper's tick (with ``ttl``)."""
        if self.ttl is not None:
            await self.asweep()

    async def asweep(self) -> int:  # the maintenance layer's
        raise NotImplementedError
