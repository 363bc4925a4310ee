# Generated from accord/memory/asynchronous/service.py by tools/synchro.py. Do not edit: run `python -m tools.synchro`.
"""The memory service.

One service behind every door (BaseStore, and part B's HTTP API and MCP server): put, get,
delete, search, list namespaces, history, TTL sweep, for ONE tenant. Every read is scoped by
the tenant and a namespace prefix before anything else (``$vectorSearch`` pre-filters, or
the ``find`` filter); caller-supplied value filters only narrow that scope further, are
validated (no ``$`` field names, only BaseStore's operators) and are applied after the vector
search, in Python, with BaseStore's semantics. Vector search runs on ``memory_vectors`` (one
vector per memory and field path) and scores each memory by its best vector. Every write is a
plan executed by the platform's unit of work (one transaction: the memory, its vectors, its
previous version in ``memory_history``), with compare-and-set on ``version`` so two writers
never lose an update.

Generated from ``accord/memory/asynchronous/service.py`` by ``tools/synchro.py``: edit that file, not this one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING, IndexModel, MongoClient
from pymongo.operations import SearchIndexModel

from accord.errors import InvalidInputError, MemoryConflictError, WriteRefused
from accord.memory import history_pages, model, validation, vector_docs
from accord.memory.embedders import Embedder, check_dimensions, resolve_embedder
from accord.memory.history_pages import HistoryPage
from accord.memory.model import Doc, Memory, PutRequest
from accord.memory.running import Offload
from accord.memory.writepath import (
    COMPONENT,
    LONG_TERM_MEMORY,
    MEMORY_HISTORY,
    MEMORY_VECTOR,
    Catalog,
    Expect,
    Group,
    Op,
    Plan,
    PlanContext,
    UnitOfWork,
)
from accord.platform.codes import DUPLICATE_KEY_CODES
from accord.platform.context import Principal, ReadContext

log = logging.getLogger("accord.memory")
_IS_SYNC = True
WRITE_ATTEMPTS = 8
MAX_CANDIDATES = model.MAX_CANDIDATES


def _conflict(_: Any) -> BaseException:
    return MemoryConflictError("a memory changed while it was being written; retry")


class MemoryService:
    """Long-term memory of one tenant on one database.

    ``embedder``: an :class:`~accord.memory.embedders.Embedder`, a LangChain
    ``Embeddings``, a function, ``"voyage:<model>"`` or None (hashing embedder). ``dims`` is
    the vector index's dimension (the embedder's when omitted).
    """

    def __init__(
        self,
        client: MongoClient[Any],
        *,
        tenant_id: str = "default",
        db_name: str = "accord",
        embedder: Any = None,
        dims: int | None = None,
        memory_collection: str = model.MEMORY_COLLECTION,
        history_collection: str = model.HISTORY_COLLECTION,
        vectors_collection: str = model.VECTORS_COLLECTION,
        uow: UnitOfWork | None = None,
        principal: Principal | None = None,
    ) -> None:
        self.client = client
        self.tenant_id = model.check_tenant(tenant_id)
        self.db_name = db_name
        self.embedder: Embedder = resolve_embedder(embedder, dims)
        found_dims = dims or self.embedder.dims
        if found_dims is None:
            raise InvalidInputError(
                f"embedder {self.embedder.name} does not declare its dimensions; pass dims="
            )
        self.dims: int = found_dims
        check_dimensions(self.embedder, self.dims, "this service")
        self.memory_collection = memory_collection
        self.history_collection = history_collection
        self.vectors_collection = vectors_collection
        if uow is None:  # a service built alone: the runtime's kernel, with its hooks
            from accord import runtime

            uow = runtime.kernel(client)
        self.uow: UnitOfWork = uow
        # Every write of a memory on this unit of work writes its vectors with it.
        vector_docs.register(self.uow, db_name, memory_collection, vectors_collection)
        self.principal = principal

    @property
    def memories(self) -> Any:
        return self.client[self.db_name][self.memory_collection]

    @property
    def history_coll(self) -> Any:
        return self.client[self.db_name][self.history_collection]

    @property
    def vectors(self) -> Any:
        return self.client[self.db_name][self.vectors_collection]

    def for_tenant(self, tenant_id: str) -> MemoryService:
        """The same store, scoped to another tenant (shares client, embedder, unit of work)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.tenant_id = model.check_tenant(tenant_id)
        return other

    def acting_as(self, principal: Principal) -> MemoryService:
        """The same service, its reads and writes made as ``principal`` (an API key's, for
        the HTTP API and MCP): the kernel's hooks (governance's policy, audit) see it."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.principal = principal
        return other

    # -- setup ----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create the collections, their indexes and the vector search index (idempotent).

        Raises EmbeddingDimensionError when the existing vector index has other dimensions.
        """
        Catalog(self.uow, self.db_name).setup(
            COMPONENT,
            {self.memory_collection: LONG_TERM_MEMORY, self.history_collection: MEMORY_HISTORY,
             self.vectors_collection: MEMORY_VECTOR},
            {
                self.memory_collection: [
                    IndexModel([("tenant_id", ASCENDING), ("ns_prefixes", ASCENDING)],
                               name="tenant_ns_prefixes"),
                    # _scan's order (updated_at desc, _id) read off the index, no sort.
                    IndexModel([("tenant_id", ASCENDING), ("updated_at", DESCENDING),
                                ("_id", ASCENDING)], name="tenant_updated_id"),
                    IndexModel([("expires_at", ASCENDING)], name="ttl", expireAfterSeconds=0),
                    # what a deleted thread gave (accord.memory.forgetting)
                    IndexModel([("tenant_id", ASCENDING), ("provenance.thread_id", ASCENDING)],
                               name="tenant_thread"),
                ],
                self.history_collection: [
                    IndexModel([("memory_id", ASCENDING), ("version", ASCENDING)],
                               name="memory_version"),
                    IndexModel([("tenant_id", ASCENDING)], name="tenant"),
                    IndexModel([("tenant_id", ASCENDING), ("provenance.thread_id", ASCENDING)],
                               name="tenant_thread"),
                ],
                self.vectors_collection: [
                    IndexModel([("memory_id", ASCENDING)], name="memory"),
                    IndexModel([("expires_at", ASCENDING)], name="ttl", expireAfterSeconds=0),
                ],
            },
        )  # fmt: skip
        existing = [i for i in self.vectors.list_search_indexes(model.VECTOR_INDEX)]
        if existing:
            fields = existing[0].get("latestDefinition", {}).get("fields", [])
            dims = next((f.get("numDimensions") for f in fields if f.get("type") == "vector"), None)
            if dims is not None:
                where = f"the vector index of {self.db_name}.{self.vectors_collection}"
                check_dimensions(self.embedder, int(dims), where)
            return
        self.vectors.create_search_index(
            SearchIndexModel(definition=model.vector_index_definition(self.dims),
                             name=model.VECTOR_INDEX, type="vectorSearch")
        )  # fmt: skip

    # -- writes -----------------------------------------------------------------------------------

    def put(self, namespace: Sequence[str], key: str, value: dict[str, Any], *,
                  text: str | None = None, embed: bool = True, kind: str = "item",
                  provenance: model.Provenance | None = None,
                  ttl_minutes: float | None = None) -> Memory:  # fmt: skip
        """Write one memory and return it as written. ``text`` is what gets embedded
        (default: the value as JSON, cut to ``validation.MAX_TEXT`` characters).

        Every input is checked first (:mod:`accord.memory.validation`): a refusal is an
        ``InvalidInputError`` naming the field, and nothing is written."""
        if not isinstance(value, dict):
            validation.check_value(value)  # raises: not an object (delete() deletes)
        req = PutRequest(
            model.check_namespace(namespace), model.check_key(key), value, text=text,
            kind=kind, provenance=provenance or model.Provenance(tenant_id=self.tenant_id),
            ttl_minutes=ttl_minutes,
        )  # fmt: skip
        written = self.apply([req], embed=[embed])
        doc = written[model.memory_id(self.tenant_id, req.namespace, req.key)]
        assert doc is not None  # a put writes its document
        return Memory.from_doc(doc)

    def delete(self, namespace: Sequence[str], key: str) -> bool:
        """Delete one memory (its last version goes to its history). True when this call
        deleted it; False when there was none, or a concurrent delete took it first (of
        several deletes at once, exactly one answers True)."""
        req = PutRequest(model.check_namespace(namespace), model.check_key(key), None)
        gone: set[str] = set()
        # its own action in the audit trail (it was recorded as memory.put)
        self.apply([req], embed=[False], operation="memory.delete", deleted=gone)
        return bool(gone)

    def apply(self, reqs: Sequence[PutRequest], embed: Sequence[bool] | None = None,
                    operation: str = "memory.put", *,
                    deleted: set[str] | None = None) -> dict[str, Doc | None]:  # fmt: skip
        """Write (or delete, ``value`` None) several memories in one transaction; returns
        each memory's document as written (None: deleted), by memory id. ``deleted``, when
        given, receives the ids of the memories this call deleted (not those that were
        already gone).

        Every request is validated first (:func:`accord.memory.model.check_request`, in a
        worker thread on the async twin: a large value costs its walk there, not on the
        event loop); one refused request writes nothing. Texts are embedded next (never
        inside the transaction). The last request for a (namespace, key) wins. Retries
        when another writer changed one of them meanwhile.
        """
        reqs = Offload.run(_checked, reqs, embed)
        flags = list(embed) if embed is not None else [True] * len(reqs)
        last: dict[tuple[tuple[str, ...], str], int] = {}
        for i, r in enumerate(reqs):
            last[(r.namespace, r.key)] = i
        chosen = sorted(last.values())
        # Each distinct text is embedded once, in one batch: a memory's one text, or the
        # texts of its fields.
        wanted: dict[int, list[str]] = {}
        for i in chosen:
            r = reqs[i]
            if r.value is None or not flags[i] or r.embedding is not None or r.field_embeddings:
                continue
            if r.field_texts:
                wanted[i] = [t for _, t in r.field_texts]
            elif r.text:
                wanted[i] = [str(r.text)]
        texts = list(dict.fromkeys(t for ts in wanted.values() for t in ts))
        embedded: dict[str, list[float]] = {}
        if texts:
            vectors = self.embedder.embed_documents(texts)
            for text, v in zip(texts, vectors, strict=True):
                if len(v) != self.dims:
                    check_dimensions(_Fixed(len(v), f"embedder {self.embedder.name}"), self.dims,
                                     self.vectors_collection)  # fmt: skip
                embedded[text] = v
        final = []
        for i in chosen:
            r = reqs[i]
            if i in wanted and r.field_texts:
                r = dataclasses.replace(
                    r, field_embeddings=tuple((p, embedded[t]) for p, t in r.field_texts)
                )
            elif i in wanted:
                r = dataclasses.replace(r, embedding=embedded[str(r.text)])
            elif r.value is not None:
                given: list[Sequence[float]] = [v for _, v in r.field_embeddings]
                given += [r.embedding] if r.embedding is not None else []
                for vec in given:
                    if len(vec) != self.dims:
                        check_dimensions(_Fixed(len(vec), "an embedding given with the write"),
                                         self.dims, self.vectors_collection)  # fmt: skip
            final.append(r)
        for attempt in range(WRITE_ATTEMPTS):
            ids = [model.memory_id(self.tenant_id, r.namespace, r.key) for r in final]
            current = {d["_id"]: d for d in self._find(
                self.memory_collection, LONG_TERM_MEMORY,
                {"_id": {"$in": ids}, "tenant_id": self.tenant_id}, operation)}  # fmt: skip
            plan, written = self._plan(final, current, operation)
            if not any(g.ops for g in plan.groups):
                return written
            gone = [op.filter["_id"] for g in plan.groups if g.name == "memory_deletes"
                    for op in g.ops if op.filter is not None]  # fmt: skip
            try:
                self.uow.execute(plan)
                if deleted is not None:
                    deleted.update(gone)
                return written
            except MemoryConflictError:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
            except WriteRefused as exc:
                if exc.code not in DUPLICATE_KEY_CODES:  # not a concurrent insert of a key
                    raise
                if attempt == WRITE_ATTEMPTS - 1:
                    raise MemoryConflictError(
                        "memories kept changing while being written; retry later"
                    ) from exc
        raise AssertionError("unreachable")

    def _plan(self, reqs: Sequence[PutRequest], current: dict[str, Doc],
              operation: str) -> tuple[Plan, dict[str, Doc | None]]:  # fmt: skip
        now = model.utcnow()
        written: dict[str, Doc | None] = {}
        db = self.db_name
        inserts = Group("memory_inserts", db, self.memory_collection, LONG_TERM_MEMORY)
        updates = Group("memory_updates", db, self.memory_collection, LONG_TERM_MEMORY)
        deletes = Group("memory_deletes", db, self.memory_collection, LONG_TERM_MEMORY)
        history = Group("memory_history", db, self.history_collection, MEMORY_HISTORY)
        for r in reqs:
            previous = current.get(model.memory_id(self.tenant_id, r.namespace, r.key))
            written[model.memory_id(self.tenant_id, r.namespace, r.key)] = None
            if r.value is None:
                if previous is not None:
                    deletes.ops.append(Op("delete", {"_id": previous["_id"],
                                                     "tenant_id": self.tenant_id,
                                                     "version": previous["version"]}))  # fmt: skip
                    history.ops.append(Op("insert", doc=model.history_document(previous, now,
                                                                               "delete")))  # fmt: skip
                continue
            doc = model.new_document(self.tenant_id, r, now, previous)
            written[doc["_id"]] = doc
            if previous is None:
                inserts.ops.append(Op("insert", doc=doc))
            else:
                updates.ops.append(
                    Op(
                        "replace",
                        {
                            "_id": previous["_id"],
                            "tenant_id": self.tenant_id,
                            "version": previous["version"],
                        },
                        doc,
                    )  # fmt: skip
                )
                history.ops.append(Op("insert", doc=model.history_document(previous, now,
                                                                           "update")))  # fmt: skip
        updates.expect = Expect(error=_conflict, matched=len(updates.ops))
        deletes.expect = Expect(error=_conflict, deleted=len(deletes.ops))
        context = PlanContext(self.tenant_id, principal=self.principal, operation=operation)
        return Plan(context, [g for g in (inserts, updates, deletes, history) if g.ops]), written

    # -- reads -------------------------------------------------------------------------------------

    def _context(self, operation: str) -> ReadContext:
        return ReadContext(self.tenant_id, principal=self.principal, operation=operation)

    def _find(self, collection: str, artifact: str, filt: Doc, operation: str,
                    **kwargs: Any) -> list[Doc]:  # fmt: skip
        """A read of one of the service's collections, through the kernel."""
        return self.uow.find(self._context(operation), artifact, self.db_name, collection,
                                   filt, **kwargs)  # fmt: skip

    def get(self, namespace: Sequence[str], key: str, *,
                  refresh_ttl: bool = False) -> Memory | None:  # fmt: skip
        ns = model.check_namespace(namespace)
        _id = model.memory_id(self.tenant_id, ns, model.check_key(key))
        found = self._find(self.memory_collection, LONG_TERM_MEMORY,
                                 {"_id": _id, "tenant_id": self.tenant_id}, "memory.get",
                                 projection=model.PROJECTION, limit=1)  # fmt: skip
        doc = found[0] if found else None
        now = model.utcnow()
        if doc is None or not model.live(doc, now):
            return None
        if refresh_ttl:
            self._refresh([doc])
        return Memory.from_doc(doc)

    def get_many(self, items: Sequence[tuple[Sequence[str], str]], *,
                       refresh_ttl: bool = False) -> list[Memory | None]:  # fmt: skip
        ids = [model.memory_id(self.tenant_id, model.check_namespace(ns), model.check_key(k))
               for ns, k in items]  # fmt: skip
        now = model.utcnow()
        found = {d["_id"]: d for d in self._find(
            self.memory_collection, LONG_TERM_MEMORY,
            {"_id": {"$in": ids}, "tenant_id": self.tenant_id}, "memory.get",
            projection=model.PROJECTION)}  # fmt: skip
        docs = [found.get(i) for i in ids]
        docs = [d if d is not None and model.live(d, now) else None for d in docs]
        if refresh_ttl:
            self._refresh([d for d in docs if d is not None])
        return [Memory.from_doc(d) if d is not None else None for d in docs]

    def search(
        self,
        namespace_prefix: Sequence[str] = (),
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
        kinds: Sequence[str] | None = None,
        recency_weight: float = 0.0,
        half_life_days: float = 30.0,
        include_unscored: bool = True,
    ) -> list[Memory]:
        """Memories under ``namespace_prefix``, best first.

        With ``query``: embedded, then ``$vectorSearch`` pre-filtered on tenant, namespace
        prefix and ``kinds``; ``filter`` (BaseStore operators on value fields) applied to the
        results, widening the vector search until ``offset + limit`` memories pass it or
        10,000 candidates were examined. ``include_unscored`` then fills the page with
        memories that have no embedding (as InMemoryStore does). Without ``query``: newest
        first. ``recency_weight`` in [0, 1] blends similarity with age
        (``half_life_days``).
        """
        prefix = model.check_namespace(namespace_prefix, allow_empty=True, field="namespace_prefix")
        filt = Offload.run(validation.check_filter, filter)
        limit, offset = validation.check_page(limit, offset)
        recency_weight, half_life_days = validation.check_recency(recency_weight, half_life_days)
        kinds = validation.check_kinds(kinds)
        if query is not None:
            query = validation.check_query(query)
        if limit == 0:  # as LangGraph's InMemoryStore: nothing (an empty page, not one item)
            return []
        now = model.utcnow()
        if query is None:
            docs = self._scan(prefix, filt, kinds, offset + limit, now)
            page = docs[offset:]
            hits = [Memory.from_doc(d) for d in page]
        else:
            hits = self._vector(prefix, query, filt, kinds, offset + limit, now,
                                      recency_weight, half_life_days)  # fmt: skip
            if include_unscored and len(hits) < offset + limit:
                extra = self._scan(prefix, filt, kinds, offset + limit - len(hits), now,
                                         unembedded=True)  # fmt: skip
                hits += [Memory.from_doc(d) for d in extra]
            hits = hits[offset:]
        if refresh_ttl and hits:
            self._refresh_memories(hits)
        return hits

    def _scan(self, prefix: Sequence[str], filt: dict[str, Any],
                    kinds: Sequence[str] | None, want: int, now: datetime,
                    unembedded: bool = False) -> list[Doc]:  # fmt: skip
        q = model.scope_filter(self.tenant_id, prefix)
        if kinds:
            q["kind"] = {"$in": list(kinds)}
        if unembedded:
            q.update(model.UNEMBEDDED)
        docs = self.uow.iterate(
            self._context("memory.search"), LONG_TERM_MEMORY, self.db_name,
            self.memory_collection, q, projection=model.PROJECTION,
            sort=[("updated_at", DESCENDING), ("_id", ASCENDING)],
        )  # fmt: skip
        out: list[Doc] = []
        for doc in docs:
            if model.live(doc, now) and model.value_matches(doc.get("value"), filt):
                out.append(doc)
                if len(out) >= want:
                    break
        return out

    def _vector(self, prefix: Sequence[str], query: str, filt: dict[str, Any],
                      kinds: Sequence[str] | None, want: int, now: datetime,
                      recency_weight: float, half_life_days: float) -> list[Memory]:  # fmt: skip
        vector = self.embedder.embed_query(query)
        if len(vector) != self.dims:
            check_dimensions(_Fixed(len(vector), f"embedder {self.embedder.name}"), self.dims,
                             self.vectors_collection)  # fmt: skip

        def keep(doc: Doc) -> bool:
            return model.live(doc, now) and model.value_matches(doc.get("value"), filt)

        found = self.nearest(prefix, vector, limit=want, kinds=kinds, keep=keep,
                                   widen=4 if filt else 1)  # fmt: skip
        hits = [Memory.from_doc(d, score) for d, score in found]
        if recency_weight > 0:
            for h in hits:
                h.score = model.recency_weighted(h.score or 0.0, h.updated_at, now,
                                                 recency_weight, half_life_days)  # fmt: skip
            hits.sort(key=lambda h: -(h.score or 0.0))
        return hits[:want]

    def nearest(
        self,
        namespace_prefix: Sequence[str],
        vector: Sequence[float],
        *,
        limit: int = 10,
        kinds: Sequence[str] | None = None,
        keep: Callable[[Doc], bool] | None = None,
        projection: Doc | None = model.PROJECTION,
        widen: int = 1,
    ) -> list[tuple[Doc, float]]:
        """Memory documents nearest to ``vector`` under ``namespace_prefix``, best first,
        each with its best vector's score (Atlas's, in [0, 1]).

        ``$vectorSearch`` on the vectors, pre-filtered on this tenant, the prefix and
        ``kinds``; then the memories, read by id (``projection``; None: whole documents,
        vectors included). ``keep`` drops documents (expired ones, value filters...): the
        vector search widens (x4 a round, up to Atlas's 10,000) until ``limit`` are kept.
        """
        prefix = model.check_namespace(namespace_prefix, allow_empty=True)
        n = min(MAX_CANDIDATES, max(limit, 10) * widen)
        while True:
            pipeline = model.vector_search_pipeline(self.tenant_id, prefix, vector, n, kinds)
            raw = self.uow.aggregate(
                self._context("memory.search"), MEMORY_VECTOR, self.db_name,
                self.vectors_collection, pipeline,
            )  # fmt: skip
            best = model.best_per_memory(raw)
            docs = {d["_id"]: d for d in self._find(
                self.memory_collection, LONG_TERM_MEMORY,
                {"_id": {"$in": list(best)}, "tenant_id": self.tenant_id}, "memory.search",
                projection=projection)}  # fmt: skip
            kept = [(docs[m], score) for m, score in best.items()
                    if m in docs and (keep is None or keep(docs[m]))]  # fmt: skip
            if len(kept) >= limit or len(raw) < n or n >= MAX_CANDIDATES:
                return kept[:limit]
            n = min(MAX_CANDIDATES, n * 4)

    def list_namespaces(self, *, prefix: Sequence[str] | None = None,
                              suffix: Sequence[str] | None = None, max_depth: int | None = None,
                              limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:  # fmt: skip
        """Namespaces holding memories of this tenant (``*`` matches any one label)."""
        if prefix is not None:
            prefix = model.check_namespace(prefix, allow_empty=True, field="prefix")
        if suffix is not None:
            suffix = model.check_namespace(suffix, allow_empty=True, field="suffix")
        limit, offset = validation.check_page(limit, offset)
        if max_depth is not None:
            max_depth = validation.check_int(max_depth, "max_depth", low=1)
        q: Doc = {"tenant_id": self.tenant_id}
        literal = []
        for label in prefix or ():
            if label == "*":
                break
            literal.append(label)
        if literal:
            q["ns_prefixes"] = model.ns_path(literal)
        # grouped by the server: one row per namespace, not one per memory of the tenant
        found = self.uow.aggregate(
            self._context("memory.list_namespaces"), LONG_TERM_MEMORY, self.db_name,
            self.memory_collection, [{"$match": q}, {"$group": {"_id": "$namespace"}}],
        )  # fmt: skip
        names = [tuple(d["_id"]) for d in found if isinstance(d["_id"], list)]
        names = [ns for ns in names if model.namespace_matches(ns, prefix, suffix)]
        if max_depth is not None:
            names = list({ns[:max_depth] for ns in names})
        names.sort()
        return names[offset : offset + limit]

    def history(self, namespace: Sequence[str], key: str) -> list[dict[str, Any]]:
        """Previous versions of a memory, oldest first (the current one is ``get``); all
        of them (``history_page`` serves them a page at a time)."""
        return [_without_id(d) for d in self._history(namespace, key, {}, None)]

    def history_page(
        self, namespace: Sequence[str], key: str, *, limit: int = 50, after: str | None = None
    ) -> HistoryPage:
        """At most ``limit`` previous versions of a memory, oldest first, after the
        cursor ``after`` (the ``next`` of the page before; None: from the oldest).
        Raises InvalidField naming ``limit`` or ``after``."""
        limit = validation.check_int(limit, "limit", low=1, high=validation.MAX_PAGE)
        position = history_pages.after_filter(after) if after is not None else {}
        found = self._history(namespace, key, position, limit + 1)
        items = found[:limit]
        more = history_pages.cursor_of(items[-1]) if len(found) > limit else None
        return HistoryPage([_without_id(d) for d in items], more)

    def _history(
        self, namespace: Sequence[str], key: str, position: Doc, limit: int | None
    ) -> list[dict[str, Any]]:
        """The stored history entries, ``_id`` included (a page's cursor is made of it)."""
        _id = model.memory_id(self.tenant_id, model.check_namespace(namespace),
                              model.check_key(key))  # fmt: skip
        # _id is read (an encrypted value is bound to it: docs/governance.md), then dropped
        return self._find(
            self.history_collection, MEMORY_HISTORY,
            {"memory_id": _id, "tenant_id": self.tenant_id, **position}, "memory.history",
            sort=history_pages.ORDER, **({"limit": limit} if limit is not None else {}),
        )  # fmt: skip

    # -- TTL ---------------------------------------------------------------------------------------

    def _refresh(self, docs: Sequence[Doc]) -> None:
        by_ttl: dict[float, list[str]] = {}
        for d in docs:
            if d.get("ttl_minutes"):
                by_ttl.setdefault(float(d["ttl_minutes"]), []).append(d["_id"])
        if not by_ttl:
            return
        now = model.utcnow()
        group = Group("memory_ttl_refresh", self.db_name, self.memory_collection,
                      LONG_TERM_MEMORY)  # fmt: skip
        for ttl, ids in by_ttl.items():
            group.ops.append(Op("update_many", {"_id": {"$in": ids}, "tenant_id": self.tenant_id},
                                {"$set": {"expires_at": now + timedelta(minutes=ttl)}}))  # fmt: skip
        self.uow.execute(Plan(PlanContext(self.tenant_id, principal=self.principal,
                                                operation="memory.refresh_ttl"), [group]))  # fmt: skip

    def _refresh_memories(self, hits: Sequence[Memory]) -> None:
        ids = [model.memory_id(self.tenant_id, h.namespace, h.key)
               for h in hits if h.expires_at is not None]  # fmt: skip
        if ids:
            docs = self._find(
                self.memory_collection, LONG_TERM_MEMORY,
                {"_id": {"$in": ids}, "tenant_id": self.tenant_id}, "memory.refresh_ttl",
                projection={"ttl_minutes": 1},
            )  # fmt: skip
            self._refresh(docs)

    def sweep_expired(self) -> int:
        """Delete this tenant's expired memories now (the TTL index does it eventually)."""
        now = model.utcnow()
        expired = self._find(
            self.memory_collection, LONG_TERM_MEMORY,
            {"tenant_id": self.tenant_id, "expires_at": {"$lte": now}}, "memory.sweep_expired",
        )  # fmt: skip
        if not expired:
            return 0
        reqs = [PutRequest(tuple(d["namespace"]), d["key"], None) for d in expired]
        self.apply(reqs, [False] * len(reqs), operation="memory.sweep_expired")
        return len(expired)


class _Fixed:
    """A stand-in embedder description for dimension checks of vectors already computed
    (``subject`` names where they came from, in the error)."""

    def __init__(self, dims: int, subject: str) -> None:
        self.dims = dims
        self.name = subject
        self.subject = subject


def _default_text(value: Mapping[str, Any]) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def _checked(reqs: Sequence[PutRequest], embed: Sequence[bool] | None) -> list[PutRequest]:
    """``reqs`` validated, a put to embed without a text given its value's JSON as text
    (after the value was checked, so its serialisation cannot fail)."""
    if not isinstance(reqs, Sequence) or not all(isinstance(r, PutRequest) for r in reqs):
        raise InvalidInputError("apply takes a list of PutRequest")
    if embed is not None and len(embed) != len(reqs):
        raise InvalidInputError(f"embed has {len(embed)} flags for {len(reqs)} requests")
    out = []
    for i, r in enumerate(reqs):
        model.check_request(r)
        wants_text = embed is None or embed[i]
        if (
            r.value is not None
            and r.text is None
            and wants_text
            and not (r.field_texts or r.embedding is not None or r.field_embeddings)
        ):
            r = dataclasses.replace(r, text=validation.cut_text(_default_text(r.value)))
        out.append(r)
    return out


def _without_id(entry: Doc) -> dict[str, Any]:
    """A history entry as callers get it: without its storage ``_id``."""
    return {k: v for k, v in entry.items() if k != "_id"}
