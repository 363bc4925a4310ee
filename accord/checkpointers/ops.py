"""Write plans: the documents one ``put``/``put_writes`` transaction writes, in order.

A plan is a list of :class:`Group` (one collection each). It is executed either as one
client-level ``bulkWrite`` (MongoDB 8.0, maxWireVersion >= 25: one round trip for every
collection) or, on older servers, as one ``bulk_write`` per group. Either way the caller
gets per-group counts, which is all the ownership checks need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, ClientBulkWriteException, OperationFailure, PyMongoError
from pymongo.results import ClientBulkWriteResult

#: maxWireVersion of MongoDB 8.0, the first with the client-level bulkWrite command.
CLIENT_BULK_WIRE_VERSION = 25


@dataclass(frozen=True)
class Op:
    """One write. ``kind`` is insert | update | update_many | replace | delete | delete_many."""

    kind: str
    filter: Mapping[str, Any] | None = None
    doc: Mapping[str, Any] | list[Any] | None = None
    upsert: bool = False

    def model(self, namespace: str | None = None) -> Any:
        doc: Any = list(self.doc) if isinstance(self.doc, list) else dict(self.doc or {})
        if self.kind == "insert":
            return InsertOne(doc, namespace=namespace)
        if self.kind == "update":
            return UpdateOne(dict(self.filter or {}), doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "update_many":
            return UpdateMany(dict(self.filter or {}), doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "replace":
            return ReplaceOne(dict(self.filter or {}), doc, upsert=self.upsert, namespace=namespace)
        if self.kind == "delete":
            return DeleteOne(dict(self.filter or {}), namespace=namespace)
        if self.kind == "delete_many":
            return DeleteMany(dict(self.filter or {}), namespace=namespace)
        raise ValueError(f"unknown op kind {self.kind!r}")


def insert_once(doc: Mapping[str, Any]) -> Op:
    """Insert ``doc`` unless a document with its ``_id`` exists (idempotent insert)."""
    body = {k: v for k, v in doc.items() if k != "_id"}
    return Op("update", {"_id": doc["_id"]}, {"$setOnInsert": body}, upsert=True)


@dataclass
class Counts:
    inserted: int = 0
    matched: int = 0
    modified: int = 0
    upserted: int = 0
    deleted: int = 0


@dataclass
class Group:
    """Writes to one collection; ``name`` identifies the group in the results."""

    name: str
    db: str
    collection: str
    ops: list[Op] = field(default_factory=list)
    #: what each op came from (business groups: the staged operation), for error messages
    sources: list[Any] | None = None

    @property
    def namespace(self) -> str:
        return f"{self.db}.{self.collection}"


def client_models(groups: Sequence[Group]) -> tuple[list[Any], list[str]]:
    models: list[Any] = []
    owners: list[str] = []
    for g in groups:
        for op in g.ops:
            models.append(op.model(g.namespace))
            owners.append(g.name)
    return models, owners


#: Ops per client-level bulkWrite. Verbose results come back in a cursor; keeping each
#: command within the first batch avoids a getMore on it (the embedded engine does not
#: support getMore on ``admin.$cmd.bulkWrite`` cursors). A step rarely has this many ops.
CLIENT_BULK_BATCH = 100


def client_batches(models: list[Any], owners: list[str]) -> list[tuple[list[Any], list[str]]]:
    n = CLIENT_BULK_BATCH
    return [(models[i : i + n], owners[i : i + n]) for i in range(0, len(models), n)]


def merge_counts(into: dict[str, Counts], more: dict[str, Counts]) -> dict[str, Counts]:
    for name, c in more.items():
        prev = into.setdefault(name, Counts())
        prev.inserted += c.inserted
        prev.matched += c.matched
        prev.modified += c.modified
        prev.upserted += c.upserted
        prev.deleted += c.deleted
    return into


def client_counts(result: ClientBulkWriteResult, owners: list[str]) -> dict[str, Counts]:
    out: dict[str, Counts] = {name: Counts() for name in owners}
    for i in result.insert_results:
        out[owners[i]].inserted += 1
    for i, r in result.update_results.items():
        c = out[owners[i]]
        c.modified += r.modified_count or 0
        if r.upserted_id is not None:
            c.upserted += 1  # the bulkWrite reply counts an upsert in "n" too
        else:
            c.matched += r.matched_count
    for i, d in result.delete_results.items():
        out[owners[i]].deleted += d.deleted_count
    return out


def collection_counts(result: Any) -> Counts:
    return Counts(
        inserted=result.inserted_count,
        matched=result.matched_count,
        modified=result.modified_count,
        upserted=result.upserted_count,
        deleted=result.deleted_count,
    )


# --- failed writes ---------------------------------------------------------------------

#: Prefix of the names of groups that hold a task's staged business writes.
BUSINESS_PREFIX = "business:"

#: Server error codes that mean "retry the whole transaction" even when they arrive as a
#: write error without the TransientTransactionError label: WriteConflict, LockTimeout,
#: NoSuchTransaction.
_TRANSIENT_CODES = frozenset({112, 24, 251})


class BusinessOpFailed(Exception):
    """Internal: the database refused a staged business write. The saver turns it into
    :class:`~accord.errors.BusinessWriteError` with the task's context."""

    def __init__(
        self, group: Group, index: int | None, info: Mapping[str, Any], cause: BaseException
    ) -> None:
        super().__init__(str(info.get("errmsg") or cause))
        self.group = group
        self.index = index
        self.info = info
        self.cause = cause

    @property
    def source(self) -> Mapping[str, Any] | None:
        """The staged operation that failed (None when the server did not say which)."""
        if self.group.sources is None:
            return None
        if self.index is None:
            return self.group.sources[0] if len(self.group.sources) == 1 else None
        return self.group.sources[self.index]


def _transient(code: Any, message: str, cause: BaseException) -> OperationFailure:
    """A write error that means "retry", relabelled so ``with_transaction`` retries."""
    err = OperationFailure(
        message,
        code,
        {"errmsg": message, "code": code, "errorLabels": ["TransientTransactionError"]},
    )
    err.__cause__ = cause
    return err


def _namespace_of(message: str) -> str | None:
    """``db.coll`` named by a server error message ("... collection: db.coll index: ...")."""
    marker = "collection: "
    at = message.find(marker)
    if at < 0:
        return None
    return message[at + len(marker) :].split(" ", 1)[0] or None


def _locate(groups: Sequence[Group], position: int) -> tuple[Group, int] | None:
    """(group, index in group) of op number ``position`` of the flattened plan."""
    for g in groups:
        if position < len(g.ops):
            return g, position
        position -= len(g.ops)
    return None


def _by_namespace(groups: Sequence[Group], message: str) -> tuple[Group, int | None] | None:
    """The business group a top-level error names (or the only one), when it says nothing
    about which op failed."""
    business = [g for g in groups if g.name.startswith(BUSINESS_PREFIX)]
    ns = _namespace_of(message)
    if ns is not None:
        named = [g for g in groups if g.namespace == ns]
        if named:
            g = named[0]
            if not g.name.startswith(BUSINESS_PREFIX):
                return None  # one of the checkpointer's own collections
            return g, (0 if len(named) == 1 and len(g.ops) == 1 else None)
    if len(business) == 1:
        return business[0], (0 if len(business[0].ops) == 1 else None)
    if business:
        return business[0], None
    return None


def translate_write_error(
    exc: BaseException, groups: Sequence[Group], offset: int = 0
) -> BaseException:
    """The error to raise for a failed bulk write of ``groups`` (ops from ``offset``).

    * a retryable error (labelled TransientTransactionError/UnknownTransactionCommitResult,
      or a WriteConflict reported as a write error) becomes an ``OperationFailure`` that
      carries the label, so ``with_transaction`` retries;
    * an error of a staged business write becomes :class:`BusinessOpFailed`, whether the
      server reports it as a write error (``ClientBulkWriteException.write_errors``,
      ``BulkWriteError``) or as a top-level error of the command (then the collection
      comes from the message);
    * anything else is returned unchanged (or unwrapped from ClientBulkWriteException).
    """
    info: Mapping[str, Any]
    where: tuple[Group, int | None] | None
    top: BaseException | None = None
    if isinstance(exc, ClientBulkWriteException):
        inner = exc.error
        if isinstance(inner, PyMongoError) and (
            inner.has_error_label("TransientTransactionError")
            or inner.has_error_label("UnknownTransactionCommitResult")
        ):
            return inner
        if exc.write_errors:
            info = dict(exc.details.get("writeErrors", [{}])[0])
            loc = _locate(groups, offset + int(info.get("idx", 0)))
            where = None if loc is None else (loc[0], loc[1])
        elif isinstance(inner, OperationFailure):
            top = inner
            info = _failure_info(inner)
            where = _by_namespace(groups, str(info.get("errmsg", "")))
        else:
            return exc
    elif isinstance(exc, BulkWriteError):  # per-collection bulk_write: one group
        errors = (exc.details or {}).get("writeErrors") or []
        if not errors or len(groups) != 1:
            return exc
        info = errors[0]
        where = (groups[0], offset + int(info.get("index", 0)))
    elif isinstance(exc, OperationFailure):
        if exc.has_error_label("TransientTransactionError") or exc.has_error_label(
            "UnknownTransactionCommitResult"
        ):
            return exc
        top = exc
        info = _failure_info(exc)
        where = (
            (groups[0], offset if len(groups[0].ops) == 1 else None)
            if len(groups) == 1
            else _by_namespace(groups, str(info.get("errmsg", "")))
        )
    else:
        return exc
    code = info.get("code")
    message = str(info.get("errmsg") or exc)
    if code in _TRANSIENT_CODES:
        return _transient(code, message, exc)
    if where is not None and where[0].name.startswith(BUSINESS_PREFIX):
        return BusinessOpFailed(where[0], where[1], info, exc)
    return top if top is not None else exc


def _failure_info(exc: OperationFailure) -> dict[str, Any]:
    details = dict(exc.details or {})
    details.setdefault("code", exc.code)
    details.setdefault("errmsg", str(exc))
    return details
