# Generated from accord/platform/asynchronous/catalog.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Setting up a component's collections and recording them in the catalog.

Every component (checkpointer, memory store, aggregator, governance) calls
:meth:`Catalog.setup` once: it creates the component's collections and indexes,
safely when several processes do it at the same time (a racing ``create`` that finds the
collection made by another is fine), and records the collections in the database's
``accord_catalog`` through the unit of work; it also creates the collections the kernel's
hooks write in that database (a hook's ``collections(db)``, :mod:`accord.platform.hooks`:
an audit trail's records with their validator), recorded as ``hook:<name>``'s.
:meth:`Catalog.reserved` reads back
every collection accord owns in the database, whichever component or application
configured its name, so tenant input can never target one.

Generated from ``accord/platform/asynchronous/catalog.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pymongo import IndexModel
from pymongo.errors import CollectionInvalid, OperationFailure, PyMongoError

from accord.errors import ConfigurationError
from accord.platform import codes, write_errors
from accord.platform.artifacts import CATALOG_COLLECTION, catalog_plan, reserved_names
from accord.platform.hooks import HookCollection
from accord.platform.synchronous.reachability import ensure_reachable
from accord.platform.synchronous.unit_of_work import UnitOfWork

_IS_SYNC = True

logger = logging.getLogger("accord.platform")

#: Index build conflicts: an index of that name or those keys exists with other options.
_INDEX_CONFLICTS = frozenset({codes.INDEX_OPTIONS_CONFLICT, codes.INDEX_KEY_SPECS_CONFLICT})


class Catalog:
    """The collections accord owns in database ``db_name``."""

    def __init__(self, uow: UnitOfWork, db_name: str) -> None:
        self.uow = uow
        self.db_name = db_name

    def setup(
        self,
        component: str,
        owned: Mapping[str, str],
        indexes: Mapping[str, Sequence[IndexModel]] | None = None,
    ) -> None:
        """Create ``owned`` (collection -> artifact class) with their ``indexes`` and
        record them as ``component``'s. Idempotent and safe to run concurrently."""
        db = self.uow.client[self.db_name]
        ensure_reachable(self.uow.client, self.uow.timeout)  # fail in seconds, naming the hosts
        try:
            existing = set(db.list_collection_names())
            for name in sorted({*owned, CATALOG_COLLECTION} - existing):
                self._create(name)
            for name, models in (indexes or {}).items():
                if models:
                    self._create_indexes(name, models)
            hooked = self._hook_collections()
            for hook_owned in hooked.values():
                self._create_hook_collections(hook_owned, existing)
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.uow.timeout) from exc
        self.uow.execute(catalog_plan(self.db_name, owned, component))
        for hook_name, hook_owned in hooked.items():
            plan = catalog_plan(
                self.db_name, {n: c.artifact for n, c in hook_owned.items()}, f"hook:{hook_name}"
            )
            self.uow.execute(plan)

    def _hook_collections(self) -> dict[str, Mapping[str, HookCollection]]:
        """The collections each hook of the kernel writes in this database, by hook."""
        found: dict[str, Mapping[str, HookCollection]] = {}
        for hook in self.uow.hooks.all:
            declare = getattr(hook, "collections", None)
            if callable(declare):
                owned = declare(self.db_name)
                if owned:
                    found[hook.name] = owned
        return found

    def _create_hook_collections(
        self, owned: Mapping[str, HookCollection], existing: set[str]
    ) -> None:
        """Create a hook's collections (validator, indexes); one that exists gets its
        validator again (``collMod``, idempotent: it may have been created implicitly by
        a write before any setup)."""
        for name, spec in sorted(owned.items()):
            options: dict[str, Any] = {}
            if spec.validator is not None:
                options = {
                    "validator": dict(spec.validator),
                    "validationLevel": "strict",
                    "validationAction": "error",
                }
            if name not in existing:
                self._create(name, **options)
            elif options:
                try:
                    self.uow.client[self.db_name].command({"collMod": name, **options})
                except OperationFailure as exc:  # a user without collMod (readWrite)
                    logger.warning(
                        "accord: could not apply the validator of %s.%s (%s); ask an "
                        "administrator to run collMod with it",
                        self.db_name, name, exc,
                    )  # fmt: skip
            if spec.indexes:
                self._create_indexes(name, spec.indexes)

    def reserved(self, own: Iterable[str] = ()) -> frozenset[str]:
        """Every collection name of this database that tenant input may not target."""
        try:
            entries = (
                self.uow.client[self.db_name][CATALOG_COLLECTION].find({}, {"_id": 1}).to_list(None)
            )
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.uow.timeout) from exc
        return reserved_names(entries, own)

    def _create(self, name: str, **options: Any) -> None:
        try:
            self.uow.client[self.db_name].create_collection(name, **options)
        except CollectionInvalid:
            pass  # created by a concurrent setup (pymongo checks before it creates)
        except OperationFailure as exc:
            if exc.code != codes.NAMESPACE_EXISTS:  # created by a concurrent setup
                raise

    def _create_indexes(self, name: str, models: Sequence[IndexModel]) -> None:
        try:
            self.uow.client[self.db_name][name].create_indexes(list(models))
        except OperationFailure as exc:
            if exc.code in _INDEX_CONFLICTS:
                raise ConfigurationError(
                    f"collection {self.db_name}.{name} has an index that conflicts with "
                    f"the one accord needs ({exc.details.get('errmsg') if exc.details else exc}). "
                    f"Drop that index, or configure another collection name."
                ) from exc
            raise
