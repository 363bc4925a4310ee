"""AsyncAccordSaver: the transactional checkpointer on pymongo's native ``AsyncMongoClient``.

Same storage model, transactions and guarantees as :class:`~accord.checkpointers.AccordSaver`;
every call is a coroutine on the driver's own asyncio I/O (no thread pool).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from pymongo import AsyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    CollectionInvalid,
    OperationFailure,
)

from accord.checkpointers import maintenance, ownership, schema, storage, validation
from accord.checkpointers.base import (
    AccordBase,
    AlreadyRecorded,
    HeadMoved,
    NotSaved,
    ReadBatch,
    check_business_marks,
    list_query,
    mark_ids,
    merge_docs,
    unsaved_checkpoint_error,
)
from accord.checkpointers.ops import (
    CLIENT_BULK_WIRE_VERSION,
    BusinessOpFailed,
    Counts,
    Group,
    client_batches,
    client_counts,
    client_models,
    collection_counts,
    merge_counts,
    translate_write_error,
)
from accord.checkpointers.saver import (
    _BATCH,
    _EXPECT_SECONDS,
    _IDLE_GRACE_SECONDS,
    _MAX_HEAD_ATTEMPTS,
    _OUTCOMES,
    _PAGE,
    _SAVE_WAIT_SECONDS,
    _WAIT_SECONDS,
    _reraise,
    _validate_writes,
)
from accord.checkpointers.storage import Scope
from accord.checkpointers.txn import READ_CONCERN, WRITE_CONCERN
from accord.errors import AccordError

T = TypeVar("T")


class _AsyncInflight:
    """asyncio twin of ``saver._Inflight`` (see there for why saves are ordered)."""

    def __init__(self) -> None:
        self._cond: asyncio.Condition | None = None
        self._puts: Counter[tuple[str, ...]] = Counter()
        self._outcomes: OrderedDict[tuple[str, ...], bool] = OrderedDict()
        #: outcome of the latest put per (tenant, thread, ns): after a failed put LangGraph
        #: saves nothing more in that run, so writes waiting for a checkpoint give up
        self._last: OrderedDict[tuple[str, ...], bool] = OrderedDict()
        #: newest checkpoint id this process saved per (tenant, thread, ns)
        self._saved: OrderedDict[tuple[str, ...], str] = OrderedDict()
        #: why a put failed (accord errors only), for the writes of its tasks
        self._errors: OrderedDict[tuple[str, ...], BaseException] = OrderedDict()

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    @asynccontextmanager
    async def put(self, key: tuple[str, ...]) -> AsyncIterator[list[bool]]:
        cond = self._condition()
        ok: list[bool] = []
        async with cond:
            self._puts[key] += 1
        try:
            yield ok
        except AccordError as exc:
            self._errors[key] = exc
            self._errors.move_to_end(key)
            while len(self._errors) > _OUTCOMES:
                self._errors.popitem(last=False)
            raise
        finally:
            async with cond:
                self._puts[key] -= 1
                if not self._puts[key]:
                    del self._puts[key]
                for table, k in ((self._outcomes, key), (self._last, key[:3])):
                    table[k] = bool(ok)
                    table.move_to_end(k)
                    while len(table) > _OUTCOMES:
                        table.popitem(last=False)
                if ok and key[3] > self._saved.get(key[:3], ""):
                    self._saved[key[:3]] = key[3]
                    self._saved.move_to_end(key[:3])
                    while len(self._saved) > _OUTCOMES:
                        self._saved.popitem(last=False)
                cond.notify_all()

    def error(self, key: tuple[str, ...]) -> BaseException | None:
        """The accord error that made this process's put of ``key`` fail, if any."""
        return self._errors.get(key)

    def _saving_before(self, key: tuple[str, ...]) -> bool:
        """Whether this process is saving ``key`` or an older checkpoint of its thread
        (checkpoint ids are time-ordered). Newer ones are ignored: they may be waiting
        for the very task writes that are waiting here."""
        return any(k[:3] == key[:3] and k[3] <= key[3] for k in self._puts)

    def _expected(self, key: tuple[str, ...]) -> bool:
        """Whether this process is running the thread and ``key`` is newer than anything
        it saved: its put is about to start (LangGraph submits it before the tasks)."""
        saved = self._saved.get(key[:3])
        return saved is not None and key[3] > saved and self._last.get(key[:3]) is True

    async def wait_put(self, key: tuple[str, ...]) -> None:
        """See ``saver._Inflight.wait_put``."""
        cond = self._condition()
        started = time.monotonic()
        async with cond:
            while key not in self._outcomes:
                waited = time.monotonic() - started
                if self._saving_before(key) and waited < _WAIT_SECONDS:
                    pass
                elif not (self._expected(key) and waited < _EXPECT_SECONDS):
                    return
                with suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), timeout=0.05)

    async def wait_outcome(self, key: tuple[str, ...]) -> bool | None:
        """See ``saver._Inflight.wait_outcome``."""
        cond = self._condition()
        deadline = time.monotonic() + _SAVE_WAIT_SECONDS
        idle_since: float | None = None
        async with cond:
            while key not in self._outcomes:
                now = time.monotonic()
                if self._saving_before(key):
                    idle_since = None
                elif self._last.get(key[:3]) is False:
                    break  # the run's last save failed: no save of this checkpoint will come
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since > _IDLE_GRACE_SECONDS:
                    break
                if now > deadline:
                    break
                with suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), timeout=0.05)
            return self._outcomes.get(key)


async def _wait_for(cond: asyncio.Condition, predicate: Callable[[], bool], timeout: float) -> None:
    # On timeout, proceed: the checks in the transaction still guard correctness.
    with suppress(TimeoutError):
        await asyncio.wait_for(cond.wait_for(predicate), timeout=timeout)


class AsyncAccordSaver(AccordBase):
    """Transactional checkpointer for async graphs (``graph.ainvoke``/``astream``).

    Example::

        async with AsyncAccordSaver.from_conn_string(uri) as saver:
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})
    """

    def __init__(self, client: AsyncMongoClient, *, db_name: str = "accord", **kwargs: Any) -> None:
        super().__init__(db_name=db_name, **kwargs)
        self.client = client
        self.db = client[self.db_name]
        self._inflight = _AsyncInflight()
        self._setup_done = False
        self._setup_lock: asyncio.Lock | None = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, *, db_name: str = "accord", **kwargs: Any
    ) -> AsyncIterator[AsyncAccordSaver]:
        """Connect, run :meth:`setup`, yield the saver, close the client on exit."""
        client: AsyncMongoClient = AsyncMongoClient(conn_string)
        try:
            saver = cls(client, db_name=db_name, **kwargs)
            await saver.setup()
            yield saver
        finally:
            await client.close()

    async def setup(self) -> None:
        """Create the collections and indexes (idempotent) and detect server features."""
        existing = set(await self.db.list_collection_names())
        for key, name in self.collections.all().items():
            if name not in existing:
                with suppress(CollectionInvalid):
                    await self.db.create_collection(name)
            await self.db[name].create_indexes(schema.index_models(self.collections)[key])
        if self._client_bulk is None:
            hello = await self.client.admin.command("hello")
            self._client_bulk = int(hello.get("maxWireVersion", 0)) >= CLIENT_BULK_WIRE_VERSION
        self._setup_done = True

    async def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if not self._setup_done:
                await self.setup()

    async def _transaction(self, fn: Callable[[AsyncClientSession], Awaitable[T]]) -> T:
        async with self.client.start_session() as session:
            return await session.with_transaction(
                fn, read_concern=READ_CONCERN, write_concern=WRITE_CONCERN
            )

    async def _execute(
        self, session: AsyncClientSession, groups: Sequence[Group]
    ) -> dict[str, Counts]:
        groups = [g for g in groups if g.ops]
        out: dict[str, Counts] = {}
        if self._client_bulk:
            models, owners = client_models(groups)
            offset = 0
            for batch, batch_owners in client_batches(models, owners):
                try:
                    result = await self.client.bulk_write(
                        batch, session=session, ordered=True, verbose_results=True
                    )
                except ClientBulkWriteException as exc:
                    _reraise(exc, translate_write_error(exc, groups, offset))
                offset += len(batch)
                merge_counts(out, client_counts(result, batch_owners))
            return out
        for g in groups:
            try:
                res = await self.client[g.db][g.collection].bulk_write(
                    [op.model() for op in g.ops], ordered=True, session=session
                )
            except (BulkWriteError, OperationFailure) as exc:
                _reraise(exc, translate_write_error(exc, [g]))
            merge_counts(out, {g.name: collection_counts(res)})
        return out

    # --- write path --------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint, its changed channel values and new messages in one transaction.

        Raises:
            ConcurrentRunError: another writer advanced the thread; nothing was written.
        """
        scope = self._scope(config)
        conf = validation.configurable(config)
        parent_id = validation.optional_identifier(conf.get("checkpoint_id"), "checkpoint_id")
        checkpoint_id = validation.identifier(checkpoint.get("id"), "checkpoint['id']")
        metadata = get_serializable_checkpoint_metadata(config, metadata)
        await self._ensure_setup()
        writer = self.writer_token(config)
        async with self._inflight.put(
            (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id)
        ) as ok:
            # Business writes staged by the parent's tasks commit before this checkpoint
            # does (registered first, so this checkpoint's own task writes wait for it).
            await self._await_units(scope, parent_id, _WAIT_SECONDS)
            # ... and if one of them failed, this checkpoint must not be saved at all.
            self._refuse_put(scope, config, parent_id, checkpoint_id)
            plan = ownership.fast_plan(parent_id)
            docs = self._build_put(
                scope, config, checkpoint, metadata, new_versions, parent_id, use_cache=True
            )
            for _ in range(_MAX_HEAD_ATTEMPTS):
                if plan is None:
                    head = await self.db[self.collections.heads].find_one({"_id": scope.head_id})
                    plan = self._decide_put(scope, head, conf, checkpoint_id, parent_id, metadata)
                    if plan.expected != parent_id:
                        docs = self._build_put(
                            scope,
                            config,
                            checkpoint,
                            metadata,
                            new_versions,
                            parent_id,
                            use_cache=False,
                        )
                groups = self._put_groups(
                    scope, docs, plan, checkpoint_id, metadata.get("run_id"), writer
                )
                current = plan

                async def txn(
                    session: AsyncClientSession,
                    groups: list[Group] = groups,
                    current: Any = current,
                ) -> None:
                    counts = await self._execute(session, groups)
                    if not self._head_ok(current, counts["head"]):
                        raise HeadMoved()

                try:
                    await self._transaction(txn)
                    ok.append(True)
                    break
                except HeadMoved:
                    plan = None
            else:
                raise self._kept_moving(scope, checkpoint_id)
        self._remember_messages(scope, checkpoint_id, docs.message_refs, parent_id)
        return {
            "configurable": {
                "thread_id": scope.thread_id,
                "checkpoint_ns": scope.checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                **({"tenant_id": scope.tenant_id} if scope.tenant_id != self.tenant_id else {}),
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes, and apply the business writes it staged, in one transaction.

        Raises:
            ConcurrentRunError: the checkpoint is no longer the thread's head.
        """
        scope = self._scope(config)
        conf = validation.configurable(config)
        checkpoint_id = validation.identifier(conf.get("checkpoint_id"), "checkpoint_id")
        task_id = validation.identifier(task_id, "task_id")
        task_path = validation.identifier(task_path, "task_path", allow_empty=True)
        writes = _validate_writes(writes)
        if not writes:
            return
        await self._ensure_setup()
        marker = conf.get(ownership.BRANCH_MARKER)
        writer = self.writer_token(config)
        key = (scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id)
        apply_business = True
        error: BaseException | None = None
        try:
            await self._inflight.wait_put(key)
            for _ in range(_MAX_HEAD_ATTEMPTS):
                groups = self._writes_groups(
                    scope, checkpoint_id, writes, task_id, task_path, apply_business=apply_business
                )

                async def txn(session: AsyncClientSession, groups: list[Group] = groups) -> None:
                    head = await self.db[self.collections.heads].find_one(
                        {"_id": scope.head_id}, session=session
                    )
                    verdict = self._write_verdict(head, checkpoint_id, marker, writer)
                    if verdict != "ok":
                        cid = self._checkpoint_doc_id(scope, checkpoint_id)
                        exists = await self.db[self.collections.checkpoints].find_one(
                            {"_id": cid}, projection={"_id": 1}, session=session
                        )
                        self._after_existence(
                            scope, head, verdict, checkpoint_id, exists is not None
                        )
                    marks = mark_ids(groups)
                    if marks and await self.db[self.collections.writes].find_one(
                        {"_id": {"$in": marks}}, projection={"_id": 1}, session=session
                    ):
                        # The task was recorded before (another attempt or worker ran it):
                        # its business writes were applied then. Check first, so they are
                        # not even attempted (a unique key would fail the transaction).
                        raise AlreadyRecorded()
                    counts = await self._execute(session, groups)
                    if marks:
                        check_business_marks(counts.get("marks"))

                try:
                    await self._transaction(txn)
                    return
                except AlreadyRecorded:
                    # Applied when the task was first recorded: exactly once, never again.
                    apply_business = False
                except BusinessOpFailed as failed:
                    raise self._business_error(scope, checkpoint_id, task_id, failed) from (
                        failed.cause
                    )
                except NotSaved:
                    if not await self._inflight.wait_outcome(key):
                        raise unsaved_checkpoint_error(
                            scope, checkpoint_id, task_id, self._inflight.error(key)
                        ) from None
            raise unsaved_checkpoint_error(scope, checkpoint_id, task_id, self._inflight.error(key))
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._unit_done(
                scope, checkpoint_id, task_id, config=config, writes=writes, error=error
            )

    # --- read path ---------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest when no ``checkpoint_id``) with a constant number
        of indexed queries (blobs and writes are fetched concurrently)."""
        scope = self._scope(config)
        checkpoint_id = validation.optional_identifier(
            validation.configurable(config).get("checkpoint_id"), "checkpoint_id"
        )
        coll = self.db[self.collections.checkpoints]
        if checkpoint_id is not None:
            doc = await coll.find_one(
                {
                    "_id": schema.checkpoint_doc_id(
                        scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id
                    ),
                    "tenant_id": scope.tenant_id,
                }
            )
        else:
            doc = await coll.find_one(scope.ns_filter, sort=[("checkpoint_id", -1)])
        if doc is None:
            return None
        batch = ReadBatch(scope.tenant_id, [doc], self.serde)
        blob_docs, write_docs, message_docs = await self._fetch(batch)
        if checkpoint_id is None:
            self._remember_messages(scope, doc["checkpoint_id"], batch.message_refs(blob_docs, doc))
        return batch.assemble(
            blob_docs,
            write_docs,
            message_docs,
            lambda d: self._config_extra(scope, marker=checkpoint_id),
        )[0]

    async def _find(self, collection: str, filter: dict[str, Any] | None) -> list[Any]:
        if filter is None:
            return []
        return await self.db[collection].find(filter, batch_size=_BATCH).to_list(None)

    async def _fetch(self, batch: ReadBatch) -> tuple[list[Any], list[Any], list[Any]]:
        blob_docs, chain_docs, write_docs = await asyncio.gather(
            self._find(self.collections.blobs, batch.blobs_filter()),
            self._find(self.collections.blobs, batch.chains_filter()),
            self._find(self.collections.writes, batch.writes_filter()),
        )
        blob_docs = merge_docs(blob_docs, chain_docs)
        more = await self._find(self.collections.blobs, batch.bases_filter(blob_docs))
        blob_docs = merge_docs(blob_docs, more)
        message_docs = await self._find(self.collections.messages, batch.messages_filter(blob_docs))
        return blob_docs, write_docs, message_docs

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """List checkpoints, newest first, hydrated in pages (3 queries per page)."""
        tenant, query = list_query(self, config, filter, before)
        limit = validation.limit(limit)
        if limit == 0:
            return
        cursor = self.db[self.collections.checkpoints].find(
            query, sort=[("checkpoint_id", -1)], batch_size=_PAGE
        )
        if limit is not None:
            cursor = cursor.limit(limit)

        def extra(d: Any) -> dict[str, Any]:
            return self._config_extra(
                Scope(d["tenant_id"], d["thread_id"], d["checkpoint_ns"]), marker=d["checkpoint_id"]
            )

        try:
            page: list[Any] = []
            async for doc in cursor:
                page.append(doc)
                if len(page) >= _PAGE:
                    for tup in await self._hydrate_page(tenant, page, extra):
                        yield tup
                    page = []
            if page:
                for tup in await self._hydrate_page(tenant, page, extra):
                    yield tup
        finally:
            await cursor.close()

    async def _hydrate_page(
        self, tenant: str, page: list[Any], extra: Any
    ) -> list[CheckpointTuple]:
        batch = ReadBatch(tenant, page, self.serde)
        return batch.assemble(*(await self._fetch(batch)), extra)

    # --- maintenance -------------------------------------------------------------------

    async def adelete_thread(self, thread_id: str, *, tenant_id: str | None = None) -> None:
        """Delete every document of a thread (all namespaces) in the saver's collections."""
        scope = self._scope_for(thread_id, tenant_id)
        for name, filt in maintenance.thread_deletes(self.collections, scope):
            await self.db[name].delete_many(filt)
        self._forget_thread(scope.tenant_id, scope.thread_id)

    async def acopy_thread(
        self, source_thread_id: str, target_thread_id: str, *, tenant_id: str | None = None
    ) -> None:
        """Copy a thread's checkpoints, writes, values and messages to a new thread id."""
        src = self._scope_for(source_thread_id, tenant_id)
        dst = self._scope_for(target_thread_id, tenant_id)
        await self._ensure_setup()
        if await self.db[self.collections.checkpoints].find_one(
            dst.thread_filter, projection={"_id": 1}
        ):
            raise validation.InvalidInputError(
                f"copy_thread: target thread {dst.thread_id!r} already has checkpoints; delete it first."
            )
        for key in ("checkpoints", "blobs", "writes", "messages", "heads"):
            coll = getattr(self.collections, key)
            batch: list[dict[str, Any]] = []
            async for doc in self.db[coll].find(src.thread_filter):
                batch.append(maintenance.rekey(key, doc, dst.thread_id))
                if len(batch) >= _PAGE:
                    await maintenance.upsert_all(self.db[coll], batch)
                    batch = []
            if batch:
                await maintenance.upsert_all(self.db[coll], batch)

    async def adelete_for_runs(
        self, run_ids: Sequence[str], *, tenant_id: str | None = None
    ) -> None:
        """Delete the checkpoints (and their writes) created by the given runs; see
        :meth:`AccordSaver.delete_for_runs`."""
        runs = validation.thread_ids(run_ids, "run_ids")
        tenant = (
            self.tenant_id if tenant_id is None else validation.identifier(tenant_id, "tenant_id")
        )
        if not runs:
            return
        cps = self.db[self.collections.checkpoints]
        doomed = await cps.find(
            {"tenant_id": tenant, "run_id": {"$in": runs}},
            projection={"thread_id": 1, "checkpoint_ns": 1, "checkpoint_id": 1},
        ).to_list(None)
        for (thread_id, ns), ids in maintenance.by_scope(doomed).items():
            scope = Scope(tenant, thread_id, ns)
            await self.db[self.collections.writes].delete_many(
                {**scope.ns_filter, "checkpoint_id": {"$in": ids}}
            )
            await cps.delete_many({**scope.ns_filter, "checkpoint_id": {"$in": ids}})
            await self._repair(scope)

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str = "keep_latest",
        tenant_id: str | None = None,
    ) -> None:
        """Prune threads; see :meth:`AccordSaver.prune`."""
        threads = validation.thread_ids(thread_ids)
        if strategy not in ("keep_latest", "delete"):
            raise validation.InvalidInputError(
                f"prune strategy must be 'keep_latest' or 'delete', got {strategy!r}."
            )
        for thread_id in threads:
            if strategy == "delete":
                await self.adelete_thread(thread_id, tenant_id=tenant_id)
                continue
            scope0 = self._scope_for(thread_id, tenant_id)
            cps = self.db[self.collections.checkpoints]
            for ns in await cps.distinct("checkpoint_ns", scope0.thread_filter):
                scope = Scope(scope0.tenant_id, thread_id, ns)
                latest = await cps.find_one(scope.ns_filter, sort=[("checkpoint_id", -1)])
                if latest is None or maintenance.uses_delta_channels(latest, self.serde):
                    continue
                keep = latest["checkpoint_id"]
                await self.db[self.collections.writes].delete_many(
                    {**scope.ns_filter, "checkpoint_id": {"$ne": keep}}
                )
                await cps.delete_many({**scope.ns_filter, "checkpoint_id": {"$ne": keep}})
                await self._repair(scope)

    async def _repair(self, scope: Scope) -> None:
        started = maintenance.gc_cutoff()
        cps = self.db[self.collections.checkpoints]
        referenced: set[str] = set()
        async for d in cps.find(scope.ns_filter, projection={"blobs": 1}):
            referenced.update(d.get("blobs") or ())
        links: dict[str, Any] = {}
        async for b in self.db[self.collections.blobs].find(
            {**scope.ns_filter, "type": schema.MSGREFS_TYPE, "chunk": 0},
            projection={"key": 1, "prev": 1, "base": 1},
        ):
            links[b["key"]] = b.get("prev") or b.get("base")
        referenced = storage.chain_closure(referenced, links)
        await self.db[self.collections.blobs].delete_many(
            {**scope.ns_filter, "key": {"$nin": sorted(referenced)}, "created_at": {"$lt": started}}
        )
        refs: set[str] = set()
        async for b in self.db[self.collections.blobs].find(
            {**scope.thread_filter, "type": schema.MSGREFS_TYPE}, projection={"refs": 1}
        ):
            refs.update(b.get("refs") or ())
        await self.db[self.collections.messages].delete_many(
            {**scope.thread_filter, "key": {"$nin": sorted(refs)}, "created_at": {"$lt": started}}
        )
        latest = await cps.find_one(
            scope.ns_filter,
            sort=[("checkpoint_id", -1)],
            projection={"checkpoint_id": 1, "run_id": 1},
        )
        heads = self.db[self.collections.heads]
        head = await heads.find_one({"_id": scope.head_id})
        if latest is None:
            await heads.delete_one({"_id": scope.head_id})
        elif head is None or not await cps.find_one(
            {**scope.ns_filter, "checkpoint_id": head["checkpoint_id"]}, projection={"_id": 1}
        ):
            await heads.replace_one(
                {"_id": scope.head_id},
                maintenance.head_doc(scope, latest["checkpoint_id"], latest.get("run_id")),
                upsert=True,
            )
        self._forget_thread(scope.tenant_id, scope.thread_id)

    # --- sync API: use AccordSaver -----------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        raise _use_sync()

    def put(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        raise _use_sync()

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        raise _use_sync()


def _use_sync() -> AccordError:
    return AccordError(
        "AsyncAccordSaver is the async checkpointer; for invoke/stream use AccordSaver "
        "(pymongo MongoClient), or call the a-prefixed methods."
    )
