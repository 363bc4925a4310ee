"""The unit of work: the one write path of accord.

Every component hands it a :class:`~accord.platform.plan.Plan` (data) and it runs the
plan in ONE multi-document transaction:

1. its hooks see the plan first, in registration order, and may extend it or refuse it:
   the tenancy guard (writes from tenant input stay in their tenant), the outbox hook
   (the plan's events become inserts in the same transaction), and governance's policy
   check and audit append once registered (``runtime.py`` wires them);
2. ``find_one_and_update`` ops (claims) run first, one command each;
3. every other op goes in one client-level ``bulkWrite`` on MongoDB 8.0+
   (maxWireVersion >= 25; batches of 100 ops), else one ``bulk_write``
   per group: a plan that fits one batch costs two round trips, ``bulkWrite`` and
   ``commitTransaction``;
4. the groups' guards (:class:`~accord.platform.plan.Expect`) are checked on their counts;
   a violated guard aborts the transaction and raises the guard's error;
5. commit, with write concern majority.

``execute_all`` runs several plans (a checkpointer run's queued saves) in one
transaction the same way, each plan passing the hooks as itself.

Retries: ``TransientTransactionError`` (write conflicts, a dropped connection, an
election) reruns the transaction and ``UnknownTransactionCommitResult`` reruns the commit,
as ``ClientSession.with_transaction`` does, but within ``timeout`` seconds for everything
(pymongo's client-side operation timeout), never minutes. Every op is idempotent by
construction of the plans (deterministic ids, ``insert_once``), so a commit whose reply was
lost and that is retried applies once.

Errors are accord's: :class:`~accord.errors.WriteRefused` (the database refused one write;
the caller adds its context), the guard's own error, :class:`~accord.errors.TransactionTimeout`
or :class:`~accord.errors.DatabaseError`; never a raw pymongo exception.

This module is the async source; its sync twin is generated from it by
``tools/synchro.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import pymongo
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import PyMongoError

from accord.errors import AccordError
from accord.platform import write_errors
from accord.platform.plan import COMMAND_KINDS, Counts, Group, Plan, PlanResult
from accord.platform.transaction import (
    CLIENT_BULK_BATCH,
    CLIENT_BULK_WRITE_WIRE_VERSION,
    DEFAULT_TIMEOUT,
    READ_CONCERN,
    WRITE_CONCERN,
    Hook,
    default_hooks,
)

_IS_SYNC = False


class AsyncUnitOfWork:
    """Runs plans, one transaction each (see the module docstring).

    Args:
        client: the driver client; transactions need a replica set, Atlas, or accord's
            embedded engine.
        client_bulk: use MongoDB 8.0's client-level ``bulkWrite``; ``None`` asks the
            server once (``hello.maxWireVersion``).
        hooks: the hooks, in order; default :func:`default_hooks`.
        timeout: seconds one ``execute`` may take, retries included.
    """

    def __init__(
        self,
        client: AsyncMongoClient[Any],
        *,
        client_bulk: bool | None = None,
        hooks: Sequence[Hook] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not timeout > 0:
            raise AccordError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.client = client
        self.hooks: list[Hook] = default_hooks() if hooks is None else list(hooks)
        self.timeout = timeout
        self._client_bulk = client_bulk

    def register(self, hook: Hook) -> None:
        """Add ``hook`` after the existing ones (e.g. governance's audit)."""
        if any(h.name == hook.name for h in self.hooks):
            raise AccordError(f"a hook named {hook.name!r} is registered already")
        self.hooks.append(hook)

    async def client_bulk(self) -> bool:
        """Whether plans go in one client-level ``bulkWrite`` (asks the server once)."""
        if self._client_bulk is None:
            try:
                hello = await self.client.admin.command("hello")
            except PyMongoError as exc:
                raise write_errors.failure(exc, self.timeout) from exc
            wire = int(hello.get("maxWireVersion", 0))
            self._client_bulk = wire >= CLIENT_BULK_WRITE_WIRE_VERSION
        return self._client_bulk

    async def execute(self, plan: Plan, *, transaction: bool = True) -> PlanResult:
        """Run ``plan`` in one transaction; see the module docstring.

        ``transaction=False``: a plan that is ONE op after the hooks ran (a lease claim,
        renewal or release) runs as that single atomic command, one round trip, with no
        transaction left open if the caller is paused half-way; a plan the hooks
        extended runs in a transaction as usual.
        """
        for hook in self.hooks:
            hook.extend(plan)
        return await self._run(list(plan.writes()), transaction)

    async def execute_all(self, plans: Sequence[Plan]) -> PlanResult:
        """Run several plans in ONE transaction (e.g. a run's queued saves): each plan
        goes through the hooks on its own, exactly as :meth:`execute` would take it
        (its own context and operation, its own events), then all their groups are
        written in order. A group keeps its name unless an earlier plan has one of that
        name; then it becomes ``<i>:<name>`` (``i``: the plan's index). All of them
        commit, or none."""
        groups: list[Group] = []
        names: set[str] = set()
        for i, plan in enumerate(plans):
            for hook in self.hooks:
                hook.extend(plan)
            for g in plan.writes():
                if g.name in names:
                    g.name = f"{i}:{g.name}"
                names.add(g.name)
                groups.append(g)
        return await self._run(groups, True)

    async def _run(self, groups: list[Group], transaction: bool) -> PlanResult:
        for g in groups:
            kinds = {op.kind in COMMAND_KINDS for op in g.ops}
            if len(kinds) > 1:
                raise AccordError(
                    f"group {g.name!r} mixes find_one_and_update with bulk writes; "
                    f"put them in separate groups"
                )
        if not groups:
            return PlanResult({})
        if not transaction and len(groups) == 1 and len(groups[0].ops) == 1:
            return await self._single(groups[0])
        bulk = await self.client_bulk()
        attempts = 0

        async def attempt(
            session: AsyncClientSession,
        ) -> tuple[dict[str, Counts], dict[str, list[Any]]]:
            nonlocal attempts
            attempts += 1
            return await self._write(session, groups, bulk)

        try:
            with pymongo.timeout(self.timeout):
                async with self.client.start_session() as session:
                    counts, found = await session.with_transaction(
                        attempt, read_concern=READ_CONCERN, write_concern=WRITE_CONCERN
                    )
        except PyMongoError as exc:
            raise write_errors.failure(exc, self.timeout) from exc
        return PlanResult(counts, found, attempts)

    async def _single(self, group: Group) -> PlanResult:
        """One op as one atomic command (retryable write, write concern majority)."""
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
        self, session: AsyncClientSession, groups: list[Group], bulk: bool
    ) -> tuple[dict[str, Counts], dict[str, list[Any]]]:
        counts: dict[str, Counts] = {g.name: Counts() for g in groups}
        found: dict[str, list[Any]] = {}
        commands = [g for g in groups if g.ops[0].kind in COMMAND_KINDS]
        writes = [g for g in groups if g.ops[0].kind not in COMMAND_KINDS]
        for g in commands:
            found[g.name] = await self._commands(session, g, counts[g.name])
        if writes:
            if bulk:
                await self._client_bulk_write(session, writes, counts)
            else:
                await self._collection_bulk_writes(session, writes, counts)
        for g in groups:
            if g.expect is not None and g.expect.violated(counts[g.name]):
                raise g.expect.error(counts[g.name])
        return counts, found

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


def _reraise(exc: BaseException, translated: BaseException) -> NoReturn:
    """Raise ``translated`` (caused by ``exc``), or ``exc`` itself when it stays as is."""
    if translated is exc:
        raise exc
    raise translated from exc
