"""The unit of work: accord's kernel, the one path of every write and every read.

Writes. Every component hands it a :class:`~accord.platform.plan.Plan` (data, with its
:class:`~accord.platform.context.WriteContext`) and it runs the plan in ONE multi-document
transaction:

0. the ``refresh`` hooks may name a read that is due (governance re-reading the stored
   policy every few seconds); the kernel makes it, through its read path, and hands it
   back (before every read too);
1. the ``check`` hooks (pure: the tenancy guard, governance's policy) may refuse it;
2. the ``derive`` hooks (pure) may add groups: the outbox inserts, a memory's vectors;
3. the run guard of the context (``context.guard``, :class:`~accord.platform.runs.ThreadGuard`)
   becomes the transaction's first group: no writer can commit to a thread without it;
4. in each transaction attempt: ``find_one_and_update`` ops (claims) first, one command each;
   then the ``seal`` hooks read what they need in the session and add groups (an audit
   chain's records and heads), on every attempt, after every plan of the batch is final;
   then every write in one client-level ``bulkWrite`` on MongoDB 8.0+ (maxWireVersion >= 25;
   batches of 100 ops), else one ``bulk_write`` per group; then the groups' guards
   (:class:`~accord.platform.plan.Expect`): a violated guard aborts the transaction and
   raises the guard's error;
5. commit, with write concern majority.

A plan that fits one batch costs two round trips (``bulkWrite`` and ``commitTransaction``);
a seal hook that reads adds one per read. ``execute_all`` runs several plans (a checkpointer
run's queued saves) in one transaction, each plan checked and derived as itself.

Reads. :meth:`AsyncUnitOfWork.find` / :meth:`find_one` / :meth:`aggregate` / :meth:`count`
take a :class:`~accord.platform.context.ReadContext` and the artifact class read; the
``read`` hooks may refuse the read, narrow its filter, or record it. A refusal (by a check
or read hook, :class:`~accord.errors.PermissionDenied`) is handed to the ``refused`` hooks,
whose plans run on their own (an audit record of the denial). A seal hook refuses in the
transaction by raising a :class:`~accord.platform.hooks.SealRefusal` carrying a
:class:`~accord.platform.hooks.Refusal` (the audit hook's refusal of an unjustified audit
cut): once the transaction has aborted, that refusal is handed to the
``refused`` hooks the same way, once, however many attempts the transaction took.

Retries: ``TransientTransactionError`` (write conflicts, a dropped connection, an election,
a :class:`~accord.platform.hooks.SealConflict`) reruns the transaction and
``UnknownTransactionCommitResult`` reruns the commit, as ``ClientSession.with_transaction``
does, but within ``timeout`` seconds for everything (pymongo's client-side operation
timeout), never minutes. Every op is idempotent by construction of the plans
(deterministic ids, ``insert_once``), so a commit whose reply was lost and that is retried
applies once.

Errors are accord's: :class:`~accord.errors.WriteRefused` (the database refused one write;
the caller adds its context), the guard's own error, :class:`~accord.errors.TransactionTimeout`
or :class:`~accord.errors.DatabaseError`; never a raw pymongo exception.

Only :mod:`accord.runtime` constructs units of work (tests/test_module_boundaries.py);
every part gets one from there, so a hook registered on the runtime sees every write.

This module is the async source; its sync twin is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn

import bson
import pymongo
from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError

from accord.errors import AccordError, ConfigurationError, PermissionDenied
from accord.platform import write_errors
from accord.platform.asynchronous.reachability import ensure_reachable
from accord.platform.context import RUNTIME, Principal, ReadContext
from accord.platform.hooks import (
    Hooks,
    ReadKind,
    ReadRequest,
    RefreshHook,
    Refusal,
    SealBatch,
    SealRefusal,
    new_transaction_id,
)
from accord.platform.plan import COMMAND_KINDS, Counts, Group, Plan, PlanResult
from accord.platform.transaction import (
    CLIENT_BULK_BATCH,
    CLIENT_BULK_WRITE_WIRE_VERSION,
    DEFAULT_TIMEOUT,
    READ_CONCERN,
    WRITE_CONCERN,
    default_hooks,
)

_IS_SYNC = False

logger = logging.getLogger("accord.platform")


class AsyncUnitOfWork:
    """Runs plans, one transaction each, and reads, through the hooks (module docstring).

    Args:
        client: the driver client; transactions need a replica set, Atlas, or accord's
            embedded engine.
        client_bulk: use MongoDB 8.0's client-level ``bulkWrite``; ``None`` asks the
            server once (``hello.maxWireVersion``).
        hooks: the hooks; default :func:`~accord.platform.transaction.default_hooks`.
        timeout: seconds one ``execute`` (or one read) may take, retries included.
        principal: who acts when a context names nobody (default the ``runtime`` service).
    """

    def __init__(
        self,
        client: AsyncMongoClient[Any],
        *,
        client_bulk: bool | None = None,
        hooks: Sequence[Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        principal: Principal | None = None,
    ) -> None:
        if not timeout > 0:
            raise AccordError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.client = client
        self.hooks = Hooks(default_hooks() if hooks is None else hooks)
        self.timeout = timeout
        self.principal = principal or Principal.service(RUNTIME)
        self._bulk: dict[str, bool | None] = {"client_bulk": client_bulk}

    def register(self, hook: Any) -> None:
        """Add ``hook`` (its phases: docs/platform.md, "Hooks"); every view of this unit
        of work (:meth:`acting_as`) sees it."""
        self.hooks.add(hook)

    def acting_as(self, principal: Principal) -> AsyncUnitOfWork:
        """This unit of work (same client, hooks, settings) acting as ``principal`` by
        default: what a part hands its own principal (the aggregator, an API key)."""
        view = copy.copy(self)
        view.principal = principal
        return view

    def with_timeout(self, timeout: float) -> AsyncUnitOfWork:
        """This unit of work with another bound on each operation."""
        if not timeout > 0:
            raise AccordError(f"timeout must be a positive number of seconds, got {timeout!r}")
        view = copy.copy(self)
        view.timeout = timeout
        return view

    async def client_bulk(self) -> bool:
        """Whether plans go in one client-level ``bulkWrite`` (asks the server once)."""
        known = self._bulk["client_bulk"]
        if known is None:
            try:
                with pymongo.timeout(self.timeout):
                    hello = await self.client.admin.command("hello")
            except PyMongoError as exc:
                raise write_errors.failure(exc, self.timeout) from exc
            wire = int(hello.get("maxWireVersion", 0))
            known = self._bulk["client_bulk"] = wire >= CLIENT_BULK_WRITE_WIRE_VERSION
        return known

    # --- writes ---------------------------------------------------------------------

    async def execute(self, plan: Plan, *, transaction: bool = True) -> PlanResult:
        """Run ``plan`` in one transaction; see the module docstring.

        ``transaction=False``: a plan that is ONE op once the hooks ran (a lease claim,
        renewal or release) runs as that single atomic command, one round trip, with no
        transaction left open if the caller is paused half-way; a plan the hooks
        extended runs in a transaction as usual.
        """
        await self._prepare(plan)
        groups = _guarded(plan)
        batch = SealBatch([plan], new_transaction_id())
        single = not transaction and len(groups) == 1 and len(groups[0].ops) == 1
        if single and not self._seals(batch):
            return await self._single(groups[0])
        return await self._run(batch, groups)

    async def execute_all(self, plans: Sequence[Plan]) -> PlanResult:
        """Run several plans in ONE transaction (e.g. a run's queued saves): each plan is
        checked and derived on its own, exactly as :meth:`execute` would take it (its own
        context, its own events), then all their groups are written in order. A group
        keeps its name unless an earlier plan has one of that name; then it becomes
        ``<i>:<name>`` (``i``: the plan's index), before the seal hooks see the batch.
        All of them commit, or none."""
        groups: list[Group] = []
        names: set[str] = set()
        for plan in plans:
            await self._prepare(plan)
        for i, plan in enumerate(plans):
            for g in _guarded(plan):
                if g.name in names:
                    g.name = f"{i}:{g.name}"
                names.add(g.name)
                groups.append(g)
        return await self._run(SealBatch(list(plans), new_transaction_id()), groups)

    async def _prepare(self, plan: Plan) -> None:
        """Name the principal, run the refresh hooks, the check hooks, then the derive
        hooks."""
        if plan.context.principal is None:
            plan.context = replace(plan.context, principal=self.principal)
        if self.hooks.refresh:
            await self._refresh({g.db for g in plan.groups} | {e.db for e in plan.events})
        try:
            for hook in self.hooks.check:
                hook.check(plan)
        except PermissionDenied as exc:
            await self._refused(Refusal(plan.context, exc, plan=plan))
            raise
        for derive in self.hooks.derive:
            derive.derive(plan)

    async def _refresh(self, dbs: set[str] | tuple[str, ...]) -> None:
        """Make the reads the refresh hooks say are due (outside any transaction, through
        :meth:`find`, so the read hooks see them) and hand each its result or error."""
        for hook in self.hooks.refresh:
            for db in sorted(dbs):
                await self._refreshed(hook, db)

    async def _refreshed(self, hook: RefreshHook, db: str) -> None:
        due = hook.refresh_read(db)
        if due is None:
            return
        try:
            found = await self.find(
                ReadContext(due.tenant_id, operation=due.operation), due.artifact, db,
                due.collection, due.filter, sort=due.sort, limit=due.limit,
            )  # fmt: skip
        except AccordError as exc:  # the hook decides what a failed read means
            hook.refreshed(db, None, exc)
            return
        hook.refreshed(db, found, None)

    def _seals(self, batch: SealBatch) -> bool:
        """Whether a seal hook would add anything to ``batch`` (for the single-op path:
        a hook that reads, or writes without reading, needs the transaction). The hooks
        see ``attempt`` 0: a probe, whose groups are only counted, never written."""
        probe = replace(batch, attempt=0)
        return any(hook.seal_reads(probe) or hook.seal(probe, {}) for hook in self.hooks.seal)

    async def _run(self, batch: SealBatch, groups: list[Group]) -> PlanResult:
        for g in groups:
            kinds = {op.kind in COMMAND_KINDS for op in g.ops}
            if len(kinds) > 1:
                raise AccordError(
                    f"group {g.name!r} mixes find_one_and_update with bulk writes; "
                    f"put them in separate groups"
                )
        if not groups:
            return PlanResult({})
        await ensure_reachable(self.client, self.timeout)  # no I/O once a writable server is known
        bulk = await self.client_bulk()
        attempts = 0

        async def attempt(
            session: AsyncClientSession,
        ) -> tuple[dict[str, Counts], dict[str, list[Any]]]:
            nonlocal attempts
            attempts += 1
            batch.attempt = attempts
            return await self._write(session, batch, groups, bulk)

        try:
            with pymongo.timeout(self.timeout):
                async with self.client.start_session() as session:
                    counts, found = await session.with_transaction(
                        attempt, read_concern=READ_CONCERN, write_concern=WRITE_CONCERN
                    )
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.timeout) from exc
        except SealRefusal as exc:
            if exc.refusal is not None:  # recorded outside the aborted transaction
                await self._refused(exc.refusal)
            raise
        return PlanResult(counts, found, attempts)

    async def _single(self, group: Group) -> PlanResult:
        """One op as one atomic command (retryable write, write concern majority)."""
        await ensure_reachable(self.client, self.timeout)  # no I/O once a writable server is known
        op = group.ops[0]
        coll = self.client[group.db][group.collection].with_options(write_concern=WRITE_CONCERN)
        counts = Counts()
        found: dict[str, list[Any]] = {}
        try:
            with pymongo.timeout(self.timeout):
                if op.kind in COMMAND_KINDS:
                    doc = await coll.find_one_and_update(
                        dict(op.filter or {}),
                        op.doc or {},
                        sort=list(op.sort) if op.sort else None,
                        upsert=op.upsert,
                        return_document=ReturnDocument.AFTER,
                    )
                    found[group.name] = [doc]
                    counts.matched += doc is not None
                else:
                    res = await coll.bulk_write([op.model()], ordered=True)
                    counts = Counts(
                        inserted=res.inserted_count,
                        matched=res.matched_count,
                        modified=res.modified_count,
                        upserted=res.upserted_count,
                        deleted=res.deleted_count,
                    )
        except PyMongoError as exc:
            translated = write_errors.translate(exc, [group])
            if isinstance(translated, PyMongoError):
                raise write_errors.failure(translated, self.timeout) from exc
            raise translated from exc
        if group.expect is not None and group.expect.violated(counts):
            raise group.expect.error(counts)
        return PlanResult({group.name: counts}, found, 1)

    async def _write(
        self, session: AsyncClientSession, batch: SealBatch, groups: list[Group], bulk: bool
    ) -> tuple[dict[str, Counts], dict[str, list[Any]]]:
        commands = [g for g in groups if g.ops[0].kind in COMMAND_KINDS]
        writes = [g for g in groups if g.ops[0].kind not in COMMAND_KINDS]
        counts: dict[str, Counts] = {g.name: Counts() for g in groups}
        found: dict[str, list[Any]] = {}
        for g in commands:
            found[g.name] = await self._commands(session, g, counts[g.name])
        batch.found = found
        sealed = await self._seal(session, batch, {g.name for g in groups})
        for g in sealed:
            counts[g.name] = Counts()
        writes += sealed
        if writes:
            if bulk:
                await self._client_bulk_write(session, writes, counts)
            else:
                await self._collection_bulk_writes(session, writes, counts)
        for g in (*groups, *sealed):
            if g.expect is not None and g.expect.violated(counts[g.name]):
                raise g.expect.error(counts[g.name])
        return counts, found

    async def _seal(
        self, session: AsyncClientSession, batch: SealBatch, taken: set[str]
    ) -> list[Group]:
        """The seal hooks' groups for this attempt (their reads made in ``session``)."""
        added: list[Group] = []
        for hook in self.hooks.seal:
            found: dict[str, list[Any]] = {}
            for read in hook.seal_reads(batch):
                cursor = self.client[read.db][read.collection].find(
                    dict(read.filter),
                    sort=list(read.sort) if read.sort else None,
                    limit=read.limit,
                    session=session,
                )
                try:
                    found[read.key] = await cursor.to_list(None)
                except PyMongoError as exc:
                    _reraise(exc, write_errors.translate(exc, []))
            for g in hook.seal(batch, found):
                if not g.ops:
                    continue
                if g.name in taken:
                    raise ConfigurationError(
                        f"seal hook {hook.name!r} added a group named {g.name!r}, which the "
                        f"batch has already; name seal groups after the hook"
                    )
                taken.add(g.name)
                added.append(g)
        return added

    async def _commands(
        self, session: AsyncClientSession, group: Group, counts: Counts
    ) -> list[Any]:
        coll = self.client[group.db][group.collection]
        out: list[Any] = []
        for op in group.ops:
            try:
                doc = await coll.find_one_and_update(
                    dict(op.filter or {}),
                    op.doc or {},
                    sort=list(op.sort) if op.sort else None,
                    upsert=op.upsert,
                    return_document=ReturnDocument.AFTER,
                    session=session,
                )
            except PyMongoError as exc:
                _reraise(exc, write_errors.translate(exc, [group], len(out)))
            if doc is not None:
                counts.matched += 1
            out.append(doc)
        return out

    async def _client_bulk_write(
        self, session: AsyncClientSession, groups: list[Group], counts: dict[str, Counts]
    ) -> None:
        models: list[Any] = []
        owners: list[str] = []
        for g in groups:
            for op in g.ops:
                models.append(op.model(g.namespace))
                owners.append(g.name)
        for start in range(0, len(models), CLIENT_BULK_BATCH):
            batch = models[start : start + CLIENT_BULK_BATCH]
            try:
                result = await self.client.bulk_write(
                    batch, session=session, ordered=True, verbose_results=True
                )
            except PyMongoError as exc:
                _reraise(exc, write_errors.translate(exc, groups, start))
            for i in result.insert_results:
                counts[owners[start + i]].inserted += 1
            for i, r in result.update_results.items():
                c = counts[owners[start + i]]
                c.modified += r.modified_count or 0
                if r.upserted_id is not None:
                    c.upserted += 1  # the bulkWrite reply counts an upsert in "n" too
                else:
                    c.matched += r.matched_count
            for i, d in result.delete_results.items():
                counts[owners[start + i]].deleted += d.deleted_count

    async def _collection_bulk_writes(
        self, session: AsyncClientSession, groups: list[Group], counts: dict[str, Counts]
    ) -> None:
        for g in groups:
            try:
                res = await self.client[g.db][g.collection].bulk_write(
                    [op.model() for op in g.ops], ordered=True, session=session
                )
            except PyMongoError as exc:
                _reraise(exc, write_errors.translate(exc, [g]))
            counts[g.name].add(
                Counts(
                    inserted=res.inserted_count,
                    matched=res.matched_count,
                    modified=res.modified_count,
                    upserted=res.upserted_count,
                    deleted=res.deleted_count,
                )
            )

    # --- reads ----------------------------------------------------------------------

    async def find(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sequence[tuple[str, int]] | None = None,
        limit: int = 0,
        skip: int = 0,
        batch_size: int = 0,
    ) -> list[Any]:
        """The documents of ``collection`` (artifact class ``artifact``) matching
        ``filter``, after the read hooks."""
        request = await self._request(context, artifact, db, collection, "find", filter=filter)
        try:
            with pymongo.timeout(self.timeout):
                cursor = self.client[db][collection].find(
                    dict(request.filter or {}),
                    dict(projection) if projection is not None else None,
                    sort=list(sort) if sort else None,
                    limit=limit,
                    skip=skip,
                    batch_size=batch_size,
                )
                docs = await cursor.to_list(None)
        except PyMongoError as exc:
            raise write_errors.read_failure(exc, collection, self.timeout) from exc
        return await self._decode(request, docs) if self.hooks.decode else docs

    async def iterate(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sequence[tuple[str, int]] | None = None,
        batch_size: int = 0,
        codec_options: CodecOptions[Any] | None = None,
    ) -> AsyncIterator[Any]:
        """:meth:`find`, one document at a time, for a caller that may stop early (a scan
        that keeps what it needs): batches are fetched as it goes, and the cursor is
        closed when it stops. Each batch is bounded by the kernel's timeout.
        ``codec_options``: how to decode the documents (default: the client's)."""
        request = await self._request(context, artifact, db, collection, "find", filter=filter)
        cursor = (
            self.client[db]
            .get_collection(collection, codec_options=codec_options)
            .find(
                dict(request.filter or {}),
                dict(projection) if projection is not None else None,
                sort=list(sort) if sort else None,
                batch_size=batch_size,
            )
        )
        try:
            while True:
                try:
                    with pymongo.timeout(self.timeout):
                        doc = await anext(cursor)
                except StopAsyncIteration:
                    return
                except PyMongoError as exc:
                    raise write_errors.read_failure(exc, collection, self.timeout) from exc
                if self.hooks.decode:
                    doc = (await self._decode(request, [doc]))[0]
                yield doc
        finally:
            await cursor.close()

    async def iterate_batches(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sequence[tuple[str, int]] | None = None,
        batch_size: int = 0,
        codec_options: CodecOptions[Any] | None = None,
    ) -> AsyncIterator[list[Any]]:
        """:meth:`iterate`, one batch at a time, for a bulk reader (a compliance export):
        each batch the server returns is decoded at once (``bson.decode_all``, with
        ``codec_options``, default the client's) instead of document by document, and
        the kernel's timeout bounds each batch. The cursor is closed when it stops."""
        request = await self._request(context, artifact, db, collection, "find", filter=filter)
        options = codec_options or self.client.codec_options
        cursor = self.client[db][collection].find_raw_batches(
            dict(request.filter or {}),
            dict(projection) if projection is not None else None,
            sort=list(sort) if sort else None,
            batch_size=batch_size,
        )
        try:
            while True:
                try:
                    with pymongo.timeout(self.timeout):
                        data = await anext(cursor)
                except StopAsyncIteration:
                    return
                except PyMongoError as exc:
                    raise write_errors.read_failure(exc, collection, self.timeout) from exc
                yield bson.decode_all(data, options)
        finally:
            await cursor.close()

    async def find_one(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sequence[tuple[str, int]] | None = None,
    ) -> Any:
        """The first document matching ``filter`` (after the read hooks), or None."""
        found = await self.find(
            context, artifact, db, collection, filter, projection=projection, sort=sort, limit=1
        )
        return found[0] if found else None

    async def aggregate(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        pipeline: Sequence[Mapping[str, Any]],
        *,
        batch_size: int | None = None,
    ) -> list[Any]:
        """The results of ``pipeline`` on ``collection``, after the read hooks (which see
        the pipeline; :meth:`ReadRequest.narrowed` keeps a ``$vectorSearch`` first)."""
        request = await self._request(
            context, artifact, db, collection, "aggregate", pipeline=pipeline
        )
        kwargs: dict[str, Any] = {} if batch_size is None else {"batchSize": batch_size}
        try:
            with pymongo.timeout(self.timeout):
                cursor = await self.client[db][collection].aggregate(
                    [dict(s) for s in request.pipeline or []], **kwargs
                )
                docs = await cursor.to_list(None)
        except PyMongoError as exc:
            raise write_errors.read_failure(exc, collection, self.timeout) from exc
        return await self._decode(request, docs) if self.hooks.decode else docs

    async def count(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        filter: Mapping[str, Any],
    ) -> int:
        """How many documents match ``filter`` (after the read hooks)."""
        request = await self._request(context, artifact, db, collection, "count", filter=filter)
        try:
            with pymongo.timeout(self.timeout):
                return await self.client[db][collection].count_documents(dict(request.filter or {}))
        except PyMongoError as exc:
            raise write_errors.read_failure(exc, collection, self.timeout) from exc

    async def _request(
        self,
        context: ReadContext,
        artifact: str,
        db: str,
        collection: str,
        kind: ReadKind,
        *,
        filter: Mapping[str, Any] | None = None,
        pipeline: Sequence[Mapping[str, Any]] | None = None,
    ) -> ReadRequest:
        """The read as the read hooks leave it (a refusal is raised after the refusal
        hooks saw it)."""
        if context.principal is None:
            context = context.with_principal(self.principal)
        if self.hooks.refresh:
            await self._refresh((db,))
        request = ReadRequest(context, artifact, db, collection, kind, filter, pipeline)
        try:
            for hook in self.hooks.read:
                request = hook.read(request)
        except PermissionDenied as exc:
            await self._refused(Refusal(context, exc, read=request))
            raise
        await ensure_reachable(self.client, self.timeout)  # no I/O once a writable server is known
        return request

    async def _decode(self, request: ReadRequest, docs: list[Any]) -> list[Any]:
        """The documents a read returned, as the decode hooks turn them back (docs/platform.md,
        "Hooks"): each hook's reads are made through :meth:`find`, as the reader."""
        for hook in self.hooks.decode:
            found: list[Any] = []
            for due in hook.decode_reads(request, docs):
                context = ReadContext(
                    due.tenant_id, principal=request.context.principal, operation=due.operation
                )
                found += await self.find(
                    context, due.artifact, request.db, due.collection, due.filter,
                    sort=due.sort, limit=due.limit,
                )  # fmt: skip
            docs = hook.decode(request, docs, found)
        return docs

    async def _refused(self, refusal: Refusal) -> None:
        """Hand a refusal to the refused hooks and run the plans they return, each on
        its own (derive and seal apply; checks do not: the refusal is what they made)."""
        for hook in self.hooks.refused:
            try:
                plan = hook.refused(refusal)
                if plan is None:
                    continue
                if plan.context.principal is None:
                    plan.context = replace(plan.context, principal=self.principal)
                for derive in self.hooks.derive:
                    derive.derive(plan)
                await self._run(SealBatch([plan], new_transaction_id()), _guarded(plan))
            except Exception as exc:  # the refusal itself is what the caller must see
                logger.warning(
                    "accord: hook %r could not record a refused %s (%s); the refusal stands",
                    hook.name,
                    "read" if refusal.read is not None else "write",
                    exc,
                )
                logger.debug("recording the refusal failed", exc_info=True)


def _guarded(plan: Plan) -> list[Group]:
    """The plan's groups to write, led by its context's run guard (added once)."""
    guard = plan.context.guard
    if guard is not None and plan.guard_group is None:
        plan.guard_group = guard.group()
        plan.groups.insert(0, plan.guard_group)
    return list(plan.writes())


def _reraise(exc: BaseException, translated: BaseException) -> NoReturn:
    """Raise ``translated`` (caused by ``exc``), or ``exc`` itself when it stays as is."""
    if translated is exc:
        raise exc
    raise translated from exc
