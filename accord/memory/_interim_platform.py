"""TEMPORARY stand-in for the platform's write path (PLATFORM_API.md), same shapes.

Removed when ``accord.platform.plan`` and the units of work land on main: then
:mod:`accord.memory.writepath` imports those and this module is dead. It runs a plan's
groups as per-collection bulk writes inside one transaction, with the retries pymongo's
``with_transaction`` gives, checks ``Expect`` guards, and turns driver errors into accord's.
No hooks: governance is not wired yet either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo import (
    AsyncMongoClient,
    DeleteMany,
    DeleteOne,
    InsertOne,
    MongoClient,
    ReplaceOne,
    UpdateMany,
    UpdateOne,
)
from pymongo.errors import BulkWriteError, PyMongoError

from accord.errors import AccordError


class WriteRefusedError(AccordError):
    """The database refused a write of a memory plan."""


@dataclass(frozen=True)
class Op:
    kind: str
    filter: Mapping[str, Any] | None = None
    doc: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    upsert: bool = False

    def model(self) -> Any:
        doc: Any = self.doc if isinstance(self.doc, list) else dict(self.doc or {})  # type: ignore[arg-type]
        filt = dict(self.filter or {})
        return {
            "insert": lambda: InsertOne(doc),
            "update": lambda: UpdateOne(filt, doc, upsert=self.upsert),
            "update_many": lambda: UpdateMany(filt, doc, upsert=self.upsert),
            "replace": lambda: ReplaceOne(filt, doc, upsert=self.upsert),
            "delete": lambda: DeleteOne(filt),
            "delete_many": lambda: DeleteMany(filt),
        }[self.kind]()


@dataclass
class Counts:
    inserted: int = 0
    matched: int = 0
    modified: int = 0
    upserted: int = 0
    deleted: int = 0


@dataclass(frozen=True)
class Expect:
    error: Callable[[Counts], BaseException]
    inserted: int | None = None
    matched: int | None = None
    upserted: int | None = None
    deleted: int | None = None
    touched: int | None = None

    def violated(self, c: Counts) -> bool:
        return (
            (self.inserted is not None and c.inserted != self.inserted)
            or (self.matched is not None and c.matched != self.matched)
            or (self.upserted is not None and c.upserted != self.upserted)
            or (self.deleted is not None and c.deleted != self.deleted)
            or (self.touched is not None and c.matched + c.upserted != self.touched)
        )


@dataclass
class Group:
    name: str
    db: str
    collection: str
    artifact: str
    ops: list[Op] = field(default_factory=list)
    sources: list[Any] | None = None
    expect: Expect | None = None


@dataclass(frozen=True)
class PlanContext:
    tenant_id: str
    thread_id: str | None = None
    principal: str | None = None
    operation: str = ""


@dataclass
class Plan:
    context: PlanContext
    groups: list[Group] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def add(self, group: Group) -> Group:
        self.groups.append(group)
        return group


@dataclass
class PlanResult:
    counts: dict[str, Counts]
    found: dict[str, list[Any]] = field(default_factory=dict)
    attempts: int = 1

    def __getitem__(self, group: str) -> Counts:
        return self.counts.get(group) or Counts()


class _Guard(Exception):
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _counts(result: Any) -> Counts:
    return Counts(result.inserted_count, result.matched_count, result.modified_count,
                  result.upserted_count, result.deleted_count)  # fmt: skip


def _refused(exc: BaseException) -> AccordError:
    if isinstance(exc, BulkWriteError):
        err = (exc.details.get("writeErrors") or [{}])[0]
        return WriteRefusedError(
            f"the database refused a memory write (code {err.get('code')}): "
            f"{err.get('errmsg')}. Nothing of this operation was written."
        )
    return AccordError(f"memory write failed: {exc}. Nothing was written; retry later.")


class UnitOfWork:
    def __init__(self, client: MongoClient[Any], **_: Any) -> None:
        self.client = client

    def execute(self, plan: Plan) -> PlanResult:
        def body(session: Any) -> dict[str, Counts]:
            counts: dict[str, Counts] = {}
            for g in plan.groups:
                if not g.ops:
                    continue
                coll = self.client[g.db][g.collection]
                c = _counts(coll.bulk_write([op.model() for op in g.ops], session=session))
                counts[g.name] = c
                if g.expect is not None and g.expect.violated(c):
                    raise _Guard(g.expect.error(c))
            return counts

        try:
            with self.client.start_session() as s:
                return PlanResult(s.with_transaction(body))
        except _Guard as guard:
            raise guard.error from None
        except PyMongoError as exc:
            raise _refused(exc) from exc


class AsyncUnitOfWork:
    def __init__(self, client: AsyncMongoClient[Any], **_: Any) -> None:
        self.client = client

    async def execute(self, plan: Plan) -> PlanResult:
        async def body(session: Any) -> dict[str, Counts]:
            counts: dict[str, Counts] = {}
            for g in plan.groups:
                if not g.ops:
                    continue
                coll = self.client[g.db][g.collection]
                result = await coll.bulk_write([op.model() for op in g.ops], session=session)
                c = _counts(result)
                counts[g.name] = c
                if g.expect is not None and g.expect.violated(c):
                    raise _Guard(g.expect.error(c))
            return counts

        try:
            async with self.client.start_session() as s:
                return PlanResult(await s.with_transaction(body))
        except _Guard as guard:
            raise guard.error from None
        except PyMongoError as exc:
            raise _refused(exc) from exc
