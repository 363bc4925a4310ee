"""Documents <-> LangGraph objects (pure functions, no I/O).

Shapes (all documents carry ``tenant_id``; see docs/checkpointer.md):

checkpoints   one per checkpoint: ids, parent id, ``checkpoint`` (serialized, without
              channel values), ``metadata`` (serialized, exact) and ``meta`` (its plain,
              filterable part), ``blobs`` (keys of the channel values it points to).
checkpoint_blobs
              one per channel value at one version (more when chunked). A message
              channel's value is stored as ``refs`` to short_term_memory documents.
checkpoint_writes
              one per pending write (more when chunked).
short_term_memory
              one per message revision, shared by every checkpoint that contains it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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

from accord.checkpointers import schema
from accord.checkpointers.ops import Op, insert_once
from accord.checkpointers.serde import (
    CorruptStateError,
    RevisionCache,
    is_message_list,
    join_payload,
    message_revision,
    message_summary,
    split_payload,
)
from accord.checkpointers.validation import bson_safe

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
    def head_id(self) -> str:
        return schema.head_id(self.tenant_id, self.thread_id, self.checkpoint_ns)


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


class PutDocs:
    """Documents of one ``put``, grouped by collection."""

    def __init__(self) -> None:
        self.checkpoint: Op | None = None
        self.blobs: list[Op] = []
        self.messages: list[Op] = []
        self.outbox: Op | None = None
        self.message_keys: list[str] = []  # new messages, for the outbox event
        self.message_refs: dict[str, RefState] = {}  # channel -> refs at this checkpoint


#: A message channel's blob is a *segment* of a chain: the message keys appended since
#: the channel's previous version, with a pointer (``prev``) to that version's blob. Every
#: PAGE-th segment is a *page* instead: the keys appended since the previous page, pointing
#: to it. The chain starts with a full *snapshot* (``seq`` 0). A new snapshot (a new chain)
#: is written when there is no previous state, when the change is not an append (an edit or
#: a removal), or when the chain holds more than max(CHAIN_MIN, snapshot length) segments or
#: appended keys. So a step stores O(new messages) (plus a page every PAGE steps and a
#: snapshot of n keys after at least ~n/2 steps or appended keys: O(1) amortized), and a
#: reader at ``seq`` s needs the snapshot, the pages and the segments of its own page
#: window (at most PAGE - 1): ``slot`` (``<chain>/p`` for the snapshot and the pages,
#: ``<chain>/<seq // PAGE>`` for a segment) in those two values and ``seq <= s``, one
#: indexed lookup.
CHAIN_MIN = 64
PAGE = 32


def pages_slot(chain: str) -> str:
    return f"{chain}/p"


def window_slot(chain: str, seq: int) -> str:
    return f"{chain}/{seq // PAGE}"


@dataclass(frozen=True)
class RefState:
    """A message channel at one checkpoint: its ordered message keys, the key of its
    blob, and its place in a chain: ``chain`` (key of the chain's snapshot; None for a
    state read from the earlier layout, so the next change starts a chain), ``seq``,
    ``base_len`` (keys in the snapshot), and the last page (or the snapshot) at or before
    it: ``page_key``, ``page_len`` (keys up to it)."""

    refs: tuple[str, ...]
    key: str
    chain: str | None
    seq: int
    base_len: int
    page_key: str
    page_len: int

    def extended_by(self, refs: Sequence[str]) -> bool:
        """Whether ``refs`` can be stored as the next segment of this state's chain."""
        limit = max(CHAIN_MIN, self.base_len)
        n = len(self.refs)
        return (
            self.chain is not None
            and self.seq + 1 <= limit
            and len(refs) - self.base_len <= limit
            and tuple(refs[:n]) == self.refs
        )


def _segment(state: RefState | None, key: str, refs: list[str]) -> tuple[dict[str, Any], RefState]:
    """(chain fields of the blob of ``refs`` at ``key``, the channel's new state)."""
    if state is None or not state.extended_by(refs):
        full = RefState(tuple(refs), key, key, 0, len(refs), key, len(refs))
        return {"chain": key, "seq": 0, "slot": pages_slot(key), "page": True, "refs": refs}, full
    assert state.chain is not None
    seq = state.seq + 1
    if seq % PAGE == 0:
        fields = {
            "chain": state.chain,
            "seq": seq,
            "slot": pages_slot(state.chain),
            "page": True,
            "prev": state.page_key,
            "refs": refs[state.page_len :],
        }
        return fields, RefState(tuple(refs), key, state.chain, seq, state.base_len, key, len(refs))
    fields = {
        "chain": state.chain,
        "seq": seq,
        "slot": window_slot(state.chain, seq),
        "prev": state.key,
        "refs": refs[len(state.refs) :],
    }
    new = RefState(
        tuple(refs), key, state.chain, seq, state.base_len, state.page_key, state.page_len
    )
    return fields, new


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
    known_messages: Mapping[str, RefState],
    revisions: RevisionCache | None = None,
) -> PutDocs:
    """Build the documents of one ``put``.

    Only channels in ``new_versions`` get blobs. ``known_messages`` maps a message
    channel to its state at the parent checkpoint (whose messages are stored), so only
    new message revisions are sent and the refs can be stored as a delta.
    """
    ts = now()
    out = PutDocs()
    values = checkpoint["channel_values"]
    for channel, version in new_versions.items():
        if channel not in values:
            continue  # e.g. a DeltaChannel step: nothing stored at this version
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
            prev = known_messages.get(channel)
            refs, docs = _message_docs(
                scope,
                checkpoint["id"],
                value,
                serde,
                chunk_size,
                ts,
                set(prev.refs) if prev else None,
                revisions,
            )
            out.messages.extend(insert_once(d) for d in docs)
            out.message_keys.extend(d["key"] for d in docs if d["chunk"] == 0)
            doc = {
                **base,
                "_id": _blob_id(scope, key, 0),
                "chunk": 0,
                "chunks": 1,
                "type": schema.MSGREFS_TYPE,
            }
            fields, state = _segment(prev, key, refs)
            doc.update(fields)
            out.message_refs[channel] = state
            out.blobs.append(insert_once(doc))
            continue
        type_, data = serde.dumps_typed(value)
        for frag in split_payload(type_, data, chunk_size):
            out.blobs.append(
                insert_once({**base, **frag, "_id": _blob_id(scope, key, frag["chunk"])})
            )

    body = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    ctype, cdata = serde.dumps_typed(body)
    mtype, mdata = serde.dumps_typed(dict(metadata))
    run_id = metadata.get("run_id")
    doc = {
        "_id": schema.checkpoint_doc_id(
            scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint["id"]
        ),
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
        "blobs": sorted({schema.blob_key(c, v) for c, v in checkpoint["channel_versions"].items()}),
        "chains": sorted(
            [st.chain, st.seq]
            for ch, st in {**known_messages, **out.message_refs}.items()
            if ch in checkpoint["channel_versions"] and st.chain is not None and st.seq > 0
        ),
        "created_at": ts,
    }
    out.checkpoint = Op("replace", {"_id": doc["_id"]}, doc, upsert=True)
    out.outbox = insert_once(
        outbox_doc(scope, checkpoint["id"], "checkpoint", ts, messages=out.message_keys or None)
    )
    return out


def _blob_id(scope: Scope, key: str, chunk: int) -> str:
    return schema.blob_doc_id(scope.tenant_id, scope.thread_id, scope.checkpoint_ns, key, chunk)


def message_key(message_id: str, revision: str) -> str:
    # The revision hashes the whole serialized message, id included: it is the key.
    return revision


def _message_docs(
    scope: Scope,
    checkpoint_id: str,
    messages: list[BaseMessage],
    serde: SerializerProtocol,
    chunk_size: int,
    ts: datetime,
    known: set[str] | None,
    revisions: RevisionCache | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    refs: list[str] = []
    docs: list[dict[str, Any]] = []
    seen: set[str] = set(known or ())
    for message in messages:
        assert message.id is not None
        rev = revisions.revision(message) if revisions is not None else message_revision(message)
        key = message_key(message.id, rev)
        refs.append(key)
        if key in seen:
            continue
        seen.add(key)
        type_, data = serde.dumps_typed(message)
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
                    revision=rev,
                    checkpoint_ns=scope.checkpoint_ns,
                    checkpoint_id=checkpoint_id,
                    **message_summary(message, serde),
                )
            docs.append(doc)
    return refs, docs


def outbox_doc(
    scope: Scope,
    checkpoint_id: str,
    kind: str,
    ts: datetime,
    *,
    task_id: str | None = None,
    messages: list[str] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": schema.doc_id(
            "o", kind, scope.tenant_id, scope.thread_id, scope.checkpoint_ns, checkpoint_id, task_id
        ),
        **scope.ns_filter,
        "checkpoint_id": checkpoint_id,
        "kind": kind,
        "status": "pending",
        "created_at": ts,
    }
    if task_id is not None:
        doc["task_id"] = task_id
    if messages:
        doc["messages"] = messages
    return doc


# --- put_writes ----------------------------------------------------------------------


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
) -> tuple[list[Op], list[Op], bool]:
    """Documents of one ``put_writes``: (regular ops, business marks, overwrite).

    Regular writes are insert-once (a repeated ``put_writes`` changes nothing); writes
    that are all special channels (error, interrupt, resume, scheduled) overwrite, as in
    every LangGraph saver. Each staged business write leaves a small *mark* (a pending
    write on :data:`BUSINESS_CHANNEL`): if a mark exists already, the task's business
    writes were applied before. A failed task's staged writes are dropped, marks included.
    """
    ts = now()
    overwrite = all(w[0] in WRITES_IDX_MAP for w in writes)
    ops: list[Op] = []
    marks: list[Op] = []
    for i, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, i)
        is_mark = channel == BUSINESS_CHANNEL
        if is_mark:
            if failed:
                continue
            value = {"op": value.get("op"), "collection": value.get("collection")}
        type_, data = serde.dumps_typed(value)
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
            key = {
                **scope.ns_filter,
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "idx": idx,
            }
            ops.append(Op("delete_many", key))
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
                marks.append(insert_once(doc))
            else:
                ops.append(Op("insert", doc=doc) if overwrite else insert_once(doc))
    return ops, marks, overwrite


# --- reading -------------------------------------------------------------------------


def group_fragments(
    docs: Iterable[Mapping[str, Any]], *key_fields: str
) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for d in docs:
        k = d[key_fields[0]] if len(key_fields) == 1 else tuple(d[f] for f in key_fields)
        out[k].append(d)
    return out


def _walk(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[Mapping[str, Any]] | str:
    """The blobs of a message channel's chain, from ``doc`` down to its snapshot (following
    ``prev``; documents of an abandoned branch of the chain are never on that path), or
    the key of the first one missing from ``blobs``."""
    thread_id, ns = doc["thread_id"], doc["checkpoint_ns"]
    path = [doc]
    current = doc
    while True:
        if "chain" in current:
            link = current.get("prev") if current.get("seq") else None
        else:  # earlier layout: a snapshot, or a delta on a base snapshot
            link = current.get("base")
        if link is None:
            return path
        nxt = blobs.get((thread_id, ns, link))
        if not nxt:
            return str(link)
        current = nxt[0]
        path.append(current)


def _refs_of(path: list[Mapping[str, Any]]) -> list[str]:
    top = path[0]
    if "chain" not in top and "base" in top:  # earlier layout: a prefix of the base
        return list(path[1].get("refs") or ())[: top["base_len"]] + list(top.get("refs") or ())
    return [r for d in reversed(path) for r in d.get("refs") or ()]


def _checked_walk(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[Mapping[str, Any]]:
    path = _walk(doc, blobs)
    if isinstance(path, str):
        raise CorruptStateError(f"message refs {doc['key']}: blob {path} of its chain is missing")
    return path


def full_refs(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> list[str]:
    """The ordered message keys of a message-channel blob (following its chain)."""
    return _refs_of(_checked_walk(doc, blobs))


def ref_state(
    doc: Mapping[str, Any], blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]
) -> RefState:
    """The :class:`RefState` of a message-channel blob (to seed the saver's cache)."""
    path = _checked_walk(doc, blobs)
    refs = tuple(_refs_of(path))
    if "chain" not in doc:
        return RefState(refs, doc["key"], None, 0, len(refs), doc["key"], len(refs))
    # the last page (or the snapshot) on the path, and the keys up to it
    after = 0
    page = path[-1]
    for d in path:
        if d.get("page") or not d.get("seq"):
            page = d
            break
        after += len(d.get("refs") or ())
    return RefState(
        refs,
        doc["key"],
        doc["chain"],
        int(doc.get("seq") or 0),
        len(path[-1].get("refs") or ()),
        page["key"],
        len(refs) - after,
    )


def missing_links(
    blob_docs: Iterable[Mapping[str, Any]], roots: Iterable[tuple[str, str, str]]
) -> dict[tuple[str, str], tuple[set[str], dict[str, set[int]]]]:
    """What the message-ref blobs ``roots`` ((thread, ns, key) of the channel versions
    being read) still need beyond ``blob_docs``, per (thread, ns): (keys of base snapshots
    of the earlier layout, chain -> ``seq``s of its readers)."""
    blobs = group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
    out: dict[tuple[str, str], tuple[set[str], dict[str, set[int]]]] = {}
    for root in roots:
        frags = blobs.get(root)
        if not frags or frags[0].get("type") != schema.MSGREFS_TYPE:
            continue
        d = frags[0]
        missing = _walk(d, blobs)
        if not isinstance(missing, str):
            continue
        keys, chains = out.setdefault((d["thread_id"], d["checkpoint_ns"]), (set(), {}))
        if "chain" in d:
            chains.setdefault(d["chain"], set()).add(int(d["seq"]))
        else:
            keys.add(missing)
    return out


def message_keys(
    blob_docs: Iterable[Mapping[str, Any]], roots: Iterable[tuple[str, str, str]]
) -> dict[str, set[str]]:
    """Message keys (per thread) of the message-ref blobs ``roots``, along their chains."""
    blobs = group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
    out: dict[str, set[str]] = {}
    for root in roots:
        frags = blobs.get(root)
        if not frags or frags[0].get("type") != schema.MSGREFS_TYPE:
            continue
        path = _walk(frags[0], blobs)
        if isinstance(path, str):
            continue  # reported when the tuple is built
        keys = out.setdefault(root[0], set())
        for d in path:
            keys.update(d.get("refs") or ())
    return out


def chain_clause(chains: Mapping[str, Iterable[int]]) -> dict[str, Any] | None:
    """Filter (within one thread and namespace) of the chain documents that readers at
    the given ``seq``s of the given chains need: one indexed lookup (documents beyond what
    one reader needs are harmless: the walk from its own blob ignores them)."""
    slots: set[str] = set()
    top = 0
    for chain, seqs in chains.items():
        wanted = [s for s in seqs if s > 0]
        if wanted:
            slots.add(pages_slot(chain))
            slots.update(window_slot(chain, s) for s in wanted)
            top = max(top, *wanted)
    if not slots:
        return None
    return {"slot": {"$in": sorted(slots)}, "seq": {"$lte": top}}


def chain_closure(referenced: set[str], links: Mapping[str, str | None]) -> set[str]:
    """``referenced`` plus every blob key their message-ref chains point to (``links``:
    key -> ``prev``/``base`` of each message-ref blob)."""
    out = set(referenced)
    stack = [k for k in referenced if links.get(k)]
    while stack:
        nxt = links.get(stack.pop())
        if nxt and nxt not in out:
            out.add(nxt)
            stack.append(nxt)
    return out


def load_checkpoint_body(doc: Mapping[str, Any], serde: SerializerProtocol) -> dict[str, Any]:
    c = doc["checkpoint"]
    return dict(serde.loads_typed((c["type"], bytes(c["data"]))))


def build_tuple(
    doc: Mapping[str, Any],
    *,
    blobs: Mapping[tuple[Any, ...], list[Mapping[str, Any]]],
    writes: list[Mapping[str, Any]],
    messages: Mapping[str, list[Mapping[str, Any]]],
    serde: SerializerProtocol,
    config_extra: Mapping[str, Any],
    body: dict[str, Any] | None = None,
) -> CheckpointTuple:
    """Reassemble a CheckpointTuple.

    ``blobs`` is keyed by (thread_id, checkpoint_ns, key); ``writes`` are this
    checkpoint's write fragments; ``messages`` is keyed by message key.
    """
    body = body if body is not None else load_checkpoint_body(doc, serde)
    thread_id, ns = doc["thread_id"], doc["checkpoint_ns"]
    values: dict[str, Any] = {}
    loaded_messages: dict[str, Any] = {}
    for channel, version in body.get("channel_versions", {}).items():
        key = schema.blob_key(channel, version)
        frags = blobs.get((thread_id, ns, key))
        if not frags:
            continue
        if frags[0].get("type") == schema.MSGREFS_TYPE:
            out: list[Any] = []
            for ref in full_refs(frags[0], blobs):
                if ref not in loaded_messages:
                    loaded_messages[ref] = serde.loads_typed(
                        join_payload(messages.get(ref, ()), f"message {ref}")
                    )
                out.append(loaded_messages[ref])
            values[channel] = out
            continue
        type_, data = join_payload(frags, f"channel {channel!r} at version {version!r}")
        if type_ == "empty":
            continue
        values[channel] = serde.loads_typed((type_, data))
    checkpoint: Checkpoint = {**body, "channel_values": values}  # type: ignore[typeddict-item]
    m = doc["metadata"]
    metadata: CheckpointMetadata = serde.loads_typed((m["type"], bytes(m["data"])))
    base_conf = {"thread_id": thread_id, "checkpoint_ns": ns}
    config: RunnableConfig = {
        "configurable": {**base_conf, "checkpoint_id": doc["checkpoint_id"], **config_extra}
    }
    parent_id = doc.get("parent_checkpoint_id")
    parent_config: RunnableConfig | None = (
        {"configurable": {**base_conf, "checkpoint_id": parent_id, **_tenant_only(config_extra)}}
        if parent_id
        else None
    )
    return CheckpointTuple(config, checkpoint, metadata, parent_config, load_writes(writes, serde))


def _tenant_only(extra: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in extra.items() if k == "tenant_id"}


def load_writes(docs: Iterable[Mapping[str, Any]], serde: SerializerProtocol) -> list[PendingWrite]:
    """Pending writes in ``writes_sort_key`` order: (task_path, task_id, idx)."""
    grouped = group_fragments(docs, "task_id", "idx")
    rows = []
    for (task_id, idx), frags in grouped.items():
        first = frags[0]
        value = serde.loads_typed(join_payload(frags, f"write {task_id}/{idx}"))
        rows.append(
            ((first.get("task_path", ""), task_id, idx), (task_id, first["channel"], value))
        )
    rows.sort(key=lambda r: r[0])
    return [r[1] for r in rows]
