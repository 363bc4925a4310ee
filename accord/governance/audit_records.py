"""Audit records as data: what one record says, its stream, and its place in the chain.

One record per stream, action, class and collection of a transaction (with the same
principal and run), naming each of their ops (inserts, updates, replaces, deletes, a
claim's ``find_one_and_update``) in plan order, and one per refused group or read,
written in the SAME transaction as the mutation by
:class:`~accord.governance.audit_hook.AuditHook`. (One per op would say the same with
several times the documents: the saves of one ``invoke`` of the benchmarks' chat graph
write 17 ops in 13 groups of 5 plans, which are 6 records; each record costs its own
hash, its validation and two index entries.) Everything a record's fields say holds for
every op it names; the order of ops of different records of one transaction is not
kept, which says nothing false: the transaction applied them together. This module is
pure: it builds record bodies, names streams and hashes; the hook and the verifier use
it, so both agree on every byte.

**Streams.** Records are hash-chained per stream, so concurrent writers of different
threads never contend on one head: one stream per (tenant, thread) for the
thread-scoped classes (checkpoints, blobs, pending writes, messages, the run registry:
:attr:`~accord.platform.artifacts.ArtifactClass.thread_scoped`) written in a thread's
context, one per (tenant, collection) otherwise. A stream's name is the RFC 8785 JSON
array of its parts (``["acme","thread","t-1"]``, ``["acme","collection","orders"]``):
two different (tenant, thread) pairs never share a stream.

**Chain.** Record ``seq`` n of a stream carries ``prev``, the ``hash`` of record n-1
(:data:`GENESIS` for n = 1), and its own ``hash``: SHA-256 over the RFC 8785 encoding of
the record without ``_id`` (an ``ObjectId``), ``hash`` and the images (:data:`UNHASHED`;
:mod:`accord.governance.canonical` says how BSON values are encoded). The head of each
stream (``seq``, ``hash``) lives in the heads collection, read and advanced in the same
transaction. Images (``full`` mode: ``images``, one entry per op with its ``filter``,
``change`` and ``image``, each stored as its canonical JSON text) are outside the hashed
body and committed to by their hashes (SHA-256 of that text), which are inside it:
erasing an image later (a data subject's erasure) leaves the chain verifiable.

**Body.** ``v`` (format, 1), ``stream``, ``seq``, ``prev``, ``tenant_id``, ``at`` (UTC,
milliseconds), ``txn`` (the kernel's transaction id: the same for every record of one
transaction, whatever its attempts), ``outcome`` (``applied`` or ``refused``), ``principal``
(``name``, ``role``, ``kind``), ``action`` (the context's operation, e.g.
``checkpoint.put``), ``thread_id``, ``run`` (``run_id``, ``fence``) where the context has a
run, ``artifact`` (the class), ``db``, ``collection``, ``mode``, and ``ops``: per op its
``op`` (kind; a read's kind for a refused read), ``upsert`` (when true), ``doc_id`` (the
target's ``_id``, None for a many-document op) and the hashes there are:
``filter_hash`` (the op's filter), ``change_hash`` (an update's operator document or
pipeline; none for an insert-once upsert, whose image is its whole change),
``image_hash`` (the document after the op when the op itself says it: an insert, a
replacement, an insert-once upsert, a claim's returned document). A refused record adds
``reason``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pymongo import IndexModel

from accord.governance.canonical import canonical, digest
from accord.platform.artifacts import CLASSES
from accord.platform.context import Principal, ReadContext, WriteContext
from accord.platform.plan import Group, Op

__all__ = [
    "FORMAT", "GENESIS", "HEADS", "HEAD_INDEXES", "IMAGE_FIELDS", "Mode", "RECORDS",
    "RECORD_INDEXES", "UNHASHED", "VALIDATOR", "chain_hash", "group_body", "read_body",
    "record_run", "recorded_principal", "stream_of",
]  # fmt: skip

Mode = Literal["metadata", "full"]
Outcome = Literal["applied", "refused"]

#: Default collection names, prefixed like accord's other collections.
RECORDS = "accord_audit"
HEADS = "accord_audit_heads"
#: The record format written by this module.
FORMAT = 1
#: ``prev`` of a stream's first record.
GENESIS = "0" * 64
#: What an entry of a record's ``images`` may hold (``full`` mode), each covered by the
#: ``<name>_hash`` of the op entry at the same index.
IMAGE_FIELDS = ("filter", "change", "image")
#: Fields of a stored record that its hash does not cover: its id, the hash itself, and
#: the images (covered by their hashes).
UNHASHED = frozenset({"_id", "hash", "images"})
#: ``full`` mode keeps an image of at most this many bytes (canonical JSON), and at most
#: :data:`RECORD_IMAGE_BUDGET` bytes of images per record (a document holds 16 MiB); a
#: larger one is kept as its hash only, named in the entry's ``omitted``.
IMAGE_LIMIT = 1024 * 1024
RECORD_IMAGE_BUDGET = 8 * 1024 * 1024
#: A group of more ops is recorded in several records (of this many ops each at most).
OPS_PER_RECORD = 1000

_HEX64 = "^[0-9a-f]{64}$"
_STRING = {"bsonType": "string"}
#: The audit collection's ``$jsonSchema``: the shape :func:`op_body` writes.
VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": [
            "_id", "v", "stream", "seq", "prev", "hash", "tenant_id", "at", "txn", "outcome",
            "principal", "action", "artifact", "db", "collection", "ops", "mode",
        ],
        "properties": {
            "_id": {"bsonType": "objectId"},
            "v": {"bsonType": ["int", "long"], "minimum": 1},
            "stream": {"bsonType": "string", "minLength": 1},
            "seq": {"bsonType": ["int", "long"], "minimum": 1},
            "prev": {"bsonType": "string", "pattern": _HEX64},
            "hash": {"bsonType": "string", "pattern": _HEX64},
            "tenant_id": _STRING,
            "at": {"bsonType": "date"},
            "txn": _STRING,
            "outcome": {"enum": ["applied", "refused"]},
            "principal": {
                "bsonType": "object",
                "required": ["name", "role", "kind"],
                "properties": {"name": _STRING, "role": _STRING, "kind": _STRING},
            },
            "action": _STRING,
            "artifact": _STRING,
            "db": _STRING,
            "collection": _STRING,
            "mode": {"enum": ["metadata", "full"]},
            "ops": {
                "bsonType": "array",
                "minItems": 1,
                "items": {
                    "bsonType": "object",
                    "required": ["op"],
                    "properties": {
                        "op": _STRING,
                        "filter_hash": {"bsonType": "string", "pattern": _HEX64},
                        "change_hash": {"bsonType": "string", "pattern": _HEX64},
                        "image_hash": {"bsonType": "string", "pattern": _HEX64},
                    },
                },
            },
            "images": {"bsonType": "array"},
        },
    }
}  # fmt: skip
RECORD_INDEXES = [
    # Not unique: the heads keep (stream, seq) unique (a second record of one seq cannot
    # commit); a unique index would turn a stale cached head into a duplicate-key
    # failure instead of the retry the head's guard gives (audit_heads.py).
    IndexModel([("stream", 1), ("seq", 1)], name="stream_seq"),
    IndexModel([("tenant_id", 1), ("stream", 1), ("seq", 1)], name="tenant_stream_seq"),
]
HEAD_INDEXES = [IndexModel([("tenant_id", 1)], name="tenant")]


@functools.lru_cache(maxsize=8192)  # asked twice per group of every transaction
def stream_of(tenant_id: str, thread_id: str | None, artifact: str, collection: str) -> str:
    """The stream of a record (module docstring): the thread's for a thread-scoped class
    written in a thread's context, else the collection's, within the tenant."""
    cls = CLASSES.get(artifact)
    if thread_id is not None and cls is not None and cls.thread_scoped:
        parts = [tenant_id, "thread", thread_id]
    else:
        parts = [tenant_id, "collection", collection]
    return canonical(parts).decode()


def chain_hash(record: Mapping[str, Any]) -> str:
    """The hash of ``record`` (a stored record or a body with ``prev``): SHA-256 of the
    canonical encoding of every field but :data:`UNHASHED`."""
    body = {k: v for k, v in record.items() if k not in UNHASHED}
    return hashlib.sha256(canonical(body)).hexdigest()


def recorded_principal(principal: Principal | None) -> tuple[str, str, str]:
    """What a record says of ``principal``: (name, role, kind)."""
    if principal is None:
        return ("unknown", "unknown", "service")
    return (principal.name, principal.role, principal.kind)


def _principal(principal: Principal | None) -> dict[str, str]:
    name, role, kind = recorded_principal(principal)
    return {"name": name, "role": role, "kind": kind}


def record_run(context: WriteContext | ReadContext) -> tuple[str, int] | None:
    """The run a record of ``context`` names: (run id, fence), or None."""
    lease = context.run
    if lease is None and isinstance(context, WriteContext) and context.guard is not None:
        lease = context.guard.lease
    return None if lease is None else (lease.run_id, lease.fence)


def _run(context: WriteContext | ReadContext) -> dict[str, Any] | None:
    run = record_run(context)
    return None if run is None else {"run_id": run[0], "fence": run[1]}


def _target(op: Op, found: Any) -> Any:
    """The ``_id`` the op writes, when it names one document."""
    if op.kind == "insert" and isinstance(op.doc, Mapping):
        return op.doc.get("_id")
    if op.kind == "find_one_and_update":
        return found.get("_id") if isinstance(found, Mapping) else None
    if op.kind in ("update_many", "delete_many"):
        return None
    ident = (op.filter or {}).get("_id")
    return None if isinstance(ident, Mapping) else ident  # an operator: many documents


def _image(op: Op, found: Any) -> Any:
    """The document after the op, when the op itself says what it is (else None)."""
    if op.kind == "insert":
        return op.doc
    if op.kind == "replace" and isinstance(op.doc, Mapping):
        ident = (op.filter or {}).get("_id")
        return {**op.doc, "_id": ident} if ident is not None else op.doc
    if op.kind == "find_one_and_update":
        return found
    if _inserts_once(op) and isinstance(op.doc, Mapping):  # what it inserts (or finds unchanged)
        return {"_id": (op.filter or {}).get("_id"), **op.doc["$setOnInsert"]}
    return None


def _inserts_once(op: Op) -> bool:
    """An insert-once upsert (:func:`~accord.platform.plan.insert_once`): its image is its
    whole change."""
    return (
        op.kind == "update" and op.upsert and isinstance(op.doc, Mapping)
        and set(op.doc) == {"$setOnInsert"}
    )  # fmt: skip


def _base(
    context: WriteContext | ReadContext, outcome: Outcome, at: datetime, txn: str, mode: Mode
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": FORMAT, "tenant_id": context.tenant_id, "at": at, "txn": txn,
        "outcome": outcome, "principal": _principal(context.principal),
        "action": context.operation or "unnamed", "thread_id": context.thread_id,
        "mode": mode,
    }  # fmt: skip
    run = _run(context)
    if run is not None:
        body["run"] = run
    return body


def group_body(
    context: WriteContext,
    group: Group,
    ops: Sequence[tuple[Op, Any]],
    *,
    at: datetime,
    txn: str,
    mode: Mode,
    outcome: Outcome = "applied",
    reason: str | None = None,
) -> dict[str, Any]:
    """The record of one group's ``ops`` (each with what a claim returned, else None),
    without its chain fields; in ``full`` mode with their images."""
    body = _base(context, outcome, at, txn, mode)
    entries: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    budget = RECORD_IMAGE_BUDGET
    for op, found in ops:
        image = _image(op, found)
        filt = None if op.kind == "insert" else op.filter
        change = op.doc if op.kind not in ("insert", "replace") and not _inserts_once(op) else None
        entry: dict[str, Any] = {"op": op.kind, "doc_id": _target(op, found)}
        if op.upsert:
            entry["upsert"] = True
        kept: dict[str, Any] = {}
        for name, value in (("filter", filt), ("change", change), ("image", image)):
            kept[name] = None
            if value is None:
                continue
            encoded = canonical(value)
            entry[f"{name}_hash"] = hashlib.sha256(encoded).hexdigest()
            if mode != "full":
                continue
            if len(encoded) > IMAGE_LIMIT or len(encoded) > budget:
                kept.setdefault("omitted", []).append(name)  # its hash is all there is
            else:
                kept[name] = encoded.decode()
                budget -= len(encoded)
        entries.append(entry)
        images.append(kept)
    body.update(artifact=group.artifact, db=group.db, collection=group.collection, ops=entries)
    if reason is not None:
        body["reason"] = reason
    if mode == "full":
        body["images"] = images
    return body


def read_body(
    context: ReadContext,
    *,
    artifact: str,
    db: str,
    collection: str,
    kind: str,
    query: Any,
    at: datetime,
    txn: str,
    mode: Mode,
    reason: str,
) -> dict[str, Any]:
    """The record of a refused read (``query``: its filter or pipeline)."""
    body = _base(context, "refused", at, txn, mode)
    entry: dict[str, Any] = {"op": kind, "doc_id": None}
    if query is not None:
        entry["filter_hash"] = digest(query)
    body.update(artifact=artifact, db=db, collection=collection, ops=[entry], reason=reason)
    if mode == "full":
        body["images"] = [{"filter": _text(query), "change": None, "image": None}]
    return body


def _text(value: Any) -> str | None:
    """An image as stored in ``full`` mode: its canonical JSON text, whose SHA-256 is the
    image's hash (and which keeps operator keys such as ``$set`` out of field names)."""
    return None if value is None else canonical(value).decode()
