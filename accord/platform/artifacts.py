"""The artifact classes of accord and the catalog of the collections that hold them.

Each kind of persisted data (a checkpoint, a message, a memory, an audit record...) is an
*artifact class* with its own collection, lifecycle and rules (see DESIGN.md, "Artifact
classes"). Plans name the class of every group they write, so hooks (policy, audit,
tenancy) can apply the class's rules whatever component wrote it.

The catalog: every component records the collections it owns in the database's
``accord_catalog`` collection when it sets up (``Catalog.register``). That is how accord
knows its own collections even when another application on the same database configured
other names: no tenant input (a business write's collection name, a store namespace...)
may target a collection listed there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from accord.errors import InvalidInputError
from accord.platform.plan import Group, Plan, PlanContext, insert_once


@dataclass(frozen=True)
class ArtifactClass:
    """One kind of persisted data.

    ``tenant_writable``: documents of this class are written from tenant input (a node's
    business writes): the tenancy hook checks every op so that no input can re-label,
    read or write another tenant's documents. ``default_collection`` is None when the
    application names the collection (business collections).
    """

    name: str
    description: str
    default_collection: str | None
    thread_scoped: bool = False
    tenant_writable: bool = False


CHECKPOINT = ArtifactClass(
    "checkpoint", "execution state of a super-step", "accord_checkpoints", thread_scoped=True
)
CHECKPOINT_BLOB = ArtifactClass(
    "checkpoint_blob", "a channel value at one version", "accord_checkpoint_blobs",
    thread_scoped=True,
)  # fmt: skip
CHECKPOINT_WRITE = ArtifactClass(
    "checkpoint_write", "pending writes of a task", "accord_checkpoint_writes",
    thread_scoped=True,
)  # fmt: skip
CHECKPOINT_HEAD = ArtifactClass(
    "checkpoint_head", "the checkpoint a thread's writer extends", "checkpoint_heads",
    thread_scoped=True,
)  # fmt: skip
SHORT_TERM_MEMORY = ArtifactClass(
    "short_term_memory", "a thread's messages", "short_term_memory", thread_scoped=True
)
OUTBOX = ArtifactClass("outbox", "events for asynchronous work", "outbox")
LONG_TERM_MEMORY = ArtifactClass(
    "long_term_memory", "durable memories with embeddings", "long_term_memory"
)
MEMORY_HISTORY = ArtifactClass(
    "memory_history", "previous versions of long-term memories", "memory_history"
)
MEMORY_VECTOR = ArtifactClass(
    "memory_vector", "the vectors of long-term memories, one per memory and field",
    "memory_vectors",
)  # fmt: skip
AUDIT = ArtifactClass("audit", "hash-chained mutation records", "accord_audit")
AUDIT_DIGEST = ArtifactClass(
    "audit_digest", "Merkle digests of the audit chains' heads, append-only",
    "accord_audit_digests",
)  # fmt: skip
RUN = ArtifactClass("run", "run registry: active run, lease, fence", "runs", thread_scoped=True)
CATALOG = ArtifactClass("catalog", "the collections accord owns", "accord_catalog")
MIGRATION = ArtifactClass(
    "migration", "progress of migrations from other savers into accord", "accord_migrations"
)
POLICY = ArtifactClass(
    "policy", "the governance policies applied to the database, versioned", "accord_policies"
)
RECORDED_CALL = ArtifactClass(
    "recorded_call", "tool and model calls of runs: intent, arguments, result",
    "accord_recorded_calls", thread_scoped=True,
)  # fmt: skip
HOLD = ArtifactClass(
    "hold", "legal holds: what must not expire, be swept or be erased while they last",
    "accord_holds",
)  # fmt: skip
BUSINESS = ArtifactClass(
    "business", "the application's own records written by nodes", None, tenant_writable=True
)
WORKFLOW_EVENT = ArtifactClass(
    "workflow_event", "ordered events the agents of one workflow share, append-only",
    "accord_workflow_events",
)  # fmt: skip
ARTIFACT = ArtifactClass(
    "artifact", "large outputs and files of a thread's steps, by pointer (GridFS files)",
    "accord_artifacts.files", thread_scoped=True,
)  # fmt: skip
ARTIFACT_CHUNK = ArtifactClass(
    "artifact_chunk", "the bytes of artifacts, in chunks (GridFS chunks)",
    "accord_artifacts.chunks", thread_scoped=True,
)  # fmt: skip
BUSINESS_UNDO = ArtifactClass(
    "business_undo", "before-images of business writes, for rolling a thread back",
    "accord_business_undo", thread_scoped=True,
)  # fmt: skip

QUEUED_RUN = ArtifactClass(
    "queued_run", "the queue of runs: graph, input, status, owner, lease, fence, result",
    "accord_run_queue", thread_scoped=True,
)  # fmt: skip

ENCRYPTION_KEY = ArtifactClass(
    "encryption_key", "data keys of encrypted classes, wrapped under the master key",
    "accord_keys",
)  # fmt: skip

CLASSES: dict[str, ArtifactClass] = {
    c.name: c
    for c in (
        CHECKPOINT,
        CHECKPOINT_BLOB,
        CHECKPOINT_WRITE,
        CHECKPOINT_HEAD,
        SHORT_TERM_MEMORY,
        OUTBOX,
        LONG_TERM_MEMORY,
        MEMORY_HISTORY,
        MEMORY_VECTOR,
        AUDIT,
        AUDIT_DIGEST,
        RUN,
        CATALOG,
        MIGRATION,
        POLICY,
        RECORDED_CALL,
        HOLD,
        BUSINESS,
        WORKFLOW_EVENT,
        QUEUED_RUN,
        ARTIFACT,
        ARTIFACT_CHUNK,
        BUSINESS_UNDO,
        ENCRYPTION_KEY,
    )
}

#: The catalog's own collection name (fixed: it is how every component finds the others).
CATALOG_COLLECTION = "accord_catalog"


def artifact(name: str) -> ArtifactClass:
    """The artifact class called ``name``."""
    try:
        return CLASSES[name]
    except KeyError:
        raise InvalidInputError(
            f"unknown artifact class {name!r}; one of {sorted(CLASSES)}"
        ) from None


def catalog_plan(db: str, owned: Mapping[str, str], component: str) -> Plan:
    """The plan that records ``owned`` (collection name -> artifact class name) as
    ``component``'s in database ``db``'s catalog. Idempotent: an entry that exists stays
    as it is (the first owner keeps it)."""
    now = datetime.now(UTC)
    ops = []
    for collection, class_name in sorted(owned.items()):
        cls = artifact(class_name)
        if cls.tenant_writable:
            raise InvalidInputError(
                f"{collection!r}: {class_name!r} collections belong to the application, not "
                f"to accord; they are not recorded in the catalog."
            )
        ops.append(
            insert_once(
                {
                    "_id": collection,
                    "artifact": class_name,
                    "component": component,
                    "registered_at": now,
                }
            )
        )
    return Plan(
        PlanContext(tenant_id="*", operation=f"{component}.setup"),
        [Group("catalog", db, CATALOG_COLLECTION, CATALOG.name, ops)],
    )


def reserved_names(entries: Iterable[Mapping[str, Any]], own: Iterable[str] = ()) -> frozenset[str]:
    """Collection names no tenant input may target: the catalog's entries, the caller's
    own collections (``own``) and the catalog itself. (``system.*`` is refused by name
    checks everywhere.)"""
    return frozenset({CATALOG_COLLECTION, *own, *(str(e["_id"]) for e in entries)})
