# Generated from accord/checkpointers/asynchronous/saver_reads.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The checkpointer's reads: ``get_tuple`` (served from the fast-step cache while this saver
knows it is current; else a constant number of indexed queries) and ``list`` (in pages).

Generated from ``accord/checkpointers/asynchronous/saver_reads.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from accord.checkpointers import cache, langgraph_internals, reads, validation
from accord.checkpointers.ownership import ActiveRun
from accord.checkpointers.storage import Scope
from accord.checkpointers.synchronous.saver_runs import SaverRuns
from accord.errors import InvalidInputError
from accord.platform import workflow_log
from accord.platform.artifacts import WORKFLOW_EVENT
from accord.platform.context import ReadContext

_IS_SYNC = True

#: Checkpoints per page of ``list`` (each page is hydrated with a constant number of queries).
_PAGE = 100


class SaverReads(SaverRuns):
    """``get_tuple`` and ``list`` (see the module docstring)."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest when ``config`` has no ``checkpoint_id``).

        Served from memory when this saver knows it is current (its own run holds the
        thread, or the thread's registry version is the one it last wrote); otherwise a
        constant number of indexed queries, however long the thread. When LangGraph's
        loop calls it on entry, the run claims the thread first.
        """
        caller = langgraph_internals.calling_loop()
        return self._get_tuple(config, caller)

    def _get_tuple(self, config: RunnableConfig, caller: Any) -> CheckpointTuple | None:
        self._capture_loop()
        self._ensure_layout()
        scope = self._scope(config)
        checkpoint_id = validation.optional_identifier(
            validation.configurable(config).get("checkpoint_id"), "checkpoint_id"
        )
        run = self._run_of(scope, config)
        if run is None and caller is not None and langgraph_internals.is_top_level(caller):
            run = self._claim(scope, config, caller)
        if run is not None and caller is not None:
            run.loops[scope.checkpoint_ns] = caller
        self._settle(scope, scope.checkpoint_ns)
        if run is not None:
            current = run.lost is None
        else:
            current = self._cache_is_current(scope, checkpoint_id)
        if current:
            entry = self.cache.lookup(
                scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id
            )
            if entry is not None:
                tup = cache.build_tuple(
                    entry,
                    thread_id=scope.thread_id,
                    ns=scope.checkpoint_ns,
                    serde=self.serde,
                    config_extra=self._config_extra(scope.tenant_id),
                    remember=self._remember if run is not None else None,
                )
                if tup is not None:
                    if run is not None:
                        run.mark_saved(scope.checkpoint_ns, entry.checkpoint_id)
                    return tup
        epoch = self.cache.epoch(scope.tenant_id, scope.thread_id) if current else None
        tup, entry = self._read_checkpoint(
            scope, checkpoint_id, keep=self.cache.enabled, remember=run is not None
        )
        if tup is None:
            return None
        if run is not None:
            run.mark_saved(scope.checkpoint_ns, tup.checkpoint["id"])
        if entry is not None:
            # the registry version was read before the checkpoint: nothing newer hides
            self.cache.store_read(
                scope.tenant_id, scope.thread_id, scope.checkpoint_ns, entry, epoch
            )
        return tup

    def read_workflow_events(
        self, config: RunnableConfig, workflow: str, *, after: int = 0, limit: int = 100
    ) -> builtins.list[dict[str, Any]]:
        """The committed events of ``workflow`` (the tenant of ``config``) with ``seq >
        after``, in order, at most ``limit`` (``business.read_events``; docs/checkpointer.md,
        "Workflow event logs")."""
        self._ensure_setup()
        tenant = self.tenant_of(config)
        name = workflow_log.workflow_name(workflow)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidInputError(f"limit must be an int from 1 to 1000, got {limit!r}")
        thread = validation.configurable(config).get("thread_id")
        context = ReadContext(
            tenant, thread if isinstance(thread, str) else None, operation="workflow.read"
        )
        found = self.uow.find(
            context, WORKFLOW_EVENT.name, self.business_db, workflow_log.COLLECTION,
            workflow_log.read_filter(tenant, name, after),
            projection={"_id": 0, "seq": 1, "event": 1, "thread_id": 1, "node": 1, "at": 1},
            sort=[("seq", 1)], limit=limit,
        )  # fmt: skip
        return builtins.list(found)

    def _settle(self, scope: Scope, ns: str | None) -> None:
        """Read your own writes: wait for this saver's queued puts on the thread (in
        ``ns``, or any namespace) to commit before reading it. A subgraph called again
        loads the state its previous call saved; ``get_state`` after a step sees it."""
        for run in self._runs_on(scope):

            def settled(r: ActiveRun = run) -> bool:
                return r.settled(ns)

            if not settled():
                run.signal.wait_for(settled, self.timeout)

    def _cache_is_current(self, scope: Scope, checkpoint_id: str | None) -> bool:
        """For a read that belongs to no run: whether the cached thread is current (one
        small read of the registry version, which also makes what is read next current
        at that version)."""
        if not self.cache.enabled:
            return False
        if checkpoint_id is not None and not self.cache.knows(scope.tenant_id, scope.thread_id):
            return False  # an addressed read of a thread this saver does not know
        version = self.leases.version(scope.tenant_id, scope.thread_id)
        if self.cache.validate(scope.tenant_id, scope.thread_id, version):
            return True
        return version is not None

    def _read_checkpoint(
        self, scope: Scope, checkpoint_id: str | None, *, keep: bool, remember: bool = False
    ) -> tuple[CheckpointTuple | None, cache.Entry | None]:
        """Read one checkpoint. ``remember``: the messages go to a run's loop, which never
        mutates them (LangGraph's rule): the next put need not hash them again. Messages
        handed to anyone else (``get_state``) are hashed again if they come back."""
        coll = self.collections.checkpoints
        if checkpoint_id is not None:
            doc = self._find_one(
                coll, {"_id": scope.checkpoint_doc_id(checkpoint_id), "tenant_id": scope.tenant_id}
            )
        else:
            doc = self._find_one(coll, scope.ns_filter, sort=[("checkpoint_id", -1)])
        if doc is None:
            return None, None
        batch = reads.ReadBatch(scope.tenant_id, [doc], self.serde)
        blob_docs, write_docs, message_docs = self._fetch(batch)
        [(tup, entry)] = batch.assemble(
            blob_docs,
            write_docs,
            message_docs,
            lambda d: self._config_extra(d["tenant_id"]),
            keep=keep and checkpoint_id is None,
            remember=self._remember if remember else None,
        )
        return tup, entry

    def _fetch(self, batch: reads.ReadBatch) -> tuple[list[Any], list[Any], list[Any]]:
        names = self.collections
        bf = batch.blobs_filter()
        blob_docs = self._find_all(names.blobs, bf) if bf else []
        wf = batch.writes_filter()
        write_docs = self._find_all(names.writes, wf) if wf else []
        cf = batch.chains_filter()
        if cf:
            blob_docs = reads.merge_docs(blob_docs, self._find_all(names.blobs, cf))
        basef = batch.bases_filter(blob_docs)
        if basef:
            blob_docs = reads.merge_docs(blob_docs, self._find_all(names.blobs, basef))
        mf = batch.messages_filter(blob_docs)
        message_docs = self._find_all(names.messages, mf) if mf else []
        return blob_docs, write_docs, message_docs

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints, newest first, in pages of 100 (each page one query for the
        checkpoints and a constant number for their values, writes and messages)."""
        tenant = self.tenant_of(config)
        query = reads.list_query(tenant, config, filter, before)
        self._ensure_layout()
        if isinstance(query.get("thread_id"), str):
            self._settle(Scope(tenant, query["thread_id"], ""), None)
        remaining = validation.limit(limit)
        last: tuple[str, str] | None = None
        while remaining is None or remaining > 0:
            size = _PAGE if remaining is None else min(_PAGE, remaining)
            page = self._find_all(
                self.collections.checkpoints,
                reads.after(query, last),
                sort=[("checkpoint_id", -1), ("_id", -1)],
                limit=size,
            )
            if not page:
                return
            batch = reads.ReadBatch(tenant, page, self.serde)
            blob_docs, write_docs, message_docs = self._fetch(batch)
            for tup, _ in batch.assemble(
                blob_docs, write_docs, message_docs, lambda d: self._config_extra(d["tenant_id"])
            ):
                yield tup
            if len(page) < size:
                return
            last = (page[-1]["checkpoint_id"], page[-1]["_id"])
            if remaining is not None:
                remaining -= len(page)
