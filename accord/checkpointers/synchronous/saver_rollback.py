# Generated from accord/checkpointers/asynchronous/saver_rollback.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""Rollback with compensation: ``rollback(config, to=CHECKPOINT)`` rewinds a thread to one
of its checkpoints and undoes the business writes committed after it, from the
before-images the undo log recorded when they were written, in one transaction
(:mod:`accord.checkpointers.rollback` says what is restored and when it refuses).

Generated from ``accord/checkpointers/asynchronous/saver_rollback.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from typing import Any

from langchain_core.runnables import RunnableConfig

from accord.checkpointers import maintenance, plans, validation
from accord.checkpointers import rollback as undo_plan
from accord.checkpointers.storage import Scope
from accord.checkpointers.synchronous.saver_maintenance import SaverMaintenance
from accord.errors import InvalidInputError, RollbackRefused, WriteRefused
from accord.platform import gridfs_layout, runs, undo_log
from accord.platform.artifacts import ARTIFACT, BUSINESS, BUSINESS_UNDO
from accord.platform.context import ReadContext
from accord.platform.plan import Group, Op

_IS_SYNC = True

_OPERATION = "checkpoint.rollback"


class SaverRollback(SaverMaintenance):
    """``rollback`` (see the module docstring)."""

    def rollback(self, config: RunnableConfig, *, to: str) -> undo_plan.RolledBack:
        """Rewind the thread of ``config`` to its checkpoint ``to`` and undo the business
        writes committed after it (by the tasks that ran from ``to`` on), in one
        transaction. The thread's checkpoints after ``to`` are removed: its latest state
        is ``to``'s, and resuming it runs ``to``'s next tasks again (their recorded tool
        calls replay; external effects are not undone).

        Raises:
            RollbackRefused: a record to restore was changed since by another writer
                (named in the error, ``error.collection`` / ``error.record_id``), or
                ``to`` is not one of the thread's checkpoints; nothing was changed.
            ConcurrentRunError: a live run holds the thread; nothing was changed.
            InvalidInputError: ``to`` or the config is malformed.
        """
        scope = self._scope(config)
        if scope.checkpoint_ns:
            raise InvalidInputError(
                "rollback rewinds a whole thread: give the thread's config without a "
                f"checkpoint_ns (got {scope.checkpoint_ns!r})."
            )
        target = validation.identifier(to, "to")
        self._ensure_setup()
        what = f"rollback of thread {scope.thread_id!r} to {target!r}"
        if self._find_one(
            self.collections.checkpoints, {**scope.ns_filter, "checkpoint_id": target},
            projection={"_id": 1},
        ) is None:  # fmt: skip
            raise RollbackRefused(
                f"rollback refused: {target!r} is not a checkpoint of thread "
                f"{scope.thread_id!r} (tenant {scope.tenant_id!r}). Nothing was changed; "
                f"list the thread's checkpoints with graph.get_state_history(config)."
            )
        later = self._find_all(
            self.collections.checkpoints,
            {**scope.thread_filter, "checkpoint_id": {"$gt": target}},
            projection={"checkpoint_ns": 1},
        )
        entries = self._undo_entries(scope, target)
        records = undo_plan.records(entries)
        current = self._current(scope.tenant_id, records)
        others = self._other_writes(scope, records)
        groups: list[Group] = []
        for i, rec in enumerate(records):
            key = undo_plan.record_key(rec.collection, rec.record_id)
            refused = undo_plan.refusal(rec, current.get(key), others.get(key, []), scope.thread_id)
            if refused is not None:
                raise refused
            group = undo_plan.restore_group(
                self.business_db, scope.tenant_id, i, rec, scope.thread_id
            )
            if group is not None:
                groups.append(group)
        f = scope.thread_filter
        extra = [
            *groups,
            Group("rollback:undo", self.business_db, undo_log.COLLECTION, BUSINESS_UNDO.name,
                  [Op("delete_many", {**f, "_id": {"$in": [str(e["_id"]) for e in entries]}})]),
            # the artifacts of the undone tasks: pending again, collected by gc_artifacts
            Group("rollback:artifacts", self.db_name, gridfs_layout.FILES, ARTIFACT.name,
                  [Op("update_many", {**f, "status": gridfs_layout.COMMITTED,
                                      "checkpoint_id": {"$gte": target}},
                      {"$set": {"status": gridfs_layout.PENDING}})]),
        ]  # fmt: skip
        deletes: list[tuple[str, dict[str, Any]]] = [
            ("checkpoints", {**f, "checkpoint_id": {"$gt": target}}),
            ("writes", {**f, "checkpoint_id": {"$gte": target}}),
        ]
        started = maintenance.gc_cutoff()
        guard = self._guard(scope, None, runs.new_version(), what)
        plan = plans.maintenance_plan(self.target, scope, guard, deletes, _OPERATION, extra=extra)
        try:
            self._commit(plan, scope, None, what)
        except WriteRefused as err:
            if not err.group.startswith("restore:"):
                raise
            raise RollbackRefused(
                f"rollback of thread {scope.thread_id!r} refused: the record it would insert "
                f"again into {err.collection!r} exists again (created since by another "
                f"writer). Nothing was changed.",
                collection=err.collection,
            ) from err
        self.cache.drop(scope.tenant_id, scope.thread_id)
        # the values only the removed checkpoints used (after the commit: not needed for it)
        for ns in sorted({"", *(str(d.get("checkpoint_ns", "")) for d in later)}):
            self._collect_values(Scope(scope.tenant_id, scope.thread_id, ns), started, _OPERATION)
        return undo_plan.RolledBack(target, len(later), len(groups), len(entries))

    def _undo_entries(self, scope: Scope, target: str) -> builtins.list[Any]:
        """The undo entries of the thread's tasks that ran from ``target`` on, in write
        order, with the records of server-named upserts resolved."""
        entries = self.uow.find(
            ReadContext(scope.tenant_id, scope.thread_id, operation="rollback.read"),
            BUSINESS_UNDO.name, self.business_db, undo_log.COLLECTION,
            {**scope.thread_filter, "checkpoint_id": {"$gte": target}},
            sort=undo_log.SORT,
        )  # fmt: skip
        for e in undo_plan.unresolved(entries):
            filt = {**(undo_log.decode(e.get("locate")) or {}), "tenant_id": scope.tenant_id}
            filt[undo_log.VERSION_FIELD] = e.get("after_version")
            found = self.uow.find(
                ReadContext(scope.tenant_id, scope.thread_id, operation="rollback.read"),
                BUSINESS.name, self.business_db, str(e["collection"]), filt, limit=2,
            )  # fmt: skip
            if len(found) != 1:
                raise RollbackRefused(
                    f"rollback of thread {scope.thread_id!r} refused: the record an upsert "
                    f"created in {e['collection']!r} cannot be found any more as the thread "
                    f"left it ({len(found)} match). Nothing was changed.",
                    collection=str(e["collection"]),
                )
            e["record_id"] = found[0]["_id"]
        return entries

    def _current(
        self, tenant_id: str, records: builtins.list[undo_plan.Record]
    ) -> dict[tuple[str, Any], Any]:
        """The records as they are now, by (collection, record id)."""
        ids: dict[str, builtins.list[Any]] = defaultdict(builtins.list)
        for rec in records:
            ids[rec.collection].append(rec.record_id)
        out: dict[tuple[str, Any], Any] = {}
        for coll, wanted in ids.items():
            for doc in self.uow.find(
                ReadContext(tenant_id, operation="rollback.read"), BUSINESS.name,
                self.business_db, coll, {"_id": {"$in": wanted}, "tenant_id": tenant_id},
            ):  # fmt: skip
                out[undo_plan.record_key(coll, doc["_id"])] = doc
        return out

    def _other_writes(
        self, scope: Scope, records: builtins.list[undo_plan.Record]
    ) -> dict[tuple[str, Any], builtins.list[Any]]:
        """Other threads' logged writes to the records since the thread's first one."""
        out: dict[tuple[str, Any], builtins.list[Any]] = defaultdict(builtins.list)
        for rec in records:
            for doc in self.uow.find(
                ReadContext(scope.tenant_id, operation="rollback.read"), BUSINESS_UNDO.name,
                self.business_db, undo_log.COLLECTION,
                {"tenant_id": scope.tenant_id, "collection": rec.collection,
                 "record_id": rec.record_id, "thread_id": {"$ne": scope.thread_id},
                 "at": {"$gte": rec.first_at}},
                projection={"thread_id": 1}, limit=5,
            ):  # fmt: skip
                out[undo_plan.record_key(rec.collection, rec.record_id)].append(doc)
        return out
