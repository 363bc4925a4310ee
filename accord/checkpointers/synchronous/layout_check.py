# Generated from accord/checkpointers/asynchronous/layout_check.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The saver's layout check: which collections it uses, and whose documents are there.

The decisions are :mod:`accord.checkpointers.layout`'s; this module reads what they need,
through the kernel (so the policy's read hook checks every read): the database's catalog,
its collection names, one bounded index lookup per collection the saver writes,
MongoDBSaver's ``checkpoints`` (one document) and its migration record.

Generated from ``accord/checkpointers/asynchronous/layout_check.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import logging
from typing import Any

from accord.checkpointers import layout, schema
from accord.platform.artifacts import CATALOG, CATALOG_COLLECTION, CHECKPOINT, MIGRATION
from accord.platform.context import ReadContext

_IS_SYNC = True

logger = logging.getLogger("accord.checkpointers")

#: The operation of the layout check's reads (what a refusal names).
OPERATION = "checkpoint.setup.layout"


def check(
    uow: Any, db: Any, names: schema.CollectionNames, *, unmigrated: str
) -> schema.CollectionNames:
    """The collection names the saver uses in ``db``; raises
    :class:`~accord.errors.ForeignDataError` when another saver's data is where accord
    would write, or beside it unmigrated (``unmigrated="refuse"``).

    The documents are read through the kernel ``uow`` (its read hooks: the policy checks
    each read, so a principal that may not read a class is refused by accord, naming the
    rule, before the database is asked), as the kernel's principal, in its tenant when it
    acts for one (then the policy narrows each read to that tenant, whose documents carry
    ``tenant_id``: another tenant's collections are none of its business)."""
    principal = getattr(uow, "principal", None)
    tenant = getattr(principal, "tenant_id", None) or "*"
    context = ReadContext(tenant, operation=OPERATION)
    catalog = uow.find(
        context, CATALOG.name, db.name, CATALOG_COLLECTION, {},
        projection={"artifact": 1, "component": 1},
    )  # fmt: skip
    names, legacy = layout.resolve_names(names, catalog)
    if legacy:
        logger.info(
            "accord: database %s was set up by an earlier accord; the checkpointer keeps its "
            "collections %s",
            db.name,
            ", ".join(legacy),
        )
    existing = set(db.list_collection_names())
    artifacts = names.artifacts()
    for key in layout.CHECKED:
        collection = getattr(names, key)
        if collection not in existing:
            continue
        doc = uow.find_one(context, artifacts[collection], db.name, collection, {"tenant_id": None})
        if doc is None:
            continue
        raise layout.foreign_in_own(db.name, collection, doc, legacy=collection in legacy)
    if unmigrated == "refuse":
        collection = layout.MONGODBSAVER_CHECKPOINTS
        if collection in existing and collection not in names.all().values():
            # MongoDBSaver's shape, without reading its (whole-state) checkpoint payload
            doc = uow.find_one(
                context, CHECKPOINT.name, db.name, collection,
                {"tenant_id": None, **layout.MONGODBSAVER_SHAPE}, projection={"thread_id": 1},
            )  # fmt: skip
            if doc is None:
                return names
            record = None
            if layout.MIGRATIONS_COLLECTION in existing:
                record = uow.find_one(
                    context, MIGRATION.name, db.name, layout.MIGRATIONS_COLLECTION,
                    {"_id": layout.migration_id(db.name, collection)},
                    projection={"status": 1, "targets": 1},
                )  # fmt: skip
            if (record or {}).get("status") != layout.DONE:
                raise layout.unmigrated_threads(db.name, collection, doc)
            into = layout.migrated_elsewhere(db.name, record)
            if into is not None:
                raise layout.threads_migrated_elsewhere(db.name, collection, into)
    return names
