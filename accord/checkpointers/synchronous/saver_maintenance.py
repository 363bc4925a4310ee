# Generated from accord/checkpointers/asynchronous/saver_maintenance.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The checkpointer's maintenance: ``delete_thread``, the ``ttl`` sweep, ``copy_thread``,
``delete_for_runs`` and ``prune``; each a plan (or a few, in batches) through the kernel.

Generated from ``accord/checkpointers/asynchronous/saver_maintenance.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import dataclasses
import time  # noqa: F401  (the sync twin's time.sleep)
from collections.abc import Sequence
from typing import Any

from accord.checkpointers import maintenance, ownership, plans, schema, validation
from accord.checkpointers.storage import Scope
from accord.checkpointers.synchronous.saver_artifacts import SaverArtifacts
from accord.errors import InvalidInputError, LegalHoldError, WriteRefused
from accord.platform import bundles, runs, undo_log
from accord.platform.artifacts import BUSINESS_UNDO, RUN
from accord.platform.plan import Expect, Group, Op, Plan

_IS_SYNC = True


class SaverMaintenance(SaverArtifacts):
    """Deleting, sweeping, copying and pruning threads (see the module docstring)."""

    def delete_thread(
        self, thread_id: str, *, tenant_id: str | None = None, keep_memories: bool = False
    ) -> None:
        """Delete every document of a thread (all namespaces). A run still working on the
        thread loses it (its next commit is refused). One transaction when the thread fits
        one; else the checkpoints go first (the thread reads as empty), then the rest in
        batches: re-running it after a crash finishes the job.

        The same transaction writes a ``thread_deleted`` outbox event (when the outbox has
        a consumer): the memory aggregator then removes the long-term memories derived
        only from this thread and re-derives those that other threads stated too
        (eventually, as it aggregates). ``keep_memories=True`` keeps them."""
        if not isinstance(keep_memories, bool):
            raise InvalidInputError(f"keep_memories must be True or False, got {keep_memories!r}.")
        scope = self._scope_for(thread_id, tenant_id)
        self._delete_thread(scope, expired_only=False, forget=not keep_memories)

    def sweep(self) -> int:
        """With ``ttl``: delete the threads whose data expired (no write for ``ttl``
        seconds) and that no live run holds (a saver pinned to a tenant: that tenant's);
        returns how many. Savers with ``ttl`` run it
        in the background; call it to sweep now."""
        if self.ttl is None:
            return 0
        self._ensure_setup()
        at = runs.now()
        mine = {"tenant_id": self.tenant_id} if self.pinned else {}  # a tenant's own saver
        expired = self._find_all(
            self.collections.runs,
            {**runs.expired(at), **mine},
            projection={"tenant_id": 1, "thread_id": 1},
            limit=maintenance.BATCH,
        )
        pairs = [(doc["tenant_id"], doc["thread_id"]) for doc in expired]
        swept, _docs = self.delete_expired(pairs)
        return swept

    def delete_expired(
        self,
        threads: Sequence[tuple[str, str]],
        *,
        batch: int = maintenance.BATCH,
        pause: float = 0.0,
    ) -> tuple[int, int]:
        """Delete the expired threads ``threads`` ((tenant, thread) pairs the caller found
        expired in the run registry) whole: checkpoints, pending writes, values, messages,
        recorded calls, pending outbox events. Several threads per transaction, up to
        ``batch`` documents; ``pause`` seconds between transactions (so the runs going on
        meanwhile keep their latency). A thread bigger than ``batch`` is deleted on its
        own, in batches. Each thread's deletion is guarded by the run registry: a thread
        written or claimed since (or under a legal hold) stays. Returns (threads deleted,
        documents deleted)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidInputError(f"batch must be a whole number >= 1, got {batch!r}.")
        if isinstance(pause, bool) or not isinstance(pause, int | float) or not pause >= 0:
            raise InvalidInputError(f"pause must be a number of seconds >= 0, got {pause!r}.")
        scopes = [  # (a saver pinned to a tenant refuses another tenant's threads)
            Scope(
                self.tenant_named(validation.identifier(t, "tenant_id")),
                validation.identifier(h, "thread_id"),
                "",
            )
            for t, h in _pairs(threads)
        ]
        self._ensure_setup()
        sizes = self._thread_sizes(scopes)
        deleted = docs = 0
        group: list[Scope] = []
        total = 0
        first = True
        for scope in [*scopes, None]:
            size = sizes.get((scope.tenant_id, scope.thread_id), 0) if scope else 0
            if scope is not None and group and total + size <= batch:
                group.append(scope)
                total += size
                continue
            if group:
                if not first and pause:
                    time.sleep(pause)
                first = False
                n, d = self._delete_expired_group(group, total > batch)
                deleted, docs = deleted + n, docs + d
            group, total = ([scope], size) if scope is not None else ([], 0)
        return deleted, docs

    def _thread_sizes(self, scopes: Sequence[Scope]) -> dict[tuple[str, str], int]:
        """Documents per thread across the thread's collections (one read per tenant and
        collection)."""
        by_tenant: dict[str, list[str]] = {}
        for scope in scopes:
            by_tenant.setdefault(scope.tenant_id, []).append(scope.thread_id)
        sizes: dict[tuple[str, str], int] = {}
        for tenant, ids in by_tenant.items():
            filt = {"tenant_id": tenant, "thread_id": {"$in": sorted(set(ids))}}
            for key in maintenance.THREAD_DATA:
                coll = getattr(self.collections, key)
                rows = self.uow.aggregate(
                    self._read_context(filt), self._artifacts[coll], self.db_name, coll,
                    [{"$match": filt}, {"$group": {"_id": "$thread_id", "n": {"$sum": 1}}}],
                )  # fmt: skip
                for row in rows:
                    k = (tenant, row["_id"])
                    sizes[k] = sizes.get(k, 0) + int(row["n"])
        return sizes

    def _delete_expired_group(self, group: Sequence[Scope], big: bool) -> tuple[int, int]:
        """One transaction deleting the expired threads of ``group`` whole (or, for one
        thread too big for a transaction, :meth:`_delete_thread`'s batches); when any of
        them was written, claimed or held since, each one on its own."""
        if big or len(group) == 1:
            return self._delete_expired_one(group[0])
        plans_ = []
        for scope in group:
            f = scope.thread_filter
            deletes = [("checkpoints", f), ("outbox", {**f, "status": "pending"})]
            deletes += [(key, f) for key in maintenance.THREAD_DATA[1:]]
            guard = self.leases.guard(
                "expired", scope.tenant_id, scope.thread_id, runs.new_version(),
                refused=plans.gone,
            )  # fmt: skip
            plans_.append(plans.maintenance_plan(  # its artifacts and undo log go with it
                self.target, scope, guard, deletes, "checkpoint.delete_thread",
                extra=[*self._thread_artifacts(f), self._thread_undo(f)],
            ))  # fmt: skip
        try:
            result = self.uow.execute_all(plans_)
        except (plans.StillInUse, WriteRefused, LegalHoldError):
            deleted = docs = 0  # one of them is not expired any more (or held): one by one
            for scope in group:
                n, d = self._delete_expired_one(scope)
                deleted, docs = deleted + n, docs + d
            return deleted, docs
        for scope in group:
            self.cache.drop(scope.tenant_id, scope.thread_id)
        return len(group), sum(c.deleted for c in result.counts.values())

    def _delete_expired_one(self, scope: Scope) -> tuple[int, int]:
        try:
            docs = self._delete_thread(scope, expired_only=True)
        except (plans.StillInUse, WriteRefused, LegalHoldError):
            return 0, 0  # written, claimed or held since: not expired any more
        return 1, docs

    def _delete_thread(
        self,
        scope: Scope,
        *,
        expired_only: bool,
        forget: bool | None = None,
        while_held: bool = True,
    ) -> int:
        """Delete the thread ``scope`` whole. ``expired_only``: only if it is still
        expired; else ``while_held`` says whether a run holding it loses it (``delete_thread``)
        or refuses the deletion (``prune``: ConcurrentRunError)."""
        self._ensure_setup()
        names = self.collections
        f = scope.thread_filter
        small = True
        for key in maintenance.THREAD_DATA:
            ids = self._find_all(
                getattr(names, key), f, projection={"_id": 1}, limit=maintenance.BATCH + 1
            )
            small = small and len(ids) <= maintenance.BATCH
        deletes: list[tuple[str, dict[str, Any]]] = [
            ("checkpoints", f),
            ("outbox", {**f, "status": "pending"}),
        ]
        if small:
            deletes += [(key, f) for key in maintenance.THREAD_DATA[1:]]
        version = runs.new_version()
        kind: runs.GuardKind = "expired" if expired_only else "takeover" if while_held else "free"
        guard = self.leases.guard(
            kind, scope.tenant_id, scope.thread_id, version,
            refused=plans.gone if expired_only else None,
        )  # fmt: skip
        if expired_only and not small:  # the thread stays expired until its last batch
            guard = dataclasses.replace(guard, keep_expiry=True)
        # the thread's artifacts and undo log go with it, in the same transaction
        plan = plans.maintenance_plan(
            self.target, scope, guard, deletes, "checkpoint.delete_thread",
            extra=[*self._thread_artifacts(f), self._thread_undo(f)],
        )  # fmt: skip
        # a deletion asked for (not a ttl expiry) tells consumers to forget the thread
        if (not expired_only if forget is None else forget) and self.outbox_gate.refresh():
            plan.events.append(self.target.thread_deleted(scope, version))
        try:
            result = self.uow.execute(plan)
        except WriteRefused as err:
            if kind != "free" or err.group != plans.GUARD:
                raise
            holder = self._holder(scope)
            raise ownership.adhoc_refused(scope.thread_id, "prune", holder) from None
        self.cache.drop(scope.tenant_id, scope.thread_id)
        docs = sum(c.deleted for c in result.counts.values())
        if not small:
            for key in maintenance.THREAD_DATA[1:]:
                docs += self._delete_in_batches(
                    scope, key, f, "checkpoint.delete_thread", takeover=not expired_only,
                    expired=expired_only,
                )  # fmt: skip
            if expired_only:
                # the last transaction takes the expiry off (what is left, written by
                # nothing since: the guard, goes with it); killed before it, the thread
                # is still expired and the next sweep finishes the job
                last = self.leases.guard(
                    "expired", scope.tenant_id, scope.thread_id, runs.new_version(),
                    refused=plans.gone,
                )  # fmt: skip
                result = self.uow.execute(plans.maintenance_plan(
                    self.target, scope, last, [(key, f) for key in maintenance.THREAD_DATA],
                    "checkpoint.delete_thread",
                ))  # fmt: skip
                docs += sum(c.deleted for c in result.counts.values())
                self.cache.drop(scope.tenant_id, scope.thread_id)
        return docs

    def _thread_undo(self, thread_filter: dict[str, Any]) -> Group:
        """The group deleting a thread's undo log (before-images of its business writes;
        the records themselves are the application's and stay)."""
        return Group(
            "delete:undo", self.business_db, undo_log.COLLECTION, BUSINESS_UNDO.name,
            [Op("delete_many", dict(thread_filter))],
        )  # fmt: skip

    def _delete_in_batches(
        self, scope: Scope, key: str, filt: dict[str, Any], operation: str, *, takeover: bool,
        expired: bool = False,
    ) -> int:  # fmt: skip
        """Delete ``filt``'s documents of ``key``, :data:`maintenance.BATCH` per
        transaction, each behind a guard: ``takeover`` (a deletion asked for: it ends any
        run), ``expired`` (an expired thread's: only while it is still expired, which it
        stays), else the saver's own (a run's or a free write)."""
        coll = getattr(self.collections, key)
        deleted = 0
        while True:
            docs = self._find_all(coll, filt, projection={"_id": 1}, limit=maintenance.BATCH)
            if not docs:
                return deleted
            deleted += len(docs)
            ids = [d["_id"] for d in docs]
            version = runs.new_version()
            if expired:
                guard = dataclasses.replace(self.leases.guard(
                    "expired", scope.tenant_id, scope.thread_id, version, refused=plans.gone,
                ), keep_expiry=True)  # fmt: skip
            elif takeover:
                guard = self.leases.guard("takeover", scope.tenant_id, scope.thread_id, version)
            else:
                guard = self._guard(scope, None, version, operation)
            plan = plans.maintenance_plan(
                self.target, scope, guard, [(key, {**filt, "_id": {"$in": ids}})], operation
            )
            if takeover or expired:
                self.uow.execute(plan)
            else:
                self._commit(plan, scope, None, operation)
            self.cache.drop(scope.tenant_id, scope.thread_id)

    def copy_thread(
        self,
        source_thread_id: str,
        target_thread_id: str,
        *,
        tenant_id: str | None = None,
        resume: bool = False,
    ) -> None:
        """Copy a thread's checkpoints, writes, values, messages and committed artifacts
        (each to a copy of its own) and its bundle pin to a new thread id (artifacts and
        values first, checkpoints last, in batches: a checkpoint of the target is readable
        as soon as it exists). Refused if the target has checkpoints, or a run holds it.

        The checkpoints copied are those the source had when the copy started, and each
        batch of them commits only if the source was not written since (ConcurrentRunError
        otherwise, naming what the target holds). ``resume=True`` finishes a copy that was
        cut short (a crash, that error): the target's checkpoints are then expected to be
        such a copy's, and every document is written again as the source has it."""
        src = self._scope_for(source_thread_id, tenant_id)
        dst = self._scope_for(target_thread_id, tenant_id)
        if not isinstance(resume, bool):
            raise InvalidInputError(f"resume must be True or False, got {resume!r}.")
        self._ensure_setup()
        if not resume and self._find_one(
            self.collections.checkpoints, dst.thread_filter, projection={"_id": 1}
        ):
            raise InvalidInputError(
                f"copy_thread: target thread {dst.thread_id!r} already has checkpoints; "
                f"delete it first (or pass resume=True to finish a copy cut short)."
            )
        what = f"copy of thread {src.thread_id!r}"
        registry = self._find_one(
            self.collections.runs, {"_id": runs.run_doc_id(src.tenant_id, src.thread_id)},
            projection={"version": 1, "bundle": 1},
        )  # fmt: skip
        # what the copy takes: the source's checkpoints now (values come with them)
        listed = {
            d["_id"]
            for d in self._find_all(
                self.collections.checkpoints, src.thread_filter, projection={"_id": 1}
            )
        }
        # the artifacts first: a checkpoint of the target finds them as soon as it exists
        self._copy_artifacts(src, dst)
        pinned = False
        for key in maintenance.COPY_ORDER:
            coll = getattr(self.collections, key)
            last: Any = None
            while True:
                filt = dict(src.thread_filter)
                if last is not None:
                    filt["_id"] = {"$gt": last}
                docs = self._find_all(coll, filt, sort=[("_id", 1)], limit=maintenance.BATCH)
                if not docs:
                    break
                last = docs[-1]["_id"]
                extra: list[Group] = []
                if key == "checkpoints":
                    docs = [d for d in docs if d["_id"] in listed]
                    if not docs:
                        continue
                    extra = self._copy_checks(src, dst, registry, first=not pinned)
                    pinned = True
                copies = [maintenance.rekey(key, d, dst.thread_id) for d in docs]
                guard = self._guard(dst, None, runs.new_version(), what)
                plan = plans.maintenance_plan(
                    self.target, dst, guard, [], "checkpoint.copy_thread",
                    inserts=[(key, maintenance.replace_ops(copies))], extra=extra,
                )  # fmt: skip
                self._commit(plan, dst, None, what)
        self.cache.drop(dst.tenant_id, dst.thread_id)

    def _copy_checks(self, src: Scope, dst: Scope, registry: Any, *, first: bool) -> list[Group]:
        """The groups a batch of copied checkpoints commits with: the source's registry
        still at the version the copy started from (else values committed with a newer
        checkpoint may be missing from the copy), and, with the first batch, the source's
        bundle pin carried over (a copy of a paused run's state does not wake on another
        bundle)."""
        if registry is None:  # a thread written before the run registry: nothing to compare
            return []
        version = registry.get("version")

        def changed(counts: Any) -> BaseException:
            return ownership.copied_meanwhile(src.thread_id, dst.thread_id)

        rid = registry["_id"]
        groups = [Group(
            "copy:source_unchanged", self.leases.db, self.leases.collection, RUN.name,
            [Op("update", {"_id": rid, "version": version}, {"$set": {"version": version}})],
            expect=Expect(matched=1, error=changed),
        )]  # fmt: skip
        bundle = registry.get("bundle")
        if first and bundle:
            pinned = bundles.Bundle.of_document(bundle)
            entry = bundles.history_entry(
                "pinned", at=runs.now(), old=None, new=pinned,
                reason=f"copied from thread {src.thread_id!r}",
            )  # fmt: skip
            groups.append(Group(
                "copy:pin", self.leases.db, self.leases.collection, RUN.name,
                [bundles.pin_op(dst.tenant_id, dst.thread_id, pinned, entry, expected=None)],
            ))  # fmt: skip
        return groups

    def delete_for_runs(self, run_ids: Sequence[str], *, tenant_id: str | None = None) -> None:
        """Delete the checkpoints (and their writes) created by the given runs, then the
        values and messages no remaining checkpoint of those threads references. Refused
        (ConcurrentRunError) for a thread a live run holds."""
        ids = validation.thread_ids(run_ids, "run_ids")
        tenant = self.tenant_named(tenant_id)
        if not ids:
            return
        self._ensure_setup()
        doomed = self._find_all(
            self.collections.checkpoints,
            {"tenant_id": tenant, "run_id": {"$in": ids}},
            projection={"thread_id": 1, "checkpoint_ns": 1, "checkpoint_id": 1},
        )
        for (thread_id, ns), cids in maintenance.by_scope(doomed).items():
            scope = Scope(tenant, thread_id, ns)
            self._drop_checkpoints(scope, {"$in": sorted(cids)}, "checkpoint.delete_for_runs")

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        tenant_id: str | None = None,
        keep: int = 1,
    ) -> None:
        """Prune threads: ``"keep_latest"`` keeps the newest ``keep`` checkpoints per
        namespace (and their writes, values and messages); ``"delete"`` deletes the
        threads. Threads that use LangGraph ``DeltaChannel`` are skipped by
        ``keep_latest`` (their state needs the ancestors). Refused (ConcurrentRunError)
        for a thread a live run holds."""
        threads = validation.thread_ids(thread_ids)
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"prune strategy must be 'keep_latest' or 'delete', got {strategy!r}."
            )
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidInputError(f"prune keeps at least 1 checkpoint, got keep={keep!r}.")
        self._ensure_setup()
        for thread_id in threads:
            if strategy == "delete":
                self._delete_thread(
                    self._scope_for(thread_id, tenant_id), expired_only=False, while_held=False
                )
                continue
            scope0 = self._scope_for(thread_id, tenant_id)
            for ns in self._namespaces(scope0):
                scope = Scope(scope0.tenant_id, thread_id, ns)
                kept = self._find_all(
                    self.collections.checkpoints, scope.ns_filter,
                    sort=[("checkpoint_id", -1)], limit=keep,
                )  # fmt: skip
                if not kept or maintenance.uses_delta_channels(kept[0], self.serde):
                    continue
                self._drop_checkpoints(
                    scope, {"$lt": kept[-1]["checkpoint_id"]}, "checkpoint.prune"
                )

    def _drop_checkpoints(self, scope: Scope, which: dict[str, Any], operation: str) -> None:
        """Delete a namespace's checkpoints matching ``which`` (a ``checkpoint_id``
        condition), their writes and their tasks' settled recorded calls in one
        transaction, then collect what no remaining checkpoint references."""
        started = maintenance.gc_cutoff()
        dropped = False
        while True:  # oldest first, BATCH checkpoints (with their writes) per transaction
            doomed = self._find_all(
                self.collections.checkpoints, {**scope.ns_filter, "checkpoint_id": which},
                projection={"checkpoint_id": 1}, sort=[("checkpoint_id", 1)],
                limit=maintenance.BATCH,
            )  # fmt: skip
            if not doomed:
                break
            ids = {"$in": [d["checkpoint_id"] for d in doomed]}
            deletes: list[tuple[str, dict[str, Any]]] = [
                ("writes", {**scope.ns_filter, "checkpoint_id": ids}),
                ("checkpoints", {**scope.ns_filter, "checkpoint_id": ids}),
                # the calls their tasks recorded (none a kept checkpoint's tasks replay)
                ("calls", maintenance.dropped_calls(scope, ids["$in"])),
            ]
            guard = self._guard(scope, None, runs.new_version(), operation)
            # the thread is marked, with its checkpoints gone, until their values are
            # collected: a run killed in between leaves the mark, and `collect_garbage` (the
            # sweep) finishes the job, which nothing else would find to do
            mark = self.target.group("mark", "runs", [Op(
                "update", {"_id": scope.run_doc_id},
                {"$set": {maintenance.COLLECT_PENDING: started}},
            )])  # fmt: skip
            self._commit(
                plans.maintenance_plan(self.target, scope, guard, deletes, operation,
                                       extra=[mark]),
                scope,
                None,
                operation,
            )  # fmt: skip
            dropped = True
        self._collect_values(scope, started, operation)
        if dropped:
            self._unmark(scope, started, operation)

    def _namespaces(self, scope0: Scope) -> list[str]:
        """The namespaces of ``scope0``'s thread, sorted: those of its checkpoints and of
        its values (a namespace may have lost every checkpoint)."""
        namespaces: set[str] = set()
        for key in ("checkpoints", "blobs"):
            docs = self._find_all(getattr(self.collections, key), scope0.thread_filter,
                                        projection={"checkpoint_ns": 1})  # fmt: skip
            namespaces.update(d["checkpoint_ns"] for d in docs)
        return sorted(namespaces)

    def collect_garbage(self, thread_ids: Sequence[str], *, tenant_id: str | None = None) -> int:
        """Finish what an interrupted ``prune`` or ``delete_for_runs`` began: collect the
        values and messages that no remaining checkpoint of each thread references, in
        every namespace, and take the thread's mark off. Returns how many threads were
        marked. The sweep runs it for every marked thread."""
        threads = validation.thread_ids(thread_ids)
        self._ensure_setup()
        marked = 0
        for thread_id in threads:
            scope0 = self._scope_for(thread_id, tenant_id)
            doc = self._find_one(
                self.collections.runs,
                {"_id": scope0.run_doc_id, maintenance.COLLECT_PENDING: {"$exists": True}},
                projection={maintenance.COLLECT_PENDING: 1},
            )  # fmt: skip
            if doc is None:
                continue
            marked += 1
            started = maintenance.gc_cutoff()
            for ns in self._namespaces(scope0):
                scope = Scope(scope0.tenant_id, thread_id, ns)
                kept = self._find_all(self.collections.checkpoints, scope.ns_filter,
                                            sort=[("checkpoint_id", -1)], limit=1)  # fmt: skip
                if kept and maintenance.uses_delta_channels(kept[0], self.serde):
                    continue
                self._collect_values(scope, started, "checkpoint.prune")
            self._unmark(scope0, doc[maintenance.COLLECT_PENDING], "checkpoint.prune")
        return marked

    def pending_collection(self, *, limit: int = maintenance.BATCH) -> list[tuple[str, str]]:
        """(tenant, thread) of at most ``limit`` threads whose values are still to be
        collected after an interrupted ``prune`` or ``delete_for_runs`` (:meth:`collect_garbage`);
        a saver pinned to a tenant lists that tenant's threads only."""
        self._ensure_setup()
        mine = {"tenant_id": self.tenant_id} if self.pinned else {}  # not other tenants' ids
        docs = self._find_all(
            self.collections.runs, {maintenance.COLLECT_PENDING: {"$exists": True}, **mine},
            projection={"tenant_id": 1, "thread_id": 1}, sort=[("_id", 1)], limit=limit,
        )  # fmt: skip
        return [(d["tenant_id"], d["thread_id"]) for d in docs]

    def _unmark(self, scope: Scope, started: Any, operation: str) -> None:
        """Take the thread's collection mark off, unless a later prune set its own."""
        group = self.target.group("unmark", "runs", [Op(
            "update", {"_id": scope.run_doc_id, maintenance.COLLECT_PENDING: {"$lte": started}},
            {"$unset": {maintenance.COLLECT_PENDING: ""}},
        )])  # fmt: skip
        self.uow.execute(Plan(plans.context(scope, operation, None), [group]))

    def _collect_values(self, scope: Scope, started: Any, operation: str) -> None:
        """Delete the values (blobs) of ``scope``'s namespace and the thread's messages
        that no remaining checkpoint references and that were created before
        ``started`` (:func:`maintenance.gc_cutoff`, taken before the checkpoints went)."""
        names = self.collections
        remaining = self._find_all(names.checkpoints, scope.ns_filter, projection={"blobs": 1})
        links = {
            b["key"]: b.get("prev") or b.get("base")
            for b in self._find_all(
                names.blobs,
                {**scope.ns_filter, "type": schema.MSGREFS_TYPE, "chunk": 0},
                projection={"key": 1, "prev": 1, "base": 1},
            )
        }
        keep_blobs = maintenance.referenced_blobs(remaining, links)
        refs: set[str] = set()
        for b in self._find_all(
            names.blobs,
            {**scope.thread_filter, "type": schema.MSGREFS_TYPE},
            projection={"key": 1, "refs": 1, "checkpoint_ns": 1},
        ):
            if b.get("checkpoint_ns") != scope.checkpoint_ns or b["key"] in keep_blobs:
                refs.update(b.get("refs") or ())
        for key, filt in maintenance.garbage(scope, keep_blobs, refs, started):
            self._delete_in_batches(scope, key, filt, operation, takeover=False)
        self.cache.drop(scope.tenant_id, scope.thread_id)


def _pairs(threads: Any) -> list[tuple[Any, Any]]:
    """``threads`` as (tenant, thread) pairs, or InvalidInputError."""
    if isinstance(threads, str | bytes) or not isinstance(threads, Sequence):
        raise InvalidInputError(
            f"threads must be a list of (tenant, thread) pairs, got {threads!r:.80}."
        )
    out = []
    for i, pair in enumerate(threads):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidInputError(
                f"threads[{i}] must be a (tenant, thread) pair, got {pair!r:.80}."
            )
        out.append((pair[0], pair[1]))
    return out
