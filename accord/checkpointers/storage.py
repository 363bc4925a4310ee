"""Documents <-> LangGraph objects (pure functions, no I/O).

Shapes (all documents carry ``tenant_id``; see docs/checkpointer.md):

checkpoints   one per checkpoint: ids, parent id, ``checkpoint`` (serialized, without
              channel values), ``metadata`` (serialized, exact) and ``meta`` (its plain,
              filterable part), ``blobs`` (keys of the channel values it points to),
              ``chains`` (the message-ref chains it ends).
checkpoint_blobs
              one per channel value at one version (more when chunked). A message
              channel's value is stored as ``refs`` to short_term_memory documents
              (:mod:`accord.checkpointers.chains`).
checkpoint_writes
              one per pending write (more when chunked).
short_term_memory
              one per message revision, shared by every checkpoint that contains it.

Everything a ``put`` or ``put_writes`` stores is serialized when the call arrives
(:func:`build_put`, :func:`build_writes`): LangGraph hands the saver live objects (a
fan-in barrier's set of seen nodes, for one) that it keeps changing while an "async"
save is still in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from accord.checkpointers import cache, chains, events, schema
from accord.checkpointers.chains import RefState, group_fragments
from accord.checkpointers.serde import (
    RevisionCache,
    is_message_list,
    join_payload,
    message_revision,
    message_summary,
    split_payload,
)
from accord.checkpointers.validation import bson_safe
from accord.platform import runs
from accord.platform.plan import Op, insert_once

#: Pending-write channel that carries staged business writes (see business.py).
BUSINESS_CHANNEL = "__accord_business__"


class Scope:
    """(tenant, thread, namespace) of one call, with the filters derived from it."""

    __slots__ = ("tenant_id", "thread_id", "checkpoint_ns")

    def __init__(self, tenant_id: str, thread_id: str, checkpoint_ns: str) -> None:
        self.tenant_id = tenant_id
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns

    @property
    def thread_filter(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "thread_id": self.thread_id}

    @property
    def ns_filter(self) -> dict[str, Any]:
        return {**self.thread_filter, "checkpoint_ns": self.checkpoint_ns}

    @property
    def run_doc_id(self) -> str:
        """``_id`` of the thread's run-registry document."""
        return runs.run_doc_id(self.tenant_id, self.thread_id)

    def checkpoint_doc_id(self, checkpoint_id: str) -> str:
        return schema.checkpoint_doc_id(
            self.tenant_id, self.thread_id, self.checkpoint_ns, checkpoint_id
        )


def now() -> datetime:
    return datetime.now(UTC)


# --- put ---------------------------------------------------------------------------


def plain_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The filterable part of checkpoint metadata (values BSON can store as-is)."""
    return {
        k: v
        for k, v in metadata.items()
        if isinstance(k, str)
        and k
        and not k.startswith("$")
        and "." not in k
        and "\x00" not in k
        and bson_safe(v)
    }


@dataclass
class PutDocs:
    """What one ``put`` stores, serialized on arrival, and what the cache keeps of it."""

    checkpoint: Op
    blobs: list[Op] = field(default_factory=list)
    messages: list[Op] = field(default_factory=list)
    #: keys of the new short-term-memory documents (for the outbox event)
    message_keys: list[str] = field(default_factory=list)
    #: the run's plain config values, for the outbox event of a step that added messages
    #: (consumers fill namespace templates from them: accord.checkpointers.events)
    configurable: dict[str, str] = field(default_factory=dict)
    #: the checkpoint as the cache keeps it
    entry: cache.Entry | None = None


def build_put(
    scope: Scope,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: Mapping[str, Any],
    parent_id: str | None,
    *,
    serde: SerializerProtocol,
    chunk_size: int,
    message_channels: frozenset[str],
    parent: cache.Entry | None,
    revisions: RevisionCache | None = None,
    keep: bool = True,
    share: bool = False,
) -> PutDocs:
    """Build the documents of one ``put``.

    Only channels in ``new_versions`` get blobs. ``parent`` (the cached parent
    checkpoint, when the saver knows it is stored) lets a message channel store only
    its new message revisions, its refs as the next segment of its chain, and lets the
    cache entry reuse the parent's values of unchanged channels. ``keep``: build the
    cache entry too; ``share``: with the message objects of the put (a run's own put:
    the cache hands them back to the run's loop, see ``cache.build_tuple``).
    """
    ts = now()
    values = checkpoint["channel_values"]
    versions = checkpoint["channel_versions"]
    known = parent.refs() if parent is not None else {}
    kept: dict[str, cache.Value] = {}
    blobs: list[Op] = []
    message_ops: list[Op] = []
    message_keys: list[str] = []
    new_refs: dict[str, RefState] = {}
    for channel, version in new_versions.items():
        if channel not in values:
            kept[channel] = cache.Value(str(version))  # e.g. a DeltaChannel step
            continue
        value = values[channel]
        key = schema.blob_key(channel, version)
        base = {
            **scope.ns_filter,
            "key": key,
            "channel": channel,
            "version": str(version),
            "created_at": ts,
        }
        if channel in message_channels and is_message_list(value):
            prev = known.get(channel)
            old = parent.values.get(channel) if parent is not None else None
            have = old.message_bytes() if old is not None and prev is not None else {}
            refs, docs, typed = _message_docs(
                scope,
                checkpoint["id"],
                value,
                serde,
                chunk_size,
                ts,
                set(prev.refs) if prev else None,
                revisions,
                have,
            )
            message_ops.extend(insert_once(d) for d in docs)
            message_keys.extend(d["key"] for d in docs if d["chunk"] == 0)
            doc = {
                **base,
                "_id": _blob_id(scope, key, 0),
                "chunk": 0,
                "chunks": 1,
                "type": schema.MSGREFS_TYPE,
            }
            fields, state = chains.segment(prev, key, refs)
            doc.update(fields)
            new_refs[channel] = state
            blobs.append(insert_once(doc))
            kept[channel] = cache.Value(
                str(version),
                messages=tuple((k, typed[k]) for k in refs),
                refs=state,
                objects=tuple(value) if share else None,
            )
            continue
        type_, data = serde.dumps_typed(value)
        for frag in split_payload(type_, data, chunk_size):
            blobs.append(insert_once({**base, **frag, "_id": _blob_id(scope, key, frag["chunk"])}))
        kept[channel] = cache.Value(str(version), typed=(type_, data))

    if keep:
        for channel, version in versions.items():
            if channel in kept:
                continue
            old = parent.values.get(channel) if parent is not None else None
            if old is not None and old.version == str(version):
                kept[channel] = old
            elif channel not in values:
                kept[channel] = cache.Value(str(version))
            elif channel in message_channels and is_message_list(values[channel]):
                # unchanged, and the cache did not know it: serialize it for the entry
                pairs = [
                    (
                        revisions.revision(m) if revisions is not None else message_revision(m),
                        serde.dumps_typed(m),
                    )
                    for m in values[channel]
                ]
                kept[channel] = cache.Value(
                    str(version),
                    messages=tuple(pairs),
                    objects=tuple(values[channel]) if share else None,
                )
            else:
                # the value of an unchanged channel the cache did not know: serialize it
                # now (it is not stored again), so the entry can be served
                kept[channel] = cache.Value(str(version), typed=serde.dumps_typed(values[channel]))

    body = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    ctype, cdata = serde.dumps_typed(body)
    mtype, mdata = serde.dumps_typed(dict(metadata))
    run_id = metadata.get("run_id")
    doc = {
        "_id": scope.checkpoint_doc_id(checkpoint["id"]),
        **scope.ns_filter,
        "checkpoint_id": checkpoint["id"],
        "parent_checkpoint_id": parent_id,
        "run_id": run_id if isinstance(run_id, str) else None,
        "source": metadata.get("source"),
        "step": metadata.get("step"),
        "ts": checkpoint.get("ts"),
        "checkpoint": {"type": ctype, "data": cdata},
        "metadata": {"type": mtype, "data": mdata},
        "meta": plain_metadata(metadata),
        # the blobs this checkpoint reads (for garbage collection), and the message-ref
        # chains they end (so the reader can fetch the chains right away; unchanged
        # channels' chains when the saver knows them)
        "blobs": sorted({schema.blob_key(c, v) for c, v in versions.items()}),
        "chains": sorted(
            [st.chain, st.seq]
            for ch, st in {**known, **new_refs}.items()
            if ch in versions and st.chain is not None and st.seq > 0
        ),
        "created_at": ts,
    }
    entry = (
        cache.Entry(checkpoint["id"], parent_id, (ctype, cdata), (mtype, mdata), kept)
        if keep
        else None
    )
    return PutDocs(
        checkpoint=Op("replace", {"_id": doc["_id"]}, doc, upsert=True),
        blobs=blobs,
        messages=message_ops,
        message_keys=message_keys,
        configurable=events.configurable_of(metadata) if message_keys else {},
        entry=entry,
    )


def _blob_id(scope: Scope, key: str, chunk: int) -> str:
    return schema.blob_doc_id(scope.tenant_id, scope.thread_id, scope.checkpoint_ns, key, chunk)


def _message_docs(
    scope: Scope,
    checkpoint_id: str,
    messages: list[BaseMessage],
    serde: SerializerProtocol,
    chunk_size: int,
    ts: datetime,
    known: set[str] | None,
    revisions: RevisionCache | None = None,
    have: Mapping[str, tuple[str, bytes]] | None = None,
) -> tuple[list[str], list[dict[str, Any]], dict[str, tuple[str, bytes]]]:
    """(refs, documents of the messages not in ``known``, serialized message per key;
    ``have``: serialized messages already known)."""
    refs: list[str] = []
    docs: list[dict[str, Any]] = []
    typed: dict[str, tuple[str, bytes]] = {}
    seen: set[str] = set(known or ())
    for message in messages:
        assert message.id is not None
        # The revision hashes the whole serialized message, id included: it is the key.
        key = revisions.revision(message) if revisions is not None else message_revision(message)
        refs.append(key)
        if key in typed:
            continue
        if key in seen and have is not None and key in have:
            typed[key] = have[key]
            continue
        typed[key] = serde.dumps_typed(message)
        if key in seen:
            continue
        seen.add(key)
        type_, data = typed[key]
        for frag in split_payload(type_, data, chunk_size):
            doc: dict[str, Any] = {
                "_id": schema.message_doc_id(scope.tenant_id, scope.thread_id, key, frag["chunk"]),
                **scope.thread_filter,
                "key": key,
                **frag,
                "created_at": ts,
            }
            if frag["chunk"] == 0:
                doc.update(
                    message_id=message.id,
                    revision=key,
                    checkpoint_ns=scope.checkpoint_ns,
                    checkpoint_id=checkpoint_id,
                    **message_summary(message, serde),
                )
            docs.append(doc)
    return refs, docs, typed


# --- put_writes ----------------------------------------------------------------------


@dataclass
class WriteDocs:
    """What one ``put_writes`` stores, serialized on arrival."""

    ops: list[Op]
    marks: list[Op]
    #: special channels only (error, interrupt, resume, scheduled): they replace the
    #: task's previous writes at the same indexes, as in every LangGraph saver
    overwrite: bool
    #: the writes as the cache keeps them (business marks excluded)
    kept: list[cache.Write]


def build_writes(
    scope: Scope,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    *,
    serde: SerializerProtocol,
    chunk_size: int,
    failed: bool,
) -> WriteDocs:
    """Documents of one ``put_writes``.

    Regular writes are insert-once (a repeated ``put_writes`` changes nothing); writes
    that are all special channels overwrite. Each staged business write leaves a small
    *mark* (a pending write on :data:`BUSINESS_CHANNEL`), inserted before the business
    writes: if a mark exists already, the task's business writes were applied before. A
    failed task's staged writes are dropped, marks included.
    """
    ts = now()
    overwrite = all(w[0] in WRITES_IDX_MAP for w in writes)
    ops: list[Op] = []
    marks: list[Op] = []
    kept: list[cache.Write] = []
    for i, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, i)
        is_mark = channel == BUSINESS_CHANNEL
        if is_mark:
            if failed:
                continue
            value = {"op": value.get("op"), "collection": value.get("collection")}
        type_, data = serde.dumps_typed(value)
        kept.append(cache.Write(task_id, task_path, idx, channel, (type_, data)))
        base = {
            **scope.ns_filter,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "task_path": task_path,
            "idx": idx,
            "channel": channel,
            "created_at": ts,
        }
        if overwrite:
            ops.append(
                Op(
                    "delete_many",
                    {
                        **scope.ns_filter,
                        "checkpoint_id": checkpoint_id,
                        "task_id": task_id,
                        "idx": idx,
                    },
                )
            )
        for frag in split_payload(type_, data, chunk_size):
            wid = schema.write_doc_id(
                scope.tenant_id,
                scope.thread_id,
                scope.checkpoint_ns,
                checkpoint_id,
                task_id,
                idx,
                frag["chunk"],
            )
            doc = {**base, **frag, "_id": wid}
            if is_mark:
                # a plain insert: if the mark exists the insert fails (DuplicateKey) and the
                # ordered bulk write stops before the business writes behind it
                marks.append(Op("insert", doc=doc))
            else:
                ops.append(Op("insert", doc=doc) if overwrite else insert_once(doc))
    return WriteDocs(ops, marks, overwrite, kept)


def mark_once(op: Op) -> Op:
    """A business mark as an insert-once (when re-recording a task without its business
    writes, which were applied when it was first recorded)."""
    assert isinstance(op.doc, Mapping)
    return insert_once(op.doc)


# --- reading -------------------------------------------------------------------------


def load_checkpoint_body(doc: Mapping[str, Any], serde: SerializerProtocol) -> dict[str, Any]:
    c = doc["checkpoint"]
    return dict(serde.loads_typed((c["type"], bytes(c["data"]))))


def assemble(
    doc: Mapping[str, Any],
    *,
    blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]],
    writes: list[Mapping[str, Any]],
    messages: Mapping[tuple[str, str], list[Mapping[str, Any]]],
    serde: SerializerProtocol,
    config_extra: Mapping[str, Any],
    body: dict[str, Any] | None = None,
    keep: bool = False,
    remember: Callable[[Any, str], None] | None = None,
) -> tuple[CheckpointTuple, cache.Entry | None]:
    """Reassemble a CheckpointTuple (and, with ``keep``, the cache entry of it).

    ``blobs`` is keyed by (thread_id, checkpoint_ns, key); ``writes`` are this
    checkpoint's write fragments; ``messages`` is keyed by (thread_id, message key):
    two threads may hold the same message. ``remember(message, key)`` is told the key of
    each message loaded.
    """
    body = body if body is not None else load_checkpoint_body(doc, serde)
    thread_id, ns = doc["thread_id"], doc["checkpoint_ns"]
    values: dict[str, Any] = {}
    kept: dict[str, cache.Value] = {}
    loaded_messages: dict[str, Any] = {}
    for channel, version in body.get("channel_versions", {}).items():
        key = schema.blob_key(channel, version)
        frags = blobs.get((thread_id, ns, key))
        if not frags:
            kept[channel] = cache.Value(str(version))
            continue
        if frags[0].get("type") == schema.MSGREFS_TYPE:
            out: list[Any] = []
            pairs: list[tuple[str, tuple[str, bytes]]] = []
            for ref in chains.full_refs(frags[0], blobs):
                if ref not in loaded_messages:
                    typed = join_payload(messages.get((thread_id, ref), ()), f"message {ref}")
                    loaded_messages[ref] = (typed, serde.loads_typed(typed))
                    if remember is not None:
                        remember(loaded_messages[ref][1], ref)
                pairs.append((ref, loaded_messages[ref][0]))
                out.append(loaded_messages[ref][1])
            values[channel] = out
            if keep:
                kept[channel] = cache.Value(
                    str(version), messages=tuple(pairs), refs=chains.ref_state(frags[0], blobs)
                )
            continue
        type_, data = join_payload(frags, f"channel {channel!r} at version {version!r}")
        kept[channel] = cache.Value(str(version), typed=(type_, data))
        if type_ == "empty":
            continue
        values[channel] = serde.loads_typed((type_, data))
    checkpoint: Checkpoint = {**body, "channel_values": values}  # type: ignore[typeddict-item]
    m = doc["metadata"]
    mtyped = (m["type"], bytes(m["data"]))
    metadata: CheckpointMetadata = serde.loads_typed(mtyped)
    base_conf = {"thread_id": thread_id, "checkpoint_ns": ns}
    config: RunnableConfig = {
        "configurable": {**base_conf, "checkpoint_id": doc["checkpoint_id"], **config_extra}
    }
    parent_id = doc.get("parent_checkpoint_id")
    parent_config: RunnableConfig | None = (
        {"configurable": {**base_conf, "checkpoint_id": parent_id, **config_extra}}
        if parent_id
        else None
    )
    pending, kept_writes = load_writes(writes, serde)
    tup = CheckpointTuple(config, checkpoint, metadata, parent_config, pending)
    if not keep:
        return tup, None
    c = doc["checkpoint"]
    entry = cache.Entry(
        doc["checkpoint_id"],
        parent_id,
        (c["type"], bytes(c["data"])),
        mtyped,
        kept,
        {(w.task_id, w.idx): w for w in kept_writes},
    )
    return tup, entry


def load_writes(
    docs: Iterable[Mapping[str, Any]], serde: SerializerProtocol
) -> tuple[list[PendingWrite], list[cache.Write]]:
    """Pending writes in ``writes_sort_key`` order: (task_path, task_id, idx), and the
    same writes as the cache keeps them."""
    grouped = group_fragments(docs, "task_id", "idx")
    rows = []
    for (task_id, idx), frags in grouped.items():
        first = frags[0]
        typed = join_payload(frags, f"write {task_id}/{idx}")
        rows.append(cache.Write(task_id, first.get("task_path", ""), idx, first["channel"], typed))
    rows.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
    return [(w.task_id, w.channel, serde.loads_typed(w.typed)) for w in rows], rows
