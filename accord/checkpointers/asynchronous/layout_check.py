"""The saver's layout check: which collections it uses, and whose documents are there.

The decisions are :mod:`accord.checkpointers.layout`'s; this module reads what they need:
the database's catalog, its collection names, one bounded index lookup per collection the
saver writes, MongoDBSaver's ``checkpoints`` (one document) and the migration records.

This module is the async source; its sync twin ``accord/checkpointers/synchronous/layout_check.py``
is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from accord.checkpointers import layout, schema
from accord.platform.artifacts import CATALOG_COLLECTION

_IS_SYNC = False

logger = logging.getLogger("accord.checkpointers")


async def check(
    db: Any, names: schema.CollectionNames, *, unmigrated: str
) -> schema.CollectionNames:
    """The collection names the saver uses in ``db``; raises
    :class:`~accord.errors.ForeignDataError` when another saver's data is where accord
    would write, or beside it unmigrated (``unmigrated="refuse"``)."""
    catalog = await db[CATALOG_COLLECTION].find({}, {"artifact": 1, "component": 1}).to_list(None)
    names, legacy = layout.resolve_names(names, catalog)
    if legacy:
        logger.info(
            "accord: database %s was set up by an earlier accord; the checkpointer keeps its "
            "collections %s",
            db.name,
            ", ".join(legacy),
        )
    existing = set(await db.list_collection_names())
    migrations = {
        d["_id"]: d async for d in db[layout.MIGRATIONS_COLLECTION].find({}, {"status": 1})
    } if layout.MIGRATIONS_COLLECTION in existing else {}  # fmt: skip
    for key in layout.CHECKED:
        collection = getattr(names, key)
        if collection not in existing:
            continue
        doc = await db[collection].find_one({"tenant_id": None})
        if doc is None:
            continue
        raise layout.foreign_in_own(db.name, collection, doc, legacy=collection in legacy)
    if unmigrated == "refuse":
        collection = layout.MONGODBSAVER_CHECKPOINTS
        if collection in existing and collection not in names.all().values():
            # MongoDBSaver's shape, without reading its (whole-state) checkpoint payload
            doc = await db[collection].find_one(
                {"tenant_id": None, **layout.MONGODBSAVER_SHAPE}, {"thread_id": 1}
            )
            record = migrations.get(layout.migration_id(db.name, collection)) or {}
            if doc is not None and record.get("status") != layout.DONE:
                raise layout.unmigrated_threads(db.name, collection, doc)
    return names
