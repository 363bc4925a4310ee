"""Pure helpers of the maintenance operations (delete, copy, prune, delete_for_runs)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pymongo import ReplaceOne

from accord.checkpointers import schema
from accord.checkpointers.storage import Scope, now


def thread_deletes(names: schema.CollectionNames, scope: Scope) -> list[tuple[str, dict[str, Any]]]:
    """(collection, filter) pairs that delete a thread, head first so that a concurrent
    writer's compare-and-set fails instead of writing into a half-deleted thread."""
    f = scope.thread_filter
    return [
        (names.heads, f),
        (names.checkpoints, f),
        (names.writes, f),
        (names.blobs, f),
        (names.messages, f),
        (names.outbox, {**f, "status": "pending"}),
    ]


def rekey(kind: str, doc: Mapping[str, Any], thread_id: str) -> dict[str, Any]:
    """A copy of ``doc`` moved to ``thread_id``, with its deterministic ``_id`` recomputed."""
    d = dict(doc)
    d["thread_id"] = thread_id
    t, ns = d["tenant_id"], d.get("checkpoint_ns", "")
    if kind == "checkpoints":
        d["_id"] = schema.checkpoint_doc_id(t, thread_id, ns, d["checkpoint_id"])
    elif kind == "blobs":
        d["_id"] = schema.blob_doc_id(t, thread_id, ns, d["key"], d["chunk"])
    elif kind == "writes":
        d["_id"] = schema.write_doc_id(
            t, thread_id, ns, d["checkpoint_id"], d["task_id"], d["idx"], d["chunk"]
        )
    elif kind == "messages":
        d["_id"] = schema.message_doc_id(t, thread_id, d["key"], d["chunk"])
    elif kind == "heads":
        d["_id"] = schema.head_id(t, thread_id, ns)
    else:
        raise ValueError(kind)
    return d


def upsert_all(collection: Any, docs: list[dict[str, Any]]) -> Any:
    return collection.bulk_write(
        [ReplaceOne({"_id": d["_id"]}, d, upsert=True) for d in docs], ordered=False
    )


def by_scope(docs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for d in docs:
        out[(d["thread_id"], d["checkpoint_ns"])].append(d["checkpoint_id"])
    return out


def uses_delta_channels(doc: Mapping[str, Any], serde: Any) -> bool:
    """Whether a checkpoint belongs to a graph with LangGraph DeltaChannels (whose state
    is rebuilt from ancestors, so ``prune(keep_latest)`` must not drop them)."""
    meta = doc.get("meta") or {}
    if meta.get("counters_since_delta_snapshot"):
        return True
    m = doc.get("metadata")
    if m:
        return bool(
            serde.loads_typed((m["type"], bytes(m["data"]))).get("counters_since_delta_snapshot")
        )
    return False


def gc_cutoff() -> datetime:
    """Garbage collection only removes documents created before it started, so values a
    concurrent put is inserting right now are never collected."""
    return now()


def head_doc(scope: Scope, checkpoint_id: str, run_id: Any) -> dict[str, Any]:
    return {
        "_id": scope.head_id,
        **scope.ns_filter,
        "checkpoint_id": checkpoint_id,
        "run_id": run_id if isinstance(run_id, str) else None,
        "updated_at": now(),
    }
