# Generated from accord/checkpointers/asynchronous/migration.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Migrating a database's MongoDBSaver threads into accord: resumable, idempotent, reported.

``accord checkpoints migrate --db checkpointing_db`` runs the sync twin
(:class:`~accord.checkpointers.synchronous.migration.MongoDBSaverMigration`) with a progress
bar; :class:`MongoDBSaverMigration` is the same on pymongo's ``MongoClient``::

    report = await MongoDBSaverMigration(client, "checkpointing_db").run()

It reads MongoDBSaver's documents directly (``checkpoints`` / ``checkpoint_writes``, the
documents without ``tenant_id``; langgraph-checkpoint-mongodb need not be installed) and
replays each thread, namespace by namespace, oldest checkpoint first, through an accord
saver's ``put``/``put_writes`` (:class:`accord.checkpointers.migrate.Replay`). So:

* **idempotent**: accord's documents have deterministic ids; a thread whose checkpoints
  are all in accord already is skipped (one indexed count), a thread cut off half-way is
  replayed whole (writing the same documents again);
* **resumable**: run it again after a crash or Ctrl-C and it continues where it stopped;
* **recorded**: a full run marks the source migrated in ``accord_migrations`` of the
  source database, which is what lets savers set up on that database afterwards (they
  refuse unmigrated MongoDBSaver threads beside them: accord.checkpointers.layout).

MongoDBSaver's collections are only read. The migrated threads get the target saver's
tenant (``tenant_id``, default ``"default"``). The migration writes no outbox events (a
replayed history is not new conversation). Stop MongoDBSaver writers first: a thread
written after it was migrated is migrated again by the next run, as long as no accord run
wrote it meanwhile.

Generated from ``accord/checkpointers/asynchronous/migration.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pymongo import ASCENDING

from accord.checkpointers import layout, migrate, schema, validation
from accord.checkpointers.migrate import MigrationProgress, MigrationReport
from accord.checkpointers.synchronous.saver import AccordSaver
from accord.errors import ConfigurationError, InvalidInputError
from accord.platform.artifacts import CATALOG_COLLECTION, MIGRATION
from accord.platform.plan import Group, Op, Plan, PlanContext
from accord.platform.runs import now
from accord.platform.synchronous.catalog import Catalog

_IS_SYNC = True

#: The component that records migrations in the catalog.
COMPONENT = "checkpointer.migration"
#: Documents per transaction when accord's own documents are copied to today's names.
_COPY_BATCH = 500


#: Seconds one migrated step may take, retries included. A migration killed in the middle
#: of a transaction leaves it open on the server, holding the documents it wrote until the
#: server aborts it (``transactionLifetimeLimitSeconds``, 60 s by default on mongod and on
#: accord's engine); the migration run again then waits that out instead of giving up.
MIGRATION_TIMEOUT = 90.0


class MongoDBSaverMigration:
    """Copies MongoDBSaver's threads of database ``db_name`` into accord.

    Args:
        client: an ``MongoClient`` on the server holding both.
        db_name: MongoDBSaver's database (its default is ``checkpointing_db``).
        target_db: accord's database (default: ``db_name``: accord's own collections
            there do not collide with MongoDBSaver's).
        tenant_id: the tenant the threads get in accord.
        checkpoint_collection_name, writes_collection_name: MongoDBSaver's collections.
        serde: the serializer MongoDBSaver wrote with (default LangGraph's
            ``JsonPlusSerializer``); accord's saver uses it too unless ``saver_options``
            gives another.
        threads: only these threads (the source is then not recorded as migrated).
        saver_options: more keywords of the target ``AccordSaver`` (``collections``,
            ``business_db``, ``timeout``...). The default ``timeout`` is
            :data:`MIGRATION_TIMEOUT`.
    """

    def __init__(
        self,
        client: Any,
        db_name: str = "checkpointing_db",
        *,
        target_db: str | None = None,
        tenant_id: str = schema.DEFAULT_TENANT,
        checkpoint_collection_name: str = layout.MONGODBSAVER_CHECKPOINTS,
        writes_collection_name: str = layout.MONGODBSAVER_WRITES,
        serde: SerializerProtocol | None = None,
        threads: Sequence[str] | None = None,
        **saver_options: Any,
    ) -> None:
        self.client = client
        self.db_name = validation.identifier(db_name, "db_name")
        self.target_db = validation.identifier(target_db or db_name, "target_db")
        self.tenant_id = validation.identifier(tenant_id, "tenant_id")
        self.checkpoints = validation.foreign_collection(
            checkpoint_collection_name, "checkpoint_collection_name"
        )
        self.writes = validation.foreign_collection(
            writes_collection_name, "writes_collection_name"
        )
        self.threads = None if threads is None else validation.thread_ids(threads, "threads")
        self.serde = serde or JsonPlusSerializer()
        for forced in ("unmigrated", "outbox_events", "tenant_id"):
            if forced in saver_options:
                raise ConfigurationError(
                    f"{forced} is the migration's to set (it runs beside the MongoDBSaver "
                    f"threads it migrates, writes no outbox events, and takes tenant_id=)."
                )
        saver_options.setdefault("serde", self.serde)
        saver_options.setdefault("timeout", MIGRATION_TIMEOUT)
        self.saver = AccordSaver(
            client, self.target_db, tenant_id=self.tenant_id, unmigrated="ignore",
            outbox_events=False, **saver_options,
        )  # fmt: skip
        self._source = client[self.db_name]

    @property
    def record_id(self) -> str:
        return layout.migration_id(self.db_name, self.checkpoints)

    def thread_ids(self) -> list[str]:
        """The source's thread ids, sorted (or the ones asked for)."""
        if self.threads is not None:
            return list(self.threads)
        cursor = self._source[self.checkpoints].aggregate(
            [
                {"$match": {**migrate.FOREIGN, "thread_id": {"$type": "string"}}},
                {"$group": {"_id": "$thread_id"}},
                {"$sort": {"_id": 1}},
            ],
            allowDiskUse=True,
        )
        return [d["_id"] for d in cursor]

    def run(
        self, on_progress: Callable[[MigrationProgress], None] | None = None
    ) -> MigrationReport:
        """Migrate every thread not in accord yet; ``on_progress`` is called before the
        first thread and after each one."""
        full = self.threads is None
        self.diverged: list[str] = []
        if not self._source.list_collection_names(filter={"name": self.checkpoints}):
            # (a typo in --db "migrated 0 threads" and recorded the database as migrated)
            raise InvalidInputError(
                f"{self.db_name}.{self.checkpoints} does not exist: nothing to migrate, "
                f"nothing was written; check the database (--db) and the collection "
                f"(--checkpoints)"
            )
        separated = self.separate()
        Catalog(self.saver.uow, self.db_name).setup(
            COMPONENT, {layout.MIGRATIONS_COLLECTION: MIGRATION.name}
        )
        self._record({"status": "running", "started_at": now()}, insert=True)
        self.saver.setup()
        ids = self.thread_ids()
        progress = MigrationProgress(total=len(ids))
        if on_progress is not None:
            on_progress(progress)
        migrated: list[str] = []
        for thread_id in ids:
            progress.thread_id = thread_id
            copied = self.migrate_thread(thread_id)
            if copied is None:
                progress.skipped += 1
            else:
                migrated.append(thread_id)
                progress.migrated += 1
                progress.checkpoints += copied[0]
                progress.writes += copied[1]
            progress.done += 1
            if on_progress is not None:
                on_progress(progress)
        report = MigrationReport(
            source=f"{self.db_name}.{self.checkpoints}",
            target=f"{self.target_db}.{self.saver.collections.checkpoints}",
            tenant_id=self.tenant_id, threads=len(ids), migrated=progress.migrated,
            skipped=progress.skipped, checkpoints=progress.checkpoints,
            writes=progress.writes, recorded=full, migrated_threads=migrated,
            separated=separated, diverged=list(self.diverged),
        )  # fmt: skip
        if full:
            self._record(
                {
                    "status": layout.DONE, "finished_at": now(), "threads": len(ids),
                    "migrated": progress.migrated, "skipped": progress.skipped,
                    "checkpoints": progress.checkpoints, "writes": progress.writes,
                }
            )  # fmt: skip
        return report

    def separate(self) -> int:
        """A database an earlier accord (whose checkpoint collections had MongoDBSaver's
        names) wrote beside MongoDBSaver: copy accord's own documents (those with a
        ``tenant_id``) of ``checkpoints``, ``checkpoint_blobs``, ``checkpoint_writes`` into
        today's collections, which from then on every saver uses; MongoDBSaver's stay
        where they are. Idempotent (same ``_id`` s); returns the documents copied."""
        db = self.client[self.target_db]
        if self.target_db != self.db_name:
            return 0
        catalog = db[CATALOG_COLLECTION].find({}, {"artifact": 1, "component": 1}).to_list(None)
        _, legacy = layout.resolve_names(self.saver.collections, catalog)
        if not {self.checkpoints, self.writes} & set(legacy):
            return 0
        keys = [k for k, old in schema.LEGACY_NAMES.items() if old in legacy]
        new = self.saver.collections
        indexes = schema.index_models(new)
        Catalog(self.saver.uow, self.target_db).setup(
            layout.COMPONENT,
            {getattr(new, k): schema.ARTIFACTS[k] for k in keys},
            {getattr(new, k): indexes[k] for k in keys},
        )
        copied = 0
        for key in keys:
            last: Any = None
            while True:
                filt: dict[str, Any] = {"tenant_id": {"$ne": None}}
                if last is not None:
                    filt["_id"] = {"$gt": last}
                docs = (
                    db[schema.LEGACY_NAMES[key]]
                    .find(filt, sort=[("_id", ASCENDING)], limit=_COPY_BATCH)
                    .to_list(None)
                )
                if not docs:
                    break
                ops = [Op("replace", {"_id": d["_id"]}, d, upsert=True) for d in docs]
                group = Group(f"copy:{key}", self.target_db, getattr(new, key),
                              schema.ARTIFACTS[key], ops)  # fmt: skip
                self.saver.uow.execute(
                    Plan(PlanContext(tenant_id="*", operation="checkpoint.migrate"), [group])
                )
                copied += len(docs)
                last = docs[-1]["_id"]
        return copied

    def migrate_thread(self, thread_id: str) -> tuple[int, int] | None:
        """Copy one thread; ``(checkpoints, writes)`` copied, or None when every checkpoint
        of it is in accord already, or when accord went on with it after its migration
        (then it is named in ``diverged`` and left as accord has it)."""
        source = self._source[self.checkpoints]
        where = {**migrate.FOREIGN, "thread_id": thread_id}
        ids = source.find(where, {"checkpoint_ns": 1, "checkpoint_id": 1}).to_list(None)
        wanted = [
            schema.checkpoint_doc_id(
                self.tenant_id, thread_id, d.get("checkpoint_ns", ""), d["checkpoint_id"]
            )
            for d in ids
        ]
        have = self.client[self.target_db][self.saver.collections.checkpoints].count_documents(
            {"_id": {"$in": wanted}}
        )
        if have == len(wanted):
            return None
        target = self.client[self.target_db][self.saver.collections.checkpoints]
        own = {"tenant_id": self.tenant_id, "thread_id": thread_id, "_id": {"$nin": wanted}}
        if have and target.count_documents(own, limit=1):
            # accord went on with the thread after its migration and MongoDBSaver wrote it
            # again since: copying would make MongoDBSaver's newer checkpoint the latest
            self.diverged.append(thread_id)
            return None
        checkpoints = writes = 0
        replay: migrate.Replay | None = None
        # namespace by namespace, parents before children (checkpoint ids grow with time)
        cursor = source.find(
            where, sort=[("checkpoint_ns", ASCENDING), ("checkpoint_id", ASCENDING)]
        )
        for doc in cursor:
            ns = doc.get("checkpoint_ns", "")
            if replay is None or replay.checkpoint_ns != ns:
                replay = migrate.Replay(thread_id, ns)
            pending = self._source[self.writes].find(
                {**migrate.FOREIGN, "thread_id": thread_id, "checkpoint_ns": ns,
                 "checkpoint_id": doc["checkpoint_id"]},
                sort=[("_id", ASCENDING)],
            ).to_list(None)  # fmt: skip
            step = replay.step(migrate.decode_checkpoint(doc, pending, self.serde))
            self.saver.put(step.config, step.checkpoint, step.metadata, step.new_versions)
            for task_id, task_writes in step.writes:
                self.saver.put_writes(step.writes_config, task_writes, task_id)
            checkpoints += 1
            writes += len(pending)
        return checkpoints, writes

    def _record(self, fields: dict[str, Any], *, insert: bool = False) -> None:
        """Update the migration's record in the source database's ``accord_migrations``."""
        body = {
            "source": {"db": self.db_name, "checkpoints": self.checkpoints, "writes": self.writes},
            "target": {"db": self.target_db, "tenant_id": self.tenant_id},
        }
        update: dict[str, Any] = {"$set": {**fields, **body}}
        if fields.get("status") == layout.DONE:  # every database a full run copied into
            update["$addToSet"] = {"targets": self.target_db}
        if insert:
            update["$setOnInsert"] = {"created_at": now()}
            if self.threads is not None:  # a partial run never marks the source migrated
                update = {"$setOnInsert": {"created_at": now(), "status": "partial", **body}}
        op = Op("update", {"_id": self.record_id}, update, upsert=True)
        group = Group("migration", self.db_name, layout.MIGRATIONS_COLLECTION, MIGRATION.name, [op])
        self.saver.uow.execute(
            Plan(PlanContext(tenant_id="*", operation="checkpoint.migrate"), [group])
        )
