"""Pure helpers of the maintenance operations (delete, copy, prune, delete_for_runs).

The savers run them as plans through the unit of work: in one transaction when the
thread fits one (:data:`BATCH` documents per collection), else in batches, ordered so
that a reader never sees a checkpoint whose values are gone and a crash half-way leaves
nothing a re-run would not finish.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from accord.checkpointers import chains, schema
from accord.checkpointers.storage import Scope, now
from accord.platform import calls
from accord.platform.plan import Op

#: Documents per collection deleted or copied in one transaction.
BATCH = 1000

#: Field of a thread's run-registry document set (to the time the collection began) in
#: each transaction that deletes some of its checkpoints (a prune, ``delete_for_runs``),
#: and unset once the values they alone referenced are collected: a run killed in
#: between leaves it, so the sweep (``collect``) can finish the job.
COLLECT_PENDING = "collect_pending"

#: Collections of a thread's data, in the order they are deleted: checkpoints first (so
#: no reader sees a checkpoint without its values), then what they point to, then the
#: thread's recorded tool and model calls.
THREAD_DATA = ("checkpoints", "writes", "blobs", "messages", "calls")
#: ... and the order they are copied: values first, checkpoints last.
COPY_ORDER = ("blobs", "messages", "writes", "checkpoints")


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
    else:
        raise ValueError(kind)
    return d


def replace_ops(docs: Iterable[Mapping[str, Any]]) -> list[Op]:
    return [Op("replace", {"_id": d["_id"]}, dict(d), upsert=True) for d in docs]


def dropped_calls(scope: Scope, checkpoint_ids: list[str]) -> dict[str, Any]:
    """The filter of the recorded calls that go with the checkpoints ``checkpoint_ids`` of
    ``scope``'s thread (a prune, ``delete_for_runs``): a call's ``checkpoint_id`` is the
    checkpoint its task ran from, so only a task of that checkpoint replays it, and a kept
    checkpoint's pending tasks have theirs under its own id. Checkpoint ids are unique in
    a thread (uuid6), whatever the namespace (a subgraph task's calls name its
    namespace's checkpoint). Calls not settled (an intent without a result, a failure to
    retry, a call parked for a human) stay: the run may still be waiting on them."""
    return {
        **scope.thread_filter, "checkpoint_id": {"$in": checkpoint_ids},
        "status": {"$nin": list(calls.UNSETTLED)},
    }  # fmt: skip


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


def referenced_blobs(
    checkpoint_docs: Iterable[Mapping[str, Any]], links: Mapping[str, str | None]
) -> set[str]:
    """Blob keys the remaining checkpoints read, with their message-ref chains
    (``links``: key -> ``prev``/``base`` of each message-ref blob)."""
    referenced: set[str] = set()
    for d in checkpoint_docs:
        referenced.update(d.get("blobs") or ())
    return chains.chain_closure(referenced, links)


def garbage(
    scope: Scope, keep_blobs: set[str], keep_messages: set[str], cutoff: datetime
) -> list[tuple[str, dict[str, Any]]]:
    """(collection key, filter) deleting a namespace's unreferenced values and the
    thread's unreferenced messages created before ``cutoff``."""
    return [
        (
            "blobs",
            {**scope.ns_filter, "key": {"$nin": sorted(keep_blobs)}, "created_at": {"$lt": cutoff}},
        ),
        (
            "messages",
            {
                **scope.thread_filter,
                "key": {"$nin": sorted(keep_messages)},
                "created_at": {"$lt": cutoff},
            },
        ),
    ]
