"""Forgetting a deleted thread: what long-term memory keeps of it, decided (pure).

When the checkpointer deletes a thread it writes a ``thread_deleted`` outbox event
(accord.checkpointers.events). The aggregator then forgets what the thread gave
(:mod:`accord.memory.asynchronous.forgetting` does the I/O), per memory with a version
whose ``provenance.thread_id`` is the thread:

* every version came from the thread: the memory is deleted, with its history and its
  vectors;
* its current version came from another thread: it stays as it is; the thread's older
  versions leave its history;
* its current version came from the thread and earlier ones from others: it is
  **re-derived**: the latest version from another thread becomes current again (its text
  is that thread's own statement: the rule extractor and the consolidator give each
  version the text of the statement that made it), re-embedded, as a new version; the
  thread's versions leave the history.

Every version carries the thread it came from (``provenance``), so this needs no
re-extraction. Memories whose provenance names no thread (store, HTTP and MCP writes) are
never touched.

No ``$in`` list of forgetting's reads and writes holds more than :data:`PAGE` values (a
thread may have derived very many memories: one list of them all would make a command past
MongoDB's 16 MiB limit); a write's list is split into several operations of one group (same
transaction, the group's counts are their sum).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from accord.memory import model
from accord.memory.aggregation import memory_conflict
from accord.memory.writepath import LONG_TERM_MEMORY, MEMORY_HISTORY
from accord.platform.artifacts import OUTBOX
from accord.platform.plan import Expect, Group, Op

Doc = dict[str, Any]

#: The most values one ``$in`` list of forgetting's reads and writes holds.
PAGE = 1000

_T = TypeVar("_T")


def chunks(values: Sequence[_T]) -> Iterator[list[_T]]:
    """``values`` in slices of at most :data:`PAGE` (read when called, so a test can lower
    it): one ``$in`` list per slice keeps each command bounded."""
    step = PAGE
    for start in range(0, len(values), step):
        yield list(values[start : start + step])


def thread_of(version: Mapping[str, Any]) -> Any:
    return (version.get("provenance") or {}).get("thread_id")


@dataclass
class Forgetting:
    """What forgetting a thread does to the memories it reached."""

    #: current documents of memories every version of which came from the thread
    delete: list[Doc] = field(default_factory=list)
    #: (current document, the history version that becomes current again)
    restore: list[tuple[Doc, Doc]] = field(default_factory=list)
    #: ids of memories that keep their current version; the thread's versions go
    prune: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.delete) + len(self.restore) + len(self.prune)


def decide(
    thread_id: str, memories: Sequence[Doc], history: Mapping[str, Sequence[Doc]]
) -> Forgetting:
    """``memories``: current documents reached by the thread; ``history``: each one's
    history documents (any order)."""
    out = Forgetting()
    for doc in memories:
        # the memory's current life: the versions since it was last deleted (a memory
        # deleted, then added again, starts again at version 1; the deleted one must never
        # come back)
        ordered = sorted(history.get(doc["_id"], ()), key=_replaced)
        deletions = [i for i, h in enumerate(ordered) if h.get("change") == "delete"]
        life = ordered[deletions[-1] + 1 :] if deletions else ordered
        kept = [h for h in life if thread_of(h) != thread_id]
        if thread_of(doc) != thread_id:
            out.prune.append(doc["_id"])
        elif kept:
            out.restore.append((doc, kept[-1]))
        else:
            out.delete.append(doc)
    return out


def _replaced(version: Mapping[str, Any]) -> tuple[datetime, Any]:
    """When a history version stopped being current (its ``_id`` breaks ties: ObjectIds
    grow with time)."""
    at = model.aware(version.get("replaced_at")) or datetime.min.replace(tzinfo=UTC)
    return at, str(version.get("_id"))


def restored_document(current: Doc, version: Doc, embedding: Sequence[float] | None) -> Doc:
    """``current`` with ``version``'s content as a new version (its vector re-embedded)."""
    doc = {k: v for k, v in current.items() if k not in ("embedding", "embeddings")}
    doc.update(
        value=version.get("value") or {},
        text=version.get("text"),
        kind=version.get("kind") or current.get("kind", "item"),
        provenance=version.get("provenance") or {},
        updated_at=version.get("valid_from") or current["updated_at"],
        version=current["version"] + 1,
    )
    if embedding is not None:
        doc["embedding"] = model.as_vector(embedding)
    return doc


def groups(
    thread_id: str,
    tenant_id: str,
    decided: Forgetting,
    embeddings: Mapping[str, Sequence[float] | None],
    *,
    db: str,
    memories: str,
    history: str,
) -> list[Group]:
    """The writes: memories deleted and re-derived (compare-and-set on the version read:
    a memory changed meanwhile fails the commit, which is decided again), and the history
    versions that go with them (the memories' vectors follow through the memory service's
    vectors hook, in the same transaction)."""
    deletes = Group("forget:delete", db, memories, LONG_TERM_MEMORY)
    replaces = Group("forget:restore", db, memories, LONG_TERM_MEMORY)
    old = Group("forget:history", db, history, MEMORY_HISTORY)
    for doc in decided.delete:
        deletes.ops.append(Op("delete", {"_id": doc["_id"], "version": doc["version"]}))
    for doc, version in decided.restore:
        new = restored_document(doc, version, embeddings.get(doc["_id"]))
        replaces.ops.append(Op("replace", {"_id": doc["_id"], "version": doc["version"]}, new))
        old.ops.append(Op("delete", {"_id": version["_id"], "tenant_id": tenant_id}))
    for gone in chunks([d["_id"] for d in decided.delete]):
        old.ops.append(Op("delete_many", {"tenant_id": tenant_id, "memory_id": {"$in": gone}}))
    for reached in chunks([d["_id"] for d, _ in decided.restore] + decided.prune):
        old.ops.append(
            Op(
                "delete_many",
                {
                    "tenant_id": tenant_id,
                    "memory_id": {"$in": reached},
                    "provenance.thread_id": thread_id,
                },
            )
        )
    deletes.expect = Expect(deleted=len(deletes.ops), error=memory_conflict)
    replaces.expect = Expect(matched=len(replaces.ops), error=memory_conflict)
    return [g for g in (deletes, replaces, old) if g.ops]


def not_yet_done_guard(db: str, outbox: str, event_ids: Sequence[str]) -> Group:
    """That the thread's events not done when its memories were read are still not done:
    one that committed memories meanwhile fails the commit (decided again)."""
    ops = [Op("update_many", {"_id": {"$in": ids}, "status": "done"},
              {"$set": {"forgotten": True}}) for ids in chunks(event_ids)]  # fmt: skip
    return Group("forget:fence", db, outbox, OUTBOX.name, ops,
                 expect=Expect(matched=0, error=memory_conflict))  # fmt: skip


def events_of_thread(db: str, outbox: str, tenant_id: str, thread_id: str, event: Mapping[str, Any],
                     until: datetime) -> Group:  # fmt: skip
    """Delete the thread's other events up to the deletion (pending ones left by a crash,
    claimed ones: their worker's commit then finds its claim gone and writes nothing,
    dead ones that a requeue would bring back, done ones)."""
    op = Op("delete_many", {"tenant_id": tenant_id, "thread_id": thread_id,
                            "_id": {"$ne": event["_id"]}, "created_at": {"$lte": until}})  # fmt: skip
    return Group("forget:events", db, outbox, OUTBOX.name, [op])
