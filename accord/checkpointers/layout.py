"""Which collections a saver uses in its database, and whose documents are in them (pure).

accord never writes into a collection that holds another saver's documents, and never
starts a database's MongoDBSaver threads over as if they were new. At setup (and before
its first read) a saver therefore:

1. **resolves its names**: the checkpoint collections are ``accord_checkpoints``,
   ``accord_checkpoint_blobs`` and ``accord_checkpoint_writes`` (not MongoDBSaver's
   ``checkpoints`` / ``checkpoint_writes``); a database set up by an accord version
   before that records ``checkpoints`` & co. in its ``accord_catalog``, and a saver on the
   default names keeps using those (:func:`resolve_names`);
2. **refuses foreign documents** in the collections it would write: every document
   accord writes carries ``tenant_id``, so one without it (found through the indexes that
   lead with ``tenant_id``) is another saver's (:func:`foreign_in_own`);
3. **refuses unmigrated MongoDBSaver threads beside it**: MongoDBSaver's ``checkpoints``
   collection in the same database, with its documents, and no finished migration of it
   recorded in ``accord_migrations`` (:func:`unmigrated_threads`). ``unmigrated="ignore"``
   runs beside them (a gradual rollout, or threads nobody wants back).

The saver does the I/O (``accord/checkpointers/asynchronous/layout_check.py``); this module
decides. See docs/checkpointer.md, "Migrating from MongoDBSaver".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from accord.checkpointers import schema
from accord.errors import ConfigurationError, ForeignDataError

#: Where migrations record their progress (one document per migrated source collection).
MIGRATIONS_COLLECTION = "accord_migrations"
#: MongoDBSaver's default collection names (langgraph-checkpoint-mongodb).
MONGODBSAVER_CHECKPOINTS = "checkpoints"
MONGODBSAVER_WRITES = "checkpoint_writes"
#: A MongoDBSaver checkpoint document (besides having no ``tenant_id``), as a filter.
MONGODBSAVER_SHAPE = {
    "thread_id": {"$exists": True},
    "checkpoint": {"$exists": True},
    "type": {"$exists": True},
}
#: What the saver does about MongoDBSaver threads beside it that were not migrated.
UNMIGRATED_MODES = ("refuse", "ignore")
#: Collections checked for foreign documents: the ones whose indexes lead with
#: ``tenant_id`` (so the check is one bounded index lookup, however large they are).
CHECKED = ("checkpoints", "blobs", "writes", "messages", "outbox")
#: The component name the checkpointer records its collections under in the catalog.
COMPONENT = "checkpointer"
#: A migration's status once every thread of its source was copied.
DONE = "done"


def migrate_command(db_name: str) -> str:
    """The command that migrates a database's MongoDBSaver threads."""
    return f"accord checkpoints migrate --db {db_name}"


def migration_id(db_name: str, collection: str) -> str:
    """The ``_id`` of the migration record of MongoDBSaver's ``db_name.collection``."""
    return f"mongodbsaver:{db_name}.{collection}"


def check_unmigrated_mode(value: Any) -> str:
    if value not in UNMIGRATED_MODES:
        raise ConfigurationError(
            f"unmigrated must be one of {UNMIGRATED_MODES} (what setup does when the "
            f"database holds MongoDBSaver threads that were not migrated), got {value!r}."
        )
    return str(value)


def resolve_names(
    names: schema.CollectionNames, catalog: Iterable[Mapping[str, Any]]
) -> tuple[schema.CollectionNames, list[str]]:
    """The names to use given the database's catalog entries, and the legacy names kept.

    A collection key configured with today's default name uses the pre-``accord_`` name
    instead when the catalog records that name as the checkpointer's (of the same
    artifact class) and does not record today's: the database was set up by an earlier
    accord, and its data lives there."""
    recorded = {str(e.get("_id")): e for e in catalog}
    defaults = schema.CollectionNames()
    changes: dict[str, str] = {}
    for key, old in schema.LEGACY_NAMES.items():
        new = getattr(defaults, key)
        if getattr(names, key) != new or new in recorded:
            continue
        entry = recorded.get(old)
        if (
            entry is not None
            and entry.get("component") == COMPONENT
            and entry.get("artifact") == schema.ARTIFACTS[key]
        ):
            changes[key] = old
    if not changes:
        return names, []
    return replace(names, **changes), sorted(changes.values())


def describe(doc: Mapping[str, Any]) -> str:
    """What a document accord did not write looks like it is."""
    keys = set(doc)
    if {"thread_id", "checkpoint", "type"} <= keys:
        return "MongoDBSaver's checkpoints (langgraph-checkpoint-mongodb)"
    if {"thread_id", "task_id", "channel", "value"} <= keys:
        return "MongoDBSaver's pending writes (langgraph-checkpoint-mongodb)"
    fields = ", ".join(sorted(str(k) for k in keys if k != "_id")[:8]) or "none but _id"
    return f"documents accord did not write (no tenant_id; fields: {fields})"


def foreign_in_own(
    db_name: str, collection: str, doc: Mapping[str, Any], *, legacy: bool = False
) -> ForeignDataError:
    """The error for another saver's documents in a collection this saver would write
    (``legacy``: a collection an earlier accord set up, which shared MongoDBSaver's name)."""
    thread = doc.get("thread_id")
    example = f" (e.g. of thread {thread!r})" if isinstance(thread, str) else ""
    what = f"Collection {db_name}.{collection} holds {describe(doc)}{example}"
    if legacy:
        return ForeignDataError(
            f"{what} beside accord's own documents: an earlier accord, whose collection "
            f"names were MongoDBSaver's, was used on MongoDBSaver's database. Nothing was "
            f"written. Run `{migrate_command(db_name)}`: it copies accord's threads into "
            f"its own collections (accord_checkpoints, ...) and migrates MongoDBSaver's "
            f"there too; MongoDBSaver's documents stay as they are."
        )
    return ForeignDataError(
        f"{what}, and this saver would write its own documents into it: accord never "
        f"writes into another saver's collection, so nothing was written. Give accord its "
        f"own collections (the defaults accord_checkpoints, accord_checkpoint_blobs, "
        f"accord_checkpoint_writes do not collide with MongoDBSaver's; drop "
        f"checkpoint_collection_name= / writes_collection_name= / collections= if you set "
        f"them to these names), and to continue those threads on accord, migrate them: "
        f"`{migrate_command(db_name)}` (or "
        f"accord.checkpointers.synchronous.migration.MongoDBSaverMigration)."
    )


def migrated_elsewhere(db_name: str, record: Mapping[str, Any] | None) -> str | None:
    """A database the finished migrations (their ``record``) of ``db_name`` copied its
    threads into, when none of them was ``db_name`` itself (else None): a saver on
    ``db_name`` must still refuse them there, since it would start them over as empty
    threads. A record written before migrations kept their ``targets`` says nothing."""
    targets = (record or {}).get("targets")
    if not isinstance(targets, list) or not targets or db_name in targets:
        return None
    return str(targets[-1])


def threads_migrated_elsewhere(db_name: str, collection: str, into: str) -> ForeignDataError:
    """The error for a saver on a database whose MongoDBSaver threads were migrated into
    another database."""
    return ForeignDataError(
        f"Database {db_name!r} holds MongoDBSaver threads in collection {collection!r} "
        f"that were migrated into database {into!r}, not into this one: a saver here would "
        f"start them over as empty threads. Nothing was written. Use the database they "
        f"were migrated into (db_name={into!r}), migrate them here too "
        f"(`{migrate_command(db_name)}`), or pass unmigrated='ignore' to run beside them."
    )


def unmigrated_threads(db_name: str, collection: str, doc: Mapping[str, Any]) -> ForeignDataError:
    """The error for MongoDBSaver threads beside the saver that were not migrated."""
    thread = doc.get("thread_id")
    example = f" (e.g. thread {thread!r})" if isinstance(thread, str) else ""
    return ForeignDataError(
        f"Database {db_name!r} holds MongoDBSaver threads in collection {collection!r}"
        f"{example} that were not migrated to accord: accord would start them over as "
        f"empty threads. Nothing was written, and MongoDBSaver's collections are untouched. "
        f"Migrate them first: `{migrate_command(db_name)}` (resumable; re-running it skips "
        f"what is there), or from Python "
        f"accord.checkpointers.synchronous.migration.MongoDBSaverMigration(client, "
        f"{db_name!r}).run(). To run beside them without migrating (a gradual rollout, "
        f"threads nobody needs back), pass unmigrated='ignore' to the saver."
    )
