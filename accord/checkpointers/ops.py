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
from pymongo.errors import ClientBulkWriteException, PyMongoError
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


def unwrap_client_bulk_error(exc: ClientBulkWriteException) -> BaseException:
    """The error ``with_transaction`` must see for a failed client-level bulkWrite.

    pymongo wraps a top-level server error (e.g. WriteConflict, code 112) in a
    ClientBulkWriteException that does not carry the error's labels, so
    ``with_transaction`` would not recognise a ``TransientTransactionError`` and would not
    retry. Re-raising the top-level error restores the labels.
    """
    inner = exc.error
    if isinstance(inner, PyMongoError) and (
        inner.has_error_label("TransientTransactionError")
        or inner.has_error_label("UnknownTransactionCommitResult")
    ):
        return inner
    return exc
