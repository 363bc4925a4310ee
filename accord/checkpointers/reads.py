"""Read plans: the queries behind ``get_tuple`` and ``list`` (pure; the savers run them).

A set of checkpoint documents is hydrated with a constant number of indexed queries,
however many checkpoints and however long their threads: the channel values by key, the
message-ref chains they end, the pending writes, the messages (and, only for data a
saver did not know at save time, one more query for missing chain links).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from accord.checkpointers import cache, chains, schema, storage, validation
from accord.checkpointers.chains import group_fragments
from accord.checkpointers.schema_migrations import MIGRATIONS


def _or(clauses: list[dict[str, Any]]) -> dict[str, Any]:
    return clauses[0] if len(clauses) == 1 else {"$or": clauses}


def merge_docs(docs: list[Any], more: Iterable[Any]) -> list[Any]:
    """``docs`` plus the documents of ``more`` it does not hold yet (by ``_id``)."""
    seen = {d["_id"] for d in docs}
    return docs + [d for d in more if d["_id"] not in seen]


def _blob_clauses(
    tenant_id: str,
    keys: Mapping[tuple[str, str], set[str]],
    chain_seqs: Mapping[tuple[str, str], Mapping[str, set[int]]],
) -> dict[str, Any] | None:
    """Filter of blobs by key, or of message-ref chain documents (never both in one
    clause: each is one indexed predicate), per (thread, ns)."""
    clauses = []
    for scope in sorted(set(keys) | set(chain_seqs)):
        thread_id, ns = scope
        inner: list[dict[str, Any]] = []
        if keys.get(scope):
            inner.append({"key": {"$in": sorted(keys[scope])}})
        if (chain := chains.chain_clause(chain_seqs.get(scope) or {})) is not None:
            inner.append(chain)
        if inner:
            clauses.append({"thread_id": thread_id, "checkpoint_ns": ns, **_or(inner)})
    return {"tenant_id": tenant_id, **_or(clauses)} if clauses else None


class ReadBatch:
    """Batched reads behind a set of checkpoint documents: a constant number of queries
    (blobs, writes, messages) however many checkpoints are hydrated."""

    def __init__(
        self, tenant_id: str, docs: list[Mapping[str, Any]], serde: SerializerProtocol
    ) -> None:
        self.tenant_id = tenant_id
        # documents of an older layout are upgraded as they are loaded (schema_migrations)
        self.docs = MIGRATIONS.upgrade_all("checkpoint", docs)
        self.bodies = [storage.load_checkpoint_body(d, serde) for d in self.docs]
        self.serde = serde

    def roots(self) -> set[tuple[str, str, str]]:
        """(thread, ns, key) of the channel values the checkpoints read."""
        return {
            (d["thread_id"], d["checkpoint_ns"], schema.blob_key(c, v))
            for d, body in zip(self.docs, self.bodies, strict=True)
            for c, v in body.get("channel_versions", {}).items()
        }

    def blobs_filter(self) -> dict[str, Any] | None:
        """Every channel value of the checkpoints, by key: one query."""
        keys: dict[tuple[str, str], set[str]] = {}
        for t, ns, key in self.roots():
            keys.setdefault((t, ns), set()).add(key)
        for d in self.docs:  # earlier layout: base snapshots of message-ref deltas
            keys.setdefault((d["thread_id"], d["checkpoint_ns"]), set()).update(
                d.get("blobs") or ()
            )
        return _blob_clauses(self.tenant_id, keys, {})

    def chains_filter(self) -> dict[str, Any] | None:
        """The message-ref chains the checkpoints end (known at save time): one query,
        none when every message channel is at a snapshot."""
        seqs: dict[tuple[str, str], dict[str, set[int]]] = {}
        for d in self.docs:
            cs = seqs.setdefault((d["thread_id"], d["checkpoint_ns"]), {})
            for chain, seq in d.get("chains") or ():
                cs.setdefault(chain, set()).add(int(seq))
        return _blob_clauses(self.tenant_id, {}, seqs)

    def writes_filter(self) -> dict[str, Any] | None:
        ids: dict[tuple[str, str], set[str]] = {}
        for d in self.docs:
            ids.setdefault((d["thread_id"], d["checkpoint_ns"]), set()).add(d["checkpoint_id"])
        clauses = [
            {
                "thread_id": t,
                "checkpoint_ns": ns,
                "checkpoint_id": next(iter(c)) if len(c) == 1 else {"$in": sorted(c)},
            }
            for (t, ns), c in ids.items()
        ]
        return {"tenant_id": self.tenant_id, **_or(clauses)} if clauses else None

    def bases_filter(self, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Message-ref chains (and base snapshots of the earlier layout) still missing:
        one more query, only when the saver did not know them at save time."""
        missing = chains.missing_links(blob_docs, self.roots())
        return _blob_clauses(
            self.tenant_id,
            {scope: ks for scope, (ks, _) in missing.items()},
            {scope: cs for scope, (_, cs) in missing.items()},
        )

    def messages_filter(self, blob_docs: list[Mapping[str, Any]]) -> dict[str, Any] | None:
        keys = chains.message_keys(blob_docs, self.roots())
        clauses = [{"thread_id": t, "key": {"$in": sorted(ks)}} for t, ks in keys.items() if ks]
        return {"tenant_id": self.tenant_id, **_or(clauses)} if clauses else None

    def assemble(
        self,
        blob_docs: list[Mapping[str, Any]],
        write_docs: list[Mapping[str, Any]],
        message_docs: list[Mapping[str, Any]],
        extra: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        *,
        keep: bool = False,
        remember: Callable[[Any, str], None] | None = None,
    ) -> list[tuple[CheckpointTuple, cache.Entry | None]]:
        """Build the tuples (and, with ``keep``, their cache entries); ``extra(doc)``
        gives the extra configurable keys of each tuple (the tenant, when not the
        saver's default)."""
        blob_docs = MIGRATIONS.upgrade_all("checkpoint_blob", blob_docs)
        write_docs = MIGRATIONS.upgrade_all("checkpoint_write", write_docs)
        message_docs = MIGRATIONS.upgrade_all("short_term_memory", message_docs)
        blobs = group_fragments(blob_docs, "thread_id", "checkpoint_ns", "key")
        messages = group_fragments(message_docs, "thread_id", "key")
        writes = group_fragments(write_docs, "thread_id", "checkpoint_ns", "checkpoint_id")
        return [
            storage.assemble(
                d,
                blobs=blobs,
                writes=writes.get((d["thread_id"], d["checkpoint_ns"], d["checkpoint_id"]), []),
                messages=messages,
                serde=self.serde,
                config_extra=extra(d),
                body=body,
                keep=keep,
                remember=remember,
            )
            for d, body in zip(self.docs, self.bodies, strict=True)
        ]


def list_query(
    tenant: str,
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
) -> dict[str, Any]:
    """The MongoDB filter of ``list``; validates every input first."""
    query: dict[str, Any] = {"tenant_id": tenant}
    conf = validation.configurable(config)
    if "thread_id" in conf:  # absent: every thread of the tenant; present: a string
        query["thread_id"] = validation.identifier(conf["thread_id"], "thread_id")
    if "checkpoint_ns" in conf and conf["checkpoint_ns"] is not None:
        query["checkpoint_ns"] = validation.identifier(
            conf["checkpoint_ns"], "checkpoint_ns", allow_empty=True
        )
    if conf.get("checkpoint_id") is not None:
        query["checkpoint_id"] = validation.identifier(conf["checkpoint_id"], "checkpoint_id")
    query.update(validation.metadata_filter(filter))
    if before is not None:
        bid = validation.configurable(before).get("checkpoint_id")
        if bid is not None:
            bid = validation.identifier(bid, "before.checkpoint_id")
            current = query.get("checkpoint_id")
            query["checkpoint_id"] = (
                {"$lt": bid} if current is None else {"$lt": bid, "$eq": current}
            )
    return query


def after(query: Mapping[str, Any], last: tuple[str, Any] | None) -> dict[str, Any]:
    """``query`` restricted to documents after ``last`` = (checkpoint_id, _id) in the
    order of ``list`` (checkpoint_id descending, then _id descending): keyset paging, so
    each page is one bounded query (two threads copied from one another share ids)."""
    if last is None:
        return dict(query)
    cid, doc_id = last
    return {
        "$and": [
            dict(query),
            {
                "$or": [
                    {"checkpoint_id": {"$lt": cid}},
                    {"checkpoint_id": cid, "_id": {"$lt": doc_id}},
                ]
            },
        ]
    }
