"""Memory vectors written with their memory, in the same transaction, whoever writes it.

Vector search runs on ``memory_vectors`` (one document per memory and field path; see
:mod:`accord.memory.model`), not on ``long_term_memory``: LangGraph's store contract embeds
each indexed field of an item separately and scores the item by its best field, and an
Atlas ``vectorSearch`` index holds one vector per document and path.

:class:`MemoryVectorsHook` is a unit-of-work hook (like the outbox hook): for every group
of a plan that writes a ``long_term_memory`` collection it knows, it adds a group that
writes the matching ``memory_vectors`` documents, so the memory and its vectors commit or
abort together. The memory service registers it on its unit of work; the aggregator, which
shares that unit of work, gets it too. What it derives, op by op:

- insert (or ``insert_once``) of a memory: insert (``insert_once``) its vectors;
- replace: delete the memory's vectors, insert the new document's;
- delete: delete its vectors; ``delete_many``: the same filter on the vectors;
- update: only ``$set``/``$unset`` of the fields the vectors copy (``expires_at``,
  ``kind``) are mirrored; an update of a memory's vectors or scope is refused (replace the
  memory instead); other fields need nothing.

Filters are mirrored with ``_id`` read as ``memory_id``; a filter on anything the vectors
do not copy (``version``, ``key``, ...) is only accepted next to ``_id`` in a group with an
:class:`~accord.platform.plan.Expect` guard (the guard aborts the transaction if the memory
op did not apply as expected, so the vectors never go their own way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accord.errors import InvalidInputError
from accord.memory import model
from accord.memory.writepath import LONG_TERM_MEMORY, MEMORY_VECTOR, Group, Op, Plan
from accord.platform.plan import insert_once

HOOK_NAME = "memory_vectors"
_UPDATE_MIRRORED = frozenset({"expires_at", "kind"})
_NEVER_UPDATED = frozenset({"embedding", "embeddings", "tenant_id", "ns_prefixes", "_id"})


class MemoryVectorsHook:
    """Kernel hook (derive phase): adds the ``memory_vectors`` writes of every
    ``long_term_memory`` write of a plan."""

    name = HOOK_NAME

    def __init__(self) -> None:
        #: (db, memory collection) -> vectors collection
        self.collections: dict[tuple[str, str], str] = {}

    def watch(self, db: str, memory_collection: str, vectors_collection: str) -> None:
        """Keep ``vectors_collection`` in step with ``memory_collection`` of ``db``."""
        known = self.collections.get((db, memory_collection))
        if known is not None and known != vectors_collection:
            raise InvalidInputError(
                f"{db}.{memory_collection} already keeps its vectors in {known!r}, not "
                f"{vectors_collection!r}: use one vectors collection per memory collection"
            )
        self.collections[(db, memory_collection)] = vectors_collection

    def derive(self, plan: Plan) -> None:
        added = []
        for group in plan.groups:
            if group.artifact != LONG_TERM_MEMORY:
                continue
            target = self.collections.get((group.db, group.collection))
            if target is None:
                continue
            ops: list[Op] = []
            for op in group.ops:
                ops.extend(_mirror(op, guarded=group.expect is not None))
            if ops:
                added.append(Group(f"{group.name}:vectors", group.db, target, MEMORY_VECTOR, ops))
        plan.groups.extend(added)


def _mirror(op: Op, *, guarded: bool) -> list[Op]:
    doc: Any = op.doc
    if op.kind == "insert":
        return [Op("insert", doc=v) for v in model.vector_documents(_mapping(doc))]
    if op.kind == "replace":
        mid = _memory_id(op, _mapping(doc))
        return [Op("delete_many", {"memory_id": mid}),
                *(Op("insert", doc=v) for v in model.vector_documents({**doc, "_id": mid}))]  # fmt: skip
    if op.kind in ("delete", "delete_many"):
        return [Op("delete_many", _filter(op.filter, guarded))]
    if op.kind in ("update", "update_many"):
        if _is_insert_once(op):
            full = {"_id": _mapping(op.filter)["_id"], **doc["$setOnInsert"]}
            return [insert_once(v) for v in model.vector_documents(full)]
        return _mirror_update(op, guarded)
    raise InvalidInputError(f"a {op.kind} op on long-term memories cannot keep their vectors")


def _mirror_update(op: Op, guarded: bool) -> list[Op]:
    doc = op.doc
    if not isinstance(doc, Mapping) or not all(str(k).startswith("$") for k in doc):
        raise InvalidInputError(
            "long-term memories are updated with $set/$unset documents or replaced; a "
            "pipeline or replacement-style update cannot keep their vectors in step"
        )
    if op.upsert:
        raise InvalidInputError("an upsert of a long-term memory must be insert_once or replace")
    mirrored: dict[str, dict[str, Any]] = {}
    for operator, fields in doc.items():
        names = [str(f).split(".")[0] for f in (fields or {})]
        touched = set(names) & (_NEVER_UPDATED | _UPDATE_MIRRORED)
        if not touched:
            continue
        if touched & _NEVER_UPDATED or operator not in ("$set", "$unset"):
            raise InvalidInputError(
                f"updating {sorted(touched)} of a long-term memory with {operator} is not "
                f"supported: replace the memory (its vectors are replaced with it)"
            )
        mirrored[operator] = {k: v for k, v in fields.items() if k in _UPDATE_MIRRORED}
    if not mirrored:
        return []
    return [Op("update_many", _filter(op.filter, guarded), mirrored)]


def _is_insert_once(op: Op) -> bool:
    return (
        op.upsert
        and isinstance(op.doc, Mapping)
        and set(op.doc) == {"$setOnInsert"}
        and isinstance(op.filter, Mapping)
        and set(op.filter) == {"_id"}
    )


def _filter(filt: Mapping[str, Any] | None, guarded: bool) -> dict[str, Any]:
    """A memory filter as a filter on its vectors."""
    out: dict[str, Any] = {}
    other = []
    for name, cond in (filt or {}).items():
        if name == "_id":
            out["memory_id"] = cond
        elif name in model.MIRRORED_FIELDS:
            out[name] = cond
        else:
            other.append(name)
    if other and not ("memory_id" in out and guarded):
        raise InvalidInputError(
            f"a write of long-term memories filtered on {sorted(other)} cannot be mirrored "
            f"on their vectors: filter on _id (with an Expect guard on the group) or on "
            f"{', '.join(model.MIRRORED_FIELDS)}"
        )
    if not out:
        raise InvalidInputError(
            "a write of every long-term memory (empty filter) is refused; filter on tenant_id"
        )
    return out


def _memory_id(op: Op, doc: Mapping[str, Any]) -> Any:
    filt = _mapping(op.filter)
    mid = doc.get("_id", filt.get("_id"))
    if mid is None or isinstance(mid, Mapping):
        raise InvalidInputError("a replace of a long-term memory must name its _id")
    return mid


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"expected a document, got {type(value).__name__}")
    return value


def register(uow: Any, db: str, memory_collection: str, vectors_collection: str) -> None:
    """Make ``uow`` keep ``vectors_collection`` in step with ``memory_collection``."""
    hook = next((h for h in uow.hooks.all if getattr(h, "name", None) == HOOK_NAME), None)
    if hook is None:
        hook = MemoryVectorsHook()
        uow.register(hook)
    hook.watch(db, memory_collection, vectors_collection)
