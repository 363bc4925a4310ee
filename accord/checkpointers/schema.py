"""Storage shape of the checkpointer: collection names, document ids, indexes.

One collection per artifact class (see docs/checkpointer.md, "Storage model"). Every
document carries ``tenant_id`` and every index leads with it, so no query crosses tenants.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel

from accord.platform import artifacts, outbox
from accord.platform.ids import doc_id

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

    The checkpoint collections are prefixed ``accord_`` so that they never collide with
    MongoDBSaver's ``checkpoints`` / ``checkpoint_writes`` in a database both use; a
    database set up by an accord version before that keeps its names
    (:data:`LEGACY_NAMES`, resolved at setup from the catalog).

    Attributes:
        checkpoints: execution state of a super-step, pointers to blobs, no channel values.
        blobs: one channel value at one version (chunked when large).
        writes: pending writes of tasks (LangGraph ``put_writes``).
        messages: short-term memory, one document per message revision.
        runs: the run registry (``accord.platform.runs``): one document per (tenant,
            thread) naming the run that may write it, its lease and fencing number.
        outbox: events for asynchronous work (memory aggregation), written in the same
            transaction as the step.
        calls: recorded tool and model calls (:mod:`accord.checkpointers.recorded`); the
            call log sets it up, and the checkpointer deletes a thread's calls with the
            thread.
    """

    checkpoints: str = "accord_checkpoints"
    blobs: str = "accord_checkpoint_blobs"
    writes: str = "accord_checkpoint_writes"
    messages: str = "short_term_memory"
    runs: str = "runs"
    outbox: str = "outbox"
    calls: str = str(artifacts.RECORDED_CALL.default_collection)

    def all(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def artifacts(self) -> dict[str, str]:
        """Collection name -> artifact class of every collection the saver reads or writes."""
        return {getattr(self, key): cls for key, cls in ARTIFACTS.items()}

    def owned(self) -> dict[str, str]:
        """Collection name -> artifact class (what ``setup()`` records in the catalog)."""
        return {
            getattr(self, key): cls for key, cls in ARTIFACTS.items() if key not in SET_UP_ELSEWHERE
        }


#: The default names accord used before its checkpoint collections were prefixed
#: ``accord_`` (collection key -> name). A saver on the new defaults whose database's
#: catalog records these (and not the new ones) keeps using them.
LEGACY_NAMES = {
    "checkpoints": "checkpoints",
    "blobs": "checkpoint_blobs",
    "writes": "checkpoint_writes",
}

#: Artifact class of each collection (``accord.platform.artifacts``).
ARTIFACTS = {
    "checkpoints": artifacts.CHECKPOINT.name,
    "blobs": artifacts.CHECKPOINT_BLOB.name,
    "writes": artifacts.CHECKPOINT_WRITE.name,
    "messages": artifacts.SHORT_TERM_MEMORY.name,
    "runs": artifacts.RUN.name,
    "outbox": artifacts.OUTBOX.name,
    "calls": artifacts.RECORDED_CALL.name,
}
#: Collection keys another component sets up and records (the call log, "durable").
SET_UP_ELSEWHERE = frozenset({"calls"})


def blob_key(channel: str, version: Any) -> str:
    """Key of one channel value at one version, unique within (tenant, thread, ns)."""
    return doc_id("b", channel, version)


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
        "runs": [IndexModel([("expire_at", ASCENDING)], name="expire_at")],
        "outbox": list(outbox.INDEXES),
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
