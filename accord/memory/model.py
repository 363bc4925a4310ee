"""The long-term memory model: documents, identifiers, validation, plans and queries as data.

Pure code (no I/O): the async service (the source) and the sync one share it, and part B
(aggregator, HTTP, MCP) builds on it.

A ``long_term_memory`` document::

    _id          sha256(tenant, namespace, key)[:32]  one memory per (tenant, namespace, key)
    tenant_id    str                                  every query is scoped by it
    namespace    [str, ...]                           e.g. ["users", "u1", "memories"]
    ns_path      "users.u1.memories"                  labels never contain "."
    ns_prefixes  ["users", "users.u1", "users.u1.memories"]   pre-filter for prefix search
    ns_depth     3
    key          str
    value        {...}                                the BaseStore value / the memory
    text         str | None                           what was embedded (field texts joined)
    embedding    BinData float32 vector | absent      ONE vector, of ``text``
    embeddings   [{path, embedding}] | absent         or one vector per indexed field path
                                                      (BaseStore's IndexConfig ``fields``)
    kind         "item" | "fact" | "preference" | "episode" | ...
    provenance   {source, tenant_id, thread_id, checkpoint_id, message_ids}
    created_at, updated_at   datetime (UTC)
    expires_at   datetime | None                      TTL index (expireAfterSeconds 0)
    ttl_minutes  float | None                         to refresh expires_at on read
    version      int                                  1, 2, ... (compare-and-set on write)

Neither ``embedding`` nor ``embeddings``: not indexed (``index=False``).

A ``memory_vectors`` document is one vector of one memory, what vector search runs on (a
``vectorSearch`` index named ``memory_vector_search``, filters ``tenant_id``,
``ns_prefixes``, ``kind``)::

    _id          "<memory _id>:<n>"
    memory_id    the memory's _id
    tenant_id, ns_prefixes, kind, expires_at           copied from the memory
    path         the field path (``"text"`` for a memory's one vector)
    embedding    BinData float32 vector

They are derived from the memory documents in the same transaction by
:class:`accord.memory.vector_docs.MemoryVectorsHook`, whoever writes the memory. A search
takes each memory's best-scoring vector (as LangGraph's stores do).

A ``memory_history`` document is a previous version: ``_id`` an ObjectId,
``memory_id``, ``tenant_id``, ``namespace``, ``key``, ``version``, ``value``, ``text``,
``kind``, ``provenance``, ``valid_from`` (its updated_at), ``replaced_at``, ``change``
(``"update"`` or ``"delete"``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import ObjectId
from bson.binary import Binary, BinaryVectorDtype

from accord.memory import validation

Doc = dict[str, Any]
MEMORY_COLLECTION = "long_term_memory"
HISTORY_COLLECTION = "memory_history"
VECTORS_COLLECTION = "memory_vectors"
VECTOR_INDEX = "memory_vector_search"
FILTER_FIELDS = ("tenant_id", "ns_prefixes", "kind")
#: The ``path`` of a memory's one vector (the vector of its whole ``text``).
TEXT_PATH = "text"
#: The fields a vector document copies from its memory (kept in step by the hook).
MIRRORED_FIELDS = ("tenant_id", "ns_prefixes", "kind", "expires_at")
#: Atlas's bound on ``numCandidates`` (and so on ``limit``).
MAX_CANDIDATES = 10_000
#: Limits and checks live in accord.memory.validation (one module for every door); these
#: names stay here for the modules that read them from the model.
VALUE_OPERATORS = validation.VALUE_OPERATORS
MAX_LABEL = validation.MAX_LABEL
MAX_KEY = validation.MAX_KEY
check_tenant = validation.check_tenant
check_namespace = validation.check_namespace
check_key = validation.check_key
check_value_filter = validation.check_filter


def check_request(req: PutRequest) -> PutRequest:
    """Validate one write (every door's, whoever builds it): namespace, key, and for a
    put the value, text, field texts, kind and TTL. Returns it unchanged."""
    validation.check_namespace(req.namespace)
    validation.check_key(req.key)
    if req.value is None:
        return req
    validation.check_value(req.value)
    _check_provenance(req.provenance)
    if req.text is not None:
        validation.check_text(req.text)
    for i, (path, text) in enumerate(req.field_texts):
        validation.check_text(path, f"index[{i}]", limit=validation.MAX_KEY)
        validation.check_text(text, f"text of {validation.preview(path)}")
    validation.check_kind(req.kind)
    validation.check_ttl(req.ttl_minutes, "ttl_minutes")
    return req


def _check_provenance(provenance: Any) -> None:
    """A put's provenance: a :class:`Provenance` of strings (``None`` raised an
    AttributeError from deep in the write)."""
    if not isinstance(provenance, Provenance):
        raise validation.InvalidField(
            "provenance", f"must be a Provenance, got {validation.preview(provenance)}"
        )
    for name in ("source", "tenant_id", "thread_id", "checkpoint_id"):
        value = getattr(provenance, name)
        if value is not None and not isinstance(value, str):
            raise validation.InvalidField(
                f"provenance.{name}", f"must be a string, got {validation.preview(value)}"
            )
    ids = provenance.message_ids
    if not isinstance(ids, tuple | list) or not all(isinstance(i, str) for i in ids):
        raise validation.InvalidField(
            "provenance.message_ids", f"must be a tuple of strings, got {validation.preview(ids)}"
        )


# -- identifiers and documents -----------------------------------------------------------------


def memory_id(tenant_id: str, namespace: Sequence[str], key: str) -> str:
    raw = json.dumps([tenant_id, list(namespace), key], ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def ns_path(namespace: Sequence[str]) -> str:
    return ".".join(namespace)


def ns_prefixes(namespace: Sequence[str]) -> list[str]:
    return [".".join(namespace[: i + 1]) for i in range(len(namespace))]


def as_vector(embedding: Sequence[float]) -> Binary:
    return Binary.from_vector([float(x) for x in embedding], BinaryVectorDtype.FLOAT32)


def utcnow() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=(now.microsecond // 1000) * 1000)  # BSON dates are ms


def aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Provenance:
    """Where a memory came from."""

    source: str = "store"
    tenant_id: str | None = None
    thread_id: str | None = None
    checkpoint_id: str | None = None
    message_ids: tuple[str, ...] = ()

    def to_doc(self) -> Doc:
        return {
            "source": self.source, "tenant_id": self.tenant_id, "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id, "message_ids": list(self.message_ids),
        }  # fmt: skip


@dataclass(frozen=True)
class PutRequest:
    """One memory to write (``value`` None deletes it).

    ``text`` is embedded as the memory's one vector, unless ``field_texts`` is given:
    then each ``(path, text)`` gets its own vector (a search scores the memory by its best
    one) and ``text`` is only what is shown. ``embedding`` / ``field_embeddings`` are
    vectors computed already (stored as given).
    """

    namespace: tuple[str, ...]
    key: str
    value: Mapping[str, Any] | None
    text: str | None = None
    embedding: Sequence[float] | None = None
    kind: str = "item"
    provenance: Provenance = field(default_factory=Provenance)
    ttl_minutes: float | None = None
    field_texts: tuple[tuple[str, str], ...] = ()
    field_embeddings: tuple[tuple[str, Sequence[float]], ...] = ()


def new_document(tenant_id: str, req: PutRequest, now: datetime, previous: Doc | None) -> Doc:
    """The document a put writes, given the current one (``previous``) if any."""
    doc: Doc = {
        "_id": memory_id(tenant_id, req.namespace, req.key),
        "tenant_id": tenant_id,
        "namespace": list(req.namespace),
        "ns_path": ns_path(req.namespace),
        "ns_prefixes": ns_prefixes(req.namespace),
        "ns_depth": len(req.namespace),
        "key": req.key,
        "value": dict(req.value or {}),
        "text": req.text,
        "kind": req.kind,
        "provenance": req.provenance.to_doc(),
        "created_at": previous["created_at"] if previous else now,
        "updated_at": now,
        "expires_at": (now + timedelta(minutes=req.ttl_minutes)) if req.ttl_minutes else None,
        "ttl_minutes": req.ttl_minutes,
        "version": (previous["version"] + 1) if previous else 1,
    }
    if req.field_embeddings:
        doc["embeddings"] = [{"path": p, "embedding": as_vector(v)}
                             for p, v in req.field_embeddings]  # fmt: skip
    elif req.embedding is not None:
        doc["embedding"] = as_vector(req.embedding)
    return doc


def stored_vectors(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A memory document's vectors as ``(path, vector)``: its ``embeddings``, or its one
    ``embedding`` (path :data:`TEXT_PATH`)."""
    many = doc.get("embeddings")
    if many:
        return [(str(e["path"]), e["embedding"]) for e in many]
    one = doc.get("embedding")
    return [] if one is None else [(TEXT_PATH, one)]


def vector_id(memory_id: str, n: int) -> str:
    return f"{memory_id}:{n}"


def vector_documents(doc: Mapping[str, Any]) -> list[Doc]:
    """The ``memory_vectors`` documents of a memory document (one per vector)."""
    namespace = doc.get("namespace") or []
    base = {
        "memory_id": doc["_id"],
        "tenant_id": doc.get("tenant_id"),
        "ns_prefixes": doc.get("ns_prefixes", ns_prefixes(namespace)),
        "kind": doc.get("kind", "item"),
        "expires_at": doc.get("expires_at"),
    }
    if doc.get("expire_at") is not None:  # governance's retention: vectors go with it
        base["expire_at"] = doc["expire_at"]
    return [{"_id": vector_id(doc["_id"], n), **base, "path": path, "embedding": vec}
            for n, (path, vec) in enumerate(stored_vectors(doc))]  # fmt: skip


def history_document(previous: Doc, now: datetime, change: str) -> Doc:
    return {
        "_id": ObjectId(),
        "memory_id": previous["_id"],
        "tenant_id": previous["tenant_id"],
        "namespace": previous["namespace"],
        "key": previous["key"],
        "version": previous["version"],
        "value": previous.get("value"),
        "text": previous.get("text"),
        "kind": previous.get("kind"),
        "provenance": previous.get("provenance"),
        "valid_from": previous.get("updated_at"),
        "replaced_at": now,
        "change": change,
    }


def vector_index_definition(dims: int, similarity: str = "cosine") -> Doc:
    return {
        "fields": [
            {"type": "vector", "path": "embedding", "numDimensions": dims,
             "similarity": similarity},
            *({"type": "filter", "path": f} for f in FILTER_FIELDS),
        ]
    }  # fmt: skip


# -- reads --------------------------------------------------------------------------------------


@dataclass
class Memory:
    """A memory as the service returns it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    score: float | None = None
    kind: str = "item"
    text: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = 1
    expires_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Doc, score: float | None = None) -> Memory:
        return cls(
            namespace=tuple(doc["namespace"]), key=doc["key"], value=doc.get("value") or {},
            created_at=aware(doc["created_at"]),  # type: ignore[arg-type]
            updated_at=aware(doc["updated_at"]),  # type: ignore[arg-type]
            score=score, kind=doc.get("kind", "item"), text=doc.get("text"),
            provenance=doc.get("provenance") or {}, version=doc.get("version", 1),
            expires_at=aware(doc.get("expires_at")),
        )  # fmt: skip


#: What reads fetch (never the vectors: they are large and callers do not need them).
PROJECTION = {"embedding": 0, "embeddings": 0, "ns_prefixes": 0}
#: Memories that have no vector (``index=False``, or nothing to embed).
UNEMBEDDED = {"embedding": {"$exists": False}, "embeddings": {"$exists": False}}


def scope_filter(tenant_id: str, prefix: Sequence[str]) -> Doc:
    """The tenant + namespace-prefix scope every read starts from."""
    filt: Doc = {"tenant_id": tenant_id}
    if prefix:
        filt["ns_prefixes"] = ns_path(prefix)
    return filt


def live(doc: Doc, now: datetime) -> bool:
    """False for a memory whose TTL has passed (the sweeper may not have removed it yet)."""
    expires = aware(doc.get("expires_at"))
    return expires is None or expires > now


def value_matches(value: Any, filt: Mapping[str, Any]) -> bool:
    """BaseStore filter semantics (as InMemoryStore and PostgresStore apply them)."""
    if not filt:
        return True
    if not isinstance(value, Mapping):
        return False
    return all(_compare(value.get(k), v) for k, v in filt.items())


def _compare(item: Any, cond: Any) -> bool:
    if isinstance(cond, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in cond):
            return all(_apply(item, op, operand) for op, operand in cond.items())
        if not isinstance(item, Mapping):
            return False
        return all(_compare(item.get(k), v) for k, v in cond.items())
    if isinstance(cond, list | tuple):
        return (
            isinstance(item, list | tuple)
            and len(item) == len(cond)
            and all(_compare(i, c) for i, c in zip(item, cond, strict=True))
        )
    return bool(item == cond)


def _apply(item: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(item == operand)
    if op == "$ne":
        return bool(item != operand)
    if op == "$in":
        return item in operand
    try:
        a, b = float(item), float(operand)
    except (TypeError, ValueError):
        return False
    if math.isnan(a) or math.isnan(b):
        return False
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def recency_weighted(score: float, updated_at: datetime, now: datetime, weight: float,
                     half_life_days: float) -> float:  # fmt: skip
    """Blend similarity with recency: ``score * ((1 - w) + w * 0.5 ** (age / half_life))``."""
    if weight <= 0:
        return score
    age_days = max(0.0, (now - updated_at).total_seconds() / 86400.0)
    return score * ((1.0 - weight) + weight * 0.5 ** (age_days / half_life_days))


def vector_search_pipeline(
    tenant_id: str, prefix: Sequence[str], query_vector: Sequence[float], limit: int,
    kinds: Sequence[str] | None = None,
) -> list[Doc]:  # fmt: skip
    """The pipeline on ``memory_vectors``: ``$vectorSearch`` pre-filtered on tenant,
    namespace prefix (and kinds), returning ``{memory_id, path, score}`` best first.

    Several vectors may belong to one memory: :func:`best_per_memory` keeps each memory's
    best score.
    """
    filt: Doc = {"tenant_id": tenant_id}
    if prefix:
        filt["ns_prefixes"] = ns_path(prefix)
    if kinds:
        filt["kind"] = {"$in": list(kinds)}
    limit = min(limit, MAX_CANDIDATES)
    return [
        {"$vectorSearch": {
            "index": VECTOR_INDEX, "path": "embedding", "queryVector": list(query_vector),
            "numCandidates": min(MAX_CANDIDATES, max(100, limit * 10)), "limit": limit,
            "filter": filt,
        }},
        {"$project": {"_id": 0, "memory_id": 1, "path": 1,
                      "score": {"$meta": "vectorSearchScore"}}},
    ]  # fmt: skip


def best_per_memory(hits: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``memory_id -> best score`` from vector hits, in the order of each memory's best hit."""
    best: dict[str, float] = {}
    for h in hits:
        mid, score = h["memory_id"], float(h["score"])
        if mid not in best or score > best[mid]:
            best[mid] = score
    return dict(sorted(best.items(), key=lambda kv: -kv[1]))


def joint_pattern(patterns: Sequence[Sequence[str]]) -> tuple[str, ...] | None:
    """The one prefix pattern (``*``: any one label) that a namespace matches exactly when
    it matches every one of ``patterns`` (the longest length; at each position the literal
    label any of them names), or None when no namespace can (two different literal labels
    at one position). For suffixes, pass the patterns reversed and reverse the result."""
    joint: list[str] = []
    for pattern in patterns:
        for i, label in enumerate(pattern):
            if i == len(joint):
                joint.append(label)
            elif joint[i] == "*":
                joint[i] = label
            elif label not in ("*", joint[i]):
                return None
    return tuple(joint)


def namespace_matches(ns: Sequence[str], prefix: Sequence[str] | None,
                      suffix: Sequence[str] | None) -> bool:  # fmt: skip
    for path, reverse in ((prefix, False), (suffix, True)):
        if not path:
            continue
        if len(ns) < len(path):
            return False
        pairs = (
            zip(reversed(ns), reversed(path), strict=False)
            if reverse
            else zip(ns, path, strict=False)
        )
        if any(p != "*" and n != p for n, p in pairs):
            return False
    return True
