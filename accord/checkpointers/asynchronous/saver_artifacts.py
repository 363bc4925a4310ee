"""Artifacts by pointer: ``put_artifact`` stores large outputs and files in GridFS's layout
(:mod:`accord.platform.gridfs_layout`) before the step, ``get_artifact`` reads the committed
ones back checked against their digest (a pending one is refused: ``ArtifactPending``),
``gc_artifacts`` collects the orphans of steps that never committed.

Inside a node, an artifact is stored *pending* (its own transactions, before the step)
and its reference is committed by the transaction that records the task as finished
(``put_writes``): a task that fails, is interrupted or whose process dies leaves a
pending artifact, which ``gc_artifacts`` deletes once it is older than its grace. Outside
a node (a config naming a thread but no running task), the artifact is committed to the
thread at once. Artifacts go with their thread (``delete_thread``, the ``ttl`` sweep).

This module is the async source; its sync twin ``accord/checkpointers/synchronous/saver_artifacts.py`` is generated from it by ``tools/synchro.py``.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config

from accord.checkpointers import langgraph_internals, plans, validation
from accord.checkpointers.asynchronous.saver_writes import AsyncSaverWrites
from accord.checkpointers.storage import BUSINESS_CHANNEL, Scope
from accord.errors import (
    ArtifactNotFound,
    ArtifactPending,
    ConfigurationError,
    InvalidInputError,
)
from accord.platform import gridfs_layout as gl
from accord.platform.artifacts import ARTIFACT, ARTIFACT_CHUNK
from accord.platform.asynchronous.catalog import AsyncCatalog
from accord.platform.context import ReadContext, WriteContext
from accord.platform.plan import Counts, Expect, Group, Op, Plan, insert_once

_IS_SYNC = False

#: Chunks written per transaction (255 KiB each: about 16 MiB).
_CHUNKS_PER_TXN = 64
#: Orphans examined per ``gc_artifacts`` round.
_GC_BATCH = 500
_MAX_METADATA = 64 * 1024
#: Nesting of an artifact's metadata, at most (the files document holds it at its second
#: level; MongoDB stores 180 levels).
_MAX_METADATA_DEPTH = 100


class _NotPending(Exception):
    """Internal: an orphan candidate was committed (or deleted) before the sweep got it."""


def _not_pending(counts: Counts) -> BaseException:
    return _NotPending()


class AsyncSaverArtifacts(AsyncSaverWrites):
    """``put_artifact``, ``get_artifact`` and ``gc_artifacts`` (module docstring)."""

    _artifacts_ready = False

    async def _artifact_setup(self) -> None:
        """Create the two GridFS collections with their indexes, in the catalog (once)."""
        if self._artifacts_ready:
            return
        await self._ensure_setup()
        await AsyncCatalog(self.uow, self.db_name).setup(
            "artifacts", {gl.FILES: ARTIFACT.name, gl.CHUNKS: ARTIFACT_CHUNK.name}, gl.INDEXES
        )
        self._artifacts_ready = True

    async def aput_artifact(
        self,
        config: RunnableConfig,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        filename: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> gl.ArtifactRef:
        """Store ``data`` (bytes) as an artifact of the thread of ``config`` and return its
        reference (id, SHA-256 digest, length, content type) to keep in state.

        Called from a node with the node's ``config``, the artifact is pending until the
        task's writes commit (then it is the step's); a task that never commits leaves
        an orphan that :meth:`agc_artifacts` collects. Called with a plain thread config,
        it is committed to the thread at once. ``metadata``: a small document (at most
        64 KiB of BSON) kept with it.

        Raises:
            InvalidInputError: ``data`` is not bytes, a label or the metadata is invalid.
            ConfigurationError: called in a node of a graph run with ``durability="exit"``
                (its tasks are never recorded one by one, so the reference could not be).
        """
        blob = gl.data_of(data)
        ctype = gl.text(content_type, "content_type") or ""
        fname = gl.text(filename, "filename", optional=True)
        meta = _metadata(metadata)
        scope = self._scope(config)
        conf = validation.configurable(config)
        send = conf.get(langgraph_internals.CONFIG_SEND)
        info = getattr(conf.get(langgraph_internals.CONFIG_RUNTIME), "execution_info", None)
        if send is not None and conf.get(langgraph_internals.CONFIG_DURABILITY) == "exit":
            raise ConfigurationError(
                "put_artifact in a node needs durability='sync' or 'async': with "
                "durability='exit' LangGraph does not record tasks one by one, so the "
                "artifact's reference could never be committed."
            )
        checkpoint_id = getattr(info, "checkpoint_id", None) or conf.get("checkpoint_id")
        task_id = getattr(info, "task_id", None)
        ref = gl.ArtifactRef(gl.new_id(), gl.digest(blob), len(blob), ctype)
        await self._artifact_setup()
        files = gl.files_doc(
            ref, tenant_id=scope.tenant_id, thread_id=scope.thread_id,
            checkpoint_ns=scope.checkpoint_ns,
            checkpoint_id=checkpoint_id if isinstance(checkpoint_id, str) else None,
            task_id=task_id if isinstance(task_id, str) else None, status=gl.PENDING,
            filename=fname, metadata=meta, at=datetime.now(UTC),
        )  # fmt: skip
        chunks = gl.chunk_docs(ref.id, blob, tenant_id=scope.tenant_id, thread_id=scope.thread_id)
        batches = [
            chunks[i : i + _CHUNKS_PER_TXN] for i in range(0, len(chunks), _CHUNKS_PER_TXN)
        ] or [[]]
        # the files document first, pending: a crash half-way leaves an orphan to collect
        for n, batch in enumerate(batches):
            groups: list[Group] = []
            if n == 0:
                groups.append(Group("artifact", self.db_name, gl.FILES, ARTIFACT.name,
                                    [Op("insert", doc=files)]))  # fmt: skip
            if batch:
                groups.append(
                    Group(
                        "artifact:chunks",
                        self.db_name,
                        gl.CHUNKS,
                        ARTIFACT_CHUNK.name,
                        [Op("insert", doc=c) for c in batch],
                    )  # fmt: skip
                )
            if send is None and n == len(batches) - 1:
                groups.append(_commit_now(self.db_name, ref.id))
            await self.uow.execute(Plan(_context(scope.tenant_id, scope.thread_id, "put"), groups))
        if send is not None:
            if isinstance(checkpoint_id, str) and isinstance(task_id, str):
                self.note_staged(config, checkpoint_id, task_id)
            send([(BUSINESS_CHANNEL, {"op": plans.COMMIT_ARTIFACT, "collection": gl.FILES,
                                      "artifact_id": ref.id})])  # fmt: skip
        return ref

    async def aget_artifact(self, ref: Any, *, tenant_id: str | None = None) -> bytes:
        """The bytes of the artifact ``ref`` (an :class:`ArtifactRef` or its dict form) of
        ``tenant_id`` (default: the saver's tenant), checked against the reference.

        Only a committed artifact is read: one whose step has not committed is refused
        (:class:`ArtifactPending`), except that a node of a run this saver holds, reading
        an artifact an earlier task of the run stored, waits for that task's writes to
        commit ("async" durability saves them while the next step runs).

        Raises:
            ArtifactPending: the artifact's step has not committed (a subclass of
                ``ArtifactNotFound``).
            ArtifactNotFound: no such artifact for the tenant.
            ArtifactCorrupted: its stored bytes differ from the reference (length,
                digest, missing chunks).
        """
        art = gl.ref_of(ref)
        tenant = self.tenant_named(tenant_id)
        await self._artifact_setup()
        context = ReadContext(tenant_id=tenant, operation="artifact.read")
        files = await self._files_of(context, art.id, tenant)
        if files is not None and files.get("status") == gl.PENDING:
            files = await self._once_committed(context, files)
        if files is None:
            raise ArtifactNotFound(
                f"no artifact {art.id!r} for tenant {tenant!r}: never stored, deleted with "
                f"its thread, or collected as an orphan (its step never committed)."
            )
        chunks = await self.uow.find(
            context, ARTIFACT_CHUNK.name, self.db_name, gl.CHUNKS,
            {"files_id": files["_id"], "tenant_id": tenant}, sort=[("n", 1)],
        )  # fmt: skip
        return gl.assemble(art, files, chunks)

    async def _files_of(
        self, context: ReadContext, art_id: str, tenant: str
    ) -> dict[str, Any] | None:
        """The files document of ``art_id``: the original unless it is pending and a
        committed copy of it exists (a copy's state refers to the original: forks), then
        that copy."""
        files = await self.uow.find_one(
            context, ARTIFACT.name, self.db_name, gl.FILES, {"_id": art_id, "tenant_id": tenant}
        )
        if files is not None and files.get("status") != gl.PENDING:
            return files  # type: ignore[no-any-return]
        copy = await self.uow.find_one(
            context, ARTIFACT.name, self.db_name, gl.FILES,
            {"alias_of": art_id, "tenant_id": tenant, "status": gl.COMMITTED},
        )  # fmt: skip
        return copy if copy is not None else files  # type: ignore[no-any-return]

    async def _once_committed(
        self, context: ReadContext, files: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``files`` (pending) once its step committed, when the reader is a later task of
        a run of this saver whose writes are under way; else :class:`ArtifactPending`."""
        run = self._reader_run(files)
        if run is not None:
            thread, task = str(files.get("thread_id")), str(files.get("task_id"))
            key = (str(files.get("tenant_id")), thread, str(files.get("checkpoint_id")))
            staged = self._staged_of(run)
            # its task's writes: recorded or queued first, then the run's queue committed
            # (every namespace: the artifact's is its task's, not its writes')
            await staged.signal.await_for(lambda: not staged.noted(key, task), self.timeout)
            await run.signal.await_for(
                lambda: not run.writes_pending() or run.failure is not None, self.timeout
            )
            again = await self.uow.find_one(
                context, ARTIFACT.name, self.db_name, gl.FILES,
                {"_id": files["_id"], "tenant_id": files.get("tenant_id")},
            )  # fmt: skip
            if again is not None and again.get("status") != gl.PENDING:
                return again  # type: ignore[no-any-return]
        raise ArtifactPending(
            f"artifact {files['_id']!r} of thread {files.get('thread_id')!r} is pending: the "
            f"step that stored it (task {files.get('task_id')!r}) has not committed: it is "
            f"still running, it failed or its process died, or a rollback undid it. Nothing "
            f"was read; read it once the step committed (gc_artifacts collects it if it "
            f"never does). A node cannot read back an artifact it stored itself: keep the "
            f"bytes it stored."
        )

    def _reader_run(self, files: Mapping[str, Any]) -> Any | None:
        """The run of this saver the calling node belongs to, on the artifact's thread,
        unless the caller is the task that stored it (None outside a node)."""
        try:
            config = get_config()
        except RuntimeError:
            return None
        conf = validation.configurable(config)
        info = getattr(conf.get(langgraph_internals.CONFIG_RUNTIME), "execution_info", None)
        mine = (getattr(info, "checkpoint_id", None), getattr(info, "task_id", None))
        if mine == (files.get("checkpoint_id"), files.get("task_id")):
            return None  # its own artifact: its writes come only after it returns
        scope = Scope(str(files.get("tenant_id")), str(files.get("thread_id")),
                      str(files.get("checkpoint_ns") or ""))  # fmt: skip
        return self._run_of(scope, config)

    async def agc_artifacts(self, *, grace: float = 3600.0) -> int:
        """Delete the orphaned artifacts (every tenant): pending ones, stored more than
        ``grace`` seconds ago, whose step never committed; returns how many. The grace
        must exceed the longest task (a task still running past it loses its artifacts,
        and its commit then fails with ``ArtifactNotFound``)."""
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not 0 <= grace <= validation.MAX_ARTIFACT_GRACE
        ):  # (inf overflowed the cutoff's timedelta)
            raise InvalidInputError(
                f"grace must be a number of seconds from 0 to {validation.MAX_ARTIFACT_GRACE:.0f} "
                f"(a year), got {grace!r}"
            )
        await self._artifact_setup()
        cutoff = datetime.now(UTC) - timedelta(seconds=float(grace))
        collected = 0
        while True:
            orphans = await self.uow.find(
                ReadContext(tenant_id="*", operation="artifact.gc"), ARTIFACT.name,
                self.db_name, gl.FILES, {"status": gl.PENDING, "uploadDate": {"$lt": cutoff}},
                projection={"tenant_id": 1, "thread_id": 1}, limit=_GC_BATCH,
            )  # fmt: skip
            done = 0
            for doc in orphans:
                if await self._collect_orphan(doc):
                    done += 1
            collected += done
            if len(orphans) < _GC_BATCH or not done:
                return collected

    async def _collect_orphan(self, doc: Mapping[str, Any]) -> bool:
        """Delete one pending artifact and its chunks in one transaction, unless its step
        committed it meanwhile (the deletion matches only while it is pending)."""
        art_id, tenant = doc["_id"], str(doc.get("tenant_id"))
        groups = [
            Group("artifact", self.db_name, gl.FILES, ARTIFACT.name,
                  [Op("delete", {"_id": art_id, "tenant_id": tenant, "status": gl.PENDING})],
                  expect=Expect(deleted=1, error=_not_pending)),
            Group("artifact:chunks", self.db_name, gl.CHUNKS, ARTIFACT_CHUNK.name,
                  [Op("delete_many", {"files_id": art_id, "tenant_id": tenant})]),
        ]  # fmt: skip
        thread = doc.get("thread_id")
        plan = Plan(_context(tenant, thread if isinstance(thread, str) else None, "gc"), groups)
        try:
            await self.uow.execute(plan)
        except _NotPending:
            return False
        return True

    async def _copy_artifacts(self, source: Scope, target: Scope) -> int:
        """Copy the committed artifacts of thread ``source`` to thread ``target``
        (``copy_thread``, a fork), each to a copy of its own: ``_id`` derived from the
        original and the target thread, ``alias_of`` the id the copied state refers to.
        So either thread can be deleted without taking the other's bytes, and
        :meth:`aget_artifact` finds a copy by the original's id. Pending first, committed
        with its last chunks (a crash half-way leaves an orphan for ``gc_artifacts``);
        idempotent (a copy retried after a crash writes the same documents). Returns
        how many artifacts it copied."""
        await self._artifact_setup()
        context = ReadContext(tenant_id=source.tenant_id, thread_id=source.thread_id,
                              operation="artifact.copy")  # fmt: skip
        copied = 0
        last: Any = None
        while True:
            filt: dict[str, Any] = {"tenant_id": source.tenant_id,
                                    "thread_id": source.thread_id, "status": gl.COMMITTED}  # fmt: skip
            if last is not None:
                filt["_id"] = {"$gt": last}
            docs = await self.uow.find(context, ARTIFACT.name, self.db_name, gl.FILES, filt,
                                       sort=[("_id", 1)], limit=_GC_BATCH)  # fmt: skip
            for doc in docs:
                await self._copy_artifact(context, doc, target)
                copied += 1
            if len(docs) < _GC_BATCH:
                return copied
            last = docs[-1]["_id"]

    async def _copy_artifact(
        self, context: ReadContext, doc: Mapping[str, Any], target: Scope
    ) -> None:
        files = gl.copy_files_doc(doc, target.thread_id)
        copy_id, n = files["_id"], 0
        while True:
            chunks = await self.uow.find(
                context, ARTIFACT_CHUNK.name, self.db_name, gl.CHUNKS,
                {"files_id": doc["_id"], "tenant_id": target.tenant_id,
                 "n": {"$gte": n, "$lt": n + _CHUNKS_PER_TXN}}, sort=[("n", 1)],
            )  # fmt: skip
            groups: list[Group] = []
            if n == 0:
                groups.append(Group("artifact", self.db_name, gl.FILES, ARTIFACT.name,
                                    [insert_once(files)]))  # fmt: skip
            if chunks:
                copies = [gl.copy_chunk_doc(c, copy_id, target.thread_id) for c in chunks]
                groups.append(Group("artifact:chunks", self.db_name, gl.CHUNKS,
                                    ARTIFACT_CHUNK.name, [insert_once(c) for c in copies]))  # fmt: skip
            n += _CHUNKS_PER_TXN
            done = len(chunks) < _CHUNKS_PER_TXN
            if done:
                groups.append(_commit_now(self.db_name, copy_id))
            await self.uow.execute(
                Plan(_context(target.tenant_id, target.thread_id, "copy"), groups)
            )
            if done:
                return

    def _thread_artifacts(self, thread_filter: Mapping[str, Any]) -> builtins.list[Group]:
        """Groups deleting a thread's artifacts (``delete_thread``, the ``ttl`` sweep)."""
        f = dict(thread_filter)
        return [
            Group("delete:artifacts", self.db_name, gl.FILES, ARTIFACT.name,
                  [Op("delete_many", f)]),
            Group("delete:artifact_chunks", self.db_name, gl.CHUNKS, ARTIFACT_CHUNK.name,
                  [Op("delete_many", f)]),
        ]  # fmt: skip


def _context(tenant_id: str, thread_id: str | None, what: str) -> WriteContext:
    return WriteContext(tenant_id=tenant_id, thread_id=thread_id, operation=f"artifact.{what}")


def _commit_now(db: str, artifact_id: str) -> Group:
    """An artifact stored outside a node: committed to its thread with its last chunks."""
    op = Op("update", {"_id": artifact_id, "status": gl.PENDING},
            {"$set": {"status": gl.COMMITTED}})  # fmt: skip
    return Group("artifact:commit", db, gl.FILES, ARTIFACT.name, [op])


def _metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(value).__name__}")
    doc = dict(value)
    # (the database refused it only when the files document was inserted, naming no field)
    if validation.nested_deeper(doc, _MAX_METADATA_DEPTH):
        raise InvalidInputError(f"metadata is nested more than {_MAX_METADATA_DEPTH} levels deep")
    try:
        size = len(bson.encode(doc))
    except UnicodeEncodeError as exc:  # was raised raw: BSON strings are UTF-8
        raise InvalidInputError(
            f"metadata holds a lone surrogate at character {exc.start} of a string; "
            f"strings must be valid Unicode"
        ) from None
    except OverflowError:  # was raised raw by the driver
        raise InvalidInputError("metadata holds an int of more than 64 bits") from None
    except (TypeError, bson.errors.InvalidDocument) as exc:
        raise InvalidInputError(f"metadata must be a BSON document: {exc}") from None
    if size > _MAX_METADATA:
        raise InvalidInputError(
            f"artifact metadata is at most {_MAX_METADATA} bytes of BSON, this one is {size}"
        )
    if any(not isinstance(k, str) or k.startswith("$") or "." in k for k in doc):
        raise InvalidInputError("metadata keys must be strings without a leading '$' or '.'")
    return doc
