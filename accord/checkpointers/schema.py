"""Storage shape of the checkpointer: collection names, document ids, indexes.

One collection per artifact class (see docs/checkpointer.md, "Storage model"). Every
document carries ``tenant_id`` and every index leads with it, so no query crosses tenants.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel

#: Size of one payload chunk. MongoDB documents are capped at 16 MiB; 8 MiB chunks leave
#: room for the key fields and keep every op of a client-level bulkWrite under the cap.
DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024

#: Tenant used when neither the config nor the saver names one.
DEFAULT_TENANT = "default"

#: Blob ``type`` for a message channel stored as references to short-term-memory documents.
MSGREFS_TYPE = "__accord_msgrefs__"


@dataclass(frozen=True)
class CollectionNames:
    """Names of the collections the checkpointer owns (all configurable).

    Attributes:
        checkpoints: execution state of a super-step, pointers to blobs, no channel values.
        blobs: one channel value at one version (chunked when large).
        writes: pending writes of tasks (LangGraph ``put_writes``).
        messages: short-term memory, one document per message revision.
        heads: one document per (tenant, thread, namespace): the checkpoint that may be
            extended; the single-writer guard compares-and-sets it in every ``put``.
        outbox: events for asynchronous work (memory aggregation), written in the same
            transaction as the step.
    """

    checkpoints: str = "checkpoints"
    blobs: str = "checkpoint_blobs"
    writes: str = "checkpoint_writes"
    messages: str = "short_term_memory"
    heads: str = "checkpoint_heads"
    outbox: str = "outbox"

    def all(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def doc_id(*parts: Any) -> str:
    """Deterministic ``_id`` for the natural key ``parts``.

    Deterministic ids make every insert idempotent (a retried or replayed transaction
    upserts the same documents). Hashing keeps ids short and unambiguous whatever
    characters thread ids or channel names contain.
    """
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()


def blob_key(channel: str, version: Any) -> str:
    """Key of one channel value at one version, unique within (tenant, thread, ns)."""
    return doc_id("b", channel, version)


def head_id(tenant_id: str, thread_id: str, checkpoint_ns: str) -> str:
    return doc_id("h", tenant_id, thread_id, checkpoint_ns)


def checkpoint_doc_id(
    tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> str:
    return doc_id("c", tenant_id, thread_id, checkpoint_ns, checkpoint_id)


def index_models(names: CollectionNames) -> dict[str, list[IndexModel]]:
    """Indexes per collection key (see :class:`CollectionNames`)."""
    t = ("tenant_id", ASCENDING)
    return {
        "checkpoints": [
            IndexModel(
                [
                    t,
                    ("thread_id", ASCENDING),
                    ("checkpoint_ns", ASCENDING),
                    ("checkpoint_id", DESCENDING),
                ],
                name="thread_ns_checkpoint",
                unique=True,
            ),
            IndexModel([t, ("run_id", ASCENDING)], name="run"),
        ],
        "blobs": [
            IndexModel(
                [
                    t,
                    ("thread_id", ASCENDING),
                    ("checkpoint_ns", ASCENDING),
                    ("key", ASCENDING),
                    ("chunk", ASCENDING),
                ],
                name="thread_ns_key_chunk",
                unique=True,
            ),
            IndexModel(
                [
                    t,
                    ("thread_id", ASCENDING),
                    ("checkpoint_ns", ASCENDING),
                    ("slot", ASCENDING),
                    ("seq", ASCENDING),
                ],
                name="thread_ns_slot_seq",
            ),
        ],
        "writes": [
            IndexModel(
                [
                    t,
                    ("thread_id", ASCENDING),
                    ("checkpoint_ns", ASCENDING),
                    ("checkpoint_id", ASCENDING),
                    ("task_id", ASCENDING),
                    ("idx", ASCENDING),
                    ("chunk", ASCENDING),
                ],
                name="thread_ns_checkpoint_task_idx",
                unique=True,
            ),
        ],
        "messages": [
            IndexModel(
                [t, ("thread_id", ASCENDING), ("key", ASCENDING), ("chunk", ASCENDING)],
                name="thread_key_chunk",
                unique=True,
            ),
            IndexModel(
                [t, ("thread_id", ASCENDING), ("created_at", ASCENDING)], name="thread_created"
            ),
        ],
        "heads": [
            IndexModel(
                [t, ("thread_id", ASCENDING), ("checkpoint_ns", ASCENDING)], name="thread_ns"
            ),
        ],
        "outbox": [
            IndexModel(
                [t, ("status", ASCENDING), ("created_at", ASCENDING)], name="tenant_status_created"
            ),
            IndexModel([t, ("thread_id", ASCENDING)], name="thread"),
        ],
    }


def blob_doc_id(tenant_id: str, thread_id: str, checkpoint_ns: str, key: str, chunk: int) -> str:
    return doc_id("blob", tenant_id, thread_id, checkpoint_ns, key, chunk)


def write_doc_id(
    tenant_id: str,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    idx: int,
    chunk: int,
) -> str:
    return doc_id("w", tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, chunk)


def message_doc_id(tenant_id: str, thread_id: str, key: str, chunk: int) -> str:
    return doc_id("msg", tenant_id, thread_id, key, chunk)
