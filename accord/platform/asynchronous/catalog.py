"""Setting up a component's collections and recording them in the catalog.

Every component (checkpointer, memory store, aggregator, governance) calls
:meth:`AsyncCatalog.setup` once: it creates the component's collections and indexes,
safely when several processes do it at the same time (a racing ``create`` that finds the
collection made by another is fine), and records the collections in the database's
``accord_catalog`` through the unit of work. :meth:`AsyncCatalog.reserved` reads back
every collection accord owns in the database, whichever component or application
configured its name, so tenant input can never target one.

This module is the async source; its sync twin is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pymongo import IndexModel
from pymongo.errors import CollectionInvalid, OperationFailure, PyMongoError

from accord.errors import ConfigurationError
from accord.platform import codes, write_errors
from accord.platform.artifacts import CATALOG_COLLECTION, catalog_plan, reserved_names
from accord.platform.asynchronous.reachability import ensure_reachable
from accord.platform.asynchronous.unit_of_work import AsyncUnitOfWork

_IS_SYNC = False

#: Index build conflicts: an index of that name or those keys exists with other options.
_INDEX_CONFLICTS = frozenset({codes.INDEX_OPTIONS_CONFLICT, codes.INDEX_KEY_SPECS_CONFLICT})


class AsyncCatalog:
    """The collections accord owns in database ``db_name``."""

    def __init__(self, uow: AsyncUnitOfWork, db_name: str) -> None:
        self.uow = uow
        self.db_name = db_name

    async def setup(
        self,
        component: str,
        owned: Mapping[str, str],
        indexes: Mapping[str, Sequence[IndexModel]] | None = None,
    ) -> None:
        """Create ``owned`` (collection -> artifact class) with their ``indexes`` and
        record them as ``component``'s. Idempotent and safe to run concurrently."""
        db = self.uow.client[self.db_name]
        await ensure_reachable(
            self.uow.client, self.uow.timeout
        )  # fail in seconds, naming the hosts
        try:
            existing = set(await db.list_collection_names())
            for name in sorted({*owned, CATALOG_COLLECTION} - existing):
                await self._create(name)
            for name, models in (indexes or {}).items():
                if models:
                    await self._create_indexes(name, models)
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.uow.timeout) from exc
        await self.uow.execute(catalog_plan(self.db_name, owned, component))

    async def reserved(self, own: Iterable[str] = ()) -> frozenset[str]:
        """Every collection name of this database that tenant input may not target."""
        try:
            entries = (
                await self.uow.client[self.db_name][CATALOG_COLLECTION]
                .find({}, {"_id": 1})
                .to_list(None)
            )
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.uow.timeout) from exc
        return reserved_names(entries, own)

    async def _create(self, name: str) -> None:
        try:
            await self.uow.client[self.db_name].create_collection(name)
        except CollectionInvalid:
            pass  # created by a concurrent setup (pymongo checks before it creates)
        except OperationFailure as exc:
            if exc.code != codes.NAMESPACE_EXISTS:  # created by a concurrent setup
                raise

    async def _create_indexes(self, name: str, models: Sequence[IndexModel]) -> None:
        try:
            await self.uow.client[self.db_name][name].create_indexes(list(models))
        except OperationFailure as exc:
            if exc.code in _INDEX_CONFLICTS:
                raise ConfigurationError(
                    f"collection {self.db_name}.{name} has an index that conflicts with "
                    f"the one accord needs ({exc.details.get('errmsg') if exc.details else exc}). "
                    f"Drop that index, or configure another collection name."
                ) from exc
            raise
